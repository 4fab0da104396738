// Image-classification recipes: ResNet and ShuffleNet v2 on Fashion-MNIST (the data set Debian
// installs), on CIFAR-10 (binary version, --data=DIR), and an ImageNet-style ResNet recipe on
// images in CIFAR-10 binary or IDX format. SGD with momentum, augmentation, cosine or step LR.
//   ./tessel train --recipe=resnet18_fashion_mnist     # the default of `./tessel train`
#pragma once

#include <memory>
#include <string>

#include "data/dataset.h"
#include "train/recipes/recipe.h"

namespace tessel::train {

Recipe resnet18_fashion_mnist_recipe();
Recipe shufflenet_v2_fashion_mnist_recipe();
Recipe resnet_cifar10_recipe();
Recipe shufflenet_v2_cifar10_recipe();
Recipe resnet_imagenet_style_recipe();

// The `split` of an image folder in one of the formats the recipes read: CIFAR-10 binary
// (data_batch_1..5.bin / test_batch.bin, or a parent of cifar-10-batches-bin/) or IDX files
// ({train,t10k}-{images-idx3,labels-idx1}-ubyte, optionally .gz; any image size, classes from
// the labels, normalised with the training images' mean and standard deviation). Throws
// tessel::Error naming the folder when it holds neither.
std::shared_ptr<data::ImageDataset> load_image_folder(const std::string& path, data::Split split);

}  // namespace tessel::train
