// MpiCommunicator: the Communicator for CPU tensors over an MPI communicator (the world or a
// split of it). Collectives are non-blocking MPI calls polled against a deadline, so a rank that
// never arrives is named in a tessel::Error instead of hanging every other rank.
//   auto world = MpiCommunicator::world(CommOptions().timeout_s(60));  world->barrier();
#pragma once

#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "parallel/communicator.h"

namespace tessel::parallel {

// How a rank that never arrives is named: each collective has a sequence number per
// communicator; every rank except 0 posts a small non-blocking "arrived at #n" message to rank 0
// on a side communicator when it enters. On timeout rank 0 knows who is missing, throws with
// their ranks and tells the ranks that did arrive, which name them in their own errors (or say
// that rank 0 did not report, when rank 0 is the missing one).
class MpiCommunicator : public Communicator {
 public:
  // Duplicates `comm` (a collective call over its ranks), so Tessel's traffic never matches the
  // program's own MPI calls. MPI must be initialised (run_ranks in parallel/launch.h does it).
  explicit MpiCommunicator(MPI_Comm comm, CommOptions options = {});
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  // Over MPI_COMM_WORLD.
  static std::shared_ptr<MpiCommunicator> world(CommOptions options = {});

  int rank() const override;
  int size() const override;
  const std::string& name() const override;
  Device device() const override;  // cpu
  double timeout_s() const;
  // The duplicated communicator (for splitting into sub-groups).
  MPI_Comm mpi_comm() const;
  // This communicator's ranks as MPI_COMM_WORLD ranks.
  const std::vector<int>& world_ranks() const;

  void all_reduce(const Tensor& tensor, ReduceOp op = ReduceOp::kSum) override;
  std::shared_ptr<Work> all_reduce_async(const Tensor& tensor,
                                         ReduceOp op = ReduceOp::kSum) override;
  void reduce_scatter(const Tensor& input, const Tensor& output,
                      ReduceOp op = ReduceOp::kSum) override;
  void all_gather(const Tensor& input, const Tensor& output) override;
  std::shared_ptr<Work> all_gather_async(const Tensor& input, const Tensor& output) override;
  void broadcast(const Tensor& tensor, int root) override;
  void send(const Tensor& tensor, int destination, int tag = 0) override;
  void recv(const Tensor& tensor, int source, int tag = 0) override;
  void barrier() override;

  struct State;  // shared with the Work objects in flight

 private:
  std::shared_ptr<State> state_;
};

}  // namespace tessel::parallel
