// ShuffleNet v2 (x0.5, x1.0, x1.5, x2.0) exactly as torchvision 0.14 builds it: conv1
// (conv, bn, relu), maxpool, stage2..stage4 of InvertedResidual blocks (branch1 / branch2),
// conv5, global mean, fc; state-dict names match (stage2.0.branch1.0.weight, conv5.1.running_var).
//   auto net = models::shufflenet_v2_x1_0(models::ShuffleNetV2Options().num_classes(10));
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/arg.h"
#include "nn/nn.h"

namespace tessel::models {

struct ShuffleNetV2Options {
  TESSEL_ARG(int64_t, num_classes) = 1000;
  // Channels of the input images; only conv1.0.weight changes.
  TESSEL_ARG(int64_t, in_channels) = 3;
  // For 28x28 / 32x32 images: conv1 runs with stride 1 and the max pool becomes an Identity.
  // Parameter names and shapes stay the same.
  TESSEL_ARG(bool, small_image_stem) = false;
};

// Interleaves the channels of `groups` equal groups: (N, g*c, H, W) viewed as (N, g, c, H, W),
// transposed to (N, c, g, H, W), made contiguous and viewed back.
Tensor channel_shuffle(const Tensor& x, int64_t groups);

// The ShuffleNet v2 unit. Stride 1: half the channels pass through, the other half go through
// branch2. Stride > 1: both branches see the whole input and halve the resolution. The two
// halves are then concatenated and shuffled.
class InvertedResidual : public nn::Module {
 public:
  InvertedResidual(int64_t in_channels, int64_t out_channels, int64_t stride);
  // x (N, in_channels, H, W) -> (N, out_channels, H / stride, W / stride)
  Tensor forward(const Tensor& x) override;

  int64_t stride;
  std::shared_ptr<nn::Sequential> branch1;  // empty when stride is 1
  std::shared_ptr<nn::Sequential> branch2;
};

class ShuffleNetV2 : public nn::Module {
 public:
  // `stages_repeats`: 3 block counts; `stages_out_channels`: 5 widths (conv1, stage2..4, conv5).
  ShuffleNetV2(const std::vector<int64_t>& stages_repeats,
               const std::vector<int64_t>& stages_out_channels,
               const ShuffleNetV2Options& options = {});
  // x (N, in_channels, H, W) -> logits (N, num_classes)
  Tensor forward(const Tensor& x) override;

  ShuffleNetV2Options options;
  std::shared_ptr<nn::Sequential> conv1;
  std::shared_ptr<nn::Module> maxpool;  // MaxPool2d, or Identity with the small-image stem
  std::shared_ptr<nn::Sequential> stage2, stage3, stage4;
  std::shared_ptr<nn::Sequential> conv5;
  std::shared_ptr<nn::Linear> fc;
};

std::shared_ptr<ShuffleNetV2> shufflenet_v2_x0_5(const ShuffleNetV2Options& options = {});
std::shared_ptr<ShuffleNetV2> shufflenet_v2_x1_0(const ShuffleNetV2Options& options = {});
std::shared_ptr<ShuffleNetV2> shufflenet_v2_x1_5(const ShuffleNetV2Options& options = {});
std::shared_ptr<ShuffleNetV2> shufflenet_v2_x2_0(const ShuffleNetV2Options& options = {});

// "shufflenet_v2_x0_5", "shufflenet_v2_x1_0", "shufflenet_v2_x1_5", "shufflenet_v2_x2_0".
const std::vector<std::string>& shufflenet_names();
// By name; an unknown name is an error listing the known ones.
std::shared_ptr<ShuffleNetV2> make_shufflenet(const std::string& name,
                                              const ShuffleNetV2Options& options = {});

}  // namespace tessel::models
