// DistributedDataParallel: data-parallel training like PyTorch's DDP. Parameters and buffers
// start as rank 0's; gradients go into buckets whose averages are all-reduced while backward
// still runs, and a callback the autograd engine runs at the end of backward
// (queue_backward_callback) waits for the last of them, so when loss.backward() returns every
// rank holds the gradient averaged over the group.
//   DistributedDataParallel ddp(net, world);  loss = criterion(ddp.forward(x), y);
//   sgd.zero_grad();  loss.backward();  sgd.step();
// The module lives on the communicator's device: the CPU with MPI, a GPU with
// make_device_communicator(comm, Device::cuda(i)) (NCCL, under --config=cuda).
#pragma once

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/arg.h"
#include "core/tensor.h"
#include "nn/module.h"
#include "parallel/communicator.h"

namespace tessel::parallel {

// One gradient bucket: a contiguous flat buffer holding these parameters' gradients.
struct GradBucket {
  std::vector<size_t> parameters;  // indices into module->parameters(), in backward order
  std::vector<std::string> names;
  DType dtype = DType::kFloat32;
  int64_t bytes = 0;     // the gradients it holds
  int64_t capacity = 0;  // its cap in bytes
};

struct DDPOptions {
  // Bucket capacity in MiB (default 25); the first bucket, filled first in backward, holds at
  // most first_bucket_mb (default 1) so the first all-reduce starts early. A bucket never exceeds
  // its capacity unless one parameter alone is larger, which then has a bucket of its own.
  TESSEL_ARG(double, bucket_cap_mb) = 25.0;
  TESSEL_ARG(double, first_bucket_mb) = 1.0;
  // Parameters the forward pass did not use (found by walking the autograd graph from the
  // outputs) count as zero gradients so their buckets complete; a parameter unused on every
  // rank keeps an undefined gradient. Needs forward() or prepare_for_backward() each step.
  TESSEL_ARG(bool, find_unused_parameters) = false;
  // Copy rank 0's buffers (batch-norm running statistics) to every rank before each forward().
  TESSEL_ARG(bool, broadcast_buffers) = true;
};

// Checks that every rank holds the same module (parameter and buffer counts, shapes, dtypes),
// otherwise an error on every rank naming `who`. A collective call over `group`.
void check_same_module(Communicator& group, const nn::Module& module, const char* who);
// check_same_module, then copies rank 0's parameters and buffers to every rank, except those
// named in `own` (each rank keeps its own: a shard of a tensor cut over the group). The tensors
// must be on group.device().
void start_from_rank0(Communicator& group, nn::Module& module, const char* who,
                      const std::set<std::string>& own = {});

class DistributedDataParallel {
 public:
  // Checks that every rank's module has the same parameters (shapes and dtypes), then copies
  // rank 0's parameters and buffers to every rank: a collective call over `process_group`.
  // Every parameter and buffer must be on process_group->device().
  DistributedDataParallel(std::shared_ptr<nn::Module> module,
                          std::shared_ptr<Communicator> process_group, DDPOptions options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // prepare_forward(), module->forward(input), prepare_for_backward({output}).
  Tensor forward(const Tensor& input);
  Tensor operator()(const Tensor& input) { return forward(input); }

  // For modules whose forward has another signature, call these around it:
  //   ddp.prepare_forward();  auto out = model->forward(ids, types, mask);
  //   ddp.prepare_for_backward({out.mlm_logits, out.nsp_logits});
  // prepare_forward fails if the previous step's reduction never finished (a parameter got no
  // gradient without find_unused_parameters) and broadcasts buffers when asked to.
  void prepare_forward();
  // Starts a step: with find_unused_parameters, finds the parameters `outputs` do not depend
  // on. Does nothing when gradients are off or no output requires grad (evaluation).
  void prepare_for_backward(const std::vector<Tensor>& outputs);

  // Waits for every bucket and writes the averaged gradients into .grad. Runs by itself at the
  // end of every backward pass that reaches the module's parameters (a parameter that received
  // no gradient is an error there, unless find_unused_parameters), so training loops need not
  // call it; calling it again is free.
  void finalize();

  // Makes every rank's buffers equal, e.g. before evaluating or saving: each floating-point
  // buffer (batch norm's running mean and variance) becomes its mean over the ranks, and the
  // others (num_batches_tracked) take rank 0's values; with from_rank0, every buffer takes rank
  // 0's values (what broadcast_buffers does before each forward). DDP itself leaves the ranks'
  // statistics apart between broadcasts, as PyTorch's does. A collective over the process group.
  void sync_buffers(bool from_rank0 = false);

  const std::vector<GradBucket>& buckets() const;
  nn::Module& module() const { return *module_; }
  const std::shared_ptr<Communicator>& process_group() const { return process_group_; }

  struct Reducer;  // the bucket state the gradient hooks update

 private:
  std::shared_ptr<nn::Module> module_;
  std::shared_ptr<Communicator> process_group_;
  DDPOptions options_;
  std::shared_ptr<Reducer> reducer_;
};

}  // namespace tessel::parallel
