// Pooling over NCHW planes with PyTorch's window rules: max_pool2d (which also outputs the i64
// index of each maximum inside its input plane, so its backward is a scatter), avg_pool2d and
// adaptive_avg_pool2d, each with a backward op: their definitions (shape rules, backward, cost,
// splits). The CPU kernels are in ops/cpu/pool.cc.
#include "ops/pool.h"

#include <utility>
#include <vector>

#include "ops/cpu/kernels.h"
#include "ops/ops.h"
#include "ops/registry_helpers.h"

namespace tessel {

namespace {

constexpr int kCpu = static_cast<int>(DeviceType::kCpu);

using cpu::attr_pair;
using cpu::pool_axes;

void check_pool_input(const char* op, const Tensor& x) {
  TESSEL_CHECK(x.dim() == 4, op, ": expected a 4-D input (N, C, H, W), got shape ",
               shape_str(x.sizes()));
  TESSEL_CHECK(x.dtype() == DType::kFloat32 || x.dtype() == DType::kFloat64, op,
               ": expected a f32 or f64 input, got ", dtype_name(x.dtype()),
               " (convert with .to(DType::kFloat32))");
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

Attrs with_input_size(const Attrs& attrs, const Shape& sizes) {
  Attrs result = attrs;
  result.set("input_size", std::vector<int64_t>(sizes.begin(), sizes.end()));
  return result;
}

std::vector<int64_t> adaptive_output_size(const Attrs& attrs) {
  auto sizes = attr_pair(attrs, "adaptive_avg_pool2d", "output_size");
  TESSEL_CHECK(sizes[0] > 0 && sizes[1] > 0,
               "adaptive_avg_pool2d: output_size must be positive, got ", sizes);
  return sizes;
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
  op.kernels[kCpu] = cpu::max_pool2d_kernel;
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
  op.kernels[kCpu] = cpu::max_pool2d_backward_kernel;
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
  op.kernels[kCpu] = cpu::avg_pool2d_kernel;
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
  op.kernels[kCpu] = cpu::avg_pool2d_backward_kernel;
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
  op.kernels[kCpu] = cpu::adaptive_avg_pool2d_kernel;
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
  op.kernels[kCpu] = cpu::adaptive_avg_pool2d_backward_kernel;
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
    return first_output(dispatch(ops::max_pool2d, {batched}, attrs));
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
    return first_output(dispatch(ops::avg_pool2d, {batched}, attrs));
  });
}

Tensor adaptive_avg_pool2d(const Tensor& x, std::vector<int64_t> output_size) {
  Attrs attrs{
      {"output_size", pool_pair(std::move(output_size), "adaptive_avg_pool2d", "output_size")}};
  return with_batch("adaptive_avg_pool2d", x, [&](const Tensor& batched) {
    return first_output(dispatch(ops::adaptive_avg_pool2d, {batched}, attrs));
  });
}

}  // namespace tessel
