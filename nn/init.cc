#include "nn/init.h"

#include <cmath>

#include "core/autograd.h"
#include "ops/ops.h"

namespace tessel::nn::init {

std::pair<int64_t, int64_t> fan_in_and_fan_out(const Tensor& weight) {
  TESSEL_CHECK(weight.dim() >= 2, "init: fan in and fan out need a tensor of 2 or more dims, got ",
               "shape ", shape_str(weight.sizes()));
  int64_t receptive_field = 1;
  for (int64_t d = 2; d < weight.dim(); ++d) receptive_field *= weight.size(d);
  return {weight.size(1) * receptive_field, weight.size(0) * receptive_field};
}

double calculate_gain(const std::string& nonlinearity, double param) {
  if (nonlinearity == "linear" || nonlinearity == "conv1d" || nonlinearity == "conv2d" ||
      nonlinearity == "conv3d" || nonlinearity == "sigmoid") {
    return 1.0;
  }
  if (nonlinearity == "tanh") return 5.0 / 3.0;
  if (nonlinearity == "relu") return std::sqrt(2.0);
  if (nonlinearity == "leaky_relu") return std::sqrt(2.0 / (1.0 + param * param));
  if (nonlinearity == "selu") return 3.0 / 4.0;
  TESSEL_FAIL("init: unknown nonlinearity '", nonlinearity,
              "' (expected linear, conv2d, sigmoid, tanh, relu, leaky_relu or selu)");
}

namespace {
int64_t chosen_fan(const Tensor& tensor, const std::string& mode) {
  auto [fan_in, fan_out] = fan_in_and_fan_out(tensor);
  if (mode == "fan_in") return fan_in;
  if (mode == "fan_out") return fan_out;
  TESSEL_FAIL("init: mode must be 'fan_in' or 'fan_out', got '", mode, "'");
}
}  // namespace

Tensor& uniform_(Tensor& tensor, double low, double high) {
  NoGradGuard no_grad;
  return tessel::uniform_(tensor, low, high);
}

Tensor& normal_(Tensor& tensor, double mean, double stddev) {
  NoGradGuard no_grad;
  return tessel::normal_(tensor, mean, stddev);
}

Tensor& constant_(Tensor& tensor, double value) {
  NoGradGuard no_grad;
  return tensor.fill_(value);
}

Tensor& zeros_(Tensor& tensor) { return constant_(tensor, 0.0); }
Tensor& ones_(Tensor& tensor) { return constant_(tensor, 1.0); }

Tensor& kaiming_uniform_(Tensor& tensor, double a, const std::string& mode,
                         const std::string& nonlinearity) {
  int64_t fan = chosen_fan(tensor, mode);
  TESSEL_CHECK(fan > 0, "init: kaiming_uniform_ of a tensor with zero fan (shape ",
               shape_str(tensor.sizes()), ")");
  double bound = calculate_gain(nonlinearity, a) * std::sqrt(3.0 / static_cast<double>(fan));
  return init::uniform_(tensor, -bound, bound);
}

Tensor& kaiming_normal_(Tensor& tensor, double a, const std::string& mode,
                        const std::string& nonlinearity) {
  int64_t fan = chosen_fan(tensor, mode);
  TESSEL_CHECK(fan > 0, "init: kaiming_normal_ of a tensor with zero fan (shape ",
               shape_str(tensor.sizes()), ")");
  return init::normal_(tensor, 0.0,
                       calculate_gain(nonlinearity, a) / std::sqrt(static_cast<double>(fan)));
}

Tensor& xavier_uniform_(Tensor& tensor, double gain) {
  auto [fan_in, fan_out] = fan_in_and_fan_out(tensor);
  double bound = gain * std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
  return init::uniform_(tensor, -bound, bound);
}

Tensor& xavier_normal_(Tensor& tensor, double gain) {
  auto [fan_in, fan_out] = fan_in_and_fan_out(tensor);
  return init::normal_(tensor, 0.0, gain * std::sqrt(2.0 / static_cast<double>(fan_in + fan_out)));
}

}  // namespace tessel::nn::init
