// The train recipes under mpirun -np 2: --dp=2 trains the parameters one process trains (the
// closeness rule for whole f32 models), --tp=2 on ResNet gives the losses of --dp=2 (both split
// the batch in two for batch norm), and a grid that does not match the ranks is a clear error.
#include <mpi.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/safetensors.h"
#include "gtest/gtest.h"
#include "ops/ops.h"
#include "tests/parallel/mpi_testing.h"
#include "tests/testing.h"
#include "train/recipes/distributed.h"
#include "train/recipes/recipe.h"

namespace tessel::train {
namespace {

namespace fs = std::filesystem;
using parallel::testing::MpiTest;
using tessel::testing::all_close;
using tessel::testing::throws_error;

class DistributedRecipe : public MpiTest {
 protected:
  // A small Fashion-MNIST-shaped data set (IDX files) shared by the ranks, and an empty folder.
  static std::string folder(const std::string& name) {
    const char* base = std::getenv("TEST_TMPDIR");
    const fs::path path = fs::path(base ? base : "/tmp") / "distributed_recipe_test" / name;
    return path.string();
  }

  static void write_be32(std::ofstream& out, uint32_t value) {
    const unsigned char bytes[4] = {
        static_cast<unsigned char>(value >> 24), static_cast<unsigned char>(value >> 16),
        static_cast<unsigned char>(value >> 8), static_cast<unsigned char>(value)};
    out.write(reinterpret_cast<const char*>(bytes), 4);
  }

  static void write_split(const std::string& dir, const std::string& prefix, int count,
                          uint32_t seed) {
    std::ofstream images(dir + "/" + prefix + "-images-idx3-ubyte", std::ios::binary);
    write_be32(images, 0x00000803);
    write_be32(images, count);
    write_be32(images, 28);
    write_be32(images, 28);
    std::ofstream labels(dir + "/" + prefix + "-labels-idx1-ubyte", std::ios::binary);
    write_be32(labels, 0x00000801);
    write_be32(labels, count);
    uint32_t state = seed;
    for (int i = 0; i < count; ++i) {
      const int label = i % 10;
      labels.put(static_cast<char>(label));
      for (int p = 0; p < 28 * 28; ++p) {
        state = state * 1664525u + 1013904223u;
        // A label-dependent band plus noise, so the classes can be told apart.
        const int row = p / 28;
        const int value = (row / 3 == label ? 160 : 0) + static_cast<int>((state >> 24) % 96);
        images.put(static_cast<char>(value));
      }
    }
  }

  static void SetUpTestSuite() {
    if (rank() == 0) {
      fs::remove_all(folder(""));
      fs::create_directories(folder("data"));
      write_split(folder("data"), "train", 256, 1);
      write_split(folder("data"), "t10k", 64, 2);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }

  static TrainConfig config(const std::string& recipe, const std::string& model) {
    TrainConfig config;
    config.recipe = recipe;
    config.model = model;
    config.data = folder("data");
    config.batch_size = 32;
    config.epochs = 1;
    config.steps = 3;
    config.log_every = 1;
    config.threads = 1;
    return config;
  }

  // One process trains `config` on rank 0 while the other ranks wait: the reference.
  static RecipeResult run_alone(const TrainConfig& config) {
    RecipeResult result;
    if (rank() == 0) {
      set_training_world(MPI_COMM_SELF);
      try {
        std::ostringstream log;
        result = run_recipe(config, log);
      } catch (...) {
        set_training_world(MPI_COMM_WORLD);
        throw;
      }
      set_training_world(MPI_COMM_WORLD);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    return result;
  }

  static std::map<std::string, Tensor> parameters(const RecipeResult& result) {
    return load_safetensors(result.last_checkpoint + "/model.safetensors");
  }
};

TEST_F(DistributedRecipe, DataParallelMlpMatchesOneProcess) {
  // Adam divides by sqrt(v) + 1e-8: where a gradient is near 1e-8, the last-bit differences of
  // two summation orders move the update by a visible part of lr. A small lr keeps that part
  // under the closeness rule; everything else is the same arithmetic in another order.
  TrainConfig alone = config("mlp_fashion_mnist", "mlp");
  alone.lr = 1e-4;
  alone.checkpoint_dir = folder("mlp_alone");
  const RecipeResult expected = run_alone(alone);

  TrainConfig split = alone;
  split.dp = 2;
  split.checkpoint_dir = folder("mlp_dp2");
  std::ostringstream log;
  const RecipeResult actual = run_recipe(split, log);
  if (rank() != 0) {
    EXPECT_EQ(log.str(), "") << "only rank 0 prints";
    EXPECT_EQ(actual.last_checkpoint, "") << "only rank 0 writes checkpoints";
    return;
  }
  EXPECT_NE(log.str().find("parallel: 2 ranks as dp 2 x tp 1"), std::string::npos) << log.str();
  EXPECT_EQ(actual.steps, 3);
  EXPECT_NEAR(actual.final_train_loss, expected.final_train_loss,
              1e-4 * std::abs(expected.final_train_loss));
  const auto want = parameters(expected);
  const auto got = parameters(actual);
  ASSERT_EQ(want.size(), got.size());
  for (const auto& [name, tensor] : want) {
    ASSERT_TRUE(got.count(name)) << name;
    EXPECT_TRUE(all_close(got.at(name), tensor, 1e-4, 1e-6)) << name;
  }
  ASSERT_EQ(actual.final_eval.size(), expected.final_eval.size());
  for (size_t i = 0; i < expected.final_eval.size(); ++i)
    EXPECT_NEAR(actual.final_eval[i].second, expected.final_eval[i].second,
                1e-4 * std::max(1.0, std::abs(expected.final_eval[i].second)))
        << expected.final_eval[i].first;
}

TEST_F(DistributedRecipe, TensorParallelResNetMatchesDataParallel) {
  // Both split each batch in two for batch norm; tp also splits the classifier by classes.
  TrainConfig data_parallel = config("resnet18_fashion_mnist", "resnet18");
  data_parallel.dp = 2;
  data_parallel.steps = 2;
  std::ostringstream log;
  const RecipeResult dp = run_recipe(data_parallel, log);
  TrainConfig tensor_parallel = data_parallel;
  tensor_parallel.dp = 0;
  tensor_parallel.tp = 2;
  const RecipeResult tp = run_recipe(tensor_parallel, log);
  EXPECT_NEAR(tp.final_train_loss, dp.final_train_loss, 1e-4 * std::abs(dp.final_train_loss));
  ASSERT_EQ(tp.final_eval.size(), dp.final_eval.size());
  for (size_t i = 0; i < dp.final_eval.size(); ++i)
    EXPECT_NEAR(tp.final_eval[i].second, dp.final_eval[i].second,
                1e-4 * std::max(1.0, std::abs(dp.final_eval[i].second)))
        << dp.final_eval[i].first;
}

TEST_F(DistributedRecipe, GridThatDoesNotMatchTheRanksIsAnError) {
  std::ostringstream log;
  TrainConfig wrong = config("mlp_fashion_mnist", "mlp");
  wrong.dp = 2;
  wrong.tp = 2;
  EXPECT_TRUE(throws_error([&] { run_recipe(wrong, log); },
                           "--dp=2 x --tp=2 = 4 ranks, but the job has 2 ranks"));
  wrong.dp = 3;
  wrong.tp = 0;
  EXPECT_TRUE(throws_error([&] { run_recipe(wrong, log); }, "--dp=3 needs a multiple of 3"));
  wrong.dp = 0;
  wrong.tp = 2;
  EXPECT_TRUE(throws_error([&] { run_recipe(wrong, log); }, "no tensor-parallel form"));
}

TEST_F(DistributedRecipe, TensorParallelCheckpointsAreRefused) {
  std::ostringstream log;
  TrainConfig config_with_checkpoints = config("resnet18_fashion_mnist", "resnet18");
  config_with_checkpoints.tp = 2;
  config_with_checkpoints.checkpoint_dir = folder("tp_checkpoints");
  EXPECT_TRUE(throws_error([&] { run_recipe(config_with_checkpoints, log); },
                           "--checkpoint_dir and --resume need --tp=1"));
}

}  // namespace
}  // namespace tessel::train
