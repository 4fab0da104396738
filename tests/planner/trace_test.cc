// Tracing a forward pass on the meta device: one node per op call, views folded into their
// consumers, parameters and data inputs named, the batch followed through reshapes, no bytes.
#include "models/trace.h"

#include <gtest/gtest.h>

#include "core/allocator.h"
#include "core/op.h"
#include "nn/nn.h"
#include "ops/ops.h"
#include "parallel/planner/graph.h"
#include "parallel/planner/planner.h"
#include "tests/testing.h"

namespace tessel::planner {
namespace {

Tensor meta(const Shape& sizes, DType dtype = DType::kFloat32) {
  return empty(sizes, TensorOptions(dtype).device(Device::meta()));
}

std::vector<std::string> op_names(const Graph& graph) {
  std::vector<std::string> names;
  for (const auto& op : graph.ops) names.push_back(op.name);
  return names;
}

TEST(Trace, TinyMlpGivesOneNodePerOpWithShapesAndNoBytes) {
  nn::Sequential model{std::make_shared<nn::Linear>(4, 8), std::make_shared<nn::ReLU>(),
                       std::make_shared<nn::Linear>(8, 2)};
  model.to(Device::meta());
  Tensor x = meta({16, 4}), y = meta({16}, DType::kInt64);
  const auto before = memory::allocator_for(Device::cpu())->stats();
  Graph graph = trace_graph([&] { cross_entropy(model(x), y); }, model.named_parameters(),
                            {{"x", x}, {"y", y}}, 16);
  const auto after = memory::allocator_for(Device::cpu())->stats();
  EXPECT_EQ(after.num_allocations, before.num_allocations);
  EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);

  ASSERT_EQ(op_names(graph),
            (std::vector<std::string>{"linear", "relu", "linear", "cross_entropy"}));
  const TracedOp& first = graph.ops[0];
  EXPECT_EQ(first.output_shapes[0], (Shape{16, 8}));
  EXPECT_EQ(graph.tensors[first.inputs[0]].input, "x");
  EXPECT_EQ(graph.tensors[first.inputs[1]].parameter, "0.weight");
  EXPECT_EQ(graph.tensors[first.inputs[2]].parameter, "0.bias");
  EXPECT_DOUBLE_EQ(first.flops, 2.0 * 16 * 4 * 8);  // 2 n m k
  // Edges follow the data: relu reads linear's output, the second linear reads relu's.
  EXPECT_EQ(graph.ops[1].inputs[0], first.outputs[0]);
  EXPECT_EQ(graph.ops[2].inputs[0], graph.ops[1].outputs[0]);
  EXPECT_EQ(graph.ops[3].inputs[0], graph.ops[2].outputs[0]);
  EXPECT_EQ(graph.tensors[graph.ops[3].inputs[1]].input, "y");
  EXPECT_EQ(graph.ops[2].output_shapes[0], (Shape{16, 2}));
  EXPECT_EQ(graph.ops[3].output_shapes[0], (Shape{}));
  // The batch is followed until the loss reduces it away.
  EXPECT_TRUE(graph.tensors[graph.ops[2].outputs[0]].has_batch);
  EXPECT_FALSE(graph.tensors[graph.ops[3].outputs[0]].has_batch);
  EXPECT_TRUE(graph.tensors[first.outputs[0]].requires_grad);
  EXPECT_EQ(graph.parameter_count(), 4 * 8 + 8 + 8 * 2 + 2);
  // linear saves its input and weight for backward.
  EXPECT_EQ(first.saved_inputs, (std::vector<int>{0, 1}));
  EXPECT_TRUE(first.differentiable);
}

TEST(Trace, ConvNetFoldsViewsIntoTheirConsumers) {
  nn::Sequential model{std::make_shared<nn::Conv2d>(nn::Conv2dOptions(3, 8, 3).padding(1)),
                       std::make_shared<nn::BatchNorm2d>(8), std::make_shared<nn::ReLU>(),
                       std::make_shared<nn::Flatten>(),
                       std::make_shared<nn::Linear>(8 * 6 * 6, 10)};
  model.to(Device::meta());
  Tensor x = meta({4, 3, 6, 6});
  Graph graph = trace_graph([&] { model(x); }, model.named_parameters(), {{"x", x}}, 4);
  // Batch norm's counter update (num_batches_tracked += 1) is traced too.
  ASSERT_EQ(op_names(graph),
            (std::vector<std::string>{"conv2d", "full", "add", "batch_norm", "relu", "linear"}));
  const TracedOp& linear = graph.ops[5];
  const TracedOp& relu_op = graph.ops[4];
  const TracedOp& norm = graph.ops[3];
  // The flatten view is gone: linear reads relu's output, seen as (4, 288).
  EXPECT_EQ(linear.inputs[0], relu_op.outputs[0]);
  EXPECT_EQ(linear.input_shapes[0], (Shape{4, 288}));
  EXPECT_TRUE(linear.input_has_batch[0]);
  EXPECT_EQ(graph.tensors[relu_op.outputs[0]].sizes, (Shape{4, 8, 6, 6}));
  EXPECT_EQ(norm.inputs[0], graph.ops[0].outputs[0]);
  EXPECT_GT(graph.ops[0].flops, 0);
  // Running statistics are inputs without a producer that are neither parameters nor data.
  const TracedTensor& running_mean = graph.tensors[norm.inputs[3]];
  EXPECT_FALSE(running_mean.is_parameter());
  EXPECT_FALSE(running_mean.is_input());
  EXPECT_EQ(running_mean.producer, -1);
}

TEST(Trace, RestoresThePreviousTraceHook) {
  int calls = 0;
  TraceHook previous = set_trace_hook([&](const OpDef&, const std::vector<Tensor>&,
                                          const std::vector<Tensor>&, const Attrs&) { ++calls; });
  Tensor x = meta({2, 3});
  trace_graph([&] { relu(x); }, {}, {{"x", x}}, 2);
  EXPECT_EQ(calls, 0);
  relu(x);
  EXPECT_EQ(calls, 1);
  set_trace_hook(previous);
}

TEST(Trace, BertAttentionKeepsTheBatchThroughHeadReshapes) {
  ModelSpec spec;
  spec.name = "bert_tiny";
  spec.batch = 2;
  spec.seq = 8;
  Graph graph = models::trace_model(spec);
  int bmms = 0, linears = 0, layer_norms = 0;
  for (const TracedOp& op : graph.ops) {
    if (op.name == "bmm") {
      ++bmms;
      EXPECT_EQ(op.input_shapes[0][0], 2 * 2);  // batch * heads
      EXPECT_TRUE(op.input_has_batch[0]);
      EXPECT_TRUE(op.input_has_batch[1]);
    }
    linears += op.name == "linear";
    layer_norms += op.name == "layer_norm";
    EXPECT_NE(op.name, "view");
    EXPECT_NE(op.name, "permute");
  }
  // tiny: 2 layers of (q, k, v, attention output, intermediate, output) plus pooler, transform,
  // NSP head and the tied MLM decoder.
  EXPECT_EQ(bmms, 2 * 2);
  EXPECT_EQ(linears, 2 * 6 + 4);
  EXPECT_EQ(layer_norms, 1 + 2 * 2 + 1);
  EXPECT_NEAR(graph.parameter_count() / 1e6, 4.4, 0.1);
}

TEST(Trace, EveryZooModelTraces) {
  for (const char* name : {"resnet18", "shufflenet_v2_x0_5", "bert_mini"}) {
    ModelSpec spec;
    spec.name = name;
    spec.batch = 2;
    spec.seq = 16;
    spec.image_size = 32;
    Graph graph = models::trace_model(spec);
    EXPECT_GT(graph.ops.size(), 10u) << name;
  }
  ModelSpec unknown;
  unknown.name = "resnet19";
  EXPECT_TRUE(testing::throws_error([&] { models::trace_model(unknown); }, "known: resnet18"));
}

}  // namespace
}  // namespace tessel::planner
