// `train --device=cuda` against `--device=cpu`: the same recipes, seeds and data give the same
// per-step losses and evaluations within a loose tolerance (cuBLAS and cuDNN sum in other orders
// than the CPU kernels), and checkpoints saved from GPU tensors resume on the GPU and on the CPU.
// A gpu test (tools/cuda.bzl): needs --config=cuda, and skips when no GPU is visible.
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "cuda/runtime.h"
#include "gtest/gtest.h"
#include "ops/ops.h"
#include "tests/gpu_skip.h"
#include "tests/testing.h"
#include "tests/train/train_test_util.h"

namespace tessel::train {
namespace {

namespace fs = std::filesystem;
using testing::all_close;

// Whole training runs on two devices: looser than the closeness rule's rtol 1e-4 for one model
// step, since differences grow over the steps.
constexpr double kRtol = 1e-3;
constexpr double kAtol = 1e-5;

std::string fresh_dir(const std::string& name) {
  const fs::path path = fs::path(::testing::TempDir()) / "recipes_gpu" / name;
  fs::remove_all(path);
  fs::create_directories(path);
  return path.string();
}

// A fortune file of `count` short entries between "%" lines.
std::string fortunes_file(const std::string& directory, int count = 60) {
  const char* subjects[] = {"the cat", "a dog", "my friend", "the old man", "every student"};
  const char* verbs[] = {"sees", "likes", "finds", "follows"};
  const char* objects[] = {"the moon", "a red apple", "the long road", "warm bread", "the sea"};
  std::ostringstream text;
  for (int i = 0; i < count; ++i)
    text << subjects[i % 5] << " " << verbs[i % 4] << " " << objects[i % 5] << ".\n"
         << subjects[(i + 2) % 5] << " " << verbs[(i + 1) % 4] << " " << objects[(i + 3) % 5]
         << " again.\n%\n";
  const std::string path = directory + "/fortunes";
  std::ofstream(path) << text.str();
  return path;
}

// What a run's --metrics file says: the loss of every step and the last evaluation.
struct RunRecord {
  std::vector<double> losses;
  std::map<std::string, double> eval;
  int64_t evictions_and_swaps = 0;  // under a memory budget, summed over the status lines
};

RunRecord train(std::vector<std::string> args, const std::string& device,
                const std::string& metrics_path) {
  args.push_back("--device=" + device);
  args.push_back("--metrics=" + metrics_path);
  args.push_back("--log_every=1");
  const CliRun result = run_train_cli(args);
  EXPECT_EQ(result.code, 0) << device << ": " << result.err;
  EXPECT_NE(result.out.find(", device " + std::string(device == "cuda" ? "cuda:0" : device)),
            std::string::npos)
      << result.out;
  RunRecord record;
  std::ifstream metrics(metrics_path);
  for (std::string line; std::getline(metrics, line);) {
    const auto json = nlohmann::json::parse(line);
    if (json.at("event") == "train") {
      record.losses.push_back(json.at("loss").get<double>());
      record.evictions_and_swaps += json.value("evictions_per_step", int64_t{0}) +
                                    json.value("swaps_out_per_step", int64_t{0});
    }
    if (json.at("event") == "eval") {
      record.eval.clear();
      for (const auto& [key, value] : json.items())
        if (value.is_number_float()) record.eval[key] = value.get<double>();
    }
  }
  return record;
}

Tensor as_tensor(const std::vector<double>& values) {
  return from_vector<double>(values, {static_cast<int64_t>(values.size())});
}

// Trains `args` on cuda and on cpu, then compares the losses step by step and the evaluation.
void expect_same_training(const std::vector<std::string>& args, const std::string& name,
                          size_t steps) {
  const std::string directory = fresh_dir(name + "_metrics");
  const RunRecord gpu = train(args, "cuda", directory + "/cuda.jsonl");
  const RunRecord cpu = train(args, "cpu", directory + "/cpu.jsonl");
  ASSERT_EQ(cpu.losses.size(), steps);
  ASSERT_EQ(gpu.losses.size(), steps);
  EXPECT_TRUE(all_close(as_tensor(gpu.losses), as_tensor(cpu.losses), kRtol, kAtol)) << name;
  for (const auto& [key, value] : cpu.eval) {
    // Accuracies count discrete guesses; "..._s" are timings.
    const bool timing = key.size() > 2 && key.compare(key.size() - 2, 2, "_s") == 0;
    if (timing || key.find("accuracy") != std::string::npos) continue;
    ASSERT_TRUE(gpu.eval.count(key)) << key;
    EXPECT_TRUE(all_close(as_tensor({gpu.eval.at(key)}), as_tensor({value}), kRtol, kAtol))
        << name << " " << key << ": cuda " << gpu.eval.at(key) << ", cpu " << value;
  }
}

std::vector<std::string> mlp_args(const std::string& data) {
  return {"--recipe=mlp_fashion_mnist",
          "--data=" + data,
          "--batch_size=32",
          "--steps=6",
          "--seed=5",
          "--threads=1"};
}

TEST(RecipesOnCuda, MlpLossesMatchCpu) {
  TESSEL_SKIP_IF_NO_GPU();
  const std::string data = fresh_dir("mlp_data");
  write_synthetic_fashion_mnist_split(data, "train", 320);
  write_synthetic_fashion_mnist_split(data, "t10k", 100);
  expect_same_training(mlp_args(data), "mlp", 6);
}

TEST(RecipesOnCuda, ResNetWithAugmentationLossesMatchCpu) {
  TESSEL_SKIP_IF_NO_GPU();
  const std::string data = fresh_dir("resnet_data");
  write_synthetic_fashion_mnist_split(data, "train", 96);
  write_synthetic_fashion_mnist_split(data, "t10k", 32);
  // Random crops and flips are drawn on the CPU, so both devices see the same batches.
  expect_same_training({"--recipe=resnet18_fashion_mnist", "--data=" + data, "--batch_size=16",
                        "--steps=4", "--seed=2", "--threads=1"},
                       "resnet18", 4);
}

TEST(RecipesOnCuda, BertTinyLossesMatchCpu) {
  TESSEL_SKIP_IF_NO_GPU();
  const std::string data = fresh_dir("bert_data");
  const std::string work = fresh_dir("bert_work");
  // Dropout draws the same Philox numbers on both devices.
  expect_same_training(
      {"--recipe=bert_mlm_fortunes", "--model=bert_tiny", "--data=" + fortunes_file(data),
       "--work_dir=" + work, "--batch_size=8", "--steps=4", "--seed=1", "--threads=1"},
      "bert_tiny", 4);
}

// --memory_budget on the GPU: half of the measured activation memory under auto (evictions and
// swaps over pinned host memory) trains like the CPU run without a budget.
TEST(RecipesOnCuda, ResNetUnderAHalfBudgetOnTheGpuLossesMatchCpu) {
  TESSEL_SKIP_IF_NO_GPU();
  const std::string data = fresh_dir("budget_data");
  write_synthetic_fashion_mnist_split(data, "train", 128);
  write_synthetic_fashion_mnist_split(data, "t10k", 32);
  const std::vector<std::string> args = {"--recipe=resnet18_fashion_mnist",
                                         "--data=" + data,
                                         "--batch_size=32",
                                         "--steps=4",
                                         "--seed=3",
                                         "--threads=1"};
  const std::string directory = fresh_dir("budget_metrics");
  std::vector<std::string> budgeted = args;
  budgeted.push_back("--memory_budget=0.5");
  const RunRecord gpu = train(budgeted, "cuda", directory + "/cuda.jsonl");
  const RunRecord cpu = train(args, "cpu", directory + "/cpu.jsonl");
  ASSERT_EQ(gpu.losses.size(), 4u);
  EXPECT_TRUE(all_close(as_tensor(gpu.losses), as_tensor(cpu.losses), kRtol, kAtol));
  EXPECT_GT(gpu.evictions_and_swaps, 0) << "the budget never pressed";
}

// Checkpoints written from GPU tensors hold the values training reached, and load back into GPU
// tensors (or CPU ones): resuming at step 3 ends where the uninterrupted GPU run ended.
TEST(RecipesOnCuda, CheckpointsSaveFromAndResumeOntoTheGpu) {
  TESSEL_SKIP_IF_NO_GPU();
  const std::string data = fresh_dir("checkpoint_data");
  write_synthetic_fashion_mnist_split(data, "train", 320);
  write_synthetic_fashion_mnist_split(data, "t10k", 100);
  const std::string whole = fresh_dir("checkpoint_whole");
  std::vector<std::string> args = mlp_args(data);
  args.push_back("--checkpoint_every=3");
  std::vector<std::string> first = args;
  first.push_back("--checkpoint_dir=" + whole);
  train(first, "cuda", whole + "/metrics.jsonl");
  ASSERT_TRUE(fs::exists(whole + "/step_3/model.safetensors"));
  ASSERT_TRUE(fs::exists(whole + "/step_6/model.safetensors"));
  const auto expected = load_safetensors(whole + "/step_6/model.safetensors");

  for (const std::string device : {"cuda", "cpu"}) {
    const std::string resumed = fresh_dir("checkpoint_resumed_" + device);
    std::vector<std::string> again = args;
    again.push_back("--checkpoint_dir=" + resumed);
    again.push_back("--resume=" + whole + "/step_3");
    train(again, device, resumed + "/metrics.jsonl");
    const auto actual = load_safetensors(resumed + "/step_6/model.safetensors");
    ASSERT_EQ(actual.size(), expected.size());
    for (const auto& [name, tensor] : expected) {
      ASSERT_TRUE(actual.count(name)) << name;
      EXPECT_TRUE(all_close(actual.at(name), tensor, kRtol, kAtol)) << device << ": " << name;
    }
  }
}

// The CUDA build on a machine without a GPU: one clear line before any data is read.
TEST(RecipesOnCuda, WithoutAGpuTheRunStopsBeforeTraining) {
  if (cuda::device_count() > 0) GTEST_SKIP() << "a GPU is here: the run would train";
  const std::string data = fresh_dir("no_gpu_data");
  write_synthetic_fashion_mnist_split(data, "train", 64);
  write_synthetic_fashion_mnist_split(data, "t10k", 20);
  std::vector<std::string> args = mlp_args(data);
  args.push_back("--device=cuda");
  const CliRun result = run_train_cli(args);
  EXPECT_EQ(result.code, 1);
  EXPECT_EQ(result.err.rfind("train: error: --device=cuda: ", 0), 0u) << result.err;
  EXPECT_NE(result.err.find("device_count() == 0"), std::string::npos) << result.err;
  EXPECT_EQ(result.out.find("data: "), std::string::npos) << result.out;
}

}  // namespace
}  // namespace tessel::train
