// The train recipes under mpirun -np 2: --dp=2 trains the parameters one process trains (the
// closeness rule for whole f32 models), --tp=2 on ResNet gives the losses of --dp=2 (both split
// the batch in two for batch norm), checkpoints under --tp=2 resume bit for bit and load with
// another split (tp = 2 <-> tp = 1), and a grid that does not match the ranks is a clear error.
#include <mpi.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "core/rng.h"
#include "core/safetensors.h"
#include "gtest/gtest.h"
#include "models/bert.h"
#include "models/trace.h"
#include "nn/nn.h"
#include "ops/ops.h"
#include "optim/adam.h"
#include "optim/clip_grad.h"
#include "optim/lr_scheduler.h"
#include "optim/sgd.h"
#include "parallel/planner/plan_io.h"
#include "parallel/planner/planner.h"
#include "parallel/planner/trace_module.h"
#include "parallel/tensor_parallel.h"
#include "tests/parallel/mpi_testing.h"
#include "tests/testing.h"
#include "train/engine/checkpointer.h"
#include "train/engine/run_layout.h"
#include "train/engine/status_log.h"
#include "train/engine/training_plan.h"
#include "train/recipes/recipe.h"
#include "train/state/checkpoint.h"
#include "train/tasks/bert_pretraining.h"

namespace tessel::train {
namespace {

namespace fs = std::filesystem;
using parallel::testing::MpiTest;
using tessel::testing::all_close;
using tessel::testing::bitwise_equal;
using tessel::testing::throws_error;

std::string test_folder(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  const fs::path path = fs::path(base ? base : "/tmp") / "distributed_recipe_test" / name;
  return path.string();
}

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

// Runs `train` as one process on rank 0 (its training world is itself) while the other ranks
// wait at a barrier: the single-process reference of a multi-rank run.
RecipeResult on_rank_zero_alone(const std::function<RecipeResult()>& train) {
  RecipeResult result;
  if (world_rank() == 0) {
    set_training_world(MPI_COMM_SELF);
    try {
      result = train();
    } catch (...) {
      set_training_world(MPI_COMM_WORLD);
      throw;
    }
    set_training_world(MPI_COMM_WORLD);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return result;
}

// Every parameter of two checkpoints within the closeness rule for whole f32 models.
void expect_close_parameters(const std::string& actual, const std::string& expected) {
  const auto want = load_safetensors(expected + "/model.safetensors");
  const auto got = load_safetensors(actual + "/model.safetensors");
  ASSERT_EQ(want.size(), got.size());
  for (const auto& [name, tensor] : want) {
    ASSERT_TRUE(got.count(name)) << name;
    EXPECT_TRUE(all_close(got.at(name), tensor, 1e-4, 1e-6)) << name;
  }
}

class DistributedRecipe : public MpiTest {
 protected:
  // ResNet-18's recipe under the plan at `path` trains what one process trains (batch 16, 3
  // steps), resumes one process's checkpoint of step 2 to the same end, and logs each of `logged`.
  static void expect_resnet_plan_trains_like_one_process(const std::string& path,
                                                         const std::string& name,
                                                         const std::vector<std::string>& logged);
  // ZeRO's stages beside ResNet-18's per-op plan on `devices` ranks that `wanted` accepts train
  // what the plan trains alone, and checkpoints resume across the two; `name` prefixes the files.
  static void expect_zero_beside_per_op_plan(
      const std::string& name, int devices,
      const std::function<bool(const planner::PlanFile&)>& wanted);

  // A small Fashion-MNIST-shaped data set (IDX files) shared by the ranks, and an empty folder.
  static std::string folder(const std::string& name) { return test_folder(name); }

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
    return on_rank_zero_alone([&config] {
      std::ostringstream log;
      return run_recipe(config, log);
    });
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
  expect_close_parameters(actual.last_checkpoint, expected.last_checkpoint);
  ASSERT_EQ(actual.final_eval.size(), expected.final_eval.size());
  for (size_t i = 0; i < expected.final_eval.size(); ++i)
    EXPECT_NEAR(actual.final_eval[i].second, expected.final_eval[i].second,
                1e-4 * std::max(1.0, std::abs(expected.final_eval[i].second)))
        << expected.final_eval[i].first;
}

TEST_F(DistributedRecipe, DataParallelMlpWithSgdMatchesOneProcess) {
  // SGD applies the averaged gradient as it is: a constant factor (a sum where a mean is due)
  // shows in every parameter, at a real learning rate.
  TrainConfig alone = config("mlp_fashion_mnist", "mlp");
  alone.optimizer = "sgd";
  alone.lr = 0.05;
  alone.checkpoint_dir = folder("mlp_sgd_alone");
  const RecipeResult expected = run_alone(alone);
  TrainConfig split = alone;
  split.dp = 2;
  split.checkpoint_dir = folder("mlp_sgd_dp2");
  std::ostringstream log;
  const RecipeResult actual = run_recipe(split, log);
  if (rank() != 0) return;
  EXPECT_NEAR(actual.final_train_loss, expected.final_train_loss,
              1e-4 * std::abs(expected.final_train_loss));
  expect_close_parameters(actual.last_checkpoint, expected.last_checkpoint);
}

TEST_F(DistributedRecipe, TensorParallelResNetMatchesDataParallel) {
  // Both split each batch in two for batch norm; tp also splits the classifier by classes.
  // The recipe trains with SGD (nesterov momentum), so a gradient off by a constant factor on
  // either side shows in the parameters.
  TrainConfig data_parallel = config("resnet18_fashion_mnist", "resnet18");
  data_parallel.dp = 2;
  data_parallel.steps = 2;
  data_parallel.checkpoint_dir = folder("resnet_dp2");
  std::ostringstream log;
  const RecipeResult dp = run_recipe(data_parallel, log);
  TrainConfig tensor_parallel = data_parallel;
  tensor_parallel.dp = 0;
  tensor_parallel.tp = 2;
  tensor_parallel.checkpoint_dir = folder("resnet_tp2");
  const RecipeResult tp = run_recipe(tensor_parallel, log);
  EXPECT_NEAR(tp.final_train_loss, dp.final_train_loss, 1e-4 * std::abs(dp.final_train_loss));
  if (rank() == 0) {
    expect_close_parameters(tp.last_checkpoint, dp.last_checkpoint);
  }
  ASSERT_EQ(tp.final_eval.size(), dp.final_eval.size());
  for (size_t i = 0; i < dp.final_eval.size(); ++i)
    EXPECT_NEAR(tp.final_eval[i].second, dp.final_eval[i].second,
                1e-4 * std::max(1.0, std::abs(dp.final_eval[i].second)))
        << dp.final_eval[i].first;
}

// --zero=1, 2 and 3 train what plain --dp=2 trains: ResNet-18 with its SGD (nesterov momentum,
// weight decay; the parts of the momentum on their ranks) and the MLP with Adam. Under stage 3
// the parameters are gathered for each op, and for the checkpoint that rank 0 writes.
TEST_F(DistributedRecipe, ZeroStagesTrainLikeDataParallel) {
  for (const auto& [recipe, model] :
       {std::pair<std::string, std::string>{"resnet18_fashion_mnist", "resnet18"},
        {"mlp_fashion_mnist", "mlp"}}) {
    TrainConfig plain = config(recipe, model);
    plain.dp = 2;
    plain.steps = 2;
    // Three test batches of 64 images: the ranks evaluate two and one of them (stage 3 gathers
    // the parameters whole first, so the evaluation needs no collective).
    plain.batch_size = 24;
    if (model == "mlp") plain.lr = 1e-4;  // see DataParallelMlpMatchesOneProcess
    plain.checkpoint_dir = folder(model + "_zero0");
    std::ostringstream log;
    const RecipeResult expected = run_recipe(plain, log);
    for (int stage : {1, 2, 3}) {
      TrainConfig zero = plain;
      zero.zero = stage;
      zero.checkpoint_dir = folder(model + "_zero" + std::to_string(stage));
      std::ostringstream zero_log;
      const RecipeResult actual = run_recipe(zero, zero_log);
      if (rank() != 0) continue;
      EXPECT_NE(zero_log.str().find("ZeRO stage " + std::to_string(stage)), std::string::npos)
          << zero_log.str();
      EXPECT_NEAR(actual.final_train_loss, expected.final_train_loss,
                  1e-4 * std::abs(expected.final_train_loss))
          << model << " --zero=" << stage;
      expect_close_parameters(actual.last_checkpoint, expected.last_checkpoint);
      // The checkpoint holds the whole optimizer state, as a plain run writes it.
      const auto state = load_safetensors(actual.last_checkpoint + "/train_state.safetensors");
      const auto plain_state =
          load_safetensors(expected.last_checkpoint + "/train_state.safetensors");
      ASSERT_EQ(state.size(), plain_state.size()) << model << " --zero=" << stage;
      int optimizer_tensors = 0;
      for (const auto& [name, tensor] : plain_state) {
        ASSERT_TRUE(state.count(name)) << name;
        if (name.rfind("optimizer.", 0) != 0) continue;
        ++optimizer_tensors;
        EXPECT_TRUE(all_close(state.at(name), tensor, 1e-4, 1e-6)) << name;
      }
      EXPECT_GT(optimizer_tensors, 0);
    }
  }
}

// ZeRO needs data-parallel ranks; stage 3 takes no memory policy.
TEST_F(DistributedRecipe, ZeroNeedsDataParallelRanks) {
  std::ostringstream log;
  TrainConfig wrong = config("resnet18_fashion_mnist", "resnet18");
  wrong.tp = 2;
  wrong.zero = 1;
  EXPECT_TRUE(throws_error([&] { run_recipe(wrong, log); }, "it needs --dp > 1 (this run: dp 1"));
  wrong.tp = 0;
  wrong.zero = 3;
  wrong.memory_policy = "dtr";
  EXPECT_TRUE(throws_error([&] { run_recipe(wrong, log); }, "use --zero=2 with a memory policy"));
  wrong.memory_policy = "";
  wrong.zero = 2;
  if (rank() == 0) {  // one process: rank 0 alone, as its own training world
    set_training_world(MPI_COMM_SELF);
    EXPECT_TRUE(throws_error([&] { run_recipe(wrong, log); }, "run several under mpirun"));
    set_training_world(MPI_COMM_WORLD);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// A plan file's ZeRO stage (plan --zero) runs as --zero does; --zero beside it must agree.
TEST_F(DistributedRecipe, PlanWithAZeroStageRunsIt) {
  planner::PlanFile plan;
  plan.model = "resnet18";
  plan.devices = 2;
  plan.batch = 32;
  plan.image_size = 28;
  plan.profile = "cpu_2core_example";
  plan.mesh_dp = 2;
  plan.zero_stage = 2;
  plan.summary = "dp=2, ZeRO-2 (optimizer state and gradients in dp parts)";
  const std::string path = folder("zero_plan.json");
  if (rank() == 0) planner::write_plan(plan, path);
  MPI_Barrier(MPI_COMM_WORLD);
  TrainConfig planned = config("resnet18_fashion_mnist", "resnet18");
  planned.plan = path;
  planned.steps = 1;
  std::ostringstream log;
  run_recipe(planned, log);
  if (rank() == 0) {
    EXPECT_NE(log.str().find("dp 2 x tp 1, ZeRO stage 2"), std::string::npos) << log.str();
  }
  planned.zero = 1;
  EXPECT_TRUE(throws_error([&] { run_recipe(planned, log); }, "sets ZeRO stage 2 itself"));
}

// Planning on 2 ranks with a profile about this machine's cores.
planner::PlanOptions two_rank_plan_options() {
  planner::PlanOptions options;
  options.config.devices = 2;
  planner::DeviceProfile& profile = options.config.profile;
  profile.name = "test";
  profile.devices_per_node = 2;
  profile.memory_per_device = 1e10;
  profile.gemm_flops = profile.conv_flops = 1e10;
  profile.elementwise_flops = 1e9;
  profile.memory_bandwidth = 1e10;
  for (auto& level : profile.collectives)
    for (auto& link : level) link = {1e-5, 1e9};
  options.remat_fractions = {1.0};
  return options;
}

// Those options on a dp=2 x tp=2 grid of 4 ranks, with ZeRO stage `zero_stage` (0: none).
planner::PlanOptions four_rank_grid_options(int zero_stage) {
  planner::PlanOptions options = two_rank_plan_options();
  options.config.devices = 4;
  options.config.profile.devices_per_node = 4;
  options.config.min_tp = options.config.max_tp = 2;
  options.zero_stages = {zero_stage};
  return options;
}

// The first point of `result`'s frontier that `wanted` accepts, as a plan file; a test failure
// naming `what` when there is none.
planner::PlanFile first_frontier_point(const planner::Graph& graph,
                                       const planner::PlanResult& result,
                                       const planner::ModelSpec& spec,
                                       const planner::PlanOptions& options,
                                       const std::function<bool(const planner::PlanFile&)>& wanted,
                                       const std::string& what) {
  for (int point = 0; point < static_cast<int>(result.frontier.size()); ++point) {
    planner::PlanFile plan = planner::make_plan_file(graph, result, point, spec, options);
    if (wanted(plan)) return plan;
  }
  ADD_FAILURE() << "no frontier point " << what;
  return {};
}

// A grid point of dp=2 x tp=2 without per-op degrees.
bool is_two_by_two_grid(const planner::PlanFile& plan) {
  return plan.mesh_dp == 2 && plan.mesh_tp == 2 && !runs_on_one_line(plan);
}

// A plan with a tensor-parallel group runs its own ops as the planner priced them (channel-split
// convolutions and linears, through parallel::ParallelModule): ResNet-18 and ShuffleNet v2 train
// like one process, and the checkpoint holds whole tensors, as a one-process run writes them.
TEST_F(DistributedRecipe, PlanWithATensorParallelGroupRunsItsOwnOps) {
  for (const auto& [recipe, model, small_stem] :
       {std::tuple<std::string, std::string, bool>{"resnet18_fashion_mnist", "resnet18", false},
        {"shufflenet_v2_fashion_mnist", "shufflenet_v2_x0_5", true}}) {
    planner::ModelSpec spec{model, 16, 0, 28, 10, 1, small_stem};
    const planner::Graph graph = models::trace_model(spec);
    planner::PlanOptions options = two_rank_plan_options();
    options.config.min_tp = 2;  // the model split over both ranks
    const planner::PlanResult result = planner::plan_graph(graph, options);
    const planner::PlanFile plan =
        planner::make_plan_file(graph, result, result.chosen, spec, options);
    ASSERT_EQ(plan.mesh_tp, 2) << plan.summary;
    const std::string path = folder(model + "_tp_plan.json");
    if (rank() == 0) planner::write_plan(plan, path);
    MPI_Barrier(MPI_COMM_WORLD);

    TrainConfig alone = config(recipe, model);
    alone.batch_size = 16;
    alone.steps = 2;
    alone.checkpoint_dir = folder(model + "_planned_alone");
    const RecipeResult expected = run_alone(alone);
    TrainConfig planned = alone;
    planned.plan = path;
    planned.checkpoint_dir = folder(model + "_planned_tp2");
    std::ostringstream log;
    const RecipeResult actual = run_recipe(planned, log);
    if (rank() != 0) continue;
    EXPECT_NE(log.str().find("run the plan's ops as priced"), std::string::npos) << log.str();
    EXPECT_NEAR(actual.final_train_loss, expected.final_train_loss,
                1e-4 * std::abs(expected.final_train_loss))
        << model << ": " << plan.summary;
    expect_close_parameters(actual.last_checkpoint, expected.last_checkpoint);
  }
}

// A frontier point of ResNet-18's plans with per-op degrees on `devices` ranks (Fashion-MNIST's
// images, batch 16) that `wanted` accepts (by default: ops split at more than one pair of
// degrees), and the path rank 0 wrote it to.
std::string resnet_per_op_plan(
    const std::string& name, const std::function<void(planner::PlanFile&)>& change = {},
    int devices = 2,
    const std::function<bool(const planner::PlanFile&)>& wanted = runs_on_one_line) {
  const planner::ModelSpec spec{"resnet18", 16, 0, 28, 10, 1, false};
  const std::string path = test_folder(name + ".json");
  if (world_rank() == 0) {
    const planner::Graph graph = models::trace_model(spec);
    planner::PlanOptions options = two_rank_plan_options();
    options.config.devices = devices;
    options.config.profile.devices_per_node = devices;
    options.per_op_degrees = true;
    const planner::PlanResult result = planner::plan_graph(graph, options);
    planner::PlanFile plan =
        first_frontier_point(graph, result, spec, options, wanted, "with per-op degrees");
    if (change) change(plan);
    planner::write_plan(plan, path);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return path;
}

void DistributedRecipe::expect_resnet_plan_trains_like_one_process(
    const std::string& path, const std::string& name, const std::vector<std::string>& logged) {
  TrainConfig alone = config("resnet18_fashion_mnist", "resnet18");
  alone.batch_size = 16;
  alone.steps = 3;
  alone.checkpoint_every = 2;
  alone.checkpoint_dir = folder(name + "_alone");
  const RecipeResult expected = run_alone(alone);

  TrainConfig planned = alone;
  planned.plan = path;
  planned.checkpoint_dir = folder(name + "_planned");
  std::ostringstream log;
  const RecipeResult actual = run_recipe(planned, log);
  // Each rank takes its part of every tensor of one process's checkpoint.
  TrainConfig resuming = planned;
  resuming.resume = folder(name + "_alone") + "/step_2";
  resuming.checkpoint_dir = folder(name + "_resumed");
  const RecipeResult resumed = run_recipe(resuming, log);
  EXPECT_EQ(resumed.resumed_from_step, 2);
  if (world_rank() != 0) return;
  EXPECT_EQ(actual.steps, 3);
  for (const std::string& text : logged)
    EXPECT_NE(log.str().find(text), std::string::npos) << text << "\n" << log.str();
  for (const RecipeResult* run : {&actual, &resumed}) {
    EXPECT_NEAR(run->final_train_loss, expected.final_train_loss,
                1e-4 * std::abs(expected.final_train_loss));
    expect_close_parameters(run->last_checkpoint, expected.last_checkpoint);
  }
}

// A vision plan with per-op degrees (each op splits the batch or the model over both ranks, or
// runs whole) trains what one process trains, and resumes one process's checkpoint.
TEST_F(DistributedRecipe, VisionPlanWithPerOpDegreesTrainsLikeOneProcess) {
  expect_resnet_plan_trains_like_one_process(
      resnet_per_op_plan("resnet_per_op_plan"), "resnet_per_op",
      {"dp 1 x tp 2 from plan", "per-op degrees: each op on the grid its strategy chose"});
}

// The frontier's point where every op runs whole on every rank (a grid of one rank in a plan for
// two) trains what one process trains: each rank gathers the batch and runs all of it.
TEST_F(DistributedRecipe, VisionPlanWithEveryOpWholeOnEveryRankTrainsLikeOneProcess) {
  const auto whole_everywhere = [](planner::PlanFile& plan) {
    plan.mesh_dp = plan.mesh_tp = 1;
    for (planner::PlanFile::Op& op : plan.ops) {
      op.dp = op.tp = 1;
      op.strategy = "replicate";
    }
    for (planner::PlanFile::Parameter& parameter : plan.parameters) {
      parameter.split_dim = -1;
      parameter.parts = 1;
    }
    plan.summary = "replicated on every device";
  };
  const std::string path = resnet_per_op_plan("resnet_whole_everywhere", whole_everywhere);
  EXPECT_TRUE(runs_on_one_line(planner::read_plan(path)));
  expect_resnet_plan_trains_like_one_process(path, "resnet_whole_everywhere",
                                             {"dp 1 x tp 2 from plan"});
}

// Whether a plan for 4 ranks puts ops on a 2 x 2 grid (each of its groups over part of the ranks)
// beside ops over all four.
bool mixes_the_two_by_two_grid(const planner::PlanFile& plan) {
  bool two_by_two = false, other = false;
  for (const auto& op : plan.ops) {
    if (op.dp == 2 && op.tp == 2) two_by_two = true;
    if ((op.dp > 1 || op.tp > 1) && !(op.dp == 2 && op.tp == 2)) other = true;
  }
  return two_by_two && other;
}

// On 4 ranks a plan with per-op degrees puts ops on a 2 x 2 grid beside ops over all four:
// ResNet-18 trains what one process trains.
TEST_F(DistributedRecipe, VisionPlanWithOpsOverPartOfTheRanksOnFourRanksTrainsLikeOneProcess) {
  if (size() != 4) GTEST_SKIP() << "a 2 x 2 grid inside one line needs 4 ranks";
  expect_resnet_plan_trains_like_one_process(
      resnet_per_op_plan("resnet_part_of_four", {}, 4, mixes_the_two_by_two_grid),
      "resnet_part_of_four", {"each op on the grid its strategy chose"});
}

// A vision plan with per-op degrees that does not fit the run says why before training.
TEST_F(DistributedRecipe, VisionPlanWithPerOpDegreesThatDoesNotFitIsAClearError) {
  TrainConfig planned = config("resnet18_fashion_mnist", "resnet18");
  planned.batch_size = 16;
  planned.plan =
      resnet_per_op_plan("resnet_per_op_batch8", [](planner::PlanFile& plan) { plan.batch = 8; });
  std::ostringstream log;
  EXPECT_TRUE(throws_error([&] { run_recipe(planned, log); },
                           "--plan: the plan was made for a batch of 8 images of 1x28x28, this "
                           "run trains [16, 1, 28, 28]"));
  EXPECT_EQ(log.str().find("train step"), std::string::npos) << log.str();
}

// Two runs that trained alike (rank 0): the final loss, the checkpoint's whole parameters and its
// whole optimizer state within the closeness rule.
void expect_trained_alike(const RecipeResult& actual, const RecipeResult& expected,
                          const std::string& what) {
  EXPECT_NEAR(actual.final_train_loss, expected.final_train_loss,
              1e-4 * std::abs(expected.final_train_loss))
      << what;
  expect_close_parameters(actual.last_checkpoint, expected.last_checkpoint);
  const auto state = load_safetensors(actual.last_checkpoint + "/train_state.safetensors");
  const auto plain_state = load_safetensors(expected.last_checkpoint + "/train_state.safetensors");
  int optimizer_tensors = 0;
  for (const auto& [name, tensor] : plain_state) {
    if (name.rfind("optimizer.", 0) != 0) continue;
    ++optimizer_tensors;
    ASSERT_TRUE(state.count(name)) << what << ": " << name;
    EXPECT_TRUE(all_close(state.at(name), tensor, 1e-4, 1e-6)) << what << ": " << name;
  }
  EXPECT_GT(optimizer_tensors, 0) << what;
}

// `plain` run again under ZeRO stages 1, 2 and 3, with the plan `plan_for(stage)` names and the
// checkpoints in folder `<name>_zero<stage>`: on rank 0 each trains like `expected` and its log
// says its stage and each of `said`. Returns the three runs.
std::vector<RecipeResult> expect_zero_stages_like(const TrainConfig& plain,
                                                  const RecipeResult& expected,
                                                  const std::string& name,
                                                  const std::function<std::string(int)>& plan_for,
                                                  const std::vector<std::string>& said = {}) {
  std::vector<RecipeResult> runs;
  for (int stage : {1, 2, 3}) {
    const std::string stage_name = name + "_zero" + std::to_string(stage);
    TrainConfig zero = plain;
    zero.plan = plan_for(stage);
    zero.checkpoint_dir = test_folder(stage_name);
    std::ostringstream log;
    runs.push_back(run_recipe(zero, log));
    if (world_rank() != 0) continue;
    std::vector<std::string> texts = said;
    texts.push_back("ZeRO stage " + std::to_string(stage));
    for (const std::string& text : texts)
      EXPECT_NE(log.str().find(text), std::string::npos) << text << " in " << log.str();
    expect_trained_alike(runs.back(), expected, stage_name);
  }
  return runs;
}

// ZeRO beside per-op degrees runs over the one group of every rank, each keeping the tensors the
// plan cuts over all of them as its own shards (and cutting those it cuts over part of them over
// the ranks holding the same part): every stage trains what the plan trains without ZeRO (the
// loss, the whole parameters and optimizer state), and checkpoints resume across the two.
void DistributedRecipe::expect_zero_beside_per_op_plan(
    const std::string& name, int devices,
    const std::function<bool(const planner::PlanFile&)>& wanted) {
  TrainConfig plain = config("resnet18_fashion_mnist", "resnet18");
  plain.batch_size = 16;
  plain.steps = 3;
  plain.checkpoint_every = 2;
  plain.plan = resnet_per_op_plan(name + "_zero0", {}, devices, wanted);
  plain.checkpoint_dir = folder(name + "_zero0");
  std::ostringstream log;
  const RecipeResult expected = run_recipe(plain, log);
  expect_zero_stages_like(plain, expected, name,
                          [&](int stage) {
                            return resnet_per_op_plan(
                                name + "_zero" + std::to_string(stage),
                                [&](planner::PlanFile& plan) { plan.zero_stage = stage; }, devices,
                                wanted);
                          },
                          {"per-op degrees"});
  // The plan without ZeRO resumes ZeRO-3's checkpoint, and ZeRO-2 the plain one.
  TrainConfig resume_plain = plain;
  resume_plain.resume = folder(name + "_zero3") + "/step_2";
  resume_plain.checkpoint_dir = folder(name + "_zero3_then_plain");
  const RecipeResult plain_resumed = run_recipe(resume_plain, log);
  EXPECT_EQ(plain_resumed.resumed_from_step, 2);
  if (world_rank() == 0)
    expect_trained_alike(plain_resumed, expected, "plain from ZeRO-3's step 2");
  TrainConfig resume_zero = plain;
  resume_zero.plan = test_folder(name + "_zero2.json");
  resume_zero.resume = folder(name + "_zero0") + "/step_2";
  resume_zero.checkpoint_dir = folder(name + "_plain_then_zero2");
  const RecipeResult zero_resumed = run_recipe(resume_zero, log);
  EXPECT_EQ(zero_resumed.resumed_from_step, 2);
  if (world_rank() == 0)
    expect_trained_alike(zero_resumed, expected, "ZeRO-2 from the plain step 2");
}

TEST_F(DistributedRecipe, ZeroBesideAPlanWithPerOpDegreesTrainsLikeThePlanAlone) {
  expect_zero_beside_per_op_plan("resnet_per_op", 2, runs_on_one_line);
}

// On 4 ranks, beside a plan with ops on a 2 x 2 grid beside ops over all four: the shards cut on
// that grid are ZeRO's over its pairs.
TEST_F(DistributedRecipe,
       ZeroBesideAPlanWithOpsOverPartOfTheRanksOnFourRanksTrainsLikeThePlanAlone) {
  if (size() != 4) GTEST_SKIP() << "a 2 x 2 grid inside one line needs 4 ranks";
  expect_zero_beside_per_op_plan("resnet_part_of_four", 4, mixes_the_two_by_two_grid);
}

// A ResNet-18 plan on a dp=2 x tp=2 grid of 4 ranks (Fashion-MNIST's images, batch 16) with ZeRO
// stage `stage` (0: none), and the path rank 0 wrote it to.
std::string resnet_grid_plan(int stage) {
  const planner::ModelSpec spec{"resnet18", 16, 0, 28, 10, 1, false};
  const std::string path = test_folder("resnet_grid_zero" + std::to_string(stage) + ".json");
  if (world_rank() == 0) {
    const planner::Graph graph = models::trace_model(spec);
    const planner::PlanOptions options = four_rank_grid_options(stage);
    const planner::PlanResult result = planner::plan_graph(graph, options);
    planner::write_plan(first_frontier_point(graph, result, spec, options, is_two_by_two_grid,
                                             "on a dp=2 x tp=2 grid"),
                        path);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return path;
}

// Under mpirun -np 4 (the _np4 target runs only the tests named OnFourRanks): ZeRO's stages
// beside a grid plan's own ops train what the plan trains without ZeRO, the checkpoint holds the
// whole parameters and optimizer state, and it resumes with and without ZeRO.
TEST_F(DistributedRecipe, ZeroBesideAGridPlanOnFourRanksTrainsLikeThePlanAlone) {
  if (size() != 4) GTEST_SKIP() << "a dp=2 x tp=2 grid needs 4 ranks";
  TrainConfig plain = config("resnet18_fashion_mnist", "resnet18");
  plain.batch_size = 16;
  plain.steps = 3;
  plain.checkpoint_every = 2;
  plain.plan = resnet_grid_plan(0);
  plain.checkpoint_dir = folder("resnet_grid_zero0");
  std::ostringstream log;
  const RecipeResult expected = run_recipe(plain, log);
  // The plan itself trains what one process trains.
  TrainConfig alone = plain;
  alone.plan.clear();
  alone.checkpoint_dir = folder("resnet_grid_alone");
  const RecipeResult one_process = run_alone(alone);
  if (rank() == 0) expect_trained_alike(expected, one_process, "the grid plan against one process");
  auto expect_like_plain = [&](const RecipeResult& actual, const std::string& what) {
    if (rank() == 0) expect_trained_alike(actual, expected, what);
  };
  const auto zero_runs = expect_zero_stages_like(
      plain, expected, "resnet_grid", resnet_grid_plan,
      {"dp 2 x tp 2", "the recipes run the plan's ops as priced beside ZeRO"});
  if (rank() == 0) {
    for (const RecipeResult& run : zero_runs) {  // whole tensors in the checkpoint
      EXPECT_EQ(
          load_safetensors(run.last_checkpoint + "/model.safetensors").at("fc.weight").sizes(),
          Shape({10, 512}));
    }
  }
  // Across layouts: the plan without ZeRO resumes ZeRO-2's checkpoint, and ZeRO-3 the plain one.
  TrainConfig resume_plain = plain;
  resume_plain.resume = folder("resnet_grid_zero2") + "/step_2";
  resume_plain.checkpoint_dir = folder("resnet_grid_zero2_then_plain");
  const RecipeResult plain_resumed = run_recipe(resume_plain, log);
  EXPECT_EQ(plain_resumed.resumed_from_step, 2);
  expect_like_plain(plain_resumed, "the plan without ZeRO from ZeRO-2's step 2");
  TrainConfig resume_zero = plain;
  resume_zero.plan = resnet_grid_plan(3);
  resume_zero.resume = folder("resnet_grid_zero0") + "/step_2";
  resume_zero.checkpoint_dir = folder("resnet_grid_plain_then_zero3");
  const RecipeResult zero_resumed = run_recipe(resume_zero, log);
  EXPECT_EQ(zero_resumed.resumed_from_step, 2);
  expect_like_plain(zero_resumed, "ZeRO-3 from the plan's step 2 without ZeRO");
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

// GPU ranks train one GPU each, with DDP's gradients and the tensor-parallel ops over NCCL. This
// binary links no NCCL (only //train:train does, under --config=cuda), so --device=cuda stops
// before training with the reason, for data and tensor parallelism alike; GPU indices are refused
// in any build.
TEST_F(DistributedRecipe, CudaDeviceOnSeveralRanksNeedsNcclAndIsRefusedBeforeTraining) {
  std::ostringstream log;
  TrainConfig cuda = config("mlp_fashion_mnist", "mlp");
  cuda.device = "cuda";
  const std::string no_nccl =
      "--device=cuda: the job has 2 ranks (mpirun -np 2) as dp 2 x tp 1, whose GPUs exchange "
      "tensors over NCCL, but this binary has no NCCL: NCCL needs a --config=cuda build";
  EXPECT_TRUE(throws_error([&] { run_recipe(cuda, log); }, no_nccl));  // dp = the rank count
  cuda.dp = 2;
  EXPECT_TRUE(throws_error([&] { run_recipe(cuda, log); }, no_nccl));

  TrainConfig split = config("resnet18_fashion_mnist", "resnet18");
  split.device = "cuda";
  split.tp = 2;
  EXPECT_TRUE(throws_error([&] { run_recipe(split, log); },
                           "--device=cuda: the job has 2 ranks (mpirun -np 2) as dp 1 x tp 2, "
                           "whose GPUs exchange tensors over NCCL, but this binary has no NCCL"));

  cuda.device = "cuda:1";
  EXPECT_TRUE(throws_error([&] { run_recipe(cuda, log); },
                           "--device=cuda:1: under mpirun each rank picks its own GPU"));
  EXPECT_EQ(log.str().find("train step"), std::string::npos) << log.str();
}

// Which GPU a rank takes, without a GPU: the rule and its errors.
TEST(RankTrainingDevice, EachRankTakesItsLocalRankModuloTheGpus) {
  TrainConfig config;
  ParallelLayout layout;
  layout.dp = 4;
  int counted = 0;
  auto two_gpus = [&] {
    ++counted;
    return 2;
  };
  config.device = "cpu";
  EXPECT_EQ(rank_training_device(config, layout, 4, 3, two_gpus), Device::cpu());
  EXPECT_EQ(counted, 0);  // the CPU never asks for GPUs (a binary without NCCL is fine)
  config.device = "cuda";
  EXPECT_EQ(rank_training_device(config, layout, 4, 0, two_gpus), Device::cuda(0));
  EXPECT_EQ(rank_training_device(config, layout, 4, 1, two_gpus), Device::cuda(1));
  EXPECT_EQ(rank_training_device(config, layout, 4, 3, two_gpus), Device::cuda(1));
  // One GPU visible per rank (CUDA_VISIBLE_DEVICES set per rank): each uses its cuda:0.
  EXPECT_EQ(rank_training_device(config, layout, 4, 3, [] { return 1; }), Device::cuda(0));
}

// Tensor parallelism takes GPUs by the same rule: dp x tp ranks, one GPU each.
TEST(RankTrainingDevice, TensorParallelRanksTakeTheirGpusLikeDataParallelOnes) {
  TrainConfig config;
  config.device = "cuda";
  config.plan = "plan.json";
  ParallelLayout layout;
  layout.dp = 2;
  layout.tp = 2;
  layout.plan = planner::PlanFile();
  auto gpus = [] { return 4; };
  for (int local_rank = 0; local_rank < 4; ++local_rank)
    EXPECT_EQ(rank_training_device(config, layout, 4, local_rank, gpus), Device::cuda(local_rank));
}

TEST(RankTrainingDevice, GpuIndicesMissingGpusAndNoNcclAreClearErrors) {
  TrainConfig config;
  config.device = "cuda";
  config.plan = "plan.json";
  ParallelLayout layout;
  layout.dp = 2;
  layout.tp = 2;
  layout.plan = planner::PlanFile();
  EXPECT_TRUE(throws_error(
      [&] {
        rank_training_device(config, layout, 4, 0, []() -> int { TESSEL_FAIL("no NCCL here"); });
      },
      "--device=cuda: the job has 4 ranks (mpirun -np 4) as dp 2 x tp 2 from --plan=plan.json, "
      "whose GPUs exchange tensors over NCCL, but no NCCL here"));
  auto gpus = [] { return 4; };
  layout.plan.reset();
  layout.tp = 1;
  layout.dp = 4;
  config.device = "cuda:0";
  EXPECT_TRUE(throws_error([&] { rank_training_device(config, layout, 4, 0, gpus); },
                           "pass --device=cuda"));
  config.device = "cuda";
  EXPECT_TRUE(throws_error([&] { rank_training_device(config, layout, 4, 0, [] { return 0; }); },
                           "--device=cuda: no GPU is visible to this rank (device_count() == 0)"));
}

// ---- checkpoints under tensor parallelism: whole tensors on disk, any split on resume.

// Every tensor of two checkpoint files, bit for bit.
void expect_same_bits(const std::string& actual_file, const std::string& expected_file) {
  const auto want = load_safetensors(expected_file);
  const auto got = load_safetensors(actual_file);
  ASSERT_EQ(want.size(), got.size()) << actual_file;
  for (const auto& [name, tensor] : want) {
    ASSERT_TRUE(got.count(name)) << name;
    EXPECT_TRUE(bitwise_equal(got.at(name), tensor)) << name;
  }
}

constexpr int64_t kBertVocab = 64, kBertSeq = 16, kBertBatch = 4, kBertSteps = 20;

// BERT tiny without dropout, trained with the engine's pieces (train/engine/) on masked-LM and
// next-sentence batches that depend on (epoch, position) only: the full model with --tp=1,
// shard_bert's with --tp=2.
RecipeResult train_bert(const TrainConfig& config) {
  std::ostringstream main_log;
  TrainConfig rank_config;
  const RunLayout layout = lay_out_ranks(config, main_log, &rank_config);
  std::ostream& log = layout.log(main_log);
  manual_seed(7);
  models::BertForPreTraining model(models::BertConfig::tiny()
                                       .vocab_size(kBertVocab)
                                       .dropout(0)
                                       .max_position_embeddings(kBertSeq));
  std::shared_ptr<models::BertForPreTraining> tp_model;
  if (layout.tp > 1) tp_model = models::shard_bert(model, layout.tp_group_id);
  models::BertForPreTraining& trained = tp_model ? *tp_model : model;
  optim::AdamW optimizer(trained.named_parameters(),
                         optim::AdamWOptions(1e-3).weight_decay(0.01).eps(1e-6));
  optim::LinearWarmupDecay scheduler(optimizer, 2, kBertSteps);
  const TrainingPlan plan(rank_config, kBertSteps);
  StatusLog status(rank_config, layout, plan, optimizer, log);
  Checkpointer checkpointer(rank_config, layout, plan, trained, optimizer, &scheduler, status);
  int64_t step = checkpointer.resume();
  for (int64_t epoch = plan.epoch_of(step); epoch <= plan.epochs && !plan.done(step); ++epoch) {
    status.begin_epoch();
    for (int64_t position = plan.batches_done(epoch, step);
         position < kBertSteps && !plan.done(step); ++position) {
      uint32_t state = static_cast<uint32_t>(1000 * (epoch - 1) + position) * 2654435761u + 1;
      auto next = [&state](int64_t bound) {
        state = state * 1664525u + 1013904223u;
        return static_cast<int64_t>((state >> 8) % static_cast<uint32_t>(bound));
      };
      std::vector<int64_t> ids, types, labels, nsp;
      for (int64_t n = 0; n < kBertBatch; ++n) {
        nsp.push_back(next(2));
        for (int64_t t = 0; t < kBertSeq; ++t) {
          ids.push_back(next(kBertVocab));
          types.push_back(t < kBertSeq / 2 ? 0 : 1);
          labels.push_back(t % 4 == 1 ? next(kBertVocab) : -100);
        }
      }
      const Tensor input_ids = from_vector<int64_t>(ids, {kBertBatch, kBertSeq});
      const Tensor token_types = from_vector<int64_t>(types, {kBertBatch, kBertSeq});
      const Tensor mlm_labels = from_vector<int64_t>(labels, {kBertBatch, kBertSeq});
      const Tensor nsp_labels = from_vector<int64_t>(nsp, {kBertBatch});
      const models::BertPreTrainingLoss loss = models::bert_pretraining_loss(
          trained.forward(input_ids, token_types), mlm_labels, nsp_labels);
      optimizer.zero_grad();
      loss.total.backward();
      if (tp_model) {
        clip_grad_norm_tensor_parallel(*tp_model, 1.0, layout.tp_group_id);
      } else {
        optim::clip_grad_norm(optimizer.parameters(), 1.0);
      }
      optimizer.step();
      scheduler.step();
      ++step;
      status.step(step, epoch, loss.total.item<double>(), kBertBatch);
      checkpointer.maybe_save(step);
    }
    if (plan.ends_epoch(epoch, step)) checkpointer.save(step);
  }
  checkpointer.save(step);
  RecipeResult result = status.finish(step);
  result.resumed_from_step = checkpointer.resumed_from();
  result.last_checkpoint = checkpointer.last_saved();
  return result;
}

TrainConfig bert_config(const std::string& checkpoint_dir, int tp, int64_t steps) {
  TrainConfig config;
  config.recipe = "bert_tiny_test";
  config.batch_size = kBertBatch;
  config.epochs = 1;
  config.steps = steps;
  config.log_every = kBertSteps;
  config.tp = tp;
  config.checkpoint_dir = checkpoint_dir;
  return config;
}

// BERT on one process (rank 0; the others wait), as run_alone does for recipes.
RecipeResult train_bert_alone(const TrainConfig& config) {
  return on_rank_zero_alone([&config] { return train_bert(config); });
}

TEST_F(DistributedRecipe, TensorParallelBertResumesExactly) {
  // Split parameters (heads, MLP columns, vocabulary) and their AdamW moments are gathered into
  // the checkpoint and sliced again on resume.
  const RecipeResult straight = train_bert(bert_config(folder("bert_tp2_straight"), 2, 20));
  TrainConfig first_half = bert_config(folder("bert_tp2_resumed"), 2, 10);
  const RecipeResult half = train_bert(first_half);
  TrainConfig second_half = first_half;
  second_half.steps = 20;
  second_half.resume = "";
  const RecipeResult resumed = train_bert(second_half);
  EXPECT_EQ(resumed.resumed_from_step, 10);
  EXPECT_EQ(resumed.steps, 20);
  if (rank() != 0) {
    EXPECT_EQ(resumed.last_checkpoint, "") << "only rank 0 writes checkpoints";
    return;
  }
  EXPECT_EQ(half.last_checkpoint, folder("bert_tp2_resumed") + "/step_10");
  expect_same_bits(resumed.last_checkpoint + "/model.safetensors",
                   straight.last_checkpoint + "/model.safetensors");
  expect_same_bits(resumed.last_checkpoint + "/train_state.safetensors",
                   straight.last_checkpoint + "/train_state.safetensors");
  // On disk the tensors are whole: the layout of a one-process run.
  const auto saved = load_safetensors(straight.last_checkpoint + "/model.safetensors");
  EXPECT_EQ(saved.at("bert.embeddings.word_embeddings.weight").sizes(), Shape({kBertVocab, 128}));
  EXPECT_EQ(saved.at("bert.encoder.layer.0.attention.self.query.weight").sizes(),
            Shape({128, 128}));
  EXPECT_EQ(saved.at("bert.encoder.layer.0.output.dense.weight").sizes(), Shape({128, 512}));
  EXPECT_EQ(saved.at("cls.predictions.bias").sizes(), Shape({kBertVocab}));
  const auto state = load_safetensors(straight.last_checkpoint + "/train_state.safetensors");
  EXPECT_EQ(state.at("optimizer.bert.encoder.layer.0.intermediate.dense.weight.exp_avg").sizes(),
            Shape({512, 128}));
}

TEST_F(DistributedRecipe, TensorParallelBertCheckpointResumesWithAnotherSplit) {
  // Other splits sum in other orders (the vocabulary-parallel cross-entropy, the all-reduced
  // row-parallel products), so the runs stay close rather than equal.
  TrainConfig tp2 = bert_config(folder("bert_split_tp2"), 2, 20);
  tp2.checkpoint_every = 10;
  const RecipeResult tp2_run = train_bert(tp2);
  TrainConfig tp1 = bert_config(folder("bert_split_tp1"), 1, 20);
  tp1.checkpoint_every = 10;
  const RecipeResult tp1_run = train_bert_alone(tp1);

  // tp = 2 -> tp = 1: one process continues from the tp = 2 run's step 10.
  TrainConfig tp1_from_tp2 = bert_config(folder("bert_split_tp1_from_tp2"), 1, 20);
  tp1_from_tp2.resume = folder("bert_split_tp2") + "/step_10";
  const RecipeResult tp1_resumed = train_bert_alone(tp1_from_tp2);
  // tp = 1 -> tp = 2.
  TrainConfig tp2_from_tp1 = bert_config(folder("bert_split_tp2_from_tp1"), 2, 20);
  tp2_from_tp1.resume = folder("bert_split_tp1") + "/step_10";
  const RecipeResult tp2_resumed = train_bert(tp2_from_tp1);
  EXPECT_EQ(tp2_resumed.resumed_from_step, 10);
  if (rank() != 0) return;
  EXPECT_EQ(tp1_resumed.resumed_from_step, 10);
  EXPECT_EQ(tp1_resumed.steps, 20);
  expect_close_parameters(tp1_resumed.last_checkpoint, tp2_run.last_checkpoint);
  expect_close_parameters(tp2_resumed.last_checkpoint, tp1_run.last_checkpoint);
}

// `base` (its --dp / --tp): 4 steps straight, and 2 steps then a resume to 4, give the same bits.
// Returns the straight run's last checkpoint on rank 0.
std::string expect_resume_exact(const TrainConfig& base, const std::string& name) {
  TrainConfig straight = base;
  straight.steps = 4;
  straight.checkpoint_dir = test_folder(name + "_straight");
  std::ostringstream log;
  const RecipeResult expected = run_recipe(straight, log);
  TrainConfig first_half = straight;
  first_half.steps = 2;
  first_half.checkpoint_dir = test_folder(name + "_resumed");
  run_recipe(first_half, log);
  TrainConfig second_half = first_half;
  second_half.steps = 4;
  second_half.resume = "";
  const RecipeResult resumed = run_recipe(second_half, log);
  EXPECT_EQ(resumed.resumed_from_step, 2);
  if (world_rank() != 0) return "";
  EXPECT_EQ(resumed.final_train_loss, expected.final_train_loss);
  expect_same_bits(resumed.last_checkpoint + "/model.safetensors",
                   expected.last_checkpoint + "/model.safetensors");
  expect_same_bits(resumed.last_checkpoint + "/train_state.safetensors",
                   expected.last_checkpoint + "/train_state.safetensors");
  return expected.last_checkpoint;
}

// The same with --tp=2.
std::string expect_tensor_parallel_resume_exact(const TrainConfig& base, const std::string& name) {
  TrainConfig tensor_parallel = base;
  tensor_parallel.tp = 2;
  return expect_resume_exact(tensor_parallel, name);
}

TEST_F(DistributedRecipe, TensorParallelResNetResumesExactly) {
  // The batch-split trunk is replicated; the class-split classifier and its momentum are
  // gathered and sliced. Rank 0's batch-norm statistics are the ones saved.
  const std::string saved_at =
      expect_tensor_parallel_resume_exact(config("resnet18_fashion_mnist", "resnet18"), "resnet");
  if (rank() != 0) return;
  const auto saved = load_safetensors(saved_at + "/model.safetensors");
  EXPECT_EQ(saved.at("fc.weight").sizes(), Shape({10, 512}));
  EXPECT_EQ(saved.at("fc.bias").sizes(), Shape({10}));
}

TEST_F(DistributedRecipe, TensorParallelShuffleNetResumesExactly) {
  // conv5 split by channels: its filters, batch-norm weights and running statistics too.
  const std::string saved_at = expect_tensor_parallel_resume_exact(
      config("shufflenet_v2_fashion_mnist", "shufflenet_v2_x0_5"), "shufflenet");
  if (rank() != 0) return;
  const auto saved = load_safetensors(saved_at + "/model.safetensors");
  EXPECT_EQ(saved.at("conv5.0.weight").size(0), 1024);
  EXPECT_EQ(saved.at("conv5.1.running_mean").sizes(), Shape({1024}));
  EXPECT_EQ(saved.at("fc.weight").sizes(), Shape({10, 1024}));
}

// Under --zero=2 and 3 a checkpoint resumes bit for bit, and it resumes a plain --dp=2 run too
// (the optimizer state and the parameters are written whole).
TEST_F(DistributedRecipe, ZeroCheckpointsResumeExactlyAndInAPlainRun) {
  for (int stage : {2, 3}) {
    const std::string name = "resnet_zero" + std::to_string(stage);
    TrainConfig zero = config("resnet18_fashion_mnist", "resnet18");
    zero.dp = 2;
    zero.zero = stage;
    const std::string saved_at = expect_resume_exact(zero, name);
    TrainConfig plain = config("resnet18_fashion_mnist", "resnet18");
    plain.dp = 2;
    plain.steps = 4;
    plain.checkpoint_dir = folder(name + "_then_plain");
    plain.resume = test_folder(name + "_resumed") + "/step_2";
    std::ostringstream log;
    const RecipeResult resumed = run_recipe(plain, log);
    EXPECT_EQ(resumed.resumed_from_step, 2);
    if (rank() == 0) expect_close_parameters(resumed.last_checkpoint, saved_at);
  }
}

// A fortune file of `count` short entries between "%" lines, written by rank 0.
std::string fortunes_corpus(const std::string& name, int count = 60) {
  const std::string directory = test_folder(name);
  const std::string path = directory + "/fortunes";
  if (world_rank() == 0) {
    fs::create_directories(directory);
    const char* subjects[] = {"the cat",       "a dog",       "my friend", "the old man",
                              "every student", "our teacher", "the river", "a small bird"};
    const char* verbs[] = {"sees", "likes", "finds", "follows", "remembers", "watches"};
    const char* objects[] = {"the moon",      "a red apple", "the long road",    "warm bread",
                             "the quiet sea", "a good book", "the morning light"};
    std::ofstream text(path);
    for (int i = 0; i < count; ++i)
      text << subjects[i % 8] << " " << verbs[i % 6] << " " << objects[i % 7] << ".\n"
           << subjects[(i + 3) % 8] << " " << verbs[(i + 1) % 6] << " " << objects[(i + 2) % 7]
           << " again.\n%\n";
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return path;
}

TrainConfig bert_fortunes_config(const std::string& name) {
  TrainConfig config;
  config.recipe = "bert_mlm_fortunes";
  config.model = "bert_tiny";
  config.data = fortunes_corpus(name + "_corpus");
  config.work_dir = test_folder(name + "_work");
  // Odd: the shards have 4 and 3 rows, so the ranks draw different amounts of random numbers
  // for dropout from the first step on.
  config.batch_size = 7;
  config.epochs = 1;
  config.log_every = 1;
  config.threads = 1;
  return config;
}

TEST_F(DistributedRecipe, DataParallelBertWithDropoutResumesExactly) {
  // Dropout (the recipe's default) draws from each rank's RNG on its own shard, so the ranks'
  // RNG states part ways: every rank must get its own state back on resume.
  TrainConfig config = bert_fortunes_config("bert_dp2");
  config.dp = 2;
  expect_resume_exact(config, "bert_dp2");
  if (rank() != 0) return;
  SafetensorsMetadata metadata;  // where the resume started
  load_safetensors(test_folder("bert_dp2_resumed") + "/step_2/train_state.safetensors", &metadata);
  EXPECT_EQ(metadata.at("rng.ranks"), "2");
  EXPECT_EQ(metadata.at("rng.layout"), "dp=2,tp=1");
  EXPECT_NE(metadata.at("rng.rank.0.offset"), metadata.at("rng.rank.1.offset"))
      << "the ranks drew different amounts of random numbers";
  EXPECT_EQ(metadata.at("rng.rank.0.offset"), metadata.at("rng.offset"));
}

TEST_F(DistributedRecipe, DataParallelBertWithoutDropoutMatchesOneProcess) {
  // --dropout=0 leaves nothing random in a step, so the two ranks (shards of 4 and 3 sequences)
  // train what one process trains on the whole batch. SGD applies the averaged gradient as it
  // is, at a rate where a gradient off by a factor shows in the parameters. Under --zero=2 the
  // gradients (the tied word embeddings and MLM decoder too) are clipped from the ranks' parts.
  TrainConfig alone = bert_fortunes_config("bert_no_dropout");
  alone.optimizer = "sgd";
  alone.lr = 0.1;
  alone.dropout = 0;
  alone.steps = 3;
  alone.checkpoint_dir = test_folder("bert_no_dropout_alone");
  const RecipeResult expected = run_alone(alone);
  for (int zero : {0, 2}) {
    TrainConfig split = alone;
    split.dp = 2;
    split.zero = zero;
    split.checkpoint_dir = test_folder("bert_no_dropout_dp2_zero" + std::to_string(zero));
    std::ostringstream log;
    const RecipeResult actual = run_recipe(split, log);
    if (rank() != 0) continue;
    EXPECT_EQ(actual.steps, 3);
    EXPECT_NEAR(actual.final_train_loss, expected.final_train_loss,
                1e-4 * std::abs(expected.final_train_loss))
        << "--zero=" << zero;
    expect_close_parameters(actual.last_checkpoint, expected.last_checkpoint);
  }
}

TEST_F(DistributedRecipe, BertCheckpointResumesInAnotherLayoutFromRankZerosRng) {
  // Saved by one process, resumed with --dp=2: rank 1 has no state of its own in the checkpoint,
  // so every rank continues from rank 0's, deterministically (two resumes give the same bits).
  TrainConfig config = bert_fortunes_config("bert_layout");
  config.steps = 2;
  config.checkpoint_dir = test_folder("bert_layout_alone");
  run_alone(config);
  std::vector<RecipeResult> resumed;
  for (const char* name : {"bert_layout_dp2_a", "bert_layout_dp2_b"}) {
    TrainConfig dp2 = config;
    dp2.dp = 2;
    dp2.steps = 4;
    dp2.checkpoint_dir = test_folder(name);
    dp2.resume = test_folder("bert_layout_alone") + "/step_2";
    std::ostringstream resume_log;
    resumed.push_back(run_recipe(dp2, resume_log));
    EXPECT_EQ(resumed.back().resumed_from_step, 2);
    if (rank() == 0) {
      EXPECT_NE(resume_log.str().find("every rank continues from rank 0's random-number state"),
                std::string::npos)
          << resume_log.str();
    }
  }
  if (rank() != 0) return;
  expect_same_bits(resumed[1].last_checkpoint + "/model.safetensors",
                   resumed[0].last_checkpoint + "/model.safetensors");
}

// ---- BERT's recipe under --plan: the plan's own ops through parallel::ParallelModule.

constexpr int64_t kPlannedBertBatch = 8;  // the test corpus's 88 training sequences: 11 batches
constexpr int64_t kPlannedBertSeq = 128;  // the recipe's longest sequence

// The step of BERT tiny without dropout as the recipe builds it (its vocabulary, from the data,
// read off `checkpoint`), traced for the recipe's batches, and the plan files' name for it.
planner::Graph recipe_bert_graph(const std::string& checkpoint) {
  const int64_t vocab = load_safetensors(checkpoint + "/model.safetensors")
                            .at("bert.embeddings.word_embeddings.weight")
                            .size(0);
  models::BertForPreTraining model(models::BertConfig::tiny().vocab_size(vocab).dropout(0));
  return planner::trace_module(model,
                               models::bert_pretraining_step(kPlannedBertBatch, kPlannedBertSeq));
}

planner::ModelSpec recipe_bert_spec() {
  planner::ModelSpec spec;
  spec.name = "bert_tiny";
  spec.batch = kPlannedBertBatch;
  spec.seq = kPlannedBertSeq;
  return spec;
}

// BERT tiny without dropout as the recipe builds it (its vocabulary, from the data, read off
// `checkpoint`), planned on 2 ranks for the recipe's batches: a point whose ops split at one
// pair of degrees with a tensor-parallel group, or one with per-op degrees.
planner::PlanFile bert_recipe_plan(const std::string& checkpoint, bool per_op_degrees) {
  const planner::Graph graph = recipe_bert_graph(checkpoint);
  planner::PlanOptions options = two_rank_plan_options();
  options.per_op_degrees = per_op_degrees;
  if (!per_op_degrees) options.config.min_tp = 2;  // the model split over both ranks
  const planner::PlanResult result = planner::plan_graph(graph, options);
  const planner::ModelSpec spec = recipe_bert_spec();
  return first_frontier_point(
      graph, result, spec, options,
      [&](const planner::PlanFile& plan) {
        return runs_on_one_line(plan) == per_op_degrees && (per_op_degrees || plan.mesh_tp == 2);
      },
      per_op_degrees ? "with per-op degrees" : "without per-op degrees");
}

// Rank 0 writes `plan` to `name`.json; every rank gets its path.
std::string shared_plan(const std::function<planner::PlanFile()>& plan, const std::string& name) {
  const std::string path = test_folder(name + ".json");
  if (world_rank() == 0) planner::write_plan(plan(), path);
  MPI_Barrier(MPI_COMM_WORLD);
  return path;
}

double eval_value(const RecipeResult& result, const std::string& name) {
  for (const auto& [key, value] : result.final_eval)
    if (key == name) return value;
  ADD_FAILURE() << "no evaluation value " << name;
  return 0;
}

TrainConfig planned_bert_config(const std::string& name) {
  TrainConfig config = bert_fortunes_config(name);
  config.batch_size = kPlannedBertBatch;
  config.dropout = 0;  // one process draws no other masks than the ranks
  config.optimizer = "sgd";
  config.lr = 0.1;  // a gradient off by a factor shows in the parameters
  config.steps = 3;
  config.checkpoint_dir = test_folder(name + "_alone");
  return config;
}

// Under mpirun -np 2 a plan with a tensor-parallel group, and one with per-op degrees (each op
// splits the batch or the model over both ranks, or runs whole), train what one process trains:
// the loss, the parameters (gathered whole into the checkpoint) and the held-out evaluation (run
// on the whole model gathered from the shards).
TEST_F(DistributedRecipe, BertPlansRunTheirOwnOpsLikeOneProcess) {
  const TrainConfig alone = planned_bert_config("bert_planned");
  const RecipeResult expected = run_alone(alone);
  for (bool per_op_degrees : {false, true}) {
    const std::string name = per_op_degrees ? "bert_planned_per_op" : "bert_planned_tp";
    TrainConfig planned = alone;
    planned.plan = shared_plan(
        [&] { return bert_recipe_plan(expected.last_checkpoint, per_op_degrees); }, name);
    planned.checkpoint_dir = folder(name);
    std::ostringstream log;
    const RecipeResult actual = run_recipe(planned, log);
    if (rank() != 0) continue;
    EXPECT_EQ(actual.steps, 3);
    EXPECT_NE(log.str().find("dp 1 x tp 2 from plan"), std::string::npos) << log.str();
    EXPECT_NE(log.str().find("run the plan's ops as priced"), std::string::npos) << log.str();
    EXPECT_EQ(log.str().find("per-op degrees: each op on the grid its strategy chose") !=
                  std::string::npos,
              per_op_degrees)
        << log.str();
    EXPECT_NEAR(actual.final_train_loss, expected.final_train_loss,
                1e-4 * std::abs(expected.final_train_loss))
        << name;
    expect_close_parameters(actual.last_checkpoint, expected.last_checkpoint);
    const double expected_mlm = eval_value(expected, "mlm_loss");
    EXPECT_GT(expected_mlm, 0);
    EXPECT_NEAR(eval_value(actual, "mlm_loss"), expected_mlm, 1e-4 * expected_mlm) << name;
  }
}

// A checkpoint written under a plan holds whole tensors: a run without the plan (--dp=2 here)
// resumes from it and ends where one process does; a plan with per-op degrees resumes one
// process's checkpoint the same way.
TEST_F(DistributedRecipe, BertCheckpointWrittenUnderAPlanResumesWithoutIt) {
  TrainConfig alone = planned_bert_config("bert_plan_resume");
  alone.checkpoint_every = 2;
  const RecipeResult expected = run_alone(alone);
  TrainConfig planned = alone;
  planned.plan = shared_plan([&] { return bert_recipe_plan(expected.last_checkpoint, false); },
                             "bert_plan_resume");
  planned.steps = 2;
  planned.checkpoint_dir = folder("bert_plan_resume_planned");
  std::ostringstream log;
  run_recipe(planned, log);
  TrainConfig plain = alone;
  plain.dp = 2;
  plain.resume = folder("bert_plan_resume_planned") + "/step_2";
  plain.checkpoint_dir = folder("bert_plan_resume_plain");
  const RecipeResult resumed = run_recipe(plain, log);
  EXPECT_EQ(resumed.resumed_from_step, 2);
  EXPECT_EQ(resumed.steps, 3);
  if (rank() != 0) return;
  const auto saved =
      load_safetensors(folder("bert_plan_resume_planned") + "/step_2/model.safetensors");
  EXPECT_EQ(saved.at("bert.encoder.layer.0.attention.self.query.weight").sizes(),
            Shape({128, 128}));
  EXPECT_EQ(saved.at("bert.encoder.layer.0.intermediate.dense.weight").sizes(), Shape({512, 128}));
  EXPECT_NEAR(resumed.final_train_loss, expected.final_train_loss,
              1e-4 * std::abs(expected.final_train_loss));
  expect_close_parameters(resumed.last_checkpoint, expected.last_checkpoint);
}

TEST_F(DistributedRecipe, BertPlanWithPerOpDegreesResumesACheckpointOfOneProcess) {
  TrainConfig alone = planned_bert_config("bert_plan_from_alone");
  alone.checkpoint_every = 2;
  const RecipeResult expected = run_alone(alone);
  TrainConfig planned = alone;
  planned.plan = shared_plan([&] { return bert_recipe_plan(expected.last_checkpoint, true); },
                             "bert_plan_from_alone");
  planned.resume = folder("bert_plan_from_alone_alone") + "/step_2";
  planned.checkpoint_dir = folder("bert_plan_from_alone_planned");
  std::ostringstream log;
  const RecipeResult resumed = run_recipe(planned, log);
  EXPECT_EQ(resumed.resumed_from_step, 2);
  EXPECT_EQ(resumed.steps, 3);
  if (rank() != 0) return;
  EXPECT_NEAR(resumed.final_train_loss, expected.final_train_loss,
              1e-4 * std::abs(expected.final_train_loss));
  expect_close_parameters(resumed.last_checkpoint, expected.last_checkpoint);
}

// A dp=2 x tp=2 plan of the recipe's BERT tiny (the vocabulary of `checkpoint`) on 4 ranks with
// ZeRO stage `zero_stage`.
planner::PlanFile bert_grid_plan(const std::string& checkpoint, int zero_stage) {
  const planner::Graph graph = recipe_bert_graph(checkpoint);
  const planner::PlanOptions options = four_rank_grid_options(zero_stage);
  const planner::PlanResult result = planner::plan_graph(graph, options);
  const planner::ModelSpec spec = recipe_bert_spec();
  return first_frontier_point(graph, result, spec, options, is_two_by_two_grid,
                              "on a dp=2 x tp=2 grid");
}

// ZeRO beside BERT's plan with per-op degrees (over the line of both ranks, each keeping the
// tensors the plan cuts as its own; gradients clipped by the whole model's norm from the parts
// and the own shards) trains what the plan trains without ZeRO, with SGD and AdamW.
TEST_F(DistributedRecipe, ZeroBesideABertPlanWithPerOpDegreesTrainsLikeThePlanAlone) {
  TrainConfig vocabulary = planned_bert_config("bert_per_op_vocabulary");
  vocabulary.steps = 1;
  const std::string checkpoint = run_alone(vocabulary).last_checkpoint;
  for (const std::string optimizer : {"sgd", "adamw"}) {
    const std::string base = "bert_per_op_" + optimizer;
    TrainConfig plain = planned_bert_config(base);
    plain.optimizer = optimizer;
    if (optimizer == "adamw") plain.lr = 1e-3;
    plain.plan = shared_plan([&] { return bert_recipe_plan(checkpoint, true); }, base + "_zero0");
    plain.checkpoint_dir = folder(base + "_zero0");
    std::ostringstream log;
    const RecipeResult expected = run_recipe(plain, log);
    expect_zero_stages_like(plain, expected, base, [&](int stage) {
      return shared_plan(
          [&] {
            planner::PlanFile plan = bert_recipe_plan(checkpoint, true);
            plan.zero_stage = stage;
            return plan;
          },
          base + "_zero" + std::to_string(stage));
    });
  }
}

// Under mpirun -np 4: ZeRO's stages beside a BERT dp=2 x tp=2 plan's own ops (parallel::
// ParallelModule, gradients clipped by the whole model's norm) train what the plan trains without
// ZeRO, with SGD and AdamW: the loss, the whole parameters and optimizer state. (The clip at norm
// 1 hides a gradient's scale here; the ResNet-18 test above holds it.)
TEST_F(DistributedRecipe, ZeroBesideABertGridPlanOnFourRanksTrainsLikeThePlanAlone) {
  if (size() != 4) GTEST_SKIP() << "a dp=2 x tp=2 grid needs 4 ranks";
  TrainConfig vocabulary = planned_bert_config("bert_grid_vocabulary");
  vocabulary.steps = 1;
  const std::string checkpoint = run_alone(vocabulary).last_checkpoint;
  for (const std::string optimizer : {"sgd", "adamw"}) {
    TrainConfig plain = planned_bert_config("bert_grid_" + optimizer);
    plain.optimizer = optimizer;
    if (optimizer == "adamw") plain.lr = 1e-3;
    plain.plan = shared_plan([&] { return bert_grid_plan(checkpoint, 0); },
                             "bert_grid_" + optimizer + "_zero0");
    plain.checkpoint_dir = folder("bert_grid_" + optimizer + "_zero0");
    std::ostringstream log;
    const RecipeResult expected = run_recipe(plain, log);
    // The plan itself trains what one process trains.
    TrainConfig alone = plain;
    alone.plan.clear();
    alone.checkpoint_dir = folder("bert_grid_" + optimizer + "_alone");
    const RecipeResult one_process = run_alone(alone);
    if (rank() == 0)
      expect_trained_alike(expected, one_process, optimizer + ": against one process");
    const std::string base = "bert_grid_" + optimizer;
    expect_zero_stages_like(plain, expected, base,
                            [&](int stage) {
                              return shared_plan([&] { return bert_grid_plan(checkpoint, stage); },
                                                 base + "_zero" + std::to_string(stage));
                            },
                            {"the recipes run the plan's ops as priced beside ZeRO"});
  }
}

// A plan that does not fit the run says why and what to make instead, before training.
TEST_F(DistributedRecipe, BertPlanThatDoesNotFitTheRunIsAClearError) {
  const TrainConfig alone = planned_bert_config("bert_plan_errors");
  const RecipeResult expected = run_alone(alone);
  auto fails_with = [&](const std::function<void(planner::PlanFile&)>& change,
                        const std::string& name, const std::string& message,
                        std::optional<double> dropout = 0.0) {
    TrainConfig planned = alone;
    planned.dropout = dropout;
    planned.plan = shared_plan(
        [&] {
          planner::PlanFile plan = bert_recipe_plan(expected.last_checkpoint, false);
          change(plan);
          return plan;
        },
        name);
    planned.checkpoint_dir = folder(name);
    std::ostringstream log;
    EXPECT_TRUE(throws_error([&] { run_recipe(planned, log); }, message)) << name;
    EXPECT_EQ(log.str().find("train step"), std::string::npos) << log.str();
  };
  fails_with([](planner::PlanFile& plan) { plan.devices = 4; }, "bert_plan_four_ranks",
             "is a plan for 4 devices but the job has 2 ranks");
  fails_with([](planner::PlanFile& plan) { plan.model = "bert_mini"; }, "bert_plan_other_model",
             "is a plan for model bert_mini but this run trains bert_tiny");
  fails_with([](planner::PlanFile& plan) { plan.batch = 16; }, "bert_plan_other_batch",
             "--plan: the plan was made for 16 sequences of 128 positions, this run trains "
             "batches of 8 sequences of up to 128 positions");
  fails_with([](planner::PlanFile& plan) { plan.seq = 64; }, "bert_plan_short_sequences",
             "--batch=8 --seq=128");
  // The test corpus's vocabulary has 159 pieces: a plan made for 160 that cuts the word table
  // in 2 does not fit.
  fails_with(
      [](planner::PlanFile& plan) {
        for (planner::PlanFile::Parameter& parameter : plan.parameters)
          if (parameter.name == "bert.embeddings.word_embeddings.weight") {
            parameter.shape = {160, 128};
            parameter.split_dim = 0;
            parameter.parts = 2;
          }
      },
      "bert_plan_vocabulary",
      "--plan: the plan cuts bert.embeddings.word_embeddings.weight in 2 parts along dim 0, but "
      "this run's is [159, 128]");
  // Dropout at 0 runs no op: a plan traced without it does not fit a run with dropout.
  fails_with([](planner::PlanFile&) {}, "bert_plan_dropout",
             "--plan: the plan was traced without dropout, this run trains with it", std::nullopt);
}

TEST_F(DistributedRecipe, CheckpointThatDoesNotSplitIsAnError) {
  // A whole tensor whose split dim is not a multiple of the ranks cannot be sliced.
  CheckpointSharding sharding;
  sharding.split_dims = {{"weight", 0}};
  sharding.parts = 3;
  sharding.part = 0;
  sharding.gather = [](const Tensor& local, int64_t) { return local; };
  const std::string dir = folder("uneven") + "_" + std::to_string(rank());
  auto layer = std::make_shared<nn::Linear>(4, 2);
  optim::SGD sgd(layer->named_parameters(), optim::SGDOptions(0.1));
  save_checkpoint(dir, 1, *layer, sgd);
  nn::Linear target(4, 2);
  optim::SGD target_sgd(target.named_parameters(), optim::SGDOptions(0.1));
  EXPECT_TRUE(throws_error(
      [&] { load_checkpoint(dir + "/step_1", target, target_sgd, nullptr, nullptr, &sharding); },
      "does not split into 3 equal parts"));
}

}  // namespace
}  // namespace tessel::train
