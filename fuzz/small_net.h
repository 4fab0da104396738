// The model the safetensors and checkpoint targets load into: a Linear (weight and bias) and a
// BatchNorm2d (affine parameters and f32 and i64 buffers), so state dicts of every kind of entry.
#pragma once

#include <memory>

#include "nn/nn.h"

namespace tessel::fuzz {

class SmallNet : public nn::Module {
 public:
  SmallNet() : Module("SmallNet") {
    fc = register_module("fc", std::make_shared<nn::Linear>(3, 4));
    bn = register_module("bn", std::make_shared<nn::BatchNorm2d>(4));
  }
  std::shared_ptr<nn::Linear> fc;
  std::shared_ptr<nn::BatchNorm2d> bn;
};

}  // namespace tessel::fuzz
