// The shape of a run in steps: how many epochs of how many batches, where --steps stops it, and
// which steps end an epoch or evaluate. Recipes count steps themselves and ask the plan.
//   TrainingPlan plan(config, loader.num_batches());
//   for (int64_t epoch = plan.epoch_of(step); epoch <= plan.epochs && !plan.done(step); ++epoch)
#pragma once

#include <cstdint>

#include "core/error.h"
#include "train/engine/config.h"

namespace tessel::train {

struct TrainingPlan {
  // `config` resolved (epochs set); a tessel::Error when an epoch has no batch.
  TrainingPlan(const TrainConfig& config, int64_t batches_per_epoch)
      : epochs(*config.epochs),
        batches_per_epoch(batches_per_epoch),
        total_steps(*config.epochs * batches_per_epoch),
        last_step(config.steps > 0 && config.steps < total_steps ? config.steps : total_steps),
        eval_every(config.eval_every) {
    TESSEL_CHECK(batches_per_epoch > 0, "recipe ", config.recipe,
                 ": the training set yields no batch of size ", *config.batch_size);
  }

  int64_t epochs;
  int64_t batches_per_epoch;
  int64_t total_steps;  // a full run of `epochs`: what schedules span
  int64_t last_step;    // --steps, or total_steps
  int64_t eval_every;   // --eval_every; 0: after each epoch only

  // Whether the run has made all its steps.
  bool done(int64_t step) const { return step >= last_step; }
  // The 1-based epoch the step after `step` belongs to.
  int64_t epoch_of(int64_t step) const { return step / batches_per_epoch + 1; }
  // Batches of 1-based `epoch` already trained when the run stands at `step` (a resume
  // mid-epoch skips them).
  int64_t batches_done(int64_t epoch, int64_t step) const {
    return step - (epoch - 1) * batches_per_epoch;
  }
  // Whether `step` completes 1-based `epoch`.
  bool ends_epoch(int64_t epoch, int64_t step) const { return step == epoch * batches_per_epoch; }
  // Whether --eval_every asks for an evaluation after `step`.
  bool evaluates_at(int64_t step) const { return eval_every > 0 && step % eval_every == 0; }
};

}  // namespace tessel::train
