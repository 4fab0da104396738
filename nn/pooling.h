// Pooling layers over NCHW input: MaxPool2d, AvgPool2d (stride defaults to the kernel size, as
// in PyTorch) and AdaptiveAvgPool2d.
//   auto pool = std::make_shared<MaxPool2d>(MaxPool2dOptions(3).stride(2).padding(1));
#pragma once

#include <optional>
#include <string>

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
  MaxPool2dOptions& padding(IntPair value) {
    padding_ = value;
    return *this;
  }
  MaxPool2dOptions& dilation(IntPair value) {
    dilation_ = value;
    return *this;
  }
  MaxPool2dOptions& ceil_mode(bool value) {
    ceil_mode_ = value;
    return *this;
  }
  const IntPair& kernel_size() const { return kernel_size_; }
  IntPair stride() const { return stride_.value_or(kernel_size_); }
  const IntPair& padding() const { return padding_; }
  const IntPair& dilation() const { return dilation_; }
  bool ceil_mode() const { return ceil_mode_; }

 private:
  IntPair kernel_size_;
  std::optional<IntPair> stride_;
  IntPair padding_ = 0;
  IntPair dilation_ = 1;
  bool ceil_mode_ = false;
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
  AvgPool2dOptions& padding(IntPair value) {
    padding_ = value;
    return *this;
  }
  AvgPool2dOptions& ceil_mode(bool value) {
    ceil_mode_ = value;
    return *this;
  }
  AvgPool2dOptions& count_include_pad(bool value) {
    count_include_pad_ = value;
    return *this;
  }
  const IntPair& kernel_size() const { return kernel_size_; }
  IntPair stride() const { return stride_.value_or(kernel_size_); }
  const IntPair& padding() const { return padding_; }
  bool ceil_mode() const { return ceil_mode_; }
  bool count_include_pad() const { return count_include_pad_; }

 private:
  IntPair kernel_size_;
  std::optional<IntPair> stride_;
  IntPair padding_ = 0;
  bool ceil_mode_ = false;
  bool count_include_pad_ = true;
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
