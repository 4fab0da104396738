// The five image recipes: what sets each apart (ImageRecipeSpec) and its defaults.
#include "data/dataset.h"
#include "models/resnet.h"
#include "train/recipes/vision.h"

namespace tessel::train {

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
