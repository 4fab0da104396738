// Layers against PyTorch: outputs, input and parameter gradients, and running statistics from
// tests/golden/nn.safetensors (made by tests/golden/make_golden_nn.py, same layer settings).
#include "nn/nn.h"
#include "ops/ops.h"
#include "tests/testing.h"

namespace tessel::nn {
namespace {

using testing::all_close;
using testing::golden_tensor;

const std::map<std::string, Tensor>& golden() {
  static const auto* fixtures = new std::map<std::string, Tensor>(testing::load_golden("nn"));
  return *fixtures;
}

Tensor fixture(const std::string& key) { return golden_tensor(golden(), key); }

// Loads the case's parameters and buffers through load_state_dict, runs forward and backward
// with the recorded upstream gradient, and compares everything PyTorch recorded.
void check_case(Module& module, const std::string& name, bool input_grad = true) {
  std::map<std::string, Tensor> state;
  for (const auto& entry : module.state_dict())
    state[entry.first] = fixture(name + "." + entry.first);
  module.load_state_dict(state);

  Tensor input = fixture(name + ".input").clone();
  if (input_grad) input.set_requires_grad(true);
  Tensor output = module.forward(input);
  EXPECT_TRUE(all_close(output, fixture(name + ".output"))) << name << " output";
  output.backward(fixture(name + ".grad_output"));
  if (input_grad) {
    EXPECT_TRUE(all_close(input.grad(), fixture(name + ".grad_input"))) << name << " grad_input";
  }
  for (const auto& [param, tensor] : module.named_parameters()) {
    EXPECT_TRUE(all_close(tensor.grad(), fixture(name + ".grad." + param)))
        << name << " grad of " << param;
  }
  for (const auto& [buffer, tensor] : module.named_buffers()) {
    EXPECT_TRUE(all_close(tensor, fixture(name + ".after." + buffer))) << name << " " << buffer;
  }
}

TEST(LinearGolden, MatchesPyTorch) {
  Linear linear(5, 4);
  check_case(linear, "linear");
}

TEST(Conv2dGolden, GroupsStrideAndPaddingMatchPyTorch) {
  Conv2d conv(Conv2dOptions(4, 6, 3).stride(2).padding(1).groups(2));
  check_case(conv, "conv_groups");
}

TEST(Conv2dGolden, RectangularDilatedWithoutBiasMatchesPyTorch) {
  Conv2d conv(
      Conv2dOptions(3, 4, {3, 2}).stride({1, 2}).padding({2, 1}).dilation({2, 1}).bias(false));
  check_case(conv, "conv_dilated");
}

TEST(BatchNorm2dGolden, TrainingUsesBatchStatisticsAndUpdatesRunningOnes) {
  BatchNorm2d bn(3);
  check_case(bn, "bn_train");
  EXPECT_EQ(bn.num_batches_tracked.item<int64_t>(), 1);
}

TEST(BatchNorm2dGolden, EvalUsesRunningStatistics) {
  BatchNorm2d bn(3);
  bn.eval();
  check_case(bn, "bn_eval");
  EXPECT_EQ(bn.num_batches_tracked.item<int64_t>(), 7);
}

TEST(LayerNormGolden, MatchesPyTorch) {
  LayerNorm ln(LayerNormOptions({4, 5}));
  check_case(ln, "layernorm");
}

TEST(EmbeddingGolden, PaddingRowGetsNoGradient) {
  Embedding embedding(EmbeddingOptions(10, 4).padding_idx(2));
  check_case(embedding, "embedding", /*input_grad=*/false);
  EXPECT_TRUE(testing::bitwise_equal(embedding.weight.grad().select(0, 2), zeros({4})));
}

TEST(SequentialGolden, MlpMatchesPyTorch) {
  Sequential mlp(
      {std::make_shared<Linear>(6, 8), std::make_shared<ReLU>(), std::make_shared<Linear>(8, 3)});
  check_case(mlp, "mlp");
}

}  // namespace
}  // namespace tessel::nn
