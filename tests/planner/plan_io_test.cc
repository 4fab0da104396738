// Plan files: what the planner writes reads back the same, and malformed files are refused with
// the field named. Also the whole planning step on a small model: plans on the frontier cost
// what the frontier says, the chosen one fits.
#include "parallel/planner/plan_io.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "models/trace.h"
#include "parallel/planner/planner.h"
#include "tests/testing.h"
#include "tools/plan/plan_cli.h"

namespace tessel::planner {
namespace {

std::string temp_path(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

struct PlannedBert {
  ModelSpec spec;
  PlanOptions options;
  Graph graph;
  PlanResult result;
  PlannedBert() {
    spec.name = "bert_tiny";
    spec.batch = 8;
    spec.seq = 32;
    options.config.devices = 4;
    options.config.profile = load_profile(find_profile("h200_cluster"));
    options.memory_per_device = 1e9;
    graph = models::trace_model(spec);
    result = plan_graph(graph, options);
  }
};

TEST(PlanGraph, FrontierPointsCostWhatTheirPlansCost) {
  PlannedBert bert;
  const PlanResult& result = bert.result;
  ASSERT_FALSE(result.frontier.empty());
  ASSERT_GE(result.chosen, 0);
  for (size_t i = 0; i < result.frontier.size(); ++i) {
    const PlannedPoint& point = result.frontier[i];
    const PlannedPoint again = describe_choice(bert.graph, result.strategies, bert.options.config,
                                               point.choice, point.remat_fraction);
    EXPECT_NEAR(again.cost.memory, point.cost.memory, 1e-6 * point.cost.memory) << i;
    EXPECT_NEAR(again.cost.time, point.cost.time, 1e-9 * point.cost.time) << i;
    if (i > 0) {  // sorted by memory, and faster as memory grows
      EXPECT_GT(point.cost.memory, result.frontier[i - 1].cost.memory);
      EXPECT_LT(point.cost.time, result.frontier[i - 1].cost.time);
    }
  }
  const PlannedPoint& chosen = result.frontier[result.chosen];
  EXPECT_LE(chosen.cost.memory, 1e9);
  for (const PlannedPoint& point : result.frontier) {
    if (point.cost.memory <= 1e9) {
      EXPECT_GE(point.cost.time, chosen.cost.time);
    }
  }
  // Every plan runs on one dp x tp grid of the 4 devices.
  for (const PlannedPoint& point : result.frontier) EXPECT_EQ(point.dp * point.tp, 4);
}

TEST(PlanGraph, RecomputationOpensPlansBelowThePlainMinimum) {
  PlannedBert bert;
  double least_plain = 1e30, least = 1e30;
  for (const PlannedPoint& point : bert.result.frontier) {
    least = std::min(least, point.cost.memory);
    if (point.remat_fraction == 1.0) least_plain = std::min(least_plain, point.cost.memory);
  }
  EXPECT_LT(least, least_plain);
  bool said = false;
  for (const PlannedPoint& point : bert.result.frontier)
    said = said || point.summary.find("under auto") != std::string::npos;
  EXPECT_TRUE(said);
}

TEST(PlanFile, RoundTripsThroughJson) {
  PlannedBert bert;
  const PlanFile plan =
      make_plan_file(bert.graph, bert.result, bert.result.chosen, bert.spec, bert.options);
  EXPECT_EQ(plan.model, "bert_tiny");
  EXPECT_EQ(plan.mesh_dp * plan.mesh_tp, 4);
  EXPECT_EQ(plan.parameters.size(), 46u);  // BertForPreTraining tiny, tied decoder listed once
  EXPECT_EQ(plan.ops.size(), bert.graph.ops.size());
  const std::string path = temp_path("plan.json");
  write_plan(plan, path);
  const PlanFile read = read_plan(path);
  EXPECT_EQ(plan_to_json(read), plan_to_json(plan));
  EXPECT_EQ(read.parameters, plan.parameters);
  EXPECT_EQ(read.ops, plan.ops);
  EXPECT_EQ(read.summary, plan.summary);
  EXPECT_DOUBLE_EQ(read.predicted_time, plan.predicted_time);
}

TEST(PlanFile, RefusesMalformedFilesNamingTheField) {
  PlanFile plan;
  plan.model = "resnet18";
  plan.devices = 2;
  plan.batch = 8;
  plan.parameters.push_back({"fc.weight", {10, 512}, 0, 2});
  plan.ops.push_back({0, "linear", "column", 1, 2, {"fc.weight"}});
  const std::string good = plan_to_json(plan);
  EXPECT_EQ(plan_to_json(plan_from_json(good, "good.json")), good);
  auto replaced = [&](const std::string& from, const std::string& to) {
    std::string text = good;
    text.replace(text.find(from), from.size(), to);
    return text;
  };
  EXPECT_TRUE(testing::throws_error(
      [&] { plan_from_json(replaced("\"devices\"", "\"device_count\""), "bad.json"); },
      "plan bad.json: missing field 'devices'"));
  EXPECT_TRUE(testing::throws_error(
      [&] { plan_from_json(replaced("tessel-plan", "other"), "bad.json"); }, "tessel-plan"));
  EXPECT_TRUE(testing::throws_error(
      [&] { plan_from_json(replaced("\"column\"", "\"diagonal\""), "bad.json"); },
      "unknown split kind 'diagonal'"));
  EXPECT_TRUE(testing::throws_error(
      [&] { plan_from_json(replaced("\"parts\": 2", "\"parts\": 3"), "bad.json"); },
      "does not split into 3 parts"));
  EXPECT_TRUE(
      testing::throws_error([&] { plan_from_json("[1, 2", "bad.json"); }, "not valid JSON"));
  EXPECT_TRUE(
      testing::throws_error([&] { read_plan("/nonexistent/plan.json"); }, "cannot open plan"));
  // Counts held as int: a larger value is refused instead of wrapping (to 0 parts, -1 index...).
  EXPECT_TRUE(testing::throws_error(
      [&] { plan_from_json(replaced("\"parts\": 2", "\"parts\": 4294967296"), "bad.json"); },
      "field 'parameters[0].parts' must be at most 2147483647, got 4294967296"));
  EXPECT_TRUE(testing::throws_error(
      [&] {
        plan_from_json(replaced("\"index\": 0", "\"index\": 18446744073709551615"), "bad.json");
      },
      "field 'ops[0].index' must be at most 2147483647"));
}

// A plan's ZeRO stage (parallel/zero.h) travels with it; plans written before it read as none.
TEST(PlanFile, CarriesItsZeroStage) {
  PlanFile plan;
  plan.model = "resnet18";
  plan.devices = 2;
  plan.batch = 8;
  plan.mesh_dp = 2;
  plan.zero_stage = 2;
  const std::string text = plan_to_json(plan);
  EXPECT_EQ(plan_from_json(text, "zero.json").zero_stage, 2);
  nlohmann::json older = nlohmann::json::parse(text);
  older.erase("zero_stage");
  EXPECT_EQ(plan_from_json(older.dump(), "older.json").zero_stage, 0);
  nlohmann::json bad = nlohmann::json::parse(text);
  bad["zero_stage"] = 4;
  EXPECT_TRUE(testing::throws_error([&] { plan_from_json(bad.dump(), "bad.json"); },
                                    "field 'zero_stage' must be 0, 1, 2 or 3, got 4"));
  bad["zero_stage"] = 1;
  bad["mesh"] = {{"dp", 1}, {"tp", 2}};
  EXPECT_TRUE(testing::throws_error(
      [&] { plan_from_json(bad.dump(), "bad.json"); },
      "needs ranks that split the batch, but the mesh is dp=1 tp=2 and no op splits the batch"));
  // Per-op degrees: ZeRO runs over the line of every rank, which an op splits the batch over.
  nlohmann::json per_op = bad;
  per_op["ops"] = {{{"index", 0},
                    {"op", "linear"},
                    {"strategy", "replicate"},
                    {"dp", 2},
                    {"tp", 1},
                    {"parameters", nlohmann::json::array()}},
                   {{"index", 1},
                    {"op", "linear"},
                    {"strategy", "column"},
                    {"dp", 1},
                    {"tp", 2},
                    {"parameters", nlohmann::json::array()}}};
  EXPECT_EQ(plan_from_json(per_op.dump(), "per_op.json").zero_stage, 1);
}

// How batch norm over a batch split normalises travels with the plan; older plans read as the
// whole batch's statistics.
TEST(PlanFile, CarriesHowBatchNormNormalises) {
  PlanFile plan;
  plan.model = "resnet18";
  plan.devices = 2;
  plan.batch = 8;
  plan.batch_norm = "per_rank";
  const std::string text = plan_to_json(plan);
  EXPECT_EQ(plan_from_json(text, "per_rank.json").batch_norm, "per_rank");
  nlohmann::json older = nlohmann::json::parse(text);
  older.erase("batch_norm");
  EXPECT_EQ(plan_from_json(older.dump(), "older.json").batch_norm, "whole_batch");
  nlohmann::json bad = nlohmann::json::parse(text);
  bad["batch_norm"] = "sync";
  EXPECT_TRUE(testing::throws_error([&] { plan_from_json(bad.dump(), "bad.json"); },
                                    "field 'batch_norm' must be \"whole_batch\" or \"per_rank\", "
                                    "got \"sync\""));
}

}  // namespace
}  // namespace tessel::planner
