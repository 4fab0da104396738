#include "core/autograd.h"

#include <atomic>
#include <map>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "core/autocast.h"
#include "core/builtin_ops.h"

namespace tessel {

namespace {
thread_local bool grad_mode_enabled = true;
// The callbacks of the backward pass this thread runs now; null outside one. A nested pass (a
// backward inside a hook) has its own list.
thread_local std::vector<std::function<void()>>* backward_callbacks = nullptr;
std::atomic<uint64_t> sequence_counter{0};

Tensor ones_like_spec(const OutputSpec& spec, Device device) {
  return dispatch(ops::full, {},
                  Attrs{{"shape", spec.sizes},
                        {"value", 1.0},
                        {"dtype", std::string(dtype_name(spec.dtype))},
                        {"device", device.str()}})[0];
}

// Sums a broadcast gradient back to `sizes`.
Tensor sum_to(const Tensor& grad, const Shape& sizes) {
  if (grad.sizes() == sizes) return grad;
  TESSEL_CHECK(broadcastable_to(sizes, grad.sizes()), "autograd: gradient of shape ",
               shape_str(grad.sizes()), " cannot be reduced to input shape ", shape_str(sizes));
  std::vector<int64_t> dims;
  size_t lead = grad.sizes().size() - sizes.size();
  for (size_t i = 0; i < grad.sizes().size(); ++i) {
    if (i < lead || (sizes[i - lead] == 1 && grad.sizes()[i] != 1))
      dims.push_back(static_cast<int64_t>(i));
  }
  Tensor reduced =
      dims.empty() ? grad : dispatch(ops::sum, {grad}, Attrs{{"dims", dims}, {"keepdim", true}})[0];
  return first_output(dispatch(ops::reshape, {reduced}, Attrs{{"shape", sizes}}));
}

Tensor accumulate(const Tensor& existing, const Tensor& incoming) {
  if (!existing.defined()) return incoming;
  if (!incoming.defined()) return existing;
  const DType dtype = existing.dtype();
  if (dtype == DType::kBFloat16 || dtype == DType::kFloat16) {
    // 16-bit gradients (autocast outputs used twice) are summed in f32 and rounded once.
    auto to = [](const Tensor& t, DType target) {
      return first_output(
          dispatch(ops::to_dtype, {t}, Attrs{{"dtype", std::string(dtype_name(target))}}));
    };
    return to(dispatch(ops::add, {to(existing, DType::kFloat32), to(incoming, DType::kFloat32)})[0],
              dtype);
  }
  // Summed in place where nothing else can see the running sum (no other handle, view or saved
  // copy of its bytes, no graph through it): a residual junction then holds two gradients, not
  // three. The same values as an out-of-place sum.
  const StorageImpl& bytes = *existing.storage();
  if (!existing.requires_grad() && !incoming.requires_grad() &&
      existing.impl_ptr().use_count() == 1 && bytes.user_refs() == 1 && bytes.record_refs() == 0 &&
      existing.sizes() == incoming.sizes() && incoming.dtype() == dtype &&
      existing.device() == incoming.device() && existing.is_contiguous() &&
      existing.storage_offset() == 0 && existing.nbytes() == bytes.nbytes()) {
    Tensor sum = existing;
    sum.add_(incoming);
    return sum;
  }
  return first_output(dispatch(ops::add, {existing, incoming}));
}
}  // namespace

bool GradMode::is_enabled() { return grad_mode_enabled; }
void GradMode::set_enabled(bool enabled) { grad_mode_enabled = enabled; }
uint64_t next_sequence_nr() { return sequence_counter.fetch_add(1); }

void queue_backward_callback(std::function<void()> callback) {
  TESSEL_CHECK(backward_callbacks != nullptr,
               "queue_backward_callback: no backward pass is running in this thread (queue "
               "callbacks from a gradient hook)");
  backward_callbacks->push_back(std::move(callback));
}

bool in_backward_pass() { return backward_callbacks != nullptr; }

SavedTensor SavedTensor::save(const Tensor& tensor) {
  return SavedTensor{tensor.detach(), tensor.version()};
}

Tensor SavedTensor::unpack(const std::string& op_name, int index, bool is_output) const {
  if (!tensor.defined()) return tensor;
  TESSEL_CHECK(tensor.version() == version, "one of the tensors saved for ", op_name, "_backward (",
               is_output ? "output " : "input ", index, ", shape ", shape_str(tensor.sizes()),
               ") was modified in place after it was saved (version ", tensor.version(),
               ", expected ", version, "); use an out-of-place op or clone() it before modifying");
  return tensor;
}

namespace {
// {tensor} when it can serve as the out= tensor of an op whose one output is `output`.
std::vector<Tensor> whole_storage_as(const Tensor& tensor, const OutputSpec& output) {
  if (tensor.sizes() != output.sizes || tensor.dtype() != output.dtype || !tensor.is_contiguous() ||
      tensor.storage_offset() != 0 || tensor.nbytes() != tensor.storage()->nbytes())
    return {};
  return {tensor};
}
}  // namespace

std::vector<Tensor> BackwardContext::reusable_grad(size_t k, const OutputSpec& output) const {
  if (k >= reusable_grad_outputs.size() || !reusable_grad_outputs[k]) return {};
  return whole_storage_as(grad_outputs[k], output);
}

std::vector<Tensor> BackwardContext::reusable_saved_input(size_t i,
                                                          const OutputSpec& output) const {
  if (i >= reusable_saved_inputs.size() || !reusable_saved_inputs[i]) return {};
  return whole_storage_as(saved_inputs[i], output);
}

std::vector<Tensor> OpNode::apply(std::vector<Tensor>&& grad_outputs) {
  bool saves_something = !op_.save_inputs.empty() || !op_.save_outputs.empty();
  TESSEL_CHECK(!(released_ && saves_something), "trying to backward through ", name(),
               " a second time, but its saved tensors were already freed; pass retain_graph=true "
               "to the first "
               "backward()");
  std::vector<Tensor> inputs(saved_inputs.size()), outputs(saved_outputs.size());
  for (size_t i = 0; i < saved_inputs.size(); ++i)
    inputs[i] = saved_inputs[i].unpack(op_.name, static_cast<int>(i), false);
  for (size_t i = 0; i < saved_outputs.size(); ++i)
    outputs[i] = saved_outputs[i].unpack(op_.name, static_cast<int>(i), true);
  // A gradient the engine handed over and nobody else holds may be overwritten by this backward
  // (not while recording a graph of the backward itself).
  std::vector<bool> reusable(grad_outputs.size(), false);
  if (!GradMode::is_enabled()) {
    for (size_t k = 0; k < grad_outputs.size(); ++k) {
      const Tensor& grad = grad_outputs[k];
      reusable[k] = grad.defined() && grad.impl_ptr().use_count() == 1 &&
                    grad.storage()->user_refs() == 1 && !grad.requires_grad();
    }
  }
  // A saved input only this node holds (its one handle is the node's, the other this copy) may be
  // overwritten when the node lets its saved tensors go after this call.
  std::vector<bool> reusable_inputs(inputs.size(), false);
  if (!GradMode::is_enabled() && releases_saved_after_apply) {
    for (size_t i = 0; i < inputs.size(); ++i) {
      const Tensor& input = inputs[i];
      reusable_inputs[i] = input.defined() && input.impl_ptr().use_count() == 2 &&
                           input.storage()->user_refs() == 1 && !input.requires_grad();
    }
  }
  BackwardContext context{grad_outputs,     inputs, outputs,  input_specs,
                          needs_input_grad, attrs_, reusable, reusable_inputs};
  std::vector<Tensor> grads = op_.backward(context);
  TESSEL_CHECK(grads.size() == input_specs.size(), op_.name, " backward returned ", grads.size(),
               " gradients for ", input_specs.size(), " inputs");
  for (size_t i = 0; i < grads.size(); ++i) {
    if (!needs_input_grad[i] || !grads[i].defined()) {
      grads[i] = Tensor();
      continue;
    }
    grads[i] = sum_to(grads[i], input_specs[i].sizes);
    if (grads[i].dtype() != input_specs[i].dtype) grads[i] = grads[i].to(input_specs[i].dtype);
  }
  return grads;
}

void OpNode::release_saved() {
  for (auto& saved : saved_inputs) saved = SavedTensor{};
  for (auto& saved : saved_outputs) saved = SavedTensor{};
  released_ = true;
}

AccumulateGrad::AccumulateGrad(const std::shared_ptr<TensorImpl>& leaf) : leaf_(leaf) {
  output_specs.push_back({leaf->sizes, leaf->dtype});
  output_devices.push_back(leaf->storage->device());
  pre_hooks.resize(1);
}

std::vector<Tensor> AccumulateGrad::apply(std::vector<Tensor>&& grad_outputs) {
  auto leaf = leaf_.lock();
  if (!leaf || !grad_outputs[0].defined()) return {};
  Tensor grad = grad_outputs[0];
  for (const auto& hook : leaf->leaf_hooks) {
    Tensor replaced = hook(grad);
    if (replaced.defined()) grad = replaced;
  }
  if (leaf->grad) {
    Tensor existing(leaf->grad);
    dispatch(ops::add, {existing, grad}, {}, {existing});
  } else {
    // Keep the incoming buffer only when nothing else can see it; otherwise copy.
    bool exclusive = grad.impl_ptr().use_count() <= 2 && grad.storage()->user_refs() == 1 &&
                     grad.is_contiguous() &&
                     grad.numel() * static_cast<int64_t>(grad.element_size()) ==
                         static_cast<int64_t>(grad.storage()->nbytes());
    leaf->grad = (exclusive ? grad.detach() : dispatch(ops::clone, {grad})[0]).impl_ptr();
  }
  Tensor leaf_tensor(leaf);
  for (const auto& hook : leaf->post_accumulate_hooks) hook(leaf_tensor);
  return {};
}

Edge gradient_edge(const Tensor& tensor) {
  TensorImpl* impl = tensor.impl();
  if (impl->grad_fn) return Edge{impl->grad_fn, impl->output_nr};
  auto accumulator = impl->grad_accumulator.lock();
  if (!accumulator) {
    accumulator = std::make_shared<AccumulateGrad>(tensor.impl_ptr());
    accumulator->sequence_nr =
        UINT64_MAX;  // accumulate as soon as ready, so data-parallel buckets fill early
    impl->grad_accumulator = accumulator;
  }
  return Edge{accumulator, 0};
}

namespace {
struct Capture {
  Node* node;
  int input_nr;
  Tensor* destination;
};

// Makes `callbacks` the list queue_backward_callback fills while a pass runs; the previous list
// comes back when the pass ends or throws.
class BackwardCallbackScope {
 public:
  explicit BackwardCallbackScope(std::vector<std::function<void()>>* callbacks)
      : previous_(backward_callbacks) {
    backward_callbacks = callbacks;
  }
  ~BackwardCallbackScope() { backward_callbacks = previous_; }
  BackwardCallbackScope(const BackwardCallbackScope&) = delete;
  BackwardCallbackScope& operator=(const BackwardCallbackScope&) = delete;

 private:
  std::vector<std::function<void()>>* previous_;
};

void run_engine(const std::vector<Edge>& root_edges, const std::vector<Tensor>& root_grads,
                bool retain_graph, const std::vector<Capture>& captures) {
  NoGradGuard no_grad;
  std::vector<std::function<void()>> callbacks;
  BackwardCallbackScope callback_scope(&callbacks);
  // Gradients run in the dtypes of the forward pass, whatever autocast says.
  AutocastGuard no_autocast(DType::kBFloat16, /*enabled=*/false);
  // Count, for every reachable node, the edges that point at it.
  std::unordered_map<Node*, int> dependencies;
  std::unordered_map<Node*, std::shared_ptr<Node>> owners;
  std::vector<Node*> stack;
  for (const auto& edge : root_edges) {
    if (owners.emplace(edge.node.get(), edge.node).second) stack.push_back(edge.node.get());
  }
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    for (const auto& next : node->next_edges) {
      if (!next.node) continue;
      ++dependencies[next.node.get()];
      if (owners.emplace(next.node.get(), next.node).second) stack.push_back(next.node.get());
    }
  }

  std::unordered_map<Node*, std::vector<Tensor>> buffers;
  auto buffer_for = [&](Node* node) -> std::vector<Tensor>& {
    auto& buffer = buffers[node];
    if (buffer.empty()) buffer.resize(node->output_specs.size());
    return buffer;
  };
  for (size_t i = 0; i < root_edges.size(); ++i) {
    auto& slot = buffer_for(root_edges[i].node.get())[root_edges[i].input_nr];
    slot = accumulate(slot, root_grads[i]);
  }
  std::unordered_set<Node*> capture_only;
  if (!captures.empty()) {
    for (auto& [node, owner] : owners)
      if (dynamic_cast<AccumulateGrad*>(node)) capture_only.insert(node);
  }

  auto later_first = [](Node* a, Node* b) { return a->sequence_nr < b->sequence_nr; };
  std::priority_queue<Node*, std::vector<Node*>, decltype(later_first)> ready(later_first);
  std::unordered_set<Node*> queued;
  for (const auto& edge : root_edges) {
    if (dependencies[edge.node.get()] == 0 && queued.insert(edge.node.get()).second)
      ready.push(edge.node.get());
  }
  while (!ready.empty()) {
    Node* node = ready.top();
    ready.pop();
    std::vector<Tensor> grads = std::move(buffer_for(node));
    buffers.erase(node);
    for (size_t k = 0; k < grads.size(); ++k) {
      if (!grads[k].defined()) continue;
      for (const auto& hook : node->pre_hooks[k]) {
        Tensor replaced = hook(grads[k]);
        if (replaced.defined()) grads[k] = replaced;
      }
    }
    for (const auto& capture : captures) {
      if (capture.node == node)
        *capture.destination = accumulate(*capture.destination, grads[capture.input_nr]);
    }
    std::vector<Tensor> input_grads;
    if (!capture_only.count(node)) {
      node->releases_saved_after_apply = !retain_graph;
      input_grads = node->apply(std::move(grads));
      if (!retain_graph) node->release_saved();
    }
    for (size_t i = 0; i < node->next_edges.size(); ++i) {
      const Edge& next = node->next_edges[i];
      if (!next.node) continue;
      if (i < input_grads.size() && input_grads[i].defined()) {
        auto& slot = buffer_for(next.node.get())[next.input_nr];
        slot = accumulate(slot, input_grads[i]);
      }
      if (--dependencies[next.node.get()] == 0) ready.push(next.node.get());
    }
  }
  // By index: a callback may queue another.
  for (size_t i = 0; i < callbacks.size(); ++i) {
    std::function<void()> callback = std::move(callbacks[i]);
    callback();
  }
}

std::vector<Tensor> default_root_grads(const std::vector<Tensor>& roots,
                                       const std::vector<Tensor>& grad_roots) {
  std::vector<Tensor> grads;
  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& root = roots[i];
    TESSEL_CHECK(root.defined() && root.requires_grad(), "backward: tensor ", i,
                 " does not require grad and has no grad_fn");
    Tensor grad = i < grad_roots.size() ? grad_roots[i] : Tensor();
    if (!grad.defined()) {
      TESSEL_CHECK(root.numel() == 1,
                   "backward: a gradient can be created implicitly only for one-element "
                   "tensors, got shape ",
                   shape_str(root.sizes()), "; pass the gradient explicitly");
      grad = ones_like_spec({root.sizes(), root.dtype()}, root.device());
    } else {
      TESSEL_CHECK(grad.sizes() == root.sizes(), "backward: gradient shape ",
                   shape_str(grad.sizes()), " does not match tensor shape ",
                   shape_str(root.sizes()));
    }
    grads.push_back(grad);
  }
  return grads;
}
}  // namespace

void run_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots,
                  bool retain_graph) {
  std::vector<Tensor> grads = default_root_grads(roots, grad_roots);
  std::vector<Edge> edges;
  for (const auto& root : roots) edges.push_back(gradient_edge(root));
  run_engine(edges, grads, retain_graph, {});
}

std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs, bool retain_graph) {
  std::vector<Tensor> grads = default_root_grads(outputs, grad_outputs);
  std::vector<Edge> edges;
  for (const auto& output : outputs) edges.push_back(gradient_edge(output));
  std::vector<Tensor> results(inputs.size());
  std::vector<Capture> captures;
  std::vector<Edge> input_edges;
  for (size_t i = 0; i < inputs.size(); ++i) {
    TESSEL_CHECK(inputs[i].requires_grad(), "grad: input ", i, " does not require grad");
    input_edges.push_back(gradient_edge(inputs[i]));
    captures.push_back({input_edges.back().node.get(), input_edges.back().input_nr, &results[i]});
  }
  run_engine(edges, grads, retain_graph, captures);
  return results;
}

}  // namespace tessel
