// ResNet against torchvision 0.14: names and shapes of all five depths, one training and one
// evaluation step (logits, loss, every gradient, running statistics) with torchvision's weights,
// Tessel-written weights read back by an independent Python reader, options, and bad input.
// References come from tests/golden/make_golden_vision.py, run at test time.
#include "models/resnet.h"

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
#include "models/cifar_resnet.h"
#include "ops/ops.h"
#include "tests/testing.h"
#include "tests/zoo/vision_golden.h"

namespace tessel::models {
namespace {

using testing::all_close;
using testing::golden_tensor;
using testing::throws_error;

// ---- The reference script (tests/zoo/vision_golden.h) ----

std::string script_options(const ResNetOptions& options) {
  return " --num-classes " + std::to_string(options.num_classes()) + " --in-channels " +
         std::to_string(options.in_channels()) +
         (options.small_image_stem() ? " --small-image-stem" : "");
}

// One reference step of `name` from the script, then Tessel in f64 and in f32.
void check_step(const std::string& name, const std::string& mode, int batch, int size,
                const ResNetOptions& options, F32Gradients f32_gradients) {
  const std::string path = temp_path(name + "_" + mode + ".safetensors");
  ASSERT_EQ(run_golden_script("--model " + name + " --mode " + mode + " --batch " +
                              std::to_string(batch) + " --size " + std::to_string(size) +
                              script_options(options) + " --out " + path),
            "");
  const auto golden = load_safetensors(path);
  for (DType dtype : {DType::kFloat64, DType::kFloat32}) {
    SCOPED_TRACE(name + " " + mode + " in " + dtype_name(dtype));
    expect_step_matches(*make_resnet(name, options), golden, mode == "train", dtype, f32_gradients);
  }
}

// ---- Parity with torchvision ----

TEST(ResNetParity, Resnet18TrainStepMatchesTorchvision) {
  SKIP_WITHOUT_TORCH();
  // 32x32 images with the small-image stem, as for CIFAR.
  check_step("resnet18", "train", 2, 32, ResNetOptions().num_classes(10).small_image_stem(true),
             F32Gradients::kElementwise);
}

TEST(ResNetParity, Resnet18EvalStepMatchesTorchvision) {
  SKIP_WITHOUT_TORCH();
  check_step("resnet18", "eval", 2, 32, ResNetOptions().num_classes(10),
             F32Gradients::kElementwise);
}

TEST(ResNetParity, Resnet50TrainStepMatchesTorchvision) {
  SKIP_WITHOUT_TORCH();
  check_step("resnet50", "train", 2, 64, ResNetOptions().num_classes(10), F32Gradients::kNorm);
}

TEST(ResNetParity, Resnet50EvalStepMatchesTorchvision) {
  SKIP_WITHOUT_TORCH();
  check_step("resnet50", "eval", 2, 64, ResNetOptions().num_classes(10), F32Gradients::kNorm);
}

// ---- Names and shapes ----

using Entry = std::tuple<std::string, std::string, Shape>;  // kind, name, shape

// model name -> state dict entries, as the script lists them.
std::map<std::string, std::vector<Entry>> torchvision_listing(const std::string& models,
                                                              const std::string& options) {
  const std::string path = temp_path("listing.txt");
  std::string failure =
      run_golden_script("--list-parameters --model " + models + options + " --out " + path);
  EXPECT_EQ(failure, "");
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

TEST(ResNet, StateDictNamesAndShapesMatchTorchvisionForAllDepths) {
  SKIP_WITHOUT_TORCH();
  std::string all_names;
  for (const auto& name : resnet_names()) all_names += (all_names.empty() ? "" : ",") + name;
  const auto listing = torchvision_listing(all_names, " --num-classes 1000");
  ASSERT_EQ(listing.size(), resnet_names().size());
  for (const auto& name : resnet_names()) {
    expect_same_listing(tessel_listing(*make_resnet(name)), listing.at(name), name);
  }
}

TEST(ResNet, SmallImageStemAndGreyInputKeepTorchvisionNames) {
  SKIP_WITHOUT_TORCH();
  const auto options = ResNetOptions().num_classes(10).in_channels(1).small_image_stem(true);
  const auto listing = torchvision_listing("resnet18,resnet50", script_options(options));
  expect_same_listing(tessel_listing(*resnet18(options)), listing.at("resnet18"), "resnet18");
  expect_same_listing(tessel_listing(*resnet50(options)), listing.at("resnet50"), "resnet50");
}

// ---- Tessel's own weights, read by the independent Python reader ----

TEST(ResNet, WeightsWrittenByTesselGiveTheSameLogitsInTorchvision) {
  SKIP_WITHOUT_TORCH();
  const auto options = ResNetOptions().num_classes(10).in_channels(1).small_image_stem(true);
  auto model = resnet18(options);
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
  const std::string weights = temp_path("tessel_resnet18.safetensors");
  const std::string result = temp_path("torchvision_resnet18_logits.safetensors");
  save_safetensors(weights, entries, {{"model", "resnet18"}});
  ASSERT_EQ(run_golden_script("--check-tessel-weights " + weights + " --model resnet18" +
                              script_options(options) + " --out " + result),
            "");
  EXPECT_TRUE(
      all_close(logits, golden_tensor(load_safetensors(result), "logits"), kF32Rtol, kF32Atol));
}

// ---- Options, initialisation, shapes ----

TEST(ResNet, SmallImageStemMaps28x28GreyImagesToLogits) {
  auto model = resnet18(ResNetOptions().num_classes(10).in_channels(1).small_image_stem(true));
  EXPECT_EQ(model->conv1->weight.sizes(), (Shape{64, 1, 3, 3}));
  EXPECT_EQ(model->conv1->options.stride(), nn::IntPair(1));
  EXPECT_EQ(model->maxpool->name(), "Identity");
  model->eval();
  NoGradGuard no_grad;
  EXPECT_EQ(model->forward(randn({3, 1, 28, 28})).sizes(), (Shape{3, 10}));
}

TEST(ResNet, DefaultStemMapsImageNetSizedImagesToLogits) {
  auto model = resnet50(ResNetOptions().num_classes(7));
  EXPECT_EQ(model->conv1->weight.sizes(), (Shape{64, 3, 7, 7}));
  EXPECT_EQ(model->fc->weight.sizes(), (Shape{7, 2048}));
  model->eval();
  NoGradGuard no_grad;
  EXPECT_EQ(model->forward(randn({1, 3, 64, 64})).sizes(), (Shape{1, 7}));
}

TEST(ResNet, AnyInputChannelCountChangesOnlyConv1) {
  auto rgb = resnet34();
  auto multispectral = resnet34(ResNetOptions().in_channels(5));
  const auto rgb_state = rgb->state_dict();
  const auto other_state = multispectral->state_dict();
  ASSERT_EQ(rgb_state.size(), other_state.size());
  for (size_t i = 0; i < rgb_state.size(); ++i) {
    EXPECT_EQ(rgb_state[i].first, other_state[i].first);
    if (rgb_state[i].first == "conv1.weight") {
      EXPECT_EQ(other_state[i].second.sizes(), (Shape{64, 5, 7, 7}));
    } else {
      EXPECT_EQ(rgb_state[i].second.sizes(), other_state[i].second.sizes()) << rgb_state[i].first;
    }
  }
}

TEST(ResNet, InitializesLikeTorchvision) {
  auto model = resnet18(ResNetOptions().num_classes(10));
  for (const auto& [name, parameter] : model->named_parameters()) {
    std::vector<double> values = parameter.to_vector<double>();
    double mean = 0, square = 0, largest = 0;
    for (double v : values) mean += v, square += v * v, largest = std::max(largest, std::abs(v));
    mean /= values.size();
    const double stddev = std::sqrt(square / values.size() - mean * mean);
    const bool is_conv = parameter.dim() == 4;
    const bool is_norm = parameter.dim() == 1 && name.rfind("fc.", 0) != 0;
    if (is_conv) {
      // kaiming_normal_(mode="fan_out", nonlinearity="relu"): N(0, sqrt(2 / fan_out)).
      const double fan_out = parameter.size(0) * parameter.size(2) * parameter.size(3);
      const double expected = std::sqrt(2.0 / fan_out);
      EXPECT_NEAR(stddev, expected, 0.1 * expected) << name;
      EXPECT_NEAR(mean, 0.0, 0.1 * expected) << name;
    } else if (is_norm) {
      const bool weight = name.size() > 6 && name.substr(name.size() - 6) == "weight";
      EXPECT_EQ(largest, weight ? 1.0 : 0.0) << name;
      EXPECT_EQ(mean, weight ? 1.0 : 0.0) << name;
    } else {
      // Linear's default: U(-1/sqrt(in_features), 1/sqrt(in_features)).
      EXPECT_LE(largest, 1.0 / std::sqrt(512.0)) << name;
      EXPECT_GT(stddev, 0.0) << name;
    }
  }
}

TEST(ResNet, ZeroInitResidualZeroesTheLastNormOfEveryBlock) {
  auto basic = resnet18(ResNetOptions().zero_init_residual(true));
  for (const auto& [name, parameter] : basic->named_parameters()) {
    const bool last_norm = name.find(".bn2.weight") != std::string::npos;
    if (last_norm) {
      EXPECT_EQ(max(abs(parameter)).item<float>(), 0.0f) << name;
    } else if (name.find("bn1.weight") != std::string::npos) {
      EXPECT_EQ(min(parameter).item<float>(), 1.0f) << name;
    }
  }
  auto bottleneck = resnet50(ResNetOptions().zero_init_residual(true));
  int zeroed = 0;
  for (const auto& [name, parameter] : bottleneck->named_parameters()) {
    if (name.find(".bn3.weight") == std::string::npos) continue;
    EXPECT_EQ(max(abs(parameter)).item<float>(), 0.0f) << name;
    ++zeroed;
  }
  EXPECT_EQ(zeroed, 16);  // 3 + 4 + 6 + 3 blocks
}

TEST(ResNet, BlocksUseTorchvisionLayout) {
  auto model = resnet50();
  auto first = model->layer2->at<Bottleneck>(0);
  // v1.5: the stride sits on the 3x3 convolution, and downsample is conv1x1 + batch norm.
  EXPECT_EQ(first->conv1->options.stride(), nn::IntPair(1));
  EXPECT_EQ(first->conv2->options.stride(), nn::IntPair(2));
  ASSERT_NE(first->downsample, nullptr);
  EXPECT_EQ(first->downsample->at<nn::Conv2d>(0)->weight.sizes(), (Shape{512, 256, 1, 1}));
  EXPECT_EQ(first->downsample->at<nn::Conv2d>(0)->options.stride(), nn::IntPair(2));
  EXPECT_EQ(first->downsample->at<nn::BatchNorm2d>(1)->options.num_features(), 512);
  EXPECT_EQ(model->layer2->at<Bottleneck>(1)->downsample, nullptr);
  // ResNet-18's first layer keeps 64 channels and stride 1: no downsample.
  EXPECT_EQ(resnet18()->layer1->at<BasicBlock>(0)->downsample, nullptr);
}

TEST(ResNet, FactoryByNameBuildsEveryDepth) {
  const std::map<std::string, int64_t> parameter_counts = {
      {"resnet18", 11689512},  {"resnet34", 21797672},  {"resnet50", 25557032},
      {"resnet101", 44549160}, {"resnet152", 60192808},
  };
  for (const auto& name : resnet_names()) {
    int64_t count = 0;
    for (const Tensor& parameter : make_resnet(name)->parameters()) count += parameter.numel();
    EXPECT_EQ(count, parameter_counts.at(name)) << name;  // torchvision's published counts
  }
}

TEST(ResNet, TrainsOneStepWithGradientsForEveryParameter) {
  auto model = resnet18(ResNetOptions().num_classes(4).in_channels(1).small_image_stem(true));
  Tensor loss =
      cross_entropy(model->forward(randn({2, 1, 12, 12})), tensor({1, 3}, {2}).to(DType::kInt64));
  loss.backward();
  for (const auto& [name, parameter] : model->named_parameters())
    EXPECT_TRUE(parameter.grad().defined()) << name;
}

// ---- Bad input ----

TEST(ResNet, WrongChannelCountNamesTheShapes) {
  auto model = resnet18();
  EXPECT_TRUE(throws_error(
      [&] {
        model->forward(randn({2, 1, 32, 32}));
      },
      "ResNet: input has 1 channels but the model was built for "
      "in_channels=3 (input shape [2, 1, 32, 32], conv1.weight shape "
      "[64, 3, 7, 7])"));
  EXPECT_TRUE(throws_error(
      [&] {
        model->forward(randn({3, 32, 32}));
      },
      "ResNet: expected images (N, C, H, W), got shape [3, 32, 32]"));
}

TEST(ResNet, UnknownModelNameListsTheKnownOnes) {
  EXPECT_TRUE(throws_error([] { make_resnet("resnet19"); },
                           "make_resnet: unknown model 'resnet19' (known models: resnet18, "
                           "resnet34, resnet50, resnet101, resnet152)"));
}

TEST(ResNet, BadOptionsAreRejected) {
  EXPECT_TRUE(throws_error([] { resnet18(ResNetOptions().num_classes(0)); },
                           "num_classes must be positive, got 0"));
  EXPECT_TRUE(throws_error([] { resnet18(ResNetOptions().in_channels(-1)); },
                           "in_channels must be positive, got -1"));
  EXPECT_TRUE(throws_error(
      [] {
        ResNet(ResNetBlock::kBasic, {2, 2, 2});
      },
      "expected 4 block counts (one per layer), got 3"));
}

// ---- The CIFAR-10 ResNets (He et al.; the DTR paper's ResNet-1202) ----

// One reference step of a CIFAR ResNet from the script (its own PyTorch definition), then Tessel
// in f64 and f32.
void check_cifar_step(const std::string& name, const std::string& mode) {
  const std::string path = temp_path(name + "_" + mode + ".safetensors");
  ASSERT_EQ(
      run_golden_script("--model " + name + " --mode " + mode +
                        " --batch 3 --size 16 --num-classes 10 --in-channels 3 --out " + path),
      "");
  const auto golden = load_safetensors(path);
  for (DType dtype : {DType::kFloat64, DType::kFloat32}) {
    SCOPED_TRACE(name + " " + mode + " in " + dtype_name(dtype));
    expect_step_matches(*make_cifar_resnet(name), golden, mode == "train", dtype,
                        F32Gradients::kNorm);
  }
}

TEST(CifarResNetParity, TrainStepMatchesPyTorch) {
  SKIP_WITHOUT_TORCH();
  // Both option A shortcuts (16 -> 32 -> 64 channels, stride 2) and identity shortcuts.
  check_cifar_step("cifar_resnet20", "train");
}

TEST(CifarResNetParity, EvalStepMatchesPyTorch) {
  SKIP_WITHOUT_TORCH();
  check_cifar_step("cifar_resnet20", "eval");
}

TEST(CifarResNet, StateDictNamesAndShapesMatchTheReferenceForEveryDepth) {
  SKIP_WITHOUT_TORCH();
  std::string all_names;
  for (const auto& name : cifar_resnet_names()) all_names += (all_names.empty() ? "" : ",") + name;
  const auto listing = torchvision_listing(all_names, " --num-classes 10");
  ASSERT_EQ(listing.size(), cifar_resnet_names().size());
  for (const auto& name : cifar_resnet_names())
    expect_same_listing(tessel_listing(*make_cifar_resnet(name)), listing.at(name), name);
}

TEST(CifarResNet, ParameterCountsAreThePapers) {
  // He et al., table 6: 0.27M, 0.46M, 0.66M, 0.85M, 1.7M and 19.4M parameters.
  const std::map<std::string, int64_t> expected = {
      {"cifar_resnet20", 269722}, {"cifar_resnet32", 464154},   {"cifar_resnet44", 658586},
      {"cifar_resnet56", 853018}, {"cifar_resnet110", 1727962}, {"cifar_resnet1202", 19421274}};
  for (const auto& [name, count] : expected) {
    int64_t parameters = 0;
    for (const Tensor& parameter : make_cifar_resnet(name)->parameters())
      parameters += parameter.numel();
    EXPECT_EQ(parameters, count) << name;
  }
}

TEST(CifarResNet, ShortcutsHalveThePlaneAndPadChannelsWithZeros) {
  CifarBasicBlock block(16, 32, 2);
  for (nn::Module* module : block.modules())
    if (auto* conv = dynamic_cast<nn::Conv2d*>(module)) nn::init::zeros_(conv->weight);
  block.eval();  // batch norm of a zero convolution: its bias, zero
  NoGradGuard no_grad;
  const Tensor x = relu(randn({2, 16, 6, 6}));
  const Tensor y = block.forward(x);
  ASSERT_EQ(y.sizes(), (Shape{2, 32, 3, 3}));
  // With both convolutions zero the block is relu(shortcut): 8 zero channels each side.
  const Tensor expected =
      cat({zeros({2, 8, 3, 3}), x.slice(2, 0, 6, 2).slice(3, 0, 6, 2), zeros({2, 8, 3, 3})}, 1);
  EXPECT_TRUE(all_close(y, expected, 0, 0));
}

TEST(CifarResNet, TrainsOneStepWithGradientsForEveryParameter) {
  auto model = make_cifar_resnet("cifar_resnet20");
  Tensor loss = cross_entropy(model->forward(randn({4, 3, 32, 32})), randint(0, 10, {4}));
  loss.backward();
  EXPECT_TRUE(std::isfinite(loss.item<double>()));
  for (const auto& [name, parameter] : model->named_parameters()) {
    ASSERT_TRUE(parameter.grad().defined()) << name;
    EXPECT_GT(sum(abs(parameter.grad())).item<double>(), 0.0) << name;
  }
}

TEST(CifarResNet, BadNamesOptionsAndInputsAreClearErrors) {
  EXPECT_TRUE(throws_error([] { make_cifar_resnet("cifar_resnet19"); },
                           "make_cifar_resnet: unknown model 'cifar_resnet19' (known models: "
                           "cifar_resnet20, cifar_resnet32, cifar_resnet44, cifar_resnet56, "
                           "cifar_resnet110, cifar_resnet1202)"));
  EXPECT_TRUE(
      throws_error([] { make_cifar_resnet("cifar_resnet20", CifarResNetOptions().num_classes(0)); },
                   "num_classes must be positive, got 0"));
  EXPECT_TRUE(throws_error([] { CifarBasicBlock(32, 16, 2); },
                           "option A shortcuts keep or add an even number of channels"));
  EXPECT_TRUE(throws_error(
      [] {
        make_cifar_resnet("cifar_resnet20")->forward(randn({1, 1, 32, 32}));
      },
      "CifarResNet: expected images (N, 3, H, W), got shape [1, 1, 32, 32]"));
}

}  // namespace
}  // namespace tessel::models
