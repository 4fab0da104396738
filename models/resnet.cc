#include "models/resnet.h"

#include <functional>
#include <map>
#include <sstream>

#include "ops/ops.h"

namespace tessel::models {
namespace {

std::shared_ptr<nn::Conv2d> conv3x3(int64_t in_planes, int64_t out_planes, int64_t stride = 1) {
  return std::make_shared<nn::Conv2d>(
      nn::Conv2dOptions(in_planes, out_planes, 3).stride(stride).padding(1).bias(false));
}

std::shared_ptr<nn::Conv2d> conv1x1(int64_t in_planes, int64_t out_planes, int64_t stride = 1) {
  return std::make_shared<nn::Conv2d>(
      nn::Conv2dOptions(in_planes, out_planes, 1).stride(stride).bias(false));
}

std::shared_ptr<nn::BatchNorm2d> batch_norm(int64_t channels) {
  return std::make_shared<nn::BatchNorm2d>(nn::BatchNormOptions(channels));
}

std::string join(const std::vector<std::string>& names) {
  std::string text;
  for (const auto& name : names) text += (text.empty() ? "" : ", ") + name;
  return text;
}

}  // namespace

BasicBlock::BasicBlock(int64_t in_planes, int64_t planes, int64_t stride,
                       std::shared_ptr<nn::Sequential> downsample_in)
    : Module("BasicBlock") {
  // Registration order is torchvision's, so state dicts list entries in the same order.
  conv1 = register_module("conv1", conv3x3(in_planes, planes, stride));
  bn1 = register_module("bn1", batch_norm(planes));
  relu = register_module("relu", std::make_shared<nn::ReLU>());
  conv2 = register_module("conv2", conv3x3(planes, planes));
  bn2 = register_module("bn2", batch_norm(planes));
  if (downsample_in) downsample = register_module("downsample", std::move(downsample_in));
}

Tensor BasicBlock::forward(const Tensor& x) {
  Tensor out = bn1->forward_relu(conv1->forward(x));
  out = bn2->forward(conv2->forward(out));
  Tensor identity = downsample ? downsample->forward(x) : x;
  return relu->forward(add(out, identity));
}

Bottleneck::Bottleneck(int64_t in_planes, int64_t planes, int64_t stride,
                       std::shared_ptr<nn::Sequential> downsample_in)
    : Module("Bottleneck") {
  const int64_t width = planes;  // groups 1, base width 64
  conv1 = register_module("conv1", conv1x1(in_planes, width));
  bn1 = register_module("bn1", batch_norm(width));
  conv2 = register_module("conv2", conv3x3(width, width, stride));
  bn2 = register_module("bn2", batch_norm(width));
  conv3 = register_module("conv3", conv1x1(width, planes * kExpansion));
  bn3 = register_module("bn3", batch_norm(planes * kExpansion));
  relu = register_module("relu", std::make_shared<nn::ReLU>());
  if (downsample_in) downsample = register_module("downsample", std::move(downsample_in));
}

Tensor Bottleneck::forward(const Tensor& x) {
  Tensor out = bn1->forward_relu(conv1->forward(x));
  out = bn2->forward_relu(conv2->forward(out));
  out = bn3->forward(conv3->forward(out));
  Tensor identity = downsample ? downsample->forward(x) : x;
  return relu->forward(add(out, identity));
}

ResNet::ResNet(ResNetBlock block_in, const std::vector<int64_t>& blocks_per_layer,
               const ResNetOptions& options_in)
    : Module("ResNet"), options(options_in), block(block_in) {
  TESSEL_CHECK(options.num_classes() > 0, "ResNet: num_classes must be positive, got ",
               options.num_classes());
  TESSEL_CHECK(options.in_channels() > 0, "ResNet: in_channels must be positive, got ",
               options.in_channels());
  TESSEL_CHECK(blocks_per_layer.size() == 4,
               "ResNet: expected 4 block counts (one per layer), got ", blocks_per_layer.size());
  for (int64_t count : blocks_per_layer)
    TESSEL_CHECK(count > 0, "ResNet: every layer needs at least one block, got ", blocks_per_layer);

  if (options.small_image_stem()) {
    conv1 = register_module(
        "conv1",
        std::make_shared<nn::Conv2d>(
            nn::Conv2dOptions(options.in_channels(), 64, 3).stride(1).padding(1).bias(false)));
  } else {
    conv1 = register_module(
        "conv1",
        std::make_shared<nn::Conv2d>(
            nn::Conv2dOptions(options.in_channels(), 64, 7).stride(2).padding(3).bias(false)));
  }
  bn1 = register_module("bn1", batch_norm(64));
  relu = register_module("relu", std::make_shared<nn::ReLU>());
  if (options.small_image_stem()) {
    maxpool = register_module("maxpool", std::make_shared<nn::Identity>());
  } else {
    maxpool = register_module(
        "maxpool", std::make_shared<nn::MaxPool2d>(nn::MaxPool2dOptions(3).stride(2).padding(1)));
  }
  layer1 = register_module("layer1", make_layer(64, blocks_per_layer[0], 1));
  layer2 = register_module("layer2", make_layer(128, blocks_per_layer[1], 2));
  layer3 = register_module("layer3", make_layer(256, blocks_per_layer[2], 2));
  layer4 = register_module("layer4", make_layer(512, blocks_per_layer[3], 2));
  avgpool = register_module("avgpool", std::make_shared<nn::AdaptiveAvgPool2d>(1));
  const int64_t expansion =
      block == ResNetBlock::kBasic ? BasicBlock::kExpansion : Bottleneck::kExpansion;
  fc = register_module("fc", std::make_shared<nn::Linear>(512 * expansion, options.num_classes()));
  initialize_like_torchvision();
}

std::shared_ptr<nn::Sequential> ResNet::make_layer(int64_t planes, int64_t blocks, int64_t stride) {
  const int64_t expansion =
      block == ResNetBlock::kBasic ? BasicBlock::kExpansion : Bottleneck::kExpansion;
  auto make_block = [&](int64_t block_stride, std::shared_ptr<nn::Sequential> downsample) {
    std::shared_ptr<nn::Module> made;
    if (block == ResNetBlock::kBasic) {
      made = std::make_shared<BasicBlock>(in_planes_, planes, block_stride, std::move(downsample));
    } else {
      made = std::make_shared<Bottleneck>(in_planes_, planes, block_stride, std::move(downsample));
    }
    return made;
  };
  std::shared_ptr<nn::Sequential> downsample;
  if (stride != 1 || in_planes_ != planes * expansion) {
    downsample =
        std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
            conv1x1(in_planes_, planes * expansion, stride), batch_norm(planes * expansion)});
  }
  auto layer = std::make_shared<nn::Sequential>();
  layer->push_back(make_block(stride, downsample));
  in_planes_ = planes * expansion;
  for (int64_t i = 1; i < blocks; ++i) layer->push_back(make_block(1, nullptr));
  return layer;
}

void ResNet::initialize_like_torchvision() {
  for (nn::Module* module : modules()) {
    if (auto* conv = dynamic_cast<nn::Conv2d*>(module)) {
      nn::init::kaiming_normal_(conv->weight, 0.0, "fan_out", "relu");
    } else if (auto* norm = dynamic_cast<nn::BatchNorm2d*>(module)) {
      nn::init::ones_(norm->weight);
      nn::init::zeros_(norm->bias);
    }
  }
  if (!options.zero_init_residual()) return;
  for (nn::Module* module : modules()) {
    if (auto* bottleneck = dynamic_cast<Bottleneck*>(module)) {
      nn::init::zeros_(bottleneck->bn3->weight);
    } else if (auto* basic = dynamic_cast<BasicBlock*>(module)) {
      nn::init::zeros_(basic->bn2->weight);
    }
  }
}

Tensor ResNet::forward(const Tensor& x) {
  TESSEL_CHECK(x.dim() == 4, "ResNet: expected images (N, C, H, W), got shape ",
               shape_str(x.sizes()));
  TESSEL_CHECK(x.size(1) == options.in_channels(), "ResNet: input has ", x.size(1),
               " channels but the model was built for in_channels=", options.in_channels(),
               " (input shape ", shape_str(x.sizes()), ", conv1.weight shape ",
               shape_str(conv1->weight.sizes()), ")");
  Tensor out = maxpool->forward(bn1->forward_relu(conv1->forward(x)));
  out = layer4->forward(layer3->forward(layer2->forward(layer1->forward(out))));
  out = flatten(avgpool->forward(out), 1);
  return fc->forward(out);
}

std::shared_ptr<ResNet> resnet18(const ResNetOptions& options) {
  return std::make_shared<ResNet>(ResNetBlock::kBasic, std::vector<int64_t>{2, 2, 2, 2}, options);
}
std::shared_ptr<ResNet> resnet34(const ResNetOptions& options) {
  return std::make_shared<ResNet>(ResNetBlock::kBasic, std::vector<int64_t>{3, 4, 6, 3}, options);
}
std::shared_ptr<ResNet> resnet50(const ResNetOptions& options) {
  return std::make_shared<ResNet>(ResNetBlock::kBottleneck, std::vector<int64_t>{3, 4, 6, 3},
                                  options);
}
std::shared_ptr<ResNet> resnet101(const ResNetOptions& options) {
  return std::make_shared<ResNet>(ResNetBlock::kBottleneck, std::vector<int64_t>{3, 4, 23, 3},
                                  options);
}
std::shared_ptr<ResNet> resnet152(const ResNetOptions& options) {
  return std::make_shared<ResNet>(ResNetBlock::kBottleneck, std::vector<int64_t>{3, 8, 36, 3},
                                  options);
}

const std::vector<std::string>& resnet_names() {
  static const std::vector<std::string> names = {"resnet18", "resnet34", "resnet50", "resnet101",
                                                 "resnet152"};
  return names;
}

std::shared_ptr<ResNet> make_resnet(const std::string& name, const ResNetOptions& options) {
  using Factory = std::shared_ptr<ResNet> (*)(const ResNetOptions&);
  static const std::map<std::string, Factory> factories = {
      {"resnet18", resnet18},   {"resnet34", resnet34},   {"resnet50", resnet50},
      {"resnet101", resnet101}, {"resnet152", resnet152},
  };
  auto found = factories.find(name);
  TESSEL_CHECK(found != factories.end(), "make_resnet: unknown model '", name,
               "' (known models: ", join(resnet_names()), ")");
  return found->second(options);
}

}  // namespace tessel::models
