#include "parallel/planner/graph.h"

#include <algorithm>
#include <map>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "core/op.h"
#include "parallel/planner/views.h"

namespace tessel::planner {

std::vector<std::vector<std::pair<int, int>>> Graph::consumers() const {
  std::vector<std::vector<std::pair<int, int>>> result(tensors.size());
  for (const TracedOp& op : ops)
    for (size_t slot = 0; slot < op.inputs.size(); ++slot)
      if (op.inputs[slot] >= 0) result[op.inputs[slot]].emplace_back(op.id, static_cast<int>(slot));
  return result;
}

std::string Graph::op_histogram() const {
  std::vector<std::pair<std::string, int>> counts;
  for (const TracedOp& op : ops) {
    auto found = std::find_if(counts.begin(), counts.end(),
                              [&](const auto& entry) { return entry.first == op.name; });
    if (found == counts.end())
      counts.emplace_back(op.name, 1);
    else
      ++found->second;
  }
  std::ostringstream text;
  for (size_t i = 0; i < counts.size(); ++i)
    text << (i ? ", " : "") << counts[i].first << " x" << counts[i].second;
  return text.str();
}

int64_t Graph::parameter_count() const {
  int64_t count = 0;
  for (const TracedTensor& tensor : tensors)
    if (tensor.is_parameter()) count += shape_numel(tensor.sizes);
  return count;
}

namespace {

// Restores the previous trace hook when the trace ends, even by an exception.
class TraceHookScope {
 public:
  explicit TraceHookScope(TraceHook hook) : previous_(set_trace_hook(std::move(hook))) {}
  ~TraceHookScope() { set_trace_hook(std::move(previous_)); }
  TraceHookScope(const TraceHookScope&) = delete;
  TraceHookScope& operator=(const TraceHookScope&) = delete;

 private:
  TraceHook previous_;
};

class Tracer {
 public:
  Tracer(const std::vector<std::pair<std::string, Tensor>>& parameters,
         const std::vector<TraceInput>& inputs, int64_t batch_size) {
    graph_.batch_size = batch_size;
    for (const auto& [name, tensor] : parameters) {
      if (!tensor.defined() || tensor_of_.count(tensor.impl())) continue;  // tied: first name
      TracedTensor& traced = add_tensor(tensor);
      traced.parameter = name;
      traced.requires_grad = true;
    }
    for (const TraceInput& input : inputs) {
      TESSEL_CHECK(input.tensor.defined(), "trace_graph: input '", input.name, "' is undefined");
      TracedTensor& traced = add_tensor(input.tensor);
      traced.input = input.name;
      traced.has_batch = input.batch;
      traced.requires_grad = input.tensor.requires_grad();
    }
  }

  void on_call(const OpDef& op, const std::vector<Tensor>& inputs,
               const std::vector<Tensor>& outputs, const Attrs& attrs) {
    for (const Tensor& t : inputs) keep_alive_.push_back(t);
    for (const Tensor& t : outputs) keep_alive_.push_back(t);
    if (op.flags.view) {
      if (outputs.empty() || inputs.empty() || !inputs[0].defined()) return;
      // A view that had to copy (reshape of a permuted tensor) views the copy its inner
      // contiguous made, an op of its own: what reads it reads that op's result, which carries
      // the gradient (the copy was made inside the view, where autograd records nothing).
      auto copy = made_storage_.find(outputs[0].storage().get());
      ViewStep step{op.name, attrs, inputs[0].sizes(), outputs[0].sizes(), 0, false};
      if (outputs[0].storage() != inputs[0].storage() && copy != made_storage_.end()) {
        root_of_[outputs[0].impl()] = copy->second;
        TracedTensor& made = graph_.tensors[static_cast<size_t>(tensor_of_.at(copy->second))];
        made.requires_grad = made.requires_grad || outputs[0].requires_grad();
        step.source = value_id(copy->second);
        views_of_[outputs[0].impl()] = {step};
      } else {
        root_of_[outputs[0].impl()] = root(inputs[0].impl());
        std::vector<ViewStep> chain = views_of(inputs[0].impl());
        step.source = value_id(inputs[0].impl());
        chain.push_back(std::move(step));
        views_of_[outputs[0].impl()] = std::move(chain);
      }
      return;
    }
    TracedOp traced;
    traced.id = static_cast<int>(graph_.ops.size());
    traced.name = op.name;
    traced.def = &op;
    traced.attrs = attrs;
    traced.saved_inputs = op.save_inputs;
    traced.saved_outputs = op.save_outputs;
    traced.differentiable = op.backward != nullptr;
    bool any_batch = false;
    double io_bytes = 0;
    for (const Tensor& input : inputs) {
      if (!input.defined()) {
        traced.inputs.push_back(-1);
        traced.input_shapes.emplace_back();
        traced.input_has_batch.push_back(false);
        traced.input_views.emplace_back();
        continue;
      }
      const int id = tensor_for(input);
      const bool batch = graph_.tensors[id].has_batch && batch_major(input);
      traced.inputs.push_back(id);
      traced.input_shapes.push_back(input.sizes());
      traced.input_has_batch.push_back(batch);
      std::vector<ViewStep> chain = views_of(input.impl());
      for (ViewStep& step : chain) step.first = viewed_.insert(step.source).second;
      traced.input_views.push_back(std::move(chain));
      any_batch = any_batch || batch;
      io_bytes += static_cast<double>(input.nbytes());
    }
    for (size_t k = 0; k < outputs.size(); ++k) {
      const Tensor& output = outputs[k];
      TracedTensor& result = add_tensor(output);
      root_of_.erase(output.impl());  // an out= view written in place: now its own value
      views_of_.erase(output.impl());
      tensor_of_[output.impl()] = result.id;
      made_storage_[output.storage().get()] = output.impl();
      result.producer = traced.id;
      result.producer_slot = static_cast<int>(k);
      result.has_batch = any_batch && batch_major(output);
      result.requires_grad = output.requires_grad();
      traced.outputs.push_back(result.id);
      traced.output_shapes.push_back(output.sizes());
      io_bytes += static_cast<double>(output.nbytes());
    }
    traced.bytes = io_bytes;
    place_model_split(traced);
    if (op.cost) {
      try {
        OpCost cost = op.cost(inputs, outputs, attrs);
        traced.flops = cost.flops;
        if (cost.bytes > 0) traced.bytes = cost.bytes;
      } catch (const Error&) {
        // A cost rule that needs values cannot run on meta tensors: keep the byte estimate.
      }
    }
    graph_.ops.push_back(std::move(traced));
  }

  Graph take() { return std::move(graph_); }

 private:
  TracedTensor& add_tensor(const Tensor& tensor) {
    TracedTensor traced;
    traced.id = static_cast<int>(graph_.tensors.size());
    traced.sizes = tensor.sizes();
    traced.dtype = tensor.dtype();
    traced.bytes = static_cast<int64_t>(tensor.nbytes());
    tensor_of_[tensor.impl()] = traced.id;
    keep_alive_.push_back(tensor);
    graph_.tensors.push_back(std::move(traced));
    return graph_.tensors.back();
  }

  // Where a model split of each output lies, as the runtime places one when the op and those
  // before it split the model (in two: a place survives a view whatever the parts when it
  // survives it in two and they divide the dims): that of the first input still split after its
  // views, unless the op's kind forces its own.
  void place_model_split(const TracedOp& op) {
    const ParallelSplit split = op.def->planner.split;
    SplitKind kind = SplitKind::kFeature;
    if (split == ParallelSplit::kLinearWeight || split == ParallelSplit::kEmbeddingTable ||
        split == ParallelSplit::kConvChannels)
      kind = SplitKind::kColumn;
    if (split == ParallelSplit::kBatchedHeads) kind = SplitKind::kHeads;
    if (split == ParallelSplit::kLossClasses || split == ParallelSplit::kSoftmaxLossClasses)
      kind = SplitKind::kVocab;
    std::optional<SplitPlace> inherited;
    int64_t axis_size = 0;
    for (size_t slot = 0; slot < op.inputs.size() && !inherited; ++slot) {
      if (op.inputs[slot] < 0) continue;
      const TracedTensor& input = graph_.tensors[static_cast<size_t>(op.inputs[slot])];
      if (input.is_parameter() || input.model_axis < 0) continue;
      std::optional<SplitPlace> place = SplitPlace{false, input.model_axis, input.model_period};
      for (const ViewStep& step : op.input_views[slot])
        if (place) place = place_through_view(step, *place, 1, 2);
      if (place) {
        inherited = place;
        axis_size = op.input_shapes[slot][static_cast<size_t>(place->axis)];
      }
    }
    if (op.outputs.empty() || op.input_shapes.empty()) return;
    const int64_t rank = static_cast<int64_t>(op.input_shapes[0].size());
    const Shape& first = op.output_shapes[0];
    const int64_t forced =
        forced_model_axis(split, kind, op.attrs, rank, static_cast<int64_t>(first.size()),
                          inherited ? inherited->axis : -1);
    const int64_t axis = forced >= 0 ? forced : inherited->axis;
    if (axis < 0 || axis >= static_cast<int64_t>(first.size())) return;
    for (size_t k = 0; k < op.outputs.size(); ++k) {
      TracedTensor& output = graph_.tensors[static_cast<size_t>(op.outputs[k])];
      const Shape& sizes = op.output_shapes[k];
      if (sizes.size() == first.size()) {
        output.model_axis = axis;
        if (forced < 0 && sizes[static_cast<size_t>(axis)] == axis_size)
          output.model_period = inherited->period;
      } else {
        // Further outputs of fewer dims (batch norm's per-channel statistics): along the dim as
        // long as the first output's split one.
        auto same = std::find(sizes.begin(), sizes.end(), first[static_cast<size_t>(axis)]);
        if (same != sizes.end()) output.model_axis = same - sizes.begin();
      }
    }
  }

  int64_t value_id(TensorImpl* impl) {
    return value_ids_.try_emplace(impl, static_cast<int64_t>(value_ids_.size())).first->second;
  }

  std::vector<ViewStep> views_of(TensorImpl* impl) const {
    auto found = views_of_.find(impl);
    return found == views_of_.end() ? std::vector<ViewStep>{} : found->second;
  }

  TensorImpl* root(TensorImpl* impl) const {
    for (auto found = root_of_.find(impl); found != root_of_.end(); found = root_of_.find(impl))
      impl = found->second;
    return impl;
  }

  // The tensor an input reads (through views); one seen for the first time (a buffer, a
  // constant made outside the trace) becomes a source without a producer.
  int tensor_for(const Tensor& input) {
    TensorImpl* source = root(input.impl());
    auto found = tensor_of_.find(source);
    if (found != tensor_of_.end()) return found->second;
    return add_tensor(input).id;
  }

  // Dim 0 is a whole multiple of the batch and the outermost dimension (largest stride), so
  // a split of dim 0 is a split of the batch.
  bool batch_major(const Tensor& tensor) const {
    const int64_t batch = graph_.batch_size;
    if (tensor.dim() == 0 || tensor.size(0) < batch || tensor.size(0) % batch != 0) return false;
    for (int64_t d = 1; d < tensor.dim(); ++d)
      if (tensor.size(d) > 1 && tensor.stride(d) > tensor.stride(0)) return false;
    return true;
  }

  Graph graph_;
  std::unordered_map<TensorImpl*, int> tensor_of_;
  std::unordered_map<TensorImpl*, TensorImpl*> root_of_;              // view -> what it views
  std::unordered_map<const StorageImpl*, TensorImpl*> made_storage_;  // -> the op result on it
  std::unordered_map<TensorImpl*, std::vector<ViewStep>> views_of_;   // view -> its chain
  std::unordered_map<TensorImpl*, int64_t> value_ids_;                // ViewStep::source
  std::unordered_set<int64_t> viewed_;  // sources a read view has viewed
  std::vector<Tensor> keep_alive_;      // no address is reused while the trace runs
};

}  // namespace

Graph trace_graph(const std::function<void()>& forward,
                  const std::vector<std::pair<std::string, Tensor>>& parameters,
                  const std::vector<TraceInput>& inputs, int64_t batch_size) {
  TESSEL_CHECK(batch_size >= 1, "trace_graph: batch_size must be positive, got ", batch_size);
  Tracer tracer(parameters, inputs, batch_size);
  {
    TraceHookScope scope([&](const OpDef& op, const std::vector<Tensor>& in,
                             const std::vector<Tensor>& out,
                             const Attrs& attrs) { tracer.on_call(op, in, out, attrs); });
    forward();
  }
  return tracer.take();
}

void untie_repeated_parameters(Graph& graph, const std::string& prefix,
                               const std::string& renamed_prefix, int64_t uses) {
  const size_t original_count = graph.tensors.size();
  for (size_t id = 0; id < original_count; ++id) {
    if (graph.tensors[id].parameter.rfind(prefix, 0) != 0) continue;
    const std::string rest = graph.tensors[id].parameter.substr(prefix.size());
    int64_t use = -1;
    int last_op = -1, current = static_cast<int>(id);
    for (TracedOp& op : graph.ops) {
      for (int& input : op.inputs) {
        if (input != static_cast<int>(id)) continue;
        if (op.id != last_op) {
          last_op = op.id;
          if (++use > 0) {
            TracedTensor copy = graph.tensors[id];
            copy.id = static_cast<int>(graph.tensors.size());
            copy.parameter = renamed_prefix + std::to_string(use) + "." + rest;
            graph.tensors.push_back(std::move(copy));
          }
          current = graph.tensors.back().id;
          if (use == 0) current = static_cast<int>(id);
        }
        input = current;
      }
    }
    TESSEL_CHECK(use + 1 == uses, "trace: parameter ", graph.tensors[id].parameter, " was read by ",
                 use + 1, " layer runs, expected ", uses);
  }
}

}  // namespace tessel::planner
