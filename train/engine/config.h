// What a training run asks for (TrainConfig, filled from the `train` flags) and what it reports
// (RecipeResult). Recipes and the engine pieces in train/engine/ read the same config.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tessel::train {

// What a run asks for. Unset values take the recipe's defaults (Recipe::defaults).
struct TrainConfig {
  std::string recipe = "resnet18_fashion_mnist";
  std::optional<std::string> model;
  std::optional<std::string> data;  // a directory or file the recipe reads
  std::optional<int64_t> batch_size;
  std::optional<double> lr;
  std::optional<int64_t> epochs;
  // "sgd" (momentum 0.9), "adam" or "adamw": one of those the recipe offers (Recipe::optimizers).
  std::optional<std::string> optimizer;
  // Dropout probability of the models that have dropout (BERT); unset: the model's own. Recipes
  // without dropout refuse it (Recipe::has_dropout).
  std::optional<double> dropout;
  // Stop after this many optimizer steps in all (a resumed run counts the steps before it);
  // 0: no limit. It does not change the schedule, which spans `epochs`.
  int64_t steps = 0;
  uint64_t seed = 0;  // model initialisation, data order, augmentation, masks
  int threads = 0;    // intra-op threads; 0: every core
  // Ranks under mpirun as a dp x tp grid (train/engine/run_layout.h): --dp data-parallel
  // replicas, --tp tensor-parallel slices (0: the rest of the ranks), or a plan file written by
  // //parallel:plan that sets both.
  int dp = 0;
  int tp = 0;
  // ZeRO over the data-parallel group (parallel/zero.h): 0 none; 1 each rank keeps its part of
  // the optimizer state; 2 of the gradients too; 3 of the parameters too, gathered on use. Needs
  // dp > 1.
  int zero = 0;
  std::string plan;
  int64_t eval_every = 0;      // evaluate every N steps as well as after each epoch; 0: epochs only
  int64_t log_every = 100;     // steps between status lines
  std::string metrics_path;    // JSON lines, one per status line and evaluation
  std::string checkpoint_dir;  // save checkpoints here (every epoch, every checkpoint_every steps)
  int64_t checkpoint_every = 0;  // steps between checkpoints; 0: at the end of each epoch only
  // Resume: unset, no; "" (bare --resume), the newest checkpoint in checkpoint_dir; otherwise a
  // checkpoint folder (<dir>/step_<N>) or a checkpoint directory (its newest checkpoint).
  std::optional<std::string> resume;
  std::string work_dir;  // files a recipe prepares once and reuses (the BERT vocab); "" default
  // Memory budget (memory::parse_budget): "" none; bytes with a unit ("1.5GiB", "512MiB", "2GB")
  // or a fraction f in (0, 1] of the activation memory ("0.4"): fixed + f * (peak - fixed), the
  // peak measured in a first unconstrained step (memory::Budget::resolve).
  std::string memory_budget;
  // none, dtr, swap, split or auto; "" is auto with a budget and none without.
  std::string memory_policy;
  // "f32", or "bf16": training steps run under autocast (core/autocast.h), so products and
  // convolutions compute in bf16 while parameters, gradients and optimizer state stay f32.
  std::string precision = "f32";
  // Where the model trains: "cpu", "cuda" or "cuda:N" (Device::parse; meta is refused). Recipes
  // move the model there before making the optimizer and copy each batch over; CUDA needs
  // --config=cuda and a GPU (run_recipe checks with one tensor before anything else). Under
  // mpirun only "cuda" with tp = 1: lay_out_ranks gives each rank its own GPU ("cuda:K").
  std::string device = "cpu";
};

using NamedValues = std::vector<std::pair<std::string, double>>;

struct RecipeResult {
  int64_t steps = 0;              // optimizer steps done, those before a resume included
  int64_t resumed_from_step = 0;  // 0 when the run started fresh
  int64_t epochs_completed = 0;
  double final_train_loss = 0;  // mean over the last status interval
  double test_accuracy = 0;     // classifiers: after the last step
  NamedValues final_eval;       // the last evaluation's metrics ("test_accuracy", "mlm_loss"...)
  std::string last_checkpoint;  // the folder saved last; "" without --checkpoint_dir
  double seconds = 0;           // wall time of the whole run, data loading included
};

}  // namespace tessel::train
