#include "parallel/vision_parallel.h"

#include <map>

#include "core/autograd.h"
#include "core/error.h"
#include "core/shape.h"
#include "ops/ops.h"

namespace tessel::parallel {

Tensor gather_channels_from_tp(const Tensor& x, int64_t group) {
  TESSEL_CHECK(x.dim() >= 2, "gather_channels_from_tp: expected (N, C, ...), got shape ",
               shape_str(x.sizes()));
  return gather_from_tp(x, group, 1);
}

Tensor gather_rows_from_tp(const Tensor& x, int64_t group) {
  TESSEL_CHECK(x.dim() >= 1, "gather_rows_from_tp: expected at least one dim");
  return gather_from_tp(x, group, 0);
}

ChannelParallelConv2d::ChannelParallelConv2d(const nn::Conv2d& full, int64_t group_in,
                                             bool gather_output_in)
    : nn::Module("ChannelParallelConv2d"), group(group_in), gather_output(gather_output_in) {
  const auto& comm = tp_group(group);
  tp_size = comm->size();
  tp_rank = comm->rank();
  const auto& options = full.options;
  const int64_t out = options.out_channels();
  TESSEL_CHECK(out % tp_size == 0, "ChannelParallelConv2d: out_channels (", out,
               ") must be a multiple of the tensor parallel size ", tp_size);
  groups = options.groups();
  TESSEL_CHECK(groups == 1, "ChannelParallelConv2d: grouped convolutions (groups=", groups,
               ") are not split by channels; split the batch instead");
  stride = options.stride().vec();
  padding = options.padding().vec();
  dilation = options.dilation().vec();
  const int64_t local = out / tp_size;
  weight = register_parameter("weight",
                              contiguous(narrow(full.weight.detach(), 0, tp_rank * local, local)));
  if (full.bias.defined())
    bias = register_parameter("bias",
                              contiguous(narrow(full.bias.detach(), 0, tp_rank * local, local)));
}

Tensor ChannelParallelConv2d::forward(const Tensor& input) {
  Tensor output = conv2d(copy_to_tp(input, group), weight, bias, stride, padding, dilation, groups);
  return gather_output ? gather_channels_from_tp(output, group) : output;
}

std::map<std::string, int64_t> ChannelParallelConv2d::split_parameter_dims() const {
  if (bias.defined()) return {{"weight", 0}, {"bias", 0}};
  return {{"weight", 0}};
}

}  // namespace tessel::parallel
