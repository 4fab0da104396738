// The CPU kernels of max_pool2d, avg_pool2d and adaptive_avg_pool2d and their gradients, with
// PyTorch's window rules (ops/math/pooling.h). Kernels read and write any strides directly.
#include "ops/pool.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ops/cpu/kernels.h"
#include "ops/math/pooling.h"
#include "ops/ops.h"
#include "ops/registry_helpers.h"

namespace tessel::cpu {

std::vector<int64_t> attr_pair(const Attrs& attrs, const char* op, const char* name) {
  const auto& values = attrs.get<std::vector<int64_t>>(name);
  TESSEL_CHECK(values.size() == 2, op, ": ", name, " must have 2 values (h, w), got ", values);
  return values;
}

// The two axes of a max/avg pool from its attributes and an input of `sizes` (N, C, H, W).
std::pair<PoolAxis, PoolAxis> pool_axes(const char* op, const Shape& sizes, const Attrs& attrs,
                                        bool with_dilation) {
  auto kernel = attr_pair(attrs, op, "kernel_size");
  auto stride = attr_pair(attrs, op, "stride");
  auto padding = attr_pair(attrs, op, "padding");
  std::vector<int64_t> dilation =
      with_dilation ? attr_pair(attrs, op, "dilation") : std::vector<int64_t>{1, 1};
  const bool ceil_mode = attrs.get<bool>("ceil_mode");
  TESSEL_CHECK(kernel[0] > 0 && kernel[1] > 0, op, ": kernel_size must be positive, got ", kernel);
  TESSEL_CHECK(stride[0] > 0 && stride[1] > 0, op, ": stride must be positive, got ", stride);
  TESSEL_CHECK(dilation[0] > 0 && dilation[1] > 0, op, ": dilation must be positive, got ",
               dilation);
  TESSEL_CHECK(padding[0] >= 0 && padding[1] >= 0 && padding[0] <= kernel[0] / 2 &&
                   padding[1] <= kernel[1] / 2,
               op, ": padding must be between 0 and half the kernel size, got padding ", padding,
               " for kernel_size ", kernel);
  PoolAxis axes[2];
  for (int i = 0; i < 2; ++i) {
    const int64_t input = sizes[2 + i];
    axes[i] = {
        input,       kernel[i],
        stride[i],   padding[i],
        dilation[i], pooled_size(input, kernel[i], padding[i], stride[i], dilation[i], ceil_mode)};
  }
  TESSEL_CHECK(axes[0].output > 0 && axes[1].output > 0, op, ": input shape ", shape_str(sizes),
               " is too small for kernel_size ", kernel, " (dilation ", dilation, ", padding ",
               padding, "): the output would be ", axes[0].output, "x", axes[1].output);
  return {axes[0], axes[1]};
}

namespace {

int64_t plane_count(const Tensor& t) { return t.size(0) * t.size(1); }

int64_t plane_grain(int64_t plane_work) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(plane_work, 1));
}

// Accumulates a gradient plane by plane: `fill(plane, accumulator)` adds into a dense zeroed
// H*W buffer, which is then written into the (strided) output. Planes never overlap, so each
// thread owns the planes it is given.
template <typename T, typename Fill>
void scatter_planes(KernelContext& context, const Fill& fill) {
  const Tensor& out = context.outputs[0];
  const Planes geometry = planes_of(out);
  const int64_t plane = geometry.height * geometry.width;
  const int64_t planes = plane_count(out);
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(get_num_threads(), planes));
  T* scratch = context.workspace({chunks, plane}, out.dtype()).template data_ptr<T>();
  T* out_data = out.data_ptr<T>();
  parallel_for(0, chunks, 1, [&](int64_t chunk_begin, int64_t chunk_end) {
    for (int64_t chunk = chunk_begin; chunk < chunk_end; ++chunk) {
      T* acc = scratch + chunk * plane;
      for (int64_t p = planes * chunk / chunks; p < planes * (chunk + 1) / chunks; ++p) {
        std::fill(acc, acc + plane, T(0));
        fill(p, acc);
        T* target = out_data + geometry.plane_offset(p);
        for (int64_t h = 0; h < geometry.height; ++h)
          for (int64_t w = 0; w < geometry.width; ++w)
            target[geometry.at(h, w)] = acc[h * geometry.width + w];
      }
    }
  });
}

// ---- max_pool2d ----

// Tap by tap over all of a plane's windows at once. Each plane is copied into a padded plane of
// its own (-inf around it, room for every window, ceil_mode's last ones included); its taps are
// gathered as rows of columns (row t: tap t of every window), and each row is folded into the
// running maxima by a loop over the windows that vectorises and has no branch to mispredict (a
// comparison per tap chained through one window's taps mispredicts on data like activations).
// The taps are taken in window_max's order with its rule (a window's first real tap starts it,
// a later one wins when greater or NaN); a padding tap, -inf at position -1, is never greater
// and never counts as a start, so the value and position are window_max's. Large planes go by
// blocks of output rows, so the tables stay small.
template <typename T>
void max_pool_forward(KernelContext& context) {
  const Tensor& x = context.inputs[0];
  const Tensor& values = context.outputs[0];
  const Tensor& indices = context.outputs[1];
  // Not a structured binding: C++17 lambdas cannot capture those (clang rejects it).
  const auto axes = pool_axes("max_pool2d", x.sizes(), context.attrs, true);
  const PoolAxis& rows = axes.first;
  const PoolAxis& cols = axes.second;
  const Planes in = planes_of(x), out = planes_of(values), index = planes_of(indices);
  const T* x_data = x.data_ptr<T>();
  T* value_data = values.data_ptr<T>();
  int64_t* index_data = indices.data_ptr<int64_t>();
  const int64_t taps = rows.kernel * cols.kernel;
  constexpr int64_t kMaxTableEntries = int64_t{1} << 16;
  const int64_t block_rows =
      std::clamp<int64_t>(kMaxTableEntries / (taps * cols.output), 1, rows.output);
  const int64_t block_windows = block_rows * cols.output;
  // A block's padded rows (from the first its windows read) and columns.
  const int64_t padded_h = (block_rows - 1) * rows.stride + (rows.kernel - 1) * rows.dilation + 1;
  const int64_t padded_w =
      std::max(cols.input + 2 * cols.padding,
               (cols.output - 1) * cols.stride + (cols.kernel - 1) * cols.dilation + 1);
  // For tap t of window k of a block (entry t * block_windows + k): its entry in the block's
  // padded rows (the same for every block) and its position h * W + w in the input plane (-1 in
  // the padding; per block).
  std::vector<int64_t> padded_at(static_cast<size_t>(taps * block_windows));
  std::vector<int64_t> position(padded_at.size());
  for (int64_t i = 0; i < rows.kernel; ++i)
    for (int64_t j = 0; j < cols.kernel; ++j)
      for (int64_t r = 0; r < block_rows; ++r)
        for (int64_t ow = 0; ow < cols.output; ++ow)
          padded_at[(i * cols.kernel + j) * block_windows + r * cols.output + ow] =
              (r * rows.stride + i * rows.dilation) * padded_w + ow * cols.stride +
              j * cols.dilation;
  for (int64_t first_row = 0; first_row < rows.output; first_row += block_rows) {
    const int64_t windows = std::min(block_rows, rows.output - first_row) * cols.output;
    const int64_t top = first_row * rows.stride - rows.padding;  // input row of padded row 0
    for (int64_t i = 0; i < rows.kernel; ++i) {
      for (int64_t j = 0; j < cols.kernel; ++j) {
        for (int64_t k = 0; k < windows; ++k) {
          const int64_t h = top + (k / cols.output) * rows.stride + i * rows.dilation;
          const int64_t w = (k % cols.output) * cols.stride + j * cols.dilation - cols.padding;
          const bool inside = h >= 0 && h < rows.input && w >= 0 && w < cols.input;
          position[(i * cols.kernel + j) * block_windows + k] = inside ? h * cols.input + w : -1;
        }
      }
    }
    parallel_for(0, plane_count(x), plane_grain(windows * taps), [&](int64_t begin, int64_t end) {
      std::vector<T> padded(static_cast<size_t>(padded_h * padded_w), -static_cast<T>(INFINITY));
      std::vector<T> columns(position.size()), best(static_cast<size_t>(windows));
      std::vector<int64_t> best_index(best.size());
      T* best_data = best.data();
      int64_t* best_index_data = best_index.data();
      for (int64_t p = begin; p < end; ++p) {
        const T* plane = x_data + in.plane_offset(p);
        for (int64_t padded_row = 0; padded_row < padded_h; ++padded_row) {
          T* row = padded.data() + padded_row * padded_w + cols.padding;
          const int64_t h = top + padded_row;
          if (h < 0 || h >= rows.input) {
            std::fill(row, row + cols.input, -static_cast<T>(INFINITY));
          } else if (in.stride_w == 1) {
            std::copy(plane + h * in.stride_h, plane + h * in.stride_h + cols.input, row);
          } else {
            for (int64_t w = 0; w < cols.input; ++w) row[w] = plane[in.at(h, w)];
          }
        }
        for (int64_t t = 0; t < taps; ++t) {
          const int64_t* tap_at = padded_at.data() + t * block_windows;
          T* tap_value = columns.data() + t * block_windows;
          for (int64_t k = 0; k < windows; ++k) tap_value[k] = padded[tap_at[k]];
        }
        std::copy(columns.begin(), columns.begin() + windows, best.begin());
        std::copy(position.begin(), position.begin() + windows, best_index.begin());
        for (int64_t t = 1; t < taps; ++t) {
          const T* tap_value = columns.data() + t * block_windows;
          const int64_t* tap_position = position.data() + t * block_windows;
#pragma omp simd
          for (int64_t k = 0; k < windows; ++k) {
            const T value = tap_value[k];
            const bool take = (best_index_data[k] < 0) | (value > best_data[k]) | (value != value);
            best_data[k] = take ? value : best_data[k];
            best_index_data[k] = take ? tap_position[k] : best_index_data[k];
          }
        }
        T* value_plane = value_data + out.plane_offset(p);
        int64_t* index_plane = index_data + index.plane_offset(p);
        for (int64_t k = 0; k < windows; ++k) {
          const int64_t oh = first_row + k / cols.output, ow = k % cols.output;
          value_plane[out.at(oh, ow)] = best_data[k];
          index_plane[index.at(oh, ow)] = best_index_data[k];
        }
      }
    });
  }
}

template <typename T>
void max_pool_backward(KernelContext& context) {
  const Tensor& grad = context.inputs[0];
  const Tensor& indices = context.inputs[1];
  const Planes g = planes_of(grad), index = planes_of(indices);
  const T* grad_data = grad.data_ptr<T>();
  const int64_t* index_data = indices.data_ptr<int64_t>();
  const int64_t in_plane = context.outputs[0].size(2) * context.outputs[0].size(3);
  scatter_planes<T>(context, [&](int64_t p, T* acc) {
    const T* grad_plane = grad_data + g.plane_offset(p);
    const int64_t* index_plane = index_data + index.plane_offset(p);
    for (int64_t oh = 0; oh < g.height; ++oh) {
      for (int64_t ow = 0; ow < g.width; ++ow) {
        const int64_t at = index_plane[index.at(oh, ow)];
        if (at >= 0 && at < in_plane) acc[at] += grad_plane[g.at(oh, ow)];
      }
    }
  });
}

// ---- avg_pool2d ----

template <typename T>
void avg_pool_forward(KernelContext& context) {
  const Tensor& x = context.inputs[0];
  const Tensor& values = context.outputs[0];
  const auto axes = pool_axes("avg_pool2d", x.sizes(), context.attrs, false);
  const PoolAxis& rows = axes.first;
  const PoolAxis& cols = axes.second;
  const bool count_include_pad = context.attrs.get<bool>("count_include_pad");
  const Planes in = planes_of(x), out = planes_of(values);
  const T* x_data = x.data_ptr<T>();
  T* value_data = values.data_ptr<T>();
  const int64_t work = rows.output * cols.output * rows.kernel * cols.kernel;
  parallel_for(0, plane_count(x), plane_grain(work), [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const T* plane = x_data + in.plane_offset(p);
      T* value_plane = value_data + out.plane_offset(p);
      for (int64_t oh = 0; oh < rows.output; ++oh) {
        const AvgWindow wh = avg_window(rows, oh);
        for (int64_t ow = 0; ow < cols.output; ++ow) {
          const AvgWindow ww = avg_window(cols, ow);
          value_plane[out.at(oh, ow)] = window_average<T>(
              wh, ww, count_include_pad, [&](int64_t h, int64_t w) { return plane[in.at(h, w)]; });
        }
      }
    }
  });
}

template <typename T>
void avg_pool_backward(KernelContext& context) {
  const Tensor& grad = context.inputs[0];
  const auto axes =
      pool_axes("avg_pool2d", context.outputs[0].sizes(), context.attrs, /*with_dilation=*/false);
  const PoolAxis& rows = axes.first;
  const PoolAxis& cols = axes.second;
  const bool count_include_pad = context.attrs.get<bool>("count_include_pad");
  const Planes g = planes_of(grad);
  const T* grad_data = grad.data_ptr<T>();
  const int64_t width = cols.input;
  scatter_planes<T>(context, [&](int64_t p, T* acc) {
    const T* grad_plane = grad_data + g.plane_offset(p);
    for (int64_t oh = 0; oh < rows.output; ++oh) {
      const AvgWindow wh = avg_window(rows, oh);
      for (int64_t ow = 0; ow < cols.output; ++ow) {
        const AvgWindow ww = avg_window(cols, ow);
        if (wh.empty() || ww.empty()) continue;
        const T share =
            grad_plane[g.at(oh, ow)] / static_cast<T>(avg_divisor(wh, ww, count_include_pad));
        for (int64_t h = wh.start; h < wh.end; ++h)
          for (int64_t w = ww.start; w < ww.end; ++w) acc[h * width + w] += share;
      }
    }
  });
}

// ---- adaptive_avg_pool2d ----

template <typename T>
void adaptive_avg_forward(KernelContext& context) {
  const Tensor& x = context.inputs[0];
  const Tensor& values = context.outputs[0];
  const Planes in = planes_of(x), out = planes_of(values);
  const int64_t out_h = values.size(2), out_w = values.size(3);
  const T* x_data = x.data_ptr<T>();
  T* value_data = values.data_ptr<T>();
  parallel_for(
      0, plane_count(x), plane_grain(in.height * in.width), [&](int64_t begin, int64_t end) {
        for (int64_t p = begin; p < end; ++p) {
          const T* plane = x_data + in.plane_offset(p);
          T* value_plane = value_data + out.plane_offset(p);
          for (int64_t oh = 0; oh < out_h; ++oh) {
            const AvgWindow wh = adaptive_window(oh, in.height, out_h);
            for (int64_t ow = 0; ow < out_w; ++ow) {
              const AvgWindow ww = adaptive_window(ow, in.width, out_w);
              const T total =
                  window_sum<T>(wh, ww, [&](int64_t h, int64_t w) { return plane[in.at(h, w)]; });
              value_plane[out.at(oh, ow)] = total / static_cast<T>(avg_divisor(wh, ww, false));
            }
          }
        }
      });
}

template <typename T>
void adaptive_avg_backward(KernelContext& context) {
  const Tensor& grad = context.inputs[0];
  const Planes g = planes_of(grad);
  const int64_t in_h = context.outputs[0].size(2), in_w = context.outputs[0].size(3);
  const T* grad_data = grad.data_ptr<T>();
  scatter_planes<T>(context, [&](int64_t p, T* acc) {
    const T* grad_plane = grad_data + g.plane_offset(p);
    for (int64_t oh = 0; oh < g.height; ++oh) {
      const AvgWindow wh = adaptive_window(oh, in_h, g.height);
      for (int64_t ow = 0; ow < g.width; ++ow) {
        const AvgWindow ww = adaptive_window(ow, in_w, g.width);
        const T share = grad_plane[g.at(oh, ow)] / static_cast<T>(avg_divisor(wh, ww, false));
        for (int64_t h = wh.start; h < wh.end; ++h)
          for (int64_t w = ww.start; w < ww.end; ++w) acc[h * in_w + w] += share;
      }
    }
  });
}

}  // namespace

void max_pool2d_kernel(KernelContext& context) {
  visit_float_dtype(context.outputs[0].dtype(), ops::max_pool2d.name(),
                    [&](auto tag) { max_pool_forward<decltype(tag)>(context); });
}

void max_pool2d_backward_kernel(KernelContext& context) {
  visit_float_dtype(context.outputs[0].dtype(), ops::max_pool2d_backward.name(),
                    [&](auto tag) { max_pool_backward<decltype(tag)>(context); });
}

void avg_pool2d_kernel(KernelContext& context) {
  visit_float_dtype(context.outputs[0].dtype(), ops::avg_pool2d.name(),
                    [&](auto tag) { avg_pool_forward<decltype(tag)>(context); });
}

void avg_pool2d_backward_kernel(KernelContext& context) {
  visit_float_dtype(context.outputs[0].dtype(), ops::avg_pool2d_backward.name(),
                    [&](auto tag) { avg_pool_backward<decltype(tag)>(context); });
}

void adaptive_avg_pool2d_kernel(KernelContext& context) {
  visit_float_dtype(context.outputs[0].dtype(), ops::adaptive_avg_pool2d.name(),
                    [&](auto tag) { adaptive_avg_forward<decltype(tag)>(context); });
}

void adaptive_avg_pool2d_backward_kernel(KernelContext& context) {
  visit_float_dtype(context.outputs[0].dtype(), ops::adaptive_avg_pool2d_backward.name(),
                    [&](auto tag) { adaptive_avg_backward<decltype(tag)>(context); });
}

}  // namespace tessel::cpu
