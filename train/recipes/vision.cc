// The training loop of the five image recipes (vision_recipes.cc holds what sets them apart).
#include "train/recipes/vision.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

#include "core/autocast.h"
#include "core/error.h"
#include "data/augment.h"
#include "data/cifar.h"
#include "data/data_loader.h"
#include "models/resnet.h"
#include "models/shufflenet.h"
#include "models/vision_parallel.h"
#include "ops/ops.h"
#include "optim/lr_scheduler.h"
#include "optim/sgd.h"
#include "parallel/zero.h"
#include "train/engine/checkpointer.h"
#include "train/engine/run_layout.h"
#include "train/engine/setup.h"
#include "train/engine/status_log.h"
#include "train/engine/training_memory.h"
#include "train/engine/training_plan.h"
#include "train/tasks/classifier.h"
#include "train/tasks/image_folder.h"
#include "train/tasks/planned_module.h"

namespace tessel::train {
namespace {

std::shared_ptr<data::ImageDataset> load_split(const ImageRecipeSpec& spec, const std::string& path,
                                               data::Split split) {
  switch (spec.data) {
    case DataFormat::kFashionMnist:
      return data::load_fashion_mnist(path, split);
    case DataFormat::kCifar10:
      return data::load_cifar10(path, split);
    case DataFormat::kImageFolder:
      return load_image_folder(path, split);
  }
  TESSEL_FAIL("unreachable");
}

std::shared_ptr<nn::Module> make_model(const ImageRecipeSpec& spec, const std::string& name,
                                       int64_t channels, int64_t classes) {
  if (spec.family == Family::kResNet)
    return models::make_resnet(name, models::ResNetOptions()
                                         .num_classes(classes)
                                         .in_channels(channels)
                                         .small_image_stem(spec.resnet_small_stem)
                                         .zero_init_residual(spec.zero_init_residual));
  return models::make_shufflenet(
      name,
      models::ShuffleNetV2Options().num_classes(classes).in_channels(channels).small_image_stem(
          spec.shufflenet_small_stem));
}

// Random crop (padded with the mean colour, or black) and horizontal flip.
data::TransformList augmentation(const ImageRecipeSpec& spec, const data::ImageDataset& images) {
  data::TransformList transforms;
  if (spec.crop_padding > 0) {
    std::vector<float> fill;
    if (spec.pad_with_black) {
      // Images are normalised: black is -mean/std of each channel, read off the darkest pixel.
      for (int64_t c = 0; c < images.images().size(1); ++c)
        fill.push_back(tessel::min(select(images.images(), 1, c)).item<float>());
    }
    transforms.add(std::make_shared<data::RandomCrop>(spec.crop_padding, fill));
  }
  transforms.add(std::make_shared<data::RandomHorizontalFlip>(0.5));
  return transforms;
}

RecipeResult run_image_recipe(const ImageRecipeSpec& spec, const TrainConfig& config,
                              const RunLayout& layout, std::ostream& log) {
  const auto start = std::chrono::steady_clock::now();
  begin_run(config, log);
  auto train_set = load_split(spec, *config.data, data::Split::kTrain);
  auto test_set = load_split(spec, *config.data, data::Split::kTest);
  const Shape& image_shape = train_set->images().sizes();
  const int64_t channels = image_shape[1];
  const int64_t classes = std::max(train_set->num_classes(), test_set->num_classes());
  TESSEL_CHECK(test_set->images().size(1) == channels &&
                   test_set->images().size(2) == image_shape[2] &&
                   test_set->images().size(3) == image_shape[3],
               "recipe ", config.recipe, ": training images are ", shape_str(image_shape),
               " but test images are ", shape_str(test_set->images().sizes()));
  log << "data: " << train_set->size() << " training and " << test_set->size() << " test images of "
      << channels << "x" << image_shape[2] << "x" << image_shape[3] << ", " << classes << " classes"
      << std::endl;

  auto full_model = make_model(spec, *config.model, channels, classes);
  int64_t parameters = 0;
  for (const Tensor& p : full_model->parameters()) parameters += p.numel();
  log << "model: " << *config.model << ", " << parameters << " parameters" << std::endl;
  // --device: parameters and buffers move before the optimizer makes its state next to them.
  const Device device = training_device(config);
  full_model->to(device);
  // With --tp > 1, the tensor-parallel form (batch-split trunk, class-split classifier); with a
  // --plan that has a tensor-parallel group, the plan's own ops as priced (its global batch of
  // images: the last, partial batch of an epoch is dropped).
  const bool planned = runs_planned_ops(layout);
  std::shared_ptr<nn::Module> model;
  if (planned) {
    const bool small_stem =
        spec.family == Family::kResNet ? spec.resnet_small_stem : spec.shufflenet_small_stem;
    auto stem = [](bool small) { return small ? "the stem for small images" : "ImageNet's stem"; };
    TESSEL_CHECK(layout.plan->small_image_stem == small_stem, "--plan: the plan was made for ",
                 *config.model, " with ", stem(layout.plan->small_image_stem),
                 ", this recipe's has ", stem(small_stem), ": make the plan ",
                 small_stem ? "with" : "without", " --small_image_stem");
    auto evaluated = make_model(spec, *config.model, channels, classes);
    evaluated->to(device);
    model =
        planned_classifier_model(layout, full_model, evaluated,
                                 {*config.batch_size, channels, image_shape[2], image_shape[3]});
  } else {
    model = parallel_classifier_model(layout, full_model);
  }

  double lr = *config.lr;
  if (spec.scale_lr_with_batch) lr *= static_cast<double>(*config.batch_size) / 256.0;
  const auto sgd_options = optim::SGDOptions(lr)
                               .momentum(spec.momentum)
                               .nesterov(spec.nesterov)
                               .weight_decay(spec.weight_decay);
  // --zero: a ZeroOptimizer over the dp group, whose parts this SGD updates.
  const auto optimizer_holder =
      make_run_optimizer(layout, *model, [&](const optim::NamedTensors& parameters) {
        return std::make_unique<optim::SGD>(parameters, sgd_options);
      });
  optim::Optimizer& optimizer = *optimizer_holder;
  // --zero=2 or 3 beside --tp: the batch-split trunk's gradients are summed over tp before ZeRO
  // reduce-scatters and drops them.
  auto* zero = dynamic_cast<parallel::ZeroOptimizer*>(&optimizer);
  auto* tensor_parallel = dynamic_cast<models::TensorParallelClassifier*>(model.get());
  if (zero && tensor_parallel && zero->stage() != parallel::ZeroStage::kOptimizerState)
    zero->sum_gradients_over(layout.tp_device_group, tensor_parallel->trunk_parameters());
  // --zero=2 or 3 beside a plan's own ops: ZeRO reduces their gradients over dp.
  if (auto* planned_module = dynamic_cast<PlannedModule*>(model.get()))
    planned_module->hand_gradients_to(optimizer);
  data::TransformList transforms = augmentation(spec, *train_set);
  // Each data-parallel rank reads its rows of every batch (under per-op degrees, each rank of
  // the line its rows).
  const auto [part, parts] = batch_part(layout);
  data::DataLoader train_loader(train_set, data::DataLoaderOptions()
                                               .batch_size(*config.batch_size)
                                               .shuffle(true)
                                               .seed(config.seed)
                                               .transform(transforms.batch_transform())
                                               .shard(part, parts)
                                               .drop_last(planned));
  const TrainingPlan plan(config, train_loader.num_batches());
  std::unique_ptr<optim::LRScheduler> scheduler;
  if (spec.schedule == Schedule::kCosineWithWarmup) {
    const int64_t warmup = std::min<int64_t>(
        plan.total_steps,
        std::max<int64_t>(1, std::llround(spec.warmup_epochs * plan.batches_per_epoch)));
    scheduler = std::make_unique<optim::CosineWithWarmup>(optimizer, warmup, plan.total_steps);
  } else {
    scheduler = std::make_unique<optim::StepLR>(
        optimizer, std::max<int64_t>(1, spec.step_epochs * plan.batches_per_epoch), 0.1);
  }
  log << "optimizer: SGD lr " << lr << " momentum " << spec.momentum
      << (spec.nesterov ? " nesterov" : "") << " weight decay " << spec.weight_decay
      << "; schedule " << scheduler->name() << " over " << plan.total_steps << " steps ("
      << plan.batches_per_epoch << " per epoch); augmentation " << transforms.str() << std::endl;

  ParallelClassifier classifier(model, layout);  // DDP over dp, the tp split's loss
  StatusLog status(config, layout, plan, optimizer, log);
  Checkpointer checkpointer(config, layout, plan, *model, optimizer, scheduler.get(), status);
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
          // --precision=bf16: products and convolutions of the forward pass run in bf16; backward
          // keeps the forward's dtypes and the update stays f32 (core/autocast.h).
          AutocastGuard autocast(DType::kBFloat16, config.precision == "bf16");
          loss = classifier.loss(to_training_device(batch->inputs, device),
                                 to_training_device(batch->targets, device));
        }
        optimizer.zero_grad();
        loss.value.backward();  // DDP's and the tp trunk's reductions finish inside
        optimizer.step();
        loss_value = loss.mean;
        samples = batch->targets.numel();
      }
      scheduler->step();
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

Recipe image_recipe(const std::string& name, const ImageRecipeSpec& spec) {
  Recipe recipe;
  recipe.name = name;
  recipe.models =
      spec.family == Family::kResNet ? models::resnet_names() : models::shufflenet_names();
  recipe.supports_checkpoints = true;
  recipe.run = [spec](const TrainConfig& config, const RunLayout& layout, std::ostream& log) {
    return run_image_recipe(spec, config, layout, log);
  };
  return recipe;
}

}  // namespace tessel::train
