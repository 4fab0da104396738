// Training recipes by name: each recipe builds a model, data and optimizer from a TrainConfig
// and trains it, reporting status lines and metrics. The `train` CLI picks one with --recipe.
//   TrainConfig config;  config.recipe = "resnet18_fashion_mnist";  config.epochs = 1;
//   RecipeResult result = run_recipe(config, std::cout);
#pragma once

#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "train/engine/config.h"

namespace tessel::train {

struct RunLayout;  // train/engine/run_layout.h

// The defaults a recipe fills in for unset TrainConfig fields.
struct RecipeDefaults {
  std::string model;
  std::string data;
  int64_t batch_size = 0;
  double lr = 0;
  int64_t epochs = 0;
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
  bool has_dropout = false;  // whether --dropout means something to it
  // Trains with a config whose optional fields are all set (--dropout may stay unset), on this
  // rank's place in `layout`; writes status lines to `log` (silent on ranks other than 0).
  std::function<RecipeResult(const TrainConfig&, const RunLayout& layout, std::ostream& log)> run;
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
// find_recipe + resolve_config + lay_out_ranks + run; with --device=cuda[:N] it first makes sure
// the device can hold a tensor ("--device=cuda: ..." errors before any data is read).
RecipeResult run_recipe(const TrainConfig& config, std::ostream& log);

}  // namespace tessel::train
