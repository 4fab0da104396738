// Linear (y = x W^T + b), Identity and Flatten, with PyTorch's defaults: W and b drawn from
// U(-1/sqrt(in_features), 1/sqrt(in_features)).
//   auto fc = std::make_shared<Linear>(LinearOptions(512, 10).bias(false));  Tensor y = (*fc)(x);
#pragma once

#include <string>

#include "core/arg.h"
#include "nn/module.h"

namespace tessel::nn {

class LinearOptions {
 public:
  LinearOptions(int64_t in_features, int64_t out_features)
      : in_features_(in_features), out_features_(out_features) {}
  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }

  TESSEL_ARG(bool, bias) = true;

 private:
  int64_t in_features_;
  int64_t out_features_;
};

// weight (out_features, in_features), bias (out_features) or undefined.
class Linear : public Module {
 public:
  explicit Linear(const LinearOptions& options);
  Linear(int64_t in_features, int64_t out_features)
      : Linear(LinearOptions(in_features, out_features)) {}
  // input (..., in_features) -> (..., out_features)
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;
  void reset_parameters();

  LinearOptions options;
  Tensor weight;
  Tensor bias;

 protected:
  // For layers that hold a part of a larger linear (the tensor-parallel shards): parameters of
  // these sizes, zero, named `name`; they are filled from the full layer, so nothing is drawn.
  Linear(const std::string& name, const LinearOptions& options);
};

class Identity : public Module {
 public:
  Identity() : Module("Identity") {}
  Tensor forward(const Tensor& input) override { return input; }
};

// Flattens dims start_dim..end_dim into one (default: all but the batch dim).
class Flatten : public Module {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1);
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

  int64_t start_dim;
  int64_t end_dim;
};

}  // namespace tessel::nn
