// CountingCommunicator: forwards every call to another communicator and records it (the kind of
// collective and the bytes it carries), to see what a step really sends: benchmarks report the
// bytes, tests hold a run to the collectives a plan prices.
//   auto counted = std::make_shared<CountingCommunicator>(world);  ...  counted->records
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "parallel/communicator.h"

namespace tessel::parallel {

class CountingCommunicator : public Communicator {
 public:
  // One call: "all_reduce", "reduce_scatter", "all_gather", "broadcast" or "send", and its bytes
  // (reduce_scatter: the whole input; all_gather: the whole output).
  struct Record {
    std::string kind;
    int64_t bytes = 0;
  };

  explicit CountingCommunicator(std::shared_ptr<Communicator> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }
  Device device() const override { return inner_->device(); }
  void all_reduce(const Tensor& t, ReduceOp op) override {
    add("all_reduce", t);
    inner_->all_reduce(t, op);
  }
  std::shared_ptr<Work> all_reduce_async(const Tensor& t, ReduceOp op) override {
    add("all_reduce", t);
    return inner_->all_reduce_async(t, op);
  }
  void reduce_scatter(const Tensor& input, const Tensor& output, ReduceOp op) override {
    add("reduce_scatter", input);
    inner_->reduce_scatter(input, output, op);
  }
  void all_gather(const Tensor& input, const Tensor& output) override {
    add("all_gather", output);
    inner_->all_gather(input, output);
  }
  std::shared_ptr<Work> all_gather_async(const Tensor& input, const Tensor& output) override {
    add("all_gather", output);
    return inner_->all_gather_async(input, output);
  }
  void broadcast(const Tensor& t, int root) override {
    add("broadcast", t);
    inner_->broadcast(t, root);
  }
  void send(const Tensor& t, int destination, int tag) override {
    add("send", t);
    inner_->send(t, destination, tag);
  }
  void recv(const Tensor& t, int source, int tag) override { inner_->recv(t, source, tag); }
  void barrier() override { inner_->barrier(); }

  void reset() {
    records.clear();
    all_reduce_bytes = other_bytes = 0;
  }

  std::vector<Record> records;
  int64_t all_reduce_bytes = 0;  // summed over the records: all-reduces
  int64_t other_bytes = 0;       // and every other kind

 private:
  void add(const char* kind, const Tensor& tensor) {
    const auto bytes = static_cast<int64_t>(tensor.nbytes());
    records.push_back({kind, bytes});
    (records.back().kind == "all_reduce" ? all_reduce_bytes : other_bytes) += bytes;
  }

  std::shared_ptr<Communicator> inner_;
};

}  // namespace tessel::parallel
