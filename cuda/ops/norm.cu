// CUDA kernels for batch norm (training, eval, backward) and pooling (max_pool2d with its i64
// indices, avg_pool2d, adaptive_avg_pool2d, and their backward ops), with the CPU semantics of
// ops/norm.cc and ops/pool.cc: per-channel statistics accumulated in f64, window rules, NaN
// propagation and index choice as PyTorch's. Backward pooling gathers into each input element
// in the CPU's order (no atomics), so results are deterministic.
#include <algorithm>
#include <cmath>

#include "cuda/ops/loops.cuh"
#include "ops/math/channel_layout.h"
#include "ops/math/pooling.h"
#include "ops/norm.h"
#include "ops/pool.h"
#include "ops/registry_helpers.h"

namespace tessel::cuda {

namespace {

constexpr DeviceType kCuda = DeviceType::kCuda;
constexpr int kReduceThreads = 256;

// A 1-D per-channel tensor on the device: pointer and stride; null when undefined.
template <typename T>
struct ChannelVector {
  T* data = nullptr;
  int64_t stride = 0;
  __device__ double get(int64_t c, double fallback) const {
    return data ? static_cast<double>(data[c * stride]) : fallback;
  }
};

template <typename T>
ChannelVector<T> channel_vector(const Tensor& tensor) {
  ChannelVector<T> vector;
  if (!tensor.defined()) return vector;
  vector.data = device_data<T>(tensor);
  vector.stride = tensor.stride(0);
  return vector;
}

// Sum over a block of `kReduceThreads` threads; every thread gets the total.
__device__ double block_sum(double value, double* shared) {
  shared[threadIdx.x] = value;
  __syncthreads();
  for (int half = kReduceThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) shared[threadIdx.x] += shared[threadIdx.x + half];
    __syncthreads();
  }
  double total = shared[0];
  __syncthreads();
  return total;
}

// ---- batch norm. x dense (N, C, S) ----

// The per-channel reductions run on a grid of channels x chunks of the N * S elements of each
// channel, so that a few channels still fill the GPU; a small kernel then combines each channel's
// chunks in chunk order. No atomics: the results are the same on every run.
constexpr int64_t kMinChunkElements = 8 * kReduceThreads;
constexpr int64_t kTargetBlocks = 1024;

struct ChannelChunks {
  int64_t chunks;  // per channel, at most 65535 (gridDim.y)
  ChannelChunks(int64_t channels, int64_t count) {
    const int64_t by_size = (count + kMinChunkElements - 1) / kMinChunkElements;
    const int64_t by_grid = channels >= kTargetBlocks ? 1 : kTargetBlocks / channels;
    chunks = std::max<int64_t>(1, std::min(by_size, by_grid));
  }
  dim3 grid(int64_t channels) const {
    return dim3(static_cast<unsigned>(channels), static_cast<unsigned>(chunks));
  }
};

// [begin, end) of chunk `k` of `chunks` over `count` elements.
__device__ void chunk_range(int64_t k, int64_t chunks, int64_t count, int64_t* begin,
                            int64_t* end) {
  *begin = k * count / chunks;
  *end = (k + 1) * count / chunks;
}

__device__ int64_t channel_element(int64_t i, int64_t c, int64_t channels, int64_t spatial) {
  return ((i / spatial) * channels + c) * spatial + i % spatial;
}

// Block (c, k): the element count, mean and sum of squared deviations of chunk k of channel c
// (two passes over the chunk, f64), to partial[3 * (c * chunks + k)].
template <typename T>
__global__ void channel_moments_kernel(const T* x, int64_t batch, int64_t channels, int64_t spatial,
                                       double* partial) {
  __shared__ double shared[kReduceThreads];
  const int64_t c = blockIdx.x, k = blockIdx.y, chunks = gridDim.y;
  int64_t begin, end;
  chunk_range(k, chunks, batch * spatial, &begin, &end);
  double total = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x)
    total += static_cast<double>(x[channel_element(i, c, channels, spatial)]);
  const double n = static_cast<double>(end - begin);
  const double chunk_sum = block_sum(total, shared);
  const double chunk_mean = n > 0 ? chunk_sum / n : 0.0;
  double squares = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const double centred =
        static_cast<double>(x[channel_element(i, c, channels, spatial)]) - chunk_mean;
    squares += centred * centred;
  }
  squares = block_sum(squares, shared);
  if (threadIdx.x != 0) return;
  double* out = partial + 3 * (c * chunks + k);
  out[0] = n;
  out[1] = chunk_mean;
  out[2] = squares;
}

// One thread per channel: the chunks' moments combined in chunk order (Chan et al.), giving the
// mean and biased variance of the channel.
__global__ void combine_moments_kernel(const double* partial, int64_t channels, int64_t chunks,
                                       double* mean, double* variance) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= channels) return;
  double n = 0, m = 0, m2 = 0;
  for (int64_t k = 0; k < chunks; ++k) {
    const double* chunk = partial + 3 * (c * chunks + k);
    if (chunk[0] == 0) continue;
    const double total = n + chunk[0];
    const double delta = chunk[1] - m;
    m += delta * chunk[0] / total;
    m2 += chunk[2] + delta * delta * n * chunk[0] / total;
    n = total;
  }
  // No element: 0 / 0, as a one-block reduction would give.
  mean[c] = n > 0 ? m : nan("");
  variance[c] = n > 0 ? m2 / n : nan("");
}

// Per channel: saved mean and invstd, scale and shift of y, and (unless replaying) the running
// statistics, updated with the unbiased variance.
template <typename T>
__global__ void batch_norm_finish_kernel(
    int64_t channels, int64_t count, double momentum, double eps, bool update_running,
    const double* mean, const double* variance, ChannelVector<T> weight, ChannelVector<T> bias,
    ChannelVector<T> save_mean, ChannelVector<T> save_invstd, ChannelVector<T> running_mean,
    ChannelVector<T> running_var, double* scale, double* shift) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= channels) return;
  const double invstd = 1.0 / sqrt(variance[c] + eps);
  scale[c] = weight.get(c, 1.0) * invstd;
  shift[c] = bias.get(c, 0.0) - mean[c] * scale[c];
  save_mean.data[c * save_mean.stride] = static_cast<T>(mean[c]);
  save_invstd.data[c * save_invstd.stride] = static_cast<T>(invstd);
  if (!update_running) return;
  const double unbiased = static_cast<double>(count) / static_cast<double>(count - 1);
  if (running_mean.data) {
    T& value = running_mean.data[c * running_mean.stride];
    value = static_cast<T>((1 - momentum) * static_cast<double>(value) + momentum * mean[c]);
  }
  if (running_var.data) {
    T& value = running_var.data[c * running_var.stride];
    value = static_cast<T>((1 - momentum) * static_cast<double>(value) +
                           momentum * variance[c] * unbiased);
  }
}

// Eval: scale and shift from the running statistics.
template <typename T>
__global__ void batch_norm_eval_scale_kernel(int64_t channels, double eps, ChannelVector<T> weight,
                                             ChannelVector<T> bias, ChannelVector<T> mean,
                                             ChannelVector<T> variance, double* scale,
                                             double* shift) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= channels) return;
  scale[c] = weight.get(c, 1.0) / sqrt(variance.get(c, 1.0) + eps);
  shift[c] = bias.get(c, 0.0) - mean.get(c, 0.0) * scale[c];
}

// y = x * scale[c] + shift[c] over dense (N, C, S).
template <typename T>
__global__ void scale_shift_kernel(const T* x, T* y, int64_t count, int64_t channels,
                                   int64_t spatial, const double* scale, const double* shift) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = (i / spatial) % channels;
    y[i] = static_cast<T>(static_cast<double>(x[i]) * scale[c] + shift[c]);
  }
}

// Backward, block (c, k): sum(g) and sum(g * (x - mean)) over chunk k of channel c, to
// partial[2 * (c * chunks + k)].
template <typename T>
__global__ void batch_norm_backward_reduce_kernel(const T* grad, const T* x, int64_t batch,
                                                  int64_t channels, int64_t spatial,
                                                  ChannelVector<T> mean, double* partial) {
  __shared__ double shared[kReduceThreads];
  const int64_t c = blockIdx.x, k = blockIdx.y, chunks = gridDim.y;
  int64_t begin, end;
  chunk_range(k, chunks, batch * spatial, &begin, &end);
  const double channel_mean = mean.get(c, 0.0);
  double sum_g = 0, sum_g_centred = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const int64_t at = channel_element(i, c, channels, spatial);
    const double g = static_cast<double>(grad[at]);
    sum_g += g;
    sum_g_centred += g * (static_cast<double>(x[at]) - channel_mean);
  }
  sum_g = block_sum(sum_g, shared);
  sum_g_centred = block_sum(sum_g_centred, shared);
  if (threadIdx.x != 0) return;
  partial[2 * (c * chunks + k)] = sum_g;
  partial[2 * (c * chunks + k) + 1] = sum_g_centred;
}

// One thread per channel: the chunks' sums added in chunk order, then grad_bias = sum(g),
// grad_weight = sum(g * (x - mean)) * invstd, and the coefficients of
// grad_x = gain * (g - mean_g) - slope * (x - mean).
template <typename T>
__global__ void batch_norm_backward_combine_kernel(
    const double* partial, int64_t channels, int64_t chunks, int64_t count, bool training,
    double eps, ChannelVector<T> weight, ChannelVector<T> mean, ChannelVector<T> invstd_or_var,
    ChannelVector<T> grad_weight, ChannelVector<T> grad_bias, double* coefficients) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= channels) return;
  double sum_g = 0, sum_g_centred = 0;
  for (int64_t k = 0; k < chunks; ++k) {
    sum_g += partial[2 * (c * chunks + k)];
    sum_g_centred += partial[2 * (c * chunks + k) + 1];
  }
  double invstd = invstd_or_var.get(c, 1.0);
  if (!training) invstd = 1.0 / sqrt(invstd + eps);
  const double w = weight.get(c, 1.0);
  if (grad_weight.data)
    grad_weight.data[c * grad_weight.stride] = static_cast<T>(sum_g_centred * invstd);
  if (grad_bias.data) grad_bias.data[c * grad_bias.stride] = static_cast<T>(sum_g);
  const double n = static_cast<double>(count);
  coefficients[4 * c + 0] = w * invstd;
  coefficients[4 * c + 1] = training ? sum_g / n : 0.0;
  coefficients[4 * c + 2] = training ? w * invstd * invstd * invstd * sum_g_centred / n : 0.0;
  coefficients[4 * c + 3] = mean.get(c, 0.0);
}

template <typename T>
__global__ void batch_norm_backward_input_kernel(const T* grad, const T* x, T* grad_x,
                                                 int64_t count, int64_t channels, int64_t spatial,
                                                 const double* coefficients) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const double* k = coefficients + 4 * ((i / spatial) % channels);
    grad_x[i] = static_cast<T>(k[0] * (static_cast<double>(grad[i]) - k[1]) -
                               k[2] * (static_cast<double>(x[i]) - k[3]));
  }
}

void batch_norm_train(KernelContext& context) {
  const double momentum = context.attrs.get<double>("momentum");
  const double eps = context.attrs.get<double>("eps");
  KernelDevice device(context);
  visit_float_dtype(context.inputs[0].dtype(), ops::batch_norm.name(), [&](auto tag) {
    using T = decltype(tag);
    const Tensor x = dense_input(context, context.inputs[0]);
    const ChannelLayout layout(x.sizes());
    const int64_t C = layout.channels;
    Tensor statistics = context.workspace({4, C}, DType::kFloat64);
    double* mean = device_data<double>(statistics);
    double* variance = mean + C;
    double* scale = mean + 2 * C;
    double* shift = mean + 3 * C;
    if (C == 0) return;
    const ChannelChunks split(C, layout.batch * layout.spatial);
    Tensor partial = context.workspace({3 * C * split.chunks}, DType::kFloat64);
    channel_moments_kernel<T><<<split.grid(C), kReduceThreads, 0, device.stream()>>>(
        device_data<T>(x), layout.batch, C, layout.spatial, device_data<double>(partial));
    check_launch();
    combine_moments_kernel<<<grid_for(C), kThreads, 0, device.stream()>>>(
        device_data<double>(partial), C, split.chunks, mean, variance);
    check_launch();
    batch_norm_finish_kernel<T><<<grid_for(C), kThreads, 0, device.stream()>>>(
        C, layout.batch * layout.spatial, momentum, eps, !context.replay, mean, variance,
        channel_vector<T>(context.inputs[1]), channel_vector<T>(context.inputs[2]),
        channel_vector<T>(context.outputs[1]), channel_vector<T>(context.outputs[2]),
        channel_vector<T>(context.inputs[3]), channel_vector<T>(context.inputs[4]), scale, shift);
    check_launch();
    DenseOutput y(context, context.outputs[0]);
    const int64_t count = x.numel();
    if (count > 0) {
      scale_shift_kernel<T><<<grid_for(count), kThreads, 0, device.stream()>>>(
          device_data<T>(x), y.data<T>(), count, C, layout.spatial, scale, shift);
      check_launch();
    }
    y.finish();
  });
}

void batch_norm_eval(KernelContext& context) {
  const double eps = context.attrs.get<double>("eps");
  KernelDevice device(context);
  visit_float_dtype(context.inputs[0].dtype(), ops::batch_norm.name(), [&](auto tag) {
    using T = decltype(tag);
    const Tensor x = dense_input(context, context.inputs[0]);
    const ChannelLayout layout(x.sizes());
    const int64_t C = layout.channels;
    if (x.numel() == 0) return;
    Tensor coefficients = context.workspace({2, C}, DType::kFloat64);
    double* scale = device_data<double>(coefficients);
    double* shift = scale + C;
    batch_norm_eval_scale_kernel<T><<<grid_for(C), kThreads, 0, device.stream()>>>(
        C, eps, channel_vector<T>(context.inputs[1]), channel_vector<T>(context.inputs[2]),
        channel_vector<T>(context.inputs[3]), channel_vector<T>(context.inputs[4]), scale, shift);
    check_launch();
    DenseOutput y(context, context.outputs[0]);
    scale_shift_kernel<T><<<grid_for(x.numel()), kThreads, 0, device.stream()>>>(
        device_data<T>(x), y.data<T>(), x.numel(), C, layout.spatial, scale, shift);
    check_launch();
    y.finish();
  });
}

void batch_norm_backward(KernelContext& context) {
  const bool training = context.attrs.get<bool>("training");
  const double eps = training ? 0.0 : context.attrs.get<double>("eps");
  KernelDevice device(context);
  visit_float_dtype(context.inputs[1].dtype(), ops::batch_norm_backward.name(), [&](auto tag) {
    using T = decltype(tag);
    const Tensor grad = dense_input(context, context.inputs[0]);
    const Tensor x = dense_input(context, context.inputs[1]);
    const ChannelLayout layout(x.sizes());
    const int64_t C = layout.channels;
    if (C == 0) return;
    Tensor coefficients = context.workspace({4 * C}, DType::kFloat64);
    const int64_t count = layout.batch * layout.spatial;
    const ChannelChunks split(C, count);
    Tensor partial = context.workspace({2 * C * split.chunks}, DType::kFloat64);
    batch_norm_backward_reduce_kernel<T><<<split.grid(C), kReduceThreads, 0, device.stream()>>>(
        device_data<T>(grad), device_data<T>(x), layout.batch, C, layout.spatial,
        channel_vector<T>(context.inputs[3]), device_data<double>(partial));
    check_launch();
    batch_norm_backward_combine_kernel<T><<<grid_for(C), kThreads, 0, device.stream()>>>(
        device_data<double>(partial), C, split.chunks, count, training, eps,
        channel_vector<T>(context.inputs[2]), channel_vector<T>(context.inputs[3]),
        channel_vector<T>(context.inputs[4]), channel_vector<T>(context.outputs[1]),
        channel_vector<T>(context.outputs[2]), device_data<double>(coefficients));
    check_launch();
    DenseOutput grad_x(context, context.outputs[0]);
    if (x.numel() > 0) {
      batch_norm_backward_input_kernel<T><<<grid_for(x.numel()), kThreads, 0, device.stream()>>>(
          device_data<T>(grad), device_data<T>(x), grad_x.data<T>(), x.numel(), C, layout.spatial,
          device_data<double>(coefficients));
      check_launch();
    }
    grad_x.finish();
  });
}

// ---- pooling over strided (N, C, H, W) tensors ----

// Planes, PoolAxis and the window rules are the CPU's (ops/math/pooling.h).

PoolAxis pool_axis(const Attrs& attrs, int i, int64_t input, int64_t output, bool with_dilation) {
  const auto& kernel = attrs.get<std::vector<int64_t>>("kernel_size");
  const auto& stride = attrs.get<std::vector<int64_t>>("stride");
  const auto& padding = attrs.get<std::vector<int64_t>>("padding");
  const int64_t dilation =
      with_dilation ? attrs.get<std::vector<int64_t>>("dilation")[static_cast<size_t>(i)] : 1;
  return {input, kernel[i], stride[i], padding[i], dilation, output};
}

template <typename T>
__global__ void max_pool_kernel(const T* x, Planes in, T* values, Planes out, int64_t* indices,
                                Planes index, PoolAxis rows, PoolAxis cols, int64_t count) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t ow = i % cols.output, oh = (i / cols.output) % rows.output;
    const int64_t plane = i / (cols.output * rows.output);
    T best;
    int64_t best_index;
    window_max(
        rows, cols, oh, ow, [&](int64_t h, int64_t w) { return x[in.at(plane, h, w)]; }, &best,
        &best_index);
    values[out.at(plane, oh, ow)] = best;
    indices[index.at(plane, oh, ow)] = best_index;
  }
}

// Each input element sums the gradients of the outputs that picked it, in (oh, ow) order.
template <typename T>
__global__ void max_pool_backward_kernel(const T* grad, Planes g, const int64_t* indices,
                                         Planes index, T* out, Planes o, PoolAxis rows,
                                         PoolAxis cols, int64_t count) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t w = i % cols.input, h = (i / cols.input) % rows.input;
    const int64_t plane = i / (cols.input * rows.input);
    const int64_t position = h * cols.input + w;
    int64_t oh0, oh1, ow0, ow1;
    covering_outputs(rows, h, &oh0, &oh1);
    covering_outputs(cols, w, &ow0, &ow1);
    T total = 0;
    for (int64_t oh = oh0; oh <= oh1; ++oh)
      for (int64_t ow = ow0; ow <= ow1; ++ow)
        if (indices[index.at(plane, oh, ow)] == position) total += grad[g.at(plane, oh, ow)];
    out[o.at(plane, h, w)] = total;
  }
}

template <typename T>
__global__ void avg_pool_kernel(const T* x, Planes in, T* values, Planes out, PoolAxis rows,
                                PoolAxis cols, bool count_include_pad, int64_t count) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t ow = i % cols.output, oh = (i / cols.output) % rows.output;
    const int64_t plane = i / (cols.output * rows.output);
    const AvgWindow wh = avg_window(rows, oh), ww = avg_window(cols, ow);
    values[out.at(plane, oh, ow)] = window_average<T>(
        wh, ww, count_include_pad, [&](int64_t h, int64_t w) { return x[in.at(plane, h, w)]; });
  }
}

template <typename T>
__global__ void avg_pool_backward_kernel(const T* grad, Planes g, T* out, Planes o, PoolAxis rows,
                                         PoolAxis cols, bool count_include_pad, int64_t count) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t w = i % cols.input, h = (i / cols.input) % rows.input;
    const int64_t plane = i / (cols.input * rows.input);
    int64_t oh0, oh1, ow0, ow1;
    covering_outputs(rows, h, &oh0, &oh1);
    covering_outputs(cols, w, &ow0, &ow1);
    T total = 0;
    for (int64_t oh = oh0; oh <= oh1; ++oh) {
      const AvgWindow wh = avg_window(rows, oh);
      if (!wh.contains(h)) continue;
      for (int64_t ow = ow0; ow <= ow1; ++ow) {
        const AvgWindow ww = avg_window(cols, ow);
        if (!ww.contains(w)) continue;
        total += grad[g.at(plane, oh, ow)] / static_cast<T>(avg_divisor(wh, ww, count_include_pad));
      }
    }
    out[o.at(plane, h, w)] = total;
  }
}

template <typename T>
__global__ void adaptive_avg_kernel(const T* x, Planes in, T* values, Planes out, int64_t count) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t ow = i % out.width, oh = (i / out.width) % out.height;
    const int64_t plane = i / (out.width * out.height);
    const AvgWindow wh = adaptive_window(oh, in.height, out.height);
    const AvgWindow ww = adaptive_window(ow, in.width, out.width);
    const T total =
        window_sum<T>(wh, ww, [&](int64_t h, int64_t w) { return x[in.at(plane, h, w)]; });
    values[out.at(plane, oh, ow)] = total / static_cast<T>(avg_divisor(wh, ww, false));
  }
}

template <typename T>
__global__ void adaptive_avg_backward_kernel(const T* grad, Planes g, T* out, Planes o,
                                             int64_t count) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t w = i % o.width, h = (i / o.width) % o.height;
    const int64_t plane = i / (o.width * o.height);
    int64_t oh_first, oh_last, ow_first, ow_last;
    adaptive_covering_outputs(h, o.height, g.height, &oh_first, &oh_last);
    adaptive_covering_outputs(w, o.width, g.width, &ow_first, &ow_last);
    T total = 0;
    for (int64_t oh = oh_first; oh <= oh_last; ++oh) {
      const AvgWindow wh = adaptive_window(oh, o.height, g.height);
      if (!wh.contains(h)) continue;
      for (int64_t ow = ow_first; ow <= ow_last; ++ow) {
        const AvgWindow ww = adaptive_window(ow, o.width, g.width);
        if (!ww.contains(w)) continue;
        total += grad[g.at(plane, oh, ow)] / static_cast<T>(avg_divisor(wh, ww, false));
      }
    }
    out[o.at(plane, h, w)] = total;
  }
}

void max_pool(KernelContext& context) {
  const Tensor& x = context.inputs[0];
  const Tensor& values = context.outputs[0];
  const Tensor& indices = context.outputs[1];
  const int64_t count = values.numel();
  if (count == 0) return;
  KernelDevice device(context);
  const PoolAxis rows = pool_axis(context.attrs, 0, x.size(2), values.size(2), true);
  const PoolAxis cols = pool_axis(context.attrs, 1, x.size(3), values.size(3), true);
  visit_float_dtype(x.dtype(), ops::max_pool2d.name(), [&](auto tag) {
    using T = decltype(tag);
    max_pool_kernel<T><<<grid_for(count), kThreads, 0, device.stream()>>>(
        device_data<T>(x), planes_of(x), device_data<T>(values), planes_of(values),
        device_data<int64_t>(indices), planes_of(indices), rows, cols, count);
    check_launch();
  });
}

void max_pool_backward(KernelContext& context) {
  const Tensor& grad = context.inputs[0];
  const Tensor& indices = context.inputs[1];
  const Tensor& out = context.outputs[0];
  const int64_t count = out.numel();
  if (count == 0) return;
  KernelDevice device(context);
  const PoolAxis rows = pool_axis(context.attrs, 0, out.size(2), grad.size(2), true);
  const PoolAxis cols = pool_axis(context.attrs, 1, out.size(3), grad.size(3), true);
  visit_float_dtype(out.dtype(), ops::max_pool2d_backward.name(), [&](auto tag) {
    using T = decltype(tag);
    max_pool_backward_kernel<T><<<grid_for(count), kThreads, 0, device.stream()>>>(
        device_data<T>(grad), planes_of(grad), device_data<int64_t>(indices), planes_of(indices),
        device_data<T>(out), planes_of(out), rows, cols, count);
    check_launch();
  });
}

void avg_pool(KernelContext& context) {
  const Tensor& x = context.inputs[0];
  const Tensor& values = context.outputs[0];
  const int64_t count = values.numel();
  if (count == 0) return;
  KernelDevice device(context);
  const PoolAxis rows = pool_axis(context.attrs, 0, x.size(2), values.size(2), false);
  const PoolAxis cols = pool_axis(context.attrs, 1, x.size(3), values.size(3), false);
  const bool count_include_pad = context.attrs.get<bool>("count_include_pad");
  visit_float_dtype(x.dtype(), ops::avg_pool2d.name(), [&](auto tag) {
    using T = decltype(tag);
    avg_pool_kernel<T><<<grid_for(count), kThreads, 0, device.stream()>>>(
        device_data<T>(x), planes_of(x), device_data<T>(values), planes_of(values), rows, cols,
        count_include_pad, count);
    check_launch();
  });
}

void avg_pool_backward(KernelContext& context) {
  const Tensor& grad = context.inputs[0];
  const Tensor& out = context.outputs[0];
  const int64_t count = out.numel();
  if (count == 0) return;
  KernelDevice device(context);
  const PoolAxis rows = pool_axis(context.attrs, 0, out.size(2), grad.size(2), false);
  const PoolAxis cols = pool_axis(context.attrs, 1, out.size(3), grad.size(3), false);
  const bool count_include_pad = context.attrs.get<bool>("count_include_pad");
  visit_float_dtype(out.dtype(), ops::avg_pool2d_backward.name(), [&](auto tag) {
    using T = decltype(tag);
    avg_pool_backward_kernel<T><<<grid_for(count), kThreads, 0, device.stream()>>>(
        device_data<T>(grad), planes_of(grad), device_data<T>(out), planes_of(out), rows, cols,
        count_include_pad, count);
    check_launch();
  });
}

void adaptive_avg_pool(KernelContext& context) {
  const Tensor& x = context.inputs[0];
  const Tensor& values = context.outputs[0];
  const int64_t count = values.numel();
  if (count == 0) return;
  KernelDevice device(context);
  visit_float_dtype(x.dtype(), ops::adaptive_avg_pool2d.name(), [&](auto tag) {
    using T = decltype(tag);
    adaptive_avg_kernel<T><<<grid_for(count), kThreads, 0, device.stream()>>>(
        device_data<T>(x), planes_of(x), device_data<T>(values), planes_of(values), count);
    check_launch();
  });
}

void adaptive_avg_pool_backward(KernelContext& context) {
  const Tensor& grad = context.inputs[0];
  const Tensor& out = context.outputs[0];
  const int64_t count = out.numel();
  if (count == 0) return;
  KernelDevice device(context);
  visit_float_dtype(out.dtype(), ops::adaptive_avg_pool2d_backward.name(), [&](auto tag) {
    using T = decltype(tag);
    adaptive_avg_backward_kernel<T><<<grid_for(count), kThreads, 0, device.stream()>>>(
        device_data<T>(grad), planes_of(grad), device_data<T>(out), planes_of(out), count);
    check_launch();
  });
}

}  // namespace

TESSEL_REGISTER_OPS(cuda_norm_pool) {
  ops::batch_norm.set_kernel(kCuda, batch_norm_train);
  ops::batch_norm_eval.set_kernel(kCuda, batch_norm_eval);
  ops::batch_norm_backward.set_kernel(kCuda, batch_norm_backward);
  ops::max_pool2d.set_kernel(kCuda, max_pool);
  ops::max_pool2d_backward.set_kernel(kCuda, max_pool_backward);
  ops::avg_pool2d.set_kernel(kCuda, avg_pool);
  ops::avg_pool2d_backward.set_kernel(kCuda, avg_pool_backward);
  ops::adaptive_avg_pool2d.set_kernel(kCuda, adaptive_avg_pool);
  ops::adaptive_avg_pool2d_backward.set_kernel(kCuda, adaptive_avg_pool_backward);
}

}  // namespace tessel::cuda
