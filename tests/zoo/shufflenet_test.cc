// ShuffleNet v2 against torchvision 0.14: names and shapes of all four widths, one training and
// one evaluation step (logits, loss, every gradient, running statistics) with torchvision's
// weights, Tessel-written weights read back by an independent Python reader, the channel shuffle,
// options, and bad input. References come from tests/golden/make_golden_vision.py at test time.
#include "models/shufflenet.h"

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "core/autograd.h"
#include "core/safetensors.h"
#include "ops/ops.h"
#include "tests/testing.h"
#include "tests/zoo/vision_golden.h"

namespace tessel::models {
namespace {

using testing::all_close;
using testing::bitwise_equal;
using testing::golden_tensor;
using testing::throws_error;

// ---- The reference script (tests/zoo/vision_golden.h) ----

std::string script_options(const ShuffleNetV2Options& options) {
  return " --num-classes " + std::to_string(options.num_classes()) + " --in-channels " +
         std::to_string(options.in_channels()) +
         (options.small_image_stem() ? " --small-image-stem" : "");
}

// One reference step of `name` from the script, then Tessel in f64 and in f32.
void check_step(const std::string& name, const std::string& mode, int batch, int size,
                const ShuffleNetV2Options& options, F32Gradients f32_gradients) {
  const std::string path = temp_path(name + "_" + mode + ".safetensors");
  ASSERT_EQ(run_golden_script("--model " + name + " --mode " + mode + " --batch " +
                              std::to_string(batch) + " --size " + std::to_string(size) +
                              script_options(options) + " --out " + path),
            "");
  const auto golden = load_safetensors(path);
  for (DType dtype : {DType::kFloat64, DType::kFloat32}) {
    SCOPED_TRACE(name + " " + mode + " in " + dtype_name(dtype));
    expect_step_matches(*make_shufflenet(name, options), golden, mode == "train", dtype,
                        f32_gradients);
  }
}

// ---- Parity with torchvision ----

TEST(ShuffleNetParity, X1_0TrainStepMatchesTorchvision) {
  SKIP_WITHOUT_TORCH();
  check_step("shufflenet_v2_x1_0", "train", 2, 64, ShuffleNetV2Options().num_classes(10),
             F32Gradients::kNorm);
}

TEST(ShuffleNetParity, X1_0EvalStepMatchesTorchvision) {
  SKIP_WITHOUT_TORCH();
  check_step("shufflenet_v2_x1_0", "eval", 2, 64, ShuffleNetV2Options().num_classes(10),
             F32Gradients::kNorm);
}

TEST(ShuffleNetParity, X0_5SmallImageStemTrainStepOnGreyImagesMatchesTorchvision) {
  SKIP_WITHOUT_TORCH();
  check_step("shufflenet_v2_x0_5", "train", 2, 28,
             ShuffleNetV2Options().num_classes(10).in_channels(1).small_image_stem(true),
             F32Gradients::kNorm);
}

// ---- Names and shapes ----

using Entry = std::tuple<std::string, std::string, Shape>;  // kind, name, shape

// model name -> state dict entries, as the script lists them.
std::map<std::string, std::vector<Entry>> torchvision_listing(const std::string& models,
                                                              const std::string& options) {
  const std::string path = temp_path("listing.txt");
  EXPECT_EQ(run_golden_script("--list-parameters --model " + models + options + " --out " + path),
            "");
  std::map<std::string, std::vector<Entry>> listing;
  std::ifstream input(path);
  std::string model, kind, name, shape_text;
  while (input >> model >> kind >> name >> shape_text) {
    Shape shape;
    if (shape_text != "-") {
      std::stringstream dims(shape_text);
      std::string dim;
      while (std::getline(dims, dim, ',')) shape.push_back(std::stoll(dim));
    }
    listing[model].emplace_back(kind, name, shape);
  }
  return listing;
}

std::vector<Entry> tessel_listing(const nn::Module& model) {
  std::map<std::string, bool> is_parameter;
  for (const auto& entry : model.named_parameters()) is_parameter[entry.first] = true;
  std::vector<Entry> entries;
  for (const auto& [name, tensor] : model.state_dict())
    entries.emplace_back(is_parameter.count(name) ? "parameter" : "buffer", name, tensor.sizes());
  return entries;
}

void expect_same_listing(const std::vector<Entry>& actual, const std::vector<Entry>& expected,
                         const std::string& model) {
  ASSERT_EQ(actual.size(), expected.size()) << model << ": state dict sizes differ";
  for (size_t i = 0; i < actual.size(); ++i) {
    const auto& [kind, name, shape] = expected[i];
    EXPECT_EQ(actual[i], expected[i])
        << model << " entry " << i << ": Tessel has " << std::get<0>(actual[i]) << " "
        << std::get<1>(actual[i]) << " " << shape_str(std::get<2>(actual[i]))
        << ", torchvision has " << kind << " " << name << " " << shape_str(shape);
    if (actual[i] != expected[i]) return;  // one mismatch shifts every later entry
  }
}

TEST(ShuffleNet, StateDictNamesAndShapesMatchTorchvisionForAllWidths) {
  SKIP_WITHOUT_TORCH();
  std::string all_names;
  for (const auto& name : shufflenet_names()) all_names += (all_names.empty() ? "" : ",") + name;
  const auto listing = torchvision_listing(all_names, " --num-classes 1000");
  ASSERT_EQ(listing.size(), shufflenet_names().size());
  for (const auto& name : shufflenet_names()) {
    expect_same_listing(tessel_listing(*make_shufflenet(name)), listing.at(name), name);
  }
}

TEST(ShuffleNet, SmallImageStemAndGreyInputKeepTorchvisionNames) {
  SKIP_WITHOUT_TORCH();
  const auto options = ShuffleNetV2Options().num_classes(10).in_channels(1).small_image_stem(true);
  const auto listing = torchvision_listing("shufflenet_v2_x1_0", script_options(options));
  expect_same_listing(tessel_listing(*shufflenet_v2_x1_0(options)),
                      listing.at("shufflenet_v2_x1_0"), "shufflenet_v2_x1_0");
}

// ---- Tessel's own weights, read by the independent Python reader ----

TEST(ShuffleNet, WeightsWrittenByTesselGiveTheSameLogitsInTorchvision) {
  SKIP_WITHOUT_TORCH();
  const auto options = ShuffleNetV2Options().num_classes(10).in_channels(1).small_image_stem(true);
  auto model = shufflenet_v2_x0_5(options);
  Tensor input = randn({2, 1, 28, 28});
  {
    NoGradGuard no_grad;
    model->train();
    model->forward(input);  // running statistics and counters move away from their defaults
    model->forward(mul(input, 0.5));
  }
  model->eval();
  Tensor logits;
  {
    NoGradGuard no_grad;
    logits = model->forward(input);
  }
  nn::NamedTensors entries = model->state_dict();
  entries.emplace_back("input", input);
  const std::string weights = temp_path("tessel_shufflenet.safetensors");
  const std::string result = temp_path("torchvision_shufflenet_logits.safetensors");
  save_safetensors(weights, entries, {{"model", "shufflenet_v2_x0_5"}});
  ASSERT_EQ(run_golden_script("--check-tessel-weights " + weights + " --model shufflenet_v2_x0_5" +
                              script_options(options) + " --out " + result),
            "");
  EXPECT_TRUE(
      all_close(logits, golden_tensor(load_safetensors(result), "logits"), kF32Rtol, kF32Atol));
}

// ---- The channel shuffle ----

TEST(ShuffleNet, ChannelShuffleInterleavesTheGroups) {
  // Channel c holds the value c; two groups of four interleave as 0 4 1 5 2 6 3 7.
  Tensor x = reshape(expand(reshape(arange(0.0, 8.0), {1, 8, 1, 1}), {2, 8, 2, 3}), {2, 8, 2, 3});
  Tensor shuffled = channel_shuffle(x, 2);
  ASSERT_EQ(shuffled.sizes(), (Shape{2, 8, 2, 3}));
  EXPECT_TRUE(bitwise_equal(select(select(select(shuffled, 3, 1), 2, 0), 0, 1),
                            tensor({0, 4, 1, 5, 2, 6, 3, 7}, {8})));
  Tensor three_groups = channel_shuffle(reshape(arange(0.0, 6.0), {1, 6, 1, 1}), 3);
  EXPECT_TRUE(bitwise_equal(reshape(three_groups, {6}), tensor({0, 2, 4, 1, 3, 5}, {6})));
}

TEST(ShuffleNet, BlocksConcatenateAndShuffleLikeTorchvision) {
  // The block fuses cat and channel_shuffle into one copy; it must equal torchvision's two steps.
  InvertedResidual downsampling(24, 48, 2);
  InvertedResidual regular(48, 48, 1);
  Tensor x = randn({2, 24, 8, 8});
  Tensor expected_down = channel_shuffle(
      cat({downsampling.branch1->forward(x), downsampling.branch2->forward(x)}, 1), 2);
  Tensor down = downsampling.forward(x);
  EXPECT_TRUE(bitwise_equal(down, expected_down));
  std::vector<Tensor> halves = chunk(down, 2, 1);
  Tensor expected = channel_shuffle(cat({halves[0], regular.branch2->forward(halves[1])}, 1), 2);
  EXPECT_TRUE(bitwise_equal(regular.forward(down), expected));
  EXPECT_EQ(regular.branch1->size(), 0u);  // registered but empty, as in torchvision
}

// ---- Options and shapes ----

TEST(ShuffleNet, SmallImageStemMaps28x28GreyImagesToLogits) {
  auto model = shufflenet_v2_x1_0(
      ShuffleNetV2Options().num_classes(10).in_channels(1).small_image_stem(true));
  auto conv = model->conv1->at<nn::Conv2d>(0);
  EXPECT_EQ(conv->weight.sizes(), (Shape{24, 1, 3, 3}));
  EXPECT_EQ(conv->options.stride(), nn::IntPair(1));
  EXPECT_EQ(model->maxpool->name(), "Identity");
  model->eval();
  NoGradGuard no_grad;
  EXPECT_EQ(model->forward(randn({3, 1, 28, 28})).sizes(), (Shape{3, 10}));
}

TEST(ShuffleNet, DefaultStemMapsImagesToLogits) {
  auto model = shufflenet_v2_x0_5(ShuffleNetV2Options().num_classes(7));
  EXPECT_EQ(model->conv1->at<nn::Conv2d>(0)->options.stride(), nn::IntPair(2));
  EXPECT_EQ(model->maxpool->name(), "MaxPool2d");
  model->eval();
  NoGradGuard no_grad;
  EXPECT_EQ(model->forward(randn({1, 3, 64, 64})).sizes(), (Shape{1, 7}));
}

TEST(ShuffleNet, FactoryByNameBuildsEveryWidth) {
  const std::map<std::string, int64_t> parameter_counts = {
      {"shufflenet_v2_x0_5", 1366792},
      {"shufflenet_v2_x1_0", 2278604},
      {"shufflenet_v2_x1_5", 3503624},
      {"shufflenet_v2_x2_0", 7393996},
  };
  for (const auto& name : shufflenet_names()) {
    int64_t count = 0;
    for (const Tensor& parameter : make_shufflenet(name)->parameters()) count += parameter.numel();
    EXPECT_EQ(count, parameter_counts.at(name)) << name;  // torchvision's published counts
  }
}

TEST(ShuffleNet, TrainsOneStepWithGradientsForEveryParameter) {
  auto model = shufflenet_v2_x0_5(
      ShuffleNetV2Options().num_classes(4).in_channels(1).small_image_stem(true));
  Tensor labels = tensor({1, 3}, {2}).to(DType::kInt64);
  cross_entropy(model->forward(randn({2, 1, 16, 16})), labels).backward();
  for (const auto& [name, parameter] : model->named_parameters())
    EXPECT_TRUE(parameter.grad().defined()) << name;
}

// ---- Bad input ----

TEST(ShuffleNet, WrongChannelCountNamesTheShapes) {
  auto model = shufflenet_v2_x0_5();
  EXPECT_TRUE(throws_error(
      [&] {
        model->forward(randn({2, 1, 32, 32}));
      },
      "ShuffleNetV2: input has 1 channels but the model was built for "
      "in_channels=3 (input shape [2, 1, 32, 32], conv1.0.weight shape "
      "[24, 3, 3, 3])"));
  EXPECT_TRUE(throws_error(
      [&] {
        model->forward(randn({3, 32, 32}));
      },
      "ShuffleNetV2: expected images (N, C, H, W), got shape [3, 32, 32]"));
}

TEST(ShuffleNet, UnknownModelNameListsTheKnownOnes) {
  EXPECT_TRUE(throws_error([] { make_shufflenet("shufflenet_v2_x3_0"); },
                           "make_shufflenet: unknown model 'shufflenet_v2_x3_0' (known models: "
                           "shufflenet_v2_x0_5, shufflenet_v2_x1_0, shufflenet_v2_x1_5, "
                           "shufflenet_v2_x2_0)"));
}

TEST(ShuffleNet, BadConfigurationsAreRejected) {
  EXPECT_TRUE(throws_error([] { InvertedResidual(10, 24, 1); },
                           "with stride 1, in_channels (10) must equal out_channels (24)"));
  EXPECT_TRUE(throws_error([] { InvertedResidual(24, 24, 4); }, "stride must be 1, 2 or 3, got 4"));
  EXPECT_TRUE(throws_error(
      [] {
        ShuffleNetV2({4, 8}, {24, 116, 232, 464, 1024});
      },
      "expected 3 stage repeats, got [4, 8]"));
  EXPECT_TRUE(throws_error(
      [] {
        ShuffleNetV2({4, 8, 4}, {24, 116, 232, 464});
      },
      "expected 5 stage widths, got [24, 116, 232, 464]"));
  EXPECT_TRUE(throws_error([] { shufflenet_v2_x1_0(ShuffleNetV2Options().num_classes(0)); },
                           "num_classes must be positive, got 0"));
  EXPECT_TRUE(throws_error(
      [] {
        channel_shuffle(randn({1, 6, 2, 2}), 4);
      },
      "channel_shuffle: 6 channels cannot be split into 4 equal groups"));
}

}  // namespace
}  // namespace tessel::models
