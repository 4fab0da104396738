#include "optim/sgd.h"

#include <cmath>

#include "core/op.h"
#include "ops/ops.h"
#include "ops/optimizer_updates.h"

namespace tessel::optim {

namespace {
void check_options(const SGDOptions& options) {
  check_learning_rate("SGD", options.lr());
  TESSEL_CHECK(options.momentum() >= 0, "SGD: invalid momentum ", options.momentum(),
               " (expected >= 0)");
  TESSEL_CHECK(options.dampening() >= 0 && options.dampening() <= 1, "SGD: invalid dampening ",
               options.dampening(), " (expected a value in [0, 1])");
  TESSEL_CHECK(options.weight_decay() >= 0, "SGD: invalid weight_decay ", options.weight_decay(),
               " (expected >= 0)");
  TESSEL_CHECK(!options.nesterov() || (options.momentum() > 0 && options.dampening() == 0),
               "SGD: Nesterov momentum requires a momentum > 0 and zero dampening (got momentum ",
               options.momentum(), ", dampening ", options.dampening(), ")");
}

std::vector<std::string> sgd_state_keys(const SGDOptions& options) {
  check_options(options);
  if (options.momentum() == 0) return {};
  return {"momentum_buffer"};
}
}  // namespace

SGD::SGD(const std::vector<Tensor>& parameters, const SGDOptions& options)
    : Optimizer(parameters, options.lr(), sgd_state_keys(options), "SGD"), options_(options) {}

SGD::SGD(const NamedTensors& named_parameters, const SGDOptions& options)
    : Optimizer(named_parameters, options.lr(), sgd_state_keys(options), "SGD"),
      options_(options) {}

void SGD::update(const Tensor& parameter, const Tensor& grad, ParameterState& state) {
  const bool use_momentum = options_.momentum() != 0;
  bool first_step = false;
  std::vector<Tensor> outputs{parameter};
  if (use_momentum) {
    Tensor& buffer = state.tensors[0];
    if (!buffer.defined()) {
      buffer =
          empty(parameter.sizes(), TensorOptions(parameter.dtype()).device(parameter.device()));
      first_step = true;
    }
    outputs.push_back(buffer);
  }
  Attrs attrs{{"lr", lr()},
              {"momentum", options_.momentum()},
              {"dampening", options_.dampening()},
              {"nesterov", options_.nesterov()},
              {"weight_decay", options_.weight_decay()},
              {"maximize", options_.maximize()},
              {"first_step", first_step}};
  dispatch(ops::sgd_update, {parameter, grad, use_momentum ? outputs[1] : Tensor()}, attrs,
           outputs);
}

}  // namespace tessel::optim
