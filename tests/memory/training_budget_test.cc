// The train CLI under --memory_budget and --memory_policy: bad budgets and policies are clear
// errors, a budget below the fixed memory says how much is needed, and a recipe trained under a
// fractional budget with dtr gives bitwise the same losses and parameters as without one.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "gtest/gtest.h"
#include "tests/testing.h"
#include "tests/train/train_test_util.h"

namespace tessel::train {
namespace {

namespace fs = std::filesystem;

// A data folder made once per process.
const std::string& data_dir() {
  static const std::string directory = [] {
    const std::string path = ::testing::TempDir() + "/budget_data";
    fs::create_directories(path);
    write_synthetic_fashion_mnist_split(path, "train", 256);
    write_synthetic_fashion_mnist_split(path, "t10k", 40);
    return path;
  }();
  return directory;
}

// ---- bad flags ----

TEST(MemoryBudgetFlag, ZeroIsAnError) {
  CliRun result = run_train_cli({"--memory_budget=0"});
  EXPECT_NE(result.code, 0);
  EXPECT_NE(result.err.find("--memory_budget"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("is zero"), std::string::npos) << result.err;
}

TEST(MemoryBudgetFlag, NegativeIsAnError) {
  CliRun result = run_train_cli({"--memory_budget=-1GiB"});
  EXPECT_NE(result.code, 0);
  EXPECT_NE(result.err.find("is negative"), std::string::npos) << result.err;
}

TEST(MemoryBudgetFlag, UnparsableTextIsAnErrorListingTheForms) {
  CliRun lots = run_train_cli({"--memory_budget=lots"});
  EXPECT_NE(lots.code, 0);
  EXPECT_NE(lots.err.find("cannot read 'lots'"), std::string::npos) << lots.err;
  EXPECT_NE(lots.err.find("1.5GiB"), std::string::npos) << lots.err;
  CliRun unit = run_train_cli({"--memory_budget=3parsecs"});
  EXPECT_NE(unit.err.find("unknown unit 'parsecs'"), std::string::npos) << unit.err;
  CliRun too_big = run_train_cli({"--memory_budget=1.5"});
  EXPECT_NE(too_big.err.find("fraction"), std::string::npos) << too_big.err;
}

TEST(MemoryPolicyFlag, UnknownPolicyListsTheKnownOnes) {
  CliRun result = run_train_cli({"--memory_policy=lru"});
  EXPECT_NE(result.code, 0);
  EXPECT_NE(result.err.find("unknown memory policy 'lru' (expected one of: none, dtr, swap, "
                            "split, auto)"),
            std::string::npos)
      << result.err;
}

TEST(MemoryBudgetFlag, HelpDescribesBothFlags) {
  CliRun result = run_train_cli({"--help"});
  EXPECT_EQ(result.code, 0);
  EXPECT_NE(result.out.find("--memory_budget"), std::string::npos);
  EXPECT_NE(result.out.find("--memory_policy"), std::string::npos);
}

// ---- budgets the model cannot train in ----

TEST(MemoryBudget, BelowTheFixedMemorySaysHowMuchIsNeeded) {
  CliRun result = run_train_cli({"--recipe=mlp_fashion_mnist", "--data=" + data_dir(), "--steps=1",
                                 "--threads=1", "--memory_budget=256KiB", "--memory_policy=dtr"});
  EXPECT_EQ(result.code, 1);
  // 784*256 + 256*128 + 128*10 weights and biases, with gradients and Adam's two moments.
  EXPECT_NE(result.err.find("--memory_budget=256KiB: 256.00 KiB is below the fixed memory of"),
            std::string::npos)
      << result.err;
  EXPECT_NE(result.err.find("this model needs a budget of at least"), std::string::npos)
      << result.err;
}

// A fraction is a share of the activation memory above the fixed memory, so the budget always
// leaves the fixed memory its room (0.05 of this model's whole peak would lie below it: Adam's
// moments dwarf a batch of 16): the first step measures the peak and the log gives the budget.
// Candidates are tensors of at least 1% of the mean size, so even this small model's tensors can
// move: auto trains at 0.05 by swapping, while dtr, which cannot move tensors without an op record
// (parameters, optimizer state), stops with a report that gives the least budget the op needs.
TEST(MemoryBudget, AFractionKeepsThatShareOfTheActivationMemory) {
  const std::vector<std::string> tight = {"--recipe=mlp_fashion_mnist",
                                          "--data=" + data_dir(),
                                          "--steps=2",
                                          "--threads=1",
                                          "--batch_size=16",
                                          "--log_every=1",
                                          "--memory_budget=0.05"};
  CliRun automatic = run_train_cli(tight);
  EXPECT_NE(automatic.out.find("memory: budget 0.05 of the activation memory"), std::string::npos)
      << automatic.out;
  EXPECT_NE(automatic.out.find("budget 0.05 of the activation memory above the fixed"),
            std::string::npos)
      << automatic.out;
  EXPECT_EQ(automatic.code, 0) << automatic.err;
  const size_t second_step = automatic.out.find("train step      2");
  ASSERT_NE(second_step, std::string::npos) << automatic.out;
  EXPECT_EQ(automatic.out.find(" 0 swaps out", second_step), std::string::npos) << automatic.out;

  std::vector<std::string> dtr_args = tight;
  dtr_args.push_back("--memory_policy=dtr");
  CliRun dtr = run_train_cli(dtr_args);
  EXPECT_EQ(dtr.code, 1);
  EXPECT_NE(dtr.err.find("least budget for this op under dtr: "), std::string::npos) << dtr.err;
  EXPECT_EQ(dtr.err.find("options: a memory policy"), std::string::npos) << dtr.err;
}

// ---- training under a budget ----

struct TrainingRun {
  CliRun cli;
  std::vector<std::string> losses;      // as written in the metrics, exactly
  std::map<std::string, Tensor> state;  // parameters and buffers, as checkpointed after step 3
  std::vector<nlohmann::json> train_records;
};

TrainingRun train_shufflenet(const std::string& name, std::vector<std::string> extra) {
  const std::string directory = ::testing::TempDir() + "/" + name;
  fs::remove_all(directory);
  fs::create_directories(directory);
  std::vector<std::string> args = {"--recipe=shufflenet_v2_fashion_mnist",
                                   "--model=shufflenet_v2_x0_5",
                                   "--data=" + data_dir(),
                                   "--batch_size=64",
                                   "--steps=3",
                                   "--log_every=1",
                                   "--threads=1",
                                   "--metrics=" + directory + "/metrics.jsonl",
                                   "--checkpoint_dir=" + directory + "/checkpoints"};
  args.insert(args.end(), extra.begin(), extra.end());
  TrainingRun result{run_train_cli(args), {}, {}, {}};
  std::ifstream metrics(directory + "/metrics.jsonl");
  std::string line;
  while (std::getline(metrics, line)) {
    const auto record = nlohmann::json::parse(line);
    if (record.at("event") != "train") continue;
    result.losses.push_back(record.at("loss").dump());
    result.train_records.push_back(record);
  }
  result.state = load_safetensors(directory + "/checkpoints/step_3/model.safetensors");
  return result;
}

TEST(MemoryBudget, DtrUnderHalfTheActivationMemoryTrainsBitwiseLikeWithoutABudget) {
  const TrainingRun reference = train_shufflenet("unbudgeted", {});
  ASSERT_EQ(reference.cli.code, 0) << reference.cli.err;
  const TrainingRun budgeted =
      train_shufflenet("budgeted", {"--memory_budget=0.5", "--memory_policy=dtr"});
  ASSERT_EQ(budgeted.cli.code, 0) << budgeted.cli.err << budgeted.cli.out;

  EXPECT_NE(budgeted.cli.out.find("the first step runs without a budget to measure the peak"),
            std::string::npos)
      << budgeted.cli.out;
  EXPECT_NE(budgeted.cli.out.find("memory: the first step peaked at"), std::string::npos)
      << budgeted.cli.out;
  EXPECT_NE(budgeted.cli.out.find("| per step: "), std::string::npos) << budgeted.cli.out;

  ASSERT_EQ(reference.losses.size(), 3u);
  EXPECT_EQ(budgeted.losses, reference.losses);
  ASSERT_FALSE(reference.state.empty());
  ASSERT_EQ(budgeted.state.size(), reference.state.size());
  for (const auto& [name, tensor] : reference.state) {
    ASSERT_TRUE(budgeted.state.count(name)) << name;
    EXPECT_TRUE(testing::bitwise_equal(budgeted.state.at(name), tensor)) << name;
  }

  // Steps 2 and 3 ran within the budget, evicting and recomputing.
  ASSERT_EQ(budgeted.train_records.size(), 3u);
  int64_t recomputes = 0;
  for (size_t i = 1; i < budgeted.train_records.size(); ++i) {
    const auto& record = budgeted.train_records[i];
    EXPECT_EQ(record.at("memory_policy"), "dtr");
    EXPECT_LE(record.at("peak_memory_bytes").get<int64_t>(),
              record.at("memory_budget_bytes").get<int64_t>());
    recomputes += record.at("recomputes_per_step").get<int64_t>();
    EXPECT_GT(record.at("evictions_per_step").get<int64_t>(), 0);
  }
  EXPECT_GT(recomputes, 0);
}

}  // namespace
}  // namespace tessel::train
