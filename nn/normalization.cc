#include "nn/normalization.h"

#include <cmath>

#include "core/autograd.h"
#include "nn/init.h"
#include "ops/ops.h"

namespace tessel::nn {

BatchNorm2d::BatchNorm2d(const BatchNormOptions& options_in)
    : Module("BatchNorm2d"), options(options_in) {
  const auto& o = options;
  TESSEL_CHECK(o.num_features() > 0, "BatchNorm2d: num_features must be positive, got ",
               o.num_features());
  TESSEL_CHECK(o.eps() > 0, "BatchNorm2d: eps must be positive, got ", o.eps());
  TESSEL_CHECK(o.momentum() >= 0 && o.momentum() <= 1,
               "BatchNorm2d: momentum must be in [0, 1], got ", o.momentum());
  if (o.affine()) {
    weight = register_parameter("weight", empty({o.num_features()}));
    bias = register_parameter("bias", empty({o.num_features()}));
  }
  if (o.track_running_stats()) {
    running_mean = register_buffer("running_mean", zeros({o.num_features()}));
    running_var = register_buffer("running_var", ones({o.num_features()}));
    num_batches_tracked = register_buffer("num_batches_tracked", zeros({}, DType::kInt64));
  }
  reset_parameters();
}

void BatchNorm2d::reset_running_stats() {
  if (!options.track_running_stats()) return;
  init::zeros_(running_mean);
  init::ones_(running_var);
  init::zeros_(num_batches_tracked);
}

void BatchNorm2d::reset_parameters() {
  reset_running_stats();
  if (!options.affine()) return;
  init::ones_(weight);
  init::zeros_(bias);
}

Tensor BatchNorm2d::forward(const Tensor& input) {
  TESSEL_CHECK(input.dim() == 4, "BatchNorm2d: expected a 4-D input (N, C, H, W), got shape ",
               shape_str(input.sizes()));
  TESSEL_CHECK(input.size(1) == options.num_features(), "BatchNorm2d: input has ", input.size(1),
               " channels but the layer has num_features=", options.num_features());
  bool update_running_stats = is_training() && options.track_running_stats();
  if (update_running_stats) {
    NoGradGuard no_grad;
    num_batches_tracked.add_(ones_like(num_batches_tracked));
  }
  // Without running statistics, batch statistics are used in eval mode too (as PyTorch does).
  bool use_batch_stats = is_training() || !options.track_running_stats();
  return batch_norm(input, weight, bias, running_mean, running_var, use_batch_stats,
                    options.momentum(), options.eps());
}

Tensor BatchNorm2d::forward_relu(const Tensor& input) {
  const bool one_pass = !is_training() && options.track_running_stats() &&
                        !GradMode::is_enabled() && input.device().is_cpu() && input.dim() == 4 &&
                        input.size(1) == options.num_features();
  if (!one_pass) return relu(forward(input));
  return batch_norm_relu_eval(input, weight, bias, running_mean, running_var, options.eps());
}

std::string BatchNorm2d::extra_repr() const {
  return std::to_string(options.num_features()) + ", eps=" + detail::format_double(options.eps()) +
         ", momentum=" + detail::format_double(options.momentum()) +
         ", affine=" + detail::format_bool(options.affine()) +
         ", track_running_stats=" + detail::format_bool(options.track_running_stats());
}

LayerNorm::LayerNorm(const LayerNormOptions& options_in)
    : Module("LayerNorm"), options(options_in) {
  const Shape& shape = options.normalized_shape();
  TESSEL_CHECK(!shape.empty(), "LayerNorm: normalized_shape must have at least one dimension");
  for (int64_t size : shape)
    TESSEL_CHECK(size > 0, "LayerNorm: normalized_shape must be positive, got ", shape_str(shape));
  TESSEL_CHECK(options.eps() > 0, "LayerNorm: eps must be positive, got ", options.eps());
  if (options.elementwise_affine()) {
    weight = register_parameter("weight", empty(shape));
    bias = register_parameter("bias", empty(shape));
  }
  reset_parameters();
}

void LayerNorm::reset_parameters() {
  if (!options.elementwise_affine()) return;
  init::ones_(weight);
  init::zeros_(bias);
}

Tensor LayerNorm::forward(const Tensor& input) {
  const Shape& shape = options.normalized_shape();
  bool trailing_match = input.dim() >= static_cast<int64_t>(shape.size()) &&
                        Shape(input.sizes().end() - shape.size(), input.sizes().end()) == shape;
  TESSEL_CHECK(trailing_match, "LayerNorm: input shape ", shape_str(input.sizes()),
               " does not end with normalized_shape ", shape_str(shape));
  return layer_norm(input, shape, weight, bias, options.eps());
}

std::string LayerNorm::extra_repr() const {
  return detail::format_tuple(options.normalized_shape()) +
         ", eps=" + detail::format_double(options.eps()) +
         ", elementwise_affine=" + detail::format_bool(options.elementwise_affine());
}

}  // namespace tessel::nn
