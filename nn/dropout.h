// Dropout: zeroes each element with probability p in training mode and scales the rest by
// 1 / (1 - p); the identity in eval mode. Its mask comes from Tessel's counter-based RNG.
//   auto drop = std::make_shared<Dropout>(0.1);  drop->eval();
#pragma once

#include <string>

#include "nn/module.h"

namespace tessel::nn {

class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5);
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

  double p;
};

}  // namespace tessel::nn
