#include "train/engine/run_layout.h"

#include <algorithm>
#include <cstdio>
#include <set>
#include <streambuf>

#include "core/error.h"
#include "ops/ops.h"
#include "parallel/ddp.h"
#include "parallel/process_group.h"
#include "parallel/tensor_parallel.h"
#include "parallel/zero.h"
#include "train/engine/setup.h"

namespace tessel::train {

namespace {

MPI_Comm& training_world() {
  static MPI_Comm world = MPI_COMM_WORLD;
  return world;
}

bool mpi_running() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

// A stream buffer that drops everything: the log of ranks other than 0.
class NullBuffer : public std::streambuf {
 protected:
  int overflow(int c) override { return c == EOF ? 0 : c; }
  std::streamsize xsputn(const char*, std::streamsize count) override { return count; }
};

std::string ranks_text(int world_size) {
  return world_size == 1 ? std::string("this process runs alone (start it with mpirun -np N)")
                         : "the job has " + std::to_string(world_size) + " ranks (mpirun -np " +
                               std::to_string(world_size) + ")";
}

// This rank's index among the ranks of `comm` on its node (a collective over `comm`).
int local_rank_on_node(MPI_Comm comm) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm node = MPI_COMM_NULL;
  TESSEL_CHECK(
      MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node) == MPI_SUCCESS,
      "MPI_Comm_split_type failed while finding this rank's place on its node");
  int local_rank = 0;
  MPI_Comm_rank(node, &local_rank);
  MPI_Comm_free(&node);
  return local_rank;
}

}  // namespace

Device rank_training_device(const TrainConfig& config, const ParallelLayout& layout, int world_size,
                            int local_rank, const std::function<int()>& gpu_count) {
  const Device device = training_device(config);
  if (!device.is_cuda()) return device;
  TESSEL_CHECK(config.device == "cuda", "--device=", config.device,
               ": under mpirun each rank picks its own GPU, cuda:(its rank on the node % the GPUs "
               "it sees), so a GPU index cannot be given; pass --device=cuda (to choose the GPUs, "
               "give each rank its own CUDA_VISIBLE_DEVICES)");
  int gpus = 0;
  try {
    gpus = gpu_count();
  } catch (const Error& error) {
    TESSEL_FAIL("--device=", config.device, ": ", ranks_text(world_size), " as dp ", layout.dp,
                " x tp ", layout.tp, layout.plan ? " from --plan=" + config.plan : std::string(),
                ", whose GPUs exchange tensors over NCCL, but ", error.message());
  }
  TESSEL_CHECK(gpus > 0, "--device=", config.device,
               ": no GPU is visible to this rank (device_count() == 0)");
  return Device::cuda(local_rank % gpus);
}

bool runs_on_one_line(const planner::PlanFile& plan) {
  std::set<std::pair<int, int>> degrees;
  for (const planner::PlanFile::Op& op : plan.ops)
    if (op.dp * op.tp > 1) degrees.insert({op.dp, op.tp});
  return degrees.size() > 1 || plan.mesh_dp * plan.mesh_tp < plan.devices;
}

ParallelLayout resolve_layout(const TrainConfig& config, int world_size) {
  ParallelLayout layout;
  TESSEL_CHECK(config.dp >= 0 && config.tp >= 0,
               "--dp and --tp must be positive, got --dp=", config.dp, " --tp=", config.tp);
  if (!config.plan.empty()) {
    TESSEL_CHECK(config.dp == 0 && config.tp == 0,
                 "--plan sets the dp x tp grid itself: pass either --plan or --dp/--tp");
    layout.plan = planner::read_plan(config.plan);
    const planner::PlanFile& plan = *layout.plan;
    const std::string model = config.model ? *config.model : "";
    TESSEL_CHECK(plan.model == model, "--plan: '", config.plan, "' is a plan for model ",
                 plan.model, " but this run trains ", model,
                 " (make one with: bazel run //parallel:plan -- --model=", model,
                 " --devices=", world_size, " --out=plan.json)");
    TESSEL_CHECK(plan.devices == world_size, "--plan: '", config.plan, "' is a plan for ",
                 plan.devices, " devices but ", ranks_text(world_size));
    layout.dp = plan.mesh_dp;
    layout.tp = plan.mesh_tp;
    TESSEL_CHECK(config.zero == 0 || config.zero == plan.zero_stage, "--plan: '", config.plan,
                 "' sets ZeRO stage ", plan.zero_stage, " itself; pass either --plan or --zero");
    layout.zero = plan.zero_stage;
    if (runs_on_one_line(plan)) {
      // parallel::ParallelModule runs per-op degrees over one group of every rank (and ZeRO
      // over that group: make_run_optimizer).
      layout.dp = 1;
      layout.tp = world_size;
    }
  } else {
    layout.dp = config.dp;
    layout.tp = config.tp;
    if (layout.dp == 0 && layout.tp == 0) {
      layout.dp = world_size;
      layout.tp = 1;
    } else if (layout.dp == 0) {
      TESSEL_CHECK(world_size % layout.tp == 0, "--tp=", layout.tp, " needs a multiple of ",
                   layout.tp, " ranks, but ", ranks_text(world_size));
      layout.dp = world_size / layout.tp;
    } else if (layout.tp == 0) {
      TESSEL_CHECK(world_size % layout.dp == 0, "--dp=", layout.dp, " needs a multiple of ",
                   layout.dp, " ranks, but ", ranks_text(world_size));
      layout.tp = world_size / layout.dp;
    }
  }
  TESSEL_CHECK(static_cast<int64_t>(layout.dp) * layout.tp == world_size, "--dp=", layout.dp,
               " x --tp=", layout.tp, " = ", static_cast<int64_t>(layout.dp) * layout.tp,
               " ranks, but ", ranks_text(world_size), "; choose dp x tp = the rank count");
  if (config.plan.empty()) layout.zero = config.zero;
  const bool one_line = layout.plan && runs_on_one_line(*layout.plan);
  TESSEL_CHECK(layout.zero == 0 || layout.dp > 1 || one_line, "--zero=", layout.zero,
               " shards the optimizer over data-parallel ranks: it needs --dp > 1 (this run: dp ",
               layout.dp, " x tp ", layout.tp, ")");
  TESSEL_CHECK(layout.zero < 3 || config.memory_policy.empty() || config.memory_policy == "none",
               "--zero=3 gathers parameters when ops use them, in the same order on every rank, "
               "which --memory_policy=",
               config.memory_policy,
               "'s recomputation does not keep: use --zero=2 with a memory policy");
  return layout;
}

int64_t RunLayout::shard_begin(int64_t rows) const {
  return parallel::part_start(rows, dp, dp_rank);
}

int64_t RunLayout::shard_rows(int64_t rows) const { return parallel::part_rows(rows, dp, dp_rank); }

Tensor RunLayout::shard(const Tensor& batch) const {
  if (dp == 1) return batch;
  const int64_t rows = batch.size(0);
  return contiguous(narrow(batch, 0, shard_begin(rows), shard_rows(rows)));
}

std::vector<int64_t> RunLayout::shard(const std::vector<int64_t>& indices) const {
  if (dp == 1) return indices;
  const int64_t rows = static_cast<int64_t>(indices.size());
  const int64_t begin = shard_begin(rows);
  return std::vector<int64_t>(indices.begin() + begin, indices.begin() + begin + shard_rows(rows));
}

std::vector<double> RunLayout::sum_over_dp(std::vector<double> values) const {
  if (dp == 1 || values.empty()) return values;
  Tensor buffer = from_vector<double>(values, {static_cast<int64_t>(values.size())});
  dp_group->all_reduce(buffer, parallel::ReduceOp::kSum);
  return buffer.to_vector<double>();
}

std::string RunLayout::layout() const {
  if (!distributed()) return "";
  return "dp=" + std::to_string(dp) + ",tp=" + std::to_string(tp);
}

std::vector<RngState> RunLayout::gather_rng_states() const {
  if (!distributed()) return {};
  // Seed and offset travel as int64 bits (the same 64 bits back on every rank).
  const RngState mine = get_rng_state();
  const Tensor local = from_vector<int64_t>(
      {static_cast<int64_t>(mine.seed), static_cast<int64_t>(mine.offset)}, {1, 2});
  Tensor all = zeros({world->size(), 2}, DType::kInt64);
  world->all_gather(local, all);
  const std::vector<int64_t> values = all.to_vector<int64_t>();
  std::vector<RngState> states(world->size());
  for (size_t r = 0; r < states.size(); ++r) {
    states[r].seed = static_cast<uint64_t>(values[2 * r]);
    states[r].offset = static_cast<uint64_t>(values[2 * r + 1]);
  }
  return states;
}

void set_training_world(MPI_Comm world) { training_world() = world; }

std::ostream& RunLayout::log(std::ostream& main_log) const {
  if (is_main()) return main_log;
  static NullBuffer null_buffer;
  static std::ostream null_log(&null_buffer);
  return null_log;
}

RunLayout lay_out_ranks(const TrainConfig& config, std::ostream& log, TrainConfig* rank_config) {
  *rank_config = config;
  const bool asked = config.dp > 0 || config.tp > 0 || !config.plan.empty();
  int world_size = 1, rank = 0;
  if (mpi_running()) {
    MPI_Comm_size(training_world(), &world_size);
    MPI_Comm_rank(training_world(), &rank);
  }
  // One process: its device is checked (a missing GPU fails here, before any data is read).
  if (world_size == 1) {
    TESSEL_CHECK(config.zero == 0, "--zero=", config.zero,
                 " shards the optimizer over data-parallel ranks: run several under mpirun");
    if (asked) resolve_layout(config, world_size);  // --dp=1 --tp=1 or a one-device plan
    check_training_device(config);
    return RunLayout();
  }
  ParallelLayout layout = resolve_layout(config, world_size);

  // On GPUs each rank takes its own (by its rank on the node); the CPU-side exchanges stay on
  // MPI and DDP's gradients go over NCCL. Every rank fails alike before any data is read.
  const bool on_gpu = training_device(config).is_cuda();
  const int local_rank = on_gpu ? local_rank_on_node(training_world()) : 0;
  const Device device = rank_training_device(config, layout, world_size, local_rank, [] {
    TESSEL_CHECK(parallel::has_device_communicator_backend(DeviceType::kCuda),
                 "this binary has no NCCL: NCCL needs a --config=cuda build (bazel build "
                 "--config=cuda //train:train)");
    return parallel::communicator_device_count(DeviceType::kCuda);
  });
  if (on_gpu) {
    // The rank's GPU is current for the whole process before anything touches a device.
    parallel::use_rank_device(device);
    rank_config->device = device.str();
    check_training_device(*rank_config);
  }

  RunLayout run;
  run.rank = rank;
  run.world_size = world_size;
  run.dp = layout.dp;
  run.tp = layout.tp;
  run.zero = layout.zero;
  run.plan = layout.plan;
  run.device = device;
  {
    parallel::ProcessGrid grid(layout.dp, layout.tp, parallel::CommOptions(), training_world(),
                               device);
    run.dp_rank = grid.dp_index();
    run.tp_rank = grid.tp_index();
    run.world = grid.world();
    run.dp_group = grid.data_parallel();
    run.tp_group = grid.tensor_parallel();
    run.dp_device_group = grid.data_parallel_on_device();
    run.tp_device_group = grid.tensor_parallel_on_device();
  }
  // The tensor-parallel ops and layers move the training device's tensors: NCCL on a GPU.
  if (run.tp > 1) run.tp_group_id = parallel::register_tp_group(run.tp_device_group);

  std::ostream& rank_log = run.log(log);
  rank_log << "parallel: " << world_size << " ranks as dp " << run.dp << " x tp " << run.tp;
  if (run.zero > 0)
    rank_log << ", ZeRO stage " << run.zero << " (each rank keeps its part of the optimizer state"
             << (run.zero == 2   ? " and of the gradients"
                 : run.zero == 3 ? ", the gradients and the parameters, gathered when used"
                                 : "")
             << ")";
  if (run.plan) {
    char numbers[128];
    std::snprintf(numbers, sizeof(numbers), "; predicted %.1f MiB per rank, %.3f s per step",
                  run.plan->predicted_memory / (1024.0 * 1024.0), run.plan->predicted_time);
    rank_log << " from plan " << config.plan << " (" << run.plan->summary << numbers;
    if (run.tp > 1)
      rank_log << "; the recipes run the plan's ops as priced"
               << (run.zero > 0 ? " beside ZeRO" : "");
    if (runs_on_one_line(*run.plan))
      rank_log << "; per-op degrees: each op on the grid its strategy chose (the batch over every "
                  "rank, the model over every rank, or both over part of them), or whole";
    rank_log << ")";
    if (run.plan->memory_policy != "none")
      rank_log << "; the plan expects memory policy " << run.plan->memory_policy
               << " with a budget of " << run.plan->memory_budget / (1024.0 * 1024.0) << " MiB";
  }
  if (on_gpu)
    rank_log << "; one GPU per rank, cuda:(rank on the node % GPUs) (rank 0 on " << run.device.str()
             << "), gradients and tensor-parallel collectives over NCCL";
  rank_log << "; rank 0 alone prints and writes metrics and checkpoints" << std::endl;
  return run;
}

std::unique_ptr<parallel::DistributedDataParallel> make_ddp(const RunLayout& run,
                                                            nn::Module& module) {
  if (run.dp == 1 || run.zero >= 2) return nullptr;
  std::shared_ptr<nn::Module> alias(&module, [](nn::Module*) {});
  return std::make_unique<parallel::DistributedDataParallel>(alias, run.dp_device_group);
}

std::unique_ptr<optim::Optimizer> make_run_optimizer(
    const RunLayout& layout, nn::Module& module,
    const std::function<std::unique_ptr<optim::Optimizer>(const optim::NamedTensors&)>& make) {
  if (layout.zero == 0) return make(module.named_parameters());
  std::shared_ptr<nn::Module> alias(&module, [](nn::Module*) {});
  const auto stage = static_cast<parallel::ZeroStage>(layout.zero);
  if (layout.plan && runs_on_one_line(*layout.plan)) {
    // Per-op degrees over one group of the ranks: ZeRO over it; the tensors the plan cuts over
    // all of them stay each rank's own shards, those cut over part of them are ZeRO's over the
    // ranks holding the same part.
    const auto* split = dynamic_cast<const parallel::SplitParameters*>(&module);
    TESSEL_CHECK(split != nullptr,
                 "make_run_optimizer: a plan with per-op degrees runs its own module");
    const parallel::ZeroCuts cuts = parallel::zero_cuts(*split);
    return std::make_unique<parallel::ZeroOptimizer>(alias, layout.tp_device_group, make, stage,
                                                     cuts.own, cuts.shared);
  }
  return std::make_unique<parallel::ZeroOptimizer>(alias, layout.dp_device_group, make, stage);
}

void ready_for_evaluation(optim::Optimizer& optimizer) {
  if (auto* zero = dynamic_cast<parallel::ZeroOptimizer*>(&optimizer)) {
    zero->broadcast_buffers();
    zero->gather_parameters();
  }
}

std::vector<Tensor> weight_by_global_counts(const RunLayout& run,
                                            const std::vector<std::pair<Tensor, int64_t>>& means,
                                            std::vector<double>* global_means) {
  std::vector<Tensor> weighted;
  global_means->clear();
  if (run.dp == 1) {
    for (const auto& [mean_value, count] : means) {
      weighted.push_back(mean_value);
      global_means->push_back(mean_value.item<double>());
    }
    return weighted;
  }
  std::vector<double> values;
  for (const auto& [mean_value, count] : means) values.push_back(static_cast<double>(count));
  for (const auto& [mean_value, count] : means)
    values.push_back(mean_value.item<double>() * static_cast<double>(count));
  const std::vector<double> sums = run.sum_over_dp(values);
  const size_t n = means.size();
  for (size_t i = 0; i < n; ++i) {
    const double global_count = sums[i];
    TESSEL_CHECK(global_count > 0, "weight_by_global_counts: no example counted in the batch");
    const double weight = static_cast<double>(means[i].second) * run.dp / global_count;
    weighted.push_back(mul(means[i].first, weight));
    global_means->push_back(sums[n + i] / global_count);
  }
  return weighted;
}

}  // namespace tessel::train
