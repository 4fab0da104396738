// Views of split tensors as the runtime runs them and the planner prices them: where a split's
// parts lie after a transpose, a reshape (the channel shuffle's strided parts), a slice or a
// select, which views cut across them, and the gather such a view makes, priced once for all the
// readers of one value (a channel split's two halves).
#include "parallel/planner/views.h"

#include <gtest/gtest.h>

#include "nn/nn.h"
#include "ops/ops.h"
#include "parallel/planner/graph.h"
#include "tests/planner/round_number_profile.h"

namespace tessel::planner {
namespace {

ViewStep step(const std::string& op, const Shape& from, const Shape& to, Attrs attrs = {}) {
  return ViewStep{op, std::move(attrs), from, to, 0, false};
}

Attrs dim(int64_t d) {
  Attrs attrs;
  attrs.set("dim", d);
  return attrs;
}

TEST(Views, ASliceAcrossTheModelSplitCutsItAndOneBesideItKeepsIt) {
  const ViewStep channels = step("slice", {2, 8, 6, 6}, {2, 4, 6, 6}, dim(1));
  EXPECT_FALSE(place_through_view(channels, SplitPlace{false, 1, 0}, 1, 2));
  const auto kept = place_through_view(channels, SplitPlace{true, -1, 0}, 2, 1);
  ASSERT_TRUE(kept);
  EXPECT_TRUE(kept->batch);
  EXPECT_FALSE(kept->model());
  // A select before the split dim moves it down one.
  const auto selected =
      place_through_view(step("select", {2, 5, 8}, {2, 8}, dim(1)), SplitPlace{false, 2, 0}, 1, 2);
  ASSERT_TRUE(selected);
  EXPECT_EQ(selected->axis, 1);
  EXPECT_FALSE(place_through_view(step("select", {4, 8}, {8}, dim(0)), SplitPlace{true}, 2, 1));
}

TEST(Views, ATransposeMovesTheSplitAndCutsWhereItMovesTheBatch) {
  Attrs swap;
  swap.set("dim0", int64_t{1});
  swap.set("dim1", int64_t{2});
  const auto moved = place_through_view(step("transpose", {2, 4, 6}, {2, 6, 4}, swap),
                                        SplitPlace{true, 1, 0}, 2, 2);
  ASSERT_TRUE(moved);
  EXPECT_EQ(moved->axis, 2);
  Attrs batch_last;
  batch_last.set("dim0", int64_t{0});
  batch_last.set("dim1", int64_t{1});
  EXPECT_FALSE(
      place_through_view(step("transpose", {2, 4}, {4, 2}, batch_last), SplitPlace{true}, 2, 1));
}

// ShuffleNet's channel shuffle ends in a view of (n, c / 2, 2, h, w) split along its dim of 2 as
// (n, c, h, w): every other channel on one rank, a period of 2 along the channels. In four parts
// that dim cannot be cut, and the view cuts across the split.
TEST(Views, TheShufflesReshapeGivesAPeriodicSplitInTwoAndCutsFour) {
  const ViewStep merge = step("view", {2, 4, 2, 3, 3}, {2, 8, 3, 3});
  const auto strided = place_through_view(merge, SplitPlace{false, 2, 0}, 1, 2);
  ASSERT_TRUE(strided);
  EXPECT_EQ(strided->axis, 1);
  EXPECT_EQ(strided->period, 2);
  EXPECT_FALSE(place_through_view(merge, SplitPlace{false, 2, 0}, 1, 4));
  // Splitting the channels into (2, c / 2) keeps a split of the channels in two on the first.
  const auto blocks = place_through_view(step("view", {2, 8, 3, 3}, {2, 2, 4, 3, 3}),
                                         SplitPlace{false, 1, 0}, 1, 2);
  ASSERT_TRUE(blocks);
  EXPECT_EQ(blocks->axis, 1);
  EXPECT_EQ(blocks->period, 0);
}

TEST(Views, AnOpsKindForcesItsAxisOrTakesItsInputs) {
  EXPECT_EQ(forced_model_axis(ParallelSplit::kConvChannels, SplitKind::kColumn, {}, 4, 4, 2), 1);
  EXPECT_EQ(forced_model_axis(ParallelSplit::kLinearWeight, SplitKind::kColumn, {}, 3, 3, -1), 2);
  EXPECT_EQ(forced_model_axis(ParallelSplit::kPointwise, SplitKind::kFeature, {}, 4, 4, 2), -1);
  EXPECT_EQ(forced_model_axis(ParallelSplit::kPointwise, SplitKind::kFeature, {}, 4, 4, -1), 1);
  EXPECT_EQ(forced_model_axis(ParallelSplit::kPointwise, SplitKind::kFeature, {}, 2, 2, -1), 1);
  // Attention's softmax never along the dim it normalises.
  EXPECT_EQ(forced_model_axis(ParallelSplit::kSoftmaxHeads, SplitKind::kFeature, dim(-1), 3, 3, 2),
            1);
}

// A convolution's output cut in two halves along the channels (chunk): the second half through
// another convolution, then the two joined.
class SplitAndJoin : public nn::Module {
 public:
  SplitAndJoin() : Module("SplitAndJoin") {
    first = register_module("first", std::make_shared<nn::Conv2d>(nn::Conv2dOptions(4, 8, 3)));
    second = register_module("second", std::make_shared<nn::Conv2d>(nn::Conv2dOptions(4, 4, 1)));
  }
  Tensor forward(const Tensor& x) override {
    const std::vector<Tensor> halves = chunk(first->forward(x), 2, 1);
    return cat({halves[0], second->forward(halves[1])}, 1);
  }
  std::shared_ptr<nn::Conv2d> first, second;
};

struct SplitAndJoinGraph {
  SplitAndJoin net;
  Graph graph;
  const TracedOp* second_conv = nullptr;
  const TracedOp* join = nullptr;
  SplitAndJoinGraph() {
    net.to(Device::meta());
    Tensor x = empty({2, 4, 8, 8}, TensorOptions().device(Device::meta()));
    graph = trace_graph([&] { net.forward(x); }, net.named_parameters(), {{"x", x}}, 2);
    for (const TracedOp& op : graph.ops) {
      if (op.name == "conv2d" && op.id > 0) second_conv = &op;
      if (op.name == "cat") join = &op;
    }
  }
};

TEST(Views, TheTraceRecordsTheViewsEachInputIsReadThroughAndWhereASplitLies) {
  SplitAndJoinGraph g;
  ASSERT_NE(g.second_conv, nullptr);
  ASSERT_NE(g.join, nullptr);
  const TracedTensor& made = g.graph.tensors[g.second_conv->inputs[0]];
  EXPECT_EQ(made.producer, 0);
  EXPECT_EQ(made.model_axis, 1);  // a convolution's channels
  ASSERT_EQ(g.second_conv->input_views[0].size(), 1u);
  const ViewStep& half = g.second_conv->input_views[0][0];
  EXPECT_EQ(half.op, "slice");
  EXPECT_EQ(half.from, (Shape{2, 8, 6, 6}));
  EXPECT_EQ(half.to, (Shape{2, 4, 6, 6}));
  // The convolution reads the tensor first, the join after it: one gather serves both.
  EXPECT_TRUE(half.first);
  ASSERT_EQ(g.join->input_views[0].size(), 1u);
  EXPECT_EQ(g.join->input_views[0][0].source, half.source);
  EXPECT_FALSE(g.join->input_views[0][0].first);
  EXPECT_TRUE(g.join->input_views[1].empty());
}

TEST(Views, AChannelSplitIsGatheredOnceForItsHalvesAndABatchSplitIsKept) {
  SplitAndJoinGraph g;
  const TracedTensor& made = g.graph.tensors[g.second_conv->inputs[0]];
  const double whole = 2.0 * 8 * 6 * 6 * 4;
  const ViewRead first = read_through_views(made, g.second_conv->input_views[0], Layout{1, 2});
  ASSERT_EQ(first.gathers.size(), 1u);
  EXPECT_EQ(first.gathers[0].from, (Layout{1, 2}));
  EXPECT_EQ(first.gathers[0].to, (Layout{1, 1}));
  EXPECT_DOUBLE_EQ(first.gathers[0].bytes, whole);
  EXPECT_TRUE(first.gathers[0].first);
  EXPECT_EQ(first.layout, (Layout{1, 1}));
  // On a 2 x 2 grid the gather keeps the batch's split.
  const ViewRead grid = read_through_views(made, g.second_conv->input_views[0], Layout{2, 2});
  ASSERT_EQ(grid.gathers.size(), 1u);
  EXPECT_EQ(grid.gathers[0].to, (Layout{2, 1}));
  // The batch's split alone survives the slice.
  const ViewRead rows = read_through_views(made, g.second_conv->input_views[0], Layout{2, 1});
  EXPECT_TRUE(rows.gathers.empty());
  EXPECT_EQ(rows.layout, (Layout{2, 1}));

  // Priced: the first reader runs the gather, the join finds it made.
  EXPECT_EQ(input_read(g.graph, *g.second_conv, 0, Layout{1, 2}).gathers.size(), 1u);
  const InputRead joined = input_read(g.graph, *g.join, 0, Layout{1, 2});
  EXPECT_TRUE(joined.gathers.empty());
  EXPECT_EQ(joined.found, (Layout{1, 1}));
  EXPECT_DOUBLE_EQ(joined.bytes, whole / 2);

  PlannerConfig config;
  config.devices = 2;
  config.profile = round_number_profile();
  const auto strategies = enumerate_strategies(g.graph, config);
  auto find = [](const std::vector<Strategy>& list, int tp, SplitKind kind) {
    return *std::find_if(list.begin(), list.end(), [&](const Strategy& s) {
      return s.dp == 1 && s.tp == tp && s.kind == kind;
    });
  };
  const Strategy split = find(strategies[0], 2, SplitKind::kColumn);
  // The gather of the whole output, and nothing for the half the convolution reads whole.
  const InputRead convolved = input_read(g.graph, *g.second_conv, 0, split.output_layouts[0]);
  EXPECT_DOUBLE_EQ(read_time(convolved, split, Layout{1, 1}, 0, config),
                   move_collectives_time({1, 2}, {1, 1}, whole, config.profile, 2));
  EXPECT_DOUBLE_EQ(read_time(input_read(g.graph, *g.join, 0, split.output_layouts[0]), split,
                             Layout{1, 1}, 0, config),
                   0);
}

}  // namespace
}  // namespace tessel::planner
