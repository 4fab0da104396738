// A device profile of round numbers for planner tests: 1 GFLOP/s for every op kind, memory traffic
// free, every collective 1 us per step plus 1 GB/s, 8 devices per node, 1 GB each, so expected
// costs can be written by hand. Usage: DeviceProfile profile = round_number_profile();
#pragma once

#include "parallel/planner/cost_model.h"

namespace tessel::planner {

inline DeviceProfile round_number_profile() {
  DeviceProfile profile;
  profile.name = "round_numbers";
  profile.devices_per_node = 8;
  profile.memory_per_device = 1e9;
  profile.gemm_flops = profile.conv_flops = profile.elementwise_flops = 1e9;
  profile.memory_bandwidth = 1e30;
  for (auto& level : profile.collectives)
    for (auto& cost : level) cost = {1e-6, 1e9};
  return profile;
}

}  // namespace tessel::planner
