// The CPU kernels of cross_entropy (log_softmax fused in), nll_loss, mse_loss and their
// gradients, with PyTorch's reductions, ignore_index and label smoothing. Per-position losses
// and sums are kept in f64.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "ops/cpu/kernels.h"
#include "ops/cpu/strided_copy.h"
#include "ops/cpu/vector_math.h"
#include "ops/ops.h"
#include "ops/registry_helpers.h"

namespace tessel::cpu {

Reduction parse_reduction(const char* op, const std::string& reduction) {
  if (reduction == "none") return Reduction::kNone;
  if (reduction == "mean") return Reduction::kMean;
  if (reduction == "sum") return Reduction::kSum;
  TESSEL_FAIL(op, ": reduction must be \"mean\", \"sum\" or \"none\", got \"", reduction, "\"");
}

Reduction reduction_of(const char* op, const Attrs& attrs) {
  return parse_reduction(op, attrs.get<std::string>("reduction"));
}

ClassLayout class_layout(const Shape& sizes) {
  if (sizes.size() == 1) return {1, sizes[0], 1};
  return {sizes[0], sizes[1], shape_numel(Shape(sizes.begin() + 2, sizes.end()))};
}

namespace {

// Throws (outside any parallel region) naming the first target that is not a class index.
void check_targets(const char* op, const int64_t* target, int64_t count, int64_t classes,
                   int64_t ignore_index) {
  for (int64_t i = 0; i < count; ++i) {
    const int64_t value = target[i];
    TESSEL_CHECK(value == ignore_index || (value >= 0 && value < classes), op, ": target ", value,
                 " (at flat index ", i, ") is out of range for ", classes, " classes; expected 0..",
                 classes - 1, " or ignore_index ", ignore_index);
  }
}

int64_t count_kept(const int64_t* target, int64_t count, int64_t ignore_index) {
  int64_t kept = 0;
  for (int64_t i = 0; i < count; ++i) kept += target[i] != ignore_index;
  return kept;
}

// Writes a reduced loss: the sum of the per-position losses, over the number of non-ignored
// targets for mean (NaN when there are none, as in PyTorch).
template <typename T>
void write_total(KernelContext& context, const Tensor& output, double total, Reduction reduction,
                 int64_t kept) {
  const Tensor dense =
      output.is_contiguous() ? output : context.workspace(output.sizes(), output.dtype());
  if (reduction == Reduction::kMean) total /= static_cast<double>(kept);
  dense.data_ptr<T>()[0] = static_cast<T>(total);
  if (!dense.is_same(output)) cpu::copy_strided(dense, output);
}

// Writes per-position losses as the (possibly reduced) loss output.
template <typename T>
void write_loss(KernelContext& context, const Tensor& output, const std::vector<double>& losses,
                Reduction reduction, int64_t kept) {
  if (reduction != Reduction::kNone) {
    double total = 0;
    for (double loss : losses) total += loss;
    return write_total<T>(context, output, total, reduction, kept);
  }
  const Tensor dense =
      output.is_contiguous() ? output : context.workspace(output.sizes(), output.dtype());
  T* data = dense.data_ptr<T>();
  for (size_t i = 0; i < losses.size(); ++i) data[i] = static_cast<T>(losses[i]);
  if (!dense.is_same(output)) cpu::copy_strided(dense, output);
}

// The loss output from one call's per-position losses. Over chunks of the batch
// (KernelContext::chunk) a reduced loss's sum and kept count go on from chunk to chunk, in the
// order of one call, and the last chunk writes it.
template <typename T>
void finish_loss(KernelContext& context, const std::vector<double>& losses, Reduction reduction,
                 int64_t kept) {
  const ChunkPass* chunk = context.chunk;
  if (!chunk || reduction == Reduction::kNone)
    return write_loss<T>(context, context.outputs[0], losses, reduction, kept);
  std::vector<double>& state = *chunk->state;  // sum, kept
  if (state.empty()) state.assign(2, 0.0);
  for (double loss : losses) state[0] += loss;
  state[1] += static_cast<double>(kept);
  if (chunk->end == chunk->size)
    write_total<T>(context, context.outputs[0], state[0], reduction,
                   static_cast<int64_t>(state[1]));
}

// The factor each position's gradient is scaled by: the incoming gradient, over the number of
// kept targets for mean.
template <typename T>
std::vector<double> position_grad_scales(const Tensor& grad_loss, Reduction reduction,
                                         int64_t positions, int64_t kept) {
  const T* grad = grad_loss.data_ptr<T>();
  if (reduction == Reduction::kNone) return std::vector<double>(grad, grad + positions);
  double scale = grad[0];
  if (reduction == Reduction::kMean) scale /= static_cast<double>(kept);
  return std::vector<double>(static_cast<size_t>(positions), scale);
}

// Each position's gradient scale for a backward over `positions` positions with `kept` kept
// targets. Over chunks of the batch the first pass only counts the kept targets (returns false:
// nothing to write), the second scales by the whole batch's count, reading an unreduced incoming
// gradient from the chunk's first position (`inner` positions per row).
template <typename T>
bool loss_grad_scales(const KernelContext& context, const Tensor& grad_loss, Reduction reduction,
                      int64_t positions, int64_t inner, int64_t kept, std::vector<double>& scales) {
  int64_t first_position = 0;
  if (const ChunkPass* chunk = context.chunk) {
    std::vector<double>& state = *chunk->state;  // kept targets
    if (state.empty()) state.assign(1, 0.0);
    if (!chunk->last_pass()) {
      state[0] += static_cast<double>(kept);
      return false;
    }
    kept = static_cast<int64_t>(state[0]);
    first_position = chunk->begin * inner;
  }
  scales = position_grad_scales<T>(grad_loss, reduction, first_position + positions, kept);
  scales.erase(scales.begin(), scales.begin() + first_position);
  return true;
}

int64_t grain_for(int64_t classes) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(classes, 1));
}

// One position of cross_entropy_kernel with f32 logits whose classes are contiguous: writes the
// log-probabilities and returns the loss (0 when ignored). Sums are kept in f64.
double cross_entropy_row_f32(const float* row, float* lp_row, int64_t C, int64_t target_class,
                             int64_t ignore_index, double smoothing) {
  float max_value = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : max_value)
  for (int64_t c = 0; c < C; ++c) max_value = max_value < row[c] ? row[c] : max_value;
  double total = 0;
#pragma omp simd reduction(+ : total)
  for (int64_t c = 0; c < C; ++c) total += exp_nonpositive_f32(row[c] - max_value);
  const double log_sum = max_value + std::log(total);
  double sum_lp = 0;
#pragma omp simd reduction(+ : sum_lp)
  for (int64_t c = 0; c < C; ++c) {
    const double value = row[c] - log_sum;
    lp_row[c] = static_cast<float>(value);
    sum_lp += value;
  }
  if (target_class == ignore_index) return 0;
  const double picked = row[target_class] - log_sum;
  return -(1 - smoothing) * picked - smoothing / static_cast<double>(C) * sum_lp;
}

}  // namespace

// inputs (logits, target); outputs (loss, log_probs). Per position with target t:
// loss = -(1 - s) * lp[t] - s / C * sum_c lp[c], s = label_smoothing; 0 where t is ignored.
void cross_entropy_kernel(KernelContext& context) {
  const int64_t ignore_index = context.attrs.get<int64_t>("ignore_index");
  const double smoothing = context.attrs.get<double>("label_smoothing");
  const Reduction reduction = reduction_of("cross_entropy", context.attrs);
  visit_float_dtype(context.inputs[0].dtype(), "cross_entropy", [&](auto tag) {
    using T = decltype(tag);
    const Tensor logits = cpu::dense_input(context, context.inputs[0]);
    const Tensor target = cpu::dense_input(context, context.inputs[1]);
    const ClassLayout layout = class_layout(logits.sizes());
    const int64_t C = layout.classes, D = layout.inner, positions = layout.positions();
    const int64_t* t = target.data_ptr<int64_t>();
    check_targets("cross_entropy", t, positions, C, ignore_index);
    const Tensor& lp_out = context.outputs[1];
    const Tensor log_probs =
        lp_out.is_contiguous() ? lp_out : context.workspace(lp_out.sizes(), lp_out.dtype());
    const T* x = logits.data_ptr<T>();
    T* lp = log_probs.data_ptr<T>();
    std::vector<double> losses(static_cast<size_t>(positions));
    parallel_for(0, positions, grain_for(C), [&](int64_t begin, int64_t end) {
      for (int64_t position = begin; position < end; ++position) {
        const int64_t n = position / D, d = position % D;
        const T* row = x + n * C * D + d;
        T* lp_row = lp + n * C * D + d;
        if constexpr (std::is_same_v<T, float>) {
          if (D == 1) {  // contiguous classes: vectorised loops
            losses[position] =
                cross_entropy_row_f32(row, lp_row, C, t[position], ignore_index, smoothing);
            continue;
          }
        }
        double max_value = -std::numeric_limits<double>::infinity();
        for (int64_t c = 0; c < C; ++c) max_value = std::max<double>(max_value, row[c * D]);
        double total = 0;
        for (int64_t c = 0; c < C; ++c) total += std::exp(row[c * D] - max_value);
        const double log_sum = max_value + std::log(total);
        double sum_lp = 0;
        for (int64_t c = 0; c < C; ++c) {
          const double value = row[c * D] - log_sum;
          lp_row[c * D] = static_cast<T>(value);
          sum_lp += value;
        }
        const int64_t target_class = t[position];
        if (target_class == ignore_index) {
          losses[position] = 0;
          continue;
        }
        const double picked = row[target_class * D] - log_sum;
        losses[position] = -(1 - smoothing) * picked - smoothing / static_cast<double>(C) * sum_lp;
      }
    });
    if (!log_probs.is_same(lp_out)) cpu::copy_strided(log_probs, lp_out);
    finish_loss<T>(context, losses, reduction, count_kept(t, positions, ignore_index));
  });
}

// inputs (grad_loss, log_probs, target); output grad_logits:
// g * (softmax - (1 - s) * onehot(t) - s / C), zero where t is ignored.
void cross_entropy_backward_kernel(KernelContext& context) {
  const int64_t ignore_index = context.attrs.get<int64_t>("ignore_index");
  const double smoothing = context.attrs.get<double>("label_smoothing");
  const Reduction reduction = reduction_of("cross_entropy_backward", context.attrs);
  visit_float_dtype(context.inputs[1].dtype(), "cross_entropy_backward", [&](auto tag) {
    using T = decltype(tag);
    const Tensor grad_loss = cpu::dense_input(context, context.inputs[0]);
    const Tensor log_probs = cpu::dense_input(context, context.inputs[1]);
    const Tensor target = cpu::dense_input(context, context.inputs[2]);
    const ClassLayout layout = class_layout(log_probs.sizes());
    const int64_t C = layout.classes, D = layout.inner, positions = layout.positions();
    const int64_t* t = target.data_ptr<int64_t>();
    std::vector<double> scales;
    if (!loss_grad_scales<T>(context, grad_loss, reduction, positions, D,
                             count_kept(t, positions, ignore_index), scales))
      return;
    const Tensor& out = context.outputs[0];
    const Tensor dense = out.is_contiguous() ? out : context.workspace(out.sizes(), out.dtype());
    const T* lp = log_probs.data_ptr<T>();
    T* grad = dense.data_ptr<T>();
    const double uniform = smoothing / static_cast<double>(C);
    parallel_for(0, positions, grain_for(C), [&](int64_t begin, int64_t end) {
      for (int64_t position = begin; position < end; ++position) {
        const int64_t n = position / D, d = position % D;
        const T* lp_row = lp + n * C * D + d;
        T* grad_row = grad + n * C * D + d;
        const int64_t target_class = t[position];
        if (target_class == ignore_index) {
          for (int64_t c = 0; c < C; ++c) grad_row[c * D] = T(0);
          continue;
        }
        const double scale = scales[position];
        if constexpr (std::is_same_v<T, float>) {
          if (D == 1) {  // contiguous classes: one vectorised pass, then the target's entry
            const float scale_f = static_cast<float>(scale);
            const float uniform_f = static_cast<float>(uniform);
#pragma omp simd
            for (int64_t c = 0; c < C; ++c)
              grad_row[c] = scale_f * (exp_nonpositive_f32(lp_row[c]) - uniform_f);
            grad_row[target_class] =
                static_cast<T>(scale * (std::exp(static_cast<double>(lp_row[target_class])) -
                                        uniform - (1 - smoothing)));
            continue;
          }
        }
        for (int64_t c = 0; c < C; ++c) {
          double value = std::exp(static_cast<double>(lp_row[c * D])) - uniform;
          if (c == target_class) value -= 1 - smoothing;
          grad_row[c * D] = static_cast<T>(scale * value);
        }
      }
    });
    if (!dense.is_same(out)) cpu::copy_strided(dense, out);
  });
}

// inputs (log_probs, target); output loss: -log_probs[t] per position, 0 where ignored.
void nll_loss_kernel(KernelContext& context) {
  const int64_t ignore_index = context.attrs.get<int64_t>("ignore_index");
  const Reduction reduction = reduction_of("nll_loss", context.attrs);
  visit_float_dtype(context.inputs[0].dtype(), "nll_loss", [&](auto tag) {
    using T = decltype(tag);
    const Tensor& log_probs = context.inputs[0];
    const Tensor target = cpu::dense_input(context, context.inputs[1]);
    const ClassLayout layout = class_layout(log_probs.sizes());
    const int64_t D = layout.inner, positions = layout.positions();
    const int64_t* t = target.data_ptr<int64_t>();
    check_targets("nll_loss", t, positions, layout.classes, ignore_index);
    // Reads one element per position, so the strides are used directly.
    const T* lp = log_probs.data_ptr<T>();
    const bool one_dim = log_probs.dim() == 1;
    const int64_t stride_n = one_dim ? 0 : log_probs.stride(0);
    const int64_t stride_c = log_probs.stride(one_dim ? 0 : 1);
    const Shape inner_sizes =
        one_dim ? Shape{} : Shape(log_probs.sizes().begin() + 2, log_probs.sizes().end());
    const Shape inner_strides =
        one_dim ? Shape{} : Shape(log_probs.strides().begin() + 2, log_probs.strides().end());
    std::vector<double> losses(static_cast<size_t>(positions));
    for (int64_t position = 0; position < positions; ++position) {
      const int64_t target_class = t[position];
      if (target_class == ignore_index) {
        losses[position] = 0;
        continue;
      }
      int64_t offset = (position / D) * stride_n + target_class * stride_c;
      int64_t rest = position % D;
      for (int64_t k = static_cast<int64_t>(inner_sizes.size()) - 1; k >= 0; --k) {
        offset += (rest % inner_sizes[k]) * inner_strides[k];
        rest /= inner_sizes[k];
      }
      losses[position] = -static_cast<double>(lp[offset]);
    }
    finish_loss<T>(context, losses, reduction, count_kept(t, positions, ignore_index));
  });
}

// inputs (grad_loss, target), attr input_shape; output grad_log_probs: -g at each target.
void nll_loss_backward_kernel(KernelContext& context) {
  const int64_t ignore_index = context.attrs.get<int64_t>("ignore_index");
  const Reduction reduction = reduction_of("nll_loss_backward", context.attrs);
  visit_float_dtype(context.inputs[0].dtype(), "nll_loss_backward", [&](auto tag) {
    using T = decltype(tag);
    const Tensor grad_loss = cpu::dense_input(context, context.inputs[0]);
    const Tensor target = cpu::dense_input(context, context.inputs[1]);
    const Tensor& out = context.outputs[0];
    const ClassLayout layout = class_layout(out.sizes());
    const int64_t C = layout.classes, D = layout.inner, positions = layout.positions();
    const int64_t* t = target.data_ptr<int64_t>();
    std::vector<double> scales;
    if (!loss_grad_scales<T>(context, grad_loss, reduction, positions, D,
                             count_kept(t, positions, ignore_index), scales))
      return;
    const Tensor dense = out.is_contiguous() ? out : context.workspace(out.sizes(), out.dtype());
    T* grad = dense.data_ptr<T>();
    std::fill(grad, grad + out.numel(), T(0));
    for (int64_t position = 0; position < positions; ++position) {
      const int64_t target_class = t[position];
      if (target_class == ignore_index) continue;
      const int64_t n = position / D, d = position % D;
      grad[(n * C + target_class) * D + d] = static_cast<T>(-scales[position]);
    }
    if (!dense.is_same(out)) cpu::copy_strided(dense, out);
  });
}

// inputs (input, target); output: (input - target)^2, reduced. Partial sums over fixed blocks
// keep the result independent of the thread count.
void mse_loss_kernel(KernelContext& context) {
  const Reduction reduction = reduction_of("mse_loss", context.attrs);
  visit_float_dtype(context.inputs[0].dtype(), "mse_loss", [&](auto tag) {
    using T = decltype(tag);
    const Tensor input = cpu::dense_input(context, context.inputs[0]);
    const Tensor target = cpu::dense_input(context, context.inputs[1]);
    const T* a = input.data_ptr<T>();
    const T* b = target.data_ptr<T>();
    const int64_t numel = input.numel();
    const Tensor& out = context.outputs[0];
    if (reduction == Reduction::kNone) {
      const Tensor dense = out.is_contiguous() ? out : context.workspace(out.sizes(), out.dtype());
      T* data = dense.data_ptr<T>();
      parallel_for(0, numel, 16384, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) data[i] = (a[i] - b[i]) * (a[i] - b[i]);
      });
      if (!dense.is_same(out)) cpu::copy_strided(dense, out);
      return;
    }
    constexpr int64_t kBlock = 8192;
    const int64_t blocks = (numel + kBlock - 1) / kBlock;
    std::vector<double> partial(static_cast<size_t>(blocks), 0.0);
    parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t block = begin; block < end; ++block) {
        double total = 0;
        const int64_t stop = std::min(numel, (block + 1) * kBlock);
        for (int64_t i = block * kBlock; i < stop; ++i) {
          const double difference = static_cast<double>(a[i]) - static_cast<double>(b[i]);
          total += difference * difference;
        }
        partial[block] = total;
      }
    });
    double total = 0;
    for (double value : partial) total += value;
    if (reduction == Reduction::kMean) total /= static_cast<double>(numel);
    out.data_ptr<T>()[0] = static_cast<T>(total);
  });
}

}  // namespace tessel::cpu
