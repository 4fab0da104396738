// The planner's view of a model: one forward pass traced on the meta device (shapes only, no
// bytes) into a graph of op calls, with view ops folded into their consumers.
//   model->to(Device::meta());
//   Graph graph = trace_graph([&] { loss = cross_entropy((*model)(x), y); },
//                             model->named_parameters(), {{"x", x}, {"y", y}}, batch);
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/attrs.h"
#include "core/op.h"
#include "core/tensor.h"

namespace tessel::planner {

// A value flowing through the graph: an op output, a parameter, or a data input.
struct TracedTensor {
  int id = 0;
  Shape sizes;
  DType dtype = DType::kFloat32;
  int64_t bytes = 0;
  int producer = -1;       // op id; -1 for parameters and inputs
  int producer_slot = 0;   // which output of the producer
  std::string parameter;   // dotted parameter name, empty otherwise
  std::string input;       // data input name, empty otherwise
  bool has_batch = false;  // dim 0 is the batch (or batch-major, such as batch * heads)
  bool requires_grad = false;
  // Where a model split of it lies (the dim its producer splits over the model, and the period
  // there), as the runtime splits it (forced_model_axis, views.h); -1 for parameters and data.
  int64_t model_axis = -1;
  int64_t model_period = 0;
  bool is_parameter() const { return !parameter.empty(); }
  bool is_input() const { return !input.empty(); }
};

// A view an op's input is read through, from the tensor the graph names outward.
struct ViewStep {
  std::string op;  // the view op's registry name ("slice", "reshape", "transpose", ...)
  Attrs attrs;
  Shape from, to;      // the shapes it views and gives
  int64_t source = 0;  // the value it views: the same for every view of one tensor or view
  bool first = false;  // the first view of `source` in the order the ops read them
};

// One non-view op call. Inputs name tensors with views folded away: a view of a tensor is read as
// that tensor, and `input_shapes` keep the shape the op actually saw.
struct TracedOp {
  int id = 0;
  std::string name;            // registry name ("linear", "bmm", ...)
  const OpDef* def = nullptr;  // the registered op: its kind and planner traits (core/op.h)
  Attrs attrs;
  std::vector<int> inputs;  // tensor ids; -1 for an undefined (optional) input
  std::vector<Shape> input_shapes;
  std::vector<bool> input_has_batch;               // the view the op saw keeps the batch in dim 0
  std::vector<std::vector<ViewStep>> input_views;  // per input, the views it is read through
  std::vector<int> outputs;
  std::vector<Shape> output_shapes;
  double flops = 0;                // OpDef::cost (forward); 0 when the op has none
  double bytes = 0;                // bytes read and written (OpDef::cost, else inputs plus outputs)
  std::vector<int> saved_inputs;   // what its backward keeps (OpDef::save_inputs)
  std::vector<int> saved_outputs;  // (OpDef::save_outputs)
  bool differentiable = false;
};

struct Graph {
  std::vector<TracedTensor> tensors;
  std::vector<TracedOp> ops;  // in call order (a topological order)
  int64_t batch_size = 1;
  std::string model;  // the model-zoo name (trace_model) or the module's (trace_module), else empty
  // Traced by trace_module: a module of one's own (parallel::ParallelModule runs its plans).
  bool user_module = false;

  // For each tensor: the (op, input slot) pairs that read it.
  std::vector<std::vector<std::pair<int, int>>> consumers() const;
  // Ops by name, "linear x12, add x4, ..." in order of first appearance.
  std::string op_histogram() const;
  int64_t parameter_count() const;  // elements of all parameters
};

struct TraceInput {
  std::string name;
  Tensor tensor;      // on the meta device
  bool batch = true;  // dim 0 is the batch
};

// Runs `forward` with a trace hook and returns every op call it makes. Tensors in `parameters`
// (on the meta device) are named parameters; `inputs` are the data. `batch_size` is the size of
// the inputs' dim 0, used to recognise batch-major tensors after reshapes (batch * heads).
Graph trace_graph(const std::function<void()>& forward,
                  const std::vector<std::pair<std::string, Tensor>>& parameters,
                  const std::vector<TraceInput>& inputs, int64_t batch_size);

// A module run `uses` times stands for `uses` identical modules (a model traced with one of its
// identical layers, run that often): the i-th op (in call order) reading a parameter named
// prefix + rest gets a copy named renamed_prefix + i + "." + rest.
void untie_repeated_parameters(Graph& graph, const std::string& prefix,
                               const std::string& renamed_prefix, int64_t uses);

}  // namespace tessel::planner
