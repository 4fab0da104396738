// Training recipes by name: each recipe builds a model, data and optimizer from a TrainConfig
// and trains it, reporting status lines and metrics. The `train` CLI picks one with --recipe.
//   TrainConfig config;  config.recipe = "resnet18_fashion_mnist";  config.epochs = 1;
//   RecipeResult result = run_recipe(config, std::cout);
#pragma once

#include <functional>
#include <optional>
#include <ostream>
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
  // Stop after this many optimizer steps in all (a resumed run counts the steps before it);
  // 0: no limit. It does not change the schedule, which spans `epochs`.
  int64_t steps = 0;
  uint64_t seed = 0;  // model initialisation, data order, augmentation, masks
  int threads = 0;    // intra-op threads; 0: every core
  // Ranks under mpirun as a dp x tp grid (train/recipes/distributed.h): --dp data-parallel
  // replicas, --tp tensor-parallel slices (0: the rest of the ranks), or a plan file written by
  // //parallel:plan that sets both.
  int dp = 0;
  int tp = 0;
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
  // or a fraction in (0, 1] of the whole peak measured in a first unconstrained step ("0.4").
  std::string memory_budget;
  // none, dtr, swap, split or auto; "" is auto with a budget and none without.
  std::string memory_policy;
  // "f32", or "bf16": training steps run under autocast (core/autocast.h), so products and
  // convolutions compute in bf16 while parameters, gradients and optimizer state stay f32.
  std::string precision = "f32";
  // Where the model trains: "cpu", "cuda" or "cuda:N" (Device::parse; meta is refused). Recipes
  // move the model there before making the optimizer and copy each batch over; CUDA needs
  // --config=cuda and a GPU (run_recipe checks with one tensor before anything else). Under
  // mpirun only "cuda" with tp = 1: run_distributed gives each rank its own GPU ("cuda:K").
  std::string device = "cpu";
};

// The defaults a recipe fills in for unset TrainConfig fields.
struct RecipeDefaults {
  std::string model;
  std::string data;
  int64_t batch_size = 0;
  double lr = 0;
  int64_t epochs = 0;
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

struct Recipe {
  std::string name;
  std::string description;  // one line for --help
  std::string data_help;    // what --data accepts, for --help
  RecipeDefaults defaults;
  std::vector<std::string> models;  // the values --model accepts
  // The values --optimizer accepts; the first is the default.
  std::vector<std::string> optimizers = {"sgd"};
  bool supports_checkpoints = true;
  // Runs with a config whose optional fields are all set; writes status lines to `log`.
  std::function<RecipeResult(const TrainConfig&, std::ostream& log)> run;
};

// Every recipe, in the order --help lists them.
const std::vector<Recipe>& recipes();
// The recipe called `name`; a tessel::Error listing the known names otherwise.
const Recipe& find_recipe(const std::string& name);
// `config` with the recipe's defaults filled in; checks values and recipe support (a model the
// recipe does not know, a recipe without a default data set and no --data, checkpoint flags a
// recipe cannot honour, a --device that does not parse or is meta, a memory budget on a GPU)
// with a clear error.
TrainConfig resolve_config(const Recipe& recipe, TrainConfig config);
// find_recipe + resolve_config + run; with --device=cuda[:N] it first makes sure the device can
// hold a tensor ("--device=cuda: ..." errors before any data is read).
RecipeResult run_recipe(const TrainConfig& config, std::ostream& log);

}  // namespace tessel::train
