// A module of one's own as the planner sees it: one training forward (the module on a batch, then
// a loss of its output) traced on the meta device, as models::trace_model traces the zoo.
//   auto net = std::make_shared<MyNet>();  // a fresh instance: tracing moves it to the meta device
//   Graph graph = trace_module(*net, ModuleTraceOptions({64, 1, 28, 28}).name("MyNet"));
//   PlanResult result = plan_graph(graph, options);
// Data-parallel plans run as priced with DistributedDataParallel. Tensor-parallel plans are
// marked not executable: the module runs split only as its own code splits it
// (parallel::make_linear), so they say what such a split would cost.
#pragma once

#include <functional>
#include <string>

#include "core/arg.h"
#include "core/tensor.h"
#include "nn/module.h"
#include "parallel/planner/graph.h"

namespace tessel::planner {

// The loss of one batch from the module's output (on the meta device).
using ModuleLoss = std::function<Tensor(const Tensor& output)>;

struct ModuleTraceOptions {
  // The input of one iteration, dim 0 the global batch: (batch, channels, height, width) for
  // images, (batch, sequence) of token ids with input_dtype kInt64.
  explicit ModuleTraceOptions(Shape input_shape) : input_shape_(std::move(input_shape)) {}

  TESSEL_ARG(Shape, input_shape);
  TESSEL_ARG(DType, input_dtype) = DType::kFloat32;
  // How the plan and its errors name the model.
  TESSEL_ARG(std::string, name) = "module";
  // Empty: cross-entropy of the output (batch, classes) against int64 labels (batch).
  TESSEL_ARG(ModuleLoss, loss);
};

// Moves `module` to the meta device (its parameter values are gone afterwards) and traces
// forward and loss. Errors: an input shape without a batch of at least 1, or a module whose
// forward rejects that input (the op's own error, prefixed with the module's name).
Graph trace_module(nn::Module& module, const ModuleTraceOptions& options);

}  // namespace tessel::planner
