#include "nn/dropout.h"

#include "ops/ops.h"

namespace tessel::nn {

Dropout::Dropout(double p_in) : Module("Dropout"), p(p_in) {
  TESSEL_CHECK(p >= 0 && p <= 1, "Dropout: probability must be between 0 and 1, got ", p);
}

Tensor Dropout::forward(const Tensor& input) { return dropout(input, p, is_training()); }

std::string Dropout::extra_repr() const {
  return "p=" + detail::format_double(p) + ", inplace=False";
}

}  // namespace tessel::nn
