// ZeroOptimizer: ZeRO-style sharding of the optimizer over a data-parallel group. Every
// trainable parameter is cut into `group size` near-equal parts of its flattened elements (the
// layout of Communicator::reduce_scatter); each rank updates its own part, a view of the
// parameter, with an ordinary optimizer (SGD, Adam, AdamW) that holds the optimizer state of that
// part only, then the parts are all-gathered into every rank's parameters.
//
// Stage 1 (optimizer state): gradients are averaged by DistributedDataParallel as usual.
//   DistributedDataParallel ddp(net, group);
//   ZeroOptimizer zero(net, group, [](const optim::NamedTensors& parts) {
//     return std::make_unique<optim::AdamW>(parts, optim::AdamWOptions(1e-3)); });
//   zero.zero_grad();  criterion(ddp.forward(x), y).backward();  zero.step();
// Stage 2 (and gradients): no DDP. Each gradient is reduce-scattered as soon as backward has
// summed it, and the rank keeps only its part: the whole gradient of a parameter is dropped
// before backward moves on.
//   ZeroOptimizer zero(net, group, make_adamw, ZeroStage::kGradients);
//   zero.zero_grad();  criterion(net->forward(x), y).backward();  zero.step();
// Stage 3 (and parameters, FSDP-like): no DDP either. Each rank keeps only its part of every
// parameter; a parameter's bytes are gathered whole when an op first touches them (an all-gather
// per use: the forward op, and the backward op that reads the weight) and dropped when the op
// is done. After the first step every gather also starts the all-gather of the parameter that
// came next last time, so it arrives while the current op computes. Every rank must touch
// parameters in the same order (the same model and batch shapes), so no memory policy may run
// under stage 3 (recomputation differs between ranks); reading parameters on one rank only
// (a checkpoint) needs gather_parameters() on every rank first.
//   ZeroOptimizer zero(net, group, make_adamw, ZeroStage::kParameters);
//   zero.zero_grad();  criterion(net->forward(x), y).backward();  zero.step();
//
// Checkpoints see whole tensors: state_tensors() gathers every part and names the state as the
// plain optimizer would ("fc.weight.exp_avg"), and load_state_tensors() takes such whole tensors,
// so a checkpoint written under any group size (or without ZeRO) resumes under any other.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "nn/module.h"
#include "optim/optimizer.h"
#include "parallel/communicator.h"
#include "parallel/tensor_parallel.h"

namespace tessel::parallel {

enum class ZeroStage {
  kOptimizerState = 1,  // each rank keeps 1/N of the optimizer state; gradients whole (DDP)
  kGradients = 2,       // and 1/N of the gradients, reduce-scattered during backward
  kParameters = 3,      // and 1/N of the parameters, gathered on use and dropped after
};

// Builds the optimizer of this rank's parts, from exactly the tensors it is given (named as the
// parameters they are parts of).
using MakeShardOptimizer =
    std::function<std::unique_ptr<optim::Optimizer>(const optim::NamedTensors& parts)>;

class ZeroOptimizer : public optim::Optimizer {
 public:
  // A collective call over `group`. Every rank must hold the same module (checked); stage 2
  // and 3 start every rank from rank 0's parameters and buffers (stage 1 leaves that to DDP).
  // Trainable parameters must be contiguous and on group->device(); under stage 3 each must own
  // its storage, and no memory policy may be installed.
  // `own` names parameters and buffers that are cut over `group` itself (tensor parallelism on
  // the same ranks: per-op degrees on one line, parallel::ParallelModule): each rank holds its
  // own shard, whole, so ZeRO leaves them to it: never sent, gathered or replaced by rank 0's;
  // the shard optimizer updates a parameter's shard whole with its whole gradient and state,
  // and state_tensors() gives that shard's state as it is.
  // `shared` maps parameters and buffers cut over part of the group's ranks to the ranks that
  // hold the same shard (per-op degrees with a grid over part of the ranks: that grid's dp
  // group). A parameter's shard is ZeRO's over those ranks instead of `group`: cut in their
  // parts, its gradient reduced over them (a share of their sum under take_gradient_shares, as
  // ParallelModule leaves it), gathered within them; state_tensors() gives the shard's state
  // whole, as for `own`. Stages 2 and 3 start such shards, and broadcast_buffers() such buffers,
  // from the first of those ranks.
  ZeroOptimizer(std::shared_ptr<nn::Module> module, std::shared_ptr<Communicator> group,
                const MakeShardOptimizer& make_optimizer,
                ZeroStage stage = ZeroStage::kOptimizerState, const std::set<std::string>& own = {},
                const std::map<std::string, std::shared_ptr<Communicator>>& shared = {});
  ~ZeroOptimizer() override;

  // Updates this rank's part of every parameter that has a gradient (the parts are views of the
  // parameters' elements, so a state dict loaded between steps is seen), then all-gathers the
  // parts (a collective). Stage 1 reads the parameters' averaged gradients;
  // stage 2 the parts that backward reduce-scattered (they add up over several backward passes).
  void step() override;
  // Drops the parameters' gradients and this rank's parts of them.
  void zero_grad() override;
  void set_lr(double lr) override;
  // The shard optimizer's name, so that checkpoints move between ZeRO and plain runs.
  std::string name() const override { return optimizer_->name(); }
  bool collective_state() const override { return true; }

  // Stages 2 and 3 run without DDP, so each rank's buffers (batch norm's running statistics)
  // follow its own rows: this makes them rank 0's of the group, as DDP does before each forward
  // (a collective). Nothing under stage 1.
  void broadcast_buffers();

  // Stages 2 and 3: the gradients of `parameters` are partial sums over `group` (a batch-split
  // trunk beside tensor parallelism: each rank of the group has its rows' part), so each is
  // summed over it before its reduce-scatter. Stage 1 leaves that to the caller, after DDP.
  void sum_gradients_over(std::shared_ptr<Communicator> group,
                          const std::vector<Tensor>& parameters);

  // Stages 2 and 3 under a loss that each rank of the group has already divided by the group's
  // size (parallel::ParallelModule): the gradients of `shares` are each rank's share of their
  // sum over the group, so their parts are reduce-scattered as sums; every other gradient is
  // whole and the same on every rank, so each rank keeps its own part of it without a
  // collective. By default each rank's gradient is the mean over its own rows: averaged. Stage
  // 1 leaves that to the caller (ParallelModule::synchronize_gradients).
  void take_gradient_shares(const std::vector<Tensor>& shares);

  // Stage 3: gathers every parameter whole and keeps it so (a collective) until the next
  // zero_grad() or step(), so that one rank alone may read the module (a checkpoint).
  // state_tensors() does it too. Nothing under stages 1 and 2.
  void gather_parameters();

  // Whole state tensors, gathered from every rank's parts (a collective), named
  // "<parameter name>.<key>" with each parameter's shape: what the plain optimizer returns.
  optim::NamedTensors state_tensors() const override;
  // The parameters, and this rank's parts with their gradients and state.
  std::vector<Tensor> held_tensors() const override;
  // Takes whole state tensors (from state_tensors() here, under another group size, or from a
  // plain optimizer) and keeps this rank's parts. Checked first: nothing changes on an error.
  void load_state_tensors(const optim::NamedTensors& state) override;
  // "lr" and "<parameter name>.step", the same on every rank.
  optim::NamedScalars state_scalars() const override;
  void load_state_scalars(const optim::NamedScalars& scalars) override;

  // optim::clip_grad_norm (2-norm) over the whole model's gradients: under stage 2 from every
  // rank's parts (a collective: their squared norms are summed over the group), so every rank
  // scales its parts alike; the shards of `own` parameters are summed over the group at every
  // stage. Returns the total norm before clipping.
  double clip_grad_norm(double max_norm);
  // The same for a module split over a tensor-parallel group as well (Megatron-LM layers; ZeRO
  // over each dp group of a dp x tp grid): the parameters named in `split` are cut over
  // `tp_group` (parallel::tensor_parallel_split_dims), so their squares add over it too; the
  // others are the same on every rank of it.
  double clip_grad_norm(double max_norm, Communicator& tp_group,
                        const std::set<std::string>& split);

  ZeroStage stage() const { return stage_; }
  // The optimizer over this rank's parts.
  const optim::Optimizer& shard_optimizer() const { return *optimizer_; }
  // This rank's [begin, begin + count) of a parameter's flattened elements, by the parameter's
  // position among the trainable ones.
  int64_t part_begin(size_t parameter) const;
  int64_t part_count(size_t parameter) const;

  // Stage 3: parameter gathers so far, and how many of them a prefetch had started.
  int64_t gathers() const;
  int64_t prefetched_gathers() const;

  struct Parts;   // the parameters, their parts and (stage 2) the gradient hooks' state
  struct Stage3;  // stage 3: the parts the parameters' bytes are gathered from

 protected:
  // Never called: step() updates the parts through the shard optimizer.
  void update(const Tensor& parameter, const Tensor& grad, ParameterState& state) override;

 private:
  double clip_grad_norm_over(double max_norm, Communicator* tp_group,
                             const std::set<std::string>* split);

  std::shared_ptr<nn::Module> module_;
  std::shared_ptr<Communicator> group_;
  ZeroStage stage_;
  std::set<std::string> own_;  // parameters and buffers each rank keeps as its own shard
  std::map<std::string, std::shared_ptr<Communicator>> shared_buffers_;  // and their copies
  std::shared_ptr<Parts> parts_;
  std::shared_ptr<Stage3> stage3_;
  std::unique_ptr<optim::Optimizer> optimizer_;
};

// ZeroOptimizer's `own` and `shared` for ZeRO over the one group of ranks over which a plan with
// per-op degrees cuts `module`'s tensors (parallel::ParallelModule): the tensors cut over all of
// them are each rank's own; those cut over part of them shared with the ranks holding the same
// part.
struct ZeroCuts {
  std::set<std::string> own;
  std::map<std::string, std::shared_ptr<Communicator>> shared;
};
ZeroCuts zero_cuts(const SplitParameters& module);

}  // namespace tessel::parallel
