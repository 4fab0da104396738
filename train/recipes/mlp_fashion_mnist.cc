#include "train/recipes/mlp_fashion_mnist.h"

#include <chrono>

#include "data/data_loader.h"
#include "data/dataset.h"
#include "nn/activation.h"
#include "nn/linear.h"
#include "optim/adam.h"
#include "train/recipes/classification.h"
#include "train/recipes/distributed.h"
#include "train/recipes/recipe_util.h"

namespace tessel::train {

std::shared_ptr<nn::Sequential> make_mlp(int64_t inputs, const std::vector<int64_t>& hidden,
                                         int64_t classes) {
  auto model = std::make_shared<nn::Sequential>();
  model->push_back(std::make_shared<nn::Flatten>());
  int64_t width = inputs;
  for (int64_t size : hidden) {
    model->push_back(std::make_shared<nn::Linear>(width, size));
    model->push_back(std::make_shared<nn::ReLU>());
    width = size;
  }
  model->push_back(std::make_shared<nn::Linear>(width, classes));
  return model;
}

namespace {

RecipeResult run_mlp_fashion_mnist(const TrainConfig& config, std::ostream& log) {
  const auto start = std::chrono::steady_clock::now();
  begin_run(config, log);
  auto train_set = data::load_fashion_mnist(*config.data, data::Split::kTrain);
  auto test_set = data::load_fashion_mnist(*config.data, data::Split::kTest);
  log << "data: " << train_set->size() << " training and " << test_set->size() << " test images"
      << std::endl;

  auto model = make_mlp(28 * 28, {256, 128}, data::kFashionMnistClasses);
  log << *model << std::endl;
  model->to(training_device(config));  // --device, before the optimizer sees the parameters
  const auto optimizer_holder = make_optimizer(config, model->named_parameters(), {});
  optim::Optimizer& optimizer = *optimizer_holder;
  data::DataLoader train_loader(
      train_set, data::DataLoaderOptions()
                     .batch_size(*config.batch_size)
                     .shuffle(true)
                     .seed(config.seed)
                     .shard(distributed_run().dp_rank, distributed_run().dp));  // this rank's rows

  RecipeResult result =
      train_classifier(*model, optimizer, nullptr, train_loader, *test_set, config, log);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  log << "wall time: " << result.seconds << " s" << std::endl;
  return result;
}

}  // namespace

Recipe mlp_fashion_mnist_recipe() {
  Recipe recipe;
  recipe.name = "mlp_fashion_mnist";
  recipe.description = "MLP 784-256-128-10 (ReLU), Adam (or --optimizer), on Fashion-MNIST";
  recipe.defaults.model = "mlp";
  recipe.defaults.data = data::kFashionMnistDir;
  recipe.defaults.batch_size = 128;
  recipe.defaults.lr = 1e-3;
  recipe.defaults.epochs = 3;
  recipe.models = {"mlp"};
  recipe.optimizers = {"adam", "sgd", "adamw"};
  recipe.data_help = "a folder of Fashion-MNIST IDX files";
  recipe.supports_checkpoints = true;
  recipe.run = run_mlp_fashion_mnist;
  return recipe;
}

}  // namespace tessel::train
