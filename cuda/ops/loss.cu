// CUDA kernels for the losses of ops/loss.cc: cross_entropy, nll_loss (each with its backward
// op) and mse_loss. Per-position losses accumulate in double as on CPU; loss reductions sum
// per-position values with one deterministic tree (over chunks of the rows, a memory policy's
// split, the chunks' sums add up on host).
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "cuda/index_check.h"
#include "cuda/ops/reduce.cuh"
#include "ops/loss.h"
#include "ops/registry_helpers.h"

namespace tessel::cuda {

namespace {

constexpr DeviceType kCuda = DeviceType::kCuda;

__device__ __forceinline__ double add_doubles(double a, double b) { return a + b; }

// ---- class losses ----

enum class Reduction { kNone, kMean, kSum };

Reduction reduction_of(const Attrs& attrs) {
  const std::string& reduction = attrs.get<std::string>("reduction");
  if (reduction == "none") return Reduction::kNone;
  if (reduction == "sum") return Reduction::kSum;
  return Reduction::kMean;
}

// Scores viewed as (outer, classes, inner): (C) is (1, C, 1), (N, C, d...) is (N, C, prod d).
ReduceLayout class_layout(const Shape& sizes) {
  if (sizes.size() == 1) return {1, sizes[0], 1};
  return {sizes[0], sizes[1], shape_numel(Shape(sizes.begin() + 2, sizes.end()))};
}

// Per position (n, d): log-probabilities of the row, and the smoothed loss (0 when ignored).
template <typename T>
__global__ void cross_entropy_forward_kernel(const T* logits, const int64_t* target,
                                             ReduceLayout layout, int64_t tiles,
                                             int64_t ignore_index, double smoothing, T* log_probs,
                                             double* losses) {
  ReduceThread thread(layout, tiles);
  double* shared = shared_buffer<double>();
  const int64_t classes = layout.reduce;
  double max_value = -INFINITY;
  if (thread.active)
    for (int64_t c = threadIdx.y; c < classes; c += blockDim.y)
      max_value = fmax(max_value, static_cast<double>(logits[thread.at(layout, c)]));
  max_value = combine_over_rows(max_value, shared, [](double a, double b) { return fmax(a, b); });
  double total = 0;
  if (thread.active)
    for (int64_t c = threadIdx.y; c < classes; c += blockDim.y)
      total += exp(static_cast<double>(logits[thread.at(layout, c)]) - max_value);
  total = combine_over_rows(total, shared, add_doubles);
  const double log_sum = max_value + log(total);
  double sum_log_probs = 0;
  if (thread.active)
    for (int64_t c = threadIdx.y; c < classes; c += blockDim.y) {
      const int64_t at = thread.at(layout, c);
      const double value = static_cast<double>(logits[at]) - log_sum;
      log_probs[at] = static_cast<T>(value);
      sum_log_probs += value;
    }
  sum_log_probs = combine_over_rows(sum_log_probs, shared, add_doubles);
  if (!thread.active || threadIdx.y != 0) return;
  const int64_t position = thread.output_index(layout);
  const int64_t target_class = target[position];
  // A bad target was recorded by the check (raised at the next synchronisation): never read it.
  if (target_class == ignore_index || target_class < 0 || target_class >= classes) {
    losses[position] = 0;
    return;
  }
  const double picked = static_cast<double>(logits[thread.at(layout, target_class)]) - log_sum;
  losses[position] =
      -(1 - smoothing) * picked - smoothing / static_cast<double>(classes) * sum_log_probs;
}

__global__ void count_kept_kernel(const int64_t* target, int64_t count, int64_t ignore_index,
                                  unsigned long long* kept) {
  unsigned long long local = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    local += target[i] != ignore_index;
  if (local) atomicAdd(kept, local);
}

// out = total (sum) or total / kept (mean), in T.
template <typename T>
__global__ void finish_loss_kernel(const double* total, const unsigned long long* kept, T* out) {
  double value = *total;
  if (kept) value /= static_cast<double>(*kept);
  *out = static_cast<T>(value);
}

// The number of targets that are not ignore_index, as a device u64 in a workspace.
Tensor count_kept(KernelContext& context, const Tensor& target, int64_t ignore_index) {
  KernelDevice device(target);
  Tensor kept = context.workspace({1}, DType::kInt64);
  auto* data = device_data<unsigned long long>(kept);
  TESSEL_CUDA_CHECK(cudaMemsetAsync(data, 0, sizeof(unsigned long long), device.stream()));
  const int64_t count = target.numel();
  if (count > 0) {
    count_kept_kernel<<<std::min<unsigned>(grid_for(count), 1024), kThreads, 0, device.stream()>>>(
        device_data<const int64_t>(target), count, ignore_index, data);
    check_launch();
  }
  return kept;
}

// Writes per-position losses (dense f64) as the loss output: as they are for "none", else their
// sum, over the kept count for "mean" (NaN when none is kept, as on CPU).
template <typename T>
void write_loss(KernelContext& context, const Tensor& output, const Tensor& losses,
                Reduction reduction, const Tensor& kept) {
  if (reduction == Reduction::kNone) {
    copy_convert(output, make_view(losses, output.sizes(), contiguous_strides(output.sizes()),
                                   losses.storage_offset()));
    return;
  }
  Tensor total = context.workspace({}, DType::kFloat64);
  sum_doubles(context, losses, total);
  KernelDevice device(output);
  finish_loss_kernel<T><<<1, 1, 0, device.stream()>>>(
      device_data<const double>(total),
      reduction == Reduction::kMean ? device_data<const unsigned long long>(kept) : nullptr,
      device_data<T>(output));
  check_launch();
}

// The count of a count_kept workspace, on host (waits for the stream).
uint64_t read_count(const Tensor& kept) {
  KernelDevice device(kept);
  unsigned long long count = 0;
  TESSEL_CUDA_CHECK(cudaMemcpyAsync(&count, kept.raw_data(), sizeof(count), cudaMemcpyDeviceToHost,
                                    device.stream()));
  TESSEL_CUDA_CHECK(cudaStreamSynchronize(device.stream()));
  return count;
}

// A count on the device, as count_kept gives it.
Tensor device_count(KernelContext& context, uint64_t count) {
  Tensor kept = context.workspace({1}, DType::kInt64);
  const unsigned long long value = count;
  KernelDevice device(kept);
  TESSEL_CUDA_CHECK(cudaMemcpyAsync(kept.raw_data(), &value, sizeof(value), cudaMemcpyHostToDevice,
                                    device.stream()));
  TESSEL_CUDA_CHECK(cudaStreamSynchronize(device.stream()));
  return kept;
}

// The loss output from per-position losses. Over chunks of the rows (KernelContext::chunk) a
// reduced loss's sum and kept count go on in the state from chunk to chunk, and the last chunk
// writes the loss.
template <typename T>
void finish_loss(KernelContext& context, const Tensor& losses, Reduction reduction,
                 const Tensor& target, int64_t ignore_index) {
  const Tensor kept = count_kept(context, target, ignore_index);
  const ChunkPass* chunk = context.chunk;
  if (!chunk || reduction == Reduction::kNone)
    return write_loss<T>(context, context.outputs[0], losses, reduction, kept);
  std::vector<double>& state = *chunk->state;  // sum, kept
  if (state.empty()) state.assign(2, 0.0);
  Tensor total = context.workspace({}, DType::kFloat64);
  sum_doubles(context, losses, total);
  state[0] += read_doubles(total)[0];
  state[1] += static_cast<double>(read_count(kept));
  if (chunk->end != chunk->size) return;
  write_doubles(total, {reduction == Reduction::kMean ? state[0] / state[1] : state[0]});
  copy_convert(context.outputs[0], total);
}

// On the device: a bad target is raised at the next synchronisation point.
void check_targets(KernelContext& context, IndexOp op, const Tensor& target, int64_t classes,
                   int64_t ignore_index) {
  check_indices(context, target, {op, 0, classes, ignore_index});
}

void cross_entropy_kernel(KernelContext& context) {
  const int64_t ignore_index = context.attrs.get<int64_t>("ignore_index");
  const double smoothing = context.attrs.get<double>("label_smoothing");
  const Reduction reduction = reduction_of(context.attrs);
  visit_float_dtype(context.inputs[0].dtype(), ops::cross_entropy.name(), [&](auto tag) {
    using T = decltype(tag);
    const Tensor logits = dense_input(context, context.inputs[0]);
    const Tensor target = dense_input(context, context.inputs[1]);
    const ReduceLayout layout = class_layout(logits.sizes());
    check_targets(context, IndexOp::kCrossEntropy, target, layout.reduce, ignore_index);
    DenseOutput log_probs(context, context.outputs[1]);
    Tensor losses = context.workspace({layout.outer * layout.inner}, DType::kFloat64);
    ReduceLaunch launch(layout);
    if (!launch.empty(layout)) {
      KernelDevice device(context);
      cross_entropy_forward_kernel<T>
          <<<launch.grid, launch.block, launch.shared(sizeof(double)), device.stream()>>>(
              device_data<const T>(logits), device_data<const int64_t>(target), layout,
              launch.tiles, ignore_index, smoothing, log_probs.data<T>(),
              device_data<double>(losses));
      check_launch();
    }
    log_probs.finish();
    finish_loss<T>(context, losses, reduction, target, ignore_index);
  });
}

// g * (softmax - (1 - s) * onehot(t) - s / C), zero where t is ignored; element i of the dense
// (outer, classes, inner) gradient.
template <typename T>
__global__ void cross_entropy_backward_kernel(const T* grad_loss, const T* log_probs,
                                              const int64_t* target, ReduceLayout layout,
                                              bool per_position, const unsigned long long* kept,
                                              int64_t ignore_index, double smoothing, T* grad) {
  const int64_t classes = layout.reduce, inner = layout.inner;
  const int64_t numel = layout.outer * classes * inner;
  const double uniform = smoothing / static_cast<double>(classes);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < numel;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t n = i / (classes * inner), c = (i / inner) % classes, d = i % inner;
    const int64_t position = n * inner + d;
    const int64_t target_class = target[position];
    if (target_class == ignore_index) {
      grad[i] = T(0);
      continue;
    }
    double scale = static_cast<double>(grad_loss[per_position ? position : 0]);
    if (kept) scale /= static_cast<double>(*kept);
    double value = exp(static_cast<double>(log_probs[i])) - uniform;
    if (c == target_class) value -= 1 - smoothing;
    grad[i] = static_cast<T>(scale * value);
  }
}

void cross_entropy_backward_op(KernelContext& context) {
  const int64_t ignore_index = context.attrs.get<int64_t>("ignore_index");
  const double smoothing = context.attrs.get<double>("label_smoothing");
  const Reduction reduction = reduction_of(context.attrs);
  visit_float_dtype(context.inputs[1].dtype(), ops::cross_entropy_backward.name(), [&](auto tag) {
    using T = decltype(tag);
    const Tensor grad_loss = dense_input(context, context.inputs[0]);
    const Tensor log_probs = dense_input(context, context.inputs[1]);
    const Tensor target = dense_input(context, context.inputs[2]);
    const ReduceLayout layout = class_layout(log_probs.sizes());
    Tensor kept = count_kept(context, target, ignore_index);
    // Over chunks of the rows: pass 0 counts the kept targets, pass 1 scales by the whole
    // batch's count, reading an unreduced incoming gradient from the chunk's first position.
    int64_t first_position = 0;
    if (const ChunkPass* chunk = context.chunk) {
      std::vector<double>& state = *chunk->state;  // kept targets
      if (state.empty()) state.assign(1, 0.0);
      if (!chunk->last_pass()) {
        state[0] += static_cast<double>(read_count(kept));
        return;
      }
      kept = device_count(context, static_cast<uint64_t>(state[0]));
      if (reduction == Reduction::kNone) first_position = chunk->begin * layout.inner;
    }
    DenseOutput grad(context, context.outputs[0]);
    const int64_t numel = log_probs.numel();
    if (numel > 0) {
      KernelDevice device(context);
      cross_entropy_backward_kernel<T><<<grid_for(numel), kThreads, 0, device.stream()>>>(
          device_data<const T>(grad_loss) + first_position, device_data<const T>(log_probs),
          device_data<const int64_t>(target), layout, reduction == Reduction::kNone,
          reduction == Reduction::kMean ? device_data<const unsigned long long>(kept) : nullptr,
          ignore_index, smoothing, grad.data<T>());
      check_launch();
    }
    grad.finish();
  });
}

// -log_probs[n, t, d] per position (0 where ignored).
template <typename T>
__global__ void nll_loss_forward_kernel(const T* log_probs, const int64_t* target,
                                        ReduceLayout layout, int64_t ignore_index, double* losses) {
  const int64_t positions = layout.outer * layout.inner;
  for (int64_t position = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       position < positions; position += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t target_class = target[position];
    // A bad target was recorded by the check (raised at the next synchronisation): never read it.
    if (target_class == ignore_index || target_class < 0 || target_class >= layout.reduce) {
      losses[position] = 0;
      continue;
    }
    const int64_t n = position / layout.inner, d = position % layout.inner;
    losses[position] =
        -static_cast<double>(log_probs[(n * layout.reduce + target_class) * layout.inner + d]);
  }
}

template <typename T>
__global__ void nll_loss_backward_kernel(const T* grad_loss, const int64_t* target,
                                         ReduceLayout layout, bool per_position,
                                         const unsigned long long* kept, int64_t ignore_index,
                                         T* grad) {
  const int64_t positions = layout.outer * layout.inner;
  for (int64_t position = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       position < positions; position += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t target_class = target[position];
    // Targets were checked by the forward op; never write outside the gradient.
    if (target_class == ignore_index || target_class < 0 || target_class >= layout.reduce) continue;
    double scale = static_cast<double>(grad_loss[per_position ? position : 0]);
    if (kept) scale /= static_cast<double>(*kept);
    const int64_t n = position / layout.inner, d = position % layout.inner;
    grad[(n * layout.reduce + target_class) * layout.inner + d] = static_cast<T>(-scale);
  }
}

void nll_loss_op(KernelContext& context) {
  const int64_t ignore_index = context.attrs.get<int64_t>("ignore_index");
  const Reduction reduction = reduction_of(context.attrs);
  visit_float_dtype(context.inputs[0].dtype(), ops::nll_loss.name(), [&](auto tag) {
    using T = decltype(tag);
    const Tensor log_probs = dense_input(context, context.inputs[0]);
    const Tensor target = dense_input(context, context.inputs[1]);
    const ReduceLayout layout = class_layout(log_probs.sizes());
    check_targets(context, IndexOp::kNllLoss, target, layout.reduce, ignore_index);
    const int64_t positions = layout.outer * layout.inner;
    Tensor losses = context.workspace({positions}, DType::kFloat64);
    if (positions > 0) {
      KernelDevice device(context);
      nll_loss_forward_kernel<T><<<grid_for(positions), kThreads, 0, device.stream()>>>(
          device_data<const T>(log_probs), device_data<const int64_t>(target), layout, ignore_index,
          device_data<double>(losses));
      check_launch();
    }
    finish_loss<T>(context, losses, reduction, target, ignore_index);
  });
}

void nll_loss_backward_op(KernelContext& context) {
  const int64_t ignore_index = context.attrs.get<int64_t>("ignore_index");
  const Reduction reduction = reduction_of(context.attrs);
  visit_float_dtype(context.inputs[0].dtype(), ops::nll_loss_backward.name(), [&](auto tag) {
    using T = decltype(tag);
    const Tensor grad_loss = dense_input(context, context.inputs[0]);
    const Tensor target = dense_input(context, context.inputs[1]);
    DenseOutput grad(context, context.outputs[0]);
    zero_fill(grad.dense);
    const ReduceLayout layout = class_layout(grad.dense.sizes());
    const Tensor kept = count_kept(context, target, ignore_index);
    const int64_t positions = layout.outer * layout.inner;
    if (positions > 0) {
      KernelDevice device(context);
      nll_loss_backward_kernel<T><<<grid_for(positions), kThreads, 0, device.stream()>>>(
          device_data<const T>(grad_loss), device_data<const int64_t>(target), layout,
          reduction == Reduction::kNone,
          reduction == Reduction::kMean ? device_data<const unsigned long long>(kept) : nullptr,
          ignore_index, grad.data<T>());
      check_launch();
    }
    grad.finish();
  });
}

// ---- mse_loss ----

template <typename T>
__global__ void squared_difference_kernel(const T* a, const T* b, int64_t numel, T* out,
                                          double* out_double) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < numel;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (out) {
      out[i] = (a[i] - b[i]) * (a[i] - b[i]);
    } else {
      const double difference = static_cast<double>(a[i]) - static_cast<double>(b[i]);
      out_double[i] = difference * difference;
    }
  }
}

template <typename T>
__global__ void finish_mse_kernel(const double* total, double divisor, T* out) {
  *out = static_cast<T>(*total / divisor);
}

void mse_loss_op(KernelContext& context) {
  const Reduction reduction = reduction_of(context.attrs);
  visit_float_dtype(context.inputs[0].dtype(), ops::mse_loss.name(), [&](auto tag) {
    using T = decltype(tag);
    const Tensor a = dense_input(context, context.inputs[0]);
    const Tensor b = dense_input(context, context.inputs[1]);
    const int64_t numel = a.numel();
    KernelDevice device(context);
    if (reduction == Reduction::kNone) {
      DenseOutput out(context, context.outputs[0]);
      if (numel > 0) {
        squared_difference_kernel<T><<<grid_for(numel), kThreads, 0, device.stream()>>>(
            device_data<const T>(a), device_data<const T>(b), numel, out.data<T>(), nullptr);
        check_launch();
      }
      out.finish();
      return;
    }
    Tensor squares = context.workspace({numel}, DType::kFloat64);
    if (numel > 0) {
      squared_difference_kernel<T><<<grid_for(numel), kThreads, 0, device.stream()>>>(
          device_data<const T>(a), device_data<const T>(b), numel, nullptr,
          device_data<double>(squares));
      check_launch();
    }
    Tensor total = context.workspace({}, DType::kFloat64);
    sum_doubles(context, squares, total);
    const double divisor = reduction == Reduction::kMean ? static_cast<double>(numel) : 1.0;
    finish_mse_kernel<T><<<1, 1, 0, device.stream()>>>(device_data<const double>(total), divisor,
                                                       device_data<T>(context.outputs[0]));
    check_launch();
  });
}

}  // namespace

TESSEL_REGISTER_OPS(cuda_loss) {
  ops::cross_entropy.set_kernel(kCuda, cross_entropy_kernel);
  ops::cross_entropy_backward.set_kernel(kCuda, cross_entropy_backward_op);
  ops::nll_loss.set_kernel(kCuda, nll_loss_op);
  ops::nll_loss_backward.set_kernel(kCuda, nll_loss_backward_op);
  ops::mse_loss.set_kernel(kCuda, mse_loss_op);
}

}  // namespace tessel::cuda
