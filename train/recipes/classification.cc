#include "train/recipes/classification.h"

#include "core/autograd.h"
#include "ops/ops.h"
#include "train/recipes/distributed.h"
#include "train/recipes/recipe_util.h"

namespace tessel::train {

EvalResult evaluate_classifier(nn::Module& model, const data::Dataset& dataset,
                               int64_t batch_size) {
  NoGradGuard no_grad;
  model.eval();
  const Device device = module_device(model);
  data::DataLoader loader(std::shared_ptr<const data::Dataset>(&dataset, [](auto*) {}),
                          data::DataLoaderOptions().batch_size(batch_size).shuffle(false));
  loader.start_epoch(0);
  EvalResult result;
  int64_t correct = 0;
  double loss_sum = 0;
  while (auto batch = loader.next()) {
    const Tensor logits = model(to_training_device(batch->inputs, device));
    loss_sum += cross_entropy(logits, to_training_device(batch->targets, device), -100, 0.0, "sum")
                    .item<double>();
    const auto predicted = argmax(logits, 1).to_vector<int64_t>();
    const auto targets = batch->targets.to_vector<int64_t>();
    for (size_t i = 0; i < targets.size(); ++i) correct += predicted[i] == targets[i];
    result.examples += static_cast<int64_t>(targets.size());
  }
  model.train();
  if (result.examples > 0) {
    result.accuracy = static_cast<double>(correct) / static_cast<double>(result.examples);
    result.loss = loss_sum / static_cast<double>(result.examples);
  }
  return result;
}

RecipeResult train_classifier(nn::Module& model, optim::Optimizer& optimizer,
                              optim::LRScheduler* scheduler, data::DataLoader& train_loader,
                              const data::Dataset& test_set, const TrainConfig& config,
                              std::ostream& log) {
  // Under mpirun: this rank's shard of each batch, DDP / tensor-parallel gradient reduction.
  ParallelClassifier parallel(std::shared_ptr<nn::Module>(&model, [](nn::Module*) {}));
  // A loader made with .shard(dp_rank, dp) reads only this rank's rows of each batch.
  const int64_t shards = train_loader.options().shard_count_;
  TESSEL_CHECK(shards == 1 || shards == distributed_run().dp,
               "train_classifier: the loader reads 1 of ", shards,
               " parts of each batch but the run has ", distributed_run().dp,
               " data-parallel ranks");
  const bool sharded = shards > 1;
  // --device: the recipe moved the model there; each batch follows it (read and augmented on CPU).
  const Device device = training_device(config);
  TESSEL_CHECK(module_device(model) == device, "train_classifier: the model is on ",
               module_device(model).str(), " but --device=", config.device,
               ": move it with model.to(device) before making the optimizer");
  TrainingTask task;
  task.model = &model;
  task.optimizer = &optimizer;
  task.scheduler = scheduler;
  task.batches_per_epoch = train_loader.num_batches();
  task.start_epoch = [&](int64_t epoch, int64_t skip) {
    train_loader.start_epoch(epoch);
    for (int64_t i = 0; i < skip; ++i) train_loader.next();
  };
  task.train_step = [&](StepResult* result) {
    auto batch = train_loader.next();
    if (!batch) return false;
    result->loss =
        parallel.forward_backward(to_training_device(batch->inputs, device),
                                  to_training_device(batch->targets, device), optimizer, sharded);
    optimizer.step();
    result->samples = batch->targets.numel();
    return true;
  };
  task.evaluate = [&]() -> Evaluation {
    const EvalResult eval = parallel.evaluate(test_set);
    return {{"test_loss", eval.loss}, {"test_accuracy", eval.accuracy}};
  };
  return run_training(task, config, log);
}

}  // namespace tessel::train
