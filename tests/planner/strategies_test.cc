// Strategy costs on hand-computed examples: compute scales with the split, row parallel pays one
// ring all-reduce of its output, column parallel one of its input gradient, data parallel one of
// the gradients; re-distribution between layouts; device profiles and their errors.
#include "parallel/planner/strategies.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "nn/nn.h"
#include "ops/ops.h"
#include "parallel/planner/cost_model.h"
#include "parallel/planner/graph.h"
#include "parallel/planner/planner.h"
#include "tests/planner/round_number_profile.h"
#include "tests/testing.h"
#include "tools/plan/plan_cli.h"

namespace tessel::planner {
namespace {

Tensor meta(const Shape& sizes, DType dtype = DType::kFloat32) {
  return empty(sizes, TensorOptions(dtype).device(Device::meta()));
}

// One linear layer, x (8, 64) -> (8, 128), x requiring grad (as inside a network).
struct OneLinear {
  nn::Linear layer{64, 128};
  Graph graph;
  OneLinear() {
    layer.to(Device::meta());
    Tensor x = meta({8, 64});
    x.set_requires_grad(true);
    graph = trace_graph([&] { layer(x); }, layer.named_parameters(), {{"x", x}}, 8);
  }
};

// Four linear layers (256 -> 256) on x (8, 256).
struct LinearStack {
  std::shared_ptr<nn::Sequential> net =
      std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
          std::make_shared<nn::Linear>(256, 256), std::make_shared<nn::Linear>(256, 256),
          std::make_shared<nn::Linear>(256, 256), std::make_shared<nn::Linear>(256, 256)});
  Graph graph;
  LinearStack() {
    net->to(Device::meta());
    Tensor x = meta({8, 256});
    graph = trace_graph([&] { net->forward(x); }, net->named_parameters(), {{"x", x}}, 8);
  }
};

const Strategy& find(const std::vector<Strategy>& list, int dp, int tp, SplitKind kind) {
  for (const Strategy& s : list)
    if (s.dp == dp && s.tp == tp && s.kind == kind) return s;
  throw std::runtime_error("no strategy dp=" + std::to_string(dp) + " tp=" + std::to_string(tp) +
                           " " + split_kind_name(kind));
}

PlannerConfig config_for(int devices) {
  PlannerConfig config;
  config.devices = devices;
  config.profile = round_number_profile();
  config.optimizer_states = 2;  // Adam
  return config;
}

TEST(Strategies, ColumnParallelLinearHalvesComputeAndSplitsTheWeightByRows) {
  OneLinear net;
  const auto strategies = enumerate_strategies(net.graph, config_for(2));
  ASSERT_EQ(strategies.size(), 1u);
  const Strategy& whole = find(strategies[0], 1, 1, SplitKind::kReplicate);
  const Strategy& column = find(strategies[0], 1, 2, SplitKind::kColumn);
  const double flops = 2.0 * 8 * 64 * 128;
  EXPECT_DOUBLE_EQ(whole.forward_compute, flops / 1e9);
  EXPECT_DOUBLE_EQ(column.forward_compute, whole.forward_compute / 2);
  // Backward computes the input and the weight gradients: twice the forward's work.
  EXPECT_DOUBLE_EQ(column.backward_compute, 2 * column.forward_compute);
  // Weight (128, 64) and bias (128) halved along dim 0, each with its gradient and two Adam
  // moments.
  EXPECT_DOUBLE_EQ(whole.parameter_bytes, (128 * 64 + 128) * 4.0 * 4);
  EXPECT_DOUBLE_EQ(column.parameter_bytes, whole.parameter_bytes / 2);
  ASSERT_EQ(column.parameters.size(), 2u);
  EXPECT_EQ(column.parameters[0].dim, 0);
  EXPECT_EQ(column.parameters[0].parts, 2);
  // The input arrives whole, the output leaves split; backward all-reduces the input gradient
  // (8 x 64 floats) over the 2 ranks: 2(p-1) alpha + 2(p-1)/p bytes / bandwidth.
  EXPECT_EQ(column.input_layouts[0], (Layout{1, 1}));
  EXPECT_EQ(column.output_layouts[0], (Layout{1, 2}));
  EXPECT_DOUBLE_EQ(column.forward_comm, 0);
  EXPECT_DOUBLE_EQ(column.backward_comm, 2 * 1e-6 + 1.0 * (8 * 64 * 4) / 1e9);
}

// Backward holds the output's gradient and the input's at once, at the strategy's shares; a plan's
// peak adds the largest of them to what its ops keep.
TEST(Strategies, BackwardHoldsTheOutputAndInputGradientsAtOnce) {
  OneLinear net;
  const auto strategies = enumerate_strategies(net.graph, config_for(2));
  const Strategy& whole = find(strategies[0], 1, 1, SplitKind::kReplicate);
  const Strategy& column = find(strategies[0], 1, 2, SplitKind::kColumn);
  const Strategy& batch = find(strategies[0], 2, 1, SplitKind::kReplicate);
  EXPECT_DOUBLE_EQ(whole.backward_working_bytes, (8 * 128 + 8 * 64) * 4.0);
  EXPECT_DOUBLE_EQ(column.backward_working_bytes, (8 * 128 / 2 + 8 * 64) * 4.0);
  EXPECT_DOUBLE_EQ(batch.backward_working_bytes, whole.backward_working_bytes / 2);
  PlanOptions options;
  options.config = config_for(1);
  options.remat_fractions = {1.0};
  const PlanResult result = plan_graph(net.graph, options);
  ASSERT_EQ(result.frontier.size(), 1u);
  const PlannedPoint& point = result.frontier[0];
  EXPECT_DOUBLE_EQ(point.breakdown.backward_working_bytes, whole.backward_working_bytes);
  EXPECT_DOUBLE_EQ(point.cost.memory, point.breakdown.parameter_bytes +
                                          point.breakdown.activation_bytes +
                                          point.breakdown.backward_working_bytes);
}

TEST(Strategies, RowParallelLinearAddsOneRingAllReduceOfTheOutput) {
  OneLinear net;
  const auto strategies = enumerate_strategies(net.graph, config_for(4));
  const Strategy& row = find(strategies[0], 1, 4, SplitKind::kRow);
  const Strategy& whole = find(strategies[0], 1, 1, SplitKind::kReplicate);
  EXPECT_DOUBLE_EQ(row.forward_compute, whole.forward_compute / 4);
  const double output_bytes = 8 * 128 * 4;
  const double p = 4;
  EXPECT_DOUBLE_EQ(row.forward_comm, 2 * (p - 1) * 1e-6 + 2 * (p - 1) / p * output_bytes / 1e9);
  EXPECT_DOUBLE_EQ(row.backward_comm, 0);
  EXPECT_EQ(row.input_layouts[0], (Layout{1, 4}));
  EXPECT_EQ(row.output_layouts[0], (Layout{1, 1}));
  // The weight is cut along its input features (dim 1); the bias stays whole.
  EXPECT_EQ(row.parameters[0].dim, 1);
  EXPECT_EQ(row.parameters[1].dim, -1);
  EXPECT_DOUBLE_EQ(row.parameter_bytes, (128 * 64 / 4 + 128) * 4.0 * 4);
}

TEST(Strategies, DataParallelSplitsTheBatchAndAllReducesGradients) {
  OneLinear net;
  const auto strategies = enumerate_strategies(net.graph, config_for(2));
  const Strategy& dp = find(strategies[0], 2, 1, SplitKind::kReplicate);
  const Strategy& whole = find(strategies[0], 1, 1, SplitKind::kReplicate);
  EXPECT_EQ(dp.label(), "dp=2");
  EXPECT_EQ(whole.label(), "replicate");
  EXPECT_DOUBLE_EQ(dp.forward_compute, whole.forward_compute / 2);
  // No sharding of parameters; DDP's bucket buffers hold one more copy of the gradients.
  EXPECT_DOUBLE_EQ(dp.parameter_bytes, whole.parameter_bytes + (128 * 64 + 128) * 4.0);
  // A ring all-reduce of every gradient byte over 2 ranks, in 25 MiB buckets: each tensor pays
  // its share of a bucket's latency.
  const double bytes = (128 * 64 + 128) * 4.0, bucket = 25.0 * 1024 * 1024;
  const double expected = 2 * 1e-6 * bytes / bucket + 1.0 * bytes / 1e9;
  EXPECT_NEAR(dp.gradient_sync, expected, 1e-15);
  EXPECT_DOUBLE_EQ(whole.gradient_sync, 0);
  EXPECT_EQ(dp.input_layouts[0], (Layout{2, 1}));
}

// DDP and ParallelModule copy each gradient into a flat bucket before the all-reduce and the sum
// back after it: two copy calls per parameter tensor, each reading and writing its bytes, priced
// at the concatenation rate. ZeRO stage 2 reduce-scatters each gradient where it lies: no copies.
TEST(Strategies, DataParallelGradientsPayTheirCopiesIntoAndOutOfTheBucket) {
  OneLinear net;
  auto gradient_sync = [&](int zero_stage, bool priced_copies) {
    PlannerConfig config = config_for(2);
    config.zero_stage = zero_stage;
    if (priced_copies) {
      OpKindRate copy;
      copy.per = "bytes";
      copy.forward = copy.backward = 2e9;
      copy.forward_call_s = copy.backward_call_s = 1e-5;
      config.profile.op_kinds["concat"] = copy;
    }
    return find(enumerate_strategies(net.graph, config)[0], 2, 1, SplitKind::kReplicate)
        .gradient_sync;
  };
  const double weight = 128 * 64 * 4.0, bias = 128 * 4.0;
  auto copies = [](double bytes) { return 2 * (1e-5 + 2 * bytes / 2e9); };
  EXPECT_NEAR(gradient_sync(0, true), gradient_sync(0, false) + copies(weight) + copies(bias),
              1e-15);
  EXPECT_DOUBLE_EQ(gradient_sync(2, true), gradient_sync(2, false));
}

// ZeRO (parallel/zero.h) on 4 data-parallel ranks: stage 1 keeps a quarter of the Adam moments
// and all-gathers the updated parameters; stage 2 also keeps a quarter of the gradients, which
// are reduce-scattered instead of all-reduced; stage 3 also keeps a quarter of the values and
// gathers each parameter for the forward op, and the weight again for the backward op (it makes
// x's gradient from it), holding the whole weight and bias and their gradients there. Every
// collective is one per parameter tensor and use.
TEST(Strategies, ZeroStagesKeepStateAndGradientsInDataParallelParts) {
  OneLinear net;
  const double weight = 128 * 64 * 4.0, bias = 128 * 4.0, bytes = weight + bias, p = 4;
  auto ring = [&](double tensor_bytes) {  // all_gather or reduce_scatter over 4 ranks
    return (p - 1) * 1e-6 + (p - 1) / p * tensor_bytes / 1e9;
  };
  std::vector<Strategy> at[4];
  for (int stage = 0; stage < 4; ++stage) {
    PlannerConfig config = config_for(4);
    config.zero_stage = stage;
    at[stage] = enumerate_strategies(net.graph, config)[0];
  }
  const Strategy& none = find(at[0], 4, 1, SplitKind::kReplicate);
  const Strategy& one = find(at[1], 4, 1, SplitKind::kReplicate);
  const Strategy& two = find(at[2], 4, 1, SplitKind::kReplicate);
  const Strategy& three = find(at[3], 4, 1, SplitKind::kReplicate);
  // Values, gradients and DDP's bucket copy whole; the two moments in quarters.
  EXPECT_DOUBLE_EQ(none.parameter_bytes, bytes * (1 + 1 + 2 + 1));
  EXPECT_DOUBLE_EQ(one.parameter_bytes, bytes * (1 + 1 + 2 / p + 1));
  // No DDP under stage 2: values whole, gradients and moments in quarters.
  EXPECT_DOUBLE_EQ(two.parameter_bytes, bytes * (1 + 1 / p + 2 / p));
  EXPECT_DOUBLE_EQ(three.parameter_bytes, bytes * (1 / p + 1 / p + 2 / p));
  EXPECT_DOUBLE_EQ(three.backward_working_bytes, two.backward_working_bytes + 2 * bytes);
  EXPECT_NEAR(one.gradient_sync, none.gradient_sync + ring(weight) + ring(bias), 1e-15);
  EXPECT_NEAR(two.gradient_sync, 2 * (ring(weight) + ring(bias)), 1e-15);
  EXPECT_NEAR(three.gradient_sync, two.gradient_sync + ring(weight), 1e-15);
  EXPECT_DOUBLE_EQ(three.optimizer_compute, two.optimizer_compute);
  EXPECT_DOUBLE_EQ(one.optimizer_compute, none.optimizer_compute / p);
  EXPECT_DOUBLE_EQ(two.optimizer_compute, one.optimizer_compute);
  // Without data parallelism there is nothing to shard.
  EXPECT_DOUBLE_EQ(find(at[2], 1, 1, SplitKind::kReplicate).parameter_bytes,
                   find(at[0], 1, 1, SplitKind::kReplicate).parameter_bytes);
}

// The ZeRO stages asked for join the frontier as their own points: with stage 3 the least memory
// per device falls (on four layers: one layer gathered whole at a time), and such points say so in
// their summary; without a tensor-parallel group the recipes run them (--zero, or the plan file's
// zero_stage).
TEST(Strategies, ZeroStagesAreFrontierPointsOfTheirOwn) {
  LinearStack net;
  PlanOptions options;
  options.config = config_for(4);
  options.config.max_tp = 1;  // data parallel or whole: what ZeRO shards
  options.remat_fractions = {1.0};
  const PlanResult plain = plan_graph(net.graph, options);
  options.zero_stages = {0, 1, 2, 3};
  const PlanResult zero = plan_graph(net.graph, options);
  ASSERT_FALSE(plain.frontier.empty());
  ASSERT_FALSE(zero.frontier.empty());
  const PlannedPoint& least = zero.frontier.front();
  EXPECT_LT(least.cost.memory, plain.frontier.front().cost.memory);
  EXPECT_EQ(least.zero_stage, 3);
  EXPECT_NE(least.summary.find("ZeRO-3"), std::string::npos) << least.summary;
  EXPECT_TRUE(least.executable) << least.not_executable_reason;
  for (const PlannedPoint& point : plain.frontier) EXPECT_EQ(point.zero_stage, 0);
  options.zero_stages = {4};
  EXPECT_TRUE(tessel::testing::throws_error([&] { plan_graph(net.graph, options); },
                                            "ZeRO stages are 0, 1, 2 and 3"));
}

// Two batch norms (16 channels each) in a row, x (8, 16, 4, 4): four running-statistics buffers.
struct TwoBatchNorms {
  nn::BatchNorm2d first{nn::BatchNormOptions(16)}, second{nn::BatchNormOptions(16)};
  Graph graph;
  TwoBatchNorms() {
    first.to(Device::meta());
    second.to(Device::meta());
    Tensor x = meta({8, 16, 4, 4});
    auto parameters = first.named_parameters();
    for (const auto& named : second.named_parameters())
      parameters.push_back({"second." + named.first, named.second});
    graph = trace_graph([&] { second(first(x)); }, parameters, {{"x", x}}, 8);
  }
};

TEST(Strategies, DataParallelBroadcastsBuffersOnceAndGathersBatchStatistics) {
  TwoBatchNorms net;
  std::vector<int> norms;
  for (const TracedOp& op : net.graph.ops)
    if (op.name == "batch_norm") norms.push_back(op.id);
  ASSERT_EQ(norms.size(), 2u);
  const auto strategies = enumerate_strategies(net.graph, config_for(2));
  const double buffer_bytes = 2 * 16 * 4.0;  // running mean and variance of one batch norm
  // One collective for all buffers: the first reader carries its latency (one all_gather step),
  // every reader the bytes of its own buffers.
  const Strategy& first = find(strategies[norms[0]], 2, 1, SplitKind::kReplicate);
  const Strategy& second = find(strategies[norms[1]], 2, 1, SplitKind::kReplicate);
  // And each normalises by the whole batch's statistics: every rank's per-channel mean and
  // centred squares all-gathered (2 ranks x 2 x 16 floats), their gradient all-reduced.
  const double statistics_bytes = 2 * 2 * 16 * 4.0;
  const double gather = 1e-6 + 0.5 * statistics_bytes / 1e9;
  EXPECT_NEAR(first.forward_comm, 1e-6 + buffer_bytes / 1e9 + gather, 1e-15);
  EXPECT_NEAR(second.forward_comm, buffer_bytes / 1e9 + gather, 1e-15);
  EXPECT_NEAR(second.backward_comm, 2e-6 + statistics_bytes / 1e9, 1e-15);
  // Each rank's own statistics (DDP's way): the buffers' broadcast alone.
  PlannerConfig per_rank = config_for(2);
  per_rank.whole_batch_norm = false;
  const auto local = enumerate_strategies(net.graph, per_rank);
  EXPECT_NEAR(find(local[norms[1]], 2, 1, SplitKind::kReplicate).forward_comm, buffer_bytes / 1e9,
              1e-15);
  EXPECT_DOUBLE_EQ(find(local[norms[1]], 2, 1, SplitKind::kReplicate).backward_comm, 0);
  // Nothing to broadcast without data parallelism.
  EXPECT_DOUBLE_EQ(find(strategies[norms[0]], 1, 1, SplitKind::kReplicate).forward_comm, 0);
}

// The whole batch's statistics run as kBatchNormOverDp*Calls op calls and about *Passes passes
// over the input beyond one batch_norm (ParallelModule's batch_norm_over_dp): each call at the
// per-op overhead, each pass over this rank's rows (8 / 2 x 16 x 4 x 4 floats) at the memory
// bandwidth (no element-wise rate in this profile).
TEST(Strategies, BatchNormOverABatchSplitPaysForTheCallsItRunsAs) {
  TwoBatchNorms net;
  int norm = -1;
  for (const TracedOp& op : net.graph.ops)
    if (op.name == "batch_norm" && norm < 0) norm = op.id;
  ASSERT_GE(norm, 0);
  PlannerConfig whole = config_for(2);
  whole.profile.op_overhead_s = 1e-6;
  whole.profile.memory_bandwidth = 1e9;
  PlannerConfig per_rank = whole;
  per_rank.whole_batch_norm = false;
  const auto whole_strategies = enumerate_strategies(net.graph, whole);
  const auto per_rank_strategies = enumerate_strategies(net.graph, per_rank);
  const Strategy& over_batch = find(whole_strategies[norm], 2, 1, SplitKind::kReplicate);
  const Strategy& own_rows = find(per_rank_strategies[norm], 2, 1, SplitKind::kReplicate);
  const double local_bytes = 4 * 16 * 4 * 4 * 4.0;
  EXPECT_NEAR(
      over_batch.forward_compute - own_rows.forward_compute,
      kBatchNormOverDpForwardCalls * 1e-6 + kBatchNormOverDpForwardPasses * local_bytes / 1e9,
      1e-12);
  EXPECT_NEAR(
      over_batch.backward_compute - own_rows.backward_compute,
      kBatchNormOverDpBackwardCalls * 1e-6 + kBatchNormOverDpBackwardPasses * local_bytes / 1e9,
      1e-12);
  // Without a batch split it is one batch_norm call.
  EXPECT_DOUBLE_EQ(find(whole_strategies[norm], 1, 1, SplitKind::kReplicate).forward_compute,
                   find(per_rank_strategies[norm], 1, 1, SplitKind::kReplicate).forward_compute);
}

// cross_entropy over vocabulary-split logits runs as parallel::vocab_parallel_cross_entropy's
// ops, not the fused op: priced at the profile's "vocab_loss" rate where it has one (here half
// the fused rate: twice the time), at the fused op's "loss" rate where not; unsplit, the fused
// op's rate either way.
TEST(Strategies, AVocabularySplitLossIsPricedAtItsDecompositionsRate) {
  Tensor logits = meta({8, 64}), target = meta({8}, DType::kInt64);
  logits.set_requires_grad(true);
  const Graph graph = trace_graph([&] { cross_entropy(logits, target); }, {},
                                  {{"logits", logits}, {"target", target}}, 8);
  int loss = -1;
  for (const TracedOp& op : graph.ops)
    if (op.name == "cross_entropy") loss = op.id;
  ASSERT_GE(loss, 0);
  PlannerConfig fused = config_for(2);
  fused.profile.op_overhead_s = 0;
  fused.profile.rank_skew = 0;
  fused.profile.op_kinds["loss"] = OpKindRate{"bytes", 1e9, 1e9, 0, 0};
  PlannerConfig decomposed = fused;
  decomposed.profile.op_kinds[kVocabLossKind] = OpKindRate{"bytes", 0.5e9, 0.5e9, 0, 0};
  const auto fused_strategies = enumerate_strategies(graph, fused);
  const auto decomposed_strategies = enumerate_strategies(graph, decomposed);
  const double local_bytes = graph.ops[loss].bytes / 2;
  const Strategy& split_fused = find(fused_strategies[loss], 1, 2, SplitKind::kVocab);
  const Strategy& split = find(decomposed_strategies[loss], 1, 2, SplitKind::kVocab);
  EXPECT_DOUBLE_EQ(split_fused.forward_compute, local_bytes / 1e9);
  EXPECT_DOUBLE_EQ(split.forward_compute, local_bytes / 0.5e9);
  EXPECT_DOUBLE_EQ(split.backward_compute, 2 * split_fused.backward_compute);
  EXPECT_DOUBLE_EQ(find(decomposed_strategies[loss], 1, 1, SplitKind::kReplicate).forward_compute,
                   find(fused_strategies[loss], 1, 1, SplitKind::kReplicate).forward_compute);
}

// While backward moves a gradient back to its producer's layout, each device holds the part of
// that layout beside the part it had: the plan's peak counts it where the move happens.
TEST(Strategies, MovingAGradientBackHoldsBothParts) {
  const double bytes = 1 << 20;
  const Layout whole{1, 1}, rows{2, 1}, columns{1, 2};
  EXPECT_DOUBLE_EQ(redistribution_gradient_bytes(columns, rows, bytes), bytes / 2);
  EXPECT_DOUBLE_EQ(redistribution_gradient_bytes(whole, rows, bytes), bytes);
  EXPECT_DOUBLE_EQ(redistribution_gradient_bytes(rows, whole, bytes), 0);  // a local slice
  EXPECT_DOUBLE_EQ(redistribution_gradient_bytes(rows, rows, bytes), 0);
}

TEST(Strategies, ReadingPartOfATensorPaysTheGradientScatterInBackward) {
  // A linear on one half of x's features (a chunk, as ShuffleNet splits its channels) against the
  // same linear on a whole tensor of that shape: the chunk's backward writes zeros over all of x
  // and copies the half's gradient in (read and written), bytes over the memory bandwidth.
  nn::Linear layer{32, 16};
  layer.to(Device::meta());
  Tensor x = meta({8, 64}), half = meta({8, 32});
  x.set_requires_grad(true);
  half.set_requires_grad(true);
  const Graph on_view =
      trace_graph([&] { layer(chunk(x, 2, 1)[1]); }, layer.named_parameters(), {{"x", x}}, 8);
  const Graph on_whole =
      trace_graph([&] { layer(half); }, layer.named_parameters(), {{"x", half}}, 8);
  PlannerConfig config = config_for(2);
  config.profile.memory_bandwidth = 1e9;
  const auto view_strategies = enumerate_strategies(on_view, config);
  const auto whole_strategies = enumerate_strategies(on_whole, config);
  ASSERT_EQ(on_view.ops.size(), 1u);
  const double scatter_bytes = (8 * 64 + 2 * 8 * 32) * 4.0;
  const double skew = 1 + config.profile.rank_skew;
  for (int dp : {1, 2}) {
    const Strategy& viewed = find(view_strategies[0], dp, 1, SplitKind::kReplicate);
    const Strategy& whole = find(whole_strategies[0], dp, 1, SplitKind::kReplicate);
    EXPECT_DOUBLE_EQ(viewed.forward_compute, whole.forward_compute);
    EXPECT_NEAR(viewed.backward_compute - whole.backward_compute, skew * scatter_bytes / dp / 1e9,
                1e-15);
  }
}

TEST(Strategies, DegreesDivideTheDevicesUpToMaxTp) {
  PlannerConfig config = config_for(8);
  EXPECT_EQ(tensor_parallel_degrees(config), (std::vector<int>{1, 2, 4, 8}));
  config.max_tp = 2;
  EXPECT_EQ(tensor_parallel_degrees(config), (std::vector<int>{1, 2}));
  config = config_for(6);
  EXPECT_EQ(tensor_parallel_degrees(config), (std::vector<int>{1, 2, 3, 6}));
  config.devices = 0;
  EXPECT_TRUE(testing::throws_error([&] { tensor_parallel_degrees(config); }, "at least 1"));
}

TEST(Strategies, BatchSplitsMustDivideTheBatch) {
  OneLinear net;  // batch 8
  PlannerConfig config = config_for(16);
  const auto strategies = enumerate_strategies(net.graph, config);
  for (const Strategy& s : strategies[0]) EXPECT_TRUE(s.dp == 1 || 8 % s.dp == 0) << s.label();
}

TEST(Redistribution, ColumnThenRowNeedsNothing) {
  const DeviceProfile profile = round_number_profile();
  EXPECT_DOUBLE_EQ(redistribution_time({2, 4}, {2, 4}, 1e6, true, profile, 8), 0);
  // A replicated tensor is sliced for free going forward, but its gradient must be gathered.
  EXPECT_DOUBLE_EQ(redistribution_time({1, 1}, {4, 1}, 1e6, false, profile, 8), 0);
  EXPECT_GT(redistribution_time({1, 1}, {4, 1}, 1e6, true, profile, 8), 0);
}

TEST(Redistribution, BatchToColumnIsAnAllGather) {
  // Produced split over 8 ranks by batch, read by a column-parallel op on dp=4 x tp=2: each rank
  // gathers its tp pair's two batch pieces: (p-1) alpha + (p-1)/p * needed bytes / bandwidth.
  const DeviceProfile profile = round_number_profile();
  const double bytes = 8e6;
  const double needed = bytes / 4;
  EXPECT_DOUBLE_EQ(redistribution_time({8, 1}, {4, 1}, bytes, false, profile, 8),
                   1e-6 + 0.5 * needed / 1e9);
  // Its gradient comes back already split finer: nothing to move.
  EXPECT_DOUBLE_EQ(redistribution_time({8, 1}, {4, 1}, bytes, true, profile, 8),
                   1e-6 + 0.5 * needed / 1e9);
}

// Between the batch's line and the model's on the same ranks, each rank sends every other a
// part's size-th of its part and copies the part twice (into the pieces, then the received pieces
// into its output), each copy reading and writing it at the concatenation rate.
TEST(Redistribution, BatchLineToModelLineIsAnAllToAllThatCopiesItsPartTwice) {
  DeviceProfile profile = round_number_profile();
  profile.op_kinds["concat"] = OpKindRate{"bytes", 2e9, 2e9, 5e-6, 5e-6};
  const double bytes = 8e6, part = bytes / 2;
  const auto steps = redistribution_steps({2, 1}, {1, 2}, bytes, 2);
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_EQ(steps[0].kind, MoveStep::Kind::kAllToAll);
  EXPECT_DOUBLE_EQ(move_collectives_time({2, 1}, {1, 2}, bytes, profile, 2),
                   1e-6 + 0.5 * part / 1e9 + 4 * part / 2e9);
  EXPECT_DOUBLE_EQ(move_collectives_time({1, 2}, {2, 1}, bytes, profile, 2),
                   1e-6 + 0.5 * part / 1e9 + 4 * part / 2e9);
  // A gather copies nothing beyond the collective.
  EXPECT_DOUBLE_EQ(move_collectives_time({1, 2}, {1, 1}, bytes, profile, 2),
                   1e-6 + 0.5 * bytes / 1e9);
}

// Ranks reach a collective apart by the jitter of the work before it: a row-parallel op's
// all-reduce waits sync_jitter * sqrt(its forward compute), a move the same after the producer's
// forward and, for the gradient, after the consumer's backward; nothing where nothing moves. The
// profile keeps the jitter through JSON.
TEST(Strategies, CollectivesWaitTheJitterOfTheWorkBeforeThem) {
  PlannerConfig config = config_for(4);
  const Strategy row_alone =
      find(enumerate_strategies(OneLinear().graph, config)[0], 1, 4, SplitKind::kRow);
  config.profile.sync_jitter = 0.01;
  const Strategy row =
      find(enumerate_strategies(OneLinear().graph, config)[0], 1, 4, SplitKind::kRow);
  EXPECT_DOUBLE_EQ(row.forward_comm,
                   row_alone.forward_comm + 0.01 * std::sqrt(row.forward_compute));
  EXPECT_DOUBLE_EQ(row.backward_comm, 0);
  const DeviceProfile& profile = config.profile;
  const double plain = redistribution_time({8, 1}, {4, 1}, 8e6, false, round_number_profile(), 8);
  EXPECT_DOUBLE_EQ(redistribution_time({8, 1}, {4, 1}, 8e6, false, profile, 8, 0.04, 0.09),
                   plain + 0.01 * 0.2);
  EXPECT_DOUBLE_EQ(
      redistribution_time({1, 1}, {4, 1}, 8e6, true, profile, 8, 0.04, 0.09),
      redistribution_time({1, 1}, {4, 1}, 8e6, true, round_number_profile(), 8) + 0.01 * 0.3);
  EXPECT_DOUBLE_EQ(redistribution_time({2, 4}, {2, 4}, 8e6, true, profile, 8, 0.04, 0.09), 0);
  const DeviceProfile reread = parse_profile(profile_to_json(profile), "test");
  EXPECT_DOUBLE_EQ(reread.sync_jitter, 0.01);
  EXPECT_DOUBLE_EQ(reread.sync_wait(0.04), 0.002);
}

// Column-parallel linear, relu and row-parallel linear (Megatron-LM's MLP) on x (8, 64).
struct ColumnReluRow {
  std::shared_ptr<nn::Sequential> net =
      std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
          std::make_shared<nn::Linear>(64, 128), std::make_shared<nn::ReLU>(),
          std::make_shared<nn::Linear>(128, 64)});
  Graph graph;
  ColumnReluRow() {
    net->to(Device::meta());
    Tensor x = meta({8, 64});
    x.set_requires_grad(true);
    graph = trace_graph([&] { net->forward(x); }, net->named_parameters(), {{"x", x}}, 8);
  }
};

int index_of(const std::vector<Strategy>& list, int dp, int tp, SplitKind kind) {
  return static_cast<int>(&find(list, dp, tp, kind) - list.data());
}

// A plan prices each collective's wait after the work since the previous collective: the
// row-parallel all-reduce waits for the column, relu and row forwards together, the column's
// input-gradient all-reduce for the three backwards; an op's own strategy knows only its own work.
TEST(Strategies, APlansWaitsCountTheWorkSinceThePreviousCollective) {
  ColumnReluRow mlp;
  ASSERT_EQ(mlp.graph.ops.size(), 3u);
  PlannerConfig config = config_for(2);
  config.profile.sync_jitter = 0.01;
  config.profile.sync_exponent = 0.75;
  const auto strategies = enumerate_strategies(mlp.graph, config);
  const std::vector<int> choice = {index_of(strategies[0], 1, 2, SplitKind::kColumn),
                                   index_of(strategies[1], 1, 2, SplitKind::kFeature),
                                   index_of(strategies[2], 1, 2, SplitKind::kRow)};
  const Strategy& column = strategies[0][choice[0]];
  const Strategy& relu = strategies[1][choice[1]];
  const Strategy& row = strategies[2][choice[2]];
  EXPECT_DOUBLE_EQ(row.forward_wait, 0.01 * std::pow(row.forward_compute, 0.75));
  EXPECT_DOUBLE_EQ(column.backward_wait, 0.01 * std::pow(column.backward_compute, 0.75));
  const SequencedWaits waits = sequenced_waits(mlp.graph, strategies, choice, config);
  const double forward_work = column.forward_compute + relu.forward_compute + row.forward_compute;
  const double backward_work =
      row.backward_compute + relu.backward_compute + column.backward_compute;
  EXPECT_DOUBLE_EQ(waits.forward, 0.01 * std::pow(forward_work, 0.75));
  EXPECT_DOUBLE_EQ(waits.backward, 0.01 * std::pow(backward_work, 0.75));
  // The plan's time holds these waits in place of the strategies' own.
  const PlannedPoint point = describe_choice(mlp.graph, strategies, config, choice, 1.0);
  EXPECT_DOUBLE_EQ(point.breakdown.sync_wait_s, waits.forward + waits.backward);
  double strategies_time = 0;
  for (size_t op = 0; op < 3; ++op) strategies_time += strategies[op][choice[op]].cost(1, 1).time;
  EXPECT_NEAR(
      point.cost.time,
      strategies_time - row.forward_wait - column.backward_wait + waits.forward + waits.backward,
      1e-15);
  // Without jitter nothing waits.
  config.profile.sync_jitter = 0;
  const SequencedWaits none =
      sequenced_waits(mlp.graph, enumerate_strategies(mlp.graph, config), choice, config);
  EXPECT_DOUBLE_EQ(none.forward + none.backward, 0);
}

// Convolutions and linear layers are priced by their measured local shapes where the profile has
// them (DeviceProfile::op_shapes): the local call each strategy makes cuts the batch by dp and,
// by the split, the output channels (column), the input channels (row) or whole groups (feature).
TEST(Strategies, MeasuredShapesPriceMatrixOpsAtTheirLocalShapes) {
  nn::Conv2d conv(nn::Conv2dOptions(16, 32, 3).padding(1));
  nn::Conv2d depthwise(nn::Conv2dOptions(32, 32, 3).padding(1).groups(32));
  conv.to(Device::meta());
  depthwise.to(Device::meta());
  Tensor x = meta({8, 16, 8, 8});
  std::vector<std::pair<std::string, Tensor>> parameters = conv.named_parameters();
  for (auto& [name, tensor] : depthwise.named_parameters())
    parameters.emplace_back("dw." + name, tensor);
  const Graph graph = trace_graph([&] { depthwise(conv(x)); }, parameters, {{"x", x}}, 8);
  ASSERT_EQ(graph.ops.size(), 2u);
  const TracedOp& op = graph.ops[0];
  auto shapes = [&](const TracedOp& traced, int dp, SplitKind kind) {
    const std::optional<ShardCall> call = shard_call(graph, traced, dp, 2, kind);
    EXPECT_TRUE(call.has_value());
    std::vector<Shape> result;
    for (const auto& shape : call->input_shapes) result.push_back(shape.value_or(Shape{}));
    return result;
  };
  EXPECT_EQ(shapes(op, 2, SplitKind::kReplicate),
            (std::vector<Shape>{{4, 16, 8, 8}, {32, 16, 3, 3}, {32}}));
  EXPECT_EQ(shapes(op, 1, SplitKind::kColumn),
            (std::vector<Shape>{{8, 16, 8, 8}, {16, 16, 3, 3}, {16}}));
  EXPECT_EQ(shapes(op, 1, SplitKind::kRow),
            (std::vector<Shape>{{8, 8, 8, 8}, {32, 8, 3, 3}, {32}}));
  EXPECT_EQ(shapes(graph.ops[1], 1, SplitKind::kFeature),
            (std::vector<Shape>{{8, 16, 8, 8}, {16, 1, 3, 3}, {16}}));
  EXPECT_EQ(
      shard_call(graph, graph.ops[1], 1, 2, SplitKind::kFeature)->attrs.get<int64_t>("groups"), 16);
  // The data input needs no gradient, the weights do.
  const ShardCall column = *shard_call(graph, op, 1, 2, SplitKind::kColumn);
  EXPECT_EQ(column.needs_gradient, (std::vector<bool>{false, true, true}));
  EXPECT_EQ(column.key().rfind("conv2d [8, 16, 8, 8] [16, 16, 3, 3]' [16]' {", 0), 0u)
      << column.key();

  PlannerConfig config = config_for(2);
  const auto by_rate = enumerate_strategies(graph, config);
  config.profile.op_shapes[column.key()] = {0.5, 0.7};
  const DeviceProfile reread = parse_profile(profile_to_json(config.profile), "test");
  ASSERT_EQ(reread.op_shapes.count(column.key()), 1u);
  EXPECT_DOUBLE_EQ(reread.op_shapes.at(column.key()).backward_s, 0.7);
  config.profile = reread;
  const auto measured = enumerate_strategies(graph, config);
  const Strategy& priced = find(measured[0], 1, 2, SplitKind::kColumn);
  EXPECT_DOUBLE_EQ(priced.forward_compute, 0.5);
  EXPECT_DOUBLE_EQ(priced.backward_compute, 0.7);
  // Calls at other shapes keep their kind's rate.
  EXPECT_DOUBLE_EQ(find(measured[0], 1, 2, SplitKind::kRow).forward_compute,
                   find(by_rate[0], 1, 2, SplitKind::kRow).forward_compute);
  // Ops of other kinds have no local call here.
  const OneLinear linear;
  EXPECT_FALSE(shard_call(linear.graph, linear.graph.ops[0], 1, 2, SplitKind::kHeads));
}

TEST(DeviceProfile, RingFormulas) {
  DeviceProfile profile = round_number_profile();
  profile.collectives[1][0] = {5e-6, 1e8};  // inter-node all_reduce
  // 8 ranks in one node: 14 steps of 1 us plus 2 * 7/8 of 1 MB at 1 GB/s.
  EXPECT_DOUBLE_EQ(profile.collective_time(Collective::kAllReduce, 8, 1e6), 14e-6 + 1.75e6 / 1e9);
  EXPECT_DOUBLE_EQ(profile.collective_time(Collective::kAllGather, 8, 1e6), 7e-6 + 0.875e6 / 1e9);
  // 16 ranks span two nodes: the inter-node link prices it.
  EXPECT_DOUBLE_EQ(profile.collective_time(Collective::kAllReduce, 16, 1e6),
                   30 * 5e-6 + 2 * 15.0 / 16 * 1e6 / 1e8);
  EXPECT_DOUBLE_EQ(profile.collective_time(Collective::kAllReduce, 1, 1e6), 0);
  // Ranks that share cores wait for each other's turns at every ring step.
  profile.collective_turn_s = 2e-6;
  EXPECT_DOUBLE_EQ(profile.collective_time(Collective::kAllReduce, 8, 1e6),
                   14 * 3e-6 + 1.75e6 / 1e9);
  EXPECT_DOUBLE_EQ(profile.collective_time(Collective::kAllGather, 8, 1e6),
                   7 * 3e-6 + 0.875e6 / 1e9);
}

TEST(DeviceProfile, ShippedProfilesParseAndCiteSources) {
  const DeviceProfile h200 = load_profile(find_profile("h200_cluster"));
  EXPECT_EQ(h200.devices_per_node, 8);
  EXPECT_DOUBLE_EQ(h200.memory_per_device, 141e9);
  EXPECT_NE(h200.sources_json.find("nvidia.com"), std::string::npos);
  const DeviceProfile cpu = load_profile(find_profile("cpu_2core_example"));
  EXPECT_GT(cpu.gemm_flops, 0);
  const DeviceProfile quiet = load_profile(find_profile("cpu_2core_quiet"));
  EXPECT_GT(quiet.gemm_flops, 0);
  EXPECT_FALSE(quiet.op_kinds.empty());
  // A round trip through JSON keeps every number.
  const DeviceProfile again = parse_profile(profile_to_json(h200), "round trip");
  EXPECT_EQ(profile_to_json(again), profile_to_json(h200));
}

TEST(DeviceProfile, SharedCoreTimesScaleTrimmedCpuTimeByTheCoreShare) {
  // The middle half of each case's CPU samples (outliers either way dropped), times wall / CPU
  // of all rounds: a short case loses the share of the cores as a long one does.
  const std::vector<std::vector<double>> samples = {{1e-4, 1e-4, 1e-4, 9e-3},
                                                    {2e-2, 2e-2, 1e-3, 2e-2}};
  const std::vector<double> shared = shared_core_times(samples, 4.0, 2.0);
  ASSERT_EQ(shared.size(), 2u);
  EXPECT_NEAR(shared[0], 2e-4, 1e-15);
  EXPECT_NEAR(shared[1], 4e-2, 1e-15);
  // Without CPU time the samples stand as they are.
  EXPECT_NEAR(shared_core_times(samples, 4.0, 0.0)[1], 2e-2, 1e-15);
  EXPECT_DOUBLE_EQ(trimmed_mean({}), 0);
  EXPECT_DOUBLE_EQ(trimmed_mean({5.0}), 5.0);
}

TEST(DeviceProfile, MissingOrBadFieldsAreNamed) {
  const std::string good = profile_to_json(round_number_profile());
  auto without = [&](const std::string& key) {
    std::string text = good;
    const size_t at = text.find("\"" + key + "\"");
    text.replace(at, key.size() + 2, "\"removed_" + key + "\"");
    return text;
  };
  EXPECT_TRUE(testing::throws_error([&] { parse_profile(without("gemm"), "p.json"); },
                                    "missing field 'compute_flops.gemm'"));
  EXPECT_TRUE(testing::throws_error([&] { parse_profile(without("devices_per_node"), "p.json"); },
                                    "missing field 'devices_per_node'"));
  EXPECT_TRUE(testing::throws_error([&] { parse_profile(without("inter_node"), "p.json"); },
                                    "missing field 'collectives.inter_node'"));
  EXPECT_TRUE(
      testing::throws_error([&] { parse_profile("{not json", "p.json"); }, "not valid JSON"));
  EXPECT_TRUE(testing::throws_error([&] { load_profile("/nonexistent/profile.json"); },
                                    "cannot open profile"));
}

TEST(ParseBytes, UnitsAndErrors) {
  EXPECT_DOUBLE_EQ(parse_bytes("16GiB", "m"), 16.0 * 1024 * 1024 * 1024);
  EXPECT_DOUBLE_EQ(parse_bytes("1.5GB", "m"), 1.5e9);
  EXPECT_DOUBLE_EQ(parse_bytes("512 mib", "m"), 512.0 * 1024 * 1024);
  EXPECT_DOUBLE_EQ(parse_bytes("4096", "m"), 4096);
  EXPECT_TRUE(testing::throws_error([] { parse_bytes("lots", "--memory_per_device"); },
                                    "--memory_per_device: cannot read 'lots' as a size"));
  EXPECT_TRUE(testing::throws_error([] { parse_bytes("16GiBs", "m"); }, "unknown unit"));
  EXPECT_TRUE(testing::throws_error([] { parse_bytes("-1GB", "m"); }, "must be positive"));
  // Finite text, infinite bytes: refused rather than returned as inf.
  EXPECT_TRUE(testing::throws_error([] { parse_bytes("1.51e308GiB", "m"); }, "is too large"));
}

// Numbers that do not fit the profile's fields are errors, not wrapped or thrown as JSON errors.
TEST(DeviceProfile, OutOfRangeCountsAndNonStringNamesAreErrors) {
  const std::string good = profile_to_json(round_number_profile());
  auto with = [&](const std::string& key, const std::string& value) {
    nlohmann::json profile = nlohmann::json::parse(good);
    profile[key] = nlohmann::json::parse(value);
    return profile.dump();
  };
  EXPECT_TRUE(testing::throws_error(
      [&] { parse_profile(with("devices_per_node", "9223372036854775807"), "p.json"); },
      "field 'devices_per_node' must be a whole number up to 2147483647"));
  EXPECT_TRUE(testing::throws_error(
      [&] {
        parse_profile(
            with("calibrated_layout", R"({"ranks_at_once": 1e300, "threads_per_rank": 1})"),
            "p.json");
      },
      "field 'calibrated_layout.ranks_at_once' must be a whole number"));
  EXPECT_TRUE(testing::throws_error([&] { parse_profile(with("name", "7"), "p.json"); },
                                    "field 'name' must be a string, got 7"));
  EXPECT_TRUE(testing::throws_error([&] { parse_profile(with("sync_exponent", "1.5"), "p.json"); },
                                    "field 'sync_exponent' must be in [0, 1], got 1.5"));
  EXPECT_TRUE(
      testing::throws_error([&] { parse_profile(with("collective_turn_s", "-1e-6"), "p.json"); },
                            "field 'collective_turn_s' must be non-negative, got -1e-06"));
  // A measured turn survives the round trip through JSON.
  DeviceProfile turning = round_number_profile();
  turning.collective_turn_s = 3e-5;
  EXPECT_DOUBLE_EQ(parse_profile(profile_to_json(turning), "p.json").collective_turn_s, 3e-5);
  EXPECT_TRUE(testing::throws_error(
      [&] { parse_profile(with("op_shapes", R"({"conv2d [1]": {"backward_s": 1}})"), "p.json"); },
      "missing field 'op_shapes.conv2d [1].forward_s'"));
  EXPECT_TRUE(testing::throws_error(
      [&] { parse_profile(with("op_shapes", R"({"conv2d [1]": {"forward_s": -1}})"), "p.json"); },
      "field 'op_shapes.conv2d [1].forward_s' must be positive"));
}

}  // namespace
}  // namespace tessel::planner

namespace tessel::planner {
namespace {

TEST(SharedParameters, ATiedWeightIsAllReducedOnceWhenAnyUserSplitsTheBatch) {
  // y = W (W x): one (16, 16) weight read by two linear ops.
  Tensor weight = meta({16, 16});
  weight.set_requires_grad(true);
  Tensor x = meta({8, 16});
  Graph graph =
      trace_graph([&] { linear(linear(x, weight), weight); }, {{"w", weight}}, {{"x", x}}, 8);
  ASSERT_EQ(graph.ops.size(), 2u);
  const auto shared = shared_parameters(graph);
  ASSERT_EQ(shared.size(), 1u);
  EXPECT_EQ(shared[0].owner, 0);
  EXPECT_EQ(shared[0].user, 1);
  const PlannerConfig config = config_for(2);
  const auto strategies = enumerate_strategies(graph, config);
  const Strategy& owner_dp = find(strategies[0], 2, 1, SplitKind::kReplicate);
  const Strategy& owner_whole = find(strategies[0], 1, 1, SplitKind::kReplicate);
  const Strategy& user_dp = find(strategies[1], 2, 1, SplitKind::kReplicate);
  const Strategy& user_whole = find(strategies[1], 1, 1, SplitKind::kReplicate);
  // Only the owner carries the weight's memory and its all-reduce.
  EXPECT_GT(owner_dp.parameter_bytes, 0);
  EXPECT_DOUBLE_EQ(user_dp.parameter_bytes, 0);
  EXPECT_GT(owner_dp.gradient_sync, 0);
  EXPECT_DOUBLE_EQ(user_dp.gradient_sync, 0);
  // Both split the batch: one all-reduce (the owner's). Only the user splits: the user's
  // contribution still needs one. Neither: none.
  EXPECT_DOUBLE_EQ(shared_parameter_time(graph, shared[0], owner_dp, user_dp, config), 0);
  EXPECT_DOUBLE_EQ(shared_parameter_time(graph, shared[0], owner_whole, user_dp, config),
                   owner_dp.gradient_sync);
  EXPECT_DOUBLE_EQ(shared_parameter_time(graph, shared[0], owner_whole, user_whole, config), 0);
  // Cut differently (rows by one user, whole by the other): the weight is gathered.
  const Strategy& user_column = find(strategies[1], 1, 2, SplitKind::kColumn);
  EXPECT_GT(shared_parameter_time(graph, shared[0], owner_whole, user_column, config), 0);
}

}  // namespace
}  // namespace tessel::planner
