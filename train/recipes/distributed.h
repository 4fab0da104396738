// Recipes over MPI ranks: --dp=N --tp=M (or --plan=FILE from //parallel:plan) lay the ranks out
// as a dp x tp grid; each rank trains on its data-parallel shard of every batch, DDP averages
// gradients over dp, tensor-parallel models split over tp; rank 0 alone prints and writes.
// With --device=cuda (dp only) each rank trains on its own GPU and DDP all-reduces over NCCL.
//   mpirun -np 2 bazel-bin/train/train --recipe=resnet18_fashion_mnist --dp=2
//   mpirun -np 4 bazel-bin/train/train --recipe=resnet18_fashion_mnist --device=cuda  # 4 GPUs
#pragma once

#include <mpi.h>

#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "data/dataset.h"
#include "nn/module.h"
#include "optim/optimizer.h"
#include "parallel/communicator.h"
#include "parallel/planner/plan_io.h"
#include "train/recipes/classification.h"
#include "train/recipes/recipe.h"
#include "train/state/checkpoint.h"

namespace tessel::parallel {
class DistributedDataParallel;
class TensorParallelClassifier;
}  // namespace tessel::parallel

namespace tessel::train {

// The grid a run asks for.
struct ParallelLayout {
  int dp = 1;
  int tp = 1;
  std::optional<planner::PlanFile> plan;  // with --plan
};

// dp x tp for `world_size` ranks: --plan's mesh, else --dp and --tp (one unset fills the other
// ranks; both unset: dp = world_size, tp = 1). A tessel::Error when the product is not the
// number of ranks, or the plan was made for another model or device count.
ParallelLayout resolve_layout(const TrainConfig& config, int world_size);

// This rank's training device in a run of `world_size` > 1 ranks laid out as `layout`:
// --device itself on the CPU; for --device=cuda, cuda:(local_rank % gpu_count()), local_rank
// being this rank's index among the ranks on its node (gpu_count is called only then). A
// tessel::Error "--device=...: ..." for --device=cuda:N (each rank picks its GPU; only "cuda" is
// accepted) and when gpu_count() is 0 or throws (a binary without NCCL). NCCL needs a GPU per
// rank: dp x tp ranks on a node need as many GPUs (fewer make ranks share one, which NCCL refuses).
Device rank_training_device(const TrainConfig& config, const ParallelLayout& layout, int world_size,
                            int local_rank, const std::function<int()>& gpu_count);

// This rank's place in the run. A single process is dp = tp = 1 with no communicators.
struct DistributedRun {
  int rank = 0;
  int world_size = 1;
  int dp = 1, tp = 1;
  int dp_rank = 0, tp_rank = 0;
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
};

// The run in progress (inside run_distributed); a single-process run otherwise.
const DistributedRun& distributed_run();

// Lays out the ranks for `config` (a collective over the training world when it has more than
// one rank), makes the layout current while `body` runs, and hands ranks other than 0 a log that
// drops every line. `body` gets this rank's config: `config` with device set to the rank's GPU
// ("cuda:K") under --device=cuda on several ranks, `config` itself otherwise. A single process
// without --dp/--tp/--plan runs `body` unchanged. With a GPU, the device is checked (and the
// NCCL group made) before `body` runs, so a bad setup fails before any data is read.
RecipeResult run_distributed(
    const TrainConfig& config, std::ostream& log,
    const std::function<RecipeResult(const TrainConfig&, std::ostream&)>& body);

// The MPI communicator recipes run over: MPI_COMM_WORLD unless set (tests train a one-process
// reference inside an MPI job with MPI_COMM_SELF).
void set_training_world(MPI_Comm world);

// ---- classifiers (train_classifier): the module the optimizer updates, and one training step.
// `full` itself, or with tp > 1 a parallel::TensorParallelClassifier over it: batch-split trunk;
// ResNet's classifier split by classes; ShuffleNet's conv5 split by channels and its classifier
// by input features.
std::shared_ptr<nn::Module> parallel_classifier_model(std::shared_ptr<nn::Module> full);

class ParallelClassifier {
 public:
  // `model`: what the optimizer updates (parallel_classifier_model's result, or any
  // single-tensor classifier when tp == 1). Wraps it in DDP over the dp group when dp > 1.
  explicit ParallelClassifier(std::shared_ptr<nn::Module> model);
  ~ParallelClassifier();
  // Forward on this rank's shard of the global batch, cross-entropy weighted so that the average
  // over the dp group is the global batch's mean, optimizer.zero_grad(), backward and gradient
  // reduction. Returns the global batch's mean loss, the same on every rank. `inputs` and
  // `targets` are the global batch, or already this rank's shard with `is_shard` (a loader with
  // DataLoaderOptions::shard(dp_rank, dp)).
  double forward_backward(const Tensor& inputs, const Tensor& targets, optim::Optimizer& optimizer,
                          bool is_shard = false);
  // Loss and accuracy over `dataset`: batches dealt round-robin to the dp ranks and summed.
  EvalResult evaluate(const data::Dataset& dataset, int64_t batch_size = 500);

 private:
  std::shared_ptr<nn::Module> model_;
  parallel::TensorParallelClassifier* tensor_parallel_ = nullptr;
  std::unique_ptr<parallel::DistributedDataParallel> ddp_;
};

// ---- helpers for other recipes
// DDP over the dp group on the run's device for `module` (null when dp == 1): NCCL when the
// ranks train on GPUs. `module` must outlive it.
std::unique_ptr<parallel::DistributedDataParallel> make_ddp(nn::Module& module);
// Means over this rank's shard, each with its count (masked positions, sequences), scaled so
// that averaging gradients over the dp group gives the gradient of the global batch's means:
// mean_i * count_i * dp / global_count_i. Returns the scaled tensors and, in `global_means`, the
// global batch's means (the same on every rank). With dp == 1 the tensors come back unchanged.
std::vector<Tensor> weight_by_global_counts(const std::vector<std::pair<Tensor, int64_t>>& means,
                                            std::vector<double>* global_means);
// clip_grad_norm for a tensor-parallel model: split parameters' squares summed over the tp
// group, replicated ones counted once. Returns the total norm.
double clip_grad_norm_tensor_parallel(nn::Module& model, double max_norm, int64_t group);
// How `model` (what the optimizer updates) is split over the tp group, so that checkpoints hold
// whole tensors and resume with any --tp; nullopt when tp == 1.
std::optional<CheckpointSharding> checkpoint_sharding(nn::Module& model);
// Copies a tensor-parallel model's parameters into the full model of the same names, gathering
// split ones over the tp group (a collective): evaluation runs on the full model.
void gather_into_full_model(nn::Module& sharded, nn::Module& full, int64_t group);

}  // namespace tessel::train
