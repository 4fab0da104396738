// BatchNorm2d and LayerNorm with PyTorch's parameters, buffers and defaults (weight ones, bias
// zeros; running_mean zeros, running_var ones, num_batches_tracked an i64 scalar).
//   auto bn = std::make_shared<BatchNorm2d>(BatchNormOptions(64).momentum(0.01));  bn->eval();
#pragma once

#include <string>

#include "core/arg.h"
#include "nn/module.h"

namespace tessel::nn {

class BatchNormOptions {
 public:
  BatchNormOptions(int64_t num_features) : num_features_(num_features) {}  // NOLINT: implicit
  int64_t num_features() const { return num_features_; }

  TESSEL_ARG(double, eps) = 1e-5;
  TESSEL_ARG(double, momentum) = 0.1;
  TESSEL_ARG(bool, affine) = true;
  TESSEL_ARG(bool, track_running_stats) = true;

 private:
  int64_t num_features_;
};

// Training: normalises with the batch statistics and updates the running ones
// (running = (1 - momentum) * running + momentum * batch, unbiased variance). Eval: uses the
// running statistics (batch statistics when track_running_stats is off).
class BatchNorm2d : public Module {
 public:
  explicit BatchNorm2d(const BatchNormOptions& options);
  // input (N, C, H, W) -> same shape
  Tensor forward(const Tensor& input) override;
  // relu(forward(input)): in one pass over the input where it can be (eval mode on running
  // statistics, no autograd, on the CPU), as Sequential runs a BatchNorm2d followed by a ReLU.
  Tensor forward_relu(const Tensor& input);
  std::string extra_repr() const override;
  void reset_running_stats();
  void reset_parameters();

  BatchNormOptions options;
  Tensor weight;  // (C), undefined without affine
  Tensor bias;
  Tensor running_mean;  // (C), undefined without track_running_stats
  Tensor running_var;
  Tensor num_batches_tracked;  // i64 scalar
};

class LayerNormOptions {
 public:
  LayerNormOptions(Shape normalized_shape)  // NOLINT: implicit
      : normalized_shape_(std::move(normalized_shape)) {}
  const Shape& normalized_shape() const { return normalized_shape_; }

  TESSEL_ARG(double, eps) = 1e-5;
  TESSEL_ARG(bool, elementwise_affine) = true;

 private:
  Shape normalized_shape_;
};

// Normalises over the trailing dims given by normalized_shape.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(const LayerNormOptions& options);
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;
  void reset_parameters();

  LayerNormOptions options;
  Tensor weight;  // normalized_shape, undefined without elementwise_affine
  Tensor bias;
};

}  // namespace tessel::nn
