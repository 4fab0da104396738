// SubgroupCommunicator: a collective over some of another communicator's ranks, made of that
// communicator's point-to-point messages, so it needs no collective call to create (each rank
// builds the groups it belongs to) and works over any backend that sends and receives. The
// parent sees only sends (a CountingCommunicator around it records them): an all-gather over g
// ranks is g - 1 sends of a g-th of the result from each rank, an all-reduce g - 1 sends of the
// whole tensor (every rank then reduces all parts in rank order, so all get the same bits), a
// broadcast g - 1 sends from the root. Meant for the small groups of a plan's ops (parallel::
// ParallelModule with per-op degrees over part of the ranks), not for large ones.
//   SubgroupCommunicator pair(world, {2, 3}, "tp2");  // on ranks 2 and 3
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "parallel/communicator.h"

namespace tessel::parallel {

class SubgroupCommunicator : public Communicator {
 public:
  // `ranks`: the parent's ranks in this group's rank order; must hold the parent's own rank.
  SubgroupCommunicator(std::shared_ptr<Communicator> parent, std::vector<int> ranks,
                       std::string name);

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(ranks_.size()); }
  const std::string& name() const override { return name_; }
  Device device() const override { return parent_->device(); }
  const std::vector<int>& ranks() const { return ranks_; }

  void all_reduce(const Tensor& tensor, ReduceOp op = ReduceOp::kSum) override;
  std::shared_ptr<Work> all_reduce_async(const Tensor& tensor,
                                         ReduceOp op = ReduceOp::kSum) override;
  void reduce_scatter(const Tensor& input, const Tensor& output,
                      ReduceOp op = ReduceOp::kSum) override;
  void all_gather(const Tensor& input, const Tensor& output) override;
  // Point-to-point messages make no progress between calls, so the gather runs when the work is
  // waited for, writing nothing before (as an MPI gather delivers its bytes then).
  std::shared_ptr<Work> all_gather_async(const Tensor& input, const Tensor& output) override;
  void broadcast(const Tensor& tensor, int root) override;
  void send(const Tensor& tensor, int destination, int tag = 0) override;
  void recv(const Tensor& tensor, int source, int tag = 0) override;
  void barrier() override;

 private:
  // Sends `mine` to every other member and receives theirs into parts[member] (parts[rank()]
  // is left alone), pairwise in a fixed schedule (no two ranks both wait to send).
  void exchange(const Tensor& mine, const std::vector<Tensor>& parts);

  std::shared_ptr<Communicator> parent_;
  std::vector<int> ranks_;
  std::string name_;
  int rank_ = -1;
};

}  // namespace tessel::parallel
