// Tensor-parallel pieces for convolutional networks over a tp group: a convolution split by
// output channels, and gathers of every rank's channels or rows with backward. The classifiers
// built from them live with their models (models/vision_parallel.h).
//   ChannelParallelConv2d split(full_conv, tp_group_id);  Tensor y = split.forward(x);
#pragma once

#include <map>
#include <memory>
#include <string>

#include "core/tensor.h"
#include "nn/nn.h"
#include "parallel/communicator.h"
#include "parallel/tensor_parallel.h"

namespace tessel::parallel {

// A 2-D convolution whose output channels are split over the group: rank r holds filters
// [r out/tp, (r+1) out/tp). The input is replicated (its gradient is all-reduced, as with
// ColumnParallelLinear); the output is this rank's channels, or every channel with
// gather_output. out_channels must be divisible by the group size.
class ChannelParallelConv2d : public nn::Module, public SplitParameters {
 public:
  ChannelParallelConv2d(const nn::Conv2d& full, int64_t group, bool gather_output = true);
  // (N, C_in, H, W) replicated -> (N, C_out / tp, H', W'), or (N, C_out, H', W') gathered.
  Tensor forward(const Tensor& input) override;
  std::map<std::string, int64_t> split_parameter_dims() const override;

  int64_t group;
  int tp_size, tp_rank;
  bool gather_output;
  std::vector<int64_t> stride, padding, dilation;
  int64_t groups;
  Tensor weight;  // (C_out / tp, C_in / groups, kH, kW)
  Tensor bias;    // (C_out / tp) or undefined
};

// Channels (dim 1) of every rank's (N, c, ...) in rank order: (N, c * tp, ...). Backward keeps
// this rank's channels of the gradient.
Tensor gather_channels_from_tp(const Tensor& x, int64_t group);
// Rows (dim 0) of every rank's (n, ...) in rank order: (n * tp, ...). Backward keeps this rank's
// rows of the gradient.
Tensor gather_rows_from_tp(const Tensor& x, int64_t group);

}  // namespace tessel::parallel
