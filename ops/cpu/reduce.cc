// The CPU kernels of the reductions (sum, mean, max, min, argmax, var) and softmax /
// log_softmax. Every kernel reads its input as a row-major [outer, reduce, inner] block: the
// reduced dims, when adjacent, are the middle; otherwise a permuted copy puts them last. f32
// data is summed in double so long sums stay accurate; partial sums combine in a fixed order
// (deterministic for any thread count).
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>

#include "ops/cpu/kernels.h"
#include "ops/cpu/loops.h"
#include "ops/math/dtype_visit.h"
#include "ops/math/reduce_layout.h"
#include "ops/ops.h"
#include "ops/registry_helpers.h"

namespace tessel::cpu {

namespace {

constexpr int64_t kTile = 256;              // inner elements reduced together
constexpr int64_t kSumBlock = 16384;        // elements per partial sum of one long row
constexpr int64_t kReductionGrain = 32768;  // elements of work per parallel task

// `x` as a row-major [outer, reduce, inner] block (ops/math/reduce_layout.h): x itself (or a
// contiguous copy) when the reduced dims are adjacent, else a permuted copy.
Tensor reduction_block(KernelContext& context, const Tensor& x, const std::vector<bool>& reduced,
                       ReduceLayout* layout) {
  Tensor input = cpu::contiguous_input(context, x);
  const ReductionPlan plan = plan_reduction(input.sizes(), input.strides(), reduced);
  *layout = plan.layout;
  if (!plan.permuted) return input;
  Tensor permuted = make_view(input, plan.sizes, plan.strides, input.storage_offset());
  Tensor copy = context.workspace(plan.sizes, x.dtype());
  cpu::copy_convert(copy, permuted);
  return copy;
}

// A row-major buffer for one output: the output itself when contiguous, else a workspace
// that finish() copies back.
struct DenseOutput {
  Tensor target, dense;
  DenseOutput(KernelContext& context, int index) : target(context.outputs[index]) {
    dense = target.is_contiguous() ? target : context.workspace(target.sizes(), target.dtype());
  }
  template <typename T>
  T* data() const {
    return dense.data_ptr<T>();
  }
  void finish() const {
    if (!dense.is_same(target)) cpu::copy_convert(target, dense);
  }
};

// Calls fn(outer_index, inner_begin, inner_count) for every tile of the block, in parallel.
template <typename Fn>
void for_each_tile(const ReduceLayout& layout, Fn&& fn) {
  int64_t tiles = (layout.inner + kTile - 1) / kTile;
  int64_t tasks = layout.outer * tiles;
  int64_t work = std::max<int64_t>(1, layout.reduce * std::min(layout.inner, kTile));
  parallel_for(0, tasks, std::max<int64_t>(1, kReductionGrain / work),
               [&](int64_t begin, int64_t end) {
                 for (int64_t task = begin; task < end; ++task) {
                   int64_t outer = task / tiles;
                   int64_t inner_begin = (task % tiles) * kTile;
                   fn(outer, inner_begin, std::min(kTile, layout.inner - inner_begin));
                 }
               });
}

template <typename Acc, typename T>
Acc sum_row(const T* values, int64_t count) {
  Acc total = 0;
  // Vector lanes hold partial sums; the order is fixed by the code, not by threads.
#pragma omp simd reduction(+ : total)
  for (int64_t i = 0; i < count; ++i) total += static_cast<Acc>(values[i]);
  return total;
}

// out[o, i] = finalize(sum over r of x[o, r, i]).
template <typename T, typename Acc, typename Out, typename Finalize>
void sum_block(const T* x, const ReduceLayout& layout, Out* out, Finalize finalize) {
  const int64_t reduce = layout.reduce, inner = layout.inner;
  if (inner == 1 && layout.outer < get_num_threads() && reduce >= 2 * kSumBlock) {
    // Few long rows: fixed-size blocks in parallel, combined in order.
    int64_t blocks = (reduce + kSumBlock - 1) / kSumBlock;
    std::vector<Acc> partial(blocks);
    for (int64_t o = 0; o < layout.outer; ++o) {
      const T* row = x + o * reduce;
      parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
        for (int64_t b = begin; b < end; ++b)
          partial[b] =
              sum_row<Acc>(row + b * kSumBlock, std::min(kSumBlock, reduce - b * kSumBlock));
      });
      Acc total = 0;
      for (Acc value : partial) total += value;
      out[o] = finalize(total);
    }
    return;
  }
  for_each_tile(layout, [&](int64_t o, int64_t inner_begin, int64_t count) {
    if (inner == 1) {
      out[o] = finalize(sum_row<Acc>(x + o * reduce, reduce));
      return;
    }
    Acc acc[kTile] = {};
    const T* base = x + o * reduce * inner + inner_begin;
    for (int64_t r = 0; r < reduce; ++r) {
      const T* row = base + r * inner;
#pragma omp simd
      for (int64_t i = 0; i < count; ++i) acc[i] += static_cast<Acc>(row[i]);
    }
    Out* target = out + o * inner + inner_begin;
    for (int64_t i = 0; i < count; ++i) target[i] = finalize(acc[i]);
  });
}

// The extremum of a contiguous floating-point row and its first index (the first NaN if any),
// as comparing entry by entry gives them, in one pass over the row: a vectorised maximum (or
// minimum) and NaN count per chunk small enough to stay in L1, then a search for the first entry
// equal to the winner in the chunk that first held it (of +0 and -0, the first one).
template <typename T, bool kIsMax>
void extremum_row(const T* row, int64_t count, T* value, int64_t* index) {
  constexpr int64_t kChunk = 256;
  T best = row[0];
  int64_t best_chunk = 0;
  for (int64_t begin = 0; begin < count; begin += kChunk) {
    const T* chunk = row + begin;
    const int64_t size = std::min(kChunk, count - begin);
    // Separate loops with plain reductions: GCC vectorises each (a bool reduction beside the
    // maximum kept the loop scalar).
    T extreme = chunk[0];
    if constexpr (kIsMax) {
#pragma omp simd reduction(max : extreme)
      for (int64_t i = 0; i < size; ++i) extreme = extreme < chunk[i] ? chunk[i] : extreme;
    } else {
#pragma omp simd reduction(min : extreme)
      for (int64_t i = 0; i < size; ++i) extreme = extreme > chunk[i] ? chunk[i] : extreme;
    }
    int64_t nans = 0;
#pragma omp simd reduction(+ : nans)
    for (int64_t i = 0; i < size; ++i) nans += chunk[i] != chunk[i];
    if (nans > 0) {  // NaN wins, the first one
      int64_t at = 0;
      while (chunk[at] == chunk[at]) ++at;
      if (value) *value = chunk[at];
      if (index) *index = begin + at;
      return;
    }
    if (kIsMax ? extreme > best : extreme < best) best = extreme, best_chunk = begin;
  }
  int64_t at = best_chunk;
  while (row[at] != best) ++at;
  if (value) *value = row[at];
  if (index) *index = at;
}

// Largest (or smallest) value and its first index along the reduced axis; NaN wins, as in
// PyTorch. Either output pointer may be null.
template <typename T, bool kIsMax>
void extremum_block(const T* x, const ReduceLayout& layout, T* values, int64_t* indices) {
  const int64_t reduce = layout.reduce, inner = layout.inner;
  auto better = [](T candidate, T best) {
    if constexpr (std::is_floating_point_v<T>) {
      if (candidate != candidate) return best == best;
    }
    return kIsMax ? candidate > best : candidate < best;
  };
  for_each_tile(layout, [&](int64_t o, int64_t inner_begin, int64_t count) {
    if constexpr (std::is_floating_point_v<T>) {
      if (inner == 1 && reduce > 0) {
        return extremum_row<T, kIsMax>(x + o * reduce, reduce, values ? values + o : nullptr,
                                       indices ? indices + o : nullptr);
      }
    }
    T best[kTile];
    int64_t best_index[kTile];
    const T* base = x + o * reduce * inner + inner_begin;
    for (int64_t i = 0; i < count; ++i) best[i] = base[i], best_index[i] = 0;
    for (int64_t r = 1; r < reduce; ++r) {
      const T* row = base + r * inner;
      for (int64_t i = 0; i < count; ++i) {
        if (better(row[i], best[i])) best[i] = row[i], best_index[i] = r;
      }
    }
    int64_t at = o * inner + inner_begin;
    for (int64_t i = 0; i < count; ++i) {
      if (values) values[at + i] = best[i];
      if (indices) indices[at + i] = best_index[i];
    }
  });
}

template <bool kIsMax>
void extremum_kernel(KernelContext& context, const char* name, bool want_values, bool want_indices,
                     const std::vector<bool>& reduced) {
  const Tensor& x = context.inputs[0];
  ReduceLayout layout;
  Tensor block = reduction_block(context, x, reduced, &layout);
  visit_reduce_dtype(x.dtype(), name, [&](auto tag) {
    using T = decltype(tag);
    int next_output = 0;
    std::unique_ptr<DenseOutput> values, indices;
    if (want_values) values = std::make_unique<DenseOutput>(context, next_output++);
    if (want_indices) indices = std::make_unique<DenseOutput>(context, next_output++);
    extremum_block<T, kIsMax>(block.data_ptr<T>(), layout, values ? values->data<T>() : nullptr,
                              indices ? indices->data<int64_t>() : nullptr);
    if (values) values->finish();
    if (indices) indices->finish();
  });
}

// Softmax of one row (the common last-dim case).
template <typename T>
void softmax_row(const T* x, int64_t count, T* out, bool log_form) {
  T maximum = -std::numeric_limits<T>::infinity();
  for (int64_t r = 0; r < count; ++r) maximum = x[r] > maximum ? x[r] : maximum;
  double total = 0;
  if (log_form) {
    for (int64_t r = 0; r < count; ++r) total += static_cast<double>(std::exp(x[r] - maximum));
    // (x - max) - log(sum): subtracting the max first keeps precision for large inputs.
    const T log_total = static_cast<T>(std::log(total));
    for (int64_t r = 0; r < count; ++r) out[r] = (x[r] - maximum) - log_total;
    return;
  }
  // exp once per element: stored in the output, then scaled.
  for (int64_t r = 0; r < count; ++r) {
    out[r] = std::exp(x[r] - maximum);
    total += static_cast<double>(out[r]);
  }
  const T scale = static_cast<T>(1.0 / total);
  for (int64_t r = 0; r < count; ++r) out[r] *= scale;
}

// Softmax along the middle axis of [outer, reduce, inner], a tile of inner columns at a time.
template <typename T>
void softmax_block(const T* x, const ReduceLayout& layout, T* out, bool log_form) {
  const int64_t reduce = layout.reduce, inner = layout.inner;
  for_each_tile(layout, [&](int64_t o, int64_t inner_begin, int64_t count) {
    const int64_t start = o * reduce * inner + inner_begin;
    if (inner == 1) return softmax_row(x + start, reduce, out + start, log_form);
    T maximum[kTile];
    double total[kTile] = {};
    for (int64_t i = 0; i < count; ++i) maximum[i] = -std::numeric_limits<T>::infinity();
    for (int64_t r = 0; r < reduce; ++r) {
      const T* row = x + start + r * inner;
      for (int64_t i = 0; i < count; ++i) maximum[i] = row[i] > maximum[i] ? row[i] : maximum[i];
    }
    if (log_form) {
      for (int64_t r = 0; r < reduce; ++r) {
        const T* row = x + start + r * inner;
        for (int64_t i = 0; i < count; ++i)
          total[i] += static_cast<double>(std::exp(row[i] - maximum[i]));
      }
      T log_total[kTile];
      for (int64_t i = 0; i < count; ++i) log_total[i] = static_cast<T>(std::log(total[i]));
      for (int64_t r = 0; r < reduce; ++r) {
        const T* row = x + start + r * inner;
        T* target = out + start + r * inner;
        for (int64_t i = 0; i < count; ++i) target[i] = (row[i] - maximum[i]) - log_total[i];
      }
      return;
    }
    for (int64_t r = 0; r < reduce; ++r) {
      const T* row = x + start + r * inner;
      T* target = out + start + r * inner;
      for (int64_t i = 0; i < count; ++i) {
        target[i] = std::exp(row[i] - maximum[i]);
        total[i] += static_cast<double>(target[i]);
      }
    }
    T scale[kTile];
    for (int64_t i = 0; i < count; ++i) scale[i] = static_cast<T>(1.0 / total[i]);
    for (int64_t r = 0; r < reduce; ++r) {
      T* target = out + start + r * inner;
      for (int64_t i = 0; i < count; ++i) target[i] *= scale[i];
    }
  });
}

}  // namespace

Kernel sum_mean_kernel(const char* name, bool is_mean) {
  return [name, is_mean](KernelContext& context) {
    const Tensor& x = context.inputs[0];
    auto reduced = reduced_flags(name, x.sizes(), dims_attr(context.attrs));
    ReduceLayout layout;
    Tensor block = reduction_block(context, x, reduced, &layout);
    DenseOutput out(context, 0);
    visit_reduce_dtype(x.dtype(), name, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (std::is_floating_point_v<T>) {
        const double divisor = is_mean ? static_cast<double>(layout.reduce) : 1.0;
        sum_block<T, double>(block.data_ptr<T>(), layout, out.data<T>(), [=](double total) {
          return static_cast<T>(is_mean ? total / divisor : total);
        });
      } else {
        sum_block<T, int64_t>(block.data_ptr<T>(), layout, out.data<int64_t>(),
                              [](int64_t total) { return total; });
      }
    });
    out.finish();
  };
}

Kernel extremum_dim_kernel(const char* name, bool is_max) {
  return [name, is_max](KernelContext& context) {
    auto reduced = single_dim(name, context.inputs[0].sizes(), context.attrs.get<int64_t>("dim"));
    if (is_max) {
      extremum_kernel<true>(context, name, true, true, reduced);
    } else {
      extremum_kernel<false>(context, name, true, true, reduced);
    }
  };
}

Kernel extremum_all_kernel(const char* all_name, bool is_max) {
  return [all_name, is_max](KernelContext& context) {
    std::vector<bool> all(context.inputs[0].dim(), true);
    if (is_max) {
      extremum_kernel<true>(context, all_name, true, false, all);
    } else {
      extremum_kernel<false>(context, all_name, true, false, all);
    }
  };
}

void argmax_kernel(KernelContext& context) {
  auto reduced = single_dim("argmax", context.inputs[0].sizes(), context.attrs.get<int64_t>("dim"));
  extremum_kernel<true>(context, "argmax", false, true, reduced);
}

void var_kernel(KernelContext& context) {
  const Tensor& x = context.inputs[0];
  auto reduced = reduced_flags("var", x.sizes(), dims_attr(context.attrs));
  double correction = context.attrs.get_or<bool>("unbiased", true) ? 1.0 : 0.0;
  ReduceLayout layout;
  Tensor block = reduction_block(context, x, reduced, &layout);
  DenseOutput out(context, 0);
  visit_float_dtype(x.dtype(), "var", [&](auto tag) {
    using T = decltype(tag);
    const T* data = block.data_ptr<T>();
    T* result = out.data<T>();
    const int64_t reduce = layout.reduce, inner = layout.inner;
    const double denominator = static_cast<double>(reduce) - correction;
    for_each_tile(layout, [&](int64_t o, int64_t inner_begin, int64_t count) {
      double mean[kTile] = {}, squares[kTile] = {};
      const T* base = data + o * reduce * inner + inner_begin;
      for (int64_t r = 0; r < reduce; ++r)
        for (int64_t i = 0; i < count; ++i) mean[i] += static_cast<double>(base[r * inner + i]);
      for (int64_t i = 0; i < count; ++i) mean[i] /= static_cast<double>(reduce);
      // Two passes: deviations from the mean, which stays accurate for large offsets.
      for (int64_t r = 0; r < reduce; ++r) {
        for (int64_t i = 0; i < count; ++i) {
          double deviation = static_cast<double>(base[r * inner + i]) - mean[i];
          squares[i] += deviation * deviation;
        }
      }
      for (int64_t i = 0; i < count; ++i)
        result[o * inner + inner_begin + i] = static_cast<T>(squares[i] / denominator);
    });
  });
  out.finish();
}

Kernel softmax_kernel(const char* name, bool log_form) {
  return [name, log_form](KernelContext& context) {
    const Tensor& x = context.inputs[0];
    auto reduced = single_dim(name, x.sizes(), context.attrs.get<int64_t>("dim"));
    ReduceLayout layout;
    Tensor block = reduction_block(context, x, reduced, &layout);
    DenseOutput out(context, 0);
    visit_float_dtype(x.dtype(), name, [&](auto tag) {
      using T = decltype(tag);
      softmax_block<T>(block.data_ptr<T>(), layout, out.data<T>(), log_form);
    });
    out.finish();
  };
}

}  // namespace tessel::cpu
