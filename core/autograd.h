// Autograd: a dynamic graph of nodes recorded by the dispatcher, run in reverse topological
// order by the engine. Nodes save only what their op's backward needs (OpDef::save_inputs /
// save_outputs), checked against the storage version counter when used.
//   { NoGradGuard no_grad; w.add_(g, -lr); }  // an update that is not recorded
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/op.h"
#include "core/tensor.h"

namespace tessel {

class GradMode {
 public:
  static bool is_enabled();
  static void set_enabled(bool enabled);
};

// RAII: disables gradient recording in this thread for its scope.
class NoGradGuard {
 public:
  NoGradGuard() : previous_(GradMode::is_enabled()) { GradMode::set_enabled(false); }
  ~NoGradGuard() { GradMode::set_enabled(previous_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// RAII, as libtorch's c10::InferenceMode: InferenceMode guard; (or guard(false) to record again)
// sets gradient recording for its scope. Tessel has no separate inference tensors, so this is
// NoGradGuard with an on/off switch: results carry no history and the graph holds no activations.
class InferenceMode {
 public:
  explicit InferenceMode(bool enabled = true) : previous_(GradMode::is_enabled()) {
    GradMode::set_enabled(!enabled);
  }
  ~InferenceMode() { GradMode::set_enabled(previous_); }
  InferenceMode(const InferenceMode&) = delete;
  InferenceMode& operator=(const InferenceMode&) = delete;
  // True while gradient recording is off (by this guard or NoGradGuard).
  static bool is_enabled() { return !GradMode::is_enabled(); }

 private:
  bool previous_;
};

struct Edge {
  std::shared_ptr<Node> node;  // null: that input needs no gradient
  int input_nr = 0;
};

class Node {
 public:
  virtual ~Node() = default;
  // Gradients of the outputs in, gradients of the inputs out (one per next_edge).
  virtual std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) = 0;
  virtual std::string name() const = 0;
  virtual void release_saved() {}

  std::vector<Edge> next_edges;
  std::vector<OutputSpec> output_specs;
  std::vector<Device> output_devices;
  std::vector<std::vector<GradHook>> pre_hooks;  // per output
  uint64_t sequence_nr = 0;
  // Set by the engine before apply(): release_saved() follows it (no retain_graph).
  bool releases_saved_after_apply = false;
};

// A saved tensor: an alias without history, and the version it had when saved.
struct SavedTensor {
  Tensor tensor;
  uint64_t version = 0;
  static SavedTensor save(const Tensor& tensor);
  Tensor unpack(const std::string& op_name, int index, bool is_output) const;  // checks the version
};

// The backward node of one dispatched op.
class OpNode : public Node {
 public:
  OpNode(const OpDef& op, Attrs attrs) : op_(op), attrs_(std::move(attrs)) {}
  std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) override;
  std::string name() const override { return op_.name + "_backward"; }
  void release_saved() override;

  std::vector<SavedTensor> saved_inputs;
  std::vector<SavedTensor> saved_outputs;
  std::vector<OutputSpec> input_specs;
  std::vector<bool> needs_input_grad;

 private:
  const OpDef& op_;
  Attrs attrs_;
  bool released_ = false;
};

// Sums gradients into a leaf's .grad, then runs its post-accumulate hooks.
class AccumulateGrad : public Node {
 public:
  explicit AccumulateGrad(const std::shared_ptr<TensorImpl>& leaf);
  std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) override;
  std::string name() const override { return "AccumulateGrad"; }

 private:
  std::weak_ptr<TensorImpl> leaf_;
};

// The gradient edge of a tensor: its grad_fn, or its leaf accumulator (created once per leaf).
Edge gradient_edge(const Tensor& tensor);

// Runs backward from `roots` with `grad_roots` (defaults to ones for one-element roots).
void run_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots,
                  bool retain_graph);

// Runs `callback` when the backward pass now running has gone through its whole graph (every
// .grad accumulated), before run_backward returns: like PyTorch's queue_callback. A hook uses it
// to finish work the whole pass feeds, such as a data-parallel gradient reduction. Callbacks run
// in the order queued, under the pass's no-grad mode, and may queue more. A tessel::Error outside
// a backward pass.
void queue_backward_callback(std::function<void()> callback);
// True while this thread runs a backward pass (its hooks and callbacks included).
bool in_backward_pass();

// Gradients of `outputs` with respect to `inputs`, without touching .grad.
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs = {}, bool retain_graph = false);

uint64_t next_sequence_nr();

}  // namespace tessel
