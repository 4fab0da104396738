// The CPU kernels of conv2d and its two gradients (ops/cpu/conv.cc) and the geometry of a
// convolution, which the op's definition (ops/conv.cc) checks shapes and prices with.
#pragma once

#include <vector>

#include "core/op.h"

namespace tessel::cpu {

// Every size of one convolution. Input (N, C, H, W), weight (O, C / groups, KH, KW),
// output (N, O, OH, OW).
struct ConvGeometry {
  int64_t batch, in_channels, height, width;
  int64_t out_channels, kernel_h, kernel_w;
  int64_t stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, groups;
  int64_t out_h, out_w;
  int64_t in_per_group() const { return in_channels / groups; }
  int64_t out_per_group() const { return out_channels / groups; }
  int64_t column_rows() const { return in_per_group() * kernel_h * kernel_w; }  // GEMM's k
  int64_t out_plane() const { return out_h * out_w; }
  bool depthwise() const { return in_per_group() == 1 && groups > 1; }
  // A 1x1 kernel that reads every pixel once: the input planes are the columns already.
  bool pointwise() const {
    return kernel_h == 1 && kernel_w == 1 && stride_h == 1 && stride_w == 1 && pad_h == 0 &&
           pad_w == 0;
  }
  Shape output_sizes() const { return {batch, out_channels, out_h, out_w}; }
  Shape weight_sizes() const { return {out_channels, in_per_group(), kernel_h, kernel_w}; }
  double flops() const {
    return 2.0 * batch * out_channels * out_h * out_w * in_per_group() * kernel_h * kernel_w;
  }
};

// Checks the input sizes, weight sizes and attributes, and derives the output size.
ConvGeometry make_geometry(const Shape& input, const Shape& weight, const Attrs& attrs);
// The geometry from the sizes in attribute `name` and the other operand's sizes.
ConvGeometry geometry_from_attr(const Attrs& attrs, const char* name, const Shape& other,
                                bool other_is_weight);

// The kernels, for f32 and f64 (16-bit floats go through cpu::with_f32_fallback).
void conv2d_forward(KernelContext& context);
void conv2d_backward_input(KernelContext& context);
void conv2d_backward_weight(KernelContext& context);

}  // namespace tessel::cpu
