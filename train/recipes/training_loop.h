// The loop every recipe shares: epochs of optimizer steps, a schedule stepped once per step,
// status lines and JSON-lines metrics, evaluations, checkpoints and exact resume.
//   TrainingTask task{...};  // model, optimizer, schedule, and how to step / evaluate
//   RecipeResult result = run_training(task, config, std::cout);
#pragma once

#include <functional>
#include <memory>
#include <ostream>
#include <string>

#include "nn/module.h"
#include "optim/adam.h"
#include "optim/lr_scheduler.h"
#include "optim/optimizer.h"
#include "train/recipes/recipe.h"

namespace tessel::train {

// One optimizer step's numbers: the loss it minimised, the examples it saw, and any parts of the
// loss to show as well (BERT: "mlm_loss", "nsp_loss"), averaged over each status interval.
struct StepResult {
  double loss = 0;
  int64_t samples = 0;
  NamedValues parts;
};

// An evaluation: metrics in display order, e.g. {"test_loss", 0.31}, {"test_accuracy", 0.91}.
using Evaluation = NamedValues;

// What a recipe gives the loop. Every data order, augmentation and mask must be a function of
// (seed, epoch, position) only, so that a resumed run sees exactly the batches it would have.
struct TrainingTask {
  nn::Module* model = nullptr;
  optim::Optimizer* optimizer = nullptr;
  optim::LRScheduler* scheduler = nullptr;  // may be null; stepped after every optimizer step
  int64_t batches_per_epoch = 0;
  // Prepares 0-based epoch `epoch`, then skips its first `skip` batches (a resume mid-epoch).
  std::function<void(int64_t epoch, int64_t skip)> start_epoch;
  // Trains on the next batch of the epoch (forward, backward, optimizer step; not the schedule)
  // and returns true, or returns false at the end of the epoch.
  std::function<bool(StepResult* result)> train_step;
  // Evaluates without changing any training state (model back in training mode after).
  std::function<Evaluation()> evaluate;
  // Words after "examples" in status lines: "samples/s" or "sequences/s".
  std::string samples_name = "samples";
};

// The steps a full run of `epochs` makes: what schedules span.
int64_t planned_steps(const TrainConfig& config, int64_t batches_per_epoch);

// The optimizer --optimizer names, at --lr: SGD with momentum 0.9, Adam, or AdamW with
// `adamw_options`' weight decay and eps.
std::unique_ptr<optim::Optimizer> make_optimizer(const TrainConfig& config,
                                                 const optim::NamedTensors& parameters,
                                                 const optim::AdamWOptions& adamw_options);

// Runs `task` as `config` says (config resolved). With config.resume, first restores the
// checkpoint (model, optimizer, schedule, RNG) and continues from its step, skipping the batches
// already trained; parameters then match an uninterrupted run bit for bit. With
// config.checkpoint_dir, saves at the end of every epoch, every checkpoint_every steps and when
// --steps stops the run, keeping the newest 3. Under --tp > 1 the split tensors are gathered
// whole to save and sliced to resume (checkpoint_sharding), so any --tp resumes any checkpoint.
// Every rank's RNG state is saved and each rank gets its own back, so a resume is exact under
// mpirun too, given the same --dp and --tp; with another layout every rank continues from rank
// 0's RNG state (deterministic, but dropout differs from an uninterrupted run; a note says so).
RecipeResult run_training(const TrainingTask& task, const TrainConfig& config, std::ostream& log);

// The checkpoint folder config.resume names: "" (bare --resume) is the newest in
// config.checkpoint_dir; a folder with a `latest` file is its newest; any other path is taken as
// a checkpoint folder. Throws tessel::Error when there is none.
std::string resolve_resume_path(const TrainConfig& config);

// "12.3 MiB": bytes for status lines.
std::string format_bytes(int64_t bytes);

}  // namespace tessel::train
