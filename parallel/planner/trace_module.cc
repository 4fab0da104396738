#include "parallel/planner/trace_module.h"

#include "core/error.h"
#include "ops/ops.h"

namespace tessel::planner {

Graph trace_module(nn::Module& module, const ModuleTraceOptions& options) {
  const Shape& shape = options.input_shape();
  TESSEL_CHECK(!shape.empty() && shape[0] >= 1, "trace_module(", options.name(),
               "): the input shape needs the batch as dim 0, at least 1; got ", shape_str(shape));
  for (int64_t size : shape)
    TESSEL_CHECK(size >= 1, "trace_module(", options.name(), "): input shape ", shape_str(shape),
                 " has a dimension below 1");
  const int64_t batch = shape[0];
  module.to(Device::meta());
  module.train();
  auto meta = [](DType dtype) { return TensorOptions(dtype).device(Device::meta()); };
  Tensor input = empty(shape, meta(options.input_dtype()));
  std::vector<TraceInput> inputs = {{"input", input}};
  Tensor labels;
  if (!options.loss()) {
    labels = empty({batch}, meta(DType::kInt64));
    inputs.push_back({"labels", labels});
  }
  Graph graph;
  try {
    graph = trace_graph(
        [&] {
          Tensor output = module.forward(input);
          if (options.loss())
            options.loss()(output);
          else
            cross_entropy(output, labels);
        },
        module.named_parameters(), inputs, batch);
  } catch (const Error& error) {
    TESSEL_FAIL("trace_module(", options.name(), ") on input ", shape_str(shape), ": ",
                error.message());
  }
  graph.model = options.name();
  graph.user_module = true;
  return graph;
}

}  // namespace tessel::planner
