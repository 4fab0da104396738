// Learning-rate schedulers that drive an optimizer, as in PyTorch: built on the optimizer (they
// set its rate for step 0 at once), then step() once per iteration (or epoch), after sgd.step().
//   StepLR schedule(sgd, /*step_size=*/30, /*gamma=*/0.1);  ... sgd.step(); schedule.step();
#pragma once

#include <cstdint>
#include <string>

#include "optim/optimizer.h"

namespace tessel::optim {

// The base of every schedule: a step counter and the base learning rate (the optimizer's at
// construction). The learning rate is a closed-form function of the step (lr_at), so a schedule
// restored from a checkpoint continues exactly.
class LRScheduler {
 public:
  virtual ~LRScheduler() = default;
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  // Advances one step and sets the optimizer's learning rate to lr_at(step_count()).
  void step();

  // Steps taken since construction (PyTorch's last_epoch).
  int64_t step_count() const { return step_count_; }
  double base_lr() const { return base_lr_; }
  // The learning rate this schedule gives after `step` steps.
  virtual double lr_at(int64_t step) const = 0;
  // The learning rate it set last: lr_at(step_count()).
  double last_lr() const { return lr_at(step_count_); }
  virtual std::string name() const = 0;
  Optimizer& optimizer() const { return optimizer_; }

  // "step_count" and "base_lr": what a checkpoint needs; the hyperparameters (step size,
  // warmup...) are the constructor's.
  NamedScalars state_scalars() const;
  // Restores what state_scalars() returned (both required; checked first, nothing changes on
  // an error) and sets the optimizer's learning rate to match.
  void load_state_scalars(const NamedScalars& scalars);

 protected:
  // Subclasses check their arguments, then call apply_initial_lr() at the end of their
  // constructor (lr_at is virtual, so the base constructor cannot).
  explicit LRScheduler(Optimizer& optimizer);
  void apply_initial_lr();

 private:
  Optimizer& optimizer_;
  int64_t step_count_ = 0;
  double base_lr_;
};

// Multiplies the learning rate by `gamma` every `step_size` steps:
// lr = base_lr * gamma^floor(step / step_size) (PyTorch's StepLR).
class StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& optimizer, int64_t step_size, double gamma = 0.1);
  double lr_at(int64_t step) const override;
  std::string name() const override { return "StepLR"; }
  int64_t step_size() const { return step_size_; }
  double gamma() const { return gamma_; }

 private:
  int64_t step_size_;
  double gamma_;
};

// Linear warmup from 0 to base_lr over `warmup_steps`, then a half cosine from base_lr down to
// `min_lr` at `total_steps`, and min_lr after that:
//   step < warmup:  base_lr * step / warmup
//   otherwise:      min_lr + (base_lr - min_lr) * (1 + cos(pi * p)) / 2,
//                   p = min(1, (step - warmup) / max(1, total - warmup))
class CosineWithWarmup : public LRScheduler {
 public:
  CosineWithWarmup(Optimizer& optimizer, int64_t warmup_steps, int64_t total_steps,
                   double min_lr = 0);
  double lr_at(int64_t step) const override;
  std::string name() const override { return "CosineWithWarmup"; }
  int64_t warmup_steps() const { return warmup_steps_; }
  int64_t total_steps() const { return total_steps_; }
  double min_lr() const { return min_lr_; }

 private:
  int64_t warmup_steps_;
  int64_t total_steps_;
  double min_lr_;
};

// BERT's schedule: linear warmup from 0 to base_lr over `warmup_steps`, then linear decay to 0
// at `total_steps`, and 0 after that:
//   step < warmup:  base_lr * step / warmup
//   otherwise:      base_lr * max(0, (total - step) / max(1, total - warmup))
class LinearWarmupDecay : public LRScheduler {
 public:
  LinearWarmupDecay(Optimizer& optimizer, int64_t warmup_steps, int64_t total_steps);
  double lr_at(int64_t step) const override;
  std::string name() const override { return "LinearWarmupDecay"; }
  int64_t warmup_steps() const { return warmup_steps_; }
  int64_t total_steps() const { return total_steps_; }

 private:
  int64_t warmup_steps_;
  int64_t total_steps_;
};

}  // namespace tessel::optim
