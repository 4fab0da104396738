// The CPU kernels of conv2d (NCHW, stride, padding, dilation, groups, optional bias) and its
// two backward ops. Grouped and dense convolutions run as im2col + GEMM (the column buffer
// comes from the kernel workspace, so the allocator counts it); depthwise ones (one input
// channel per group) run directly. Images are spread over threads when the batch allows.
#include "ops/cpu/conv.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "ops/conv.h"
#include "ops/cpu/gemm.h"
#include "ops/cpu/strided_copy.h"
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
  for (int64_t c = 0; c < g.in_per_group(); ++c) {
    const T* channel = image + c * channel_stride;
    for (int64_t ki = 0; ki < g.kernel_h; ++ki) {
      for (int64_t kj = 0; kj < g.kernel_w; ++kj) {
        T* row = columns + ((c * g.kernel_h + ki) * g.kernel_w + kj) * columns_ld;
        const int64_t offset_w = kj * g.dilation_w - g.pad_w;
        if (same_plane) {
          shifted_plane(channel, g.height, g.width, ki * g.dilation_h - g.pad_h, offset_w, row);
          continue;
        }
        int64_t first, last;
        valid_range(offset_w, g.stride_w, g.width, g.out_w, &first, &last);
        for (int64_t oh = 0; oh < g.out_h; ++oh) {
          T* out = row + oh * g.out_w;
          const int64_t ih = oh * g.stride_h - g.pad_h + ki * g.dilation_h;
          if (ih < 0 || ih >= g.height) {
            std::fill(out, out + g.out_w, T(0));
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
// With `table` (col2im_table) the planes are written, not added to: they need no zeroing.
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
  for (int64_t c = 0; c < g.in_per_group(); ++c) {
    T* channel = image + c * channel_stride;
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
        for (int64_t oh = 0; oh < g.out_h; ++oh) {
          const int64_t ih = oh * g.stride_h - g.pad_h + ki * g.dilation_h;
          if (ih < 0 || ih >= g.height) continue;
          const T* in = row + oh * g.out_w;
          T* out = channel + ih * g.width;
          if (g.stride_w == 1) {
            T* shifted = out + offset_w;
            // Columns and image are separate buffers: vectorise (-O2 alone does not).
#pragma omp simd
            for (int64_t ow = first; ow < last; ++ow) shifted[ow] += in[ow];
          } else {
            for (int64_t ow = first; ow < last; ++ow) out[ow * g.stride_w + offset_w] += in[ow];
          }
        }
      }
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
// inner dimension.
int64_t channels_per_pass(const ConvGeometry& g, int64_t width, int64_t element_size) {
  const int64_t taps = g.kernel_h * g.kernel_w, cg = g.in_per_group();
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

// ---- forward ----

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
  const int64_t step = channels_per_pass(g, block * plane, sizeof(T));
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
  if (g.depthwise()) {
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
  const int64_t step = channels_per_pass(g, block * plane, sizeof(T));
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
            if (!tap_table) std::fill(image, image + channels * in_plane, T(0));
            col2im(slice, chunk_columns + i * plane, width, image, in_plane, tap_table);
          }
        }
      }
    }
  });
  if (!write_direct) cpu::copy_strided(target, out);
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
  if (g.depthwise()) {
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
  const int64_t step = channels_per_pass(g, block * plane, sizeof(T));
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
  if (g.depthwise()) {
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
