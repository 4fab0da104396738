// The memory-policy equality check shared by the CPU test (tests/memory/policy_equality_test)
// and the CUDA one (tests/cuda/policy_equality_test): ResNet-18 (small-image stem), ShuffleNet v2
// x0.5 and BERT tiny (with dropout) train 3 SGD steps (lr 1e-3) on one device at activation
// budgets f = 0.7, 0.5, 0.3 (budget = fixed + f * (peak - fixed)) and on the CPU at 0.2 and 0.1
// too, and BERT tiny with a vocabulary of 30522 (its MLM head scored in chunks) at f = 0.2 and
// 0.1; where dtr cannot train (ResNet-18 below 0.3: what it cannot move and one op's operands
// exceed the budget) it must fail naming the least budget that op needs.
// Every run that trains must match the unbudgeted
// run on that device: the first step's gradients and parameter changes and every loss (bitwise
// for dtr and swap, which run the same kernels in the same order; the closeness rule for split
// and auto), and for dtr and swap the final parameters and batch-norm statistics bitwise.
// Batches are sized so activations are at least 75% of the peak.
//   check_policy_equality("resnet18", Policy::kDtr, Device::cpu(), /*bitwise=*/true);
#pragma once

#include <string>
#include <vector>

#include "core/device.h"
#include "memory/memory.h"

namespace tessel::memory {

// One test case: a model of the zoo under one policy.
struct PolicyEqualityCase {
  std::string model;
  Policy policy;
};
// Every model under dtr, swap, split and auto (BERT with 30522 words: swap and auto);
// "resnet18_dtr" names a case in a test.
std::vector<PolicyEqualityCase> policy_equality_cases();
std::string policy_equality_case_name(const PolicyEqualityCase& test_case);

// Trains `model` under `policy` at each fraction and checks peak <= budget, the losses,
// parameters and batch-norm statistics against the unbudgeted run (bitwise, or within the
// whole-model closeness rule), and that the policy did its work. Costs are estimated from each
// op's FLOPs and bytes, so the same evictions happen on every run.
void check_policy_equality(const std::string& model, Policy policy, Device device, bool bitwise);

}  // namespace tessel::memory
