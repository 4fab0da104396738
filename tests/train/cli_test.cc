#include "train/cli.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "gtest/gtest.h"
#include "ops/transfer.h"
#include "tests/testing.h"
#include "tests/train/train_test_util.h"
#include "train/recipes/recipe.h"

namespace tessel::train {
namespace {

using testing::throws_error;

TrainConfig parse(std::vector<std::string> args) {
  args.insert(args.begin(), "train");
  std::vector<const char*> argv;
  for (const auto& arg : args) argv.push_back(arg.c_str());
  std::ostringstream out, err;
  TrainConfig config;
  EXPECT_EQ(parse_train_flags(static_cast<int>(argv.size()), argv.data(), &config, out, err), -1)
      << err.str();
  return config;
}

TEST(TrainCli, HelpListsEveryFlagAndTheRecipes) {
  CliRun result = run_train_cli({"--help"});
  EXPECT_EQ(result.code, 0);
  for (const char* flag :
       {"--recipe", "--model", "--data", "--batch_size", "--lr", "--epochs", "--steps", "--seed",
        "--threads", "--eval_every", "--log_every", "--metrics", "--checkpoint_dir",
        "--checkpoint_every", "--resume", "--work_dir", "--device", "--optimizer", "--dropout"})
    EXPECT_NE(result.out.find(flag), std::string::npos) << flag;
  for (const char* recipe :
       {"resnet18_fashion_mnist", "shufflenet_v2_fashion_mnist", "bert_mlm_fortunes",
        "resnet_cifar10", "shufflenet_v2_cifar10", "resnet_imagenet_style", "mlp_fashion_mnist"})
    EXPECT_NE(result.out.find(recipe), std::string::npos) << recipe;
}

TEST(TrainCli, FlagsFillTheConfigAndUnsetOnesStayUnset) {
  TrainConfig config = parse({"--lr=0.01", "--epochs", "2", "--steps=50", "--seed=7", "--threads=2",
                              "--eval_every=10", "--metrics=m.jsonl"});
  EXPECT_EQ(config.recipe, "resnet18_fashion_mnist");
  EXPECT_EQ(config.lr, 0.01);
  EXPECT_EQ(config.epochs, 2);
  EXPECT_EQ(config.steps, 50);
  EXPECT_EQ(config.seed, 7u);
  EXPECT_EQ(config.threads, 2);
  EXPECT_EQ(config.eval_every, 10);
  EXPECT_EQ(config.metrics_path, "m.jsonl");
  EXPECT_FALSE(config.batch_size.has_value());
  EXPECT_FALSE(config.model.has_value());
  EXPECT_FALSE(config.resume.has_value());

  TrainConfig resolved = resolve_config(find_recipe("mlp_fashion_mnist"), config);
  EXPECT_EQ(*resolved.batch_size, 128);
  EXPECT_EQ(*resolved.model, "mlp");
  EXPECT_EQ(*resolved.lr, 0.01);
}

TEST(TrainCli, PrecisionIsF32UnlessBf16IsAskedFor) {
  EXPECT_EQ(parse({}).precision, "f32");
  EXPECT_EQ(parse({"--precision=bf16"}).precision, "bf16");
  CliRun result = run_train_cli({"--precision=f16"});
  EXPECT_NE(result.code, 0);
  EXPECT_NE(result.err.find("--precision"), std::string::npos) << result.err;
}

TEST(TrainCli, DeviceIsCpuUnlessCudaIsAskedFor) {
  EXPECT_EQ(parse({}).device, "cpu");
  EXPECT_EQ(parse({"--device=cpu"}).device, "cpu");
  EXPECT_EQ(parse({"--device=cuda"}).device, "cuda");
  EXPECT_EQ(parse({"--device", "cuda:1"}).device, "cuda:1");
  TrainConfig config = parse({"--recipe=mlp_fashion_mnist", "--device=cuda:1"});
  EXPECT_EQ(resolve_config(find_recipe("mlp_fashion_mnist"), config).device, "cuda:1");
}

TEST(TrainCli, BadDeviceTextIsAClearError) {
  for (const char* text : {"gpu", "cuda:", "cuda:x", "cuda:-1", "cuda1", "CPU"}) {
    CliRun result = run_train_cli({std::string("--device=") + text});
    EXPECT_NE(result.code, 0) << text;
    EXPECT_NE(result.err.find("--device: unknown device '" + std::string(text) +
                              "' (expected cpu, cuda or cuda:N)"),
              std::string::npos)
        << text << ": " << result.err;
    EXPECT_EQ(result.out.find("train step"), std::string::npos) << result.out;
  }
  // The library checks the same text when the config does not come from the command line.
  TrainConfig config;
  config.device = "tpu";
  EXPECT_TRUE(throws_error([&] { resolve_config(find_recipe("mlp_fashion_mnist"), config); },
                           "--device: unknown device 'tpu' (expected cpu, cuda or cuda:N)"));
}

TEST(TrainCli, MetaDeviceIsRefused) {
  CliRun result = run_train_cli({"--device=meta"});
  EXPECT_NE(result.code, 0);
  EXPECT_NE(result.err.find("--device: the meta device holds shapes only and cannot train"),
            std::string::npos)
      << result.err;
  TrainConfig config;
  config.device = "meta";
  EXPECT_TRUE(throws_error([&] { resolve_config(find_recipe("mlp_fashion_mnist"), config); },
                           "--device: the meta device holds shapes only"));
}

// --optimizer takes one of the optimizers the recipe offers; the first is its default.
TEST(TrainCli, OptimizerIsOneTheRecipeOffers) {
  TrainConfig config;
  EXPECT_EQ(*resolve_config(find_recipe("mlp_fashion_mnist"), config).optimizer, "adam");
  EXPECT_EQ(*resolve_config(find_recipe("bert_mlm_fortunes"), config).optimizer, "adamw");
  config.optimizer = "sgd";
  EXPECT_EQ(*resolve_config(find_recipe("mlp_fashion_mnist"), config).optimizer, "sgd");
  config.optimizer = "adam";
  EXPECT_TRUE(throws_error([&] { resolve_config(find_recipe("resnet18_fashion_mnist"), config); },
                           "--optimizer=adam is not offered (this recipe trains with: sgd)"));
}

// The budget applies to the device the model trains on (tests/train:recipes_gpu_test runs it).
TEST(TrainCli, MemoryBudgetAndPolicyAreAcceptedWithAGpuDevice) {
  TrainConfig config;
  config.device = "cuda:1";
  config.memory_budget = "1GiB";
  config.memory_policy = "dtr";
  EXPECT_EQ(resolve_config(find_recipe("mlp_fashion_mnist"), config).device, "cuda:1");
}

// Without a usable GPU (this build has no CUDA backend linked, or the machine has no GPU) the run
// stops with one clear line before reading data or training a step.
TEST(TrainCli, CudaWithoutAUsableGpuFailsBeforeTraining) {
  const std::string directory = ::testing::TempDir() + "/no_gpu";
  ASSERT_EQ(system(("mkdir -p " + directory).c_str()), 0);
  write_synthetic_fashion_mnist_split(directory, "train", 64);
  write_synthetic_fashion_mnist_split(directory, "t10k", 20);
  for (const char* device : {"cuda", "cuda:3"}) {
    CliRun result =
        run_train_cli({"--recipe=mlp_fashion_mnist", "--data=" + directory, "--steps=2",
                       "--batch_size=16", "--threads=1", std::string("--device=") + device});
    // Training is right only where this binary has the CUDA backend and the machine a GPU;
    // anywhere else a success is a failure of this test.
    if (result.code == 0) {
      ASSERT_TRUE(cuda_transfers_built())
          << "a binary built without CUDA trained on " << device << ": " << result.out;
      ASSERT_TRUE(std::filesystem::exists("/dev/nvidiactl"))
          << "trained on " << device << " on a machine without an NVIDIA device node";
      GTEST_SKIP() << "this binary trains on " << device << ": a GPU is here";
    }
    EXPECT_EQ(result.code, 1) << result.err;
    EXPECT_EQ(result.err.rfind("train: error: --device=" + std::string(device) + ": ", 0), 0u)
        << result.err;
    if (!cuda_transfers_built()) {
      EXPECT_NE(result.err.find("built without CUDA (rebuild with --config=cuda"),
                std::string::npos)
          << result.err;
    }
    EXPECT_EQ(result.out.find("data: "), std::string::npos) << result.out;
    EXPECT_EQ(result.out.find("train step"), std::string::npos) << result.out;
  }
}

// Per-step training losses from a --metrics file.
std::vector<double> train_losses(const std::string& metrics_path) {
  std::ifstream metrics(metrics_path);
  std::vector<double> losses;
  for (std::string line; std::getline(metrics, line);) {
    const auto record = nlohmann::json::parse(line);
    if (record.at("event") == "train") losses.push_back(record.at("loss").get<double>());
  }
  return losses;
}

TEST(TrainCli, ExplicitCpuDeviceTrainsExactlyLikeTheDefault) {
  const std::string directory = ::testing::TempDir() + "/explicit_cpu";
  ASSERT_EQ(system(("mkdir -p " + directory).c_str()), 0);
  write_synthetic_fashion_mnist_split(directory, "train", 160);
  write_synthetic_fashion_mnist_split(directory, "t10k", 40);
  std::vector<double> losses[2];
  std::string accuracy[2];
  const std::vector<std::string> device_flags[2] = {{}, {"--device=cpu"}};
  for (int k = 0; k < 2; ++k) {
    const std::string metrics = directory + "/metrics_" + std::to_string(k) + ".jsonl";
    std::vector<std::string> args = {"--recipe=mlp_fashion_mnist",
                                     "--data=" + directory,
                                     "--steps=6",
                                     "--batch_size=16",
                                     "--log_every=1",
                                     "--threads=1",
                                     "--seed=3",
                                     "--metrics=" + metrics};
    args.insert(args.end(), device_flags[k].begin(), device_flags[k].end());
    CliRun result = run_train_cli(args);
    ASSERT_EQ(result.code, 0) << result.err;
    EXPECT_NE(result.out.find(", device cpu\n"), std::string::npos) << result.out;
    losses[k] = train_losses(metrics);
    const size_t final_line = result.out.find("test accuracy: ");
    ASSERT_NE(final_line, std::string::npos) << result.out;
    accuracy[k] = result.out.substr(final_line, result.out.find('\n', final_line) - final_line);
  }
  ASSERT_EQ(losses[0].size(), 6u);
  EXPECT_EQ(losses[1], losses[0]);  // bit for bit: the same code on the same device
  EXPECT_EQ(accuracy[1], accuracy[0]);
}

TEST(TrainCli, UnknownFlagFails) {
  CliRun result = run_train_cli({"--bogus=1"});
  EXPECT_NE(result.code, 0);
  EXPECT_NE(result.err.find("--bogus"), std::string::npos) << result.err;
  EXPECT_NE(run_train_cli({"stray"}).code, 0);
}

TEST(TrainCli, BadValuesFailWithTheFlagName) {
  for (const auto& [flag, fragment] : std::vector<std::pair<std::string, std::string>>{
           {"--lr=abc", "--lr: expected a number, got 'abc'"},
           {"--lr=0", "--lr: must be positive, got 0"},
           {"--lr=nan", "--lr: expected a number, got 'nan'"},
           {"--lr=inf", "--lr: expected a number, got 'inf'"},
           {"--batch_size=0", "--batch_size: must be positive"},
           {"--batch_size=1.5", "--batch_size: expected an integer"},
           {"--epochs=-1", "--epochs: must be positive"},
           {"--steps=-3", "--steps: must be non-negative"},
           {"--threads=x", "--threads: expected an integer"},
       }) {
    CliRun result = run_train_cli({flag});
    EXPECT_NE(result.code, 0) << flag;
    EXPECT_NE(result.err.find(fragment), std::string::npos) << flag << ": " << result.err;
  }
}

TEST(TrainCli, DropoutIsAProbabilityBelowOne) {
  EXPECT_FALSE(parse({}).dropout.has_value());
  EXPECT_EQ(parse({"--dropout=0"}).dropout, 0.0);
  EXPECT_EQ(parse({"--dropout=0.25"}).dropout, 0.25);
  CliRun not_a_number = run_train_cli({"--dropout=half"});
  EXPECT_NE(not_a_number.code, 0);
  EXPECT_NE(not_a_number.err.find("--dropout: expected a number, got 'half'"), std::string::npos)
      << not_a_number.err;
  CliRun out_of_range = run_train_cli({"--dropout=1"});
  EXPECT_NE(out_of_range.code, 0);
  EXPECT_NE(out_of_range.err.find("--dropout: must be in [0, 1), got 1"), std::string::npos)
      << out_of_range.err;
}

TEST(TrainCli, DropoutForARecipeWithoutDropoutIsAClearError) {
  CliRun result = run_train_cli({"--recipe=mlp_fashion_mnist", "--dropout=0"});
  EXPECT_EQ(result.code, 1);
  EXPECT_NE(result.err.find("--dropout: recipe mlp_fashion_mnist trains a model without dropout"),
            std::string::npos)
      << result.err;
}

TEST(TrainCli, UnknownRecipeListsTheKnownOnes) {
  CliRun result = run_train_cli({"--recipe=vgg16_imagenet"});
  EXPECT_EQ(result.code, 1);
  EXPECT_NE(result.err.find("unknown recipe 'vgg16_imagenet' (known recipes: "
                            "resnet18_fashion_mnist, shufflenet_v2_fashion_mnist, "
                            "bert_mlm_fortunes, resnet_cifar10, shufflenet_v2_cifar10, "
                            "resnet_imagenet_style, mlp_fashion_mnist)"),
            std::string::npos)
      << result.err;
}

TEST(TrainCli, UnknownModelListsTheRecipesModels) {
  CliRun mlp = run_train_cli({"--recipe=mlp_fashion_mnist", "--model=transformer"});
  EXPECT_EQ(mlp.code, 1);
  EXPECT_NE(mlp.err.find("unknown model 'transformer' (this recipe trains: mlp)"),
            std::string::npos)
      << mlp.err;
  CliRun resnet = run_train_cli({"--model=resnet19"});
  EXPECT_EQ(resnet.code, 1);
  EXPECT_NE(resnet.err.find("unknown model 'resnet19' (this recipe trains: resnet18, resnet34, "
                            "resnet50, resnet101, resnet152)"),
            std::string::npos)
      << resnet.err;
  CliRun bert = run_train_cli({"--recipe=bert_mlm_fortunes", "--model=bert_huge"});
  EXPECT_NE(bert.err.find("(this recipe trains: bert_tiny, bert_mini, bert_small, bert_base, "
                          "bert_large)"),
            std::string::npos)
      << bert.err;
}

TEST(TrainCli, ResumeTakesAnOptionalPath) {
  TrainConfig bare = parse({"--checkpoint_dir=ckpt", "--resume"});
  ASSERT_TRUE(bare.resume.has_value());
  EXPECT_EQ(*bare.resume, "");
  EXPECT_EQ(bare.checkpoint_dir, "ckpt");
  TrainConfig with_path = parse({"--resume=ckpt/step_40", "--checkpoint_every=20"});
  ASSERT_TRUE(with_path.resume.has_value());
  EXPECT_EQ(*with_path.resume, "ckpt/step_40");
  EXPECT_EQ(with_path.checkpoint_every, 20);
  TrainConfig work = parse({"--work_dir=/tmp/work"});
  EXPECT_EQ(work.work_dir, "/tmp/work");
}

TEST(TrainCli, MissingDataIsAClearError) {
  CliRun result = run_train_cli({"--data=/nonexistent/fashion"});
  EXPECT_EQ(result.code, 1);
  EXPECT_NE(result.err.find("/nonexistent/fashion/train-images-idx3-ubyte.gz"), std::string::npos)
      << result.err;
}

TEST(TrainCli, TrainsEndToEndAndWritesMetrics) {
  const std::string directory = ::testing::TempDir();
  write_synthetic_fashion_mnist_split(directory, "train", 320);
  write_synthetic_fashion_mnist_split(directory, "t10k", 100);
  const std::string metrics_path = directory + "/metrics.jsonl";
  CliRun result = run_train_cli({"--recipe=mlp_fashion_mnist", "--data=" + directory, "--epochs=2",
                                 "--batch_size=32", "--log_every=5", "--eval_every=15",
                                 "--threads=1", "--metrics=" + metrics_path});
  ASSERT_EQ(result.code, 0) << result.err;
  EXPECT_NE(result.out.find("train step      5 | epoch 1/2"), std::string::npos) << result.out;
  EXPECT_NE(result.out.find("samples/s | "), std::string::npos);
  EXPECT_NE(result.out.find("ms/step | memory "), std::string::npos);
  EXPECT_NE(result.out.find(", of which data sets "), std::string::npos) << result.out;
  const size_t final_line = result.out.find("test accuracy: ");
  ASSERT_NE(final_line, std::string::npos) << result.out;
  const double accuracy = std::stod(result.out.substr(final_line + 15, 6));
  EXPECT_GT(accuracy, 0.9);  // the classes are trivially separable

  std::ifstream metrics(metrics_path);
  std::string line;
  int train_lines = 0, eval_lines = 0, final_lines = 0;
  while (std::getline(metrics, line)) {
    const auto record = nlohmann::json::parse(line);
    const std::string event = record.at("event");
    train_lines += event == "train";
    eval_lines += event == "eval";
    if (event == "final") {
      ++final_lines;
      EXPECT_EQ(record.at("steps"), 20);
      EXPECT_EQ(record.at("epochs_completed"), 2);
      EXPECT_DOUBLE_EQ(record.at("test_accuracy").get<double>(), accuracy);
    }
    if (event == "train") {
      EXPECT_GT(record.at("peak_memory_bytes").get<int64_t>(), 0);
      // The data sets held as tensors: 420 images of 28x28 f32 and their int64 labels.
      EXPECT_EQ(record.at("data_bytes").get<int64_t>(), 420 * (28 * 28 * 4 + 8));
    }
  }
  EXPECT_EQ(train_lines, 4);  // steps 5, 10, 15, 20
  EXPECT_EQ(eval_lines, 3);   // step 15, end of epoch 1 (10), end of epoch 2 (20)
  EXPECT_EQ(final_lines, 1);
}

TEST(TrainCli, StepsLimitStopsMidEpoch) {
  const std::string directory = ::testing::TempDir() + "/steps";
  ASSERT_EQ(system(("mkdir -p " + directory).c_str()), 0);
  write_synthetic_fashion_mnist_split(directory, "train", 320);
  write_synthetic_fashion_mnist_split(directory, "t10k", 50);
  CliRun result = run_train_cli({"--recipe=mlp_fashion_mnist", "--data=" + directory, "--steps=3",
                                 "--batch_size=16", "--threads=1"});
  ASSERT_EQ(result.code, 0) << result.err;
  EXPECT_NE(result.out.find("train step      3 | epoch 1/3"), std::string::npos) << result.out;
  EXPECT_NE(result.out.find("eval  step      3"), std::string::npos) << result.out;
  EXPECT_NE(result.out.find("test accuracy: "), std::string::npos);
}

}  // namespace
}  // namespace tessel::train
