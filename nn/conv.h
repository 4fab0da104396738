// Conv2d over NCHW input, PyTorch's defaults: weight (out, in / groups, kh, kw) and bias drawn
// from U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = in / groups * kh * kw.
//   auto conv = std::make_shared<Conv2d>(Conv2dOptions(64, 128, 3).stride(2).padding(1));
#pragma once

#include <string>

#include "nn/module.h"
#include "nn/options.h"

namespace tessel::nn {

class Conv2dOptions {
 public:
  Conv2dOptions(int64_t in_channels, int64_t out_channels, IntPair kernel_size)
      : in_channels_(in_channels), out_channels_(out_channels), kernel_size_(kernel_size) {}
  Conv2dOptions& stride(IntPair value) {
    stride_ = value;
    return *this;
  }
  Conv2dOptions& padding(IntPair value) {
    padding_ = value;
    return *this;
  }
  Conv2dOptions& dilation(IntPair value) {
    dilation_ = value;
    return *this;
  }
  Conv2dOptions& groups(int64_t value) {
    groups_ = value;
    return *this;
  }
  Conv2dOptions& bias(bool value) {
    bias_ = value;
    return *this;
  }
  int64_t in_channels() const { return in_channels_; }
  int64_t out_channels() const { return out_channels_; }
  const IntPair& kernel_size() const { return kernel_size_; }
  const IntPair& stride() const { return stride_; }
  const IntPair& padding() const { return padding_; }
  const IntPair& dilation() const { return dilation_; }
  int64_t groups() const { return groups_; }
  bool bias() const { return bias_; }

 private:
  int64_t in_channels_;
  int64_t out_channels_;
  IntPair kernel_size_;
  IntPair stride_ = 1;
  IntPair padding_ = 0;
  IntPair dilation_ = 1;
  int64_t groups_ = 1;
  bool bias_ = true;
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
