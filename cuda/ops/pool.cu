// CUDA kernels for the pooling ops of ops/pool.cc (max_pool2d with its i64 indices, avg_pool2d,
// adaptive_avg_pool2d, and their backward ops), with the CPU's window rules, NaN propagation and
// index choice (ops/math/pooling.h). Backward pooling gathers into each input element in the
// CPU's order (no atomics), so results are deterministic.
#include <vector>

#include "cuda/ops/loops.cuh"
#include "ops/math/pooling.h"
#include "ops/pool.h"
#include "ops/registry_helpers.h"

namespace tessel::cuda {

namespace {

constexpr DeviceType kCuda = DeviceType::kCuda;

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

TESSEL_REGISTER_OPS(cuda_pool) {
  ops::max_pool2d.set_kernel(kCuda, max_pool);
  ops::max_pool2d_backward.set_kernel(kCuda, max_pool_backward);
  ops::avg_pool2d.set_kernel(kCuda, avg_pool);
  ops::avg_pool2d_backward.set_kernel(kCuda, avg_pool_backward);
  ops::adaptive_avg_pool2d.set_kernel(kCuda, adaptive_avg_pool);
  ops::adaptive_avg_pool2d_backward.set_kernel(kCuda, adaptive_avg_pool_backward);
}

}  // namespace tessel::cuda
