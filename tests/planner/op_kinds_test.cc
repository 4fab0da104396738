// Per-kind pricing: ops are priced by the profile's measured rate for their kind (a fixed cost per
// call plus their FLOPs or bytes over the rate, forward and backward apart), kinds a profile lacks
// fall back to the roofline, the optimizer update is priced per parameter, the profile records the
// thread layout it was measured under, and vision plans the runtime would not run as priced are
// marked and not chosen when only executable plans are asked for (ops over part of 4+ devices).
#include <gtest/gtest.h>

#include <set>

#include "models/trace.h"
#include "nn/nn.h"
#include "ops/ops.h"
#include "parallel/planner/cost_model.h"
#include "parallel/planner/graph.h"
#include "parallel/planner/planner.h"
#include "parallel/planner/strategies.h"
#include "tests/planner/round_number_profile.h"
#include "tests/testing.h"
#include "tools/plan/plan_cli.h"

namespace tessel::planner {
namespace {

Tensor meta(const Shape& sizes) {
  return empty(sizes, TensorOptions(DType::kFloat32).device(Device::meta()));
}

// The traced ops of `forward` on meta tensors (no parameters; x requires grad).
Graph trace_ops(const std::function<void(const Tensor&)>& forward, const Shape& shape) {
  Tensor x = meta(shape);
  x.set_requires_grad(true);
  return trace_graph([&] { forward(x); }, {}, {{"x", x}}, shape[0]);
}

// On 4 devices (options.config.devices), some point of the frontier has an op over part of
// them, and every point marked not executable is marked for that.
// Per-op degrees on 4 devices: ops on the 2 x 2 grid (part of the devices for each of its groups)
// run beside ops on the others, with and without ZeRO; a point is marked only for a parameter cut
// on one grid and read on another (`tied`: whether the model has such a parameter).
// Whether `point` runs ops on the 2 x 2 grid beside ops on another.
bool mixes_the_two_by_two_grid(const PlanResult& result, const PlannedPoint& point) {
  std::set<int> grids;
  for (size_t op = 0; op < point.choice.size(); ++op) {
    const Strategy& s = result.strategies[op][static_cast<size_t>(point.choice[op])];
    if (!s.fully_replicated()) grids.insert(s.tp);
  }
  return grids.count(2) && grids.size() > 1;
}

void expect_ops_over_part_of_four_devices_run(const Graph& graph, const PlanOptions& options,
                                              bool tied) {
  const PlanResult result = plan_graph(graph, options);
  bool on_part = false;
  for (const PlannedPoint& point : result.frontier) {
    const bool part = mixes_the_two_by_two_grid(result, point);
    if (point.executable) {
      on_part = on_part || part;
      continue;
    }
    EXPECT_TRUE(part) << point.summary << ": " << point.not_executable_reason;
    EXPECT_TRUE(tied) << point.summary << ": " << point.not_executable_reason;
    EXPECT_NE(point.not_executable_reason.find("another grid"), std::string::npos)
        << point.not_executable_reason;
  }
  EXPECT_TRUE(on_part) << "expected a runnable point with ops on the 2 x 2 grid among others";
  // Beside ZeRO too (over the one group; a shard cut on the 2 x 2 grid over that grid's dp pair).
  PlanOptions zero = options;
  zero.zero_stages = {1};
  const PlanResult with_zero = plan_graph(graph, zero);
  bool zero_on_part = false;
  for (const PlannedPoint& point : with_zero.frontier) {
    zero_on_part =
        zero_on_part || (mixes_the_two_by_two_grid(with_zero, point) && point.executable);
    if (!point.executable) {
      EXPECT_NE(point.not_executable_reason.find("another grid"), std::string::npos)
          << point.not_executable_reason;
    }
  }
  EXPECT_TRUE(zero_on_part) << "expected a runnable ZeRO point with ops on the 2 x 2 grid";
}

TEST(OpKind, ConvolutionsNormalisationAndActivationsGetTheirOwnKinds) {
  Tensor dense_weight = meta({8, 8, 3, 3}), depthwise_weight = meta({8, 1, 3, 3});
  const Graph convs = trace_ops(
      [&](const Tensor& x) {
        conv2d(x, dense_weight, Tensor(), {1, 1}, {1, 1});
        conv2d(x, depthwise_weight, Tensor(), {1, 1}, {1, 1}, {1, 1}, 8);
        max_pool2d(x, {3, 3}, {2, 2}, {1, 1});
        cat({x, x}, 1);
        relu(x);
        gelu(x);
      },
      {2, 8, 8, 8});
  ASSERT_EQ(convs.ops.size(), 6u);
  EXPECT_EQ(op_kind(convs.ops[0]), "conv");
  EXPECT_EQ(op_kind(convs.ops[1]), "conv_grouped");
  EXPECT_EQ(op_kind(convs.ops[2]), "pool");
  EXPECT_EQ(op_kind(convs.ops[3]), "concat");
  EXPECT_EQ(op_kind(convs.ops[4]), "elementwise");
  EXPECT_EQ(op_kind(convs.ops[5]), "activation");

  Tensor w = meta({16}), b = meta({16});
  const Graph norms = trace_ops(
      [&](const Tensor& x) {
        layer_norm(x, {16}, w, b);
        softmax(x, -1);
      },
      {4, 16});
  ASSERT_EQ(norms.ops.size(), 2u);
  EXPECT_EQ(op_kind(norms.ops[0]), "layer_norm");
  EXPECT_EQ(op_kind(norms.ops[1]), "softmax");
}

TEST(OpTime, MeasuredKindsUseTheirRateAndCallCostOthersTheRoofline) {
  DeviceProfile profile = round_number_profile();
  OpKindRate relu_rate;
  relu_rate.per = "bytes";
  relu_rate.forward = 1e9;
  relu_rate.backward = 5e8;
  relu_rate.forward_call_s = 1e-5;
  relu_rate.backward_call_s = 2e-5;
  profile.op_kinds["elementwise"] = relu_rate;
  // Bytes, not FLOPs: 1e6 bytes at 1 GB/s plus the call.
  EXPECT_DOUBLE_EQ(profile.op_time("elementwise", 123.0, 1e6, false), 1e-5 + 1e-3);
  // Backward: its own rate and call cost, times the backward work factor.
  EXPECT_DOUBLE_EQ(profile.op_time("elementwise", 123.0, 1e6, true, 2.0), 2e-5 + 2 * 2e-3);
  // A kind the profile lacks: the roofline of the closest of gemm / conv / element-wise.
  EXPECT_DOUBLE_EQ(profile.op_time("conv_grouped", 2e9, 0, false), 2.0);
  EXPECT_DOUBLE_EQ(profile.op_time("gemm", 1e9, 0, true, 2.0), 2.0);
}

TEST(OpTime, StrategiesSplitTheWorkButEveryDeviceStillPaysTheCall) {
  DeviceProfile profile = round_number_profile();
  OpKindRate rate;
  rate.per = "bytes";
  rate.forward = rate.backward = 1e9;
  rate.forward_call_s = rate.backward_call_s = 1e-4;
  profile.op_kinds["elementwise"] = rate;
  const Graph graph = trace_ops([](const Tensor& x) { relu(x); }, {8, 64});
  PlannerConfig config;
  config.devices = 2;
  config.profile = profile;
  const auto strategies = enumerate_strategies(graph, config);
  ASSERT_EQ(strategies.size(), 1u);
  const Strategy* whole = nullptr;
  const Strategy* halves = nullptr;
  for (const Strategy& s : strategies[0]) {
    if (s.fully_replicated()) whole = &s;
    if (s.dp == 2 && s.tp == 1) halves = &s;
  }
  ASSERT_TRUE(whole && halves);
  const double bytes = graph.ops[0].bytes;
  EXPECT_DOUBLE_EQ(whole->forward_compute, 1e-4 + bytes / 1e9);
  EXPECT_DOUBLE_EQ(halves->forward_compute, 1e-4 + bytes / 2 / 1e9);
}

TEST(OptimizerTime, PricedPerParameterOrByMemoryTraffic) {
  DeviceProfile profile = round_number_profile();
  profile.memory_bandwidth = 1e9;
  // No measured rate: (3 + 2 states) x 4 bytes per parameter over the memory bandwidth.
  EXPECT_DOUBLE_EQ(profile.optimizer_time(1e6, 2), 7 * 4e6 / 1e9);
  EXPECT_DOUBLE_EQ(profile.optimizer_time(1e6, 1), 5 * 4e6 / 1e9);
  OpKindRate adam;
  adam.per = "parameters";
  adam.forward = adam.backward = 1e8;
  profile.op_kinds["adam_update"] = adam;
  EXPECT_DOUBLE_EQ(profile.optimizer_time(1e6, 2), 1e-2);
  EXPECT_DOUBLE_EQ(profile.optimizer_time(1e6, 1), 5 * 4e6 / 1e9);  // SGD: still the traffic
}

TEST(OptimizerTime, OwnedParametersPayTheUpdateAtTheirShard) {
  nn::Linear layer(64, 128);
  layer.to(Device::meta());
  Tensor x = meta({8, 64});
  const Graph graph = trace_graph([&] { layer(x); }, layer.named_parameters(), {{"x", x}}, 8);
  PlannerConfig config;
  config.devices = 2;
  config.profile = round_number_profile();
  config.optimizer_states = 2;
  const double parameters = 64 * 128 + 128;
  const auto strategies = enumerate_strategies(graph, config);
  for (const Strategy& s : strategies[0]) {
    double shard = 0;
    for (const ParameterSplit& split : s.parameters)
      shard += static_cast<double>(shape_numel(graph.tensors[split.tensor].sizes)) / split.parts;
    EXPECT_DOUBLE_EQ(s.optimizer_compute, config.profile.optimizer_time(shard, 2)) << s.label();
    EXPECT_LE(shard, parameters);
    // The update is part of the strategy's time.
    EXPECT_DOUBLE_EQ(s.cost(1.0, 1.0).time, s.forward_compute + s.forward_comm +
                                                s.backward_compute + s.backward_comm +
                                                s.gradient_sync + s.optimizer_compute);
  }
}

TEST(DeviceProfile, OpKindsAndLayoutRoundTripAndBadKindsAreNamed) {
  DeviceProfile profile = round_number_profile();
  OpKindRate rate;
  rate.per = "flops";
  rate.forward = 3e10;
  rate.backward = 2e10;
  rate.forward_call_s = 5e-6;
  profile.op_kinds["conv_grouped"] = rate;
  profile.calibrated_ranks = 2;
  profile.calibrated_threads = 1;
  const std::string text = profile_to_json(profile);
  const DeviceProfile again = parse_profile(text, "round trip");
  EXPECT_EQ(profile_to_json(again), text);
  ASSERT_EQ(again.op_kinds.count("conv_grouped"), 1u);
  EXPECT_DOUBLE_EQ(again.op_kinds.at("conv_grouped").forward_call_s, 5e-6);
  EXPECT_EQ(again.layout_description(), "2 ranks x 1 thread at once");
  EXPECT_EQ(round_number_profile().layout_description(), "layout not recorded");

  std::string bad = text;
  bad.replace(bad.find("\"flops\""), 7, "\"watts\"");
  EXPECT_TRUE(
      testing::throws_error([&] { parse_profile(bad, "p.json"); }, "op_kinds.conv_grouped.per"));
}

TEST(DeviceProfile, ShippedCpuProfileSaysWhichLayoutItWasMeasuredUnder) {
  const DeviceProfile cpu = load_profile(find_profile("cpu_2core_example"));
  EXPECT_GT(cpu.calibrated_ranks, 0);
  EXPECT_GT(cpu.calibrated_threads, 0);
  for (const char* kind : {"gemm", "conv", "conv_grouped", "elementwise", "batch_norm"})
    EXPECT_EQ(cpu.op_kinds.count(kind), 1u) << kind;
}

TEST(Executable, VisionPlansRunOnTheirGridOrOverAllTheDevicesAndTheRestIsMarked) {
  ModelSpec spec;
  spec.name = "resnet18";
  spec.batch = 4;
  spec.image_size = 32;
  PlanOptions options;
  options.config.devices = 2;
  options.config.max_tp = 2;
  options.config.profile = load_profile(find_profile("h200_cluster"));
  options.remat_fractions = {1.0};
  const Graph graph = models::trace_model(spec);
  EXPECT_EQ(graph.model, "resnet18");

  // On one dp x tp grid every point runs as priced (the recipes run a tensor-parallel group's
  // plan through parallel::ParallelModule).
  const PlanResult grid = plan_graph(graph, options);
  bool tensor_parallel = false;
  for (const PlannedPoint& point : grid.frontier) {
    EXPECT_TRUE(point.executable) << point.summary << ": " << point.not_executable_reason;
    tensor_parallel = tensor_parallel || point.tp > 1;
  }
  EXPECT_TRUE(tensor_parallel) << "expected some tensor-parallel point on the frontier";

  // ZeRO beside a tensor-parallel group runs on a grid (through parallel::ParallelModule): on
  // 4 devices, dp=2 x tp=2 points with each stage.
  options.config.devices = 4;
  options.config.min_tp = 2;
  std::set<int> zero_beside_tp;
  for (int stage : {1, 2, 3}) {
    options.zero_stages = {stage};
    for (const PlannedPoint& point : plan_graph(graph, options).frontier) {
      EXPECT_TRUE(point.executable) << point.summary << ": " << point.not_executable_reason;
      if (point.dp > 1 && point.tp > 1) zero_beside_tp.insert(point.zero_stage);
    }
  }
  EXPECT_EQ(zero_beside_tp, std::set<int>({1, 2, 3}));
  options.config.devices = 2;
  options.config.min_tp = 1;
  options.zero_stages = {0};

  // Per-op degrees: the recipes run them through parallel::ParallelModule where every op splits
  // the batch or the model over all the devices, or runs whole (every such plan on 2 devices).
  options.per_op_degrees = true;
  bool mixed = false;
  for (const PlannedPoint& point : plan_graph(graph, options).frontier) {
    EXPECT_TRUE(point.executable) << point.summary << ": " << point.not_executable_reason;
    mixed = mixed || point.summary.find("ops at other degrees") != std::string::npos;
  }
  EXPECT_TRUE(mixed) << "expected some point with per-op degrees on the frontier";
  // ZeRO runs beside per-op degrees too (over the line of every device).
  options.zero_stages = {1, 2, 3};
  std::set<int> zero_beside_per_op;
  for (const PlannedPoint& point : plan_graph(graph, options).frontier) {
    if (point.summary.find("ops at other degrees") == std::string::npos) continue;
    EXPECT_TRUE(point.executable) << point.summary << ": " << point.not_executable_reason;
    zero_beside_per_op.insert(point.zero_stage);
  }
  EXPECT_FALSE(zero_beside_per_op.empty())
      << "expected some ZeRO point with per-op degrees on the frontier";
  options.zero_stages = {0};
  // On 4 devices ops at dp=2 tp=2 (part of the devices for each) run beside the others.
  options.config.devices = 4;
  options.config.max_tp = 4;
  expect_ops_over_part_of_four_devices_run(graph, options, /*tied=*/false);
  options.config.devices = 2;
  options.config.max_tp = 2;

  options.executable_only = true;
  const PlanResult runnable = plan_graph(graph, options);
  ASSERT_GE(runnable.chosen, 0);
  const PlannedPoint& chosen = runnable.frontier[runnable.chosen];
  EXPECT_TRUE(chosen.executable);
  // The fastest executable point that fits, even if only non-executable points dominate it.
  for (const PlannedPoint& point : runnable.frontier) {
    if (point.executable && point.cost.memory <= runnable.memory_per_device) {
      EXPECT_GE(point.cost.time, chosen.cost.time);
    }
  }
}

TEST(Executable, BertPlansStayExecutable) {
  ModelSpec spec;
  spec.name = "bert_tiny";
  spec.batch = 4;
  spec.seq = 16;
  PlanOptions options;
  options.config.devices = 2;
  options.config.profile = load_profile(find_profile("h200_cluster"));
  options.remat_fractions = {1.0};
  const PlanResult result = plan_graph(models::trace_model(spec), options);
  for (const PlannedPoint& point : result.frontier) EXPECT_TRUE(point.executable);
}

// BERT's recipe runs per-op degrees through parallel::ParallelModule, each op on its own grid:
// every such plan on 2 devices; on 4, ops at dp=2 tp=2 too, unless the word table tied to the
// decoder is cut on one grid and read on another.
TEST(Executable, BertPerOpDegreesRunOverAllTheDevices) {
  ModelSpec spec;
  spec.name = "bert_tiny";
  spec.batch = 8;
  spec.seq = 16;
  PlanOptions options;
  options.config.profile = load_profile(find_profile("h200_cluster"));
  options.remat_fractions = {1.0};
  options.per_op_degrees = true;
  const Graph graph = models::trace_model(spec);
  options.config.devices = 2;
  bool mixed = false;
  for (const PlannedPoint& point : plan_graph(graph, options).frontier) {
    EXPECT_TRUE(point.executable) << point.summary << ": " << point.not_executable_reason;
    mixed = mixed || point.summary.find("ops at other degrees") != std::string::npos;
  }
  EXPECT_TRUE(mixed) << "expected some point with per-op degrees on the frontier";

  options.config.devices = 4;
  expect_ops_over_part_of_four_devices_run(graph, options, /*tied=*/true);
}

}  // namespace
}  // namespace tessel::planner
