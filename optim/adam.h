// Adam (L2 weight decay added to the gradient) and AdamW (decoupled decay of the parameter),
// PyTorch 1.13's formulas including amsgrad and maximize. Both run as the "adam_update" op.
//   AdamW adamw(net->named_parameters(), AdamWOptions(1e-4).betas({0.9, 0.98}));
#pragma once

#include <string>
#include <utility>

#include "core/arg.h"
#include "optim/optimizer.h"

namespace tessel::optim {

using Betas = std::pair<double, double>;  // (beta1, beta2)

class AdamOptions {
 public:
  AdamOptions(double lr = 1e-3) : lr_(lr) {}  // NOLINT: implicit, as in libtorch

  TESSEL_ARG(double, lr);
  TESSEL_ARG(double, eps) = 1e-8;
  TESSEL_ARG(double, weight_decay) = 0;
  TESSEL_ARG(bool, amsgrad) = false;
  // Ascends the objective instead of descending it.
  TESSEL_ARG(bool, maximize) = false;

  TESSEL_ARG(Betas, betas){0.9, 0.999};
};

// The same fields as AdamOptions; weight_decay defaults to 1e-2 as in PyTorch's AdamW.
class AdamWOptions {
 public:
  AdamWOptions(double lr = 1e-3) : lr_(lr) {}  // NOLINT: implicit, as in libtorch

  TESSEL_ARG(double, lr);
  TESSEL_ARG(double, eps) = 1e-8;
  TESSEL_ARG(double, weight_decay) = 1e-2;
  TESSEL_ARG(bool, amsgrad) = false;
  // Ascends the objective instead of descending it.
  TESSEL_ARG(bool, maximize) = false;

  TESSEL_ARG(Betas, betas){0.9, 0.999};
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
