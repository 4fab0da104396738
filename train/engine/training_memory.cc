#include "train/engine/training_memory.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <unordered_set>
#include <vector>

#include "core/error.h"
#include "optim/adam.h"
#include "optim/sgd.h"
#include "parallel/zero.h"
#include "train/engine/setup.h"

namespace tessel::train {
namespace {

using memory::format_bytes;

memory::PolicyCounters per_step(const memory::PolicyCounters& total, int64_t steps) {
  auto mean = [&](int64_t value) {
    return static_cast<int64_t>(std::llround(static_cast<double>(value) / steps));
  };
  memory::PolicyCounters result;
  result.evictions = mean(total.evictions);
  result.evicted_bytes = mean(total.evicted_bytes);
  result.recomputes = mean(total.recomputes);
  result.recomputed_bytes = mean(total.recomputed_bytes);
  result.swaps_out = mean(total.swaps_out);
  result.swapped_out_bytes = mean(total.swapped_out_bytes);
  result.swaps_in = mean(total.swaps_in);
  result.swapped_in_bytes = mean(total.swapped_in_bytes);
  result.splits = mean(total.splits);
  return result;
}

}  // namespace

int optimizer_states_per_parameter(const optim::Optimizer& optimizer) {
  if (const auto* sgd = dynamic_cast<const optim::SGD*>(&optimizer))
    return sgd->options().momentum() > 0 ? 1 : 0;
  if (const auto* adam = dynamic_cast<const optim::Adam*>(&optimizer))
    return adam->options().amsgrad() ? 3 : 2;
  if (const auto* adamw = dynamic_cast<const optim::AdamW*>(&optimizer))
    return adamw->options().amsgrad() ? 3 : 2;
  // --zero: the shard optimizer's states, counted whole (each rank holds about 1/dp of them).
  if (const auto* zero = dynamic_cast<const parallel::ZeroOptimizer*>(&optimizer))
    return optimizer_states_per_parameter(zero->shard_optimizer());
  return 2;  // an optimizer this file does not know: assume Adam's state
}

size_t training_fixed_bytes(const nn::Module& model, const optim::Optimizer& optimizer) {
  size_t bytes =
      memory::fixed_memory_bytes(model.parameters(), optimizer_states_per_parameter(optimizer));
  for (const Tensor& buffer : model.buffers())
    bytes += memory::CachingAllocator::round_size(buffer.nbytes());
  return bytes;
}

void move_training_state(nn::Module& model, optim::Optimizer& optimizer) {
  std::vector<Tensor> held = model.parameters();
  for (const Tensor& buffer : model.buffers()) held.push_back(buffer);
  // held_tensors(), not state_tensors(): a ZeroOptimizer's state_tensors() gathers whole
  // tensors from every rank, while its own parts are what this rank holds. Each tensor once:
  // one moved twice would leave the tensors that share its bytes behind.
  std::unordered_set<const TensorImpl*> listed;
  for (const Tensor& tensor : held) listed.insert(tensor.impl());
  for (const Tensor& tensor : optimizer.held_tensors())
    if (listed.insert(tensor.impl()).second) held.push_back(tensor);
  memory::move_to_current_allocator(held);
}

TrainingMemory::TrainingMemory(const TrainConfig& config, nn::Module& model,
                               optim::Optimizer& optimizer, std::ostream& log)
    : model_(model),
      optimizer_(optimizer),
      device_(training_device(config)),
      budget_text_(config.memory_budget) {
  if (config.memory_budget.empty() && config.memory_policy.empty()) return;
  if (!config.memory_budget.empty()) {
    try {
      budget_ = memory::parse_budget(config.memory_budget);
    } catch (const Error& error) {
      TESSEL_FAIL("--memory_budget: ", error.message());
    }
  }
  const bool has_budget = !config.memory_budget.empty();
  try {
    policy_ = memory::parse_policy(config.memory_policy.empty()
                                       ? std::string(has_budget ? "auto" : "none")
                                       : config.memory_policy);
  } catch (const Error& error) {
    TESSEL_FAIL("--memory_policy: ", error.message());
  }
  fixed_bytes_ = training_fixed_bytes(model, optimizer);
  const std::string fixed = format_bytes(static_cast<double>(fixed_bytes_));
  if (!has_budget) {
    log << "memory: policy " << memory::policy_name(policy_)
        << " without --memory_budget (nothing to stay within: counters only); fixed memory "
        << fixed << std::endl;
    install(0, policy_);
    return;
  }
  if (budget_.is_fraction()) {
    fraction_pending_ = true;
    log << "memory: budget " << budget_.fraction
        << " of the activation memory: the first step runs without a budget to measure the "
           "peak; fixed memory (parameters, gradients, optimizer state, buffers) "
        << fixed << std::endl;
    install(0, memory::Policy::kNone);
    return;
  }
  if (budget_.bytes < fixed_bytes_) {
    throw TESSEL_ERROR_TYPE(
        OutOfMemory, "--memory_budget=", budget_text_, ": ",
        format_bytes(static_cast<double>(budget_.bytes)), " is below the fixed memory of ", fixed,
        " that every step holds at once (parameters, their gradients, the ", optimizer.name(),
        " state and the buffers); this model needs a budget of at least ", fixed,
        " plus room for activations");
  }
  log << "memory: budget " << format_bytes(static_cast<double>(budget_.bytes)) << ", policy "
      << memory::policy_name(policy_) << "; fixed memory (parameters, gradients, optimizer state, "
      << "buffers) " << fixed << ", leaving "
      << format_bytes(static_cast<double>(budget_.bytes - fixed_bytes_)) << " for activations"
      << std::endl;
  install(budget_.bytes, policy_);
}

TrainingMemory::~TrainingMemory() = default;

void TrainingMemory::install(size_t budget_bytes, memory::Policy policy) {
  scope_.reset();  // scopes nest: the measuring scope ends before the budgeted one starts
  scope_ =
      std::make_unique<memory::MemoryScope>(memory::MemoryOptions()
                                                .device(device_)
                                                .budget(budget_bytes)
                                                .policy(policy)
                                                .fixed_bytes(budget_bytes > 0 ? fixed_bytes_ : 0));
  move_training_state(model_, optimizer_);
  memory::step_counters();  // counters start now
}

void TrainingMemory::after_step(std::ostream& log) {
  if (!fraction_pending_) return;
  fraction_pending_ = false;
  const auto peak =
      static_cast<size_t>(scope_->allocator().memory_stats().base.peak_allocated_bytes);
  // The fraction keeps that share of the activation memory, the peak above the fixed memory
  // (memory::Budget::resolve), so any fraction leaves the fixed memory its room.
  const size_t bytes = budget_.resolve(fixed_bytes_, peak);
  char line[256];
  std::snprintf(line, sizeof(line),
                "memory: the first step peaked at %s; budget %g of the activation memory above "
                "the fixed %s: %s (%.2f of the whole peak), policy %s",
                format_bytes(static_cast<double>(peak)).c_str(), budget_.fraction,
                format_bytes(static_cast<double>(fixed_bytes_)).c_str(),
                format_bytes(static_cast<double>(bytes)).c_str(),
                static_cast<double>(bytes) / static_cast<double>(std::max<size_t>(peak, 1)),
                memory::policy_name(policy_));
  log << line << std::endl;
  install(bytes, policy_);
  measured_peak_ = static_cast<int64_t>(peak);
}

memory::AllocatorStats TrainingMemory::stats() const {
  if (scope_) {
    memory::AllocatorStats stats = scope_->allocator().stats();
    stats.peak_allocated_bytes = std::max(stats.peak_allocated_bytes, measured_peak_);
    return stats;
  }
  return memory::allocator_for(device_)->stats();
}

std::string TrainingMemory::report(int64_t steps, nlohmann::ordered_json* record) {
  if (!scope_) return "";
  measured_peak_ = 0;
  const memory::PolicyCounters step =
      per_step(memory::step_counters(), std::max<int64_t>(1, steps));
  const size_t budget = scope_->allocator().budget();
  std::string text =
      " | budget " + (budget ? format_bytes(static_cast<double>(budget)) : std::string("none")) +
      ", " + memory::policy_name(fraction_pending_ ? memory::Policy::kNone : policy_) +
      " | per step: " + memory::format_counters(step);
  if (record) {
    (*record)["memory_budget_bytes"] = budget;
    (*record)["memory_policy"] = memory::policy_name(policy_);
    (*record)["evictions_per_step"] = step.evictions;
    (*record)["evicted_bytes_per_step"] = step.evicted_bytes;
    (*record)["recomputes_per_step"] = step.recomputes;
    (*record)["recomputed_bytes_per_step"] = step.recomputed_bytes;
    (*record)["swaps_out_per_step"] = step.swaps_out;
    (*record)["swapped_out_bytes_per_step"] = step.swapped_out_bytes;
    (*record)["swaps_in_per_step"] = step.swaps_in;
    (*record)["swapped_in_bytes_per_step"] = step.swapped_in_bytes;
    (*record)["splits_per_step"] = step.splits;
  }
  return text;
}

}  // namespace tessel::train
