// Planning a module of one's own: trace_module traces a user's nn::Module on the meta device,
// the planner prices it, every plan of it is executable (parallel::ParallelModule runs them), and
// bad inputs are clear errors that leave tracing usable.
#include "parallel/planner/trace_module.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>

#include "nn/nn.h"
#include "ops/ops.h"
#include "parallel/planner/planner.h"
#include "parallel/planner/report.h"
#include "tests/planner/round_number_profile.h"
#include "tests/testing.h"

namespace tessel::planner {
namespace {

// Two linear layers with a residual connection: a module with its own forward, as users write.
class ResidualMlp : public nn::Module {
 public:
  ResidualMlp() : nn::Module("ResidualMlp") {
    hidden = register_module("hidden", std::make_shared<nn::Linear>(16, 16));
    head = register_module("head", std::make_shared<nn::Linear>(16, 4));
  }
  Tensor forward(const Tensor& x) override { return head->forward(x + relu(hidden->forward(x))); }
  std::shared_ptr<nn::Linear> hidden, head;
};

int count_ops(const Graph& graph, const std::string& name) {
  int count = 0;
  for (const TracedOp& op : graph.ops) count += op.name == name;
  return count;
}

TEST(TraceModule, TracesTheModulesOpsParametersAndInputs) {
  ResidualMlp net;
  const Graph graph = trace_module(net, ModuleTraceOptions({32, 16}).name("mlp"));
  EXPECT_EQ(graph.model, "mlp");
  EXPECT_TRUE(graph.user_module);
  EXPECT_EQ(graph.batch_size, 32);
  EXPECT_EQ(count_ops(graph, "linear"), 2);
  EXPECT_EQ(count_ops(graph, "cross_entropy"), 1);
  EXPECT_EQ(graph.parameter_count(), 16 * 16 + 16 + 16 * 4 + 4);
  int inputs = 0;
  for (const TracedTensor& tensor : graph.tensors)
    if (tensor.is_input()) {
      ++inputs;
      EXPECT_TRUE(tensor.input == "input" || tensor.input == "labels") << tensor.input;
      EXPECT_EQ(tensor.sizes.at(0), 32);
    }
  EXPECT_EQ(inputs, 2);
  EXPECT_EQ(net.parameters()[0].device(), Device::meta());
}

// Heads merged back as attention does: a permute, then a reshape that has to copy. The copy is
// an op of its own (contiguous), and the layer after it reads that op's result, with its gradient.
class MergedHeads : public nn::Module {
 public:
  MergedHeads() : nn::Module("MergedHeads") {
    heads = register_module("heads", std::make_shared<nn::Linear>(16, 16));
    head = register_module("head", std::make_shared<nn::Linear>(16, 4));
  }
  Tensor forward(const Tensor& x) override {
    const int64_t batch = x.size(0);
    const Tensor merged = heads->forward(x).view({batch, 4, 4}).permute({0, 2, 1});
    return head->forward(merged.reshape({batch, 16}));
  }
  std::shared_ptr<nn::Linear> heads, head;
};

TEST(TraceModule, AReshapeThatCopiesIsReadAsTheCopy) {
  MergedHeads net;
  const Graph graph = trace_module(net, ModuleTraceOptions({8, 16}));
  ASSERT_EQ(count_ops(graph, "contiguous"), 1);
  const auto op_named = [&](const std::string& name) {
    return *std::find_if(graph.ops.begin(), graph.ops.end(),
                         [&](const TracedOp& op) { return op.name == name; });
  };
  const TracedOp& last_linear = graph.ops.at(static_cast<size_t>(op_named("contiguous").id + 1));
  ASSERT_EQ(last_linear.name, "linear");
  const TracedTensor& read = graph.tensors.at(static_cast<size_t>(last_linear.inputs[0]));
  EXPECT_EQ(read.producer, op_named("contiguous").id);
  EXPECT_TRUE(read.requires_grad);
}

TEST(TraceModule, UsesTheGivenLossInsteadOfCrossEntropy) {
  ResidualMlp net;
  const Graph graph = trace_module(net, ModuleTraceOptions({8, 16}).loss([](const Tensor& out) {
    return mse_loss(out, zeros_like(out));
  }));
  EXPECT_EQ(count_ops(graph, "mse_loss"), 1);
  EXPECT_EQ(count_ops(graph, "cross_entropy"), 0);
  EXPECT_EQ(graph.model, "module");
}

TEST(TraceModule, EveryPlanOfAModuleOfOnesOwnIsExecutable) {
  ResidualMlp net;
  const Graph graph = trace_module(net, ModuleTraceOptions({64, 16}).name("mlp"));
  PlanOptions options;
  options.config.devices = 4;
  options.config.profile = round_number_profile();
  options.executable_only = true;
  const PlanResult result = plan_graph(graph, options);
  ASSERT_GE(result.chosen, 0);
  // parallel::ParallelModule runs tensor-parallel plans too: none is marked, and the frontier's
  // small end (splitting the weights is cheaper in memory) is tensor parallel.
  bool tensor_parallel = false;
  for (const PlannedPoint& point : result.frontier) {
    EXPECT_TRUE(point.executable) << point.summary << ": " << point.not_executable_reason;
    tensor_parallel = tensor_parallel || point.tp > 1;
  }
  EXPECT_TRUE(tensor_parallel);
  std::ostringstream text;
  print_frontier(text, result, 64);
  print_chosen(text, graph, result);
  EXPECT_NE(text.str().find("<- chosen"), std::string::npos) << text.str();
  EXPECT_NE(text.str().find("chosen: point " + std::to_string(result.chosen)), std::string::npos);
  EXPECT_EQ(text.str().find("not run as priced"), std::string::npos) << text.str();
}

TEST(TraceModule, BadInputShapesAreClearErrors) {
  ResidualMlp net;
  EXPECT_TRUE(testing::throws_error([&] { trace_module(net, ModuleTraceOptions(Shape{})); },
                                    "needs the batch as dim 0"));
  EXPECT_TRUE(testing::throws_error(
      [&] {
        trace_module(net, ModuleTraceOptions({0, 16}));
      },
      "needs the batch as dim 0"));
  EXPECT_TRUE(testing::throws_error(
      [&] {
        trace_module(net, ModuleTraceOptions({4, 0}));
      },
      "has a dimension below 1"));
  // The module's forward rejects 5 features: the op's error, named after the module.
  EXPECT_TRUE(testing::throws_error(
      [&] {
        trace_module(net, ModuleTraceOptions({4, 5}).name("mlp"));
      },
      "trace_module(mlp) on input [4, 5]"));
  // Tracing still works afterwards (the trace hook was restored).
  EXPECT_EQ(count_ops(trace_module(net, ModuleTraceOptions({4, 16})), "linear"), 2);
}

TEST(TraceModule, PrintChosenWithoutAChoiceIsAnError) {
  PlanResult empty_result;
  std::ostringstream text;
  EXPECT_TRUE(
      testing::throws_error([&] { print_chosen(text, Graph(), empty_result); }, "no chosen point"));
}

}  // namespace
}  // namespace tessel::planner
