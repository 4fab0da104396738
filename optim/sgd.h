// SGD with momentum, dampening, Nesterov and weight decay: PyTorch's algorithm, step for step
// (the first momentum buffer is the gradient itself). Runs as the "sgd_update" op.
//   SGD sgd(net->parameters(), SGDOptions(0.1).momentum(0.9).nesterov(true).weight_decay(5e-4));
#pragma once

#include <string>

#include "optim/optimizer.h"

namespace tessel::optim {

class SGDOptions {
 public:
  SGDOptions(double lr) : lr_(lr) {}  // NOLINT: implicit, as in libtorch
  SGDOptions& lr(double value) {
    lr_ = value;
    return *this;
  }
  SGDOptions& momentum(double value) {
    momentum_ = value;
    return *this;
  }
  SGDOptions& dampening(double value) {
    dampening_ = value;
    return *this;
  }
  SGDOptions& nesterov(bool value) {
    nesterov_ = value;
    return *this;
  }
  SGDOptions& weight_decay(double value) {
    weight_decay_ = value;
    return *this;
  }
  // Ascends the objective instead of descending it.
  SGDOptions& maximize(bool value) {
    maximize_ = value;
    return *this;
  }
  double lr() const { return lr_; }
  double momentum() const { return momentum_; }
  double dampening() const { return dampening_; }
  bool nesterov() const { return nesterov_; }
  double weight_decay() const { return weight_decay_; }
  bool maximize() const { return maximize_; }

 private:
  double lr_;
  double momentum_ = 0;
  double dampening_ = 0;
  bool nesterov_ = false;
  double weight_decay_ = 0;
  bool maximize_ = false;
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
