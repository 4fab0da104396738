// Training under a memory budget: the user surface of the memory layer. Set a budget and a policy
// (none, dtr, swap, split, auto) for the whole process or for a scope, read statistics and the
// per-step counters of evictions, recomputes, swaps and splits. Create the model inside the scope.
//   memory::MemoryScope scope(memory::parse_budget("512MiB").bytes, memory::Policy::kDtr);
//   ... build the model, train ...;  memory::PolicyCounters step = memory::step_counters();
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "core/arg.h"
#include "core/tensor.h"
#include "memory/caching_allocator.h"
#include "memory/residency_manager.h"

namespace tessel::memory {

namespace detail {
struct MemorySetup;
}  // namespace detail

// A budget as written by a user: bytes ("1.5GiB", "512MiB", "2GB", "4096") or a fraction of the
// activation memory ("0.4"), which the caller resolves against the measured unconstrained peak.
struct Budget {
  size_t bytes = 0;     // when given in bytes
  double fraction = 0;  // in (0, 1] when given as a fraction
  bool is_fraction() const { return fraction > 0; }
  // The bytes, or fixed + fraction * (peak - fixed) for a fraction.
  size_t resolve(size_t fixed_bytes, size_t peak_bytes) const;
  std::string str() const;
};

// Units: B, KB/MB/GB/TB (powers of 1000), KiB/MiB/GiB/TiB (powers of 1024), any case; a number
// without a unit is bytes when whole and at least 1, a fraction of activation memory when in
// (0, 1). Zero, negative, unparsable or fractional-byte text is an error that says what is
// accepted.
Budget parse_budget(const std::string& text);

// fixed + fraction * (peak - fixed): the budget that leaves `fraction` of the activation memory.
size_t activation_budget(size_t fixed_bytes, size_t peak_bytes, double fraction);
// Parameters, their gradients and `optimizer_states_per_parameter` tensors like each parameter
// (1 for SGD with momentum, 2 for Adam), as the caching allocator rounds them.
size_t fixed_memory_bytes(const std::vector<Tensor>& parameters,
                          int optimizer_states_per_parameter);
// Throws tessel::OutOfMemory when `budget_bytes` cannot hold the fixed memory.
void check_budget(size_t budget_bytes, size_t fixed_bytes);

// The bytes `tensors` and their gradients hold, each storage once, as the caching allocator
// rounds them.
size_t held_bytes(const std::vector<Tensor>& tensors);
// Copies each tensor's bytes (and its gradient's) into storage from the allocator installed now,
// keeping every tensor's identity (optimizers and layers keep seeing the same tensors), so they
// count against the budget installed now; tensors sharing storage keep sharing it.
void move_to_current_allocator(const std::vector<Tensor>& tensors);

class MemoryOptions {
 public:
  MemoryOptions() = default;
  MemoryOptions& policy(Policy value) {
    residency_.policy(value);
    return *this;
  }
  MemoryOptions& policy(const std::string& name) { return policy(parse_policy(name)); }
  MemoryOptions& min_candidate_bytes(size_t bytes) {
    residency_.min_candidate_bytes(bytes);
    return *this;
  }
  MemoryOptions& min_candidate_share(double share_of_mean) {
    residency_.min_candidate_share(share_of_mean);
    return *this;
  }
  MemoryOptions& host_bandwidth(double bytes_per_second) {
    residency_.host_bandwidth(bytes_per_second);
    return *this;
  }
  MemoryOptions& sample_candidates(bool value, uint64_t seed = 0) {
    residency_.sample_candidates(value, seed);
    return *this;
  }
  MemoryOptions& cost_source(CostSource value) {
    residency_.cost_source(value);
    return *this;
  }
  MemoryOptions& prefetch(bool value) {
    residency_.prefetch(value);
    return *this;
  }
  MemoryOptions& swap_ahead(bool value) {
    residency_.swap_ahead(value);
    return *this;
  }
  Policy policy() const { return residency_.policy(); }
  const ResidencyOptions& residency() const { return residency_; }
  ResidencyOptions& residency() { return residency_; }

  // The device the budget is for (the CPU by default: a simulated device). On CUDA, op record costs
  // are estimated from FLOPs and bytes, since the host sees only kernel launches.
  TESSEL_ARG(Device, device) = Device::cpu();
  // 0: unlimited (statistics only).
  TESSEL_ARG(size_t, budget) = 0;
  // Parameters + gradients + optimizer state: checked against the budget up front.
  TESSEL_ARG(size_t, fixed_bytes) = 0;

 private:
  ResidencyOptions residency_{Policy::kNone};
};

struct MemoryStatus {
  bool active = false;  // a budget/policy is installed (else core's default allocator)
  Policy policy = Policy::kNone;
  size_t budget = 0;  // 0: unlimited
  MemoryStats stats;  // allocator statistics; stats.policy: counters since installation
  ResidencyStats residency;
};

// Installs a caching allocator (with the budget) for the options' device and, unless the policy
// is none, a residency manager; at scope end brings back what the program still holds and restores
// the previous allocator and hooks. Tensors made before the scope stay outside the budget.
//
// A budget may also be a fraction of the activation memory, as the train command's
// --memory_budget=0.5 is: the scope measures the first step without a budget or policy, and the
// first end_step(held) sets the budget to fixed + fraction * (peak - fixed), fixed being the bytes
// of `held` (what lives from step to step: parameters with their gradients, buffers, optimizer
// state), moves those tensors into the budget and installs the policy. Any fraction in (0, 1] is
// meaningful; 1 keeps the whole measured peak.
//   memory::MemoryScope scope(memory::parse_budget("0.5"), memory::Policy::kAuto);
//   ... build the model and optimizer; each step: train, then
//   std::vector<Tensor> held = optimizer.held_tensors();  // parameters, gradients, state
//   for (const Tensor& buffer : model->buffers()) held.push_back(buffer);
//   scope.end_step(held);
class MemoryScope {
 public:
  explicit MemoryScope(const MemoryOptions& options);
  MemoryScope(size_t budget_bytes, Policy policy);
  MemoryScope(const Budget& budget, Policy policy);
  // The same with the other settings (the policy's, the device) from `options`, whose budget and
  // fixed bytes are replaced.
  MemoryScope(const Budget& budget, const MemoryOptions& options);
  ~MemoryScope();
  MemoryScope(const MemoryScope&) = delete;
  MemoryScope& operator=(const MemoryScope&) = delete;

  CachingAllocator& allocator() const;
  ResidencyManager* manager() const;  // null under Policy::kNone

  // Call after each training step (after optimizer.step()) with the tensors that live from step
  // to step. The first call of a scope made with a fraction resolves it; every other call does
  // nothing. Returns the budget in bytes (0: unlimited). This scope must be the innermost.
  size_t end_step(const std::vector<Tensor>& held);
  // Whether a fraction still waits for end_step().
  bool measuring() const { return pending_fraction_ > 0; }

 private:
  std::shared_ptr<detail::MemorySetup> setup_;
  double pending_fraction_ = 0;
  MemoryOptions pending_options_;  // installed by end_step once the fraction is resolved
};

// Process-wide settings (the innermost MemoryScope's when one is active): the budget of the
// current caching allocator, or a new one; the policy, replacing the residency manager.
void set_budget(size_t bytes);
void set_policy(Policy policy);
void set_policy(const std::string& name);
// Replaces the process-wide setup; reset() goes back to core's allocator without hooks.
void configure(const MemoryOptions& options);
void reset();

MemoryStatus status();
// Counters since the previous call (or since installation): one training step's worth.
PolicyCounters step_counters();
std::string format_counters(const PolicyCounters& counters);
// "policy dtr, budget 512.00 MiB, peak 480.21 MiB; 12 evictions, 30 recomputes, ..."
std::string status_line(const MemoryStatus& status);

}  // namespace tessel::memory
