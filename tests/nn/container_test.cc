// Sequential and ModuleList built the libtorch way: variadic, from shared_ptrs or from modules
// given by value.
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "core/autograd.h"
#include "core/op.h"
#include "gtest/gtest.h"
#include "nn/nn.h"
#include "ops/ops.h"
#include "tests/testing.h"

namespace tessel::nn {
namespace {

using testing::bitwise_equal;

std::vector<std::string> names_of(const NamedTensors& named) {
  std::vector<std::string> names;
  for (const auto& [name, tensor] : named) names.push_back(name);
  return names;
}

// Modules are handed over, never copied: an lvalue module does not convert, an rvalue does.
static_assert(std::is_constructible_v<Sequential, Linear&&, ReLU&&>);
static_assert(!std::is_constructible_v<Sequential, Linear&>);
static_assert(std::is_constructible_v<Sequential, std::shared_ptr<Linear>&, ReLU&&>);
static_assert(!std::is_convertible_v<std::shared_ptr<Linear>, Sequential>);  // explicit
static_assert(!std::is_constructible_v<Sequential, int>);

TEST(Sequential, TakesSharedPointersAsSeparateArguments) {
  auto first = std::make_shared<Linear>(2, 3);
  auto last = std::make_shared<Linear>(3, 1);
  Sequential seq(first, std::make_shared<ReLU>(), last);
  ASSERT_EQ(seq.size(), 3u);
  EXPECT_EQ(seq[0], first);
  EXPECT_EQ(seq[2], last);
  EXPECT_EQ(seq[1]->name(), "ReLU");
  EXPECT_EQ(names_of(seq.named_parameters()),
            (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"}));
  Tensor x = randn({4, 2});
  EXPECT_TRUE(bitwise_equal(seq.forward(x), last->forward(relu(first->forward(x)))));
  // The brace list gives the same container.
  Sequential braced{first, std::make_shared<ReLU>(), last};
  EXPECT_TRUE(bitwise_equal(braced.forward(x), seq.forward(x)));
}

TEST(Sequential, TakesModulesByValue) {
  Sequential seq(Linear(2, 3), ReLU(), Linear(LinearOptions(3, 1).bias(false)));
  ASSERT_EQ(seq.size(), 3u);
  EXPECT_EQ(seq.at<Linear>(0)->options.out_features(), 3);
  EXPECT_EQ(names_of(seq.named_parameters()),
            (std::vector<std::string>{"0.weight", "0.bias", "2.weight"}));
  // The layers' members and the registered parameters are the same tensors after the move.
  EXPECT_TRUE(seq.at<Linear>(0)->weight.is_same(seq.parameters()[0]));
  EXPECT_TRUE(seq.at<Linear>(2)->weight.is_same(seq.parameters()[2]));
  Tensor x = randn({5, 2});
  Tensor expected = matmul(relu(linear(x, seq.at<Linear>(0)->weight, seq.at<Linear>(0)->bias)),
                           seq.at<Linear>(2)->weight.t());
  EXPECT_TRUE(bitwise_equal(seq(x), expected));
}

TEST(Sequential, MixesFormsAndNestsByValue) {
  auto shared = std::make_shared<Linear>(4, 4);
  Sequential outer(Sequential(Linear(2, 4), Tanh()), shared, Sigmoid());
  EXPECT_EQ(outer.size(), 3u);
  EXPECT_EQ(outer[1], shared);
  EXPECT_EQ(names_of(outer.named_parameters()),
            (std::vector<std::string>{"0.0.weight", "0.0.bias", "1.weight", "1.bias"}));
  EXPECT_EQ(outer(randn({3, 2})).sizes(), (Shape{3, 4}));
  auto made = std::make_shared<Sequential>(std::make_shared<Linear>(2, 2), ReLU());
  EXPECT_EQ(made->size(), 2u);
}

// Evaluation runs a BatchNorm2d followed by a ReLU as one pass (batch_norm_eval with relu):
// the same bits as the two modules one after the other, and training is untouched by it.
TEST(Sequential, RunsBatchNormThenReluInOnePassInEvaluation) {
  Sequential block(Conv2d(Conv2dOptions(3, 8, 3).padding(1)), BatchNorm2d(8), ReLU());
  auto norm = block.at<BatchNorm2d>(1);
  norm->running_mean.copy_(randn({8}));
  norm->running_var.copy_(rand({8}) + 0.5);
  const Tensor x = randn({2, 3, 6, 6});
  block.eval();
  std::vector<std::string> ops_run;
  TraceHook previous =
      set_trace_hook([&](const OpDef& op, const std::vector<Tensor>&, const std::vector<Tensor>&,
                         const Attrs&) { ops_run.push_back(op.name); });
  Tensor fused;
  {
    NoGradGuard no_grad;
    fused = block.forward(x);
  }
  set_trace_hook(previous);
  EXPECT_EQ(ops_run, (std::vector<std::string>{"conv2d", "batch_norm_eval"}));
  Tensor apart;
  {
    NoGradGuard no_grad;
    apart = block[2]->forward(block[1]->forward(block[0]->forward(x)));
  }
  EXPECT_TRUE(bitwise_equal(fused, apart));
  // With autograd on, two ops and a gradient as before.
  const Tensor with_grad = block.forward(x);
  EXPECT_TRUE(bitwise_equal(with_grad, apart));
  with_grad.sum().backward();
  EXPECT_TRUE(block.at<Conv2d>(0)->weight.grad().defined());
}

TEST(Sequential, PrintsItsStructure) {
  Sequential seq(Linear(2, 3), ReLU());
  std::ostringstream out;
  out << seq;
  EXPECT_EQ(out.str(),
            "Sequential(\n"
            "  (0): Linear(in_features=2, out_features=3, bias=True)\n"
            "  (1): ReLU()\n"
            ")");
}

TEST(Module, MovingKeepsParametersAndChildrenTogether) {
  Linear source(3, 2);
  const Tensor weight = source.weight;
  Linear moved(std::move(source));
  EXPECT_TRUE(moved.weight.is_same(weight));
  ASSERT_EQ(moved.parameters().size(), 2u);
  EXPECT_TRUE(moved.parameters()[0].is_same(weight));
  EXPECT_EQ(moved.extra_repr(), "in_features=3, out_features=2, bias=True");

  Sequential inner(Linear(2, 2));
  const std::shared_ptr<Module> child = inner[0];
  Sequential taken(std::move(inner));
  EXPECT_EQ(taken[0], child);
  EXPECT_EQ(names_of(taken.named_parameters()), (std::vector<std::string>{"0.weight", "0.bias"}));
}

TEST(ModuleList, TakesModulesAsSeparateArguments) {
  auto shared = std::make_shared<Linear>(2, 3);
  ModuleList list(shared, Linear(3, 4), Tanh());
  ASSERT_EQ(list.size(), 3u);
  EXPECT_EQ(list[0], shared);
  EXPECT_EQ(list[2]->name(), "Tanh");
  EXPECT_EQ(names_of(list.named_parameters()),
            (std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias"}));
}

}  // namespace
}  // namespace tessel::nn
