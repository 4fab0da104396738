#include "train/recipes/mlp_fashion_mnist.h"

#include <chrono>

#include "core/autocast.h"
#include "data/data_loader.h"
#include "data/dataset.h"
#include "nn/activation.h"
#include "nn/linear.h"
#include "train/engine/checkpointer.h"
#include "train/engine/run_layout.h"
#include "train/engine/setup.h"
#include "train/engine/status_log.h"
#include "train/engine/training_memory.h"
#include "train/engine/training_plan.h"
#include "train/tasks/classifier.h"

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

RecipeResult run_mlp_fashion_mnist(const TrainConfig& config, const RunLayout& layout,
                                   std::ostream& log) {
  const auto start = std::chrono::steady_clock::now();
  begin_run(config, log);
  auto train_set = data::load_fashion_mnist(*config.data, data::Split::kTrain);
  auto test_set = data::load_fashion_mnist(*config.data, data::Split::kTest);
  log << "data: " << train_set->size() << " training and " << test_set->size() << " test images"
      << std::endl;

  auto model = make_mlp(28 * 28, {256, 128}, data::kFashionMnistClasses);
  log << *model << std::endl;
  const Device device = training_device(config);
  model->to(device);  // --device, before the optimizer makes its state next to the parameters
  const auto optimizer_holder =
      make_run_optimizer(layout, *model, [&](const optim::NamedTensors& parameters) {
        return make_optimizer(config, parameters, {});
      });
  optim::Optimizer& optimizer = *optimizer_holder;
  // Each data-parallel rank reads its rows of every batch.
  data::DataLoader train_loader(train_set, data::DataLoaderOptions()
                                               .batch_size(*config.batch_size)
                                               .shuffle(true)
                                               .seed(config.seed)
                                               .shard(layout.dp_rank, layout.dp));
  const TrainingPlan plan(config, train_loader.num_batches());

  ParallelClassifier classifier(model, layout);  // DDP over dp
  StatusLog status(config, layout, plan, optimizer, log);
  Checkpointer checkpointer(config, layout, plan, *model, optimizer, /*scheduler=*/nullptr, status);
  int64_t step = checkpointer.resume();
  TrainingMemory memory(config, *model, optimizer, log);  // --memory_budget, --memory_policy
  status.watch(memory);
  status.count_data(train_set->nbytes() + test_set->nbytes());
  auto evaluate = [&] {
    ready_for_evaluation(optimizer);  // --zero: the ranks' shares of the batches differ
    const EvalResult eval = classifier.evaluate(*test_set, *config.batch_size);
    return Evaluation{{"test_loss", eval.loss}, {"test_accuracy", eval.accuracy}};
  };

  model->train();
  for (int64_t epoch = plan.epoch_of(step); epoch <= plan.epochs && !plan.done(step); ++epoch) {
    train_loader.start_epoch(epoch - 1);
    for (int64_t skip = plan.batches_done(epoch, step); skip > 0; --skip) train_loader.next();
    status.begin_epoch();
    while (!plan.done(step)) {
      double loss_value = 0;
      int64_t samples = 0;
      {  // the batch and the graph are freed before the status line reads the memory in use
        const auto batch = train_loader.next();
        if (!batch) break;
        ClassifierLoss loss;
        {
          // --precision=bf16: the linear layers of the forward pass run in bf16 (core/autocast.h).
          AutocastGuard autocast(DType::kBFloat16, config.precision == "bf16");
          loss = classifier.loss(to_training_device(batch->inputs, device),
                                 to_training_device(batch->targets, device));
        }
        optimizer.zero_grad();
        loss.value.backward();  // with --dp, DDP's average over the ranks finishes inside
        optimizer.step();
        loss_value = loss.mean;
        samples = batch->targets.numel();
      }
      ++step;
      memory.after_step(log);
      status.step(step, epoch, loss_value, samples);
      if (plan.evaluates_at(step)) status.eval(step, epoch, evaluate());
      checkpointer.maybe_save(step);
    }
    if (plan.ends_epoch(epoch, step)) {
      if (!status.evaluated_at(step)) status.eval(step, epoch, evaluate());
      checkpointer.save(step);
    }
  }
  if (!status.evaluated_at(step)) status.eval(step, plan.epoch_of(step), evaluate());
  checkpointer.save(step);

  RecipeResult result = status.finish(step);
  result.resumed_from_step = checkpointer.resumed_from();
  result.last_checkpoint = checkpointer.last_saved();
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
