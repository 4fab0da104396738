// Reductions (sum, mean, max, min, argmax, var) and softmax / log_softmax: their definitions
// (shape rules, backward, cost). The CPU kernels are in ops/cpu/reduce.cc.
#include "ops/reduce.h"

#include <string>
#include <vector>

#include "ops/cpu/kernels.h"
#include "ops/math/reduce_layout.h"
#include "ops/ops.h"
#include "ops/registry_helpers.h"

namespace tessel {

namespace {

constexpr int kCpu = static_cast<int>(DeviceType::kCpu);

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
  op.kernels[kCpu] = cpu::sum_mean_kernel(name, is_mean);
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
    op.kernels[kCpu] = cpu::extremum_dim_kernel(name, is_max);
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
    op.kernels[kCpu] = cpu::extremum_all_kernel(all_name, is_max);
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
  op.kernels[kCpu] = cpu::argmax_kernel;
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
  op.kernels[kCpu] = cpu::var_kernel;
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
  op.kernels[kCpu] = cpu::softmax_kernel(name, log_form);
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
  // Rows are independent along the batch unless the softmax runs over it.
  op.splits = {{0, {0}, [](const std::vector<Tensor>& inputs, const Attrs& attrs) {
                  const int64_t rank = inputs.at(0).dim();
                  const int64_t dim = attrs.get<int64_t>("dim");
                  return rank >= 2 && (dim < 0 ? dim + rank : dim) != 0;
                }}};
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
  return first_output(dispatch(ops::sum, {x}, Attrs{{"dims", dims}, {"keepdim", keepdim}}));
}

Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return first_output(dispatch(ops::mean, {x}, Attrs{{"dims", dims}, {"keepdim", keepdim}}));
}

Tensor max(const Tensor& x, int64_t dim, bool keepdim) {
  return first_output(dispatch(ops::max, {x}, Attrs{{"dim", dim}, {"keepdim", keepdim}}));
}

Tensor min(const Tensor& x, int64_t dim, bool keepdim) {
  return first_output(dispatch(ops::min, {x}, Attrs{{"dim", dim}, {"keepdim", keepdim}}));
}

Tensor max(const Tensor& x) { return first_output(dispatch(ops::max_all, {x})); }
Tensor min(const Tensor& x) { return first_output(dispatch(ops::min_all, {x})); }

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  return first_output(dispatch(ops::argmax, {x}, Attrs{{"dim", dim}, {"keepdim", keepdim}}));
}

Tensor var(const Tensor& x, const std::vector<int64_t>& dims, bool unbiased, bool keepdim) {
  return dispatch(ops::var, {x},
                  Attrs{{"dims", dims}, {"unbiased", unbiased}, {"keepdim", keepdim}})[0];
}

Tensor softmax(const Tensor& x, int64_t dim) {
  return first_output(dispatch(ops::softmax, {x}, Attrs{{"dim", dim}}));
}

Tensor log_softmax(const Tensor& x, int64_t dim) {
  return first_output(dispatch(ops::log_softmax, {x}, Attrs{{"dim", dim}}));
}

}  // namespace tessel
