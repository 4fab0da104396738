#include "models/shufflenet.h"

#include <map>

#include "ops/ops.h"

namespace tessel::models {
namespace {

using ModulePtr = std::shared_ptr<nn::Module>;

ModulePtr conv(int64_t in_channels, int64_t out_channels, int64_t kernel, int64_t stride,
               int64_t padding, int64_t groups = 1) {
  return std::make_shared<nn::Conv2d>(nn::Conv2dOptions(in_channels, out_channels, kernel)
                                          .stride(stride)
                                          .padding(padding)
                                          .groups(groups)
                                          .bias(false));
}

ModulePtr depthwise_conv(int64_t channels, int64_t stride) {
  return conv(channels, channels, 3, stride, 1, /*groups=*/channels);
}

ModulePtr batch_norm(int64_t channels) {
  return std::make_shared<nn::BatchNorm2d>(nn::BatchNormOptions(channels));
}

ModulePtr relu() { return std::make_shared<nn::ReLU>(); }

std::string join(const std::vector<std::string>& names) {
  std::string text;
  for (const auto& name : names) text += (text.empty() ? "" : ", ") + name;
  return text;
}

// channel_shuffle(cat({first, second}, 1), 2) in one copy: stacking on a new dim 2 gives
// (N, c, 2, H, W), which is exactly the transposed (N, 2, c, H, W) layout the shuffle makes.
Tensor concat_and_shuffle(const Tensor& first, const Tensor& second) {
  const Shape& sizes = first.sizes();
  return view(stack({first, second}, 2), {sizes[0], 2 * sizes[1], sizes[2], sizes[3]});
}

}  // namespace

Tensor channel_shuffle(const Tensor& x, int64_t groups) {
  TESSEL_CHECK(x.dim() == 4, "channel_shuffle: expected (N, C, H, W), got shape ",
               shape_str(x.sizes()));
  TESSEL_CHECK(groups > 0 && x.size(1) % groups == 0, "channel_shuffle: ", x.size(1),
               " channels cannot be split into ", groups, " equal groups");
  const int64_t batch = x.size(0), channels = x.size(1), height = x.size(2), width = x.size(3);
  Tensor grouped = reshape(x, {batch, groups, channels / groups, height, width});
  return view(contiguous(transpose(grouped, 1, 2)), {batch, channels, height, width});
}

InvertedResidual::InvertedResidual(int64_t in_channels, int64_t out_channels, int64_t stride_in)
    : Module("InvertedResidual"), stride(stride_in) {
  TESSEL_CHECK(stride >= 1 && stride <= 3, "InvertedResidual: stride must be 1, 2 or 3, got ",
               stride);
  const int64_t branch_features = out_channels / 2;
  TESSEL_CHECK(stride != 1 || in_channels == branch_features * 2,
               "InvertedResidual: with stride 1, in_channels (", in_channels,
               ") must equal out_channels (", out_channels, ") rounded down to an even number");
  branch1 = register_module("branch1", std::make_shared<nn::Sequential>());
  if (stride > 1) {
    branch1->push_back(depthwise_conv(in_channels, stride));
    branch1->push_back(batch_norm(in_channels));
    branch1->push_back(conv(in_channels, branch_features, 1, 1, 0));
    branch1->push_back(batch_norm(branch_features));
    branch1->push_back(relu());
  }
  branch2 = register_module(
      "branch2", std::make_shared<nn::Sequential>(std::initializer_list<ModulePtr>{
                     conv(stride > 1 ? in_channels : branch_features, branch_features, 1, 1, 0),
                     batch_norm(branch_features), relu(), depthwise_conv(branch_features, stride),
                     batch_norm(branch_features), conv(branch_features, branch_features, 1, 1, 0),
                     batch_norm(branch_features), relu()}));
}

Tensor InvertedResidual::forward(const Tensor& x) {
  if (stride == 1) {
    // The pass-through half stays a view of x; only the shuffle below copies it.
    std::vector<Tensor> halves = chunk(x, 2, 1);
    return concat_and_shuffle(halves[0], branch2->forward(halves[1]));
  }
  return concat_and_shuffle(branch1->forward(x), branch2->forward(x));
}

ShuffleNetV2::ShuffleNetV2(const std::vector<int64_t>& stages_repeats,
                           const std::vector<int64_t>& stages_out_channels,
                           const ShuffleNetV2Options& options_in)
    : Module("ShuffleNetV2"), options(options_in) {
  TESSEL_CHECK(stages_repeats.size() == 3, "ShuffleNetV2: expected 3 stage repeats, got ",
               stages_repeats);
  TESSEL_CHECK(stages_out_channels.size() == 5, "ShuffleNetV2: expected 5 stage widths, got ",
               stages_out_channels);
  TESSEL_CHECK(options.num_classes() > 0, "ShuffleNetV2: num_classes must be positive, got ",
               options.num_classes());
  TESSEL_CHECK(options.in_channels() > 0, "ShuffleNetV2: in_channels must be positive, got ",
               options.in_channels());
  for (int64_t repeats : stages_repeats)
    TESSEL_CHECK(repeats > 0, "ShuffleNetV2: every stage needs a block, got ", stages_repeats);

  int64_t channels = stages_out_channels[0];
  const int64_t stem_stride = options.small_image_stem() ? 1 : 2;
  conv1 = register_module(
      "conv1",
      std::make_shared<nn::Sequential>(std::initializer_list<ModulePtr>{
          conv(options.in_channels(), channels, 3, stem_stride, 1), batch_norm(channels), relu()}));
  if (options.small_image_stem()) {
    maxpool = register_module("maxpool", std::make_shared<nn::Identity>());
  } else {
    maxpool = register_module(
        "maxpool", std::make_shared<nn::MaxPool2d>(nn::MaxPool2dOptions(3).stride(2).padding(1)));
  }
  std::shared_ptr<nn::Sequential>* stages[3] = {&stage2, &stage3, &stage4};
  for (int i = 0; i < 3; ++i) {
    const int64_t out_channels = stages_out_channels[i + 1];
    auto stage = std::make_shared<nn::Sequential>();
    stage->push_back(std::make_shared<InvertedResidual>(channels, out_channels, 2));
    for (int64_t k = 1; k < stages_repeats[i]; ++k)
      stage->push_back(std::make_shared<InvertedResidual>(out_channels, out_channels, 1));
    *stages[i] = register_module("stage" + std::to_string(i + 2), stage);
    channels = out_channels;
  }
  const int64_t last_channels = stages_out_channels[4];
  conv5 = register_module(
      "conv5", std::make_shared<nn::Sequential>(std::initializer_list<ModulePtr>{
                   conv(channels, last_channels, 1, 1, 0), batch_norm(last_channels), relu()}));
  fc = register_module("fc", std::make_shared<nn::Linear>(last_channels, options.num_classes()));
}

Tensor ShuffleNetV2::forward(const Tensor& x) {
  TESSEL_CHECK(x.dim() == 4, "ShuffleNetV2: expected images (N, C, H, W), got shape ",
               shape_str(x.sizes()));
  TESSEL_CHECK(x.size(1) == options.in_channels(), "ShuffleNetV2: input has ", x.size(1),
               " channels but the model was built for in_channels=", options.in_channels(),
               " (input shape ", shape_str(x.sizes()), ", conv1.0.weight shape ",
               shape_str(conv1->at<nn::Conv2d>(0)->weight.sizes()), ")");
  Tensor out = maxpool->forward(conv1->forward(x));
  out = conv5->forward(stage4->forward(stage3->forward(stage2->forward(out))));
  return fc->forward(mean(out, {2, 3}));  // global average pool
}

std::shared_ptr<ShuffleNetV2> shufflenet_v2_x0_5(const ShuffleNetV2Options& options) {
  return std::make_shared<ShuffleNetV2>(std::vector<int64_t>{4, 8, 4},
                                        std::vector<int64_t>{24, 48, 96, 192, 1024}, options);
}
std::shared_ptr<ShuffleNetV2> shufflenet_v2_x1_0(const ShuffleNetV2Options& options) {
  return std::make_shared<ShuffleNetV2>(std::vector<int64_t>{4, 8, 4},
                                        std::vector<int64_t>{24, 116, 232, 464, 1024}, options);
}
std::shared_ptr<ShuffleNetV2> shufflenet_v2_x1_5(const ShuffleNetV2Options& options) {
  return std::make_shared<ShuffleNetV2>(std::vector<int64_t>{4, 8, 4},
                                        std::vector<int64_t>{24, 176, 352, 704, 1024}, options);
}
std::shared_ptr<ShuffleNetV2> shufflenet_v2_x2_0(const ShuffleNetV2Options& options) {
  return std::make_shared<ShuffleNetV2>(std::vector<int64_t>{4, 8, 4},
                                        std::vector<int64_t>{24, 244, 488, 976, 2048}, options);
}

const std::vector<std::string>& shufflenet_names() {
  static const std::vector<std::string> names = {"shufflenet_v2_x0_5", "shufflenet_v2_x1_0",
                                                 "shufflenet_v2_x1_5", "shufflenet_v2_x2_0"};
  return names;
}

std::shared_ptr<ShuffleNetV2> make_shufflenet(const std::string& name,
                                              const ShuffleNetV2Options& options) {
  using Factory = std::shared_ptr<ShuffleNetV2> (*)(const ShuffleNetV2Options&);
  static const std::map<std::string, Factory> factories = {
      {"shufflenet_v2_x0_5", shufflenet_v2_x0_5},
      {"shufflenet_v2_x1_0", shufflenet_v2_x1_0},
      {"shufflenet_v2_x1_5", shufflenet_v2_x1_5},
      {"shufflenet_v2_x2_0", shufflenet_v2_x2_0},
  };
  auto found = factories.find(name);
  TESSEL_CHECK(found != factories.end(), "make_shufflenet: unknown model '", name,
               "' (known models: ", join(shufflenet_names()), ")");
  return found->second(options);
}

}  // namespace tessel::models
