// Training under a memory budget (--memory_budget, --memory_policy): installs the memory layer for
// a run, moves the model's state into the budget, turns a fraction into bytes after a first
// unconstrained step, and reports memory use and policy counters for status lines and metrics.
//   TrainingMemory memory(config, model, optimizer, log);  // before the first step
//   ... each step: train; memory.after_step(log);  StatusLog shows memory.report(...)
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>

#include "memory/memory.h"
#include "nn/module.h"
#include "optim/optimizer.h"
#include "train/engine/config.h"

namespace tessel::train {

// State tensors each parameter gets from `optimizer`: 0 (SGD without momentum), 1 (SGD with
// momentum), 2 (Adam, AdamW), 3 (with amsgrad).
int optimizer_states_per_parameter(const optim::Optimizer& optimizer);

// Bytes that every step holds at once: parameters, their gradients, the optimizer state and the
// module's buffers, as the caching allocator rounds them.
size_t training_fixed_bytes(const nn::Module& model, const optim::Optimizer& optimizer);

// Copies the model's parameters, gradients and buffers and the optimizer's state into storage
// from the allocator installed now, keeping every tensor's identity (an optimizer and the layers
// keep seeing the same tensors), so they count against the installed budget.
void move_training_state(nn::Module& model, optim::Optimizer& optimizer);

class TrainingMemory {
 public:
  // Does nothing when config sets neither a budget nor a policy. Checks a budget in bytes against
  // the fixed memory (a tessel::OutOfMemory naming what is needed when it is below), installs
  // the budget and policy and moves the training state into it. A fraction is resolved by
  // after_step: until then the run is unconstrained and measured.
  TrainingMemory(const TrainConfig& config, nn::Module& model, optim::Optimizer& optimizer,
                 std::ostream& log);
  ~TrainingMemory();
  TrainingMemory(const TrainingMemory&) = delete;
  TrainingMemory& operator=(const TrainingMemory&) = delete;

  bool active() const { return scope_ != nullptr; }
  // After every optimizer step. With a fraction still to resolve: reads the measured peak, sets
  // the budget to fixed + fraction * (peak - fixed) (that share of the activation memory) and
  // says so in `log`.
  void after_step(std::ostream& log);
  // " | budget 1.50 GiB, policy dtr | per step: ..." for a status line covering `steps` steps,
  // and the same numbers in `record` (per-step means of the policy counters); "" when inactive.
  std::string report(int64_t steps, nlohmann::ordered_json* record);
  // Bytes in use and the peak, of the budgeted allocator when active (else the default one).
  memory::AllocatorStats stats() const;

 private:
  void install(size_t budget_bytes, memory::Policy policy);

  nn::Module& model_;
  optim::Optimizer& optimizer_;
  Device device_;  // --device: where the budget applies
  std::string budget_text_;
  memory::Budget budget_;
  memory::Policy policy_ = memory::Policy::kNone;
  size_t fixed_bytes_ = 0;
  bool fraction_pending_ = false;
  // The unconstrained first step's peak, shown by the status line that covers that step.
  int64_t measured_peak_ = 0;
  std::unique_ptr<memory::MemoryScope> scope_;
};

}  // namespace tessel::train
