// Every memory policy trains the model zoo on the CPU (a simulated device) to the same result as
// training without a budget (tests/memory/policy_equality.h): dtr and swap bitwise, split and
// auto within the whole-model closeness rule. One test per (model, policy); the unbudgeted
// reference run is shared within a process.
#include "tests/memory/policy_equality.h"

#include "gtest/gtest.h"

namespace tessel::memory {
namespace {

class PolicyEquality : public ::testing::TestWithParam<PolicyEqualityCase> {};

TEST_P(PolicyEquality, TrainsLikeWithoutABudgetAtEveryActivationFraction) {
  const Policy policy = GetParam().policy;
  check_policy_equality(GetParam().model, policy, Device::cpu(),
                        /*bitwise=*/policy == Policy::kDtr || policy == Policy::kSwap);
}

INSTANTIATE_TEST_SUITE_P(Zoo, PolicyEquality, ::testing::ValuesIn(policy_equality_cases()),
                         [](const ::testing::TestParamInfo<PolicyEqualityCase>& info) {
                           return policy_equality_case_name(info.param);
                         });

}  // namespace
}  // namespace tessel::memory
