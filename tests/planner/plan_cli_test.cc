// The plan command end to end (in process): runs for BERT and ResNet on 4 devices, writes a plan
// file the recipes can read and a frontier picture, and refuses bad input with clear errors.
#include "tools/plan/plan_cli.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "parallel/planner/plan_io.h"

namespace tessel::planner {
namespace {

struct CliRun {
  int code = 0;
  std::string out, err;
};

CliRun run(std::vector<std::string> args) {
  args.insert(args.begin(), "plan");
  std::vector<const char*> argv;
  for (const auto& arg : args) argv.push_back(arg.c_str());
  std::ostringstream out, err;
  CliRun result;
  result.code = run_plan_cli(static_cast<int>(argv.size()), argv.data(), out, err);
  result.out = out.str();
  result.err = err.str();
  return result;
}

std::string temp_path(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

bool file_nonempty(const std::string& path) {
  std::ifstream file(path, std::ios::binary | std::ios::ate);
  return file.good() && file.tellg() > 0;
}

TEST(PlanCommand, BertTinyOnFourDevicesPrintsTheFrontierAndWritesThePlan) {
  const std::string plan_path = temp_path("bert_plan.json"), png = temp_path("bert.png");
  CliRun r = run({"--model=bert_tiny", "--devices=4", "--memory_per_device=16GiB",
                  "--profile=h200_cluster", "--batch=16", "--seq=64", "--out=" + plan_path,
                  "--png=" + png});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("memory/device"), std::string::npos);
  EXPECT_NE(r.out.find("<- chosen"), std::string::npos);
  EXPECT_NE(r.out.find("chosen: point"), std::string::npos);
  const PlanFile plan = read_plan(plan_path);
  EXPECT_EQ(plan.model, "bert_tiny");
  EXPECT_EQ(plan.devices, 4);
  EXPECT_EQ(plan.batch, 16);
  EXPECT_EQ(plan.seq, 64);
  EXPECT_LE(plan.predicted_memory, 16.0 * (1 << 30));
  EXPECT_TRUE(file_nonempty(png));
}

TEST(PlanCommand, Resnet18OnFourDevices) {
  const std::string plan_path = temp_path("resnet_plan.json");
  CliRun r = run({"--model=resnet18", "--devices=4", "--profile=h200_cluster", "--batch=32",
                  "--image_size=64", "--optimizer=sgd_momentum", "--out=" + plan_path});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("resnet18"), std::string::npos);
  EXPECT_EQ(read_plan(plan_path).model, "resnet18");
}

// Without --profile the plan is for H200s: the output says so, and names the CPU profile.
TEST(PlanCommand, PointWritesThatFrontierPointInsteadOfTheChosenOne) {
  const std::string chosen_path = temp_path("chosen.json"), first_path = temp_path("first.json");
  const std::vector<std::string> common = {"--model=resnet18",
                                           "--devices=2",
                                           "--batch=8",
                                           "--image_size=64",
                                           "--profile=cpu_2core_example",
                                           "--any_plan",
                                           "--remat=1"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), common.begin(), common.end());
    return run(more);
  };
  CliRun chosen = with({"--out=" + chosen_path});
  ASSERT_EQ(chosen.code, 0) << chosen.err;
  CliRun first = with({"--out=" + first_path, "--point=0"});
  ASSERT_EQ(first.code, 0) << first.err;
  EXPECT_NE(first.out.find("(point 0)"), std::string::npos) << first.out;
  // Point 0 is the frontier's smallest: no more memory than the chosen (fastest) point.
  EXPECT_LE(read_plan(first_path).predicted_memory, read_plan(chosen_path).predicted_memory);
  EXPECT_GE(read_plan(first_path).predicted_time, read_plan(chosen_path).predicted_time);
  CliRun beyond = with({"--out=" + first_path, "--point=1000"});
  EXPECT_EQ(beyond.code, 1);
  EXPECT_NE(beyond.err.find("--point=1000: the frontier has points 0 to"), std::string::npos)
      << beyond.err;
}

TEST(PlanCommand, TheDefaultProfileIsNamedAsSuch) {
  CliRun defaulted = run({"--model=bert_tiny", "--devices=2", "--batch=8", "--seq=32"});
  ASSERT_EQ(defaulted.code, 0) << defaulted.err;
  EXPECT_NE(defaulted.out.find("note: h200_cluster is the default profile"), std::string::npos)
      << defaulted.out;
  EXPECT_NE(defaulted.out.find("--profile=cpu_2core_example"), std::string::npos);
  CliRun chosen =
      run({"--model=bert_tiny", "--devices=2", "--batch=8", "--seq=32", "--profile=h200_cluster"});
  ASSERT_EQ(chosen.code, 0) << chosen.err;
  EXPECT_EQ(chosen.out.find("is the default profile"), std::string::npos) << chosen.out;
}

TEST(PlanCommand, UnknownModelListsTheKnownOnes) {
  CliRun r = run({"--model=resnet19", "--devices=4"});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("unknown model 'resnet19'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("resnet18"), std::string::npos);
  EXPECT_NE(r.err.find("bert_large"), std::string::npos);
  EXPECT_NE(r.err.find("shufflenet_v2_x1_0"), std::string::npos);
}

TEST(PlanCommand, DevicesBelowOneIsAnError) {
  CliRun r = run({"--model=bert_tiny", "--devices=0"});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("--devices must be at least 1"), std::string::npos) << r.err;
}

TEST(PlanCommand, UnparsableMemorySizeIsAnError) {
  CliRun r = run({"--model=bert_tiny", "--memory_per_device=lots"});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("--memory_per_device: cannot read 'lots' as a size"), std::string::npos)
      << r.err;
}

TEST(PlanCommand, ProfileWithMissingFieldsIsAnError) {
  const std::string path = temp_path("partial_profile.json");
  {
    std::ofstream file(path);
    file << R"({"name": "partial", "devices_per_node": 8, "memory_per_device": "80GB",
               "compute_flops": {"gemm": 1e14, "conv": 1e14},
               "memory_bandwidth": 2e12, "collectives": {}})";
  }
  CliRun r = run({"--model=bert_tiny", "--profile=" + path});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("missing field 'compute_flops.elementwise'"), std::string::npos) << r.err;
  CliRun missing = run({"--model=bert_tiny", "--profile=/nonexistent/profile.json"});
  EXPECT_EQ(missing.code, 1);
  EXPECT_NE(missing.err.find("cannot open profile"), std::string::npos) << missing.err;
}

TEST(PlanCommand, NoPlanFittingIsReported) {
  CliRun r = run(
      {"--model=bert_tiny", "--devices=2", "--memory_per_device=1MiB", "--batch=4", "--seq=16"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("no plan fits in 1.00 MiB per device"), std::string::npos) << r.err;
}

TEST(PlanCommand, MissingModelFlagIsAParseError) {
  CliRun r = run({"--devices=4"});
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--model"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace tessel::planner
