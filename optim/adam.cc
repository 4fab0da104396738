#include "optim/adam.h"

#include <cmath>

#include "core/op.h"
#include "ops/ops.h"
#include "ops/optimizer_updates.h"

namespace tessel::optim {

namespace {
struct AdamSettings {
  double beta1, beta2, eps, weight_decay;
  bool amsgrad, maximize, decoupled;
};

template <typename Options>
std::vector<std::string> adam_state_keys(const char* name, const Options& options) {
  check_learning_rate(name, options.lr());
  TESSEL_CHECK(options.eps() >= 0, name, ": invalid epsilon ", options.eps(), " (expected >= 0)");
  auto [beta1, beta2] = options.betas();
  TESSEL_CHECK(beta1 >= 0 && beta1 < 1, name, ": invalid beta1 ", beta1,
               " (expected a value in [0, 1))");
  TESSEL_CHECK(beta2 >= 0 && beta2 < 1, name, ": invalid beta2 ", beta2,
               " (expected a value in [0, 1))");
  TESSEL_CHECK(options.weight_decay() >= 0, name, ": invalid weight_decay ", options.weight_decay(),
               " (expected >= 0)");
  if (options.amsgrad()) return {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
  return {"exp_avg", "exp_avg_sq"};
}

void adam_update(const Tensor& parameter, const Tensor& grad, Optimizer::ParameterState& state,
                 double lr, const AdamSettings& settings) {
  for (Tensor& tensor : state.tensors) {
    if (!tensor.defined())
      tensor =
          zeros(parameter.sizes(), TensorOptions(parameter.dtype()).device(parameter.device()));
  }
  Attrs attrs{{"lr", lr},
              {"beta1", settings.beta1},
              {"beta2", settings.beta2},
              {"eps", settings.eps},
              {"weight_decay", settings.weight_decay},
              {"decoupled", settings.decoupled},
              {"amsgrad", settings.amsgrad},
              {"maximize", settings.maximize},
              {"step", state.step}};
  std::vector<Tensor> outputs{parameter};
  outputs.insert(outputs.end(), state.tensors.begin(), state.tensors.end());
  Tensor max_exp_avg_sq = settings.amsgrad ? state.tensors[2] : Tensor();
  dispatch(ops::adam_update, {parameter, grad, state.tensors[0], state.tensors[1], max_exp_avg_sq},
           attrs, outputs);
}

template <typename Options>
AdamSettings settings_of(const Options& options, bool decoupled) {
  return {options.betas().first, options.betas().second, options.eps(), options.weight_decay(),
          options.amsgrad(),     options.maximize(),     decoupled};
}
}  // namespace

Adam::Adam(const std::vector<Tensor>& parameters, const AdamOptions& options)
    : Optimizer(parameters, options.lr(), adam_state_keys("Adam", options), "Adam"),
      options_(options) {}

Adam::Adam(const NamedTensors& named_parameters, const AdamOptions& options)
    : Optimizer(named_parameters, options.lr(), adam_state_keys("Adam", options), "Adam"),
      options_(options) {}

void Adam::update(const Tensor& parameter, const Tensor& grad, ParameterState& state) {
  adam_update(parameter, grad, state, lr(), settings_of(options_, /*decoupled=*/false));
}

AdamW::AdamW(const std::vector<Tensor>& parameters, const AdamWOptions& options)
    : Optimizer(parameters, options.lr(), adam_state_keys("AdamW", options), "AdamW"),
      options_(options) {}

AdamW::AdamW(const NamedTensors& named_parameters, const AdamWOptions& options)
    : Optimizer(named_parameters, options.lr(), adam_state_keys("AdamW", options), "AdamW"),
      options_(options) {}

void AdamW::update(const Tensor& parameter, const Tensor& grad, ParameterState& state) {
  adam_update(parameter, grad, state, lr(), settings_of(options_, /*decoupled=*/true));
}

}  // namespace tessel::optim
