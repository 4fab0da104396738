// Pooling over NCHW planes with PyTorch's window rules: max_pool2d (which also outputs the i64
// index of each maximum inside its input plane, so its backward is a scatter), avg_pool2d and
// adaptive_avg_pool2d, each with a backward op. Kernels read and write any strides directly.
#include "ops/pool.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "ops/math/pooling.h"
#include "ops/ops.h"
#include "ops/registry_helpers.h"

namespace tessel {

namespace {

constexpr int kCpu = static_cast<int>(DeviceType::kCpu);

std::vector<int64_t> attr_pair(const Attrs& attrs, const char* op, const char* name) {
  const auto& values = attrs.get<std::vector<int64_t>>(name);
  TESSEL_CHECK(values.size() == 2, op, ": ", name, " must have 2 values (h, w), got ", values);
  return values;
}

void check_pool_input(const char* op, const Tensor& x) {
  TESSEL_CHECK(x.dim() == 4, op, ": expected a 4-D input (N, C, H, W), got shape ",
               shape_str(x.sizes()));
  TESSEL_CHECK(x.dtype() == DType::kFloat32 || x.dtype() == DType::kFloat64, op,
               ": expected a f32 or f64 input, got ", dtype_name(x.dtype()),
               " (convert with .to(DType::kFloat32))");
}

// The two axes of a max/avg pool from its attributes and an input of `sizes` (N, C, H, W).
std::pair<PoolAxis, PoolAxis> pool_axes(const char* op, const Shape& sizes, const Attrs& attrs,
                                        bool with_dilation) {
  auto kernel = attr_pair(attrs, op, "kernel_size");
  auto stride = attr_pair(attrs, op, "stride");
  auto padding = attr_pair(attrs, op, "padding");
  std::vector<int64_t> dilation =
      with_dilation ? attr_pair(attrs, op, "dilation") : std::vector<int64_t>{1, 1};
  const bool ceil_mode = attrs.get<bool>("ceil_mode");
  TESSEL_CHECK(kernel[0] > 0 && kernel[1] > 0, op, ": kernel_size must be positive, got ", kernel);
  TESSEL_CHECK(stride[0] > 0 && stride[1] > 0, op, ": stride must be positive, got ", stride);
  TESSEL_CHECK(dilation[0] > 0 && dilation[1] > 0, op, ": dilation must be positive, got ",
               dilation);
  TESSEL_CHECK(padding[0] >= 0 && padding[1] >= 0 && padding[0] <= kernel[0] / 2 &&
                   padding[1] <= kernel[1] / 2,
               op, ": padding must be between 0 and half the kernel size, got padding ", padding,
               " for kernel_size ", kernel);
  PoolAxis axes[2];
  for (int i = 0; i < 2; ++i) {
    const int64_t input = sizes[2 + i];
    axes[i] = {
        input,       kernel[i],
        stride[i],   padding[i],
        dilation[i], pooled_size(input, kernel[i], padding[i], stride[i], dilation[i], ceil_mode)};
  }
  TESSEL_CHECK(axes[0].output > 0 && axes[1].output > 0, op, ": input shape ", shape_str(sizes),
               " is too small for kernel_size ", kernel, " (dilation ", dilation, ", padding ",
               padding, "): the output would be ", axes[0].output, "x", axes[1].output);
  return {axes[0], axes[1]};
}

std::vector<int64_t> input_size_attr(const Attrs& attrs) {
  const auto& sizes = attrs.get<std::vector<int64_t>>("input_size");
  TESSEL_CHECK(sizes.size() == 4, "pooling backward: input_size must have 4 values, got ", sizes);
  return sizes;
}

void check_grad(const char* op, const Tensor& grad, const Shape& expected) {
  TESSEL_CHECK(grad.sizes() == expected, op, ": grad_output has shape ", shape_str(grad.sizes()),
               " but the pooled output has shape ", shape_str(expected));
  TESSEL_CHECK(grad.dtype() == DType::kFloat32 || grad.dtype() == DType::kFloat64, op,
               ": expected a f32 or f64 grad_output, got ", dtype_name(grad.dtype()));
}

double total_bytes(const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs) {
  double bytes = 0;
  for (const auto& t : inputs)
    if (t.defined()) bytes += static_cast<double>(t.nbytes());
  for (const auto& t : outputs) bytes += static_cast<double>(t.nbytes());
  return bytes;
}

int64_t plane_count(const Tensor& t) { return t.size(0) * t.size(1); }

int64_t plane_grain(int64_t plane_work) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(plane_work, 1));
}

Attrs with_input_size(const Attrs& attrs, const Shape& sizes) {
  Attrs result = attrs;
  result.set("input_size", std::vector<int64_t>(sizes.begin(), sizes.end()));
  return result;
}

// Accumulates a gradient plane by plane: `fill(plane, accumulator)` adds into a dense zeroed
// H*W buffer, which is then written into the (strided) output. Planes never overlap, so each
// thread owns the planes it is given.
template <typename T, typename Fill>
void scatter_planes(KernelContext& context, const Fill& fill) {
  const Tensor& out = context.outputs[0];
  const Planes geometry = planes_of(out);
  const int64_t plane = geometry.height * geometry.width;
  const int64_t planes = plane_count(out);
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(get_num_threads(), planes));
  T* scratch = context.workspace({chunks, plane}, out.dtype()).template data_ptr<T>();
  T* out_data = out.data_ptr<T>();
  parallel_for(0, chunks, 1, [&](int64_t chunk_begin, int64_t chunk_end) {
    for (int64_t chunk = chunk_begin; chunk < chunk_end; ++chunk) {
      T* acc = scratch + chunk * plane;
      for (int64_t p = planes * chunk / chunks; p < planes * (chunk + 1) / chunks; ++p) {
        std::fill(acc, acc + plane, T(0));
        fill(p, acc);
        T* target = out_data + geometry.plane_offset(p);
        for (int64_t h = 0; h < geometry.height; ++h)
          for (int64_t w = 0; w < geometry.width; ++w)
            target[geometry.at(h, w)] = acc[h * geometry.width + w];
      }
    }
  });
}

// ---- max_pool2d ----

template <typename T>
void max_pool_forward(KernelContext& context) {
  const Tensor& x = context.inputs[0];
  const Tensor& values = context.outputs[0];
  const Tensor& indices = context.outputs[1];
  // Not a structured binding: C++17 lambdas cannot capture those (clang rejects it).
  const auto axes = pool_axes("max_pool2d", x.sizes(), context.attrs, true);
  const PoolAxis& rows = axes.first;
  const PoolAxis& cols = axes.second;
  const Planes in = planes_of(x), out = planes_of(values), index = planes_of(indices);
  const T* x_data = x.data_ptr<T>();
  T* value_data = values.data_ptr<T>();
  int64_t* index_data = indices.data_ptr<int64_t>();
  const int64_t work = rows.output * cols.output * rows.kernel * cols.kernel;
  parallel_for(0, plane_count(x), plane_grain(work), [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const T* plane = x_data + in.plane_offset(p);
      T* value_plane = value_data + out.plane_offset(p);
      int64_t* index_plane = index_data + index.plane_offset(p);
      for (int64_t oh = 0; oh < rows.output; ++oh) {
        for (int64_t ow = 0; ow < cols.output; ++ow) {
          T best;
          int64_t best_index;
          window_max(
              rows, cols, oh, ow, [&](int64_t h, int64_t w) { return plane[in.at(h, w)]; }, &best,
              &best_index);
          value_plane[out.at(oh, ow)] = best;
          index_plane[index.at(oh, ow)] = best_index;
        }
      }
    }
  });
}

template <typename T>
void max_pool_backward(KernelContext& context) {
  const Tensor& grad = context.inputs[0];
  const Tensor& indices = context.inputs[1];
  const Planes g = planes_of(grad), index = planes_of(indices);
  const T* grad_data = grad.data_ptr<T>();
  const int64_t* index_data = indices.data_ptr<int64_t>();
  const int64_t in_plane = context.outputs[0].size(2) * context.outputs[0].size(3);
  scatter_planes<T>(context, [&](int64_t p, T* acc) {
    const T* grad_plane = grad_data + g.plane_offset(p);
    const int64_t* index_plane = index_data + index.plane_offset(p);
    for (int64_t oh = 0; oh < g.height; ++oh) {
      for (int64_t ow = 0; ow < g.width; ++ow) {
        const int64_t at = index_plane[index.at(oh, ow)];
        if (at >= 0 && at < in_plane) acc[at] += grad_plane[g.at(oh, ow)];
      }
    }
  });
}

// ---- avg_pool2d ----

template <typename T>
void avg_pool_forward(KernelContext& context) {
  const Tensor& x = context.inputs[0];
  const Tensor& values = context.outputs[0];
  const auto axes = pool_axes("avg_pool2d", x.sizes(), context.attrs, false);
  const PoolAxis& rows = axes.first;
  const PoolAxis& cols = axes.second;
  const bool count_include_pad = context.attrs.get<bool>("count_include_pad");
  const Planes in = planes_of(x), out = planes_of(values);
  const T* x_data = x.data_ptr<T>();
  T* value_data = values.data_ptr<T>();
  const int64_t work = rows.output * cols.output * rows.kernel * cols.kernel;
  parallel_for(0, plane_count(x), plane_grain(work), [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const T* plane = x_data + in.plane_offset(p);
      T* value_plane = value_data + out.plane_offset(p);
      for (int64_t oh = 0; oh < rows.output; ++oh) {
        const AvgWindow wh = avg_window(rows, oh);
        for (int64_t ow = 0; ow < cols.output; ++ow) {
          const AvgWindow ww = avg_window(cols, ow);
          value_plane[out.at(oh, ow)] = window_average<T>(
              wh, ww, count_include_pad, [&](int64_t h, int64_t w) { return plane[in.at(h, w)]; });
        }
      }
    }
  });
}

template <typename T>
void avg_pool_backward(KernelContext& context) {
  const Tensor& grad = context.inputs[0];
  const auto axes =
      pool_axes("avg_pool2d", context.outputs[0].sizes(), context.attrs, /*with_dilation=*/false);
  const PoolAxis& rows = axes.first;
  const PoolAxis& cols = axes.second;
  const bool count_include_pad = context.attrs.get<bool>("count_include_pad");
  const Planes g = planes_of(grad);
  const T* grad_data = grad.data_ptr<T>();
  const int64_t width = cols.input;
  scatter_planes<T>(context, [&](int64_t p, T* acc) {
    const T* grad_plane = grad_data + g.plane_offset(p);
    for (int64_t oh = 0; oh < rows.output; ++oh) {
      const AvgWindow wh = avg_window(rows, oh);
      for (int64_t ow = 0; ow < cols.output; ++ow) {
        const AvgWindow ww = avg_window(cols, ow);
        if (wh.empty() || ww.empty()) continue;
        const T share =
            grad_plane[g.at(oh, ow)] / static_cast<T>(avg_divisor(wh, ww, count_include_pad));
        for (int64_t h = wh.start; h < wh.end; ++h)
          for (int64_t w = ww.start; w < ww.end; ++w) acc[h * width + w] += share;
      }
    }
  });
}

// ---- adaptive_avg_pool2d ----

std::vector<int64_t> adaptive_output_size(const Attrs& attrs) {
  auto sizes = attr_pair(attrs, "adaptive_avg_pool2d", "output_size");
  TESSEL_CHECK(sizes[0] > 0 && sizes[1] > 0,
               "adaptive_avg_pool2d: output_size must be positive, got ", sizes);
  return sizes;
}

template <typename T>
void adaptive_avg_forward(KernelContext& context) {
  const Tensor& x = context.inputs[0];
  const Tensor& values = context.outputs[0];
  const Planes in = planes_of(x), out = planes_of(values);
  const int64_t out_h = values.size(2), out_w = values.size(3);
  const T* x_data = x.data_ptr<T>();
  T* value_data = values.data_ptr<T>();
  parallel_for(
      0, plane_count(x), plane_grain(in.height * in.width), [&](int64_t begin, int64_t end) {
        for (int64_t p = begin; p < end; ++p) {
          const T* plane = x_data + in.plane_offset(p);
          T* value_plane = value_data + out.plane_offset(p);
          for (int64_t oh = 0; oh < out_h; ++oh) {
            const AvgWindow wh = adaptive_window(oh, in.height, out_h);
            for (int64_t ow = 0; ow < out_w; ++ow) {
              const AvgWindow ww = adaptive_window(ow, in.width, out_w);
              const T total =
                  window_sum<T>(wh, ww, [&](int64_t h, int64_t w) { return plane[in.at(h, w)]; });
              value_plane[out.at(oh, ow)] = total / static_cast<T>(avg_divisor(wh, ww, false));
            }
          }
        }
      });
}

template <typename T>
void adaptive_avg_backward(KernelContext& context) {
  const Tensor& grad = context.inputs[0];
  const Planes g = planes_of(grad);
  const int64_t in_h = context.outputs[0].size(2), in_w = context.outputs[0].size(3);
  const T* grad_data = grad.data_ptr<T>();
  scatter_planes<T>(context, [&](int64_t p, T* acc) {
    const T* grad_plane = grad_data + g.plane_offset(p);
    for (int64_t oh = 0; oh < g.height; ++oh) {
      const AvgWindow wh = adaptive_window(oh, in_h, g.height);
      for (int64_t ow = 0; ow < g.width; ++ow) {
        const AvgWindow ww = adaptive_window(ow, in_w, g.width);
        const T share = grad_plane[g.at(oh, ow)] / static_cast<T>(avg_divisor(wh, ww, false));
        for (int64_t h = wh.start; h < wh.end; ++h)
          for (int64_t w = ww.start; w < ww.end; ++w) acc[h * in_w + w] += share;
      }
    }
  });
}

// Public wrappers accept (C, H, W) too, as PyTorch does, by adding a batch of one.
template <typename Fn>
Tensor with_batch(const char* op, const Tensor& x, const Fn& fn) {
  TESSEL_CHECK(x.dim() == 3 || x.dim() == 4, op,
               ": expected a 3-D (C, H, W) or 4-D (N, C, H, W) input, got shape ",
               shape_str(x.sizes()));
  if (x.dim() == 3) return squeeze(fn(unsqueeze(x, 0)), 0);
  return fn(x);
}

std::vector<int64_t> pool_pair(std::vector<int64_t> values, const char* op, const char* name) {
  if (values.size() == 1) values.push_back(values[0]);
  TESSEL_CHECK(values.size() == 2, op, ": ", name, " must have 1 or 2 values, got ", values);
  return values;
}

// A kernel that runs the f32 or f64 instantiation for the output's dtype.
Kernel float_kernel(const char* op, void (*f32)(KernelContext&), void (*f64)(KernelContext&)) {
  return [op, f32, f64](KernelContext& context) {
    DType dtype = context.outputs[0].dtype();
    visit_float_dtype(dtype, op, [&](auto tag) {
      if constexpr (std::is_same_v<decltype(tag), float>) {
        f32(context);
      } else {
        f64(context);
      }
    });
  };
}

void register_max_pool2d() {
  // max_pool2d: x (N, C, H, W) -> values (N, C, OH, OW), indices (i64, into each H*W plane).
  OpDef& op = OpRegistry::get().define(ops::max_pool2d);
  op.kind = OpKind::kPool;
  op.autocast = AutocastPolicy::kWiden;
  op.planner = {ParallelSplit::kChannels, "pool"};
  op.shape = [](const std::vector<Tensor>& in, const Attrs& attrs) {
    check_pool_input("max_pool2d", in.at(0));
    auto [rows, cols] = pool_axes("max_pool2d", in[0].sizes(), attrs, true);
    Shape sizes{in[0].size(0), in[0].size(1), rows.output, cols.output};
    return std::vector<OutputSpec>{{sizes, in[0].dtype()}, {sizes, DType::kInt64}};
  };
  op.kernels[kCpu] = float_kernel("max_pool2d", max_pool_forward<float>, max_pool_forward<double>);
  op.save_outputs = {1};
  op.backward = [](const BackwardContext& context) -> std::vector<Tensor> {
    if (!context.grad_outputs[0].defined()) return {Tensor()};
    return {dispatch(ops::max_pool2d_backward, {context.grad_outputs[0], context.saved_outputs[1]},
                     with_input_size(context.attrs, context.input_specs[0].sizes))[0]};
  };
  op.cost = [](const std::vector<Tensor>& in, const std::vector<Tensor>& out, const Attrs& attrs) {
    auto kernel = attrs.get<std::vector<int64_t>>("kernel_size");
    return OpCost{static_cast<double>(out[0].numel()) * kernel[0] * kernel[1],
                  total_bytes(in, out)};
  };
  op.splits = {{0, {0}}};
}

void register_max_pool2d_backward() {
  // max_pool2d_backward: grad (N, C, OH, OW), indices -> grad of x (input_size).
  OpDef& op = OpRegistry::get().define(ops::max_pool2d_backward);
  op.kind = OpKind::kPool;
  op.autocast = AutocastPolicy::kWiden;
  op.shape = [](const std::vector<Tensor>& in, const Attrs& attrs) {
    auto sizes = input_size_attr(attrs);
    auto [rows, cols] = pool_axes("max_pool2d", sizes, attrs, true);
    Shape pooled{sizes[0], sizes[1], rows.output, cols.output};
    check_grad("max_pool2d_backward", in.at(0), pooled);
    TESSEL_CHECK(in.at(1).dtype() == DType::kInt64 && in[1].sizes() == pooled,
                 "max_pool2d_backward: indices must be i64 of shape ", shape_str(pooled), ", got ",
                 dtype_name(in[1].dtype()), " ", shape_str(in[1].sizes()));
    return std::vector<OutputSpec>{{Shape(sizes.begin(), sizes.end()), in[0].dtype()}};
  };
  op.kernels[kCpu] =
      float_kernel("max_pool2d_backward", max_pool_backward<float>, max_pool_backward<double>);
  op.cost = [](const std::vector<Tensor>& in, const std::vector<Tensor>& out, const Attrs&) {
    return OpCost{static_cast<double>(in[0].numel()), total_bytes(in, out)};
  };
  op.splits = {{0, {0, 0}}};
}

void register_avg_pool2d() {
  // avg_pool2d: x (N, C, H, W) -> (N, C, OH, OW).
  OpDef& op = OpRegistry::get().define(ops::avg_pool2d);
  op.kind = OpKind::kPool;
  op.autocast = AutocastPolicy::kWiden;
  op.planner = {ParallelSplit::kChannels, "pool"};
  op.shape = [](const std::vector<Tensor>& in, const Attrs& attrs) {
    check_pool_input("avg_pool2d", in.at(0));
    auto [rows, cols] = pool_axes("avg_pool2d", in[0].sizes(), attrs, false);
    return std::vector<OutputSpec>{
        {{in[0].size(0), in[0].size(1), rows.output, cols.output}, in[0].dtype()}};
  };
  op.kernels[kCpu] = float_kernel("avg_pool2d", avg_pool_forward<float>, avg_pool_forward<double>);
  op.backward = [](const BackwardContext& context) -> std::vector<Tensor> {
    return {dispatch(ops::avg_pool2d_backward, {context.grad_outputs[0]},
                     with_input_size(context.attrs, context.input_specs[0].sizes))[0]};
  };
  op.cost = [](const std::vector<Tensor>& in, const std::vector<Tensor>& out, const Attrs& attrs) {
    auto kernel = attrs.get<std::vector<int64_t>>("kernel_size");
    return OpCost{static_cast<double>(out[0].numel()) * kernel[0] * kernel[1],
                  total_bytes(in, out)};
  };
  op.splits = {{0, {0}}};
}

void register_avg_pool2d_backward() {
  OpDef& op = OpRegistry::get().define(ops::avg_pool2d_backward);
  op.kind = OpKind::kPool;
  op.autocast = AutocastPolicy::kWiden;
  op.shape = [](const std::vector<Tensor>& in, const Attrs& attrs) {
    auto sizes = input_size_attr(attrs);
    auto [rows, cols] = pool_axes("avg_pool2d", sizes, attrs, false);
    check_grad("avg_pool2d_backward", in.at(0), {sizes[0], sizes[1], rows.output, cols.output});
    return std::vector<OutputSpec>{{Shape(sizes.begin(), sizes.end()), in[0].dtype()}};
  };
  op.kernels[kCpu] =
      float_kernel("avg_pool2d_backward", avg_pool_backward<float>, avg_pool_backward<double>);
  op.cost = [](const std::vector<Tensor>& in, const std::vector<Tensor>& out, const Attrs& attrs) {
    auto kernel = attrs.get<std::vector<int64_t>>("kernel_size");
    return OpCost{static_cast<double>(in[0].numel()) * kernel[0] * kernel[1], total_bytes(in, out)};
  };
  op.splits = {{0, {0}}};
}

void register_adaptive_avg_pool2d() {
  // adaptive_avg_pool2d: x (N, C, H, W) -> (N, C, output_size[0], output_size[1]).
  OpDef& op = OpRegistry::get().define(ops::adaptive_avg_pool2d);
  op.kind = OpKind::kPool;
  op.autocast = AutocastPolicy::kWiden;
  op.planner.split = ParallelSplit::kChannels;
  op.shape = [](const std::vector<Tensor>& in, const Attrs& attrs) {
    check_pool_input("adaptive_avg_pool2d", in.at(0));
    auto sizes = adaptive_output_size(attrs);
    TESSEL_CHECK(in[0].size(2) > 0 && in[0].size(3) > 0,
                 "adaptive_avg_pool2d: input planes must not be empty, got shape ",
                 shape_str(in[0].sizes()));
    return std::vector<OutputSpec>{
        {{in[0].size(0), in[0].size(1), sizes[0], sizes[1]}, in[0].dtype()}};
  };
  op.kernels[kCpu] = float_kernel("adaptive_avg_pool2d", adaptive_avg_forward<float>,
                                  adaptive_avg_forward<double>);
  op.backward = [](const BackwardContext& context) -> std::vector<Tensor> {
    return {dispatch(ops::adaptive_avg_pool2d_backward, {context.grad_outputs[0]},
                     with_input_size(context.attrs, context.input_specs[0].sizes))[0]};
  };
  op.cost = [](const std::vector<Tensor>& in, const std::vector<Tensor>& out, const Attrs&) {
    return OpCost{static_cast<double>(in[0].numel()), total_bytes(in, out)};
  };
  op.splits = {{0, {0}}};
}

void register_adaptive_avg_pool2d_backward() {
  OpDef& op = OpRegistry::get().define(ops::adaptive_avg_pool2d_backward);
  op.kind = OpKind::kPool;
  op.autocast = AutocastPolicy::kWiden;
  op.shape = [](const std::vector<Tensor>& in, const Attrs& attrs) {
    auto sizes = input_size_attr(attrs);
    auto out = adaptive_output_size(attrs);
    check_grad("adaptive_avg_pool2d_backward", in.at(0), {sizes[0], sizes[1], out[0], out[1]});
    return std::vector<OutputSpec>{{Shape(sizes.begin(), sizes.end()), in[0].dtype()}};
  };
  op.kernels[kCpu] = float_kernel("adaptive_avg_pool2d_backward", adaptive_avg_backward<float>,
                                  adaptive_avg_backward<double>);
  op.cost = [](const std::vector<Tensor>& in, const std::vector<Tensor>& out, const Attrs&) {
    return OpCost{static_cast<double>(out[0].numel()), total_bytes(in, out)};
  };
  op.splits = {{0, {0}}};
}

}  // namespace

TESSEL_REGISTER_OPS(pool) {
  register_max_pool2d();
  register_max_pool2d_backward();
  register_avg_pool2d();
  register_avg_pool2d_backward();
  register_adaptive_avg_pool2d();
  register_adaptive_avg_pool2d_backward();
}

Tensor max_pool2d(const Tensor& x, std::vector<int64_t> kernel_size, std::vector<int64_t> stride,
                  std::vector<int64_t> padding, std::vector<int64_t> dilation, bool ceil_mode) {
  kernel_size = pool_pair(std::move(kernel_size), "max_pool2d", "kernel_size");
  stride = stride.empty() ? kernel_size : pool_pair(std::move(stride), "max_pool2d", "stride");
  Attrs attrs{{"kernel_size", kernel_size},
              {"stride", stride},
              {"padding", pool_pair(std::move(padding), "max_pool2d", "padding")},
              {"dilation", pool_pair(std::move(dilation), "max_pool2d", "dilation")},
              {"ceil_mode", ceil_mode}};
  return with_batch("max_pool2d", x, [&](const Tensor& batched) {
    return dispatch(ops::max_pool2d, {batched}, attrs)[0];
  });
}

Tensor avg_pool2d(const Tensor& x, std::vector<int64_t> kernel_size, std::vector<int64_t> stride,
                  std::vector<int64_t> padding, bool ceil_mode, bool count_include_pad) {
  kernel_size = pool_pair(std::move(kernel_size), "avg_pool2d", "kernel_size");
  stride = stride.empty() ? kernel_size : pool_pair(std::move(stride), "avg_pool2d", "stride");
  Attrs attrs{{"kernel_size", kernel_size},
              {"stride", stride},
              {"padding", pool_pair(std::move(padding), "avg_pool2d", "padding")},
              {"ceil_mode", ceil_mode},
              {"count_include_pad", count_include_pad}};
  return with_batch("avg_pool2d", x, [&](const Tensor& batched) {
    return dispatch(ops::avg_pool2d, {batched}, attrs)[0];
  });
}

Tensor adaptive_avg_pool2d(const Tensor& x, std::vector<int64_t> output_size) {
  Attrs attrs{
      {"output_size", pool_pair(std::move(output_size), "adaptive_avg_pool2d", "output_size")}};
  return with_batch("adaptive_avg_pool2d", x, [&](const Tensor& batched) {
    return dispatch(ops::adaptive_avg_pool2d, {batched}, attrs)[0];
  });
}

}  // namespace tessel
