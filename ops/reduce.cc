// Reductions (sum, mean, max, min, argmax, var) and softmax / log_softmax.
// Every kernel reads its input as a row-major [outer, reduce, inner] block: the reduced dims,
// when adjacent, are the middle; otherwise a permuted copy puts them last. f32 data is summed
// in double so long sums stay accurate; partial sums combine in a fixed order (deterministic
// for any thread count).
#include "ops/reduce.h"

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>

#include "ops/cpu/loops.h"
#include "ops/math/dtype_visit.h"
#include "ops/math/reduce_layout.h"
#include "ops/ops.h"
#include "ops/registry_helpers.h"

namespace tessel {

namespace {

constexpr int kCpu = static_cast<int>(DeviceType::kCpu);
constexpr int64_t kTile = 256;              // inner elements reduced together
constexpr int64_t kSumBlock = 16384;        // elements per partial sum of one long row
constexpr int64_t kReductionGrain = 32768;  // elements of work per parallel task

Shape reduced_shape(const Shape& sizes, const std::vector<bool>& reduced, bool keepdim) {
  Shape result;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (!reduced[d]) {
      result.push_back(sizes[d]);
    } else if (keepdim) {
      result.push_back(1);
    }
  }
  return result;
}

int64_t reduced_count(const Shape& sizes, const std::vector<bool>& reduced) {
  int64_t count = 1;
  for (size_t d = 0; d < sizes.size(); ++d)
    if (reduced[d]) count *= sizes[d];
  return count;
}

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

void check_float(const char* op, DType dtype) {
  TESSEL_CHECK(dtype == DType::kFloat32 || dtype == DType::kFloat64, op,
               ": expected a f32 or f64 tensor, got ", dtype_name(dtype),
               " (convert with .to(DType::kFloat32))");
}

OpCost reduction_cost(const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                      const Attrs&) {
  double bytes = static_cast<double>(inputs.at(0).nbytes());
  for (const auto& output : outputs) bytes += static_cast<double>(output.nbytes());
  return OpCost{static_cast<double>(inputs[0].numel()), bytes};
}

CostFn scaled_cost(double flops_per_element) {
  return [flops_per_element](const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                             const Attrs& attrs) {
    OpCost cost = reduction_cost(inputs, outputs, attrs);
    cost.flops *= flops_per_element;
    return cost;
  };
}

// `grad` (the reduced shape) reshaped so it broadcasts against the input (keepdim form).
Tensor keepdim_grad(const Tensor& grad, const Shape& input_sizes,
                    const std::vector<bool>& reduced) {
  Shape keep = reduced_shape(input_sizes, reduced, /*keepdim=*/true);
  return grad.sizes() == keep ? grad : reshape(grad, keep);
}

// ---- sum and mean ----

void register_sum_mean(const OpHandle& handle, bool is_mean) {
  // Attrs: dims (empty: all), keepdim.
  const char* name = handle.name();
  OpDef& op = OpRegistry::get().define(handle);
  op.kind = OpKind::kReduction;
  op.autocast = AutocastPolicy::kWiden;
  op.planner.split = ParallelSplit::kSpatialReduction;
  op.shape = [name, is_mean](const std::vector<Tensor>& inputs, const Attrs& attrs) {
    const Tensor& x = inputs.at(0);
    DType dtype = x.dtype();
    if (is_mean) {
      check_float(name, dtype);
    } else {
      TESSEL_CHECK(dtype != DType::kBFloat16 && dtype != DType::kFloat16, name,
                   ": expected a f32, f64 or integer tensor, got ", dtype_name(dtype));
      if (is_integral(dtype)) dtype = DType::kInt64;  // integer sums widen, as in PyTorch
    }
    auto reduced = reduced_flags(name, x.sizes(), dims_attr(attrs));
    return std::vector<OutputSpec>{
        {reduced_shape(x.sizes(), reduced, attrs.get_or<bool>("keepdim", false)), dtype}};
  };
  op.kernels[kCpu] = [name, is_mean](KernelContext& context) {
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
  op.backward = [name, is_mean](const BackwardContext& context) -> std::vector<Tensor> {
    const Tensor& grad = context.grad_outputs[0];
    if (!grad.defined()) return {Tensor()};
    const Shape& input_sizes = context.input_specs[0].sizes;
    auto reduced = reduced_flags(name, input_sizes, dims_attr(context.attrs));
    Tensor spread = keepdim_grad(grad, input_sizes, reduced);
    if (is_mean) spread = div(spread, static_cast<double>(reduced_count(input_sizes, reduced)));
    return {expand(spread, input_sizes)};
  };
  op.cost = reduction_cost;
}

// ---- max, min (along a dim, and over all), argmax ----

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

void check_extremum_input(const char* op, const Tensor& x, const std::vector<bool>& reduced) {
  DType dtype = x.dtype();
  TESSEL_CHECK(dtype != DType::kBFloat16 && dtype != DType::kFloat16, op,
               ": expected a f32, f64 or integer tensor, got ", dtype_name(dtype));
  TESSEL_CHECK(reduced_count(x.sizes(), reduced) > 0, op,
               ": cannot reduce over zero elements (input shape ", shape_str(x.sizes()), ")");
}

void register_extremum(const OpHandle& along_dim, const OpHandle& over_all, bool is_max) {
  const char* name = along_dim.name();
  const char* all_name = over_all.name();
  {
    // Along a dim. Attrs: dim, keepdim. Outputs: values, indices (i64; the first on ties).
    OpDef& op = OpRegistry::get().define(along_dim);
    op.kind = OpKind::kReduction;
    op.autocast = AutocastPolicy::kWiden;
    op.shape = [name](const std::vector<Tensor>& inputs, const Attrs& attrs) {
      const Tensor& x = inputs.at(0);
      auto reduced = single_dim(name, x.sizes(), attrs.get<int64_t>("dim"));
      check_extremum_input(name, x, reduced);
      Shape sizes = reduced_shape(x.sizes(), reduced, attrs.get_or<bool>("keepdim", false));
      return std::vector<OutputSpec>{{sizes, x.dtype()}, {sizes, DType::kInt64}};
    };
    op.kernels[kCpu] = [name, is_max](KernelContext& context) {
      auto reduced = single_dim(name, context.inputs[0].sizes(), context.attrs.get<int64_t>("dim"));
      if (is_max) {
        extremum_kernel<true>(context, name, true, true, reduced);
      } else {
        extremum_kernel<false>(context, name, true, true, reduced);
      }
    };
    op.save_outputs = {1};
    op.backward = [name](const BackwardContext& context) -> std::vector<Tensor> {
      const Tensor& grad = context.grad_outputs[0];
      if (!grad.defined()) return {Tensor()};
      const Shape& input_sizes = context.input_specs[0].sizes;
      int64_t dim = context.attrs.get<int64_t>("dim");
      auto reduced = single_dim(name, input_sizes, dim);
      if (input_sizes.empty()) return {grad};
      int64_t wrapped = wrap_dim(dim, static_cast<int64_t>(input_sizes.size()));
      // Route the gradient to the winning position: positions along `dim` == saved index.
      Shape position_shape(input_sizes.size(), 1);
      position_shape[wrapped] = input_sizes[wrapped];
      Tensor positions =
          reshape(arange(input_sizes[wrapped], TensorOptions(DType::kInt64).device(grad.device())),
                  position_shape);
      Tensor winners = eq(positions, keepdim_grad(context.saved_outputs[1], input_sizes, reduced));
      Tensor zero = full({}, 0.0, TensorOptions(grad.dtype()).device(grad.device()));
      return {where(winners, keepdim_grad(grad, input_sizes, reduced), zero)};
    };
    op.cost = reduction_cost;
  }
  {
    // Over all elements: one 0-d output.
    OpDef& op = OpRegistry::get().define(over_all);
    op.kind = OpKind::kReduction;
    op.autocast = AutocastPolicy::kWiden;
    op.shape = [all_name](const std::vector<Tensor>& inputs, const Attrs&) {
      const Tensor& x = inputs.at(0);
      check_extremum_input(all_name, x, std::vector<bool>(x.dim(), true));
      return std::vector<OutputSpec>{{Shape{}, x.dtype()}};
    };
    op.kernels[kCpu] = [all_name, is_max](KernelContext& context) {
      std::vector<bool> all(context.inputs[0].dim(), true);
      if (is_max) {
        extremum_kernel<true>(context, all_name, true, false, all);
      } else {
        extremum_kernel<false>(context, all_name, true, false, all);
      }
    };
    op.save_inputs = {0};
    op.save_outputs = {0};
    op.backward = [](const BackwardContext& context) -> std::vector<Tensor> {
      const Tensor& grad = context.grad_outputs[0];
      if (!grad.defined()) return {Tensor()};
      // Shared evenly among tied elements, as PyTorch's max() does.
      Tensor winners = eq(context.saved_inputs[0], context.saved_outputs[0]);
      Tensor zero = full({}, 0.0, TensorOptions(grad.dtype()).device(grad.device()));
      return {where(winners, div(grad, sum(winners)), zero)};
    };
    op.cost = reduction_cost;
  }
}

void register_argmax() {
  // Attrs: dim, keepdim. i64 output, the first index on ties.
  OpDef& op = OpRegistry::get().define(ops::argmax);
  op.kind = OpKind::kReduction;
  op.autocast = AutocastPolicy::kWiden;
  op.shape = [](const std::vector<Tensor>& inputs, const Attrs& attrs) {
    const Tensor& x = inputs.at(0);
    auto reduced = single_dim("argmax", x.sizes(), attrs.get<int64_t>("dim"));
    check_extremum_input("argmax", x, reduced);
    return std::vector<OutputSpec>{
        {reduced_shape(x.sizes(), reduced, attrs.get_or<bool>("keepdim", false)), DType::kInt64}};
  };
  op.kernels[kCpu] = [](KernelContext& context) {
    auto reduced =
        single_dim("argmax", context.inputs[0].sizes(), context.attrs.get<int64_t>("dim"));
    extremum_kernel<true>(context, "argmax", false, true, reduced);
  };
  op.cost = reduction_cost;
}

// ---- var ----

void register_var() {
  // Attrs: dims (empty: all), unbiased, keepdim.
  OpDef& op = OpRegistry::get().define(ops::var);
  op.kind = OpKind::kReduction;
  op.autocast = AutocastPolicy::kWiden;
  op.shape = [](const std::vector<Tensor>& inputs, const Attrs& attrs) {
    const Tensor& x = inputs.at(0);
    check_float("var", x.dtype());
    auto reduced = reduced_flags("var", x.sizes(), dims_attr(attrs));
    return std::vector<OutputSpec>{
        {reduced_shape(x.sizes(), reduced, attrs.get_or<bool>("keepdim", false)), x.dtype()}};
  };
  op.kernels[kCpu] = [](KernelContext& context) {
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
  };
  op.save_inputs = {0};
  op.backward = [](const BackwardContext& context) -> std::vector<Tensor> {
    const Tensor& grad = context.grad_outputs[0];
    if (!grad.defined()) return {Tensor()};
    const Tensor& x = context.saved_inputs[0];
    const std::vector<int64_t>& dims = dims_attr(context.attrs);
    auto reduced = reduced_flags("var", x.sizes(), dims);
    double correction = context.attrs.get_or<bool>("unbiased", true) ? 1.0 : 0.0;
    double scale = 2.0 / (static_cast<double>(reduced_count(x.sizes(), reduced)) - correction);
    Tensor centered = sub(x, mean(x, dims, /*keepdim=*/true));
    return {mul(centered, mul(keepdim_grad(grad, x.sizes(), reduced), scale))};
  };
  op.cost = scaled_cost(3);
}

// ---- softmax and log_softmax ----

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

void register_softmax(const OpHandle& handle, bool log_form) {
  // Attr: dim.
  const char* name = handle.name();
  OpDef& op = OpRegistry::get().define(handle);
  op.kind = OpKind::kReduction;
  op.autocast = AutocastPolicy::kWiden;
  op.planner = {ParallelSplit::kSoftmaxHeads, "softmax"};
  op.shape = [name](const std::vector<Tensor>& inputs, const Attrs& attrs) {
    const Tensor& x = inputs.at(0);
    check_float(name, x.dtype());
    single_dim(name, x.sizes(), attrs.get<int64_t>("dim"));
    return std::vector<OutputSpec>{{x.sizes(), x.dtype()}};
  };
  op.kernels[kCpu] = [name, log_form](KernelContext& context) {
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
  op.save_outputs = {0};
  op.backward = [log_form](const BackwardContext& context) -> std::vector<Tensor> {
    const Tensor& grad = context.grad_outputs[0];
    if (!grad.defined()) return {Tensor()};
    const Tensor& y = context.saved_outputs[0];
    std::vector<int64_t> dims{context.attrs.get<int64_t>("dim")};
    if (log_form) return {sub(grad, mul(exp(y), sum(grad, dims, /*keepdim=*/true)))};
    return {mul(y, sub(grad, sum(mul(grad, y), dims, /*keepdim=*/true)))};
  };
  op.cost = scaled_cost(15);
}

}  // namespace

TESSEL_REGISTER_OPS(reduce) {
  register_sum_mean(ops::sum, false);
  register_sum_mean(ops::mean, true);
  register_extremum(ops::max, ops::max_all, true);
  register_extremum(ops::min, ops::min_all, false);
  register_argmax();
  register_var();
  register_softmax(ops::softmax, false);
  register_softmax(ops::log_softmax, true);
}

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return dispatch(ops::sum, {x}, Attrs{{"dims", dims}, {"keepdim", keepdim}})[0];
}

Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return dispatch(ops::mean, {x}, Attrs{{"dims", dims}, {"keepdim", keepdim}})[0];
}

Tensor max(const Tensor& x, int64_t dim, bool keepdim) {
  return dispatch(ops::max, {x}, Attrs{{"dim", dim}, {"keepdim", keepdim}})[0];
}

Tensor min(const Tensor& x, int64_t dim, bool keepdim) {
  return dispatch(ops::min, {x}, Attrs{{"dim", dim}, {"keepdim", keepdim}})[0];
}

Tensor max(const Tensor& x) { return dispatch(ops::max_all, {x})[0]; }
Tensor min(const Tensor& x) { return dispatch(ops::min_all, {x})[0]; }

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  return dispatch(ops::argmax, {x}, Attrs{{"dim", dim}, {"keepdim", keepdim}})[0];
}

Tensor var(const Tensor& x, const std::vector<int64_t>& dims, bool unbiased, bool keepdim) {
  return dispatch(ops::var, {x},
                  Attrs{{"dims", dims}, {"unbiased", unbiased}, {"keepdim", keepdim}})[0];
}

Tensor softmax(const Tensor& x, int64_t dim) {
  return dispatch(ops::softmax, {x}, Attrs{{"dim", dim}})[0];
}

Tensor log_softmax(const Tensor& x, int64_t dim) {
  return dispatch(ops::log_softmax, {x}, Attrs{{"dim", dim}})[0];
}

}  // namespace tessel
