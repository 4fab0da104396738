#include "models/cifar_resnet.h"

#include <utility>

#include "ops/ops.h"

namespace tessel::models {
namespace {

std::shared_ptr<nn::Conv2d> conv3x3(int64_t in_planes, int64_t out_planes, int64_t stride) {
  return std::make_shared<nn::Conv2d>(
      nn::Conv2dOptions(in_planes, out_planes, 3).stride(stride).padding(1).bias(false));
}

std::shared_ptr<nn::BatchNorm2d> batch_norm(int64_t channels) {
  return std::make_shared<nn::BatchNorm2d>(nn::BatchNormOptions(channels));
}

// Names and blocks per stage n (depth 6n + 2), in order of depth.
const std::vector<std::pair<std::string, int64_t>>& known_models() {
  static const std::vector<std::pair<std::string, int64_t>> models = {
      {"cifar_resnet20", 3}, {"cifar_resnet32", 5},   {"cifar_resnet44", 7},
      {"cifar_resnet56", 9}, {"cifar_resnet110", 18}, {"cifar_resnet1202", 200},
  };
  return models;
}

}  // namespace

CifarBasicBlock::CifarBasicBlock(int64_t in_planes, int64_t planes, int64_t stride)
    : Module("CifarBasicBlock"), stride_(stride), added_channels_(planes - in_planes) {
  TESSEL_CHECK(added_channels_ >= 0 && added_channels_ % 2 == 0 && (stride == 1 || stride == 2),
               "CifarBasicBlock: option A shortcuts keep or add an even number of channels with "
               "stride 1 or 2, got ",
               in_planes, " -> ", planes, " channels at stride ", stride);
  conv1 = register_module("conv1", conv3x3(in_planes, planes, stride));
  bn1 = register_module("bn1", batch_norm(planes));
  conv2 = register_module("conv2", conv3x3(planes, planes, 1));
  bn2 = register_module("bn2", batch_norm(planes));
}

Tensor CifarBasicBlock::forward(const Tensor& x) {
  Tensor out = bn1->forward_relu(conv1->forward(x));
  out = bn2->forward(conv2->forward(out));
  Tensor shortcut = x;
  if (stride_ != 1) {
    // The pixels the stride-2 convolution centres on.
    shortcut = shortcut.slice(2, 0, x.size(2), stride_).slice(3, 0, x.size(3), stride_);
  }
  if (added_channels_ > 0) {
    Shape zero_sizes = shortcut.sizes();
    zero_sizes[1] = added_channels_ / 2;
    const Tensor padding =
        zeros(zero_sizes, TensorOptions(shortcut.dtype()).device(shortcut.device()));
    shortcut = cat({padding, shortcut, padding}, 1);
  }
  return relu(add(out, shortcut));
}

CifarResNet::CifarResNet(int64_t blocks_per_stage, const CifarResNetOptions& options_in)
    : Module("CifarResNet"), options(options_in) {
  TESSEL_CHECK(blocks_per_stage >= 1, "CifarResNet: needs at least one block per stage, got ",
               blocks_per_stage);
  TESSEL_CHECK(options.num_classes() > 0, "CifarResNet: num_classes must be positive, got ",
               options.num_classes());
  TESSEL_CHECK(options.in_channels() > 0, "CifarResNet: in_channels must be positive, got ",
               options.in_channels());
  conv1 = register_module("conv1", conv3x3(options.in_channels(), 16, 1));
  bn1 = register_module("bn1", batch_norm(16));
  int64_t in_planes = 16;
  auto make_stage = [&](int64_t planes, int64_t stride) {
    auto stage = std::make_shared<nn::Sequential>();
    for (int64_t i = 0; i < blocks_per_stage; ++i) {
      stage->push_back(std::make_shared<CifarBasicBlock>(in_planes, planes, i == 0 ? stride : 1));
      in_planes = planes;
    }
    return stage;
  };
  layer1 = register_module("layer1", make_stage(16, 1));
  layer2 = register_module("layer2", make_stage(32, 2));
  layer3 = register_module("layer3", make_stage(64, 2));
  linear = register_module("linear", std::make_shared<nn::Linear>(64, options.num_classes()));
  // He et al.'s initialisation of the weights; batch norms start at 1 and 0.
  for (nn::Module* module : modules()) {
    if (auto* conv = dynamic_cast<nn::Conv2d*>(module)) {
      nn::init::kaiming_normal_(conv->weight, 0.0, "fan_in", "relu");
    } else if (auto* fully_connected = dynamic_cast<nn::Linear*>(module)) {
      nn::init::kaiming_normal_(fully_connected->weight, 0.0, "fan_in", "relu");
    }
  }
}

Tensor CifarResNet::forward(const Tensor& x) {
  TESSEL_CHECK(x.dim() == 4 && x.size(1) == options.in_channels(),
               "CifarResNet: expected images (N, ", options.in_channels(), ", H, W), got shape ",
               shape_str(x.sizes()));
  Tensor out = bn1->forward_relu(conv1->forward(x));
  out = layer3->forward(layer2->forward(layer1->forward(out)));
  out = mean(out, {2, 3});
  return linear->forward(out);
}

const std::vector<std::string>& cifar_resnet_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> result;
    for (const auto& entry : known_models()) result.push_back(entry.first);
    return result;
  }();
  return names;
}

std::shared_ptr<CifarResNet> make_cifar_resnet(const std::string& name,
                                               const CifarResNetOptions& options) {
  for (const auto& [known, blocks] : known_models())
    if (known == name) return std::make_shared<CifarResNet>(blocks, options);
  std::string known;
  for (const auto& entry : known_models()) known += (known.empty() ? "" : ", ") + entry.first;
  TESSEL_FAIL("make_cifar_resnet: unknown model '", name, "' (known models: ", known, ")");
}

}  // namespace tessel::models
