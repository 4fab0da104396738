// NcclCommunicator: the Communicator for CUDA tensors over NCCL, one rank per GPU. The NCCL
// unique id goes from rank 0 to the others over MPI; collectives are queued on the compute
// stream of the tensors' device, so they are ordered with the kernels around them.
//   auto nccl = NcclCommunicator::world(/*device=*/local_rank);  nccl->all_reduce(grad, kMean);
// Code built without --config=cuda reaches it through make_device_communicator (communicator.h):
// linking //parallel:nccl registers it as the backend for DeviceType::kCuda.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "parallel/communicator.h"

namespace tessel::parallel {

// Only built with --config=cuda (//parallel:nccl is empty otherwise).
// Differences from MpiCommunicator, which NCCL imposes:
// - every tensor must be on this communicator's CUDA device;
// - a collective returns once queued on the device's compute stream (work that reads the result
//   on that stream, or copies it to the host, sees it); barrier() and Work::wait() block the
//   host until the queued work is done;
// - send/recv pair by order between two ranks; the tag is checked but not matched;
// - the timeout applies where the host waits (barrier, Work::wait, synchronize): past it the
//   NCCL communicator is aborted and the error names the collective.
class NcclCommunicator : public Communicator {
 public:
  // A collective over `comm`'s ranks: rank 0 creates the NCCL unique id, MPI_Bcast sends it, and
  // every rank joins on CUDA device `device`. MPI must be initialised.
  NcclCommunicator(MPI_Comm comm, int device, CommOptions options = {});
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  // Over MPI_COMM_WORLD on `device`.
  static std::shared_ptr<NcclCommunicator> world(int device, CommOptions options = {});

  int rank() const override;
  int size() const override;
  const std::string& name() const override;
  Device device() const override;  // cuda:N

  void all_reduce(const Tensor& tensor, ReduceOp op = ReduceOp::kSum) override;
  std::shared_ptr<Work> all_reduce_async(const Tensor& tensor,
                                         ReduceOp op = ReduceOp::kSum) override;
  void reduce_scatter(const Tensor& input, const Tensor& output,
                      ReduceOp op = ReduceOp::kSum) override;
  void all_gather(const Tensor& input, const Tensor& output) override;
  void broadcast(const Tensor& tensor, int root) override;
  void send(const Tensor& tensor, int destination, int tag = 0) override;
  void recv(const Tensor& tensor, int source, int tag = 0) override;
  void barrier() override;
  // Blocks until every collective queued so far is done (within the timeout).
  void synchronize();

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace tessel::parallel
