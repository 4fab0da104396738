// CUDA kernels for the normalisations of ops/norm.cc, with the CPU's semantics: batch_norm
// (training, eval, backward) accumulates per-channel statistics in f64, layer_norm (+ backward)
// per-row statistics, one block per row (the block reductions of reduce.cuh). batch_norm, its
// backward and layer_norm's backward also run over chunks of the batch (KernelContext::chunk, a
// memory policy's split), their per-channel or per-feature sums kept on host between chunks.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "cuda/ops/loops.cuh"
#include "cuda/ops/reduce.cuh"
#include "ops/math/channel_layout.h"
#include "ops/norm.h"
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

// Adds the moments (count, mean, sum of squared deviations) of `part` to `total` (Chan et al.).
__host__ __device__ inline void add_moments(double* total, const double* part) {
  if (part[0] == 0) return;
  const double count = total[0] + part[0];
  const double delta = part[1] - total[1];
  total[1] += delta * part[0] / count;
  total[2] += part[2] + delta * delta * total[0] * part[0] / count;
  total[0] = count;
}

// One thread per channel: the chunks' moments combined in chunk order, giving the mean and biased
// variance of the channel.
__global__ void combine_moments_kernel(const double* partial, int64_t channels, int64_t chunks,
                                       double* mean, double* variance) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= channels) return;
  double moments[3] = {0, 0, 0};
  for (int64_t k = 0; k < chunks; ++k) add_moments(moments, partial + 3 * (c * chunks + k));
  // No element: 0 / 0, as a one-block reduction would give.
  mean[c] = moments[0] > 0 ? moments[1] : nan("");
  variance[c] = moments[0] > 0 ? moments[2] / moments[0] : nan("");
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

// Block (c, k)'s moments of a dense (N, C, S) x, to partial[3 * (c * split.chunks + k)].
template <typename T>
Tensor channel_moments(KernelContext& context, const Tensor& x, const ChannelLayout& layout,
                       const ChannelChunks& split) {
  KernelDevice device(context);
  const int64_t C = layout.channels;
  Tensor partial = context.workspace({3 * C * split.chunks}, DType::kFloat64);
  channel_moments_kernel<T><<<split.grid(C), kReduceThreads, 0, device.stream()>>>(
      device_data<T>(x), layout.batch, C, layout.spatial, device_data<double>(partial));
  check_launch();
  return partial;
}

// Over chunks of the batch (KernelContext::chunk, three passes): pass 0 adds the chunk's
// per-channel moments to the state (count, mean, squared deviations per channel, in chunk order),
// pass 1 has nothing left to read, pass 2 writes the chunk's statistics into `statistics` (mean,
// variance; false before then) and the whole batch's count per channel into `per_channel`.
template <typename T>
bool chunk_statistics(KernelContext& context, const Tensor& x, const ChannelLayout& layout,
                      const Tensor& statistics, int64_t* per_channel) {
  const ChunkPass& chunk = *context.chunk;
  std::vector<double>& state = *chunk.state;
  const int64_t C = layout.channels;
  if (state.empty()) state.assign(3 * C, 0.0);
  if (chunk.pass == 0) {
    if (x.numel() == 0) return false;
    const ChannelChunks split(C, layout.batch * layout.spatial);
    const std::vector<double> moments = read_doubles(channel_moments<T>(context, x, layout, split));
    for (int64_t c = 0; c < C; ++c)
      for (int64_t k = 0; k < split.chunks; ++k)
        add_moments(&state[3 * c], &moments[3 * (c * split.chunks + k)]);
    return false;
  }
  if (!chunk.last_pass()) return false;
  std::vector<double> mean_variance(2 * C);
  for (int64_t c = 0; c < C; ++c) {
    const double* moments = &state[3 * c];
    mean_variance[c] = moments[0] > 0 ? moments[1] : std::nan("");
    mean_variance[C + c] = moments[0] > 0 ? moments[2] / moments[0] : std::nan("");
  }
  write_doubles(statistics, mean_variance);
  *per_channel = chunk.size * layout.spatial;
  return true;
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
    int64_t per_channel = layout.batch * layout.spatial;
    if (context.chunk) {
      if (!chunk_statistics<T>(context, x, layout, statistics, &per_channel)) return;
    } else {
      const ChannelChunks split(C, per_channel);
      const Tensor partial = channel_moments<T>(context, x, layout, split);
      combine_moments_kernel<<<grid_for(C), kThreads, 0, device.stream()>>>(
          device_data<double>(partial), C, split.chunks, mean, variance);
      check_launch();
    }
    // Over chunks, the running statistics move once, with the last chunk.
    const bool update_running =
        !context.replay && (!context.chunk || context.chunk->end == context.chunk->size);
    batch_norm_finish_kernel<T><<<grid_for(C), kThreads, 0, device.stream()>>>(
        C, per_channel, momentum, eps, update_running, mean, variance,
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
  TESSEL_CHECK(!context.attrs.get_or<bool>("relu", false),
               "batch_norm_eval: relu fused in runs on the CPU only; call relu(batch_norm(...))");
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
    int64_t count = layout.batch * layout.spatial;
    ChannelChunks split(C, count);
    Tensor partial = context.workspace({2 * C * split.chunks}, DType::kFloat64);
    if (!context.chunk || context.chunk->pass == 0) {
      batch_norm_backward_reduce_kernel<T><<<split.grid(C), kReduceThreads, 0, device.stream()>>>(
          device_data<T>(grad), device_data<T>(x), layout.batch, C, layout.spatial,
          channel_vector<T>(context.inputs[3]), device_data<double>(partial));
      check_launch();
    }
    if (const ChunkPass* chunk = context.chunk) {
      // Over chunks of the batch: pass 0 adds the chunk's sums per channel to the state (sum_g,
      // sum_g_centred, in chunk order), pass 1 takes them as one block's over the whole batch.
      std::vector<double>& sums = *chunk->state;
      if (sums.empty()) sums.assign(2 * C, 0.0);
      if (chunk->pass == 0) {
        const std::vector<double> partial_sums = read_doubles(partial);
        for (int64_t c = 0; c < C; ++c)
          for (int64_t k = 0; k < split.chunks; ++k)
            for (int s = 0; s < 2; ++s)
              sums[2 * c + s] += partial_sums[2 * (c * split.chunks + k) + s];
        return;
      }
      write_doubles(partial, sums);
      split.chunks = 1;
      count = chunk->size * layout.spatial;
    }
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

// ---- layer_norm ----

struct DoublePair {
  double first, second;
};

// One block per row of K features: mean, then squared deviations, then the normalised output.
template <typename T>
__global__ void layer_norm_forward_kernel(const T* x, const T* weight, const T* bias,
                                          ReduceLayout layout, int64_t tiles, double eps, T* y,
                                          T* means, T* rstds) {
  ReduceThread thread(layout, tiles);
  double* shared = shared_buffer<double>();
  auto add = [](double a, double b) { return a + b; };
  const int64_t features = layout.reduce;
  double total = 0;
  for (int64_t j = threadIdx.y; j < features; j += blockDim.y)
    total += static_cast<double>(x[thread.at(layout, j)]);
  const double mean = combine_over_rows(total, shared, add) / static_cast<double>(features);
  double squares = 0;
  for (int64_t j = threadIdx.y; j < features; j += blockDim.y) {
    const double deviation = static_cast<double>(x[thread.at(layout, j)]) - mean;
    squares += deviation * deviation;
  }
  squares = combine_over_rows(squares, shared, add);
  const double rstd = 1.0 / sqrt(squares / static_cast<double>(features) + eps);
  for (int64_t j = threadIdx.y; j < features; j += blockDim.y) {
    const int64_t at = thread.at(layout, j);
    double value = (static_cast<double>(x[at]) - mean) * rstd;
    if (weight) value *= static_cast<double>(weight[j]);
    if (bias) value += static_cast<double>(bias[j]);
    y[at] = static_cast<T>(value);
  }
  if (threadIdx.y == 0) {
    means[thread.outer] = static_cast<T>(mean);
    rstds[thread.outer] = static_cast<T>(rstd);
  }
}

// dx = rstd * (wg - mean(wg) - xhat * mean(wg * xhat)), wg = g * weight; one block per row.
template <typename T>
__global__ void layer_norm_grad_input_kernel(const T* grad_y, const T* x, const T* means,
                                             const T* rstds, const T* weight, ReduceLayout layout,
                                             int64_t tiles, T* grad_x) {
  ReduceThread thread(layout, tiles);
  const int64_t features = layout.reduce;
  const double mu = static_cast<double>(means[thread.outer]);
  const double r = static_cast<double>(rstds[thread.outer]);
  DoublePair sums{0, 0};
  for (int64_t j = threadIdx.y; j < features; j += blockDim.y) {
    const int64_t at = thread.at(layout, j);
    const double wg = weight ? static_cast<double>(grad_y[at]) * static_cast<double>(weight[j])
                             : static_cast<double>(grad_y[at]);
    sums.first += wg;
    sums.second += wg * (static_cast<double>(x[at]) - mu) * r;
  }
  sums = combine_over_rows(sums, shared_buffer<DoublePair>(), [](DoublePair a, DoublePair b) {
    return DoublePair{a.first + b.first, a.second + b.second};
  });
  const double mean_wg = sums.first / static_cast<double>(features);
  const double mean_wg_xhat = sums.second / static_cast<double>(features);
  for (int64_t j = threadIdx.y; j < features; j += blockDim.y) {
    const int64_t at = thread.at(layout, j);
    const double wg = weight ? static_cast<double>(grad_y[at]) * static_cast<double>(weight[j])
                             : static_cast<double>(grad_y[at]);
    const double xhat = (static_cast<double>(x[at]) - mu) * r;
    grad_x[at] = static_cast<T>(r * (wg - mean_wg - xhat * mean_wg_xhat));
  }
}

// Column sums over rows: grad_weight[j] = sum g * xhat, grad_bias[j] = sum g, in G (T, or f64
// for a run over chunks). Layout [1, rows, features].
template <typename T, typename G>
__global__ void layer_norm_grad_params_kernel(const T* grad_y, const T* x, const T* means,
                                              const T* rstds, ReduceLayout layout, int64_t tiles,
                                              G* grad_weight, G* grad_bias) {
  ReduceThread thread(layout, tiles);
  DoublePair sums{0, 0};
  if (thread.active) {
    for (int64_t row = threadIdx.y; row < layout.reduce; row += blockDim.y) {
      const int64_t at = thread.at(layout, row);
      const double g = static_cast<double>(grad_y[at]);
      const double xhat = (static_cast<double>(x[at]) - static_cast<double>(means[row])) *
                          static_cast<double>(rstds[row]);
      sums.first += g * xhat;
      sums.second += g;
    }
  }
  sums = combine_over_rows(sums, shared_buffer<DoublePair>(), [](DoublePair a, DoublePair b) {
    return DoublePair{a.first + b.first, a.second + b.second};
  });
  if (thread.active && threadIdx.y == 0) {
    grad_weight[thread.column] = static_cast<G>(sums.first);
    grad_bias[thread.column] = static_cast<G>(sums.second);
  }
}

int64_t features_of(const Attrs& attrs) {
  return shape_numel(attrs.get<std::vector<int64_t>>("normalized_shape"));
}

void layer_norm_kernel(KernelContext& context) {
  const double eps = context.attrs.get<double>("eps");
  const int64_t features = features_of(context.attrs);
  visit_float_dtype(context.inputs[0].dtype(), ops::layer_norm.name(), [&](auto tag) {
    using T = decltype(tag);
    const Tensor x = dense_input(context, context.inputs[0]);
    const bool has_weight = context.inputs[1].defined(), has_bias = context.inputs[2].defined();
    const Tensor weight = has_weight ? dense_input(context, context.inputs[1]) : Tensor();
    const Tensor bias = has_bias ? dense_input(context, context.inputs[2]) : Tensor();
    DenseOutput y(context, context.outputs[0]);
    DenseOutput means(context, context.outputs[1]);
    DenseOutput rstds(context, context.outputs[2]);
    const int64_t rows = features == 0 ? 0 : x.numel() / features;
    ReduceLayout layout{rows, features, 1};
    ReduceLaunch launch(layout);
    if (rows > 0) {
      KernelDevice device(context);
      layer_norm_forward_kernel<T>
          <<<launch.grid, launch.block, launch.shared(sizeof(double)), device.stream()>>>(
              device_data<const T>(x), has_weight ? device_data<const T>(weight) : nullptr,
              has_bias ? device_data<const T>(bias) : nullptr, layout, launch.tiles, eps,
              y.data<T>(), means.data<T>(), rstds.data<T>());
      check_launch();
    }
    y.finish();
    means.finish();
    rstds.finish();
  });
}

void layer_norm_backward_kernel(KernelContext& context) {
  const int64_t features = features_of(context.attrs);
  visit_float_dtype(context.inputs[1].dtype(), ops::layer_norm_backward.name(), [&](auto tag) {
    using T = decltype(tag);
    const Tensor grad_y = dense_input(context, context.inputs[0]);
    const Tensor x = dense_input(context, context.inputs[1]);
    const Tensor means = dense_input(context, context.inputs[2]);
    const Tensor rstds = dense_input(context, context.inputs[3]);
    const bool has_weight = context.inputs[4].defined();
    const Tensor weight = has_weight ? dense_input(context, context.inputs[4]) : Tensor();
    DenseOutput grad_x(context, context.outputs[0]);
    const int64_t rows = features == 0 ? 0 : x.numel() / features;
    KernelDevice device(context);
    if (rows > 0) {
      ReduceLayout layout{rows, features, 1};
      ReduceLaunch launch(layout);
      layer_norm_grad_input_kernel<T>
          <<<launch.grid, launch.block, launch.shared(sizeof(DoublePair)), device.stream()>>>(
              device_data<const T>(grad_y), device_data<const T>(x), device_data<const T>(means),
              device_data<const T>(rstds), has_weight ? device_data<const T>(weight) : nullptr,
              layout, launch.tiles, grad_x.data<T>());
      check_launch();
    }
    grad_x.finish();
    if (features == 0) return;
    ReduceLayout layout{1, rows, features};
    ReduceLaunch launch(layout);
    auto column_sums = [&](auto* weight_sums, auto* bias_sums) {
      using G = std::remove_pointer_t<decltype(weight_sums)>;
      layer_norm_grad_params_kernel<T, G>
          <<<launch.grid, launch.block, launch.shared(sizeof(DoublePair)), device.stream()>>>(
              device_data<const T>(grad_y), device_data<const T>(x), device_data<const T>(means),
              device_data<const T>(rstds), layout, launch.tiles, weight_sums, bias_sums);
      check_launch();
    };
    const ChunkPass* chunk = context.chunk;
    if (!chunk) {
      DenseOutput grad_weight(context, context.outputs[1]);
      DenseOutput grad_bias(context, context.outputs[2]);
      column_sums(grad_weight.data<T>(), grad_bias.data<T>());
      grad_weight.finish();
      grad_bias.finish();
      return;
    }
    // Over chunks of the rows the column sums go on in the state (dw, then db), chunk after
    // chunk, and the last chunk writes them.
    std::vector<double>& sums = *chunk->state;
    if (sums.empty()) sums.assign(2 * features, 0.0);
    Tensor chunk_sums = context.workspace({2 * features}, DType::kFloat64);
    if (rows > 0) {
      double* weight_sums = device_data<double>(chunk_sums);
      column_sums(weight_sums, weight_sums + features);
      const std::vector<double> added = read_doubles(chunk_sums);
      for (size_t j = 0; j < sums.size(); ++j) sums[j] += added[j];
    }
    if (chunk->end != chunk->size) return;
    write_doubles(chunk_sums, sums);
    const int64_t offset = chunk_sums.storage_offset();
    copy_convert(context.outputs[1], make_view(chunk_sums, {features}, {1}, offset));
    copy_convert(context.outputs[2], make_view(chunk_sums, {features}, {1}, offset + features));
  });
}

}  // namespace

TESSEL_REGISTER_OPS(cuda_norm) {
  ops::batch_norm.set_kernel(kCuda, batch_norm_train);
  ops::batch_norm_eval.set_kernel(kCuda, batch_norm_eval);
  ops::batch_norm_backward.set_kernel(kCuda, batch_norm_backward);
  ops::layer_norm.set_kernel(kCuda, layer_norm_kernel);
  ops::layer_norm_backward.set_kernel(kCuda, layer_norm_backward_kernel);
}

}  // namespace tessel::cuda
