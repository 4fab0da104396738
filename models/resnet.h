// ResNet-18/34/50/101/152 exactly as torchvision 0.14 builds them (BasicBlock / Bottleneck v1.5,
// stride on the 3x3 conv), with the same module tree and state-dict names (layer1.0.conv1.weight,
// layer2.0.downsample.0.weight, fc.bias, ...), so torchvision checkpoints load with strict names.
//   auto net = models::resnet18(models::ResNetOptions().num_classes(10).in_channels(1)
//                                   .small_image_stem(true));   // 28x28 Fashion-MNIST
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/arg.h"
#include "nn/nn.h"

namespace tessel::models {

struct ResNetOptions {
  TESSEL_ARG(int64_t, num_classes) = 1000;
  // Channels of the input images (3 for RGB, 1 for grey scale); only conv1's weight changes.
  TESSEL_ARG(int64_t, in_channels) = 3;
  // For 28x28 / 32x32 images: conv1 becomes 3x3 stride 1 padding 1 and the max pool an Identity,
  // the usual CIFAR adaptation. Parameter names stay the same.
  TESSEL_ARG(bool, small_image_stem) = false;
  // Zero the last batch norm weight of every residual branch, so each block starts as the
  // identity (torchvision's zero_init_residual).
  TESSEL_ARG(bool, zero_init_residual) = false;
};

// Two 3x3 convolutions (ResNet-18/34). Expansion 1.
class BasicBlock : public nn::Module {
 public:
  static constexpr int64_t kExpansion = 1;
  // `downsample` (conv1x1 + batch norm) maps the input onto the output's shape; null when the
  // shapes already agree.
  BasicBlock(int64_t in_planes, int64_t planes, int64_t stride,
             std::shared_ptr<nn::Sequential> downsample);
  // x (N, in_planes, H, W) -> (N, planes, H / stride, W / stride)
  Tensor forward(const Tensor& x) override;

  std::shared_ptr<nn::Conv2d> conv1;
  std::shared_ptr<nn::BatchNorm2d> bn1;
  std::shared_ptr<nn::ReLU> relu;
  std::shared_ptr<nn::Conv2d> conv2;
  std::shared_ptr<nn::BatchNorm2d> bn2;
  std::shared_ptr<nn::Sequential> downsample;  // may be null
};

// 1x1 reduce, 3x3 (carries the stride: ResNet v1.5), 1x1 expand (ResNet-50/101/152).
class Bottleneck : public nn::Module {
 public:
  static constexpr int64_t kExpansion = 4;
  Bottleneck(int64_t in_planes, int64_t planes, int64_t stride,
             std::shared_ptr<nn::Sequential> downsample);
  // x (N, in_planes, H, W) -> (N, 4 * planes, H / stride, W / stride)
  Tensor forward(const Tensor& x) override;

  std::shared_ptr<nn::Conv2d> conv1;
  std::shared_ptr<nn::BatchNorm2d> bn1;
  std::shared_ptr<nn::Conv2d> conv2;
  std::shared_ptr<nn::BatchNorm2d> bn2;
  std::shared_ptr<nn::Conv2d> conv3;
  std::shared_ptr<nn::BatchNorm2d> bn3;
  std::shared_ptr<nn::ReLU> relu;
  std::shared_ptr<nn::Sequential> downsample;  // may be null
};

enum class ResNetBlock { kBasic, kBottleneck };

class ResNet : public nn::Module {
 public:
  // `blocks_per_layer`: four counts, e.g. {2, 2, 2, 2} for ResNet-18 with kBasic.
  ResNet(ResNetBlock block, const std::vector<int64_t>& blocks_per_layer,
         const ResNetOptions& options = {});
  // x (N, in_channels, H, W) -> logits (N, num_classes)
  Tensor forward(const Tensor& x) override;

  ResNetOptions options;
  ResNetBlock block;
  std::shared_ptr<nn::Conv2d> conv1;
  std::shared_ptr<nn::BatchNorm2d> bn1;
  std::shared_ptr<nn::ReLU> relu;
  std::shared_ptr<nn::Module> maxpool;  // MaxPool2d, or Identity with the small-image stem
  std::shared_ptr<nn::Sequential> layer1, layer2, layer3, layer4;
  std::shared_ptr<nn::AdaptiveAvgPool2d> avgpool;
  std::shared_ptr<nn::Linear> fc;

 private:
  std::shared_ptr<nn::Sequential> make_layer(int64_t planes, int64_t blocks, int64_t stride);
  void initialize_like_torchvision();

  int64_t in_planes_ = 64;
};

std::shared_ptr<ResNet> resnet18(const ResNetOptions& options = {});
std::shared_ptr<ResNet> resnet34(const ResNetOptions& options = {});
std::shared_ptr<ResNet> resnet50(const ResNetOptions& options = {});
std::shared_ptr<ResNet> resnet101(const ResNetOptions& options = {});
std::shared_ptr<ResNet> resnet152(const ResNetOptions& options = {});

// "resnet18", "resnet34", "resnet50", "resnet101", "resnet152".
const std::vector<std::string>& resnet_names();
// By name; an unknown name is an error listing the known ones.
std::shared_ptr<ResNet> make_resnet(const std::string& name, const ResNetOptions& options = {});

}  // namespace tessel::models
