#include "train/recipes/vision.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>

#include "core/error.h"
#include "core/rng.h"
#include "core/threading.h"
#include "data/augment.h"
#include "data/cifar.h"
#include "data/data_loader.h"
#include "data/idx.h"
#include "models/resnet.h"
#include "models/shufflenet.h"
#include "ops/ops.h"
#include "optim/lr_scheduler.h"
#include "optim/sgd.h"
#include "train/recipes/classification.h"
#include "train/recipes/distributed.h"
#include "train/recipes/recipe_util.h"

namespace tessel::train {
namespace {

namespace fs = std::filesystem;

enum class DataFormat { kFashionMnist, kCifar10, kImageFolder };
enum class Family { kResNet, kShuffleNet };
enum class Schedule { kCosineWithWarmup, kStepLR };

// Everything that tells one image recipe from another.
struct ImageRecipeSpec {
  DataFormat data = DataFormat::kFashionMnist;
  Family family = Family::kResNet;
  bool resnet_small_stem = true;    // 3x3 stride-1 conv, no max pool; else the ImageNet stem
  bool zero_init_residual = false;  // every residual block starts as the identity
  bool shufflenet_small_stem = true;
  double momentum = 0.9;
  bool nesterov = true;
  double weight_decay = 5e-4;
  bool scale_lr_with_batch = false;  // lr * batch / 256 (the ImageNet rule)
  Schedule schedule = Schedule::kCosineWithWarmup;
  double warmup_epochs = 0;     // cosine: linear warmup over this many epochs (at least one step)
  int64_t step_epochs = 30;     // StepLR: divide the rate by 10 every step_epochs epochs
  int64_t crop_padding = 4;     // RandomCrop padding; 0: no crop
  bool pad_with_black = false;  // fill the crop border with black instead of the mean colour
};

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

RecipeResult run_image_recipe(const ImageRecipeSpec& spec, const TrainConfig& config,
                              std::ostream& log) {
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
  // --device: parameters and buffers move before the optimizer sees them (its state is made on
  // the parameters' device).
  full_model->to(training_device(config));
  // With --tp > 1, the tensor-parallel form (batch-split trunk, class-split classifier).
  auto model = parallel_classifier_model(full_model);

  double lr = *config.lr;
  if (spec.scale_lr_with_batch) lr *= static_cast<double>(*config.batch_size) / 256.0;
  optim::SGD optimizer(model->named_parameters(), optim::SGDOptions(lr)
                                                      .momentum(spec.momentum)
                                                      .nesterov(spec.nesterov)
                                                      .weight_decay(spec.weight_decay));

  data::TransformList augmentation;
  if (spec.crop_padding > 0) {
    std::vector<float> fill;
    if (spec.pad_with_black) {
      // Images are normalised: black is -mean/std of each channel, read off the darkest pixel.
      for (int64_t c = 0; c < channels; ++c)
        fill.push_back(tessel::min(select(train_set->images(), 1, c)).item<float>());
    }
    augmentation.add(std::make_shared<data::RandomCrop>(spec.crop_padding, fill));
  }
  augmentation.add(std::make_shared<data::RandomHorizontalFlip>(0.5));
  data::DataLoader train_loader(train_set,
                                data::DataLoaderOptions()
                                    .batch_size(*config.batch_size)
                                    .shuffle(true)
                                    .seed(config.seed)
                                    .transform(augmentation.batch_transform())
                                    .shard(distributed_run().dp_rank, distributed_run().dp));

  const int64_t batches_per_epoch = train_loader.num_batches();
  const int64_t total_steps = planned_steps(config, batches_per_epoch);
  std::unique_ptr<optim::LRScheduler> scheduler;
  if (spec.schedule == Schedule::kCosineWithWarmup) {
    const int64_t warmup = std::min<int64_t>(
        total_steps, std::max<int64_t>(1, std::llround(spec.warmup_epochs * batches_per_epoch)));
    scheduler = std::make_unique<optim::CosineWithWarmup>(optimizer, warmup, total_steps);
  } else {
    scheduler = std::make_unique<optim::StepLR>(
        optimizer, std::max<int64_t>(1, spec.step_epochs * batches_per_epoch), 0.1);
  }
  log << "optimizer: SGD lr " << lr << " momentum " << spec.momentum
      << (spec.nesterov ? " nesterov" : "") << " weight decay " << spec.weight_decay
      << "; schedule " << scheduler->name() << " over " << total_steps << " steps ("
      << batches_per_epoch << " per epoch); augmentation " << augmentation.str() << std::endl;

  RecipeResult result =
      train_classifier(*model, optimizer, scheduler.get(), train_loader, *test_set, config, log);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  log << "wall time: " << result.seconds << " s" << std::endl;
  return result;
}

Recipe image_recipe(const std::string& name, const ImageRecipeSpec& spec) {
  Recipe recipe;
  recipe.name = name;
  recipe.models =
      spec.family == Family::kResNet ? models::resnet_names() : models::shufflenet_names();
  recipe.supports_checkpoints = true;
  recipe.run = [spec](const TrainConfig& config, std::ostream& log) {
    return run_image_recipe(spec, config, log);
  };
  return recipe;
}

bool exists_with_optional_gz(const fs::path& path) {
  return fs::exists(path) || fs::exists(path.string() + ".gz");
}

std::string existing_idx(const fs::path& directory, const std::string& name) {
  const fs::path gz = directory / (name + ".gz");
  return fs::exists(gz) ? gz.string() : (directory / name).string();
}

}  // namespace

std::shared_ptr<data::ImageDataset> load_image_folder(const std::string& path, data::Split split) {
  const fs::path folder(path);
  TESSEL_CHECK(fs::exists(folder), "image folder '", path, "' does not exist");
  if (fs::is_regular_file(folder) || fs::exists(folder / "data_batch_1.bin") ||
      fs::exists(folder / "test_batch.bin") || fs::exists(folder / data::kCifar10FolderName))
    return data::load_cifar10(path, split);
  TESSEL_CHECK(exists_with_optional_gz(folder / "train-images-idx3-ubyte"), "image folder '", path,
               "' holds neither CIFAR-10 binary files (data_batch_1.bin .. data_batch_5.bin, "
               "test_batch.bin) nor IDX files (train-images-idx3-ubyte[.gz], "
               "train-labels-idx1-ubyte[.gz], t10k-images-idx3-ubyte[.gz], "
               "t10k-labels-idx1-ubyte[.gz])");
  // Statistics and classes come from the training split, so both splits agree.
  const data::IdxArray train_images =
      data::read_idx_images(existing_idx(folder, "train-images-idx3-ubyte"));
  double sum = 0, sum_sq = 0;
  for (uint8_t v : train_images.values) sum += v / 255.0, sum_sq += (v / 255.0) * (v / 255.0);
  const double n = std::max<double>(1.0, static_cast<double>(train_images.values.size()));
  const double mean = sum / n;
  const double stddev = std::max(1e-6, std::sqrt(std::max(0.0, sum_sq / n - mean * mean)));
  const data::IdxArray train_labels =
      data::read_idx_labels(existing_idx(folder, "train-labels-idx1-ubyte"));
  int64_t classes = 1;
  for (uint8_t label : train_labels.values) classes = std::max<int64_t>(classes, label + 1);
  const std::string prefix = split == data::Split::kTrain ? "train" : "t10k";
  return data::load_idx_dataset(existing_idx(folder, prefix + "-images-idx3-ubyte"),
                                existing_idx(folder, prefix + "-labels-idx1-ubyte"), classes,
                                static_cast<float>(mean), static_cast<float>(stddev));
}

Recipe resnet18_fashion_mnist_recipe() {
  ImageRecipeSpec spec;
  spec.data = DataFormat::kFashionMnist;
  spec.family = Family::kResNet;
  spec.resnet_small_stem = false;
  spec.zero_init_residual = true;
  spec.warmup_epochs = 0.2;
  spec.crop_padding = 2;
  spec.pad_with_black = true;
  Recipe recipe = image_recipe("resnet18_fashion_mnist", spec);
  recipe.description =
      "ResNet with torchvision's stem (7x7 stride 2 + max pool: 28x28 -> 7x7, the cheapest "
      "on 2 cores), zero-init residuals, SGD nesterov, cosine with warmup, random crop (pad 2) + "
      "flip, on Fashion-MNIST";
  recipe.data_help = "a folder of Fashion-MNIST IDX files";
  recipe.defaults.model = "resnet18";
  recipe.defaults.data = data::kFashionMnistDir;
  recipe.defaults.batch_size = 128;
  recipe.defaults.lr = 0.05;
  recipe.defaults.epochs = 5;
  return recipe;
}

Recipe shufflenet_v2_fashion_mnist_recipe() {
  ImageRecipeSpec spec;
  spec.data = DataFormat::kFashionMnist;
  spec.family = Family::kShuffleNet;
  spec.shufflenet_small_stem = true;
  spec.weight_decay = 4e-5;
  spec.warmup_epochs = 0.3;
  spec.crop_padding = 2;
  spec.pad_with_black = true;
  Recipe recipe = image_recipe("shufflenet_v2_fashion_mnist", spec);
  recipe.description =
      "ShuffleNet v2 (stride-1 stem, no max pool), SGD nesterov, cosine with warmup, random crop "
      "(pad 2) + flip, on Fashion-MNIST";
  recipe.data_help = "a folder of Fashion-MNIST IDX files";
  recipe.defaults.model = "shufflenet_v2_x1_0";
  recipe.defaults.data = data::kFashionMnistDir;
  recipe.defaults.batch_size = 128;
  recipe.defaults.lr = 0.1;
  recipe.defaults.epochs = 3;
  return recipe;
}

Recipe resnet_cifar10_recipe() {
  ImageRecipeSpec spec;
  spec.data = DataFormat::kCifar10;
  spec.family = Family::kResNet;
  spec.resnet_small_stem = true;
  spec.warmup_epochs = 1;
  spec.crop_padding = 4;
  Recipe recipe = image_recipe("resnet_cifar10", spec);
  recipe.description =
      "ResNet (3x3 stride-1 stem, the CIFAR adaptation), SGD nesterov, cosine with warmup, "
      "random crop (pad 4) + flip, on CIFAR-10";
  recipe.data_help =
      "required: the CIFAR-10 binary version (a folder of data_batch_1..5.bin and test_batch.bin, "
      "or its parent)";
  recipe.defaults.model = "resnet18";
  recipe.defaults.batch_size = 128;
  recipe.defaults.lr = 0.1;
  recipe.defaults.epochs = 30;
  return recipe;
}

Recipe shufflenet_v2_cifar10_recipe() {
  ImageRecipeSpec spec;
  spec.data = DataFormat::kCifar10;
  spec.family = Family::kShuffleNet;
  spec.shufflenet_small_stem = true;
  spec.weight_decay = 4e-5;
  spec.warmup_epochs = 1;
  spec.crop_padding = 4;
  Recipe recipe = image_recipe("shufflenet_v2_cifar10", spec);
  recipe.description =
      "ShuffleNet v2 (stride-1 stem, no max pool), SGD nesterov, cosine with warmup, random crop "
      "(pad 4) + flip, on CIFAR-10";
  recipe.data_help = resnet_cifar10_recipe().data_help;
  recipe.defaults.model = "shufflenet_v2_x1_0";
  recipe.defaults.batch_size = 128;
  recipe.defaults.lr = 0.1;
  recipe.defaults.epochs = 30;
  return recipe;
}

Recipe resnet_imagenet_style_recipe() {
  ImageRecipeSpec spec;
  spec.data = DataFormat::kImageFolder;
  spec.family = Family::kResNet;
  spec.resnet_small_stem = false;
  spec.nesterov = false;
  spec.weight_decay = 1e-4;
  spec.scale_lr_with_batch = true;
  spec.schedule = Schedule::kStepLR;
  spec.step_epochs = 30;
  spec.crop_padding = 4;
  Recipe recipe = image_recipe("resnet_imagenet_style", spec);
  recipe.description =
      "ResNet with torchvision's ImageNet recipe: 7x7 stem + max pool, SGD momentum 0.9, lr "
      "0.1 x batch/256, weight decay 1e-4, StepLR /10 every 30 epochs, 90 epochs, random crop + "
      "flip (no random-resized crop, no JPEG reader: convert ImageNet to one of the --data "
      "formats first)";
  recipe.data_help =
      "required: CIFAR-10 binary files, or a folder of IDX files {train,t10k}-{images-idx3,"
      "labels-idx1}-ubyte[.gz] of any image size";
  recipe.defaults.model = "resnet50";
  recipe.defaults.batch_size = 256;
  recipe.defaults.lr = 0.1;
  recipe.defaults.epochs = 90;
  return recipe;
}

}  // namespace tessel::train
