// BatchNorm2d and LayerNorm with PyTorch's parameters, buffers and defaults (weight ones, bias
// zeros; running_mean zeros, running_var ones, num_batches_tracked an i64 scalar).
//   auto bn = std::make_shared<BatchNorm2d>(BatchNormOptions(64).momentum(0.01));  bn->eval();
#pragma once

#include <string>

#include "nn/module.h"

namespace tessel::nn {

class BatchNormOptions {
 public:
  BatchNormOptions(int64_t num_features) : num_features_(num_features) {}  // NOLINT: implicit
  BatchNormOptions& eps(double value) {
    eps_ = value;
    return *this;
  }
  BatchNormOptions& momentum(double value) {
    momentum_ = value;
    return *this;
  }
  BatchNormOptions& affine(bool value) {
    affine_ = value;
    return *this;
  }
  BatchNormOptions& track_running_stats(bool value) {
    track_running_stats_ = value;
    return *this;
  }
  int64_t num_features() const { return num_features_; }
  double eps() const { return eps_; }
  double momentum() const { return momentum_; }
  bool affine() const { return affine_; }
  bool track_running_stats() const { return track_running_stats_; }

 private:
  int64_t num_features_;
  double eps_ = 1e-5;
  double momentum_ = 0.1;
  bool affine_ = true;
  bool track_running_stats_ = true;
};

// Training: normalises with the batch statistics and updates the running ones
// (running = (1 - momentum) * running + momentum * batch, unbiased variance). Eval: uses the
// running statistics (batch statistics when track_running_stats is off).
class BatchNorm2d : public Module {
 public:
  explicit BatchNorm2d(const BatchNormOptions& options);
  // input (N, C, H, W) -> same shape
  Tensor forward(const Tensor& input) override;
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
  LayerNormOptions& eps(double value) {
    eps_ = value;
    return *this;
  }
  LayerNormOptions& elementwise_affine(bool value) {
    elementwise_affine_ = value;
    return *this;
  }
  const Shape& normalized_shape() const { return normalized_shape_; }
  double eps() const { return eps_; }
  bool elementwise_affine() const { return elementwise_affine_; }

 private:
  Shape normalized_shape_;
  double eps_ = 1e-5;
  bool elementwise_affine_ = true;
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
