// ProcessGrid: the ranks laid out as a 2-D grid, dp (data parallel) x tp (tensor parallel), with
// rank = dp_index * tp + tp_index. The data-parallel group holds the ranks with this rank's
// tp_index; the tensor-parallel group the ranks with its dp_index. Given a GPU, both groups also
// get a communicator for that GPU's tensors (NCCL): DDP's gradients, the tensor-parallel ops.
//   ProcessGrid grid(2, 2);  grid.data_parallel()->all_reduce(grad, ReduceOp::kMean);
//   ProcessGrid gpus(2, 1, {}, MPI_COMM_WORLD, Device::cuda(local_rank));  // --config=cuda
#pragma once

#include <mpi.h>

#include <memory>

#include "parallel/communicator.h"
#include "parallel/mpi_communicator.h"

namespace tessel::parallel {

class ProcessGrid {
 public:
  // A collective call over `world`'s ranks (MPI_Comm_split). dp * tp must equal the number of
  // ranks. The groups get the names "world", "dp" and "tp" and `options`' timeout. `device` is
  // this rank's training device: for a GPU, data_parallel_on_device() and
  // tensor_parallel_on_device() are made over the dp and tp groups with make_device_communicator
  // (an error when this binary has no backend for it).
  ProcessGrid(int dp, int tp, CommOptions options = {}, MPI_Comm world = MPI_COMM_WORLD,
              Device device = Device::cpu());

  int dp_size() const { return dp_size_; }
  int tp_size() const { return tp_size_; }
  int dp_index() const { return dp_index_; }  // this rank's rank in data_parallel()
  int tp_index() const { return tp_index_; }  // this rank's rank in tensor_parallel()

  const std::shared_ptr<Communicator>& world() const { return world_; }
  const std::shared_ptr<Communicator>& data_parallel() const { return data_parallel_; }
  const std::shared_ptr<Communicator>& tensor_parallel() const { return tensor_parallel_; }
  // The data-parallel group for tensors on `device` (its ranks and order are data_parallel()'s):
  // data_parallel() itself on the CPU, an NCCL communicator named "dp" on a GPU. The groups above
  // stay MPI: CPU-side bookkeeping (counts, RNG states, checkpoints, barriers) keeps using them.
  const std::shared_ptr<Communicator>& data_parallel_on_device() const {
    return data_parallel_on_device_;
  }
  // The same for the tensor-parallel group (an NCCL communicator named "tp" on a GPU): the one to
  // register_tp_group for the tensor-parallel ops and layers.
  const std::shared_ptr<Communicator>& tensor_parallel_on_device() const {
    return tensor_parallel_on_device_;
  }

 private:
  int dp_size_;
  int tp_size_;
  int dp_index_ = 0;
  int tp_index_ = 0;
  std::shared_ptr<Communicator> world_;
  std::shared_ptr<Communicator> data_parallel_;
  std::shared_ptr<Communicator> tensor_parallel_;
  std::shared_ptr<Communicator> data_parallel_on_device_;
  std::shared_ptr<Communicator> tensor_parallel_on_device_;
};

}  // namespace tessel::parallel
