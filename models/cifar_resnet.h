// The CIFAR-10 ResNets of He et al. (2016, section 4.2), the family of the DTR paper's
// ResNet-1202: a 3x3 stem of 16 channels, three stages of n basic blocks at 16, 32 and 64
// channels (32x32, 16x16, 8x8 for CIFAR images), global average pooling and a linear classifier;
// depth 6n + 2. Where a stage halves the plane and doubles the channels the shortcut is the
// paper's option A, without parameters: every other pixel, the new channels zero (half of them on
// each side). State-dict names: conv1, bn1, layer1.0.conv1, ..., linear.
//   auto net = models::make_cifar_resnet("cifar_resnet56");   // 0.86 M parameters
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/arg.h"
#include "nn/nn.h"

namespace tessel::models {

struct CifarResNetOptions {
  TESSEL_ARG(int64_t, num_classes) = 10;
  TESSEL_ARG(int64_t, in_channels) = 3;
};

// Two 3x3 convolutions with batch norm; the shortcut is the identity or option A.
class CifarBasicBlock : public nn::Module {
 public:
  CifarBasicBlock(int64_t in_planes, int64_t planes, int64_t stride);
  // x (N, in_planes, H, W) -> (N, planes, H / stride, W / stride)
  Tensor forward(const Tensor& x) override;

  std::shared_ptr<nn::Conv2d> conv1;
  std::shared_ptr<nn::BatchNorm2d> bn1;
  std::shared_ptr<nn::Conv2d> conv2;
  std::shared_ptr<nn::BatchNorm2d> bn2;

 private:
  int64_t stride_;
  int64_t added_channels_;  // zero channels the shortcut adds (0: the identity)
};

class CifarResNet : public nn::Module {
 public:
  // `blocks_per_stage`: n, the depth is 6n + 2.
  CifarResNet(int64_t blocks_per_stage, const CifarResNetOptions& options = {});
  // x (N, in_channels, H, W) -> logits (N, num_classes)
  Tensor forward(const Tensor& x) override;

  CifarResNetOptions options;
  std::shared_ptr<nn::Conv2d> conv1;
  std::shared_ptr<nn::BatchNorm2d> bn1;
  std::shared_ptr<nn::Sequential> layer1, layer2, layer3;
  std::shared_ptr<nn::Linear> linear;
};

// "cifar_resnet20", "cifar_resnet32", "cifar_resnet44", "cifar_resnet56", "cifar_resnet110",
// "cifar_resnet1202".
const std::vector<std::string>& cifar_resnet_names();
// By name; an unknown name is an error listing the known ones.
std::shared_ptr<CifarResNet> make_cifar_resnet(const std::string& name,
                                               const CifarResNetOptions& options = {});

}  // namespace tessel::models
