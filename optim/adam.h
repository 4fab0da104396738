// Adam (L2 weight decay added to the gradient) and AdamW (decoupled decay of the parameter),
// PyTorch 1.13's formulas including amsgrad and maximize. Both run as the "adam_update" op.
//   AdamW adamw(net->named_parameters(), AdamWOptions(1e-4).betas({0.9, 0.98}));
#pragma once

#include <string>
#include <utility>

#include "optim/optimizer.h"

namespace tessel::optim {

class AdamOptions {
 public:
  AdamOptions(double lr = 1e-3) : lr_(lr) {}  // NOLINT: implicit, as in libtorch
  AdamOptions& lr(double value) {
    lr_ = value;
    return *this;
  }
  AdamOptions& betas(std::pair<double, double> value) {
    betas_ = value;
    return *this;
  }
  AdamOptions& eps(double value) {
    eps_ = value;
    return *this;
  }
  AdamOptions& weight_decay(double value) {
    weight_decay_ = value;
    return *this;
  }
  AdamOptions& amsgrad(bool value) {
    amsgrad_ = value;
    return *this;
  }
  // Ascends the objective instead of descending it.
  AdamOptions& maximize(bool value) {
    maximize_ = value;
    return *this;
  }
  double lr() const { return lr_; }
  const std::pair<double, double>& betas() const { return betas_; }
  double eps() const { return eps_; }
  double weight_decay() const { return weight_decay_; }
  bool amsgrad() const { return amsgrad_; }
  bool maximize() const { return maximize_; }

 private:
  double lr_;
  std::pair<double, double> betas_{0.9, 0.999};
  double eps_ = 1e-8;
  double weight_decay_ = 0;
  bool amsgrad_ = false;
  bool maximize_ = false;
};

// The same fields as AdamOptions; weight_decay defaults to 1e-2 as in PyTorch's AdamW.
class AdamWOptions {
 public:
  AdamWOptions(double lr = 1e-3) : lr_(lr) {}  // NOLINT: implicit, as in libtorch
  AdamWOptions& lr(double value) {
    lr_ = value;
    return *this;
  }
  AdamWOptions& betas(std::pair<double, double> value) {
    betas_ = value;
    return *this;
  }
  AdamWOptions& eps(double value) {
    eps_ = value;
    return *this;
  }
  AdamWOptions& weight_decay(double value) {
    weight_decay_ = value;
    return *this;
  }
  AdamWOptions& amsgrad(bool value) {
    amsgrad_ = value;
    return *this;
  }
  // Ascends the objective instead of descending it.
  AdamWOptions& maximize(bool value) {
    maximize_ = value;
    return *this;
  }
  double lr() const { return lr_; }
  const std::pair<double, double>& betas() const { return betas_; }
  double eps() const { return eps_; }
  double weight_decay() const { return weight_decay_; }
  bool amsgrad() const { return amsgrad_; }
  bool maximize() const { return maximize_; }

 private:
  double lr_;
  std::pair<double, double> betas_{0.9, 0.999};
  double eps_ = 1e-8;
  double weight_decay_ = 1e-2;
  bool amsgrad_ = false;
  bool maximize_ = false;
};

// State keys: "exp_avg", "exp_avg_sq" (and "max_exp_avg_sq" with amsgrad).
class Adam : public Optimizer {
 public:
  Adam(const std::vector<Tensor>& parameters, const AdamOptions& options);
  Adam(const NamedTensors& named_parameters, const AdamOptions& options);
  std::string name() const override { return "Adam"; }
  const AdamOptions& options() const { return options_; }

 protected:
  void update(const Tensor& parameter, const Tensor& grad, ParameterState& state) override;

 private:
  AdamOptions options_;
};

// Adam with the weight decay applied to the parameter (p *= 1 - lr * weight_decay) instead of
// added to the gradient.
class AdamW : public Optimizer {
 public:
  AdamW(const std::vector<Tensor>& parameters, const AdamWOptions& options);
  AdamW(const NamedTensors& named_parameters, const AdamWOptions& options);
  std::string name() const override { return "AdamW"; }
  const AdamWOptions& options() const { return options_; }

 protected:
  void update(const Tensor& parameter, const Tensor& grad, ParameterState& state) override;

 private:
  AdamWOptions options_;
};

}  // namespace tessel::optim
