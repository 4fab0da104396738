// Conv2d over NCHW input, PyTorch's defaults: weight (out, in / groups, kh, kw) and bias drawn
// from U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = in / groups * kh * kw.
//   auto conv = std::make_shared<Conv2d>(Conv2dOptions(64, 128, 3).stride(2).padding(1));
#pragma once

#include <string>

#include "core/arg.h"
#include "nn/module.h"
#include "nn/options.h"

namespace tessel::nn {

class Conv2dOptions {
 public:
  Conv2dOptions(int64_t in_channels, int64_t out_channels, IntPair kernel_size)
      : in_channels_(in_channels), out_channels_(out_channels), kernel_size_(kernel_size) {}
  int64_t in_channels() const { return in_channels_; }
  int64_t out_channels() const { return out_channels_; }
  const IntPair& kernel_size() const { return kernel_size_; }

  TESSEL_ARG(IntPair, stride) = 1;
  TESSEL_ARG(IntPair, padding) = 0;
  TESSEL_ARG(IntPair, dilation) = 1;
  TESSEL_ARG(int64_t, groups) = 1;
  TESSEL_ARG(bool, bias) = true;

 private:
  int64_t in_channels_;
  int64_t out_channels_;
  IntPair kernel_size_;
};

class Conv2d : public Module {
 public:
  explicit Conv2d(const Conv2dOptions& options);
  // input (N, in_channels, H, W) -> (N, out_channels, H', W')
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;
  void reset_parameters();

  Conv2dOptions options;
  Tensor weight;
  Tensor bias;
};

}  // namespace tessel::nn
