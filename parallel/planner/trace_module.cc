#include "parallel/planner/trace_module.h"

#include "core/error.h"
#include "ops/ops.h"

namespace tessel::planner {

ModuleTraceOptions::ModuleTraceOptions(std::vector<StepInput> inputs, ModuleStep step)
    : inputs_(std::move(inputs)), step_(std::move(step)) {
  TESSEL_CHECK(!inputs_.empty() && step_, "ModuleTraceOptions: a step needs inputs and a function");
  input_shape_ = inputs_[0].shape;
  input_dtype_ = inputs_[0].dtype;
}

std::vector<StepInput> ModuleTraceOptions::step_inputs() const {
  if (!inputs_.empty()) return inputs_;
  std::vector<StepInput> inputs = {{"input", input_shape_, input_dtype_}};
  if (!loss_ && !input_shape_.empty())
    inputs.push_back({"labels", {input_shape_[0]}, DType::kInt64});
  return inputs;
}

ModuleStep ModuleTraceOptions::step() const {
  if (step_) return step_;
  return [loss = loss_](nn::Module& module, const std::vector<Tensor>& inputs) {
    Tensor output = module.forward(inputs.at(0));
    return loss ? loss(output) : cross_entropy(output, inputs.at(1));
  };
}

Graph trace_module(nn::Module& module, const ModuleTraceOptions& options) {
  const std::vector<StepInput> specs = options.step_inputs();
  for (const StepInput& spec : specs) {
    TESSEL_CHECK(!spec.shape.empty() && spec.shape[0] >= 1, "trace_module(", options.name(),
                 "): input ", spec.name, " needs the batch as dim 0, at least 1; got ",
                 shape_str(spec.shape));
    for (int64_t size : spec.shape)
      TESSEL_CHECK(size >= 1, "trace_module(", options.name(), "): input ", spec.name, " shape ",
                   shape_str(spec.shape), " has a dimension below 1");
    TESSEL_CHECK(spec.shape[0] == specs[0].shape[0], "trace_module(", options.name(), "): input ",
                 spec.name, " has a batch of ", spec.shape[0], " but ", specs[0].name, " of ",
                 specs[0].shape[0]);
  }
  const int64_t batch = specs[0].shape[0];
  module.to(Device::meta());
  module.train();
  std::vector<Tensor> tensors;
  std::vector<TraceInput> inputs;
  for (const StepInput& spec : specs) {
    tensors.push_back(empty(spec.shape, TensorOptions(spec.dtype).device(Device::meta())));
    inputs.push_back({spec.name, tensors.back()});
  }
  const ModuleStep step = options.step();
  Graph graph;
  try {
    graph = trace_graph([&] { step(module, tensors); }, module.named_parameters(), inputs, batch);
  } catch (const Error& error) {
    TESSEL_FAIL("trace_module(", options.name(), ") on input ", shape_str(specs[0].shape), ": ",
                error.message());
  }
  graph.model = options.name();
  graph.user_module = true;
  return graph;
}

}  // namespace tessel::planner
