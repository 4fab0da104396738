#include "nn/linear.h"

#include <cmath>

#include "nn/init.h"
#include "ops/ops.h"

namespace tessel::nn {

Linear::Linear(const LinearOptions& options_in) : Linear("Linear", options_in) {
  reset_parameters();
}

Linear::Linear(const std::string& name, const LinearOptions& options_in)
    : Module(name), options(options_in) {
  TESSEL_CHECK(options.in_features() > 0 && options.out_features() > 0, name,
               ": in_features and out_features must be positive, got in_features=",
               options.in_features(), ", out_features=", options.out_features());
  weight = register_parameter("weight", zeros({options.out_features(), options.in_features()}));
  if (options.bias()) bias = register_parameter("bias", zeros({options.out_features()}));
}

void Linear::reset_parameters() {
  init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (bias.defined()) {
    double bound = 1.0 / std::sqrt(static_cast<double>(options.in_features()));
    init::uniform_(bias, -bound, bound);
  }
}

Tensor Linear::forward(const Tensor& input) {
  TESSEL_CHECK(input.dim() >= 1 && input.size(-1) == options.in_features(),
               "Linear: expected input with last dimension ", options.in_features(),
               " (in_features), got shape ", shape_str(input.sizes()));
  return linear(input, weight, bias);
}

std::string Linear::extra_repr() const {
  return "in_features=" + std::to_string(options.in_features()) +
         ", out_features=" + std::to_string(options.out_features()) +
         ", bias=" + detail::format_bool(bias.defined());
}

Flatten::Flatten(int64_t start_dim_in, int64_t end_dim_in)
    : Module("Flatten"), start_dim(start_dim_in), end_dim(end_dim_in) {}

Tensor Flatten::forward(const Tensor& input) { return flatten(input, start_dim, end_dim); }

std::string Flatten::extra_repr() const {
  return "start_dim=" + std::to_string(start_dim) + ", end_dim=" + std::to_string(end_dim);
}

}  // namespace tessel::nn
