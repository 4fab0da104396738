// Module behaviour: names, state dicts, strict loading, modes, devices, printing, options.
#include <cmath>
#include <sstream>

#include "core/autograd.h"
#include "core/rng.h"
#include "nn/nn.h"
#include "ops/ops.h"
#include "tests/testing.h"

namespace tessel::nn {
namespace {

using testing::all_close;
using testing::bitwise_equal;
using testing::throws_error;

std::vector<std::string> names_of(const NamedTensors& named) {
  std::vector<std::string> names;
  for (const auto& entry : named) names.push_back(entry.first);
  return names;
}

// A child registered before the module's own parameter and buffer, like the PyTorch model
// whose state_dict order the expectations below were taken from.
struct Mixed : Module {
  Mixed() : Module("Mixed") {
    child = register_module("child", std::make_shared<BatchNorm2d>(2));
    w = register_parameter("w", zeros({1}));
    b = register_buffer("b", zeros({1}));
    fc = register_module("fc", std::make_shared<Linear>(2, 2));
  }
  std::shared_ptr<BatchNorm2d> child;
  Tensor w, b;
  std::shared_ptr<Linear> fc;
};

// layer1.0.conv1 as in torchvision's ResNet.
struct Block : Module {
  Block() : Module("Block") {
    conv1 = register_module("conv1", std::make_shared<Conv2d>(Conv2dOptions(2, 2, 3).bias(false)));
    bn1 = register_module("bn1", std::make_shared<BatchNorm2d>(2));
  }
  std::shared_ptr<Conv2d> conv1;
  std::shared_ptr<BatchNorm2d> bn1;
};

struct Net : Module {
  Net() : Module("Net") {
    layer1 = register_module(
        "layer1", std::make_shared<Sequential>(std::initializer_list<std::shared_ptr<Module>>{
                      std::make_shared<Block>(), std::make_shared<Block>()}));
    fc = register_module("fc", std::make_shared<Linear>(2, 3));
  }
  std::shared_ptr<Sequential> layer1;
  std::shared_ptr<Linear> fc;
};

TEST(Module, NamedParametersAreDottedInRegistrationOrder) {
  Net net;
  EXPECT_EQ(
      names_of(net.named_parameters()),
      (std::vector<std::string>{"layer1.0.conv1.weight", "layer1.0.bn1.weight", "layer1.0.bn1.bias",
                                "layer1.1.conv1.weight", "layer1.1.bn1.weight", "layer1.1.bn1.bias",
                                "fc.weight", "fc.bias"}));
  EXPECT_EQ(net.parameters().size(), 8u);
  EXPECT_EQ(net.parameters(/*recurse=*/false).size(), 0u);
  EXPECT_TRUE(net.parameters()[0].is_same(net.layer1->at<Block>(0)->conv1->weight));
}

TEST(Module, StateDictOrderMatchesPyTorch) {
  Mixed mixed;
  EXPECT_EQ(names_of(mixed.state_dict()),
            (std::vector<std::string>{"w", "b", "child.weight", "child.bias", "child.running_mean",
                                      "child.running_var", "child.num_batches_tracked", "fc.weight",
                                      "fc.bias"}));
  EXPECT_EQ(names_of(mixed.named_parameters()),
            (std::vector<std::string>{"w", "child.weight", "child.bias", "fc.weight", "fc.bias"}));
  EXPECT_EQ(names_of(mixed.named_buffers()),
            (std::vector<std::string>{"b", "child.running_mean", "child.running_var",
                                      "child.num_batches_tracked"}));
  Tensor count = mixed.state_dict()[6].second;
  EXPECT_EQ(count.dtype(), DType::kInt64);
  EXPECT_EQ(count.dim(), 0);
}

TEST(Module, StateDictSharesStorageWithoutAutograd) {
  Linear linear(3, 2);
  auto state = linear.state_dict();
  EXPECT_FALSE(state[0].second.requires_grad());
  EXPECT_EQ(state[0].second.storage(), linear.weight.storage());
}

TEST(Module, TiedParametersAreListedOnceButSavedUnderEachName) {
  struct Tied : Module {
    Tied() : Module("Tied") {
      embed = register_module("embed", std::make_shared<Embedding>(EmbeddingOptions(5, 3)));
      head = register_module("head", std::make_shared<Module>("Head"));
      head->register_parameter("weight", embed->weight);
    }
    std::shared_ptr<Embedding> embed;
    std::shared_ptr<Module> head;
  } tied;
  EXPECT_EQ(names_of(tied.named_parameters()), (std::vector<std::string>{"embed.weight"}));
  EXPECT_EQ(names_of(tied.state_dict()), (std::vector<std::string>{"embed.weight", "head.weight"}));
}

TEST(Module, ChildrenAndModulesWalkTheTreeDepthFirst) {
  Net net;
  EXPECT_EQ(net.children().size(), 2u);
  std::vector<std::string> names;
  for (const auto& [name, module] : net.named_modules()) names.push_back(name);
  EXPECT_EQ(names,
            (std::vector<std::string>{"", "layer1", "layer1.0", "layer1.0.conv1", "layer1.0.bn1",
                                      "layer1.1", "layer1.1.conv1", "layer1.1.bn1", "fc"}));
  EXPECT_EQ(net.modules().front(), &net);
}

TEST(Module, RegistrationRejectsTakenEmptyAndDottedNames) {
  Module module;
  module.register_parameter("weight", zeros({2}));
  EXPECT_TRUE(throws_error([&] { module.register_buffer("weight", zeros({2})); }, "already taken"));
  EXPECT_TRUE(throws_error([&] { module.register_parameter("a.b", zeros({2})); }, "'.'"));
  EXPECT_TRUE(throws_error([&] { module.register_parameter("", zeros({2})); }, "empty"));
  EXPECT_TRUE(throws_error([&] { module.register_module("weight", std::make_shared<ReLU>()); },
                           "already taken"));
  EXPECT_TRUE(throws_error([&] { module.register_parameter("index", zeros({2}, DType::kInt64)); },
                           "floating-point"));
}

TEST(Module, UndefinedParameterIsLeftOut) {
  Linear linear(LinearOptions(3, 2).bias(false));
  EXPECT_FALSE(linear.bias.defined());
  EXPECT_EQ(names_of(linear.named_parameters()), (std::vector<std::string>{"weight"}));
}

std::map<std::string, Tensor> shifted_state(Module& module, double shift) {
  std::map<std::string, Tensor> state;
  for (const auto& [name, tensor] : module.state_dict())
    state[name] = is_floating(tensor.dtype()) ? add(tensor, shift) : tensor.clone();
  return state;
}

TEST(LoadStateDict, CopiesValuesInPlaceKeepingTensorIdentity) {
  Mixed source, target;
  source.child->num_batches_tracked.fill_(5);
  Tensor weight_before = target.fc->weight;
  auto state = shifted_state(source, 1.0);
  target.load_state_dict(state);
  EXPECT_TRUE(target.fc->weight.is_same(weight_before));
  EXPECT_TRUE(target.fc->weight.requires_grad());
  for (const auto& [name, tensor] : target.state_dict())
    EXPECT_TRUE(bitwise_equal(tensor, state.at(name))) << name;
  EXPECT_EQ(target.child->num_batches_tracked.item<int64_t>(), 5);
}

TEST(LoadStateDict, ConvertsDtype) {
  Linear source(3, 2), target(3, 2);
  std::map<std::string, Tensor> state;
  for (const auto& [name, tensor] : source.state_dict()) state[name] = tensor.to(DType::kFloat64);
  target.load_state_dict(state);
  EXPECT_EQ(target.weight.dtype(), DType::kFloat32);
  EXPECT_TRUE(all_close(target.weight, source.weight));
}

TEST(LoadStateDict, MissingKeyThrowsAndLoadsNothing) {
  Mixed source, target;
  auto before = shifted_state(target, 0.0);
  auto state = shifted_state(source, 1.0);
  state.erase("child.running_var");
  EXPECT_TRUE(
      throws_error([&] { target.load_state_dict(state); }, "missing keys: child.running_var"));
  for (const auto& [name, tensor] : target.state_dict())
    EXPECT_TRUE(bitwise_equal(tensor, before.at(name))) << name;
}

TEST(LoadStateDict, UnexpectedKeyThrowsAndLoadsNothing) {
  Mixed source, target;
  auto before = shifted_state(target, 0.0);
  auto state = shifted_state(source, 1.0);
  state["fc.extra"] = zeros({2});
  EXPECT_TRUE(throws_error([&] { target.load_state_dict(state); }, "unexpected keys: fc.extra"));
  for (const auto& [name, tensor] : target.state_dict())
    EXPECT_TRUE(bitwise_equal(tensor, before.at(name))) << name;
}

TEST(LoadStateDict, ShapeMismatchThrowsEvenWhenNotStrict) {
  Mixed source, target;
  auto before = shifted_state(target, 0.0);
  auto state = shifted_state(source, 1.0);
  state["fc.weight"] = zeros({3, 2});
  EXPECT_TRUE(throws_error([&] { target.load_state_dict(state); },
                           "size mismatch for 'fc.weight': the given tensor has shape [3, 2], "
                           "the module's has shape [2, 2]"));
  EXPECT_TRUE(throws_error([&] { target.load_state_dict(state, /*strict=*/false); },
                           "size mismatch for 'fc.weight'"));
  for (const auto& [name, tensor] : target.state_dict())
    EXPECT_TRUE(bitwise_equal(tensor, before.at(name))) << name;
}

TEST(LoadStateDict, OneErrorListsEveryProblem) {
  Mixed target;
  auto state = shifted_state(target, 1.0);
  state.erase("w");
  state["bogus"] = zeros({1});
  state["fc.bias"] = zeros({7});
  try {
    target.load_state_dict(state);
    FAIL() << "no error";
  } catch (const Error& error) {
    std::string message = error.what();
    EXPECT_NE(message.find("missing keys: w"), std::string::npos) << message;
    EXPECT_NE(message.find("unexpected keys: bogus"), std::string::npos) << message;
    EXPECT_NE(message.find("size mismatch for 'fc.bias'"), std::string::npos) << message;
    EXPECT_NE(message.find("nothing was loaded"), std::string::npos) << message;
  }
}

TEST(LoadStateDict, NonStrictIgnoresMissingAndUnexpectedKeys) {
  Linear target(3, 2);
  Tensor bias_before = target.bias.clone();
  std::map<std::string, Tensor> state{{"weight", ones({2, 3})}, {"other", zeros({4})}};
  target.load_state_dict(state, /*strict=*/false);
  EXPECT_TRUE(bitwise_equal(target.weight, ones({2, 3})));
  EXPECT_TRUE(bitwise_equal(target.bias, bias_before));
}

TEST(LoadStateDict, RejectsDuplicateNamesInAList) {
  Linear target(3, 2);
  NamedTensors state{{"weight", ones({2, 3})}, {"weight", ones({2, 3})}, {"bias", ones({2})}};
  EXPECT_TRUE(throws_error([&] { target.load_state_dict(state); }, "appears twice"));
}

TEST(Module, TrainAndEvalSwitchEveryModule) {
  Net net;
  EXPECT_TRUE(net.is_training());
  net.eval();
  for (Module* module : net.modules()) EXPECT_FALSE(module->is_training()) << module->name();
  net.train();
  for (Module* module : net.modules()) EXPECT_TRUE(module->is_training()) << module->name();
  net.layer1->train(false);
  EXPECT_TRUE(net.is_training());
  EXPECT_FALSE(net.layer1->at<Block>(1)->bn1->is_training());
}

TEST(Module, ZeroGradMakesGradientsUndefined) {
  Sequential mlp(
      {std::make_shared<Linear>(3, 4), std::make_shared<ReLU>(), std::make_shared<Linear>(4, 2)});
  mlp.forward(randn({5, 3})).sum().backward();
  for (const Tensor& parameter : mlp.parameters()) EXPECT_TRUE(parameter.grad().defined());
  mlp.zero_grad();
  for (const Tensor& parameter : mlp.parameters()) EXPECT_FALSE(parameter.grad().defined());
}

TEST(Module, ToCpuFromCpuKeepsTheSameStorage) {
  Net net;
  auto storage = net.fc->weight.storage();
  net.to(Device::cpu());
  EXPECT_EQ(net.fc->weight.storage(), storage);
}

TEST(Module, ToMetaMakesShapeOnlyCopiesThatLayersAndOptimizersStillHold) {
  Net net;
  Tensor held = net.fc->weight;  // what an optimizer would hold
  net.to(Device::meta());
  for (const auto& [name, tensor] : net.state_dict())
    EXPECT_TRUE(tensor.device().is_meta()) << name;
  EXPECT_TRUE(held.device().is_meta());
  EXPECT_TRUE(held.is_same(net.fc->weight));
  EXPECT_EQ(net.fc->weight.sizes(), (Shape{3, 2}));
  EXPECT_TRUE(net.fc->weight.requires_grad());
  EXPECT_EQ(net.layer1->at<Block>(0)->bn1->num_batches_tracked.dtype(), DType::kInt64);
  // Shape-only forward, as the planner traces it.
  Sequential mlp({std::make_shared<Linear>(3, 4), std::make_shared<ReLU>()});
  mlp.to(Device::meta());
  Tensor out = mlp.forward(empty({5, 3}, TensorOptions().device(Device::meta())));
  EXPECT_EQ(out.sizes(), (Shape{5, 4}));
  EXPECT_TRUE(out.device().is_meta());
}

TEST(Module, ToCudaWithoutBackendThrows) {
  Linear linear(3, 2);
  Tensor weight = linear.weight;
  EXPECT_TRUE(throws_error([&] { linear.to(Device::cuda()); }, "built without CUDA"));
  EXPECT_TRUE(weight.device().is_cpu());
}

TEST(Module, ToMetaThenCpuExplainsThereAreNoValues) {
  Linear linear(3, 2);
  linear.to(Device::meta());
  EXPECT_TRUE(throws_error([&] { linear.to(Device::cpu()); }, "no values"));
}

TEST(Module, ToDtypeConvertsFloatingTensorsOnly) {
  Sequential net(
      {std::make_shared<Conv2d>(Conv2dOptions(2, 2, 1)), std::make_shared<BatchNorm2d>(2)});
  Tensor weight = net.at<Conv2d>(0)->weight;
  Tensor values = weight.clone();
  net.to(DType::kFloat64);
  EXPECT_EQ(weight.dtype(), DType::kFloat64);
  EXPECT_TRUE(all_close(weight, values));
  EXPECT_EQ(net.at<BatchNorm2d>(1)->running_var.dtype(), DType::kFloat64);
  EXPECT_EQ(net.at<BatchNorm2d>(1)->num_batches_tracked.dtype(), DType::kInt64);
  Tensor out = net.forward(randn({2, 2, 3, 3}, DType::kFloat64));
  EXPECT_EQ(out.dtype(), DType::kFloat64);
}

TEST(Module, MlpInputGradientPassesGradcheckInF64) {
  auto mlp = std::make_shared<Sequential>(std::initializer_list<std::shared_ptr<Module>>{
      std::make_shared<Linear>(4, 5), std::make_shared<Tanh>(), std::make_shared<Linear>(5, 2)});
  mlp->to(DType::kFloat64);
  Tensor x = randn({3, 4}, DType::kFloat64).set_requires_grad(true);
  EXPECT_TRUE(
      testing::gradcheck([&](const std::vector<Tensor>& in) { return mlp->forward(in[0]); }, {x}));
}

TEST(Module, DefaultForwardExplainsItself) {
  ModuleList list({std::make_shared<ReLU>()});
  EXPECT_TRUE(throws_error([&] { list.forward(zeros({1})); }, "ModuleList has no forward"));
}

TEST(Module, PrintsTheTreeLikePyTorch) {
  auto inner = std::make_shared<Sequential>(std::initializer_list<std::shared_ptr<Module>>{
      std::make_shared<Conv2d>(Conv2dOptions(8, 8, {3, 1}).groups(2).dilation({2, 1}))});
  Sequential net({
      std::make_shared<Conv2d>(Conv2dOptions(3, 8, 3).stride(2).padding(1).bias(false)),
      std::make_shared<BatchNorm2d>(8),
      std::make_shared<ReLU>(),
      std::make_shared<MaxPool2d>(MaxPool2dOptions(3).stride(2).padding(1)),
      inner,
      std::make_shared<AdaptiveAvgPool2d>(1),
      std::make_shared<Flatten>(),
      std::make_shared<Dropout>(0.1),
      std::make_shared<Linear>(8, 10),
      std::make_shared<GELU>("tanh"),
      std::make_shared<LayerNorm>(LayerNormOptions({10})),
      std::make_shared<Embedding>(EmbeddingOptions(5, 2).padding_idx(-1)),
      std::make_shared<AvgPool2d>(2),
      std::make_shared<ModuleList>(std::initializer_list<std::shared_ptr<Module>>{
          std::make_shared<Identity>(), std::make_shared<Tanh>(), std::make_shared<Sigmoid>()}),
  });
  // Printed by PyTorch 1.13 for the same model.
  const char* expected = R"(Sequential(
  (0): Conv2d(3, 8, kernel_size=(3, 3), stride=(2, 2), padding=(1, 1), bias=False)
  (1): BatchNorm2d(8, eps=1e-05, momentum=0.1, affine=True, track_running_stats=True)
  (2): ReLU()
  (3): MaxPool2d(kernel_size=3, stride=2, padding=1, dilation=1, ceil_mode=False)
  (4): Sequential(
    (0): Conv2d(8, 8, kernel_size=(3, 1), stride=(1, 1), dilation=(2, 1), groups=2)
  )
  (5): AdaptiveAvgPool2d(output_size=1)
  (6): Flatten(start_dim=1, end_dim=-1)
  (7): Dropout(p=0.1, inplace=False)
  (8): Linear(in_features=8, out_features=10, bias=True)
  (9): GELU(approximate='tanh')
  (10): LayerNorm((10,), eps=1e-05, elementwise_affine=True)
  (11): Embedding(5, 2, padding_idx=4)
  (12): AvgPool2d(kernel_size=2, stride=2, padding=0)
  (13): ModuleList(
    (0): Identity()
    (1): Tanh()
    (2): Sigmoid()
  )
))";
  EXPECT_EQ(net.str(), expected);
  std::ostringstream stream;
  stream << *net.at<Linear>(8);
  EXPECT_EQ(stream.str(), "Linear(in_features=8, out_features=10, bias=True)");
}

TEST(Sequential, ChainsForwardAndIndexes) {
  auto first = std::make_shared<Linear>(3, 4);
  Sequential seq({first, std::make_shared<ReLU>()});
  seq.push_back(std::make_shared<Linear>(4, 2));
  EXPECT_EQ(seq.size(), 3u);
  EXPECT_EQ(seq[0], first);
  EXPECT_EQ(seq[-1]->name(), "Linear");
  EXPECT_TRUE(throws_error([&] { seq[3]; }, "out of range"));
  EXPECT_TRUE(throws_error([&] { seq.at<Conv2d>(0); }, "is a Linear"));
  Tensor x = randn({5, 3});
  Tensor expected = seq.at<Linear>(2)->forward(relu(first->forward(x)));
  EXPECT_TRUE(bitwise_equal(seq.forward(x), expected));
  EXPECT_EQ(names_of(seq.named_parameters()),
            (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"}));
}

TEST(Sequential, NamedEntriesKeepTheirNames) {
  Sequential seq(std::vector<std::pair<std::string, std::shared_ptr<Module>>>{
      {"fc", std::make_shared<Linear>(3, 4)}, {"act", std::make_shared<ReLU>()}});
  EXPECT_EQ(names_of(seq.named_parameters()), (std::vector<std::string>{"fc.weight", "fc.bias"}));
}

TEST(ModuleList, RegistersItsModules) {
  ModuleList list;
  list.push_back(std::make_shared<Linear>(2, 2));
  list.push_back(std::make_shared<Linear>(2, 3));
  EXPECT_EQ(names_of(list.named_parameters()),
            (std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias"}));
  int count = 0;
  for (const auto& module : list) count += module->name() == "Linear";
  EXPECT_EQ(count, 2);
}

// ---- default initialisation ----

void expect_within(const Tensor& tensor, double bound) {
  auto values = tensor.to_vector<double>();
  double largest = 0;
  for (double value : values) largest = std::max(largest, std::abs(value));
  EXPECT_LE(largest, bound);
  EXPECT_GT(largest, 0.8 * bound);  // fills the interval, not a narrower one
}

TEST(Init, LinearAndConvDrawFromPlusMinusOneOverSqrtFanIn) {
  manual_seed(3);
  Linear linear(50, 40);
  expect_within(linear.weight, 1 / std::sqrt(50.0));
  expect_within(linear.bias, 1 / std::sqrt(50.0));
  Conv2d conv(Conv2dOptions(8, 64, 3).groups(2));
  expect_within(conv.weight, 1 / std::sqrt(4 * 9.0));
  expect_within(conv.bias, 1 / std::sqrt(4 * 9.0));
}

TEST(Init, NormsStartAtOnesAndZeros) {
  BatchNorm2d bn(4);
  EXPECT_TRUE(bitwise_equal(bn.weight, ones({4})));
  EXPECT_TRUE(bitwise_equal(bn.bias, zeros({4})));
  EXPECT_TRUE(bitwise_equal(bn.running_mean, zeros({4})));
  EXPECT_TRUE(bitwise_equal(bn.running_var, ones({4})));
  EXPECT_EQ(bn.num_batches_tracked.item<int64_t>(), 0);
  LayerNorm ln(LayerNormOptions({2, 3}));
  EXPECT_TRUE(bitwise_equal(ln.weight, ones({2, 3})));
  EXPECT_TRUE(bitwise_equal(ln.bias, zeros({2, 3})));
}

TEST(Init, EmbeddingIsStandardNormalWithZeroPaddingRow) {
  manual_seed(4);
  Embedding embedding(EmbeddingOptions(200, 50).padding_idx(7));
  EXPECT_TRUE(bitwise_equal(embedding.weight.select(0, 7), zeros({50})));
  auto values = embedding.weight.to_vector<double>();
  double mean = 0, square = 0;
  for (double value : values) mean += value, square += value * value;
  mean /= values.size();
  double stddev = std::sqrt(square / values.size() - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.05);
  EXPECT_NEAR(stddev, 1.0, 0.05);
}

TEST(Init, KaimingNormalUsesTheChosenFanAndGain) {
  manual_seed(5);
  Tensor weight = empty({256, 64, 3, 3});
  init::kaiming_normal_(weight, 0.0, "fan_out", "relu");
  double expected = std::sqrt(2.0) / std::sqrt(256 * 9.0);
  auto values = weight.to_vector<double>();
  double square = 0;
  for (double value : values) square += value * value;
  EXPECT_NEAR(std::sqrt(square / values.size()), expected, 0.02 * expected);
  EXPECT_TRUE(throws_error([&] { init::kaiming_normal_(weight, 0.0, "fan_sideways"); }, "mode"));
  EXPECT_TRUE(throws_error([] { init::calculate_gain("swish"); }, "unknown nonlinearity"));
}

// ---- behaviour in training and eval ----

TEST(BatchNorm2d, CountsBatchesOnlyWhileTraining) {
  BatchNorm2d bn(3);
  Tensor x = randn({4, 3, 2, 2});
  bn.forward(x);
  bn.forward(x);
  EXPECT_EQ(bn.num_batches_tracked.item<int64_t>(), 2);
  Tensor mean_after_training = bn.running_mean.clone();
  bn.eval();
  bn.forward(x);
  EXPECT_EQ(bn.num_batches_tracked.item<int64_t>(), 2);
  EXPECT_TRUE(bitwise_equal(bn.running_mean, mean_after_training));
}

TEST(BatchNorm2d, WithoutRunningStatsUsesBatchStatisticsInEval) {
  BatchNorm2d bn(BatchNormOptions(2).track_running_stats(false).affine(false));
  EXPECT_TRUE(bn.state_dict().empty());
  bn.eval();
  Tensor y = bn.forward(randn({8, 2, 3, 3}) * 3.0 + 2.0);
  EXPECT_NEAR(mean(y).item<double>(), 0.0, 1e-5);
}

TEST(Dropout, IsTheIdentityInEvalAndDropsInTraining) {
  Dropout dropout(0.5);
  Tensor x = ones({1000});
  Tensor dropped = dropout.forward(x);
  double kept = sum(ne(dropped, zeros({1000}))).item<double>();
  EXPECT_GT(kept, 400);
  EXPECT_LT(kept, 600);
  EXPECT_NEAR(max(dropped).item<double>(), 2.0, 1e-6);
  dropout.eval();
  EXPECT_TRUE(bitwise_equal(dropout.forward(x), x));
}

// ---- options checked in constructors ----

TEST(Options, BadValuesGiveClearErrors) {
  EXPECT_TRUE(throws_error([] { Linear(0, 3); }, "in_features and out_features must be positive"));
  EXPECT_TRUE(throws_error([] { Conv2d(Conv2dOptions(3, 8, 3).groups(2)); },
                           "in_channels (3) must be divisible by groups (2)"));
  EXPECT_TRUE(throws_error([] { Conv2d(Conv2dOptions(4, 6, 3).groups(4)); },
                           "out_channels (6) must be divisible by groups (4)"));
  EXPECT_TRUE(throws_error([] { Conv2d(Conv2dOptions(4, 6, 3).stride(0)); }, "stride"));
  EXPECT_TRUE(throws_error([] { Conv2d(Conv2dOptions(4, 6, 3).padding(-1)); }, "padding"));
  EXPECT_TRUE(throws_error([] { Conv2d(Conv2dOptions(4, 6, {3, 3, 3})); }, "two"));
  EXPECT_TRUE(throws_error([] { BatchNorm2d(BatchNormOptions(3).momentum(1.5)); }, "momentum"));
  EXPECT_TRUE(throws_error([] { BatchNorm2d(BatchNormOptions(3).eps(0)); }, "eps"));
  EXPECT_TRUE(throws_error([] { LayerNorm(LayerNormOptions({})); }, "at least one dimension"));
  EXPECT_TRUE(throws_error([] { Embedding(EmbeddingOptions(10, 4).padding_idx(10)); },
                           "padding_idx 10 is out of range"));
  EXPECT_TRUE(throws_error([] { Dropout(1.5); }, "between 0 and 1"));
  EXPECT_TRUE(throws_error([] { GELU("fast"); }, "'none' or 'tanh'"));
  EXPECT_TRUE(throws_error([] { MaxPool2d(MaxPool2dOptions(2).padding(2)); }, "half the kernel"));
  EXPECT_TRUE(throws_error([] { AdaptiveAvgPool2d(0); }, "output_size"));
}

TEST(Options, BadInputsNameTheLayer) {
  Conv2d conv(Conv2dOptions(3, 4, 3));
  EXPECT_TRUE(throws_error(
      [&] {
        conv.forward(zeros({1, 2, 5, 5}));
      },
      "input has 2 channels but the layer expects 3"));
  EXPECT_TRUE(throws_error([&] { conv.forward(zeros({2, 5, 5})); }, "4-D input"));
  Linear linear(3, 4);
  EXPECT_TRUE(throws_error([&] { linear.forward(zeros({2, 5})); }, "last dimension 3"));
  LayerNorm ln(LayerNormOptions({4}));
  EXPECT_TRUE(throws_error([&] { ln.forward(zeros({2, 5})); }, "does not end with"));
  BatchNorm2d bn(3);
  EXPECT_TRUE(throws_error([&] { bn.forward(zeros({2, 4, 2, 2})); }, "num_features=3"));
  Embedding embedding(EmbeddingOptions(5, 2));
  EXPECT_TRUE(throws_error([&] { embedding.forward(zeros({3})); }, "integers"));
}

}  // namespace
}  // namespace tessel::nn
