// A module of one's own as the planner sees it: one training forward (the module on a batch, then
// a loss of its output) traced on the meta device, as models::trace_model traces the zoo.
//   auto net = std::make_shared<MyNet>();  // a fresh instance: tracing moves it to the meta device
//   Graph graph = trace_module(*net, ModuleTraceOptions({64, 1, 28, 28}).name("MyNet"));
//   PlanResult result = plan_graph(graph, options);
// A model whose step takes several inputs (BERT's ids, types, mask and labels) is traced from a
// step: ModuleTraceOptions({{"ids", {64, 128}}, ...}, [](nn::Module& m, inputs) { ... }).
// Every plan of such a graph runs as priced through parallel::ParallelModule.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/arg.h"
#include "core/tensor.h"
#include "nn/module.h"
#include "parallel/planner/graph.h"

namespace tessel::planner {

// The loss of one batch from the module's output (on the meta device).
using ModuleLoss = std::function<Tensor(const Tensor& output)>;

// One input of a step that takes several (BERT's token ids, token types, mask and labels): dim 0
// the global batch.
struct StepInput {
  std::string name;
  Shape shape;
  DType dtype = DType::kInt64;
};
// The loss of one batch from the module and one tensor per StepInput, in their order.
using ModuleStep = std::function<Tensor(nn::Module& module, const std::vector<Tensor>& inputs)>;

struct ModuleTraceOptions {
  // The input of one iteration, dim 0 the global batch: (batch, channels, height, width) for
  // images, (batch, sequence) of token ids with input_dtype kInt64.
  explicit ModuleTraceOptions(Shape input_shape) : input_shape_(std::move(input_shape)) {}
  // A step of several inputs: `step` calls the module's forward as it needs and returns the loss.
  // input_shape() is the first input's.
  ModuleTraceOptions(std::vector<StepInput> inputs, ModuleStep step);

  TESSEL_ARG(Shape, input_shape);
  TESSEL_ARG(DType, input_dtype) = DType::kFloat32;
  // How the plan and its errors name the model.
  TESSEL_ARG(std::string, name) = "module";
  // Empty: cross-entropy of the output (batch, classes) against int64 labels (batch).
  TESSEL_ARG(ModuleLoss, loss);

 public:
  // Whichever form was given, as a step: the inputs (the single form's input, then its labels
  // when the loss is the default cross-entropy) and the function from them to the loss.
  std::vector<StepInput> step_inputs() const;
  ModuleStep step() const;

 private:
  std::vector<StepInput> inputs_;  // the form of several inputs (else empty)
  ModuleStep step_;
};

// Moves `module` to the meta device (its parameter values are gone afterwards) and traces
// forward and loss. Errors: an input shape without a batch of at least 1, or a module whose
// forward rejects that input (the op's own error, prefixed with the module's name).
Graph trace_module(nn::Module& module, const ModuleTraceOptions& options);

}  // namespace tessel::planner
