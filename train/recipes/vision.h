// Image-classification recipes: ResNet and ShuffleNet v2 on Fashion-MNIST (the data set Debian
// installs), on CIFAR-10 (binary version, --data=DIR), and an ImageNet-style ResNet recipe on
// images in CIFAR-10 binary or IDX format. SGD with momentum, augmentation, cosine or step LR.
// The five share one training loop (vision.cc), set apart by an ImageRecipeSpec
// (vision_recipes.cc).
//   ./tessel train --recipe=resnet18_fashion_mnist     # the default of `./tessel train`
#pragma once

#include <cstdint>
#include <string>

#include "train/recipes/recipe.h"

namespace tessel::train {

Recipe resnet18_fashion_mnist_recipe();
Recipe shufflenet_v2_fashion_mnist_recipe();
Recipe resnet_cifar10_recipe();
Recipe shufflenet_v2_cifar10_recipe();
Recipe resnet_imagenet_style_recipe();

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

// A recipe called `name` that trains as `spec` says; the caller fills in its description, data
// help and defaults.
Recipe image_recipe(const std::string& name, const ImageRecipeSpec& spec);

}  // namespace tessel::train
