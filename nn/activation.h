// Element-wise activation layers: ReLU, GELU ("none" for the erf form, "tanh" for the
// approximation), Tanh, Sigmoid. Stateless wrappers of the ops of the same name.
//   auto act = std::make_shared<GELU>("tanh");
#pragma once

#include <string>

#include "nn/module.h"

namespace tessel::nn {

class ReLU : public Module {
 public:
  ReLU() : Module("ReLU") {}
  Tensor forward(const Tensor& input) override;
};

class GELU : public Module {
 public:
  explicit GELU(std::string approximate = "none");
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

  std::string approximate;
};

class Tanh : public Module {
 public:
  Tanh() : Module("Tanh") {}
  Tensor forward(const Tensor& input) override;
};

class Sigmoid : public Module {
 public:
  Sigmoid() : Module("Sigmoid") {}
  Tensor forward(const Tensor& input) override;
};

}  // namespace tessel::nn
