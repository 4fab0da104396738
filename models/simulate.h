// What recomputation costs a zoo model, measured on the memory simulator: a training step
// (SGD with momentum) on the meta device against a device profile, unconstrained and then under
// activation budgets with a memory policy (the median of three steps after five settling ones). The
// planner prices its "memory budget under auto" points with the factors this measures
// (PlanOptions::remat_overhead_k) instead of the profile's one constant.
//   RematOverhead overhead = simulate_remat_overhead({"resnet50", 128}, profile, {0.5, 0.25});
//   options.remat_overhead_k = overhead.k;
#pragma once

#include <map>
#include <string>
#include <vector>

#include "memory/memory.h"
#include "parallel/planner/cost_model.h"
#include "parallel/planner/planner.h"

namespace tessel::models {

struct RematOverhead {
  double step_seconds = 0;     // the unconstrained step, simulated
  double forward_seconds = 0;  // its forward pass and loss
  double peak_bytes = 0, fixed_bytes = 0;
  // Per activation fraction f that trained: the step's slowdown, and the factor k for which
  // (1 - f) * forward_seconds * k is the extra time.
  std::map<double, double> slowdown;
  std::map<double, double> k;
  std::map<double, std::string> failed;  // fractions that did not fit, with the reason
};

// The whole model at spec.batch on one simulated device; fractions of 1 are skipped (nothing
// to recompute). Takes seconds to minutes (the model is built on the CPU first).
RematOverhead simulate_remat_overhead(const planner::ModelSpec& spec,
                                      const planner::DeviceProfile& profile,
                                      const std::vector<double>& fractions,
                                      memory::Policy policy = memory::Policy::kAuto);

}  // namespace tessel::models
