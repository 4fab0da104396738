// Device profiles (the planner's JSON): parse_profile must return a profile of positive, finite
// numbers or throw tessel::Error; a profile it returns is written with profile_to_json and read
// back unchanged, and prices collectives and ops with non-negative times (infinite at worst, for
// absurd rates).
#include <cmath>
#include <string>

#include "fuzz/harness.h"
#include "parallel/planner/cost_model.h"

namespace tessel::fuzz {
namespace {

bool non_negative(double value) { return !std::isnan(value) && value >= 0; }

void check_profile(const planner::DeviceProfile& profile) {
  TESSEL_FUZZ_CHECK(profile.devices_per_node >= 1, "devices_per_node ", profile.devices_per_node);
  for (double value : {profile.memory_per_device, profile.gemm_flops, profile.conv_flops,
                       profile.elementwise_flops, profile.memory_bandwidth})
    TESSEL_FUZZ_CHECK(std::isfinite(value) && value > 0, "a rate or size of ", value);
  for (auto collective : {planner::Collective::kAllReduce, planner::Collective::kAllGather,
                          planner::Collective::kReduceScatter}) {
    const double time = profile.collective_time(collective, 4, 1 << 20);
    TESSEL_FUZZ_CHECK(non_negative(time), "a collective takes ", time, " s");
  }
  for (const char* kind : {"gemm", "conv", "elementwise", "softmax", "adam_update"}) {
    const double time = profile.op_time(kind, 1e9, 1e6, /*backward=*/false);
    TESSEL_FUZZ_CHECK(non_negative(time), "op kind ", kind, " takes ", time, " s");
  }
}

}  // namespace
}  // namespace tessel::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessel;
  planner::DeviceProfile profile;
  if (!fuzz::expect_only_tessel_errors(
          [&] { profile = planner::parse_profile(fuzz::as_string(data, size), "fuzz input"); }))
    return 0;
  fuzz::check_profile(profile);
  fuzz::check_reads_back(
      profile,
      [](const std::string& text) { return planner::parse_profile(text, "written profile"); },
      [](const planner::DeviceProfile& value) { return planner::profile_to_json(value); });
  return 0;
}
