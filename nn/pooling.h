// Pooling layers over NCHW input: MaxPool2d, AvgPool2d (stride defaults to the kernel size, as
// in PyTorch) and AdaptiveAvgPool2d.
//   auto pool = std::make_shared<MaxPool2d>(MaxPool2dOptions(3).stride(2).padding(1));
#pragma once

#include <optional>
#include <string>

#include "core/arg.h"
#include "nn/module.h"
#include "nn/options.h"

namespace tessel::nn {

class MaxPool2dOptions {
 public:
  MaxPool2dOptions(IntPair kernel_size) : kernel_size_(kernel_size) {}  // NOLINT: implicit
  MaxPool2dOptions& stride(IntPair value) {
    stride_ = value;
    return *this;
  }
  const IntPair& kernel_size() const { return kernel_size_; }
  IntPair stride() const { return stride_.value_or(kernel_size_); }

  TESSEL_ARG(IntPair, padding) = 0;
  TESSEL_ARG(IntPair, dilation) = 1;
  TESSEL_ARG(bool, ceil_mode) = false;

 private:
  IntPair kernel_size_;
  std::optional<IntPair> stride_;
};

class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(const MaxPool2dOptions& options);
  explicit MaxPool2d(IntPair kernel_size) : MaxPool2d(MaxPool2dOptions(kernel_size)) {}
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

  MaxPool2dOptions options;
};

class AvgPool2dOptions {
 public:
  AvgPool2dOptions(IntPair kernel_size) : kernel_size_(kernel_size) {}  // NOLINT: implicit
  AvgPool2dOptions& stride(IntPair value) {
    stride_ = value;
    return *this;
  }
  const IntPair& kernel_size() const { return kernel_size_; }
  IntPair stride() const { return stride_.value_or(kernel_size_); }

  TESSEL_ARG(IntPair, padding) = 0;
  TESSEL_ARG(bool, ceil_mode) = false;
  TESSEL_ARG(bool, count_include_pad) = true;

 private:
  IntPair kernel_size_;
  std::optional<IntPair> stride_;
};

class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(const AvgPool2dOptions& options);
  explicit AvgPool2d(IntPair kernel_size) : AvgPool2d(AvgPool2dOptions(kernel_size)) {}
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

  AvgPool2dOptions options;
};

// Averages each channel down to output_size (H', W'), for any input size.
class AdaptiveAvgPool2d : public Module {
 public:
  explicit AdaptiveAvgPool2d(IntPair output_size);
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

  IntPair output_size;
};

}  // namespace tessel::nn
