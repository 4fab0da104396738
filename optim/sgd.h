// SGD with momentum, dampening, Nesterov and weight decay: PyTorch's algorithm, step for step
// (the first momentum buffer is the gradient itself). Runs as the "sgd_update" op.
//   SGD sgd(net->parameters(), SGDOptions(0.1).momentum(0.9).nesterov(true).weight_decay(5e-4));
#pragma once

#include <string>

#include "core/arg.h"
#include "optim/optimizer.h"

namespace tessel::optim {

class SGDOptions {
 public:
  SGDOptions(double lr) : lr_(lr) {}  // NOLINT: implicit, as in libtorch

  TESSEL_ARG(double, lr);
  TESSEL_ARG(double, momentum) = 0;
  TESSEL_ARG(double, dampening) = 0;
  TESSEL_ARG(bool, nesterov) = false;
  TESSEL_ARG(double, weight_decay) = 0;
  // Ascends the objective instead of descending it.
  TESSEL_ARG(bool, maximize) = false;
};

// State key: "momentum_buffer" (when momentum != 0).
class SGD : public Optimizer {
 public:
  SGD(const std::vector<Tensor>& parameters, const SGDOptions& options);
  SGD(const NamedTensors& named_parameters, const SGDOptions& options);
  std::string name() const override { return "SGD"; }
  const SGDOptions& options() const { return options_; }

 protected:
  void update(const Tensor& parameter, const Tensor& grad, ParameterState& state) override;

 private:
  SGDOptions options_;
};

}  // namespace tessel::optim
