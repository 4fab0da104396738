// Window rules and index maps of 2-D pooling (PyTorch's), shared by the CPU kernels
// (ops/cpu/pool.cc) and the CUDA kernels (cuda/ops/pool.cu): strided (N, C, H, W) planes, the
// window of each output along one axis (max / avg with stride, padding, dilation; adaptive),
// the outputs whose windows cover an input position, and the per-window max and averages.
//   const Planes in = planes_of(x);  T v = x_data[in.at(plane, h, w)];
#pragma once

#include <cmath>
#include <cstdint>

#include "core/host_device.h"

namespace tessel {

// One strided (N, C, H, W) tensor's planes: element (n, c, h, w) is (h, w) of plane n*C + c.
struct Planes {
  int64_t channels, height, width;
  int64_t stride_n, stride_c, stride_h, stride_w;
  TESSEL_HOST_DEVICE int64_t plane_offset(int64_t plane) const {
    return (plane / channels) * stride_n + (plane % channels) * stride_c;
  }
  TESSEL_HOST_DEVICE int64_t at(int64_t h, int64_t w) const { return h * stride_h + w * stride_w; }
  TESSEL_HOST_DEVICE int64_t at(int64_t plane, int64_t h, int64_t w) const {
    return plane_offset(plane) + at(h, w);
  }
};

// The planes of a 4-D tensor (anything with size(d) and stride(d)).
template <typename TensorLike>
Planes planes_of(const TensorLike& t) {
  return {t.size(1), t.size(2), t.size(3), t.stride(0), t.stride(1), t.stride(2), t.stride(3)};
}

// Windows of max_pool2d and avg_pool2d along one axis.
struct PoolAxis {
  int64_t input, kernel, stride, padding, dilation, output;
};

// PyTorch's pooling_output_shape: floor (or ceil) division, and in ceil mode the last window
// must start inside the input or its left padding.
TESSEL_HOST_DEVICE inline int64_t pooled_size(int64_t input, int64_t kernel, int64_t padding,
                                              int64_t stride, int64_t dilation, bool ceil_mode) {
  const int64_t numerator =
      input + 2 * padding - dilation * (kernel - 1) - 1 + (ceil_mode ? stride - 1 : 0);
  const int64_t quotient =
      numerator >= 0 ? numerator / stride : -((-numerator + stride - 1) / stride);
  int64_t output = quotient + 1;
  if (ceil_mode && (output - 1) * stride >= input + padding) --output;
  return output;
}

// The outputs [*first, *last] (inclusive; empty when first > last) along one axis whose
// (dilated) window may cover input position `x`.
TESSEL_HOST_DEVICE inline void covering_outputs(const PoolAxis& axis, int64_t x, int64_t* first,
                                                int64_t* last) {
  const int64_t reach = x + axis.padding;  // o * stride + i * dilation == reach
  const int64_t span = (axis.kernel - 1) * axis.dilation;
  const int64_t lo = reach - span <= 0 ? 0 : (reach - span + axis.stride - 1) / axis.stride;
  const int64_t hi = reach < 0 ? -1 : reach / axis.stride;
  *first = lo;
  *last = hi < axis.output - 1 ? hi : axis.output - 1;
}

// The max of output (oh, ow)'s window, read(h, w) giving input (h, w), and its position
// h * width + w in the plane (-1 for a window wholly in the padding). NaN wins, as in PyTorch.
template <typename T, typename Read>
TESSEL_HOST_DEVICE inline void window_max(const PoolAxis& rows, const PoolAxis& cols, int64_t oh,
                                          int64_t ow, const Read& read, T* best_value,
                                          int64_t* best_position) {
  const int64_t h0 = oh * rows.stride - rows.padding, w0 = ow * cols.stride - cols.padding;
  T best = -static_cast<T>(INFINITY);
  int64_t best_index = -1;
  for (int64_t i = 0; i < rows.kernel; ++i) {
    const int64_t h = h0 + i * rows.dilation;
    if (h < 0 || h >= rows.input) continue;
    for (int64_t j = 0; j < cols.kernel; ++j) {
      const int64_t w = w0 + j * cols.dilation;
      if (w < 0 || w >= cols.input) continue;
      const T value = read(h, w);
      if (best_index < 0 || value > best || value != value) {
        best = value;
        best_index = h * cols.input + w;
      }
    }
  }
  *best_value = best;
  *best_position = best_index;
}

// PyTorch's avg window of output `o`: [start, end) clipped to the input, and the length of the
// window clipped only to input + padding (the divisor when count_include_pad).
struct AvgWindow {
  int64_t start, end, padded_count;
  TESSEL_HOST_DEVICE bool empty() const { return start >= end; }
  TESSEL_HOST_DEVICE bool contains(int64_t x) const { return x >= start && x < end; }
};

TESSEL_HOST_DEVICE inline AvgWindow avg_window(const PoolAxis& axis, int64_t o) {
  const int64_t start = o * axis.stride - axis.padding;
  const int64_t padded_end = axis.input + axis.padding;
  const int64_t end = start + axis.kernel < padded_end ? start + axis.kernel : padded_end;
  return {start > 0 ? start : 0, end < axis.input ? end : axis.input, end - start};
}

// What an avg window's sum is divided by.
TESSEL_HOST_DEVICE inline int64_t avg_divisor(const AvgWindow& wh, const AvgWindow& ww,
                                              bool count_include_pad) {
  return count_include_pad ? wh.padded_count * ww.padded_count
                           : (wh.end - wh.start) * (ww.end - ww.start);
}

// The sum over the window (wh x ww), read(h, w) giving input (h, w).
template <typename T, typename Read>
TESSEL_HOST_DEVICE inline T window_sum(const AvgWindow& wh, const AvgWindow& ww, const Read& read) {
  T total = 0;
  for (int64_t h = wh.start; h < wh.end; ++h)
    for (int64_t w = ww.start; w < ww.end; ++w) total += read(h, w);
  return total;
}

// avg_pool2d's value for the window (wh x ww): 0 for a window wholly in the padding.
template <typename T, typename Read>
TESSEL_HOST_DEVICE inline T window_average(const AvgWindow& wh, const AvgWindow& ww,
                                           bool count_include_pad, const Read& read) {
  const T total = window_sum<T>(wh, ww, read);
  if (wh.empty() || ww.empty()) return T(0);
  return total / static_cast<T>(avg_divisor(wh, ww, count_include_pad));
}

// PyTorch's adaptive window of output `o` (of `out`) over `in` inputs:
// [floor(o * in / out), ceil((o + 1) * in / out)).
TESSEL_HOST_DEVICE inline AvgWindow adaptive_window(int64_t o, int64_t in, int64_t out) {
  const int64_t start = (o * in) / out, end = ((o + 1) * in + out - 1) / out;
  return {start, end, end - start};
}

// The outputs [*first, *last] of an adaptive pool (`out` of them over `in` inputs) whose
// windows may hold input x: around the proportional ones, one more each side.
TESSEL_HOST_DEVICE inline void adaptive_covering_outputs(int64_t x, int64_t in, int64_t out,
                                                         int64_t* first, int64_t* last) {
  const int64_t lo = (x * out) / in - 1, hi = ((x + 1) * out) / in + 1;
  *first = lo > 0 ? lo : 0;
  *last = hi < out - 1 ? hi : out - 1;
}

}  // namespace tessel
