// The CPU kernels of conv2d (NCHW, stride, padding, dilation, groups, optional bias) and its
// two backward ops. Grouped and dense convolutions run as im2col + GEMM (the column buffer
// comes from the kernel workspace, so the allocator counts it); depthwise ones (one input
// channel per group) run directly. Images are spread over threads when the batch allows.
#include "ops/cpu/conv.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "ops/conv.h"
#include "ops/cpu/gemm.h"
#include "ops/cpu/strided_copy.h"
#include "ops/cpu/winograd_gemm.h"
#include "ops/math/dtype_visit.h"
#include "ops/ops.h"
#include "ops/registry_helpers.h"

namespace tessel::cpu {

namespace {

const std::vector<int64_t>& pair_attr(const Attrs& attrs, const char* name) {
  const auto& values = attrs.get<std::vector<int64_t>>(name);
  TESSEL_CHECK(values.size() == 2, "conv2d: ", name, " must have 2 values (h, w), got ", values);
  return values;
}

}  // namespace

ConvGeometry make_geometry(const Shape& input, const Shape& weight, const Attrs& attrs) {
  TESSEL_CHECK(input.size() == 4, "conv2d: expected a 4-D input (N, C, H, W), got shape ",
               shape_str(input));
  TESSEL_CHECK(weight.size() == 4,
               "conv2d: expected a 4-D weight (out_channels, in_channels / groups, kH, kW), got "
               "shape ",
               shape_str(weight));
  const auto& stride = pair_attr(attrs, "stride");
  const auto& padding = pair_attr(attrs, "padding");
  const auto& dilation = pair_attr(attrs, "dilation");
  const int64_t groups = attrs.get<int64_t>("groups");
  TESSEL_CHECK(stride[0] > 0 && stride[1] > 0, "conv2d: stride must be positive, got ", stride);
  TESSEL_CHECK(dilation[0] > 0 && dilation[1] > 0, "conv2d: dilation must be positive, got ",
               dilation);
  TESSEL_CHECK(padding[0] >= 0 && padding[1] >= 0, "conv2d: padding must be non-negative, got ",
               padding);
  TESSEL_CHECK(groups > 0, "conv2d: groups must be positive, got ", groups);
  ConvGeometry g{};
  g.batch = input[0], g.in_channels = input[1], g.height = input[2], g.width = input[3];
  g.out_channels = weight[0], g.kernel_h = weight[2], g.kernel_w = weight[3];
  g.stride_h = stride[0], g.stride_w = stride[1];
  g.pad_h = padding[0], g.pad_w = padding[1];
  g.dilation_h = dilation[0], g.dilation_w = dilation[1];
  g.groups = groups;
  const char* groups_note = groups > 1 ? ", groups=" : "";
  TESSEL_CHECK(g.in_channels == weight[1] * groups, "conv2d: input has ", g.in_channels,
               " channels but weight expects ", weight[1] * groups, " (weight shape ",
               shape_str(weight), groups_note, groups > 1 ? std::to_string(groups) : "", ")");
  TESSEL_CHECK(g.out_channels % groups == 0, "conv2d: groups=", groups,
               " does not divide the weight's ", g.out_channels, " output channels (weight shape ",
               shape_str(weight), ")");
  TESSEL_CHECK(g.kernel_h > 0 && g.kernel_w > 0, "conv2d: empty kernel (weight shape ",
               shape_str(weight), ")");
  const int64_t span_h = (g.kernel_h - 1) * g.dilation_h + 1;
  const int64_t span_w = (g.kernel_w - 1) * g.dilation_w + 1;
  const int64_t padded_h = g.height + 2 * g.pad_h, padded_w = g.width + 2 * g.pad_w;
  TESSEL_CHECK(span_h <= padded_h && span_w <= padded_w, "conv2d: kernel ", span_h, "x", span_w,
               " (weight shape ", shape_str(weight), ", dilation ", dilation,
               ") is larger than the padded input ", padded_h, "x", padded_w, " (input shape ",
               shape_str(input), ", padding ", padding, ")");
  g.out_h = (padded_h - span_h) / g.stride_h + 1;
  g.out_w = (padded_w - span_w) / g.stride_w + 1;
  return g;
}

ConvGeometry geometry_from_attr(const Attrs& attrs, const char* name, const Shape& other,
                                bool other_is_weight) {
  const auto& sizes = attrs.get<std::vector<int64_t>>(name);
  return other_is_weight ? make_geometry(sizes, other, attrs) : make_geometry(other, sizes, attrs);
}

namespace {

// Row stride of the (channels, H*W) matrix of one image when its planes are dense, else -1.
int64_t plane_matrix_ld(const Tensor& t) {
  const int64_t h = t.size(2), w = t.size(3);
  bool dense_rows = w <= 1 || t.stride(3) == 1;
  bool dense_plane = h <= 1 || t.stride(2) == w;
  if (!dense_rows || !dense_plane) return -1;
  if (t.size(1) <= 1) return std::max<int64_t>(h * w, 1);
  return t.stride(1) >= h * w ? t.stride(1) : -1;
}

bool shares_storage(const Tensor& output, const std::vector<Tensor>& inputs) {
  for (const auto& input : inputs)
    if (input.defined() && input.storage() == output.storage()) return true;
  return false;
}

// An output's (channels, H*W) matrices as a kernel writes them: in place when the planes are
// dense and no input shares the storage, else through a dense workspace copied back at the end.
template <typename T>
struct PlaneOutput {
  Tensor target;
  T* data = nullptr;
  int64_t ld = 0, batch_stride = 0;
  bool staged = false;
  PlaneOutput(KernelContext& context, const Tensor& output) : target(output) {
    int64_t row_ld = plane_matrix_ld(output);
    if (row_ld < 0 || shares_storage(output, context.inputs)) {
      staged = true;
      target = context.workspace(output.sizes(), output.dtype());
      row_ld = output.size(2) * output.size(3);
    }
    data = target.data_ptr<T>();
    ld = row_ld;
    batch_stride = target.stride(0);
  }
  void finish(const Tensor& output) const {
    if (staged) cpu::copy_strided(target, output);
  }
};

// A read-only (channels, H*W) view of one tensor's images, copied dense when needed.
template <typename T>
struct PlaneInput {
  const T* data = nullptr;
  int64_t ld = 0, batch_stride = 0;
  PlaneInput(KernelContext& context, const Tensor& input) {
    Tensor source = input;
    int64_t row_ld = plane_matrix_ld(input);
    if (row_ld < 0) {
      source = cpu::dense_input(context, input);
      row_ld = input.size(2) * input.size(3);
    }
    data = source.data_ptr<T>();
    ld = row_ld;
    batch_stride = source.stride(0);
  }
};

// Splits the batch into at most get_num_threads() contiguous chunks and runs
// fn(chunk, first_image, end_image) for each, one chunk per thread.
int64_t batch_chunks(int64_t batch) {
  return std::max<int64_t>(1, std::min<int64_t>(get_num_threads(), batch));
}
template <typename Fn>
void for_each_batch_chunk(int64_t batch, int64_t chunks, const Fn& fn) {
  parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t chunk = begin; chunk < end; ++chunk)
      fn(chunk, batch * chunk / chunks, batch * (chunk + 1) / chunks);
  });
}

// The first and one-past-last output column whose input column ow*stride + offset lies in
// [0, size).
inline void valid_range(int64_t offset, int64_t stride, int64_t size, int64_t outputs,
                        int64_t* first, int64_t* last) {
  int64_t lo = offset >= 0 ? 0 : (-offset + stride - 1) / stride;
  int64_t hi = size - offset <= 0 ? 0 : (size - 1 - offset) / stride + 1;
  *first = std::min(lo, outputs);
  *last = std::max(*first, std::min(hi, outputs));
}

// out (H*W) = the dense plane (H, W) shifted by (dh, dw): out[h, w] = plane[h + dh, w + dw],
// 0 outside. One run copy for all rows, then the columns that wrapped into a neighbouring row
// are zeroed: row by row copies cost more than the data in late stages (rows of 8 or 4 values).
template <typename T>
void shifted_plane(const T* plane, int64_t H, int64_t W, int64_t dh, int64_t dw, T* out) {
  const int64_t first_row = std::clamp<int64_t>(-dh, 0, H);
  const int64_t last_row = std::clamp<int64_t>(H - dh, first_row, H);
  if (last_row == first_row || dw >= W || -dw >= W) {
    std::fill(out, out + H * W, T(0));
    return;
  }
  std::fill(out, out + first_row * W, T(0));
  std::fill(out + last_row * W, out + H * W, T(0));
  T* dst = out + first_row * W;
  const T* src = plane + (first_row + dh) * W + dw;
  const int64_t count = (last_row - first_row) * W;
  // Only reads inside the plane: the |dw| values past one end of the run are zeros anyway.
  const int64_t begin = dw < 0 ? -dw : 0, end = dw > 0 ? count - dw : count;
  std::fill(dst, dst + begin, T(0));
  std::copy(src + begin, src + end, dst + begin);
  std::fill(dst + end, dst + count, T(0));
  for (int64_t r = 0; r < last_row - first_row; ++r) {
    T* out_row = dst + r * W;
    if (dw > 0) std::fill(out_row + W - dw, out_row + W, T(0));
    if (dw < 0) std::fill(out_row, out_row - dw, T(0));
  }
}

// row[0..width) = even[0], odd[0], even[1], odd[1], ... (a row from its two stride phases).
template <typename T>
inline void interleave_pair(const T* even, const T* odd, int64_t width, T* row) {
  const int64_t pairs = width / 2;
#pragma omp simd
  for (int64_t t = 0; t < pairs; ++t) {
    row[2 * t] = even[t];
    row[2 * t + 1] = odd[t];
  }
  if (width % 2) row[width - 1] = even[pairs];
}

// The inverse: even[t] = row[2 t], odd[t] = row[2 t + 1]; a last odd column goes to even only.
template <typename T>
inline void deinterleave_pair(const T* row, int64_t width, T* even, T* odd) {
  const int64_t pairs = width / 2;
#pragma omp simd
  for (int64_t t = 0; t < pairs; ++t) {
    even[t] = row[2 * t];
    odd[t] = row[2 * t + 1];
  }
  if (width % 2) even[pairs] = row[width - 1];
}

// Output rows of fewer than 8 values (late ResNet stages: 7x7, 4x4) go through per-tap index
// tables in im2col and col2im: one pass per column row, where the run copies and fills of the
// general paths cost more in call overhead than the few values they move (from 8 values on,
// the runs are as fast or faster).
bool uses_tap_tables(const ConvGeometry& g) { return g.out_w < 8 && g.out_plane() <= 1024; }

// table[t * OH*OW + p]: offset in a channel (rows row_stride, columns col_stride) of the input
// pixel that output pixel p reads through tap t = ki * KW + kj, or -1 in the padding.
std::vector<int64_t> im2col_table(const ConvGeometry& g, int64_t row_stride, int64_t col_stride) {
  std::vector<int64_t> table(g.kernel_h * g.kernel_w * g.out_plane(), -1);
  int64_t* entry = table.data();
  for (int64_t ki = 0; ki < g.kernel_h; ++ki) {
    for (int64_t kj = 0; kj < g.kernel_w; ++kj) {
      for (int64_t oh = 0; oh < g.out_h; ++oh) {
        for (int64_t ow = 0; ow < g.out_w; ++ow, ++entry) {
          const int64_t ih = oh * g.stride_h - g.pad_h + ki * g.dilation_h;
          const int64_t iw = ow * g.stride_w - g.pad_w + kj * g.dilation_w;
          if (ih >= 0 && ih < g.height && iw >= 0 && iw < g.width)
            *entry = ih * row_stride + iw * col_stride;
        }
      }
    }
  }
  return table;
}

// table[t * H*W + i]: the output pixel that reads input pixel i (dense H x W plane) through tap
// t, or -1 when none does (each tap reads a pixel at most once).
std::vector<int64_t> col2im_table(const ConvGeometry& g) {
  const int64_t in_plane = g.height * g.width;
  std::vector<int64_t> table(g.kernel_h * g.kernel_w * in_plane, -1);
  for (int64_t ki = 0; ki < g.kernel_h; ++ki) {
    for (int64_t kj = 0; kj < g.kernel_w; ++kj) {
      int64_t* tap = table.data() + (ki * g.kernel_w + kj) * in_plane;
      for (int64_t oh = 0; oh < g.out_h; ++oh) {
        for (int64_t ow = 0; ow < g.out_w; ++ow) {
          const int64_t ih = oh * g.stride_h - g.pad_h + ki * g.dilation_h;
          const int64_t iw = ow * g.stride_w - g.pad_w + kj * g.dilation_w;
          if (ih >= 0 && ih < g.height && iw >= 0 && iw < g.width)
            tap[ih * g.width + iw] = oh * g.out_w + ow;
        }
      }
    }
  }
  return table;
}

// Writes one image's group into columns (Cg*KH*KW rows of OH*OW, row stride columns_ld): channel
// plane c at image + c * channel_stride, rows h * row_stride, columns w * col_stride. `table`:
// im2col_table for these strides, or null.
template <typename T>
void im2col(const ConvGeometry& g, const T* image, int64_t channel_stride, int64_t row_stride,
            int64_t col_stride, T* columns, int64_t columns_ld, const int64_t* table) {
  if (table) {
    const int64_t taps = g.kernel_h * g.kernel_w, plane = g.out_plane();
    for (int64_t c = 0; c < g.in_per_group(); ++c) {
      const T* channel = image + c * channel_stride;
      for (int64_t t = 0; t < taps; ++t) {
        T* row = columns + (c * taps + t) * columns_ld;
        const int64_t* source = table + t * plane;
#pragma omp simd
        for (int64_t p = 0; p < plane; ++p) row[p] = source[p] >= 0 ? channel[source[p]] : T(0);
      }
    }
    return;
  }
  // Stride 1 keeping the plane size (3x3 padding 1) over dense rows: whole shifted planes.
  const bool same_plane = g.stride_h == 1 && g.stride_w == 1 && col_stride == 1 &&
                          row_stride == g.width && g.out_h == g.height && g.out_w == g.width;
  // Strided columns over dense rows: each row split once into its stride's phases (phase r holds
  // columns r, r + stride, ...), zeros on both sides, so every tap's output row is one straight
  // run of a phase (no gather of every stride-th value, no fills around it: output rows of a
  // stride-2 layer are short, 14 or 7 values, and calls per run cost more than the values).
  const int64_t stride_w = g.stride_w;
  const bool phased = stride_w > 1 && col_stride == 1;
  const int64_t phase_w = (g.width + stride_w - 1) / stride_w;
  // Input column ow * stride + offset_w of tap kj is entry ow + shift(kj) of phase
  // phase_of(kj); a padded phase row holds `left` zeros before entry 0.
  auto phase_of = [&](int64_t kj) {
    const int64_t offset_w = kj * g.dilation_w - g.pad_w;
    return ((offset_w % stride_w) + stride_w) % stride_w;
  };
  auto shift_of = [&](int64_t kj) {
    return (kj * g.dilation_w - g.pad_w - phase_of(kj)) / stride_w;
  };
  int64_t left = 0, padded_w = 0;
  if (phased) {
    int64_t reach = phase_w;
    for (int64_t kj = 0; kj < g.kernel_w; ++kj) {
      left = std::max(left, -shift_of(kj));
      reach = std::max(reach, g.out_w + shift_of(kj));
    }
    padded_w = left + reach;
  }
  // Zero once: each channel writes the same entries (a phase's columns), the rest stay zero.
  std::vector<T> phases(phased ? static_cast<size_t>(g.height * stride_w * padded_w) : 0);
  for (int64_t c = 0; c < g.in_per_group(); ++c) {
    const T* channel = image + c * channel_stride;
    if (phased) {
      for (int64_t ih = 0; ih < g.height; ++ih) {
        const T* in = channel + ih * row_stride;
        T* phase = phases.data() + ih * stride_w * padded_w + left;
        if (stride_w == 2) {
          deinterleave_pair(in, g.width, phase, phase + padded_w);
          continue;
        }
        for (int64_t r = 0; r < stride_w; ++r) {
          const int64_t count = (g.width - r + stride_w - 1) / stride_w;
          for (int64_t m = 0; m < count; ++m) phase[r * padded_w + m] = in[m * stride_w + r];
        }
      }
    }
    for (int64_t ki = 0; ki < g.kernel_h; ++ki) {
      for (int64_t kj = 0; kj < g.kernel_w; ++kj) {
        T* row = columns + ((c * g.kernel_h + ki) * g.kernel_w + kj) * columns_ld;
        const int64_t offset_w = kj * g.dilation_w - g.pad_w;
        if (same_plane) {
          shifted_plane(channel, g.height, g.width, ki * g.dilation_h - g.pad_h, offset_w, row);
          continue;
        }
        int64_t first = 0, last = 0;
        if (!phased) valid_range(offset_w, g.stride_w, g.width, g.out_w, &first, &last);
        const int64_t tap_start = phased ? phase_of(kj) * padded_w + left + shift_of(kj) : 0;
        for (int64_t oh = 0; oh < g.out_h; ++oh) {
          T* out = row + oh * g.out_w;
          const int64_t ih = oh * g.stride_h - g.pad_h + ki * g.dilation_h;
          if (ih < 0 || ih >= g.height) {
#pragma omp simd
            for (int64_t ow = 0; ow < g.out_w; ++ow) out[ow] = T(0);
            continue;
          }
          if (phased) {
            const T* run = phases.data() + ih * stride_w * padded_w + tap_start;
#pragma omp simd
            for (int64_t ow = 0; ow < g.out_w; ++ow) out[ow] = run[ow];
            continue;
          }
          const T* in = channel + ih * row_stride;
          std::fill(out, out + first, T(0));
          if (g.stride_w == 1 && col_stride == 1) {
            std::memcpy(out + first, in + first + offset_w,
                        static_cast<size_t>(last - first) * sizeof(T));
          } else {
            for (int64_t ow = first; ow < last; ++ow)
              out[ow] = in[(ow * g.stride_w + offset_w) * col_stride];
          }
          std::fill(out + last, out + g.out_w, T(0));
        }
      }
    }
  }
}

// plane (H, W) += column row (H*W) shifted by (dh, dw): plane[h + dh, w + dw] += row[h, w] where
// inside. The row's entries that would wrap into a neighbouring plane row are zeroed first (the
// row is scratch), so one run adds all rows at once.
template <typename T>
void add_shifted_plane(T* row, int64_t H, int64_t W, int64_t dh, int64_t dw, T* plane) {
  const int64_t first_row = std::clamp<int64_t>(-dh, 0, H);
  const int64_t last_row = std::clamp<int64_t>(H - dh, first_row, H);
  if (last_row == first_row || dw >= W || -dw >= W) return;
  T* src = row + first_row * W;
  T* dst = plane + (first_row + dh) * W + dw;
  const int64_t count = (last_row - first_row) * W;
  for (int64_t r = 0; r < last_row - first_row; ++r) {
    T* src_row = src + r * W;
    if (dw > 0) std::fill(src_row + W - dw, src_row + W, T(0));
    if (dw < 0) std::fill(src_row, src_row - dw, T(0));
  }
  // Only writes inside the plane: the |dw| entries past one end of the run are outside it.
  const int64_t begin = dw < 0 ? -dw : 0, end = dw > 0 ? count - dw : count;
#pragma omp simd
  for (int64_t i = begin; i < end; ++i) dst[i] += src[i];
}

// Adds columns (Cg*KH*KW rows of OH*OW, row stride columns_ld) back into one image's group
// planes (dense, H*W each). The columns are scratch: the same-plane path zeroes some entries.
// With `table` (col2im_table), or strided columns, the planes are written, not added to: they
// need no zeroing (col2im_writes).
inline bool col2im_writes(const ConvGeometry& g, const int64_t* table) {
  return table || g.stride_w > 1;
}

template <typename T>
void col2im(const ConvGeometry& g, T* columns, int64_t columns_ld, T* image, int64_t channel_stride,
            const int64_t* table) {
  if (table) {
    // Taps in the order of the general path, so the sums round the same way.
    const int64_t taps = g.kernel_h * g.kernel_w, in_plane = g.height * g.width;
    for (int64_t c = 0; c < g.in_per_group(); ++c) {
      T* channel = image + c * channel_stride;
      const T* rows = columns + c * taps * columns_ld;
      const int64_t* source = table;
#pragma omp simd
      for (int64_t i = 0; i < in_plane; ++i)
        channel[i] = T(0) + (source[i] >= 0 ? rows[source[i]] : T(0));
      for (int64_t t = 1; t < taps; ++t) {
        const T* row = rows + t * columns_ld;
        source = table + t * in_plane;
#pragma omp simd
        for (int64_t i = 0; i < in_plane; ++i) channel[i] += source[i] >= 0 ? row[source[i]] : T(0);
      }
    }
    return;
  }
  const bool same_plane = g.stride_h == 1 && g.stride_w == 1 && g.out_h == g.height &&
                          g.out_w == g.width && channel_stride >= g.height * g.width;
  // Strided columns: each tap adds a run onto one of the stride's phases of the row (as im2col
  // reads them), the phases interleaved into the plane once per channel, instead of adding every
  // stride-th value (what a stride-2 convolution's input gradient spent its time on). Every pixel
  // still sums its taps in the same order.
  const int64_t stride_w = g.stride_w;
  const bool phased = stride_w > 1;
  const int64_t phase_w = (g.width + stride_w - 1) / stride_w;
  std::vector<T> phases(phased ? static_cast<size_t>(g.height * stride_w * phase_w) : 0);
  for (int64_t c = 0; c < g.in_per_group(); ++c) {
    T* channel = image + c * channel_stride;
    if (phased) std::fill(phases.begin(), phases.end(), T(0));
    for (int64_t ki = 0; ki < g.kernel_h; ++ki) {
      for (int64_t kj = 0; kj < g.kernel_w; ++kj) {
        T* row = columns + ((c * g.kernel_h + ki) * g.kernel_w + kj) * columns_ld;
        const int64_t offset_w = kj * g.dilation_w - g.pad_w;
        if (same_plane) {
          add_shifted_plane(row, g.height, g.width, ki * g.dilation_h - g.pad_h, offset_w, channel);
          continue;
        }
        int64_t first, last;
        valid_range(offset_w, g.stride_w, g.width, g.out_w, &first, &last);
        const int64_t phase_of_tap = ((offset_w % stride_w) + stride_w) % stride_w;
        const int64_t shift = (offset_w - phase_of_tap) / stride_w;
        for (int64_t oh = 0; oh < g.out_h; ++oh) {
          const int64_t ih = oh * g.stride_h - g.pad_h + ki * g.dilation_h;
          if (ih < 0 || ih >= g.height) continue;
          const T* in = row + oh * g.out_w;
          // Columns and image are separate buffers: vectorise (-O2 alone does not).
          T* shifted = phased ? phases.data() + (ih * stride_w + phase_of_tap) * phase_w + shift
                              : channel + ih * g.width + offset_w;
#pragma omp simd
          for (int64_t ow = first; ow < last; ++ow) shifted[ow] += in[ow];
        }
      }
    }
    if (!phased) continue;
    for (int64_t ih = 0; ih < g.height; ++ih) {
      T* out = channel + ih * g.width;
      const T* phase = phases.data() + ih * stride_w * phase_w;
      if (stride_w == 2) {
        interleave_pair(phase, phase + phase_w, g.width, out);
        continue;
      }
      for (int64_t r = 0; r < stride_w; ++r)
        for (int64_t m = 0; m * stride_w + r < g.width; ++m)
          out[m * stride_w + r] = phase[r * phase_w + m];
    }
  }
}

// How many images share one GEMM. Small output planes (late ResNet stages: 7x7 = 49 columns
// per image) make narrow GEMMs that waste most of each packed panel, so several images' columns
// sit side by side until a GEMM is about 512 columns wide (capped at 8M column elements).
int64_t images_per_gemm(const ConvGeometry& g, int64_t chunk_images) {
  const int64_t plane = std::max<int64_t>(g.out_plane(), 1);
  int64_t images = std::min<int64_t>((512 + plane - 1) / plane, std::max<int64_t>(chunk_images, 1));
  while (images > 1 && g.column_rows() * plane * images > (int64_t{8} << 20)) --images;
  return std::max<int64_t>(images, 1);
}

// Input channels per im2col + GEMM pass. The columns of all of a group's channels can be many
// MB in late ResNet stages (3x3 over 512 channels: 9 MB for 512 columns); written in one go,
// they have left the L2 cache before the GEMM reads them back. Passes over slices of about
// 1 MB of columns keep them there; each pass still gives the GEMM 384 or more rows of its
// inner dimension. Sized for the widest GEMM the geometry takes, however few images run now: a
// batch cut into chunks (by a memory policy) sums each output over the same passes, so its
// outputs keep the whole batch's bits.
int64_t channels_per_pass(const ConvGeometry& g, int64_t element_size) {
  const int64_t taps = g.kernel_h * g.kernel_w, cg = g.in_per_group();
  const int64_t width =
      images_per_gemm(g, std::numeric_limits<int64_t>::max()) * std::max<int64_t>(g.out_plane(), 1);
  const int64_t channel_bytes = taps * width * element_size;
  if (cg * channel_bytes <= (int64_t{4} << 20)) return cg;
  const int64_t channels = std::max((int64_t{1} << 20) / channel_bytes, (384 + taps - 1) / taps);
  const int64_t passes = (cg + channels - 1) / channels;
  return (cg + passes - 1) / passes;
}

// The geometry of `channels` input channels of each group (for im2col and col2im of a slice).
ConvGeometry channel_slice(ConvGeometry g, int64_t channels) {
  g.in_channels = channels * g.groups;
  return g;
}

// Copies a group's gradient rows of `count` images (Og rows of OH*OW each) side by side into
// `block` (Og rows of count * OH*OW).
template <typename T>
void gather_grad_block(const ConvGeometry& g, const T* grad_group, int64_t grad_ld,
                       int64_t grad_batch_stride, int64_t count, T* block) {
  const int64_t plane = g.out_plane(), block_ld = count * plane;
  for (int64_t i = 0; i < count; ++i)
    for (int64_t o = 0; o < g.out_per_group(); ++o)
      std::copy(grad_group + i * grad_batch_stride + o * grad_ld,
                grad_group + i * grad_batch_stride + o * grad_ld + plane,
                block + o * block_ld + i * plane);
}

// ---- Winograd F(2x2, 3x3) and F(4x4, 3x3) ----
// A 3x3 stride-1 convolution by Lavin and Gray's minimal filtering: every (m + 2) x (m + 2) tile of
// the padded input gives an m x m tile of the output with (m + 2)^2 products per channel pair
// instead of 9 m^2 (m = 2: 16 instead of 36; m = 4: 36 instead of 144). Weights and input tiles are
// transformed, the products become (m + 2)^2 GEMMs of (out channels x in channels) by (in channels
// x tiles), and the output transform sums them back. The transforms cost about as much as a GEMM
// with 16 channels, so wide layers use it (f32 only: F(2x2)'s rounding differs from im2col's by a
// few ulps, F(4x4)'s by about 1e-5 of the outputs' magnitude, as in other libraries' Winograd).
// The fewest 2x2 output tiles per image plane for Winograd (TESSEL_WINOGRAD_MIN_TILES, default 16:
// planes of 7x7 and up). Below, the weight and tile transforms outweigh the products saved: a
// ResNet-18 step on 64x64 images (batch 8, 2 ranks, one thread each) took 109 ms with Winograd on
// every plane, 85 ms with this bound and 81 ms with none. Per image, not per batch, so a memory
// policy's chunks of a batch take the path the whole batch takes.
int64_t winograd_min_tiles() {
  static const int64_t tiles = [] {
    const char* setting = std::getenv("TESSEL_WINOGRAD_MIN_TILES");
    return setting ? std::atoll(setting) : int64_t{16};
  }();
  return tiles;
}

bool winograd_applies(const ConvGeometry& g) {
  // TESSEL_CONV_WINOGRAD=0 keeps im2col everywhere (to compare the two).
  static const bool enabled = [] {
    const char* setting = std::getenv("TESSEL_CONV_WINOGRAD");
    return !setting || std::string(setting) != "0";
  }();
  return enabled && g.kernel_h == 3 && g.kernel_w == 3 && g.stride_h == 1 && g.stride_w == 1 &&
         g.dilation_h == 1 && g.dilation_w == 1 && g.groups == 1 && g.pad_h <= 2 && g.pad_w <= 2 &&
         g.in_channels >= 32 && g.out_channels >= 32 && g.out_h >= 2 && g.out_w >= 2 &&
         (g.out_h + 1) / 2 * ((g.out_w + 1) / 2) >= winograd_min_tiles();
}

// The output tile's edge: 4 (F(4x4, 3x3), 36 products for 16 outputs) over 128 channels and
// more, else 2 (16 products for 4 outputs, but simpler transforms: over 64 channels at 32x32 the
// two ran even, at 7x7 over 512 channels F(4x4) took 0.75-0.8 of F(2x2)'s time, one thread per
// half of a batch of 32). TESSEL_WINOGRAD_TILE=2 or 4 takes that one everywhere.
int winograd_tile(const ConvGeometry& g) {
  static const int forced = [] {
    const char* setting = std::getenv("TESSEL_WINOGRAD_TILE");
    return setting ? std::atoi(setting) : 0;
  }();
  if (forced == 2 || forced == 4) return forced;
  return std::min(g.in_channels, g.out_channels) >= 128 ? 4 : 2;
}

// The one-dimensional transforms of F(m, 3) on m + 2 points, each reading its values `is` apart
// and writing them `os` apart: called in vector loops along a line of tiles (one tile a lane),
// the two-dimensional ones apply them down the columns, then along the rows.
template <int M>
struct WinogradTransforms;

// F(2, 3) on the points 0, 1, -1 and infinity.
template <>
struct WinogradTransforms<2> {
  static constexpr int kIn = 4;
  // G g: three taps -> kIn values.
  template <typename T>
  static void filter(const T* g, int64_t is, T* u, int64_t os) {
    const T g0 = g[0], g1 = g[is], g2 = g[2 * is];
    u[0] = g0;
    u[os] = T(0.5) * (g0 + g1 + g2);
    u[2 * os] = T(0.5) * (g0 - g1 + g2);
    u[3 * os] = g2;
  }
  // B^T d: kIn input values -> kIn.
  template <typename T>
  static void input(const T* d, int64_t is, T* v, int64_t os) {
    const T d0 = d[0], d1 = d[is], d2 = d[2 * is], d3 = d[3 * is];
    v[0] = d0 - d2;
    v[os] = d1 + d2;
    v[2 * os] = d2 - d1;
    v[3 * os] = d1 - d3;
  }
  // A^T m: kIn products -> M outputs.
  template <typename T>
  static void output(const T* m, int64_t is, T* y, int64_t os) {
    const T m0 = m[0], m1 = m[is], m2 = m[2 * is], m3 = m[3 * is];
    y[0] = m0 + m1 + m2;
    y[os] = m1 - m2 - m3;
  }
  // A y: M values of the output's gradient -> kIn.
  template <typename T>
  static void gradient(const T* y, int64_t is, T* a, int64_t os) {
    const T y0 = y[0], y1 = y[is];
    a[0] = y0;
    a[os] = y0 + y1;
    a[2 * os] = y0 - y1;
    a[3 * os] = -y1;
  }
  // G^T m: kIn sums -> three taps of the weight's gradient.
  template <typename T>
  static void filter_gradient(const T* m, int64_t is, T* w, int64_t os) {
    const T m0 = m[0], m1 = m[is], m2 = m[2 * is], m3 = m[3 * is];
    w[0] = m0 + T(0.5) * (m1 + m2);
    w[os] = T(0.5) * (m1 - m2);
    w[2 * os] = T(0.5) * (m1 + m2) + m3;
  }
};

// F(4, 3) on the points 0, 1, -1, 2, -2 and infinity.
template <>
struct WinogradTransforms<4> {
  static constexpr int kIn = 6;
  template <typename T>
  static void filter(const T* g, int64_t is, T* u, int64_t os) {
    const T g0 = g[0], g1 = g[is], g2 = g[2 * is];
    const T outer = g0 + g2, even = T(1.0 / 24) * g0 + T(1.0 / 6) * g2, odd = T(1.0 / 12) * g1;
    u[0] = T(0.25) * g0;
    u[os] = T(-1.0 / 6) * (outer + g1);
    u[2 * os] = T(-1.0 / 6) * (outer - g1);
    u[3 * os] = even + odd;
    u[4 * os] = even - odd;
    u[5 * os] = g2;
  }
  template <typename T>
  static void input(const T* d, int64_t is, T* v, int64_t os) {
    const T d0 = d[0], d1 = d[is], d2 = d[2 * is], d3 = d[3 * is], d4 = d[4 * is], d5 = d[5 * is];
    const T a = d4 - d2, b = T(2) * (d3 - d1);
    v[0] = T(4) * d0 - T(5) * d2 + d4;
    v[os] = (d3 + d4) - T(4) * (d1 + d2);
    v[2 * os] = (d4 - d3) + T(4) * (d1 - d2);
    v[3 * os] = a + b;
    v[4 * os] = a - b;
    v[5 * os] = T(4) * d1 - T(5) * d3 + d5;
  }
  template <typename T>
  static void output(const T* m, int64_t is, T* y, int64_t os) {
    const T m1 = m[is], m2 = m[2 * is], m3 = m[3 * is], m4 = m[4 * is];
    const T sum12 = m1 + m2, diff12 = m1 - m2, sum34 = m3 + m4, diff34 = m3 - m4;
    y[0] = m[0] + sum12 + sum34;
    y[os] = diff12 + T(2) * diff34;
    y[2 * os] = sum12 + T(4) * sum34;
    y[3 * os] = diff12 + T(8) * diff34 + m[5 * is];
  }
  template <typename T>
  static void gradient(const T* y, int64_t is, T* a, int64_t os) {
    const T y0 = y[0], y1 = y[is], y2 = y[2 * is], y3 = y[3 * is];
    const T even1 = y0 + y2, odd1 = y1 + y3, even2 = y0 + T(4) * y2, odd2 = T(2) * y1 + T(8) * y3;
    a[0] = y0;
    a[os] = even1 + odd1;
    a[2 * os] = even1 - odd1;
    a[3 * os] = even2 + odd2;
    a[4 * os] = even2 - odd2;
    a[5 * os] = y3;
  }
  template <typename T>
  static void filter_gradient(const T* m, int64_t is, T* w, int64_t os) {
    const T m1 = m[is], m2 = m[2 * is], m3 = m[3 * is], m4 = m[4 * is];
    const T sum12 = m1 + m2, diff12 = m1 - m2, sum34 = m3 + m4, diff34 = m3 - m4;
    w[0] = T(0.25) * m[0] - T(1.0 / 6) * sum12 + T(1.0 / 24) * sum34;
    w[os] = T(-1.0 / 6) * diff12 + T(1.0 / 12) * diff34;
    w[2 * os] = T(1.0 / 6) * (sum34 - sum12) + m[5 * is];
  }
};

// Tiles a two-pass transform takes at once: its intermediate lines stay in L1.
constexpr int64_t kWinogradStrip = 64;

// row[0..width) = shift + parts[0][0], ..., shift + parts[M - 1][0], shift + parts[0][1], ...
// (a plane row from the M columns of its tiles, `part_stride` apart).
template <int M, typename T>
inline void interleave_tiles(const T* parts, int64_t part_stride, int64_t width, T shift, T* row) {
  const int64_t whole = width / M;
#pragma omp simd
  for (int64_t t = 0; t < whole; ++t)
    for (int b = 0; b < M; ++b) row[M * t + b] = shift + parts[b * part_stride + t];
  for (int64_t x = whole * M; x < width; ++x)
    row[x] = shift + parts[(x - whole * M) * part_stride + whole];
}

// The inverse without the shift: parts[b][t] = row[M t + b]; the columns past the row's end are
// left as they are.
template <int M, typename T>
inline void deinterleave_tiles(const T* row, int64_t width, T* parts, int64_t part_stride) {
  const int64_t whole = width / M;
#pragma omp simd
  for (int64_t t = 0; t < whole; ++t)
    for (int b = 0; b < M; ++b) parts[b * part_stride + t] = row[M * t + b];
  for (int64_t x = whole * M; x < width; ++x) parts[(x - whole * M) * part_stride + whole] = row[x];
}

// The transformed kernels as the products read them: matrix k = G g G^T of every kernel g, as
// the products' left operand of `rows` x `cols` (out x in channels; for the input gradient in x
// out channels, each kernel turned by 180 degrees). In blocks of 8 rows, a column's 8 values side
// by side: element (row, col) of matrix k at k * matrix_stride + (row / 8 * cols + col) * 8 +
// row % 8 (winograd_gemm_avx512's packed operand), or with `column_major` at k * matrix_stride +
// col * rows8 + row (rows8: rows rounded up to 8; a general GEMM's transposed operand). Rows past
// the last are zero. Each block of 8 rows runs the transform in vector lanes. `matrix_stride` is
// best a cache line more than a matrix takes: a 512 x 512 kernel's 36 matrices 1 MiB apart put
// all their stores on one cache set (the transform took as long as the products).
template <int M, typename T>
void winograd_weights(const T* w, int64_t outs, int64_t ins, bool input_gradient, bool column_major,
                      int64_t matrix_stride, T* U) {
  using Transforms = WinogradTransforms<M>;
  constexpr int n = Transforms::kIn;
  const int64_t rows = input_gradient ? ins : outs, cols = input_gradient ? outs : ins;
  const int64_t blocks = (rows + 7) / 8;
  // Kernel (row, col) at w + row * row_step + col * col_step.
  const int64_t row_step = input_gradient ? 9 : 9 * ins, col_step = input_gradient ? 9 * ins : 9;
  parallel_for(0, blocks, 1, [&](int64_t block_begin, int64_t block_end) {
    T taps[9][8];
    T half[n][3][8];  // G times each column of taps
    for (int64_t block = block_begin; block < block_end; ++block) {
      const int64_t live = std::min<int64_t>(8, rows - block * 8);
      for (int64_t col = 0; col < cols; ++col) {
        for (int64_t lane = 0; lane < 8; ++lane) {
          const T* kernel = w + (block * 8 + lane) * row_step + col * col_step;
          for (int tap = 0; tap < 9; ++tap)
            taps[tap][lane] = lane < live ? kernel[input_gradient ? 8 - tap : tap] : T(0);
        }
        T* out = U + (column_major ? col * blocks * 8 + block * 8 : (block * cols + col) * 8);
        for (int j = 0; j < 3; ++j) {
#pragma omp simd
          for (int lane = 0; lane < 8; ++lane)
            Transforms::filter(&taps[j][lane], 24, &half[0][j][lane], 24);
        }
        for (int i = 0; i < n; ++i) {
#pragma omp simd
          for (int lane = 0; lane < 8; ++lane)
            Transforms::filter(&half[i][0][lane], 8, out + i * n * matrix_stride + lane,
                               matrix_stride);
        }
      }
    }
  });
}

// Planes of one convolution's operands as the Winograd passes read and write them.
template <typename T>
struct WinogradConv {
  const T* in;  // (batch, ins, height, width): rows dense, `in_ld` between channels
  int64_t in_ld, in_batch_stride;
  T* out;  // (batch, outs, out_h, out_w): rows dense, `out_ld` between channels
  int64_t out_ld, out_batch_stride;
  const T* bias;  // per output channel, or null
  int64_t bias_stride;
  int64_t batch, ins, height, width, outs, out_h, out_w, pad_h, pad_w;
  DType dtype;
};

// How the Winograd passes cut the output tiles: blocks of whole images, each image's tiles in a
// slot of a multiple of 4 columns, and every GEMM as wide as a multiple of `columns` tiles (zeros
// after the last image): 48 for Eigen's GEMM, which then takes every tile through the same full
// micro-tile (48 columns of the row-major product, 6 AVX2 registers) whatever its place, 16 for
// winograd_gemm_avx512, whose every entry is the same sum whatever the columns beside it. So
// every image meets the same arithmetic whichever images share its block: a batch run in chunks
// under a memory budget gives each image the same result bit for bit. A block's transformed input
// and products take about 2 MB but at least 256 tiles (the GEMMs' width: Eigen's GEMM packs all of
// its transformed weights again for each; at 64 tiles that packing made a 512-channel 7x7
// convolution 10-15% slower), and no more images than a thread's share; the images go to at most
// one chunk per thread.
struct WinogradBlocks {
  // The GEMM widths' multiple for Eigen's GEMM (its AVX2 micro-tile).
  static constexpr int64_t kEigenColumns = 48;
  int64_t columns, tiles_w, tiles_h, slot, block_images, block_tiles, padded_w, chunks;
  // Between the transformed matrices of `channels` rows: a cache line more than they take, so
  // that the streams a transform reads or writes at once fall on different cache sets (at a
  // multiple of 4 KiB apart, 64 channels of 256 tiles, all 16 fell on one and thrashed L1).
  int64_t matrix_stride(int64_t channels) const { return channels * block_tiles + 16; }
  // The GEMM width for `images` images: their slots, rounded up to whole micro-tiles.
  int64_t gemm_tiles(int64_t images) const {
    return (images * slot + columns - 1) / columns * columns;
  }
};
template <typename T>
WinogradBlocks winograd_blocks(const WinogradConv<T>& p, int tile, int64_t columns) {
  WinogradBlocks b;
  b.columns = columns;
  b.tiles_w = (p.out_w + tile - 1) / tile;
  b.tiles_h = (p.out_h + tile - 1) / tile;
  b.slot = (b.tiles_h * b.tiles_w + 3) / 4 * 4;
  const int64_t tile_bytes =
      (tile + 2) * (tile + 2) * (p.ins + p.outs) * static_cast<int64_t>(sizeof(T));
  const int64_t wanted_tiles = std::clamp<int64_t>((int64_t{2} << 20) / tile_bytes, 256, 1024);
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(get_num_threads(), p.batch));
  // Images per block: enough for the tiles wanted (no more than a thread's share), or down to
  // half that when fewer zero columns then pad the GEMMs to whole micro-tiles.
  const int64_t share = (p.batch + threads - 1) / threads;
  const int64_t most = std::min((wanted_tiles + b.slot - 1) / b.slot, share);
  b.block_images = most;
  for (int64_t images = most - 1; images >= (most + 1) / 2; --images)
    if ((b.gemm_tiles(images) - images * b.slot) * b.gemm_tiles(b.block_images) <
        (b.gemm_tiles(b.block_images) - b.block_images * b.slot) * b.gemm_tiles(images))
      b.block_images = images;
  b.block_tiles = b.gemm_tiles(b.block_images);
  b.padded_w = tile * b.tiles_w + 2;  // input columns a tile row reads
  b.chunks = std::max<int64_t>(
      1, std::min<int64_t>(threads, (p.batch + b.block_images - 1) / b.block_images));
  return b;
}

// V[k][c][tile] = B^T d B for the (M + 2) x (M + 2) input tile d under each output tile of images
// [n0, n0 + images) (image i's tiles in columns i * slot ..., row by row; the rest of its slot and
// the columns up to gemm_tiles(images) zero), every input channel c. A row of tiles at a time,
// straight from M + 2 padded input rows: B^T combines the rows along whole lines, B the columns of
// each tile (M apart), so every pass runs along contiguous memory. `band` (2 (M + 2) padded rows)
// is scratch.
template <int M, typename T>
void winograd_input_tiles(const WinogradConv<T>& p, const WinogradBlocks& b, int64_t n0,
                          int64_t images, T* V, T* band) {
  using Transforms = WinogradTransforms<M>;
  constexpr int n = Transforms::kIn;
  const int64_t count = b.gemm_tiles(images), ds = b.block_tiles, pw = b.padded_w;
  const int64_t padding = b.slot - b.tiles_h * b.tiles_w;
  const int64_t vs = b.matrix_stride(p.ins);
  const int64_t copied = std::min<int64_t>(p.width, pw - p.pad_w);
  T* lines = band;              // [n][pw]: input rows M ty - pad_h + r, zero outside the image
  T* combined = band + n * pw;  // [n][pw]: (B^T d) along the rows
  // The columns of `combined` outside the image stay zero: B^T of zeros.
  std::fill(combined, combined + n * pw, T(0));
  for (int64_t c = 0; c < p.ins; ++c) {
    T* v = V + c * ds;
    for (int k = 0; k < n * n; ++k) {
      for (int64_t i = 0; i < images && padding > 0; ++i)
        std::fill_n(v + k * vs + (i + 1) * b.slot - padding, padding, T(0));
      std::fill(v + k * vs + images * b.slot, v + k * vs + count, T(0));
    }
    for (int64_t i = 0; i < images; ++i) {
      const T* plane = p.in + (n0 + i) * p.in_batch_stride + c * p.in_ld;
      for (int64_t ty = 0; ty < b.tiles_h; ++ty) {
        const int64_t top = M * ty - p.pad_h;
        if (top >= 0 && top + n <= p.height) {
          // Every row inside the image: B^T straight from the plane, over its columns.
          const T* first = plane + top * p.width;
#pragma omp simd
          for (int64_t x = p.pad_w; x < p.pad_w + copied; ++x)
            Transforms::input(first + (x - p.pad_w), p.width, combined + x, pw);
        } else {
          for (int row = 0; row < n; ++row) {
            T* line = lines + row * pw;
            const int64_t y = top + row;
            if (y < 0 || y >= p.height) {
              std::fill(line, line + pw, T(0));
              continue;
            }
            std::fill(line, line + p.pad_w, T(0));
            std::copy(plane + y * p.width, plane + y * p.width + copied, line + p.pad_w);
            std::fill(line + p.pad_w + copied, line + pw, T(0));
          }
#pragma omp simd
          for (int64_t x = 0; x < pw; ++x) Transforms::input(lines + x, pw, combined + x, pw);
        }
        const int64_t at = i * b.slot + ty * b.tiles_w;
        for (int r = 0; r < n; ++r) {
          const T* e = combined + r * pw;
          T* out = v + n * r * vs + at;
#pragma omp simd
          for (int64_t t = 0; t < b.tiles_w; ++t) Transforms::input(e + M * t, 1, out + t, vs);
        }
      }
    }
  }
}

// out = conv(in, w) + bias, stride 1, `w` (outs x ins x 3 x 3) the forward's kernel, or for
// the input gradient the forward's kernel of ins x outs, turned and read transposed: images
// spread over threads, each block of them transformed, multiplied and transformed back in a
// per-thread workspace.
template <int M, typename T>
void winograd_run(KernelContext& context, const WinogradConv<T>& p, const T* w,
                  bool input_gradient) {
  using Transforms = WinogradTransforms<M>;
  constexpr int n = Transforms::kIn, matrices = n * n;
  // The products' left operands, packed for winograd_gemm_avx512 on AVX-512, else column-major
  // for the general GEMM.
  bool packed = false;
  if constexpr (std::is_same_v<T, float>) packed = avx512_kernels();
  const WinogradBlocks b =
      winograd_blocks(p, M, packed ? kWinogradColumns : WinogradBlocks::kEigenColumns);
  const int64_t bt = b.block_tiles;
  const int64_t vs = b.matrix_stride(p.ins), ms = b.matrix_stride(p.outs);
  const int64_t per_chunk =
      matrices * (vs + ms) + M * M * bt + 2 * n * b.padded_w + M * n * kWinogradStrip;
  T* scratch = context.workspace({b.chunks, per_chunk}, p.dtype).template data_ptr<T>();
  const int64_t us = packed_rows_size(p.outs, p.ins) + 16;
  T* U = context.workspace({matrices, us}, p.dtype).template data_ptr<T>();
  winograd_weights<M>(w, input_gradient ? p.ins : p.outs, input_gradient ? p.outs : p.ins,
                      input_gradient, /*column_major=*/!packed, us, U);

  for_each_batch_chunk(p.batch, b.chunks, [&](int64_t chunk, int64_t first, int64_t last) {
    T* V = scratch + chunk * per_chunk;   // [matrices][ins][block_tiles], vs apart: input
    T* P = V + matrices * vs;             // [matrices][outs][block_tiles], ms apart: products
    T* D = P + matrices * ms;             // [M * M][block_tiles]: one output channel's tiles
    T* band = D + M * M * bt;             // 2 n padded input rows
    T* half = band + 2 * n * b.padded_w;  // [M][n][kWinogradStrip]: A^T down the columns
    for (int64_t n0 = first; n0 < last; n0 += b.block_images) {
      const int64_t images = std::min(b.block_images, last - n0), count = b.gemm_tiles(images);
      winograd_input_tiles<M>(p, b, n0, images, V, band);
      for (int k = 0; k < matrices; ++k) {
        if constexpr (std::is_same_v<T, float>) {
          if (packed) {
            winograd_gemm_avx512(U + k * us, p.outs, p.ins, V + k * vs, bt, count, P + k * ms, bt);
            continue;
          }
        }
        cpu::gemm(true, false, p.outs, count, p.ins, T(1), U + k * us, (us - 16) / p.ins,
                  V + k * vs, bt, T(0), P + k * ms, bt);
      }
      // Output transform Y = A^T m A across the tiles into D, a strip of tiles at a time, then
      // onto the bias in the output planes.
      constexpr int64_t strip = kWinogradStrip;
      for (int64_t o = 0; o < p.outs; ++o) {
        const T* m = P + o * bt;
        for (int64_t t0 = 0; t0 < count; t0 += strip) {
          const int64_t t1 = std::min(count, t0 + strip);
          for (int j = 0; j < n; ++j) {
#pragma omp simd
            for (int64_t t = t0; t < t1; ++t)
              Transforms::output(m + j * ms + t, n * ms, half + j * strip + t - t0, n * strip);
          }
          for (int a = 0; a < M; ++a) {
#pragma omp simd
            for (int64_t t = t0; t < t1; ++t)
              Transforms::output(half + a * n * strip + t - t0, strip, D + a * M * bt + t, bt);
          }
        }
        const T shift = p.bias ? p.bias[o * p.bias_stride] : T(0);
        for (int64_t i = 0; i < images; ++i) {
          T* plane = p.out + (n0 + i) * p.out_batch_stride + o * p.out_ld;
          for (int64_t ty = 0; ty < b.tiles_h; ++ty) {
            const int64_t at = i * b.slot + ty * b.tiles_w;
            for (int a = 0; a < M && M * ty + a < p.out_h; ++a)
              interleave_tiles<M>(D + a * M * bt + at, bt, p.out_w, shift,
                                  plane + (M * ty + a) * p.out_w);
          }
        }
      }
    }
  });
}

// ---- forward ----

template <int M, typename T>
void conv2d_winograd_forward(KernelContext& context, const ConvGeometry& g) {
  PlaneInput<T> x(context, context.inputs[0]);
  Tensor weight = cpu::dense_input(context, context.inputs[1]);
  const Tensor& bias = context.inputs[2];
  PlaneOutput<T> out(context, context.outputs[0]);
  const WinogradConv<T> planes{x.data,
                               x.ld,
                               x.batch_stride,
                               out.data,
                               out.ld,
                               out.batch_stride,
                               bias.defined() ? bias.data_ptr<T>() : nullptr,
                               bias.defined() ? bias.stride(0) : 0,
                               g.batch,
                               g.in_channels,
                               g.height,
                               g.width,
                               g.out_channels,
                               g.out_h,
                               g.out_w,
                               g.pad_h,
                               g.pad_w,
                               weight.dtype()};
  winograd_run<M>(context, planes, weight.data_ptr<T>(), /*input_gradient=*/false);
  out.finish(context.outputs[0]);
}

template <typename T>
void conv2d_gemm_forward(KernelContext& context, const ConvGeometry& g) {
  const Tensor& x = context.inputs[0];
  const Tensor& bias = context.inputs[2];
  Tensor weight = cpu::dense_input(context, context.inputs[1]);
  PlaneOutput<T> out(context, context.outputs[0]);
  const T* x_data = x.data_ptr<T>();
  const T* w_data = weight.data_ptr<T>();
  const T* bias_data = bias.defined() ? bias.data_ptr<T>() : nullptr;
  const int64_t bias_stride = bias.defined() ? bias.stride(0) : 0;
  const int64_t k = g.column_rows(), plane = g.out_plane();
  const int64_t og = g.out_per_group(), cg = g.in_per_group();
  const int64_t chunks = batch_chunks(g.batch);
  const int64_t block = images_per_gemm(g, (g.batch + chunks - 1) / chunks);
  // Channels per im2col (col2im) pass, and the column rows one pass holds.
  const int64_t step = channels_per_pass(g, sizeof(T));
  const int64_t pass_rows = step * g.kernel_h * g.kernel_w;
  const int64_t x_ld = plane_matrix_ld(x);
  const std::vector<int64_t> tap_table_data =
      uses_tap_tables(g) ? im2col_table(g, x.stride(2), x.stride(3)) : std::vector<int64_t>();
  const int64_t* tap_table = tap_table_data.empty() ? nullptr : tap_table_data.data();
  // A 1x1 kernel over dense planes reads the input as its columns, one image at a time.
  const bool columns_are_input = g.pointwise() && x_ld >= 0 && block == 1;
  T* columns = nullptr;
  if (!columns_are_input)
    columns =
        context.workspace({chunks, pass_rows * block * plane}, x.dtype()).template data_ptr<T>();
  T* staging = nullptr;  // GEMM results of a multi-image block, before they go to each image
  if (block > 1)
    staging = context.workspace({chunks, og * block * plane}, x.dtype()).template data_ptr<T>();

  for_each_batch_chunk(g.batch, chunks, [&](int64_t chunk, int64_t first, int64_t last) {
    T* chunk_columns = columns ? columns + chunk * pass_rows * block * plane : nullptr;
    T* chunk_staging = staging ? staging + chunk * og * block * plane : nullptr;
    for (int64_t n0 = first; n0 < last; n0 += block) {
      const int64_t count = std::min(block, last - n0);
      const int64_t width = count * plane;  // GEMM columns: `count` images side by side
      if (block == 1 && bias_data) {
        T* out_image = out.data + n0 * out.batch_stride;
        for (int64_t o = 0; o < g.out_channels; ++o)
          std::fill(out_image + o * out.ld, out_image + o * out.ld + plane,
                    bias_data[o * bias_stride]);
      }
      for (int64_t group = 0; group < g.groups; ++group) {
        const T* group_input = x_data + n0 * x.stride(0) + group * cg * x.stride(1);
        const T* group_weight = w_data + group * og * k;
        // One image straight into the output (onto the bias), several into the staging rows.
        T* target =
            block == 1 ? out.data + n0 * out.batch_stride + group * og * out.ld : chunk_staging;
        const int64_t target_ld = block == 1 ? out.ld : width;
        const T beta = block == 1 && bias_data ? T(1) : T(0);
        if (columns_are_input) {
          cpu::gemm(false, false, og, plane, k, T(1), group_weight, k, group_input, x_ld, beta,
                    target, target_ld);
        } else {
          for (int64_t c0 = 0; c0 < cg; c0 += step) {
            const int64_t channels = std::min(step, cg - c0);
            const ConvGeometry slice = channel_slice(g, channels);
            for (int64_t i = 0; i < count; ++i)
              im2col(slice, group_input + c0 * x.stride(1) + i * x.stride(0), x.stride(1),
                     x.stride(2), x.stride(3), chunk_columns + i * plane, width, tap_table);
            const int64_t rows = channels * g.kernel_h * g.kernel_w;
            cpu::gemm(false, false, og, width, rows, T(1),
                      group_weight + c0 * g.kernel_h * g.kernel_w, k, chunk_columns, width,
                      c0 == 0 ? beta : T(1), target, target_ld);
          }
        }
        if (block == 1) continue;
        for (int64_t i = 0; i < count; ++i) {
          for (int64_t o = 0; o < og; ++o) {
            const int64_t channel = group * og + o;
            const T* from = chunk_staging + o * width + i * plane;
            T* to = out.data + (n0 + i) * out.batch_stride + channel * out.ld;
            const T shift = bias_data ? bias_data[channel * bias_stride] : T(0);
#pragma omp simd
            for (int64_t p = 0; p < plane; ++p) to[p] = from[p] + shift;
          }
        }
      }
    }
  });
  out.finish(context.outputs[0]);
}

// Depthwise: every output channel reads one input channel; a direct loop beats a GEMM whose
// inner dimension would be KH*KW.
template <typename T>
void conv2d_depthwise_forward(KernelContext& context, const ConvGeometry& g) {
  const Tensor& x = context.inputs[0];
  const Tensor& bias = context.inputs[2];
  const Tensor& out = context.outputs[0];
  Tensor weight = cpu::dense_input(context, context.inputs[1]);
  const T* x_data = x.data_ptr<T>();
  const T* w_data = weight.data_ptr<T>();
  const T* bias_data = bias.defined() ? bias.data_ptr<T>() : nullptr;
  const int64_t bias_stride = bias.defined() ? bias.stride(0) : 0;
  T* out_data = out.data_ptr<T>();
  const bool in_place = shares_storage(out, context.inputs);
  const int64_t plane = g.out_plane(), og = g.out_per_group();
  const int64_t planes = g.batch * g.out_channels;
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(get_num_threads(), planes));
  T* scratch = context.workspace({chunks, plane}, x.dtype()).template data_ptr<T>();
  Tensor staged_tensor = in_place ? context.workspace(out.sizes(), out.dtype()) : Tensor();
  T* staged = in_place ? staged_tensor.data_ptr<T>() : nullptr;
  const int64_t sx_w = x.stride(3), sx_h = x.stride(2), sx_n = x.stride(0), sx_c = x.stride(1);
  // Tensor::stride checks its argument: read every stride once, not per plane or element.
  const int64_t so_n = out.stride(0), so_c = out.stride(1), so_h = out.stride(2),
                so_w = out.stride(3);
  // Stride 1: every tap is one flat run over a zero-padded copy of the plane (row stride
  // padded_w), a vectorised loop per tap instead of a short loop per row and tap; the columns
  // past out_w in each row are computed and dropped.
  const bool flat_taps = g.stride_h == 1 && g.stride_w == 1;
  const int64_t padded_w = g.width + 2 * g.pad_w, padded_h = g.height + 2 * g.pad_h;
  const int64_t flat_size = g.out_h * padded_w, padded_size = (padded_h + 1) * padded_w;
  T* flat_scratch =
      flat_taps
          ? context.workspace({chunks, flat_size + padded_size}, x.dtype()).template data_ptr<T>()
          : nullptr;

  parallel_for(0, chunks, 1, [&](int64_t chunk_begin, int64_t chunk_end) {
    for (int64_t chunk = chunk_begin; chunk < chunk_end; ++chunk) {
      T* acc = scratch + chunk * plane;
      for (int64_t p = planes * chunk / chunks; p < planes * (chunk + 1) / chunks; ++p) {
        const int64_t n = p / g.out_channels, o = p % g.out_channels;
        const T* channel = x_data + n * sx_n + (o / og) * sx_c;
        const T initial = bias_data ? bias_data[o * bias_stride] : T(0);
        if (flat_taps) {
          T* flat = flat_scratch + chunk * (flat_size + padded_size);
          T* padded = flat + flat_size;
          std::fill(padded, padded + padded_size, T(0));
          for (int64_t h = 0; h < g.height; ++h) {
            T* to = padded + (h + g.pad_h) * padded_w + g.pad_w;
            const T* from = channel + h * sx_h;
            for (int64_t w = 0; w < g.width; ++w) to[w] = from[w * sx_w];
          }
          std::fill(flat, flat + flat_size, initial);
          for (int64_t ki = 0; ki < g.kernel_h; ++ki) {
            for (int64_t kj = 0; kj < g.kernel_w; ++kj) {
              const T w = w_data[(o * g.kernel_h + ki) * g.kernel_w + kj];
              // Reads end before padded_size: (kw - 1) * dilation_w = padded_w - out_w.
              const T* tap = padded + ki * g.dilation_h * padded_w + kj * g.dilation_w;
#pragma omp simd
              for (int64_t i = 0; i < flat_size; ++i) flat[i] += w * tap[i];
            }
          }
          for (int64_t oh = 0; oh < g.out_h; ++oh)
            std::copy(flat + oh * padded_w, flat + oh * padded_w + g.out_w, acc + oh * g.out_w);
        } else {
          std::fill(acc, acc + plane, initial);
          for (int64_t ki = 0; ki < g.kernel_h; ++ki) {
            for (int64_t kj = 0; kj < g.kernel_w; ++kj) {
              const T w = w_data[(o * g.kernel_h + ki) * g.kernel_w + kj];
              const int64_t offset_w = kj * g.dilation_w - g.pad_w;
              int64_t first, last;
              valid_range(offset_w, g.stride_w, g.width, g.out_w, &first, &last);
              for (int64_t oh = 0; oh < g.out_h; ++oh) {
                const int64_t ih = oh * g.stride_h - g.pad_h + ki * g.dilation_h;
                if (ih < 0 || ih >= g.height) continue;
                const T* in = channel + ih * sx_h;
                T* row = acc + oh * g.out_w;
                if (g.stride_w == 1 && sx_w == 1) {
                  const T* shifted = in + offset_w;
#pragma omp simd
                  for (int64_t ow = first; ow < last; ++ow) row[ow] += w * shifted[ow];
                } else {
                  for (int64_t ow = first; ow < last; ++ow)
                    row[ow] += w * in[(ow * g.stride_w + offset_w) * sx_w];
                }
              }
            }
          }
        }
        if (staged) {
          std::copy(acc, acc + plane, staged + p * plane);
        } else {
          T* target = out_data + n * so_n + o * so_c;
          for (int64_t oh = 0; oh < g.out_h; ++oh)
            for (int64_t ow = 0; ow < g.out_w; ++ow)
              target[oh * so_h + ow * so_w] = acc[oh * g.out_w + ow];
        }
      }
    }
  });
  if (staged) cpu::copy_strided(staged_tensor, out);
}

template <typename T>
void conv2d_forward_kernel(KernelContext& context) {
  const ConvGeometry g =
      make_geometry(context.inputs[0].sizes(), context.inputs[1].sizes(), context.attrs);
  if (context.outputs[0].numel() == 0) return;
  if (std::is_same_v<T, float> && winograd_applies(g)) {
    if (winograd_tile(g) == 4) {
      conv2d_winograd_forward<4, T>(context, g);
    } else {
      conv2d_winograd_forward<2, T>(context, g);
    }
  } else if (g.depthwise()) {
    conv2d_depthwise_forward<T>(context, g);
  } else {
    conv2d_gemm_forward<T>(context, g);
  }
}

// ---- gradient of the input: grad (N, O, OH, OW), weight -> (N, C, H, W) ----

template <typename T>
void conv2d_gemm_backward_input(KernelContext& context, const ConvGeometry& g) {
  PlaneInput<T> grad(context, context.inputs[0]);
  Tensor weight = cpu::dense_input(context, context.inputs[1]);
  const Tensor& out = context.outputs[0];
  // col2im accumulates, so it needs dense zeroed planes.
  const bool write_direct = out.is_contiguous() && !shares_storage(out, context.inputs);
  Tensor target = write_direct ? out : context.workspace(out.sizes(), out.dtype());
  T* result = target.data_ptr<T>();
  const T* w_data = weight.data_ptr<T>();
  const int64_t k = g.column_rows(), plane = g.out_plane(), in_plane = g.height * g.width;
  const int64_t og = g.out_per_group(), cg = g.in_per_group();
  const int64_t chunks = batch_chunks(g.batch);
  const int64_t block = images_per_gemm(g, (g.batch + chunks - 1) / chunks);
  // Channels per im2col (col2im) pass, and the column rows one pass holds.
  const int64_t step = channels_per_pass(g, sizeof(T));
  const int64_t pass_rows = step * g.kernel_h * g.kernel_w;
  const bool columns_are_output = g.pointwise() && block == 1;
  const std::vector<int64_t> tap_table_data =
      uses_tap_tables(g) && !columns_are_output ? col2im_table(g) : std::vector<int64_t>();
  const int64_t* tap_table = tap_table_data.empty() ? nullptr : tap_table_data.data();
  T* columns = nullptr;
  if (!columns_are_output)
    columns =
        context.workspace({chunks, pass_rows * block * plane}, out.dtype()).template data_ptr<T>();
  T* grad_blocks = nullptr;  // a multi-image block's gradient rows, side by side
  if (block > 1)
    grad_blocks =
        context.workspace({chunks, og * block * plane}, out.dtype()).template data_ptr<T>();

  for_each_batch_chunk(g.batch, chunks, [&](int64_t chunk, int64_t first, int64_t last) {
    T* chunk_columns = columns ? columns + chunk * pass_rows * block * plane : nullptr;
    T* chunk_grad = grad_blocks ? grad_blocks + chunk * og * block * plane : nullptr;
    for (int64_t n0 = first; n0 < last; n0 += block) {
      const int64_t count = std::min(block, last - n0);
      const int64_t width = count * plane;
      for (int64_t group = 0; group < g.groups; ++group) {
        const T* grad_group = grad.data + n0 * grad.batch_stride + group * og * grad.ld;
        int64_t grad_ld = grad.ld;
        if (block > 1) {
          gather_grad_block(g, grad_group, grad.ld, grad.batch_stride, count, chunk_grad);
          grad_group = chunk_grad;
          grad_ld = width;
        }
        const T* group_weight = w_data + group * og * k;
        T* group_image = result + n0 * g.in_channels * in_plane + group * cg * in_plane;
        // columns (K, width) = W_g^T (K, Og) * grad_g (Og, width)
        if (columns_are_output) {
          cpu::gemm(true, false, k, plane, og, T(1), group_weight, k, grad_group, grad_ld, T(0),
                    group_image, in_plane);
          continue;
        }
        const int64_t taps = g.kernel_h * g.kernel_w;
        for (int64_t c0 = 0; c0 < cg; c0 += step) {
          const int64_t channels = std::min(step, cg - c0);
          const ConvGeometry slice = channel_slice(g, channels);
          cpu::gemm(true, false, channels * taps, width, og, T(1), group_weight + c0 * taps, k,
                    grad_group, grad_ld, T(0), chunk_columns, width);
          for (int64_t i = 0; i < count; ++i) {
            T* image = group_image + i * g.in_channels * in_plane + c0 * in_plane;
            if (!col2im_writes(g, tap_table)) std::fill(image, image + channels * in_plane, T(0));
            col2im(slice, chunk_columns + i * plane, width, image, in_plane, tap_table);
          }
        }
      }
    }
  });
  if (!write_direct) cpu::copy_strided(target, out);
}

// The input gradient of a stride-1 3x3 convolution is one too: the gradient convolved with the
// kernel turned by 180 degrees, input and output channels swapped, padded by 2 - padding
// (winograd_weights reads the forward's kernel so, without turning it in memory first).
template <int M, typename T>
void conv2d_winograd_backward_input(KernelContext& context, const ConvGeometry& g) {
  PlaneInput<T> grad(context, context.inputs[0]);
  Tensor weight = cpu::dense_input(context, context.inputs[1]);
  PlaneOutput<T> out(context, context.outputs[0]);
  const WinogradConv<T> planes{
      grad.data,     grad.ld,  grad.batch_stride, out.data,       out.ld,      out.batch_stride,
      nullptr,       0,        g.batch,           g.out_channels, g.out_h,     g.out_w,
      g.in_channels, g.height, g.width,           2 - g.pad_h,    2 - g.pad_w, weight.dtype()};
  winograd_run<M>(context, planes, weight.data_ptr<T>(), /*input_gradient=*/true);
  out.finish(context.outputs[0]);
}

template <typename T>
void conv2d_depthwise_backward_input(KernelContext& context, const ConvGeometry& g) {
  const Tensor& grad = context.inputs[0];
  Tensor weight = cpu::dense_input(context, context.inputs[1]);
  const Tensor& out = context.outputs[0];
  const T* g_data = grad.data_ptr<T>();
  const T* w_data = weight.data_ptr<T>();
  const int64_t in_plane = g.height * g.width, og = g.out_per_group();
  const bool write_direct = out.is_contiguous() && !shares_storage(out, context.inputs);
  Tensor target = write_direct ? out : context.workspace(out.sizes(), out.dtype());
  T* result = target.data_ptr<T>();
  const int64_t sg_h = grad.stride(2), sg_w = grad.stride(3);
  const int64_t sg_n = grad.stride(0), sg_c = grad.stride(1);
  const int64_t planes = g.batch * g.in_channels;
  parallel_for(0, planes, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t n = p / g.in_channels, c = p % g.in_channels;
      T* acc = result + p * in_plane;
      std::fill(acc, acc + in_plane, T(0));
      for (int64_t j = 0; j < og; ++j) {
        const int64_t o = c * og + j;
        const T* grad_plane = g_data + n * sg_n + o * sg_c;
        for (int64_t ki = 0; ki < g.kernel_h; ++ki) {
          for (int64_t kj = 0; kj < g.kernel_w; ++kj) {
            const T w = w_data[(o * g.kernel_h + ki) * g.kernel_w + kj];
            const int64_t offset_w = kj * g.dilation_w - g.pad_w;
            int64_t first, last;
            valid_range(offset_w, g.stride_w, g.width, g.out_w, &first, &last);
            for (int64_t oh = 0; oh < g.out_h; ++oh) {
              const int64_t ih = oh * g.stride_h - g.pad_h + ki * g.dilation_h;
              if (ih < 0 || ih >= g.height) continue;
              const T* in = grad_plane + oh * sg_h;
              T* row = acc + ih * g.width;
              if (g.stride_w == 1 && sg_w == 1) {  // dense rows: vectorised (acc is not grad)
                T* shifted = row + offset_w;
#pragma omp simd
                for (int64_t ow = first; ow < last; ++ow) shifted[ow] += w * in[ow];
                continue;
              }
              for (int64_t ow = first; ow < last; ++ow)
                row[ow * g.stride_w + offset_w] += w * in[ow * sg_w];
            }
          }
        }
      }
    }
  });
  if (!write_direct) cpu::copy_strided(target, out);
}

template <typename T>
void conv2d_backward_input_kernel(KernelContext& context) {
  const ConvGeometry g = geometry_from_attr(context.attrs, "input_size", context.inputs[1].sizes(),
                                            /*other_is_weight=*/true);
  if (context.outputs[0].numel() == 0) return;
  if (std::is_same_v<T, float> && winograd_applies(g)) {
    if (winograd_tile(g) == 4) {
      conv2d_winograd_backward_input<4, T>(context, g);
    } else {
      conv2d_winograd_backward_input<2, T>(context, g);
    }
  } else if (g.depthwise()) {
    conv2d_depthwise_backward_input<T>(context, g);
  } else {
    conv2d_gemm_backward_input<T>(context, g);
  }
}

// ---- gradient of the weight: grad (N, O, OH, OW), input -> (O, C / groups, KH, KW) ----

template <typename T>
void conv2d_gemm_backward_weight(KernelContext& context, const ConvGeometry& g) {
  PlaneInput<T> grad(context, context.inputs[0]);
  const Tensor& x = context.inputs[1];
  const Tensor& out = context.outputs[0];
  const T* x_data = x.data_ptr<T>();
  const int64_t k = g.column_rows(), plane = g.out_plane();
  const int64_t og = g.out_per_group(), cg = g.in_per_group();
  const int64_t weight_numel = g.out_channels * k;
  const int64_t chunks = batch_chunks(g.batch);
  const int64_t block = images_per_gemm(g, (g.batch + chunks - 1) / chunks);
  // Channels per im2col (col2im) pass, and the column rows one pass holds.
  const int64_t step = channels_per_pass(g, sizeof(T));
  const int64_t pass_rows = step * g.kernel_h * g.kernel_w;
  const int64_t x_ld = plane_matrix_ld(x);
  const std::vector<int64_t> tap_table_data =
      uses_tap_tables(g) ? im2col_table(g, x.stride(2), x.stride(3)) : std::vector<int64_t>();
  const int64_t* tap_table = tap_table_data.empty() ? nullptr : tap_table_data.data();
  const bool columns_are_input = g.pointwise() && x_ld >= 0 && block == 1;
  // One sum per chunk, added up at the end: threads never write the same weight. The first
  // chunk sums straight into a dense output (no buffer to fill, fault in and copy back).
  const bool direct = out.is_contiguous() && !shares_storage(out, context.inputs);
  const int64_t buffered = direct ? chunks - 1 : chunks;
  Tensor partials =
      buffered > 0 ? context.workspace({buffered, weight_numel}, out.dtype()) : Tensor();
  T* partial_data = buffered > 0 ? partials.template data_ptr<T>() : nullptr;
  T* out_data = direct ? out.data_ptr<T>() : nullptr;
  auto chunk_sum = [&](int64_t chunk) {
    return direct ? (chunk == 0 ? out_data : partial_data + (chunk - 1) * weight_numel)
                  : partial_data + chunk * weight_numel;
  };
  T* columns = nullptr;
  if (!columns_are_input)
    columns =
        context.workspace({chunks, pass_rows * block * plane}, out.dtype()).template data_ptr<T>();
  T* grad_blocks = nullptr;
  if (block > 1)
    grad_blocks =
        context.workspace({chunks, og * block * plane}, out.dtype()).template data_ptr<T>();

  for_each_batch_chunk(g.batch, chunks, [&](int64_t chunk, int64_t first, int64_t last) {
    T* partial = chunk_sum(chunk);
    if (first == last) std::fill(partial, partial + weight_numel, T(0));
    T* chunk_columns = columns ? columns + chunk * pass_rows * block * plane : nullptr;
    T* chunk_grad = grad_blocks ? grad_blocks + chunk * og * block * plane : nullptr;
    for (int64_t n0 = first; n0 < last; n0 += block) {
      const int64_t count = std::min(block, last - n0);
      const int64_t width = count * plane;
      for (int64_t group = 0; group < g.groups; ++group) {
        const T* group_input = x_data + n0 * x.stride(0) + group * cg * x.stride(1);
        const T* grad_group = grad.data + n0 * grad.batch_stride + group * og * grad.ld;
        int64_t grad_ld = grad.ld;
        if (block > 1) {
          gather_grad_block(g, grad_group, grad.ld, grad.batch_stride, count, chunk_grad);
          grad_group = chunk_grad;
          grad_ld = width;
        }
        const T beta = n0 == first ? T(0) : T(1);
        T* group_sum = partial + group * og * k;
        if (columns_are_input) {
          // dW_g (Og, K) += grad_g (Og, width) * x_g^T (width, K)
          cpu::gemm(false, true, og, k, width, T(1), grad_group, grad_ld, group_input, x_ld, beta,
                    group_sum, k);
          continue;
        }
        // The same product over slices of the columns (channel passes, as in the forward).
        const int64_t taps = g.kernel_h * g.kernel_w;
        for (int64_t c0 = 0; c0 < cg; c0 += step) {
          const int64_t channels = std::min(step, cg - c0);
          const ConvGeometry slice = channel_slice(g, channels);
          for (int64_t i = 0; i < count; ++i)
            im2col(slice, group_input + c0 * x.stride(1) + i * x.stride(0), x.stride(1),
                   x.stride(2), x.stride(3), chunk_columns + i * plane, width, tap_table);
          cpu::gemm(false, true, og, channels * taps, width, T(1), grad_group, grad_ld,
                    chunk_columns, width, beta, group_sum + c0 * taps, k);
        }
      }
    }
  });
  T* total = chunk_sum(0);
  parallel_for(0, weight_numel, 16384, [&](int64_t begin, int64_t end) {
    for (int64_t chunk = 1; chunk < chunks; ++chunk) {
      const T* partial = chunk_sum(chunk);
#pragma omp simd
      for (int64_t i = begin; i < end; ++i) total[i] += partial[i];
    }
  });
  if (direct) return;
  Tensor sum =
      make_view(partials, out.sizes(), contiguous_strides(out.sizes()), partials.storage_offset());
  cpu::copy_strided(sum, out);
}

// The weight gradient of a stride-1 3x3 convolution as F(3x3, MxM), the transpose of the
// forward's F(MxM, 3x3): for each MxM tile g of the output gradient and the input tile d under
// it, dW[o][c] += G^T [(A g A^T) (.) (B^T d B)] G. The sum over tiles runs in the transformed
// domain as (M + 2)^2 GEMMs of (out channels x tiles) by (tiles x in channels), one sum per
// thread, added up before the transform back to 3x3.
template <int M, typename T>
void conv2d_winograd_backward_weight(KernelContext& context, const ConvGeometry& g) {
  using Transforms = WinogradTransforms<M>;
  constexpr int n = Transforms::kIn, matrices = n * n;
  PlaneInput<T> grad(context, context.inputs[0]);
  PlaneInput<T> x(context, context.inputs[1]);
  const Tensor& out = context.outputs[0];
  // The input's tiles as the forward reads them; the gradient stands in for the output.
  const WinogradConv<T> p{
      x.data,         x.ld,    x.batch_stride, nullptr,       grad.ld,  grad.batch_stride,
      nullptr,        0,       g.batch,        g.in_channels, g.height, g.width,
      g.out_channels, g.out_h, g.out_w,        g.pad_h,       g.pad_w,  out.dtype()};
  // The tiles are the products' inner dimension here: zero columns only pad it.
  const WinogradBlocks b = winograd_blocks(p, M, kWinogradColumns);
  const int64_t O = g.out_channels, C = g.in_channels, sums = matrices * O * C;
  const int64_t bt = b.block_tiles, vs = b.matrix_stride(C), gs = b.matrix_stride(O);
  const int64_t per_chunk =
      matrices * (vs + gs) + M * M * bt + 2 * n * b.padded_w + M * n * kWinogradStrip + sums;
  T* scratch = context.workspace({b.chunks, per_chunk}, out.dtype()).template data_ptr<T>();
  auto sum_of = [&](int64_t chunk) { return scratch + chunk * per_chunk; };  // [matrices][O][C]

  for_each_batch_chunk(g.batch, b.chunks, [&](int64_t chunk, int64_t first, int64_t last) {
    T* S = sum_of(chunk);
    T* V = S + sums;            // [matrices][C][block_tiles], vs apart: transformed input
    T* Gt = V + matrices * vs;  // [matrices][O][block_tiles], gs apart: transformed gradient
    T* D = Gt + matrices * gs;  // [M * M][block_tiles]: one gradient channel's tiles
    T* band = D + M * M * bt;   // 2 n padded input rows
    T* half = band + 2 * n * b.padded_w;  // [M][n][kWinogradStrip]: A along the rows
    if (first == last) std::fill(S, S + sums, T(0));
    for (int64_t n0 = first; n0 < last; n0 += b.block_images) {
      const int64_t images = std::min(b.block_images, last - n0), count = b.gemm_tiles(images);
      winograd_input_tiles<M>(p, b, n0, images, V, band);
      // Each gradient tile, zero past the plane's edge and in the slots' padding (the zeros
      // filled here stay: every channel writes the same places), then A g A^T across the tiles.
      std::fill(D, D + M * M * bt, T(0));
      for (int64_t o = 0; o < O; ++o) {
        for (int64_t i = 0; i < images; ++i) {
          const T* plane = grad.data + (n0 + i) * grad.batch_stride + o * grad.ld;
          for (int64_t ty = 0; ty < b.tiles_h; ++ty) {
            const int64_t at = i * b.slot + ty * b.tiles_w;
            for (int a = 0; a < M && M * ty + a < g.out_h; ++a)
              deinterleave_tiles<M>(plane + (M * ty + a) * g.out_w, g.out_w, D + a * M * bt + at,
                                    bt);
          }
        }
        T* gt = Gt + o * bt;
        constexpr int64_t strip = kWinogradStrip;
        for (int64_t t0 = 0; t0 < count; t0 += strip) {
          const int64_t t1 = std::min(count, t0 + strip);
          for (int a = 0; a < M; ++a) {
#pragma omp simd
            for (int64_t t = t0; t < t1; ++t)
              Transforms::gradient(D + a * M * bt + t, bt, half + a * n * strip + t - t0, strip);
          }
          for (int j = 0; j < n; ++j) {
#pragma omp simd
            for (int64_t t = t0; t < t1; ++t)
              Transforms::gradient(half + j * strip + t - t0, n * strip, gt + j * gs + t, n * gs);
          }
        }
      }
      const T beta = n0 == first ? T(0) : T(1);
      for (int k = 0; k < matrices; ++k)
        cpu::gemm(false, true, O, C, count, T(1), Gt + k * gs, bt, V + k * vs, bt, beta,
                  S + k * O * C, C);
    }
  });
  // The threads' sums added up, then dW = G^T S G into a dense (O, C, 3, 3) gradient.
  T* total = sum_of(0);
  const bool direct = out.is_contiguous() && !shares_storage(out, context.inputs);
  Tensor dense = direct ? out : context.workspace(out.sizes(), out.dtype());
  T* dw = dense.data_ptr<T>();
  parallel_for(0, O * C, 256, [&](int64_t begin, int64_t end) {
    for (int64_t chunk = 1; chunk < b.chunks; ++chunk)
      for (int k = 0; k < matrices; ++k) {
        const T* partial = sum_of(chunk) + k * O * C;
        T* into = total + k * O * C;
#pragma omp simd
        for (int64_t i = begin; i < end; ++i) into[i] += partial[i];
      }
    for (int64_t i = begin; i < end; ++i) {
      T half_taps[3][n];  // G^T down each column of the sums
      for (int j = 0; j < n; ++j)
        Transforms::filter_gradient(total + j * O * C + i, n * O * C, &half_taps[0][j], n);
      for (int r = 0; r < 3; ++r)
        Transforms::filter_gradient(half_taps[r], 1, dw + i * 9 + 3 * r, 1);
    }
  });
  if (!direct) cpu::copy_strided(dense, out);
}

template <typename T>
void conv2d_depthwise_backward_weight(KernelContext& context, const ConvGeometry& g) {
  const Tensor& grad = context.inputs[0];
  const Tensor& x = context.inputs[1];
  const Tensor& out = context.outputs[0];
  const T* g_data = grad.data_ptr<T>();
  const T* x_data = x.data_ptr<T>();
  const int64_t taps = g.kernel_h * g.kernel_w, og = g.out_per_group();
  Tensor sums = context.workspace({g.out_channels, taps}, out.dtype());
  T* sum_data = sums.data_ptr<T>();
  const int64_t sg_h = grad.stride(2), sg_w = grad.stride(3);
  const int64_t sx_h = x.stride(2), sx_w = x.stride(3);
  const int64_t sg_n = grad.stride(0), sg_c = grad.stride(1);
  const int64_t sx_n = x.stride(0), sx_c = x.stride(1);
  if (g.stride_h == 1 && g.stride_w == 1) {
    // As in the forward: the gradient plane laid out with the padded row stride (zeros past
    // out_w), so every tap is one vectorised dot product with a shifted run of the padded input.
    const int64_t padded_w = g.width + 2 * g.pad_w, padded_h = g.height + 2 * g.pad_h;
    const int64_t flat_size = g.out_h * padded_w, padded_size = (padded_h + 1) * padded_w;
    const int64_t chunks =
        std::max<int64_t>(1, std::min<int64_t>(get_num_threads(), g.out_channels));
    T* scratch =
        context.workspace({chunks, flat_size + padded_size}, out.dtype()).template data_ptr<T>();
    parallel_for(0, chunks, 1, [&](int64_t chunk_begin, int64_t chunk_end) {
      for (int64_t chunk = chunk_begin; chunk < chunk_end; ++chunk) {
        T* grad_flat = scratch + chunk * (flat_size + padded_size);
        T* padded = grad_flat + flat_size;
        const int64_t o_begin = g.out_channels * chunk / chunks;
        const int64_t o_end = g.out_channels * (chunk + 1) / chunks;
        for (int64_t o = o_begin; o < o_end; ++o) {
          const int64_t c = o / og;
          T* totals = sum_data + o * taps;
          std::fill(totals, totals + taps, T(0));
          for (int64_t n = 0; n < g.batch; ++n) {
            const T* grad_plane = g_data + n * sg_n + o * sg_c;
            const T* channel = x_data + n * sx_n + c * sx_c;
            std::fill(padded, padded + padded_size, T(0));
            for (int64_t h = 0; h < g.height; ++h) {
              T* to = padded + (h + g.pad_h) * padded_w + g.pad_w;
              for (int64_t w = 0; w < g.width; ++w) to[w] = channel[h * sx_h + w * sx_w];
            }
            std::fill(grad_flat, grad_flat + flat_size, T(0));
            for (int64_t oh = 0; oh < g.out_h; ++oh)
              for (int64_t ow = 0; ow < g.out_w; ++ow)
                grad_flat[oh * padded_w + ow] = grad_plane[oh * sg_h + ow * sg_w];
            for (int64_t ki = 0; ki < g.kernel_h; ++ki) {
              for (int64_t kj = 0; kj < g.kernel_w; ++kj) {
                const T* tap = padded + ki * g.dilation_h * padded_w + kj * g.dilation_w;
                T total = 0;
#pragma omp simd reduction(+ : total)
                for (int64_t i = 0; i < flat_size; ++i) total += grad_flat[i] * tap[i];
                totals[ki * g.kernel_w + kj] += total;
              }
            }
          }
        }
      }
    });
    Tensor sum =
        make_view(sums, out.sizes(), contiguous_strides(out.sizes()), sums.storage_offset());
    cpu::copy_strided(sum, out);
    return;
  }
  parallel_for(0, g.out_channels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o) {
      const int64_t c = o / og;
      for (int64_t ki = 0; ki < g.kernel_h; ++ki) {
        for (int64_t kj = 0; kj < g.kernel_w; ++kj) {
          const int64_t offset_w = kj * g.dilation_w - g.pad_w;
          int64_t first, last;
          valid_range(offset_w, g.stride_w, g.width, g.out_w, &first, &last);
          T total = 0;
          for (int64_t n = 0; n < g.batch; ++n) {
            const T* grad_plane = g_data + n * sg_n + o * sg_c;
            const T* channel = x_data + n * sx_n + c * sx_c;
            for (int64_t oh = 0; oh < g.out_h; ++oh) {
              const int64_t ih = oh * g.stride_h - g.pad_h + ki * g.dilation_h;
              if (ih < 0 || ih >= g.height) continue;
              const T* grad_row = grad_plane + oh * sg_h;
              const T* in = channel + ih * sx_h;
              if (g.stride_w == 1 && sg_w == 1 && sx_w == 1) {  // dense rows: vectorised
                const T* shifted = in + offset_w;
#pragma omp simd reduction(+ : total)
                for (int64_t ow = first; ow < last; ++ow) total += grad_row[ow] * shifted[ow];
                continue;
              }
              for (int64_t ow = first; ow < last; ++ow)
                total += grad_row[ow * sg_w] * in[(ow * g.stride_w + offset_w) * sx_w];
            }
          }
          sum_data[o * taps + ki * g.kernel_w + kj] = total;
        }
      }
    }
  });
  Tensor sum = make_view(sums, out.sizes(), contiguous_strides(out.sizes()), sums.storage_offset());
  cpu::copy_strided(sum, out);
}

template <typename T>
void conv2d_backward_weight_kernel(KernelContext& context) {
  const ConvGeometry g = geometry_from_attr(context.attrs, "weight_size", context.inputs[1].sizes(),
                                            /*other_is_weight=*/false);
  if (context.outputs[0].numel() == 0) return;
  // Each thread sums the weight gradient's transformed matrices: up to 16 MB of floats a thread
  // (F(2x2)'s 16 over 512 x 512 channels: at 7x7, batch 32, 0.8 of im2col's time; F(4x4)'s 36
  // up to 256 x 256), im2col beyond.
  const int64_t pairs = g.in_channels * g.out_channels, most = int64_t{4} << 20;
  const bool winograd = std::is_same_v<T, float> && winograd_applies(g);
  if (winograd && winograd_tile(g) == 4 && 36 * pairs <= most) {
    conv2d_winograd_backward_weight<4, T>(context, g);
  } else if (winograd && 16 * pairs <= most) {
    conv2d_winograd_backward_weight<2, T>(context, g);
  } else if (g.depthwise()) {
    conv2d_depthwise_backward_weight<T>(context, g);
  } else {
    conv2d_gemm_backward_weight<T>(context, g);
  }
}

}  // namespace

void conv2d_forward(KernelContext& context) {
  visit_float_dtype(context.outputs[0].dtype(), ops::conv2d.name(),
                    [&](auto tag) { conv2d_forward_kernel<decltype(tag)>(context); });
}

void conv2d_backward_input(KernelContext& context) {
  visit_float_dtype(context.outputs[0].dtype(), ops::conv2d_backward_input.name(),
                    [&](auto tag) { conv2d_backward_input_kernel<decltype(tag)>(context); });
}

void conv2d_backward_weight(KernelContext& context) {
  visit_float_dtype(context.outputs[0].dtype(), ops::conv2d_backward_weight.name(),
                    [&](auto tag) { conv2d_backward_weight_kernel<decltype(tag)>(context); });
}

}  // namespace tessel::cpu
