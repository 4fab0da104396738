#include "train/recipes/recipe.h"

#include "core/error.h"
#include "train/engine/run_layout.h"
#include "train/engine/setup.h"
#include "train/recipes/bert_mlm_fortunes.h"
#include "train/recipes/mlp_fashion_mnist.h"
#include "train/recipes/vision.h"

namespace tessel::train {

const std::vector<Recipe>& recipes() {
  // New recipes add one line here.
  static const std::vector<Recipe> all = {
      resnet18_fashion_mnist_recipe(), shufflenet_v2_fashion_mnist_recipe(),
      bert_mlm_fortunes_recipe(),      resnet_cifar10_recipe(),
      shufflenet_v2_cifar10_recipe(),  resnet_imagenet_style_recipe(),
      mlp_fashion_mnist_recipe()};
  return all;
}

namespace {
std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& name : names) out += (out.empty() ? "" : ", ") + name;
  return out;
}
}  // namespace

const Recipe& find_recipe(const std::string& name) {
  std::vector<std::string> known;
  for (const auto& recipe : recipes()) {
    if (recipe.name == name) return recipe;
    known.push_back(recipe.name);
  }
  TESSEL_FAIL("unknown recipe '", name, "' (known recipes: ", join(known), ")");
}

TrainConfig resolve_config(const Recipe& recipe, TrainConfig config) {
  if (!config.model) config.model = recipe.defaults.model;
  if (!config.data) config.data = recipe.defaults.data;
  if (!config.batch_size) config.batch_size = recipe.defaults.batch_size;
  if (!config.lr) config.lr = recipe.defaults.lr;
  if (!config.epochs) config.epochs = recipe.defaults.epochs;
  if (!config.optimizer) config.optimizer = recipe.optimizers.front();

  bool known_model = false;
  for (const auto& model : recipe.models) known_model |= model == *config.model;
  TESSEL_CHECK(known_model, "recipe ", recipe.name, ": unknown model '", *config.model,
               "' (this recipe trains: ", join(recipe.models), ")");
  bool known_optimizer = false;
  for (const auto& optimizer : recipe.optimizers) known_optimizer |= optimizer == *config.optimizer;
  TESSEL_CHECK(known_optimizer, "recipe ", recipe.name, ": --optimizer=", *config.optimizer,
               " is not offered (this recipe trains with: ", join(recipe.optimizers), ")");
  TESSEL_CHECK(*config.batch_size > 0, "--batch_size must be positive, got ", *config.batch_size);
  TESSEL_CHECK(*config.lr > 0, "--lr must be positive, got ", *config.lr);
  TESSEL_CHECK(*config.epochs > 0, "--epochs must be positive, got ", *config.epochs);
  TESSEL_CHECK(config.steps >= 0, "--steps must be >= 0, got ", config.steps);
  TESSEL_CHECK(config.threads >= 0, "--threads must be >= 0, got ", config.threads);
  TESSEL_CHECK(config.eval_every >= 0, "--eval_every must be >= 0, got ", config.eval_every);
  TESSEL_CHECK(config.log_every > 0, "--log_every must be positive, got ", config.log_every);
  TESSEL_CHECK(config.checkpoint_every >= 0, "--checkpoint_every must be >= 0, got ",
               config.checkpoint_every);
  TESSEL_CHECK(!config.data->empty(), "recipe ", recipe.name,
               " has no default data set: pass --data (", recipe.data_help, ")");
  if (!recipe.supports_checkpoints) {
    TESSEL_CHECK(config.checkpoint_dir.empty(), "--checkpoint_dir is not supported by recipe ",
                 recipe.name, " (it trains without checkpoints)");
    TESSEL_CHECK(!config.resume, "--resume is not supported by recipe ", recipe.name,
                 " (it trains without checkpoints)");
  }
  TESSEL_CHECK(!config.dropout || recipe.has_dropout, "--dropout: recipe ", recipe.name,
               " trains a model without dropout");
  TESSEL_CHECK(!config.dropout || (*config.dropout >= 0 && *config.dropout < 1),
               "--dropout must be in [0, 1), got ", *config.dropout);
  TESSEL_CHECK(config.checkpoint_every == 0 || !config.checkpoint_dir.empty(),
               "--checkpoint_every needs --checkpoint_dir");
  TESSEL_CHECK(!config.resume || !config.resume->empty() || !config.checkpoint_dir.empty(),
               "--resume without a value resumes from the newest checkpoint in --checkpoint_dir, "
               "which is not set (or pass --resume=PATH)");
  training_device(config);  // a malformed --device fails here
  return config;
}

RecipeResult run_recipe(const TrainConfig& config, std::ostream& log) {
  const Recipe& recipe = find_recipe(config.recipe);
  const TrainConfig resolved = resolve_config(recipe, config);
  // Under mpirun: the dp x tp grid, each rank's own GPU with --device=cuda (checked before any
  // data is read), and a silent log on ranks other than 0.
  TrainConfig rank_config;
  const RunLayout layout = lay_out_ranks(resolved, log, &rank_config);
  return recipe.run(rank_config, layout, layout.log(log));
}

}  // namespace tessel::train
