// Checkpoints of a run: --resume restores the model, optimizer, schedule and every rank's RNG
// state and says which step to continue from; --checkpoint_dir saves every --checkpoint_every
// steps, at the end of every epoch and of the run, keeping the newest 3 (rank 0 writes).
//   Checkpointer checkpointer(config, layout, plan, model, optimizer, &scheduler, status);
//   int64_t step = checkpointer.resume();         // 0 for a fresh run
//   ... after each step: checkpointer.maybe_save(step);
//   ... at the end of an epoch and of the run: checkpointer.save(step);
// Data orders, augmentations and masks must be functions of (seed, epoch, position) only, so a
// resumed run that skips the batches it trained sees exactly the batches it would have; its
// parameters then match an uninterrupted run bit for bit. Under --tp > 1 the split tensors are
// gathered whole to save and sliced to resume, so any --tp resumes any checkpoint. Each rank
// resumes its own RNG state when the checkpoint was saved with the same --dp and --tp; with
// another layout every rank continues from rank 0's (deterministic, but dropout differs from an
// uninterrupted run; a note says so).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "nn/module.h"
#include "optim/lr_scheduler.h"
#include "optim/optimizer.h"
#include "train/engine/config.h"
#include "train/engine/run_layout.h"
#include "train/engine/status_log.h"
#include "train/engine/training_plan.h"
#include "train/state/checkpoint.h"

namespace tessel::train {

class Checkpointer {
 public:
  // `model` is what the optimizer updates (the tensor-parallel form under --tp > 1);
  // `scheduler` may be null. Every reference must outlive the checkpointer.
  Checkpointer(const TrainConfig& config, const RunLayout& layout, const TrainingPlan& plan,
               nn::Module& model, optim::Optimizer& optimizer, optim::LRScheduler* scheduler,
               StatusLog& status);

  // With --resume, loads the checkpoint it names and returns its step; 0 otherwise. A
  // tessel::Error when there is none, or it was trained with other data, batch size or seed.
  int64_t resume();
  int64_t resumed_from() const { return resumed_from_; }
  // Saves when --checkpoint_every divides `step`.
  void maybe_save(int64_t step);
  // Saves the state at `step` unless it is on disk already (or there is no --checkpoint_dir).
  // A collective under mpirun: every rank calls it.
  void save(int64_t step);
  // The folder saved last ("" without --checkpoint_dir and on ranks other than 0).
  const std::string& last_saved() const { return last_saved_; }

 private:
  const TrainConfig& config_;
  const RunLayout& layout_;
  const TrainingPlan plan_;
  nn::Module& model_;
  optim::Optimizer& optimizer_;
  optim::LRScheduler* scheduler_;
  StatusLog& status_;
  std::optional<CheckpointSharding> sharding_;  // --tp > 1
  int64_t saved_step_ = -1;
  int64_t resumed_from_ = 0;
  std::string last_saved_;
};

// The checkpoint folder config.resume names: "" (bare --resume) is the newest in
// config.checkpoint_dir; a folder with a `latest` file is its newest; any other path is taken as
// a checkpoint folder. Throws tessel::Error when there is none.
std::string resolve_resume_path(const TrainConfig& config);

// How `model` (what the optimizer updates) is split over the layout's tp group, so that
// checkpoints hold whole tensors and resume with any --tp; nullopt when tp == 1.
std::optional<CheckpointSharding> checkpoint_sharding(const RunLayout& layout, nn::Module& model);

}  // namespace tessel::train
