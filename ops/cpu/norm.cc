// The CPU kernels of batch_norm (training and eval), layer_norm and their backward ops. Each
// normalises one channel (or row) per pass over dense data, statistics summed in f64.
#include <algorithm>
#include <cmath>
#include <memory>
#include <type_traits>
#include <vector>

#include "ops/cpu/kernels.h"
#include "ops/cpu/strided_copy.h"
#include "ops/math/channel_layout.h"
#include "ops/ops.h"
#include "ops/registry_helpers.h"

namespace tessel::cpu {

namespace {

// Where a kernel writes one output densely: the output itself when contiguous, otherwise
// scratch that finish() copies back into the strided output.
class DenseOutput {
 public:
  DenseOutput(KernelContext& context, const Tensor& output)
      : output_(output),
        dense_(output.is_contiguous() ? output
                                      : context.workspace(output.sizes(), output.dtype())) {}
  template <typename T>
  T* data() const {
    return dense_.data_ptr<T>();
  }
  void finish() const {
    if (!dense_.is_same(output_)) cpu::copy_strided(dense_, output_);
  }

 private:
  Tensor output_;
  Tensor dense_;
};

// Reads a 1-D (possibly strided) parameter as doubles; `fallback` when it is undefined.
template <typename T>
std::vector<double> read_vector(const Tensor& tensor, int64_t count, double fallback) {
  std::vector<double> values(static_cast<size_t>(count), fallback);
  if (!tensor.defined()) return values;
  const T* data = tensor.data_ptr<T>();
  const int64_t stride = tensor.stride(0);
  for (int64_t i = 0; i < count; ++i) values[i] = static_cast<double>(data[i * stride]);
  return values;
}

// x viewed as (rows, features): features is the product of normalized_shape.
struct RowLayout {
  int64_t rows, features;
};

RowLayout row_layout(const Shape& sizes, size_t normalized_dims) {
  int64_t features = 1;
  for (size_t d = sizes.size() - normalized_dims; d < sizes.size(); ++d) features *= sizes[d];
  int64_t rows = 1;
  for (size_t d = 0; d < sizes.size() - normalized_dims; ++d) rows *= sizes[d];
  return {rows, features};
}

// Writes per-row statistics into a (possibly strided) (rows..., 1, ...) output.
template <typename T>
void write_rows(KernelContext& context, const Tensor& output, const std::vector<double>& values) {
  DenseOutput dense(context, output);
  T* data = dense.data<T>();
  for (size_t i = 0; i < values.size(); ++i) data[i] = static_cast<T>(values[i]);
  dense.finish();
}

}  // namespace

namespace {

// The per-channel loops of batch_norm and its backward over the planes of `planes` entries of
// the batch, shared by the whole op and its runs over chunks (KernelContext::chunk): each sum goes
// on from `total`, plane after plane, so chunks of the batch give the whole op's sums bit for bit.
template <typename T>
double add_channel_sum(const T* x, int64_t planes, int64_t C, int64_t S, int64_t c, double total) {
  for (int64_t n = 0; n < planes; ++n) {
    const T* plane = x + (n * C + c) * S;
    // The reductions are vectorised (omp simd reduction: lanes summed at the end); a plain loop
    // of double additions waits on each one and dominated this kernel.
#pragma omp simd reduction(+ : total)
    for (int64_t s = 0; s < S; ++s) total += plane[s];
  }
  return total;
}

template <typename T>
double add_centred_squares(const T* x, int64_t planes, int64_t C, int64_t S, int64_t c, double mean,
                           double squares) {
  for (int64_t n = 0; n < planes; ++n) {
    const T* plane = x + (n * C + c) * S;
#pragma omp simd reduction(+ : squares)
    for (int64_t s = 0; s < S; ++s) {
      const double centred = plane[s] - mean;
      squares += centred * centred;
    }
  }
  return squares;
}

template <typename T>
void scale_and_shift(const T* x, T* y, int64_t planes, int64_t C, int64_t S, int64_t c,
                     double scale, double shift) {
  for (int64_t n = 0; n < planes; ++n) {
    const T* in_plane = x + (n * C + c) * S;
    T* out_plane = y + (n * C + c) * S;
#pragma omp simd
    for (int64_t s = 0; s < S; ++s) out_plane[s] = static_cast<T>(in_plane[s] * scale + shift);
  }
}

// Adds a channel's sum of g and of g * (x - mean).
template <typename T>
void add_gradient_sums(const T* g_data, const T* x_data, int64_t planes, int64_t C, int64_t S,
                       int64_t c, double mean, double& sum_g_out, double& sum_g_centred_out) {
  double sum_g = sum_g_out, sum_g_centred = sum_g_centred_out;
  for (int64_t n = 0; n < planes; ++n) {
    const T* g = g_data + (n * C + c) * S;
    const T* in = x_data + (n * C + c) * S;
#pragma omp simd reduction(+ : sum_g, sum_g_centred)
    for (int64_t s = 0; s < S; ++s) {
      sum_g += g[s];
      sum_g_centred += g[s] * (in[s] - mean);
    }
  }
  sum_g_out = sum_g;
  sum_g_centred_out = sum_g_centred;
}

template <typename T>
void write_input_gradient(const T* g_data, const T* x_data, T* dx_data, int64_t planes, int64_t C,
                          int64_t S, int64_t c, double mean, double gain, double mean_g,
                          double slope) {
  for (int64_t n = 0; n < planes; ++n) {
    const T* g = g_data + (n * C + c) * S;
    const T* in = x_data + (n * C + c) * S;
    T* out = dx_data + (n * C + c) * S;
#pragma omp simd
    for (int64_t s = 0; s < S; ++s)
      out[s] = static_cast<T>(gain * (g[s] - mean_g) - slope * (in[s] - mean));
  }
}

template <typename T>
void write_channel_values(const Tensor& output, const std::vector<double>& values) {
  T* data = output.data_ptr<T>();
  const int64_t stride = output.stride(0);
  for (size_t c = 0; c < values.size(); ++c) data[c * stride] = static_cast<T>(values[c]);
}

// The batch statistics written out, and the running ones moved (not on a recompute).
template <typename T>
void finish_batch_norm(KernelContext& context, const std::vector<double>& means,
                       const std::vector<double>& variances, int64_t count) {
  const double momentum = context.attrs.get<double>("momentum");
  const double eps = context.attrs.get<double>("eps");
  const size_t C = means.size();
  std::vector<double> invstd(C);
  for (size_t c = 0; c < C; ++c) invstd[c] = 1.0 / std::sqrt(variances[c] + eps);
  write_channel_values<T>(context.outputs[1], means);
  write_channel_values<T>(context.outputs[2], invstd);
  // A recompute must not move the running statistics a second time.
  if (context.replay) return;
  const Tensor& running_mean = context.inputs[3];
  const Tensor& running_var = context.inputs[4];
  const double unbiased = static_cast<double>(count) / static_cast<double>(count - 1);
  if (running_mean.defined()) {
    T* data = running_mean.data_ptr<T>();
    const int64_t stride = running_mean.stride(0);
    for (size_t c = 0; c < C; ++c)
      data[c * stride] = static_cast<T>((1 - momentum) * data[c * stride] + momentum * means[c]);
  }
  if (running_var.defined()) {
    T* data = running_var.data_ptr<T>();
    const int64_t stride = running_var.stride(0);
    for (size_t c = 0; c < C; ++c)
      data[c * stride] =
          static_cast<T>((1 - momentum) * data[c * stride] + momentum * variances[c] * unbiased);
  }
}

// batch_norm over chunks of the batch: pass 0 sums each channel, pass 1 its centred squares,
// pass 2 writes the chunk's y; the last chunk writes the statistics.
template <typename T>
void batch_norm_train_chunk(KernelContext& context) {
  const ChunkPass& chunk = *context.chunk;
  const double eps = context.attrs.get<double>("eps");
  const Tensor x = cpu::dense_input(context, context.inputs[0]);
  const ChannelLayout layout(x.sizes());
  const int64_t C = layout.channels, S = layout.spatial, N = layout.batch;
  const int64_t count = chunk.size * S;
  std::vector<double>& state = *chunk.state;  // sums, then centred squares, per channel
  if (state.empty()) state.assign(2 * C, 0.0);
  const T* x_data = x.data_ptr<T>();
  if (chunk.pass == 0) {
    parallel_for(0, C, 1, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c)
        state[c] = add_channel_sum(x_data, N, C, S, c, state[c]);
    });
    return;
  }
  auto mean_of = [&](int64_t c) { return state[c] / static_cast<double>(count); };
  if (chunk.pass == 1) {
    parallel_for(0, C, 1, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c)
        state[C + c] = add_centred_squares(x_data, N, C, S, c, mean_of(c), state[C + c]);
    });
    return;
  }
  const std::vector<double> weight = read_vector<T>(context.inputs[1], C, 1.0);
  const std::vector<double> bias = read_vector<T>(context.inputs[2], C, 0.0);
  DenseOutput y(context, context.outputs[0]);
  T* y_data = y.data<T>();
  parallel_for(0, C, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const double variance = state[C + c] / static_cast<double>(count);
      const double scale = weight[c] * (1.0 / std::sqrt(variance + eps));
      scale_and_shift(x_data, y_data, N, C, S, c, scale, bias[c] - mean_of(c) * scale);
    }
  });
  y.finish();
  if (chunk.end != chunk.size) return;
  std::vector<double> means(C), variances(C);
  for (int64_t c = 0; c < C; ++c) {
    means[c] = mean_of(c);
    variances[c] = state[C + c] / static_cast<double>(count);
  }
  finish_batch_norm<T>(context, means, variances, count);
}

}  // namespace

// Training: batch statistics (biased variance) normalise; running statistics get the unbiased
// variance. inputs (x, weight, bias, running_mean, running_var); outputs (y, mean, invstd).
void batch_norm_train_kernel(KernelContext& context) {
  const double eps = context.attrs.get<double>("eps");
  visit_float_dtype(context.inputs[0].dtype(), "batch_norm", [&](auto tag) {
    using T = decltype(tag);
    if (context.chunk) return batch_norm_train_chunk<T>(context);
    const Tensor x = cpu::dense_input(context, context.inputs[0]);
    const ChannelLayout layout(x.sizes());
    const int64_t C = layout.channels, S = layout.spatial, N = layout.batch;
    const int64_t count = layout.per_channel();
    const std::vector<double> weight = read_vector<T>(context.inputs[1], C, 1.0);
    const std::vector<double> bias = read_vector<T>(context.inputs[2], C, 0.0);
    DenseOutput y(context, context.outputs[0]);
    std::vector<double> means(C), variances(C);
    const T* x_data = x.data_ptr<T>();
    T* y_data = y.data<T>();
    parallel_for(0, C, 1, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        const double mean = add_channel_sum(x_data, N, C, S, c, 0.0) / static_cast<double>(count);
        const double variance =
            add_centred_squares(x_data, N, C, S, c, mean, 0.0) / static_cast<double>(count);
        means[c] = mean;
        variances[c] = variance;
        const double scale = weight[c] * (1.0 / std::sqrt(variance + eps));
        scale_and_shift(x_data, y_data, N, C, S, c, scale, bias[c] - mean * scale);
      }
    });
    y.finish();
    finish_batch_norm<T>(context, means, variances, count);
  });
}

// Eval: y = (x - running_mean) / sqrt(running_var + eps) * weight + bias, plane by plane; with
// attr relu, then max(y, 0) in the same pass (the bits of relu's kernel on y).
void batch_norm_eval_kernel(KernelContext& context) {
  const double eps = context.attrs.get<double>("eps");
  const bool relu = context.attrs.get_or<bool>("relu", false);
  visit_float_dtype(context.inputs[0].dtype(), "batch_norm", [&](auto tag) {
    using T = decltype(tag);
    const Tensor x = cpu::dense_input(context, context.inputs[0]);
    const ChannelLayout layout(x.sizes());
    const int64_t C = layout.channels, S = layout.spatial;
    const std::vector<double> weight = read_vector<T>(context.inputs[1], C, 1.0);
    const std::vector<double> bias = read_vector<T>(context.inputs[2], C, 0.0);
    const std::vector<double> mean = read_vector<T>(context.inputs[3], C, 0.0);
    const std::vector<double> variance = read_vector<T>(context.inputs[4], C, 1.0);
    std::vector<double> scale(C), shift(C);
    for (int64_t c = 0; c < C; ++c) {
      scale[c] = weight[c] / std::sqrt(variance[c] + eps);
      shift[c] = bias[c] - mean[c] * scale[c];
    }
    DenseOutput y(context, context.outputs[0]);
    const T* x_data = x.data_ptr<T>();
    T* y_data = y.data<T>();
    const int64_t planes = layout.batch * C;
    auto normalize = [&](auto then_relu) {
      parallel_for(0, planes, std::max<int64_t>(1, 32768 / std::max<int64_t>(S, 1)),
                   [&](int64_t begin, int64_t end) {
                     for (int64_t plane = begin; plane < end; ++plane) {
                       const int64_t c = plane % C;
                       const T* in = x_data + plane * S;
                       T* out = y_data + plane * S;
#pragma omp simd
                       for (int64_t s = 0; s < S; ++s) {
                         const T value = static_cast<T>(in[s] * scale[c] + shift[c]);
                         if constexpr (decltype(then_relu)::value) {
                           out[s] = value < T(0) ? T(0) : value;
                         } else {
                           out[s] = value;
                         }
                       }
                     }
                   });
    };
    if (relu) {
      normalize(std::true_type{});
    } else {
      normalize(std::false_type{});
    }
    y.finish();
  });
}

// inputs (grad_y, x, weight, mean, invstd), attr training. In eval mode (training=false) input 4
// is the running variance and attr eps applies. outputs (grad_x, grad_weight, grad_bias).
// Over chunks of the batch (KernelContext::chunk): pass 0 sums each channel's g and g * (x - mean),
// pass 1 writes the chunk's grad_x, and the last chunk the per-channel gradients.
void batch_norm_backward_kernel(KernelContext& context) {
  const bool training = context.attrs.get<bool>("training");
  visit_float_dtype(context.inputs[1].dtype(), "batch_norm_backward", [&](auto tag) {
    using T = decltype(tag);
    const ChunkPass* chunk = context.chunk;
    const Tensor grad_y = cpu::dense_input(context, context.inputs[0]);
    const Tensor x = cpu::dense_input(context, context.inputs[1]);
    const ChannelLayout layout(x.sizes());
    const int64_t C = layout.channels, S = layout.spatial, N = layout.batch;
    const double count = static_cast<double>(chunk ? chunk->size * S : layout.per_channel());
    const std::vector<double> weight = read_vector<T>(context.inputs[2], C, 1.0);
    const std::vector<double> mean = read_vector<T>(context.inputs[3], C, 0.0);
    std::vector<double> invstd = read_vector<T>(context.inputs[4], C, 1.0);
    if (!training) {
      const double eps = context.attrs.get<double>("eps");
      for (double& value : invstd) value = 1.0 / std::sqrt(value + eps);
    }
    const T* g_data = grad_y.data_ptr<T>();
    const T* x_data = x.data_ptr<T>();
    std::vector<double> own_sums;
    std::vector<double>& sums = chunk ? *chunk->state : own_sums;  // sum_g, then sum_g_centred
    if (sums.empty()) sums.assign(2 * C, 0.0);
    const bool sum = !chunk || chunk->pass == 0, write = !chunk || chunk->last_pass();
    std::unique_ptr<DenseOutput> grad_x;
    if (write) grad_x = std::make_unique<DenseOutput>(context, context.outputs[0]);
    T* dx_data = write ? grad_x->data<T>() : nullptr;
    parallel_for(0, C, 1, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        if (sum) add_gradient_sums(g_data, x_data, N, C, S, c, mean[c], sums[c], sums[C + c]);
        if (!write) continue;
        // Training: dx = w*invstd * (g - mean(g) - xhat * mean(g * xhat)); eval: w*invstd*g.
        const double gain = weight[c] * invstd[c];
        const double mean_g = training ? sums[c] / count : 0.0;
        const double slope =
            training ? weight[c] * invstd[c] * invstd[c] * invstd[c] * sums[C + c] / count : 0.0;
        write_input_gradient(g_data, x_data, dx_data, N, C, S, c, mean[c], gain, mean_g, slope);
      }
    });
    if (!write) return;
    grad_x->finish();
    if (chunk && chunk->end != chunk->size) return;
    std::vector<double> grad_weight(C), grad_bias(C);
    for (int64_t c = 0; c < C; ++c) {
      grad_bias[c] = sums[c];
      grad_weight[c] = sums[C + c] * invstd[c];
    }
    write_channel_values<T>(context.outputs[1], grad_weight);
    write_channel_values<T>(context.outputs[2], grad_bias);
  });
}

// inputs (x, weight, bias); outputs (y, mean, rstd), mean and rstd shaped (leading..., 1, ...).
void layer_norm_kernel(KernelContext& context) {
  const double eps = context.attrs.get<double>("eps");
  const auto& normalized = context.attrs.get<std::vector<int64_t>>("normalized_shape");
  visit_float_dtype(context.inputs[0].dtype(), "layer_norm", [&](auto tag) {
    using T = decltype(tag);
    const Tensor x = cpu::dense_input(context, context.inputs[0]);
    const RowLayout layout = row_layout(x.sizes(), normalized.size());
    const int64_t K = layout.features;
    const bool has_weight = context.inputs[1].defined(), has_bias = context.inputs[2].defined();
    const Tensor weight = has_weight ? cpu::dense_input(context, context.inputs[1]) : Tensor();
    const Tensor bias = has_bias ? cpu::dense_input(context, context.inputs[2]) : Tensor();
    const T* w = has_weight ? weight.data_ptr<T>() : nullptr;
    const T* b = has_bias ? bias.data_ptr<T>() : nullptr;
    DenseOutput y(context, context.outputs[0]);
    const T* x_data = x.data_ptr<T>();
    T* y_data = y.data<T>();
    std::vector<double> means(layout.rows), rstds(layout.rows);
    parallel_for(0, layout.rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(K, 1)),
                 [&](int64_t begin, int64_t end) {
                   for (int64_t row = begin; row < end; ++row) {
                     const T* in = x_data + row * K;
                     T* out = y_data + row * K;
                     double total = 0;
#pragma omp simd reduction(+ : total)
                     for (int64_t j = 0; j < K; ++j) total += in[j];
                     const double mean = total / static_cast<double>(K);
                     double squares = 0;
#pragma omp simd reduction(+ : squares)
                     for (int64_t j = 0; j < K; ++j) squares += (in[j] - mean) * (in[j] - mean);
                     const double rstd = 1.0 / std::sqrt(squares / static_cast<double>(K) + eps);
                     means[row] = mean;
                     rstds[row] = rstd;
#pragma omp simd
                     for (int64_t j = 0; j < K; ++j) {
                       double value = (in[j] - mean) * rstd;
                       if (w) value *= w[j];
                       if (b) value += b[j];
                       out[j] = static_cast<T>(value);
                     }
                   }
                 });
    y.finish();
    write_rows<T>(context, context.outputs[1], means);
    write_rows<T>(context, context.outputs[2], rstds);
  });
}

// inputs (grad_y, x, mean, rstd, weight); outputs (grad_x, grad_weight, grad_bias), the last two
// shaped like normalized_shape.
void layer_norm_backward_kernel(KernelContext& context) {
  const auto& normalized = context.attrs.get<std::vector<int64_t>>("normalized_shape");
  visit_float_dtype(context.inputs[1].dtype(), "layer_norm_backward", [&](auto tag) {
    using T = decltype(tag);
    const Tensor grad_y = cpu::dense_input(context, context.inputs[0]);
    const Tensor x = cpu::dense_input(context, context.inputs[1]);
    const Tensor mean = cpu::dense_input(context, context.inputs[2]);
    const Tensor rstd = cpu::dense_input(context, context.inputs[3]);
    const bool has_weight = context.inputs[4].defined();
    const Tensor weight = has_weight ? cpu::dense_input(context, context.inputs[4]) : Tensor();
    const RowLayout layout = row_layout(x.sizes(), normalized.size());
    const int64_t K = layout.features, rows = layout.rows;
    const T* g_data = grad_y.data_ptr<T>();
    const T* x_data = x.data_ptr<T>();
    const T* mean_data = mean.data_ptr<T>();
    const T* rstd_data = rstd.data_ptr<T>();
    const T* w = has_weight ? weight.data_ptr<T>() : nullptr;
    DenseOutput grad_x(context, context.outputs[0]);
    T* dx_data = grad_x.data<T>();
    // dx = rstd * (wg - mean(wg) - xhat * mean(wg * xhat)), wg = g * weight.
    parallel_for(0, rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(K, 1)),
                 [&](int64_t begin, int64_t end) {
                   for (int64_t row = begin; row < end; ++row) {
                     const T* g = g_data + row * K;
                     const T* in = x_data + row * K;
                     T* out = dx_data + row * K;
                     const double mu = mean_data[row], r = rstd_data[row];
                     double sum_wg = 0, sum_wg_xhat = 0;
#pragma omp simd reduction(+ : sum_wg, sum_wg_xhat)
                     for (int64_t j = 0; j < K; ++j) {
                       const double wg = w ? g[j] * static_cast<double>(w[j]) : g[j];
                       sum_wg += wg;
                       sum_wg_xhat += wg * (in[j] - mu) * r;
                     }
                     const double mean_wg = sum_wg / static_cast<double>(K);
                     const double mean_wg_xhat = sum_wg_xhat / static_cast<double>(K);
#pragma omp simd
                     for (int64_t j = 0; j < K; ++j) {
                       const double wg = w ? g[j] * static_cast<double>(w[j]) : g[j];
                       const double xhat = (in[j] - mu) * r;
                       out[j] = static_cast<T>(r * (wg - mean_wg - xhat * mean_wg_xhat));
                     }
                   }
                 });
    grad_x.finish();
    // Column sums over rows, split across columns so every thread owns its outputs. Over chunks
    // of the rows (KernelContext::chunk) the sums go on from chunk to chunk, row after row as in
    // one call, and the last chunk writes them.
    std::vector<double> own_sums;
    std::vector<double>& sums = context.chunk ? *context.chunk->state : own_sums;  // dw, then db
    if (sums.empty()) sums.assign(2 * K, 0.0);
    parallel_for(0, K, 64, [&](int64_t begin, int64_t end) {
      for (int64_t row = 0; row < rows; ++row) {
        const T* g = g_data + row * K;
        const T* in = x_data + row * K;
        const double mu = mean_data[row], r = rstd_data[row];
        for (int64_t j = begin; j < end; ++j) {
          sums[j] += g[j] * (in[j] - mu) * r;
          sums[K + j] += g[j];
        }
      }
    });
    if (context.chunk && context.chunk->end != context.chunk->size) return;
    DenseOutput grad_weight(context, context.outputs[1]);
    DenseOutput grad_bias(context, context.outputs[2]);
    T* dw_data = grad_weight.data<T>();
    T* db_data = grad_bias.data<T>();
    for (int64_t j = 0; j < K; ++j) {
      dw_data[j] = static_cast<T>(sums[j]);
      db_data[j] = static_cast<T>(sums[K + j]);
    }
    grad_weight.finish();
    grad_bias.finish();
  });
}

}  // namespace tessel::cpu
