#include "optim/clip_grad.h"

#include <cmath>

#include "core/autograd.h"
#include "ops/ops.h"

namespace tessel::optim {

namespace {
// The p-norm of one gradient, computed with public ops so it runs on the gradient's device.
double gradient_norm(const Tensor& grad, double norm_type) {
  if (std::isinf(norm_type)) return max(abs(grad)).item<double>();
  if (norm_type == 2.0) return std::sqrt(sum(mul(grad, grad)).item<double>());
  if (norm_type == 1.0) return sum(abs(grad)).item<double>();
  return std::pow(sum(pow(abs(grad), norm_type)).item<double>(), 1.0 / norm_type);
}
}  // namespace

double clip_grad_norm(const std::vector<Tensor>& parameters, double max_norm, double norm_type,
                      bool error_if_nonfinite) {
  TESSEL_CHECK(max_norm >= 0, "clip_grad_norm: max_norm must be >= 0, got ", max_norm);
  TESSEL_CHECK(norm_type > 0, "clip_grad_norm: norm_type must be positive or INFINITY, got ",
               norm_type);
  NoGradGuard no_grad;
  std::vector<Tensor> grads;
  for (const Tensor& parameter : parameters) {
    Tensor grad = parameter.grad();
    if (grad.defined() && grad.numel() > 0) grads.push_back(grad);
  }
  if (grads.empty()) return 0.0;

  double total = 0;
  for (const Tensor& grad : grads) {
    double norm = gradient_norm(grad, norm_type);
    if (std::isinf(norm_type)) {
      total = std::isnan(norm) ? norm : std::max(total, norm);
    } else {
      total += std::pow(norm, norm_type);
    }
  }
  if (!std::isinf(norm_type)) total = std::pow(total, 1.0 / norm_type);
  TESSEL_CHECK(!error_if_nonfinite || std::isfinite(total), "clip_grad_norm: the total norm of ",
               "order ", norm_type, " of the gradients is ", total,
               ", so they cannot be clipped (set error_if_nonfinite=false to scale anyway)");

  double scale = max_norm / (total + 1e-6);
  if (scale < 1.0 || std::isnan(scale)) {
    for (Tensor& grad : grads) grad.mul_(scale);
  }
  return total;
}

}  // namespace tessel::optim
