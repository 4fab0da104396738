// Where this process stands in a run: under mpirun, --dp=N --tp=M (or --plan=FILE from
// //parallel:plan) lay the ranks out as a dp x tp grid; each rank trains on its data-parallel
// shard of every batch, DDP averages gradients over dp, tensor-parallel models split over tp;
// rank 0 alone prints and writes. With --device=cuda (dp only) each rank trains on its own GPU and
// DDP all-reduces over NCCL. A single process is dp = tp = 1 with no communicators. Recipes get
// the layout as an argument (run_recipe makes it).
//   TrainConfig rank_config;  RunLayout layout = lay_out_ranks(config, log, &rank_config);
//   auto ddp = make_ddp(layout, model);  Tensor rows = layout.shard(batch);
//   mpirun -np 2 bazel-bin/train/train --recipe=resnet18_fashion_mnist --dp=2
#pragma once

#include <mpi.h>

#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "core/device.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "nn/module.h"
#include "optim/optimizer.h"
#include "parallel/communicator.h"
#include "parallel/planner/plan_io.h"
#include "train/engine/config.h"

namespace tessel::parallel {
class DistributedDataParallel;
}  // namespace tessel::parallel

namespace tessel::train {

// The grid a run asks for.
struct ParallelLayout {
  int dp = 1;
  int tp = 1;
  int zero = 0;                           // --zero, or the plan's ZeRO stage
  std::optional<planner::PlanFile> plan;  // with --plan
};

// Whether a plan runs over one group of every rank (parallel::ParallelModule's line): its ops
// split at more than one pair of degrees (a plan of --per_op_degrees), or its grid holds fewer
// ranks than the plan's devices (every op whole on every rank, a frontier point too).
bool runs_on_one_line(const planner::PlanFile& plan);

// dp x tp for `world_size` ranks: --plan's mesh, else --dp and --tp (one unset fills the other
// ranks; both unset: dp = world_size, tp = 1), and the ZeRO stage (--plan's or --zero). A plan
// with per-op degrees lays the ranks out as one line, dp 1 x tp = world_size, over which
// each of its ops splits the batch or the model, or runs whole (ZeRO then runs over that line).
// A tessel::Error when the product is not the number of ranks, the plan was made for another
// model or device count, or ZeRO is asked for without dp > 1 (outside per-op degrees).
ParallelLayout resolve_layout(const TrainConfig& config, int world_size);

// This rank's training device in a run of `world_size` > 1 ranks laid out as `layout`:
// --device itself on the CPU; for --device=cuda, cuda:(local_rank % gpu_count()), local_rank
// being this rank's index among the ranks on its node (gpu_count is called only then). A
// tessel::Error "--device=...: ..." for --device=cuda:N (each rank picks its GPU; only "cuda" is
// accepted) and when gpu_count() is 0 or throws (a binary without NCCL). NCCL needs a GPU per
// rank: dp x tp ranks on a node need as many GPUs (fewer make ranks share one, which NCCL refuses).
Device rank_training_device(const TrainConfig& config, const ParallelLayout& layout, int world_size,
                            int local_rank, const std::function<int()>& gpu_count);

// This rank's place in the run.
struct RunLayout {
  int rank = 0;
  int world_size = 1;
  int dp = 1, tp = 1;
  int dp_rank = 0, tp_rank = 0;
  int zero = 0;  // --zero: the ZeRO stage over the dp group (0 when dp == 1)
  // MPI communicators (CPU tensors): counts, evaluation sums, RNG states, checkpoints, barriers.
  std::shared_ptr<parallel::Communicator> world, dp_group, tp_group;
  // Where this rank trains (rank_training_device), and the dp and tp groups for tensors there:
  // the MPI groups themselves on the CPU, NCCL on a GPU. DDP's gradient all-reduces use
  // dp_device_group; the tensor-parallel ops tp_device_group (registered as tp_group_id).
  Device device = Device::cpu();
  std::shared_ptr<parallel::Communicator> dp_device_group, tp_device_group;
  int64_t tp_group_id = -1;  // parallel::register_tp_group(tp_device_group)'s id when tp > 1
  std::optional<planner::PlanFile> plan;

  bool is_main() const { return rank == 0; }
  bool distributed() const { return world_size > 1; }
  // Rows [shard_begin, shard_begin + shard_rows) of a global batch of `rows` are this
  // data-parallel rank's (near-equal parts in rank order, as Communicator::part_rows).
  int64_t shard_begin(int64_t rows) const;
  int64_t shard_rows(int64_t rows) const;
  // This rank's rows of a global batch (the batch itself when dp == 1).
  Tensor shard(const Tensor& batch) const;
  std::vector<int64_t> shard(const std::vector<int64_t>& indices) const;
  // Element-wise sums over the data-parallel group (the values themselves when dp == 1).
  std::vector<double> sum_over_dp(std::vector<double> values) const;
  // The grid as checkpoints record it ("dp=2,tp=1"); "" for a single process.
  std::string layout() const;
  // Every rank's RNG state in rank order (a collective over the world); empty for a single
  // process. Checkpoints keep them, so each rank resumes its own random-number stream.
  std::vector<RngState> gather_rng_states() const;
  // `main_log` on rank 0, a stream that drops everything on the other ranks.
  std::ostream& log(std::ostream& main_log) const;
};

// Lays out the ranks for `config` (a collective over the training world when it has more than
// one rank) and says so in `log` (rank 0). `rank_config` gets `config` with device set to the
// rank's GPU ("cuda:K") under --device=cuda on several ranks, `config` itself otherwise. A single
// process without --dp/--tp/--plan gets the one-process layout. The training device is checked
// (and the NCCL group made) here, so a bad setup fails before any data is read.
RunLayout lay_out_ranks(const TrainConfig& config, std::ostream& log, TrainConfig* rank_config);

// The MPI communicator lay_out_ranks lays out: MPI_COMM_WORLD unless set (tests train a
// one-process reference inside an MPI job with MPI_COMM_SELF).
void set_training_world(MPI_Comm world);

// DDP over the dp group on the layout's device for `module` (null when dp == 1, and under ZeRO
// stages 2 and 3, whose optimizer reduces the gradients itself): NCCL when the ranks train on GPUs.
// `module` must outlive it.
std::unique_ptr<parallel::DistributedDataParallel> make_ddp(const RunLayout& layout,
                                                            nn::Module& module);

// The run's optimizer: `make` over the module's parameters, or under --zero a
// parallel::ZeroOptimizer over the dp group whose parts `make` optimizes (a collective then);
// under a plan with per-op degrees over the line of every rank, each keeping the tensors the plan
// cuts over it as its own shards (`module` is then the plan's parallel::SplitParameters).
// `module` must outlive it.
std::unique_ptr<optim::Optimizer> make_run_optimizer(
    const RunLayout& layout, nn::Module& module,
    const std::function<std::unique_ptr<optim::Optimizer>(const optim::NamedTensors&)>& make);

// Before an evaluation in which ranks run different numbers of batches (each its share of the
// test set), under ZeRO (`optimizer` a parallel::ZeroOptimizer; collectives): stages 2 and 3 make
// every rank's buffers rank 0's (as DDP does), and stage 3 gathers the parameters whole now, so
// that the evaluation needs no collective (they go again at the next zero_grad()). Nothing
// otherwise.
void ready_for_evaluation(optim::Optimizer& optimizer);

// Means over this rank's shard, each with its count (masked positions, sequences), scaled so
// that averaging gradients over the dp group gives the gradient of the global batch's means:
// mean_i * count_i * dp / global_count_i. Returns the scaled tensors and, in `global_means`, the
// global batch's means (the same on every rank). With dp == 1 the tensors come back unchanged.
std::vector<Tensor> weight_by_global_counts(const RunLayout& layout,
                                            const std::vector<std::pair<Tensor, int64_t>>& means,
                                            std::vector<double>* global_means);

}  // namespace tessel::train
