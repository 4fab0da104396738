#include "nn/activation.h"

#include "ops/ops.h"

namespace tessel::nn {

Tensor ReLU::forward(const Tensor& input) { return relu(input); }

GELU::GELU(std::string approximate_in) : Module("GELU"), approximate(std::move(approximate_in)) {
  TESSEL_CHECK(approximate == "none" || approximate == "tanh",
               "GELU: approximate must be 'none' or 'tanh', got '", approximate, "'");
}

Tensor GELU::forward(const Tensor& input) { return gelu(input, approximate); }

std::string GELU::extra_repr() const { return "approximate='" + approximate + "'"; }

Tensor Tanh::forward(const Tensor& input) { return tanh(input); }

Tensor Sigmoid::forward(const Tensor& input) { return sigmoid(input); }

}  // namespace tessel::nn
