// CUDA kernels for the reductions of ops/reduce.cc: sum, mean, max / min (along a dim and over
// all), argmax, var, softmax and log_softmax. Inputs are read as [outer, reduce, inner] blocks
// (ops/math/reduce_layout.h, shared with the CPU); f32 sums accumulate in double as on CPU; NaN
// wins max / min and the first index wins ties.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>

#include "cuda/ops/reduce.cuh"
#include "ops/math/dtype_visit.h"
#include "ops/reduce.h"
#include "ops/registry_helpers.h"

namespace tessel::cuda {

namespace {

constexpr DeviceType kCuda = DeviceType::kCuda;

// ---- kernels ----

// out[o, i] = sum_r x[o, r, i] (divided by `divisor` for mean). With gridDim.y = S > 1, block
// row s sums rows [s * chunk, (s + 1) * chunk) into out[o, s, i]: partial sums, combined by a
// second launch over [outer, S, inner].
template <typename T, typename Acc, typename Out>
__global__ void sum_kernel(const T* x, ReduceLayout layout, int64_t tiles, int64_t chunk, Out* out,
                           double divisor) {
  ReduceThread thread(layout, tiles);
  const int64_t begin = blockIdx.y * chunk;
  const int64_t end = begin + chunk < layout.reduce ? begin + chunk : layout.reduce;
  Acc total = 0;
  if (thread.active)
    for (int64_t r = begin + threadIdx.y; r < end; r += blockDim.y)
      total += static_cast<Acc>(x[thread.at(layout, r)]);
  total = combine_over_rows(total, shared_buffer<Acc>(), [](Acc a, Acc b) { return a + b; });
  if (thread.active && threadIdx.y == 0) {
    const int64_t at = (thread.outer * gridDim.y + blockIdx.y) * layout.inner + thread.column;
    if constexpr (std::is_floating_point_v<Acc>) {
      out[at] = static_cast<Out>(divisor == 1.0 ? total : total / divisor);
    } else {
      out[at] = static_cast<Out>(total);
    }
  }
}

// Sums `x` over the middle axis of `layout` into `out` (dense [outer, inner]). Few long
// columns are cut into chunks summed by separate blocks, then combined in a second pass, so
// the GPU is busy; the cut depends only on the shape, so results are deterministic.
template <typename T, typename Acc, typename Out>
void launch_sum(KernelContext* context, const T* x, const ReduceLayout& layout, Out* out,
                double divisor, cudaStream_t stream) {
  ReduceLaunch launch(layout);
  if (launch.empty(layout)) return;
  constexpr int64_t kTargetBlocks = 512;
  constexpr int64_t kMinRowsPerChunk = 256;
  const int64_t blocks = layout.outer * launch.tiles;
  int64_t splits = 1;
  if (context && blocks < kTargetBlocks && layout.reduce >= 2 * kMinRowsPerChunk) {
    splits = std::min((kTargetBlocks + blocks - 1) / blocks, layout.reduce / kMinRowsPerChunk);
    splits = std::min<int64_t>(splits, 65535);
  }
  if (splits <= 1) {
    sum_kernel<T, Acc, Out><<<launch.grid, launch.block, launch.shared(sizeof(Acc)), stream>>>(
        x, layout, launch.tiles, layout.reduce, out, divisor);
    check_launch();
    return;
  }
  const int64_t chunk = (layout.reduce + splits - 1) / splits;
  splits = (layout.reduce + chunk - 1) / chunk;
  const DType acc_dtype = std::is_floating_point_v<Acc> ? DType::kFloat64 : DType::kInt64;
  Tensor partial = context->workspace({layout.outer, splits, layout.inner}, acc_dtype);
  dim3 grid(launch.grid.x, static_cast<unsigned>(splits));
  sum_kernel<T, Acc, Acc><<<grid, launch.block, launch.shared(sizeof(Acc)), stream>>>(
      x, layout, launch.tiles, chunk, device_data<Acc>(partial), 1.0);
  check_launch();
  const ReduceLayout partial_layout{layout.outer, splits, layout.inner};
  ReduceLaunch second(partial_layout);
  sum_kernel<Acc, Acc, Out><<<second.grid, second.block, second.shared(sizeof(Acc)), stream>>>(
      device_data<const Acc>(partial), partial_layout, second.tiles, splits, out, divisor);
  check_launch();
}

template <typename T>
struct ValueIndex {
  T value;
  int64_t index;
};

// The better of two candidates: NaN first, then the larger (smaller) value, then the first
// index, which makes the combine order irrelevant.
template <typename T, bool kIsMax>
__device__ ValueIndex<T> better_of(ValueIndex<T> a, ValueIndex<T> b) {
  if (a.index < 0) return b;
  if (b.index < 0) return a;
  if constexpr (std::is_floating_point_v<T>) {
    const bool a_nan = a.value != a.value, b_nan = b.value != b.value;
    if (a_nan || b_nan) {
      if (a_nan && b_nan) return a.index < b.index ? a : b;
      return a_nan ? a : b;
    }
  }
  if (a.value == b.value) return a.index < b.index ? a : b;
  if (kIsMax) return a.value > b.value ? a : b;
  return a.value < b.value ? a : b;
}

template <typename T, bool kIsMax>
__global__ void extremum_kernel(const T* x, ReduceLayout layout, int64_t tiles, T* values,
                                int64_t* indices) {
  ReduceThread thread(layout, tiles);
  ValueIndex<T> best{T(), -1};
  if (thread.active)
    for (int64_t r = threadIdx.y; r < layout.reduce; r += blockDim.y)
      best = better_of<T, kIsMax>(best, ValueIndex<T>{x[thread.at(layout, r)], r});
  best = combine_over_rows(
      best, shared_buffer<ValueIndex<T>>(),
      [](ValueIndex<T> a, ValueIndex<T> b) { return better_of<T, kIsMax>(a, b); });
  if (thread.active && threadIdx.y == 0) {
    const int64_t at = thread.output_index(layout);
    if (values) values[at] = best.value;
    if (indices) indices[at] = best.index;
  }
}

// Two passes, as on CPU: the mean, then squared deviations from it.
template <typename T>
__global__ void var_kernel(const T* x, ReduceLayout layout, int64_t tiles, T* out,
                           double denominator) {
  ReduceThread thread(layout, tiles);
  double* shared = shared_buffer<double>();
  auto add = [](double a, double b) { return a + b; };
  double total = 0;
  if (thread.active)
    for (int64_t r = threadIdx.y; r < layout.reduce; r += blockDim.y)
      total += static_cast<double>(x[thread.at(layout, r)]);
  const double mean = combine_over_rows(total, shared, add) / static_cast<double>(layout.reduce);
  double squares = 0;
  if (thread.active)
    for (int64_t r = threadIdx.y; r < layout.reduce; r += blockDim.y) {
      const double deviation = static_cast<double>(x[thread.at(layout, r)]) - mean;
      squares += deviation * deviation;
    }
  squares = combine_over_rows(squares, shared, add);
  if (thread.active && threadIdx.y == 0)
    out[thread.output_index(layout)] = static_cast<T>(squares / denominator);
}

template <typename T>
__device__ __forceinline__ T exp_of(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return expf(x);
  } else {
    return exp(x);
  }
}

template <typename T>
__global__ void softmax_kernel(const T* x, ReduceLayout layout, int64_t tiles, T* out,
                               bool log_form) {
  ReduceThread thread(layout, tiles);
  T maximum = -std::numeric_limits<T>::infinity();
  if (thread.active)
    for (int64_t r = threadIdx.y; r < layout.reduce; r += blockDim.y) {
      const T value = x[thread.at(layout, r)];
      maximum = value > maximum ? value : maximum;
    }
  maximum = combine_over_rows(maximum, shared_buffer<T>(), [](T a, T b) { return b > a ? b : a; });
  double total = 0;
  if (thread.active)
    for (int64_t r = threadIdx.y; r < layout.reduce; r += blockDim.y)
      total += static_cast<double>(exp_of(x[thread.at(layout, r)] - maximum));
  total =
      combine_over_rows(total, shared_buffer<double>(), [](double a, double b) { return a + b; });
  if (!thread.active) return;
  if (log_form) {
    const T log_total = static_cast<T>(log(total));
    for (int64_t r = threadIdx.y; r < layout.reduce; r += blockDim.y) {
      const int64_t at = thread.at(layout, r);
      out[at] = (x[at] - maximum) - log_total;
    }
  } else {
    const T scale = static_cast<T>(1.0 / total);
    for (int64_t r = threadIdx.y; r < layout.reduce; r += blockDim.y) {
      const int64_t at = thread.at(layout, r);
      out[at] = exp_of(x[at] - maximum) * scale;
    }
  }
}

// ---- op kernels ----

void sum_mean_kernel(KernelContext& context, bool is_mean) {
  const Tensor& x = context.inputs[0];
  auto reduced = reduced_flags(context.op.name, x.sizes(), dims_attr(context.attrs));
  ReduceLayout layout;
  Tensor block = reduction_block(context, x, reduced, &layout);
  DenseOutput out(context, context.outputs[0]);
  if (layout.outer * layout.inner > 0) {
    KernelDevice device(context);
    const double divisor = is_mean ? static_cast<double>(layout.reduce) : 1.0;
    visit_reduce_dtype(x.dtype(), context.op.name.c_str(), [&](auto tag) {
      using T = decltype(tag);
      if constexpr (std::is_floating_point_v<T>) {
        launch_sum<T, double, T>(&context, device_data<const T>(block), layout, out.data<T>(),
                                 divisor, device.stream());
      } else {
        launch_sum<T, int64_t, int64_t>(&context, device_data<const T>(block), layout,
                                        out.data<int64_t>(), 1.0, device.stream());
      }
    });
  }
  out.finish();
}

// Outputs: values (when want_values), then indices (when want_indices).
void extremum_op(KernelContext& context, bool is_max, bool want_values, bool want_indices,
                 const std::vector<bool>& reduced) {
  const Tensor& x = context.inputs[0];
  ReduceLayout layout;
  Tensor block = reduction_block(context, x, reduced, &layout);
  int next_output = 0;
  std::unique_ptr<DenseOutput> values, indices;
  if (want_values) values = std::make_unique<DenseOutput>(context, context.outputs[next_output++]);
  if (want_indices)
    indices = std::make_unique<DenseOutput>(context, context.outputs[next_output++]);
  ReduceLaunch launch(layout);
  if (!launch.empty(layout)) {
    KernelDevice device(context);
    visit_reduce_dtype(x.dtype(), context.op.name.c_str(), [&](auto tag) {
      using T = decltype(tag);
      T* value_data = values ? values->data<T>() : nullptr;
      int64_t* index_data = indices ? indices->data<int64_t>() : nullptr;
      const size_t shared = launch.shared(sizeof(ValueIndex<T>));
      if (is_max) {
        extremum_kernel<T, true><<<launch.grid, launch.block, shared, device.stream()>>>(
            device_data<const T>(block), layout, launch.tiles, value_data, index_data);
      } else {
        extremum_kernel<T, false><<<launch.grid, launch.block, shared, device.stream()>>>(
            device_data<const T>(block), layout, launch.tiles, value_data, index_data);
      }
      check_launch();
    });
  }
  if (values) values->finish();
  if (indices) indices->finish();
}

void softmax_op(KernelContext& context, bool log_form) {
  const Tensor& x = context.inputs[0];
  auto reduced = single_dim(context.op.name, x.sizes(), context.attrs.get<int64_t>("dim"));
  ReduceLayout layout;
  Tensor block = reduction_block(context, x, reduced, &layout);
  // One reduced dim: the block is x in row-major order, as the output.
  DenseOutput out(context, context.outputs[0]);
  ReduceLaunch launch(layout);
  if (!launch.empty(layout) && layout.reduce > 0) {
    KernelDevice device(context);
    visit_float_dtype(x.dtype(), context.op.name.c_str(), [&](auto tag) {
      using T = decltype(tag);
      softmax_kernel<T>
          <<<launch.grid, launch.block, launch.shared(sizeof(double)), device.stream()>>>(
              device_data<const T>(block), layout, launch.tiles, out.data<T>(), log_form);
      check_launch();
    });
  }
  out.finish();
}

}  // namespace

Tensor reduction_block(KernelContext& context, const Tensor& x, const std::vector<bool>& reduced,
                       ReduceLayout* layout) {
  const ReductionPlan plan = plan_reduction(x.sizes(), x.strides(), reduced);
  *layout = plan.layout;
  if (!plan.permuted) return dense_input(context, x);
  Tensor permuted = make_view(x, plan.sizes, plan.strides, x.storage_offset());
  Tensor copy = context.workspace(plan.sizes, x.dtype());
  copy_convert(copy, permuted);
  return copy;
}

void sum_doubles(KernelContext& context, const Tensor& values, const Tensor& out) {
  KernelDevice device(out);
  launch_sum<double, double, double>(&context, device_data<const double>(values),
                                     ReduceLayout{1, values.numel(), 1}, device_data<double>(out),
                                     1.0, device.stream());
}

TESSEL_REGISTER_OPS(cuda_reduce) {
  ops::sum.set_kernel(kCuda, [](KernelContext& context) { sum_mean_kernel(context, false); });
  ops::mean.set_kernel(kCuda, [](KernelContext& context) { sum_mean_kernel(context, true); });
  for (bool is_max : {true, false}) {
    (is_max ? ops::max : ops::min).set_kernel(kCuda, [is_max](KernelContext& context) {
      auto reduced =
          single_dim(context.op.name, context.inputs[0].sizes(), context.attrs.get<int64_t>("dim"));
      extremum_op(context, is_max, true, true, reduced);
    });
    (is_max ? ops::max_all : ops::min_all).set_kernel(kCuda, [is_max](KernelContext& context) {
      extremum_op(context, is_max, true, false, std::vector<bool>(context.inputs[0].dim(), true));
    });
  }
  ops::argmax.set_kernel(kCuda, [](KernelContext& context) {
    auto reduced =
        single_dim(context.op.name, context.inputs[0].sizes(), context.attrs.get<int64_t>("dim"));
    extremum_op(context, true, false, true, reduced);
  });
  ops::var.set_kernel(kCuda, [](KernelContext& context) {
    const Tensor& x = context.inputs[0];
    auto reduced = reduced_flags(context.op.name, x.sizes(), dims_attr(context.attrs));
    const double correction = context.attrs.get_or<bool>("unbiased", true) ? 1.0 : 0.0;
    ReduceLayout layout;
    Tensor block = reduction_block(context, x, reduced, &layout);
    DenseOutput out(context, context.outputs[0]);
    ReduceLaunch launch(layout);
    if (!launch.empty(layout)) {
      KernelDevice device(context);
      visit_float_dtype(x.dtype(), ops::var.name(), [&](auto tag) {
        using T = decltype(tag);
        var_kernel<T>
            <<<launch.grid, launch.block, launch.shared(sizeof(double)), device.stream()>>>(
                device_data<const T>(block), layout, launch.tiles, out.data<T>(),
                static_cast<double>(layout.reduce) - correction);
        check_launch();
      });
    }
    out.finish();
  });
  ops::softmax.set_kernel(kCuda, [](KernelContext& context) { softmax_op(context, false); });
  ops::log_softmax.set_kernel(kCuda, [](KernelContext& context) { softmax_op(context, true); });
}

}  // namespace tessel::cuda
