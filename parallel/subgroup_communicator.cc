#include "parallel/subgroup_communicator.h"

#include <algorithm>
#include <functional>

#include "core/autograd.h"
#include "core/error.h"
#include "ops/ops.h"

namespace tessel::parallel {

namespace {
Tensor empty_like(const Tensor& t) {
  return empty(t.sizes(), TensorOptions(t.dtype()).device(t.device()));
}

// A collective run when it is waited for.
class DeferredWork : public Work {
 public:
  explicit DeferredWork(std::function<void()> run) : run_(std::move(run)) {}
  bool poll() override { return !run_; }
  void wait() override {
    if (!run_) return;
    std::function<void()> run = std::move(run_);
    run_ = nullptr;
    run();
  }

 private:
  std::function<void()> run_;
};
}  // namespace

SubgroupCommunicator::SubgroupCommunicator(std::shared_ptr<Communicator> parent,
                                           std::vector<int> ranks, std::string name)
    : parent_(std::move(parent)), ranks_(std::move(ranks)), name_(std::move(name)) {
  TESSEL_CHECK(parent_ != nullptr, "SubgroupCommunicator: no parent communicator");
  for (size_t i = 0; i < ranks_.size(); ++i) {
    TESSEL_CHECK(ranks_[i] >= 0 && ranks_[i] < parent_->size(), "SubgroupCommunicator '", name_,
                 "': rank ", ranks_[i], " is not one of the ", parent_->size(), " ranks of '",
                 parent_->name(), "'");
    TESSEL_CHECK(std::count(ranks_.begin(), ranks_.end(), ranks_[i]) == 1, "SubgroupCommunicator '",
                 name_, "': rank ", ranks_[i], " is listed twice");
    if (ranks_[i] == parent_->rank()) rank_ = static_cast<int>(i);
  }
  TESSEL_CHECK(rank_ >= 0, "SubgroupCommunicator '", name_, "': this rank (", parent_->rank(),
               " of '", parent_->name(), "') is not in the group");
}

void SubgroupCommunicator::exchange(const Tensor& mine, const std::vector<Tensor>& parts) {
  // Round r pairs each member with (r - rank) mod size; of each pair the lower rank sends first.
  for (int round = 0; round < size(); ++round) {
    const int member = ((round - rank_) % size() + size()) % size();
    if (member == rank_) continue;
    const int peer = ranks_[static_cast<size_t>(member)];
    if (rank_ < member) parent_->send(mine, peer);
    parent_->recv(parts[static_cast<size_t>(member)], peer);
    if (rank_ > member) parent_->send(mine, peer);
  }
}

void SubgroupCommunicator::all_reduce(const Tensor& tensor, ReduceOp op) {
  TESSEL_CHECK(tensor.dtype() != DType::kBool, "SubgroupCommunicator '", name_,
               "': all_reduce of bool tensors is not supported");
  TESSEL_CHECK(op != ReduceOp::kMean || is_floating(tensor.dtype()), "SubgroupCommunicator '",
               name_, "': a mean all_reduce needs a floating-point tensor");
  if (size() == 1) return;
  NoGradGuard no_grad;
  const Tensor mine = tensor.contiguous().clone();
  std::vector<Tensor> parts;
  for (int member = 0; member < size(); ++member)
    parts.push_back(member == rank_ ? mine : empty_like(mine));
  exchange(mine, parts);
  // Every member reduces the same parts in the same order: the same bits everywhere.
  Tensor result = parts[0];
  for (size_t member = 1; member < parts.size(); ++member) {
    if (op == ReduceOp::kMax) {
      result = maximum(result, parts[member]);
    } else if (op == ReduceOp::kMin) {
      result = minimum(result, parts[member]);
    } else {
      result = add(result, parts[member]);
    }
  }
  if (op == ReduceOp::kMean) result = mul(result, 1.0 / size());
  Tensor target = tensor;
  target.copy_(result);
}

std::shared_ptr<Work> SubgroupCommunicator::all_reduce_async(const Tensor& tensor, ReduceOp op) {
  all_reduce(tensor, op);
  return finished_work();
}

void SubgroupCommunicator::reduce_scatter(const Tensor& input, const Tensor& output, ReduceOp op) {
  NoGradGuard no_grad;
  Tensor reduced = input.contiguous().clone();
  all_reduce(reduced, op);
  const int64_t rows = input.size(0);
  Tensor target = output;
  target.copy_(narrow(reduced, 0, part_start(rows, size(), rank_), part_rows(rows, size(), rank_)));
}

void SubgroupCommunicator::all_gather(const Tensor& input, const Tensor& output) {
  NoGradGuard no_grad;
  const int64_t rows = output.size(0);
  TESSEL_CHECK(input.size(0) == part_rows(rows, size(), rank_), "SubgroupCommunicator '", name_,
               "': all_gather of ", input.size(0), " rows into ", rows, " over ", size(), " ranks");
  const bool dense = output.is_contiguous();
  Tensor gathered = dense ? output : empty_like(output);
  std::vector<Tensor> parts;
  for (int member = 0; member < size(); ++member)
    parts.push_back(
        narrow(gathered, 0, part_start(rows, size(), member), part_rows(rows, size(), member)));
  Tensor own = parts[static_cast<size_t>(rank_)];
  own.copy_(input);
  exchange(input.contiguous(), parts);
  if (!dense) {
    Tensor target = output;
    target.copy_(gathered);
  }
}

std::shared_ptr<Work> SubgroupCommunicator::all_gather_async(const Tensor& input,
                                                             const Tensor& output) {
  // The communicator must outlive the work, as for any communicator's.
  return std::make_shared<DeferredWork>([this, input, output] { all_gather(input, output); });
}

void SubgroupCommunicator::broadcast(const Tensor& tensor, int root) {
  TESSEL_CHECK(root >= 0 && root < size(), "SubgroupCommunicator '", name_, "': root ", root,
               " is not one of its ", size(), " ranks");
  if (rank_ == root) {
    const Tensor data = tensor.contiguous();
    for (int member = 0; member < size(); ++member)
      if (member != root) parent_->send(data, ranks_[static_cast<size_t>(member)]);
    return;
  }
  if (tensor.is_contiguous()) {
    parent_->recv(tensor, ranks_[static_cast<size_t>(root)]);
    return;
  }
  NoGradGuard no_grad;
  Tensor received = empty_like(tensor);
  parent_->recv(received, ranks_[static_cast<size_t>(root)]);
  Tensor target = tensor;
  target.copy_(received);
}

void SubgroupCommunicator::send(const Tensor& tensor, int destination, int tag) {
  TESSEL_CHECK(destination >= 0 && destination < size(), "SubgroupCommunicator '", name_,
               "': send to rank ", destination, " of ", size());
  parent_->send(tensor, ranks_[static_cast<size_t>(destination)], tag);
}

void SubgroupCommunicator::recv(const Tensor& tensor, int source, int tag) {
  TESSEL_CHECK(source >= 0 && source < size(), "SubgroupCommunicator '", name_,
               "': recv from rank ", source, " of ", size());
  parent_->recv(tensor, ranks_[static_cast<size_t>(source)], tag);
}

void SubgroupCommunicator::barrier() {
  NoGradGuard no_grad;
  const TensorOptions options = TensorOptions(DType::kFloat32).device(device());
  const Tensor token = zeros({1}, options);
  std::vector<Tensor> parts;
  for (int member = 0; member < size(); ++member)
    parts.push_back(member == rank_ ? token : zeros({1}, options));
  exchange(token, parts);
}

}  // namespace tessel::parallel
