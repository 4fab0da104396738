// Element-wise ops: binary arithmetic with broadcasting and type promotion, scalar forms,
// unary math and activations, clamp, where / masked_fill and comparisons: their definitions
// (shape rules, backward, cost, splits). The CPU kernels are in ops/cpu/elementwise.cc.
#include "ops/elementwise.h"

#include <cmath>
#include <string>
#include <vector>

#include "ops/cpu/kernels.h"
#include "ops/math/elementwise.h"
#include "ops/ops.h"
#include "ops/registry_helpers.h"

namespace tessel {

namespace {

constexpr int kCpu = static_cast<int>(DeviceType::kCpu);

using cpu::gelu_uses_tanh;
using math::Binary;
using math::Compare;
using math::ScalarOp;
using math::Unary;

// FLOPs per output element plus every byte read and written.
CostFn elementwise_cost(double flops_per_element) {
  return [flops_per_element](const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                             const Attrs&) {
    double bytes = 0;
    for (const auto& input : inputs)
      if (input.defined()) bytes += static_cast<double>(input.nbytes());
    for (const auto& output : outputs) bytes += static_cast<double>(output.nbytes());
    return OpCost{flops_per_element * static_cast<double>(outputs.at(0).numel()), bytes};
  };
}

// A zero of `like`'s dtype and device, broadcast by the ops it feeds.
Tensor zero_scalar(const Tensor& like) {
  return full({}, 0.0, TensorOptions(like.dtype()).device(like.device()));
}

Tensor scalar_like(const Tensor& like, double value) {
  return full({}, value, TensorOptions(like.dtype()).device(like.device()));
}

void check_two_inputs(const char* op, const std::vector<Tensor>& inputs) {
  TESSEL_CHECK(inputs.size() == 2 && inputs[0].defined() && inputs[1].defined(), op,
               ": expected two defined tensors");
}

// ---- binary ops ----

// The result dtype of a binary op: promotion, except true division of integers gives f32.
DType binary_result_dtype(Binary kind, DType a, DType b) {
  DType result = promote_types(a, b);
  if (kind == Binary::kDiv && is_integral(result)) return DType::kFloat32;
  return result;
}

// Backward of maximum / minimum for one side: the gradient where that side wins, half on ties
// (PyTorch's rule).
Tensor extremum_grad(const Tensor& grad, const Tensor& self, const Tensor& other, bool is_max) {
  Tensor half_on_ties = where(eq(self, other), mul(grad, 0.5), grad);
  Tensor loses = is_max ? lt(self, other) : gt(self, other);
  return masked_fill(half_on_ties, loses, 0.0);
}

void register_binary(const OpHandle& handle, Binary kind, double flops) {
  const char* name = handle.name();
  OpDef& op = OpRegistry::get().define(handle);
  op.kind = kind == Binary::kPow ? OpKind::kActivation : OpKind::kPointwise;
  op.autocast = AutocastPolicy::kWiden;
  op.planner.split = ParallelSplit::kPointwise;
  op.shape = [name, kind](const std::vector<Tensor>& inputs, const Attrs&) {
    check_two_inputs(name, inputs);
    Shape sizes = broadcast_shapes(inputs[0].sizes(), inputs[1].sizes(), name);
    DType dtype = binary_result_dtype(kind, inputs[0].dtype(), inputs[1].dtype());
    TESSEL_CHECK(dtype != DType::kBFloat16 && dtype != DType::kFloat16, name,
                 ": expected f32, f64 or integer tensors, got ", dtype_name(inputs[0].dtype()),
                 " and ", dtype_name(inputs[1].dtype()), " (convert with .to(DType::kFloat32))");
    TESSEL_CHECK(dtype != DType::kBool || math::binary_allows_bool(kind), name,
                 ": not supported for two bool tensors");
    return one_output(std::move(sizes), dtype);
  };
  op.kernels[kCpu] = [kind](KernelContext& context) { cpu::binary_kernel(kind, context); };
  op.cost = elementwise_cost(flops);
  op.splits = {{0, {0, 0}}};
  switch (kind) {
    case Binary::kAdd:
    case Binary::kSub:
      op.backward = [kind](const BackwardContext& context) -> std::vector<Tensor> {
        const Tensor& grad = context.grad_outputs[0];
        if (!grad.defined()) return {Tensor(), Tensor()};
        double alpha = context.attrs.get_or<double>("alpha", 1.0);
        if (kind == Binary::kSub) alpha = -alpha;
        Tensor grad_b;
        if (context.needs_input_grad[1]) grad_b = alpha == 1.0 ? grad : mul(grad, alpha);
        return {grad, grad_b};
      };
      break;
    case Binary::kMul:
      op.save_inputs = {0, 1};
      op.backward = [](const BackwardContext& context) -> std::vector<Tensor> {
        const Tensor& grad = context.grad_outputs[0];
        std::vector<Tensor> grads(2);
        if (!grad.defined()) return grads;
        if (context.needs_input_grad[0]) grads[0] = mul(grad, context.saved_inputs[1]);
        if (context.needs_input_grad[1]) grads[1] = mul(grad, context.saved_inputs[0]);
        return grads;
      };
      break;
    case Binary::kDiv:
      op.save_inputs = {0, 1};
      op.backward = [](const BackwardContext& context) -> std::vector<Tensor> {
        const Tensor& grad = context.grad_outputs[0];
        const Tensor& a = context.saved_inputs[0];
        const Tensor& b = context.saved_inputs[1];
        std::vector<Tensor> grads(2);
        if (!grad.defined()) return grads;
        if (context.needs_input_grad[0]) grads[0] = div(grad, b);
        if (context.needs_input_grad[1]) grads[1] = neg(div(mul(grad, a), mul(b, b)));
        return grads;
      };
      break;
    case Binary::kPow:
      op.save_inputs = {0, 1};
      op.save_outputs = {0};
      op.backward = [](const BackwardContext& context) -> std::vector<Tensor> {
        const Tensor& grad = context.grad_outputs[0];
        const Tensor& base = context.saved_inputs[0];
        const Tensor& exponent = context.saved_inputs[1];
        std::vector<Tensor> grads(2);
        if (!grad.defined()) return grads;
        if (context.needs_input_grad[0]) {
          // d/da a^b = b * a^(b-1); zero where b == 0 (PyTorch's rule, avoids 0 * inf).
          Tensor local = mul(exponent, pow(base, sub(exponent, 1.0)));
          grads[0] = mul(grad, masked_fill(local, eq(exponent, zero_scalar(exponent)), 0.0));
        }
        if (context.needs_input_grad[1]) {
          // d/db a^b = a^b * log(a); zero where a == 0 and b >= 0.
          Tensor local = mul(context.saved_outputs[0], log(base));
          Tensor base_zero = mul(eq(base, zero_scalar(base)), ge(exponent, zero_scalar(exponent)));
          grads[1] = mul(grad, masked_fill(local, base_zero, 0.0));
        }
        return grads;
      };
      break;
    case Binary::kMaximum:
    case Binary::kMinimum:
      op.save_inputs = {0, 1};
      op.backward = [kind](const BackwardContext& context) -> std::vector<Tensor> {
        const Tensor& grad = context.grad_outputs[0];
        const Tensor& a = context.saved_inputs[0];
        const Tensor& b = context.saved_inputs[1];
        bool is_max = kind == Binary::kMaximum;
        std::vector<Tensor> grads(2);
        if (!grad.defined()) return grads;
        if (context.needs_input_grad[0]) grads[0] = extremum_grad(grad, a, b, is_max);
        if (context.needs_input_grad[1]) grads[1] = extremum_grad(grad, b, a, is_max);
        return grads;
      };
      break;
  }
}

// ---- comparisons (bool result, not differentiable) ----

void register_comparison(const OpHandle& handle, Compare kind) {
  const char* name = handle.name();
  OpDef& op = OpRegistry::get().define(handle);
  op.kind = OpKind::kPointwise;
  op.autocast = AutocastPolicy::kWiden;
  op.planner.split = ParallelSplit::kPointwise;
  op.shape = [name](const std::vector<Tensor>& inputs, const Attrs&) {
    check_two_inputs(name, inputs);
    return std::vector<OutputSpec>{
        {broadcast_shapes(inputs[0].sizes(), inputs[1].sizes(), name), DType::kBool}};
  };
  op.kernels[kCpu] = cpu::comparison_kernel(name, kind);
  op.cost = elementwise_cost(1);
  op.splits = {{0, {0, 0}}};
}

// ---- scalar forms: the tensor's dtype is kept ----

// Attr: value (exponent for pow_scalar).
void register_scalar(const OpHandle& handle, ScalarOp kind, const char* attr) {
  const char* name = handle.name();
  OpDef& op = OpRegistry::get().define(handle);
  op.kind = kind == ScalarOp::kPow ? OpKind::kActivation : OpKind::kPointwise;
  op.autocast = AutocastPolicy::kWiden;
  op.planner.split = ParallelSplit::kPointwise;
  op.shape = [](const std::vector<Tensor>& inputs, const Attrs&) {
    return one_output(inputs.at(0).sizes(), inputs[0].dtype());
  };
  op.kernels[kCpu] = cpu::scalar_kernel(name, kind, attr);
  op.cost = elementwise_cost(kind == ScalarOp::kPow ? 10 : 1);
  op.splits = {{0, {0}}};
  if (kind == ScalarOp::kAdd) {
    op.backward = [](const BackwardContext& context) -> std::vector<Tensor> {
      return {context.grad_outputs[0]};
    };
  } else if (kind == ScalarOp::kMul || kind == ScalarOp::kDiv) {
    op.backward = [kind](const BackwardContext& context) -> std::vector<Tensor> {
      const Tensor& grad = context.grad_outputs[0];
      if (!grad.defined()) return {Tensor()};
      double value = context.attrs.get<double>("value");
      return {kind == ScalarOp::kMul ? mul(grad, value) : div(grad, value)};
    };
  } else {
    op.save_inputs = {0};
    op.backward = [](const BackwardContext& context) -> std::vector<Tensor> {
      const Tensor& grad = context.grad_outputs[0];
      if (!grad.defined()) return {Tensor()};
      double exponent = context.attrs.get<double>("exponent");
      if (exponent == 0.0) return {zeros_like(grad)};
      const Tensor& x = context.saved_inputs[0];
      Tensor local = exponent == 2.0 ? mul(x, 2.0) : mul(pow(x, exponent - 1.0), exponent);
      return {mul(grad, local)};
    };
  }
}

// ---- unary ops ----

// Priced apart from arithmetic by the planner (OpKind::kActivation).
bool is_transcendental(Unary kind) {
  return kind != Unary::kNeg && kind != Unary::kAbs && kind != Unary::kRelu;
}

void register_unary(const OpHandle& handle, Unary kind, double flops) {
  const char* name = handle.name();
  OpDef& op = OpRegistry::get().define(handle);
  op.kind = is_transcendental(kind) ? OpKind::kActivation : OpKind::kPointwise;
  op.autocast = AutocastPolicy::kWiden;
  op.planner.split = ParallelSplit::kPointwise;
  op.shape = [name, kind](const std::vector<Tensor>& inputs, const Attrs&) {
    TESSEL_CHECK(inputs.size() == 1 && inputs[0].defined(), name, ": expected one tensor");
    DType dtype = inputs[0].dtype();
    bool ok = is_floating(dtype) ? (dtype == DType::kFloat32 || dtype == DType::kFloat64)
                                 : (math::unary_allows_integers(kind) && dtype != DType::kBool);
    TESSEL_CHECK(ok, name, ": expected a f32 or f64 tensor",
                 math::unary_allows_integers(kind) ? " (or an integer one)" : "", ", got ",
                 dtype_name(dtype));
    return one_output(inputs[0].sizes(), dtype);
  };
  op.kernels[kCpu] = cpu::unary_kernel(name, kind);
  op.cost = elementwise_cost(flops);
  op.splits = {{0, {0}}};
  switch (kind) {
    case Unary::kNeg:
      op.backward = [](const BackwardContext& context) -> std::vector<Tensor> {
        if (!context.grad_outputs[0].defined()) return {Tensor()};
        return {neg(context.grad_outputs[0])};
      };
      break;
    case Unary::kAbs:
      op.save_inputs = {0};
      op.backward = [](const BackwardContext& context) -> std::vector<Tensor> {
        const Tensor& grad = context.grad_outputs[0];
        const Tensor& x = context.saved_inputs[0];
        if (!grad.defined()) return {Tensor()};
        // grad * sign(x), zero at 0.
        Tensor zero = zero_scalar(x);
        return {sub(mul(grad, gt(x, zero)), mul(grad, lt(x, zero)))};
      };
      break;
    case Unary::kExp:
      op.save_outputs = {0};
      op.backward = [](const BackwardContext& context) -> std::vector<Tensor> {
        if (!context.grad_outputs[0].defined()) return {Tensor()};
        return {mul(context.grad_outputs[0], context.saved_outputs[0])};
      };
      break;
    case Unary::kLog:
      op.save_inputs = {0};
      op.backward = [](const BackwardContext& context) -> std::vector<Tensor> {
        if (!context.grad_outputs[0].defined()) return {Tensor()};
        return {div(context.grad_outputs[0], context.saved_inputs[0])};
      };
      break;
    case Unary::kSqrt:
      op.save_outputs = {0};
      op.backward = [](const BackwardContext& context) -> std::vector<Tensor> {
        if (!context.grad_outputs[0].defined()) return {Tensor()};
        return {div(context.grad_outputs[0], mul(context.saved_outputs[0], 2.0))};
      };
      break;
    case Unary::kRsqrt:
      op.save_outputs = {0};
      op.backward = [](const BackwardContext& context) -> std::vector<Tensor> {
        if (!context.grad_outputs[0].defined()) return {Tensor()};
        const Tensor& y = context.saved_outputs[0];
        // d/dx x^(-1/2) = -1/2 y^3
        return {mul(context.grad_outputs[0], mul(mul(y, mul(y, y)), -0.5))};
      };
      break;
    case Unary::kTanh:
      op.save_outputs = {0};
      op.backward = [](const BackwardContext& context) -> std::vector<Tensor> {
        if (!context.grad_outputs[0].defined()) return {Tensor()};
        const Tensor& y = context.saved_outputs[0];
        // 1 - y^2
        return {mul(context.grad_outputs[0], neg(sub(mul(y, y), 1.0)))};
      };
      break;
    case Unary::kSigmoid:
      op.save_outputs = {0};
      op.backward = [](const BackwardContext& context) -> std::vector<Tensor> {
        if (!context.grad_outputs[0].defined()) return {Tensor()};
        const Tensor& y = context.saved_outputs[0];
        // y (1 - y)
        return {mul(context.grad_outputs[0], mul(y, neg(sub(y, 1.0))))};
      };
      break;
    case Unary::kRelu:
      op.save_outputs = {0};
      op.backward = [](const BackwardContext& context) -> std::vector<Tensor> {
        if (!context.grad_outputs[0].defined()) return {Tensor()};
        // One fused pass instead of a comparison into a bool tensor and a promoting product,
        // into the incoming gradient when nothing else holds it.
        const Tensor& grad = context.grad_outputs[0];
        const Tensor& y = context.saved_outputs[0];
        return {dispatch(ops::relu_backward, {grad, y}, {},
                         context.reusable_grad(0, {y.sizes(), y.dtype()}))[0]};
      };
      break;
  }
}

// ---- gelu ----

void register_gelu() {
  {
    OpDef& op = OpRegistry::get().define(ops::gelu);
    op.kind = OpKind::kActivation;
    op.autocast = AutocastPolicy::kWiden;
    op.planner.split = ParallelSplit::kPointwise;
    op.shape = [](const std::vector<Tensor>& inputs, const Attrs& attrs) {
      gelu_uses_tanh(attrs);
      visit_float_dtype(inputs.at(0).dtype(), "gelu", [](auto) {});
      return one_output(inputs[0].sizes(), inputs[0].dtype());
    };
    op.kernels[kCpu] = cpu::gelu_kernel;
    op.save_inputs = {0};
    op.backward = [](const BackwardContext& context) -> std::vector<Tensor> {
      if (!context.grad_outputs[0].defined()) return {Tensor()};
      return {dispatch(ops::gelu_backward, {context.grad_outputs[0], context.saved_inputs[0]},
                       context.attrs)[0]};
    };
    op.cost = elementwise_cost(20);
    op.splits = {{0, {0}}};
  }
  {
    // inputs {grad, x}: grad * gelu'(x). Attr approximate, as the forward.
    OpDef& op = OpRegistry::get().define(ops::gelu_backward);
    op.kind = OpKind::kActivation;
    op.autocast = AutocastPolicy::kWiden;
    op.shape = [](const std::vector<Tensor>& inputs, const Attrs& attrs) {
      check_two_inputs("gelu_backward", inputs);
      gelu_uses_tanh(attrs);
      TESSEL_CHECK(inputs[0].dtype() == inputs[1].dtype(), "gelu_backward: grad is ",
                   dtype_name(inputs[0].dtype()), " but x is ", dtype_name(inputs[1].dtype()));
      return std::vector<OutputSpec>{
          {broadcast_shapes(inputs[0].sizes(), inputs[1].sizes(), "gelu_backward"),
           inputs[1].dtype()}};
    };
    op.kernels[kCpu] = cpu::gelu_backward_kernel;
    op.cost = elementwise_cost(25);
    op.splits = {{0, {0, 0}}};
  }
}

// ---- relu_backward ----

// inputs {grad, y} (y = relu(x)): grad where y > 0, else 0 (PyTorch's threshold_backward).
void register_relu_backward() {
  OpDef& op = OpRegistry::get().define(ops::relu_backward);
  op.kind = OpKind::kPointwise;
  op.autocast = AutocastPolicy::kWiden;
  op.shape = [](const std::vector<Tensor>& inputs, const Attrs&) {
    check_two_inputs("relu_backward", inputs);
    visit_float_dtype(inputs[1].dtype(), "relu_backward", [](auto) {});
    TESSEL_CHECK(inputs[0].dtype() == inputs[1].dtype(), "relu_backward: grad is ",
                 dtype_name(inputs[0].dtype()), " but the relu output is ",
                 dtype_name(inputs[1].dtype()));
    return std::vector<OutputSpec>{
        {broadcast_shapes(inputs[0].sizes(), inputs[1].sizes(), "relu_backward"),
         inputs[1].dtype()}};
  };
  op.kernels[kCpu] = cpu::relu_backward_kernel;
  op.save_inputs = {1};
  // Linear in grad, piecewise constant in y: the same mask again, nothing for y.
  op.backward = [](const BackwardContext& context) -> std::vector<Tensor> {
    if (!context.grad_outputs[0].defined() || !context.needs_input_grad[0])
      return {Tensor(), Tensor()};
    return {dispatch(ops::relu_backward, {context.grad_outputs[0], context.saved_inputs[1]})[0],
            Tensor()};
  };
  op.cost = elementwise_cost(1);
  op.splits = {{0, {0, 0}}};
}

// ---- clamp ----

void register_clamp() {
  // Attrs: min, max (either may be -inf / +inf).
  OpDef& op = OpRegistry::get().define(ops::clamp);
  op.kind = OpKind::kPointwise;
  op.autocast = AutocastPolicy::kWiden;
  op.planner.split = ParallelSplit::kPointwise;
  op.shape = [](const std::vector<Tensor>& inputs, const Attrs& attrs) {
    DType dtype = inputs.at(0).dtype();
    TESSEL_CHECK(dtype != DType::kBool && dtype != DType::kBFloat16 && dtype != DType::kFloat16,
                 "clamp: expected a f32, f64 or integer tensor, got ", dtype_name(dtype));
    TESSEL_CHECK(!std::isnan(attrs.get<double>("min")) && !std::isnan(attrs.get<double>("max")),
                 "clamp: bounds must not be NaN");
    return one_output(inputs[0].sizes(), dtype);
  };
  op.kernels[kCpu] = cpu::clamp_kernel;
  op.save_inputs = {0};
  op.backward = [](const BackwardContext& context) -> std::vector<Tensor> {
    const Tensor& grad = context.grad_outputs[0];
    if (!grad.defined()) return {Tensor()};
    const Tensor& x = context.saved_inputs[0];
    // The gradient passes where min <= x <= max (PyTorch's rule).
    Tensor low = scalar_like(x, context.attrs.get<double>("min"));
    Tensor high = scalar_like(x, context.attrs.get<double>("max"));
    return {mul(mul(grad, ge(x, low)), le(x, high))};
  };
  op.cost = elementwise_cost(2);
  op.splits = {{0, {0}}};
}

// ---- where and masked_fill ----

void check_mask(const char* op, const char* argument, const Tensor& mask) {
  TESSEL_CHECK(mask.dtype() == DType::kBool || mask.dtype() == DType::kUInt8, op, ": ", argument,
               " must be bool or u8, got ", dtype_name(mask.dtype()));
}

void register_selection() {
  {
    OpDef& op = OpRegistry::get().define(ops::where);
    op.kind = OpKind::kPointwise;
    op.autocast = AutocastPolicy::kWiden;
    op.planner.split = ParallelSplit::kPointwise;
    op.shape = [](const std::vector<Tensor>& inputs, const Attrs&) {
      TESSEL_CHECK(inputs.size() == 3, "where: expected {condition, a, b}");
      check_mask("where", "condition", inputs[0]);
      Shape sizes = broadcast_shapes(inputs[1].sizes(), inputs[2].sizes(), "where");
      sizes = broadcast_shapes(inputs[0].sizes(), sizes, "where (condition)");
      return std::vector<OutputSpec>{{sizes, promote_types(inputs[1].dtype(), inputs[2].dtype())}};
    };
    op.kernels[kCpu] = cpu::where_kernel;
    op.save_inputs = {0};
    op.backward = [](const BackwardContext& context) -> std::vector<Tensor> {
      const Tensor& grad = context.grad_outputs[0];
      std::vector<Tensor> grads(3);
      if (!grad.defined()) return grads;
      const Tensor& condition = context.saved_inputs[0];
      Tensor zero = zero_scalar(grad);
      if (context.needs_input_grad[1]) grads[1] = where(condition, grad, zero);
      if (context.needs_input_grad[2]) grads[2] = where(condition, zero, grad);
      return grads;
    };
    op.cost = elementwise_cost(1);
    op.splits = {{0, {0, 0, 0}}};
  }
  {
    // inputs {x, mask}, attr value.
    OpDef& op = OpRegistry::get().define(ops::masked_fill);
    op.kind = OpKind::kPointwise;
    op.autocast = AutocastPolicy::kWiden;
    op.planner.split = ParallelSplit::kPointwise;
    op.shape = [](const std::vector<Tensor>& inputs, const Attrs&) {
      check_two_inputs("masked_fill", inputs);
      check_mask("masked_fill", "mask", inputs[1]);
      TESSEL_CHECK(broadcastable_to(inputs[1].sizes(), inputs[0].sizes()),
                   "masked_fill: mask of shape ", shape_str(inputs[1].sizes()),
                   " cannot be broadcast to input shape ", shape_str(inputs[0].sizes()));
      return one_output(inputs[0].sizes(), inputs[0].dtype());
    };
    op.kernels[kCpu] = cpu::masked_fill_kernel;
    op.save_inputs = {1};
    op.backward = [](const BackwardContext& context) -> std::vector<Tensor> {
      const Tensor& grad = context.grad_outputs[0];
      if (!grad.defined() || !context.needs_input_grad[0]) return {Tensor(), Tensor()};
      return {masked_fill(grad, context.saved_inputs[1], 0.0), Tensor()};
    };
    op.cost = elementwise_cost(1);
    op.splits = {{0, {0, 0}}};
  }
}

Tensor binary(const OpHandle& op, const Tensor& a, const Tensor& b) {
  return first_output(dispatch(op, inputs_of(a, b)));
}

Tensor scalar_op(const OpHandle& op, const Tensor& a, double value) {
  return first_output(dispatch(op, inputs_of(a), Attrs{{"value", value}}));
}

Tensor unary(const OpHandle& op, const Tensor& x) {
  return first_output(dispatch(op, inputs_of(x)));
}

}  // namespace

TESSEL_REGISTER_OPS(elementwise) {
  register_binary(ops::add, Binary::kAdd, 1);
  register_binary(ops::sub, Binary::kSub, 1);
  register_binary(ops::mul, Binary::kMul, 1);
  register_binary(ops::div, Binary::kDiv, 1);
  register_binary(ops::pow, Binary::kPow, 10);
  register_binary(ops::maximum, Binary::kMaximum, 1);
  register_binary(ops::minimum, Binary::kMinimum, 1);

  register_scalar(ops::add_scalar, ScalarOp::kAdd, "value");
  register_scalar(ops::mul_scalar, ScalarOp::kMul, "value");
  register_scalar(ops::div_scalar, ScalarOp::kDiv, "value");
  register_scalar(ops::pow_scalar, ScalarOp::kPow, "exponent");

  register_comparison(ops::eq, Compare::kEq);
  register_comparison(ops::ne, Compare::kNe);
  register_comparison(ops::lt, Compare::kLt);
  register_comparison(ops::le, Compare::kLe);
  register_comparison(ops::gt, Compare::kGt);
  register_comparison(ops::ge, Compare::kGe);

  register_unary(ops::neg, Unary::kNeg, 1);
  register_unary(ops::abs, Unary::kAbs, 1);
  register_unary(ops::exp, Unary::kExp, 10);
  register_unary(ops::log, Unary::kLog, 10);
  register_unary(ops::sqrt, Unary::kSqrt, 4);
  register_unary(ops::rsqrt, Unary::kRsqrt, 5);
  register_unary(ops::tanh, Unary::kTanh, 12);
  register_unary(ops::sigmoid, Unary::kSigmoid, 12);
  register_unary(ops::relu, Unary::kRelu, 1);
  register_gelu();
  register_relu_backward();
  register_clamp();
  register_selection();
}

Tensor add(const Tensor& a, const Tensor& b, double alpha) {
  if (alpha == 1.0) return binary(ops::add, a, b);
  return first_output(dispatch(ops::add, {a, b}, Attrs{{"alpha", alpha}}));
}
Tensor sub(const Tensor& a, const Tensor& b, double alpha) {
  if (alpha == 1.0) return binary(ops::sub, a, b);
  return first_output(dispatch(ops::sub, {a, b}, Attrs{{"alpha", alpha}}));
}
Tensor mul(const Tensor& a, const Tensor& b) { return binary(ops::mul, a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return binary(ops::div, a, b); }
Tensor pow(const Tensor& a, const Tensor& b) { return binary(ops::pow, a, b); }
Tensor maximum(const Tensor& a, const Tensor& b) { return binary(ops::maximum, a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return binary(ops::minimum, a, b); }

Tensor add(const Tensor& a, double b) { return scalar_op(ops::add_scalar, a, b); }
Tensor sub(const Tensor& a, double b) { return scalar_op(ops::add_scalar, a, -b); }
Tensor mul(const Tensor& a, double b) { return scalar_op(ops::mul_scalar, a, b); }
Tensor div(const Tensor& a, double b) { return scalar_op(ops::div_scalar, a, b); }
Tensor pow(const Tensor& a, double exponent) {
  return first_output(dispatch(ops::pow_scalar, {a}, Attrs{{"exponent", exponent}}));
}

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator+(const Tensor& a, double b) { return add(a, b); }
Tensor operator-(const Tensor& a, double b) { return sub(a, b); }
Tensor operator*(const Tensor& a, double b) { return mul(a, b); }
Tensor operator/(const Tensor& a, double b) { return div(a, b); }
Tensor operator*(double a, const Tensor& b) { return mul(b, a); }
Tensor operator-(const Tensor& a) { return neg(a); }

Tensor neg(const Tensor& x) { return unary(ops::neg, x); }
Tensor abs(const Tensor& x) { return unary(ops::abs, x); }
Tensor exp(const Tensor& x) { return unary(ops::exp, x); }
Tensor log(const Tensor& x) { return unary(ops::log, x); }
Tensor sqrt(const Tensor& x) { return unary(ops::sqrt, x); }
Tensor rsqrt(const Tensor& x) { return unary(ops::rsqrt, x); }
Tensor tanh(const Tensor& x) { return unary(ops::tanh, x); }
Tensor sigmoid(const Tensor& x) { return unary(ops::sigmoid, x); }
Tensor relu(const Tensor& x) { return unary(ops::relu, x); }
Tensor gelu(const Tensor& x, const std::string& approximate) {
  return first_output(dispatch(ops::gelu, {x}, Attrs{{"approximate", approximate}}));
}
Tensor clamp(const Tensor& x, double min, double max) {
  return first_output(dispatch(ops::clamp, {x}, Attrs{{"min", min}, {"max", max}}));
}

Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b) {
  return first_output(dispatch(ops::where, {condition, a, b}));
}
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  return first_output(dispatch(ops::masked_fill, {x, mask}, Attrs{{"value", value}}));
}
Tensor eq(const Tensor& a, const Tensor& b) { return binary(ops::eq, a, b); }
Tensor ne(const Tensor& a, const Tensor& b) { return binary(ops::ne, a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return binary(ops::lt, a, b); }
Tensor le(const Tensor& a, const Tensor& b) { return binary(ops::le, a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return binary(ops::gt, a, b); }
Tensor ge(const Tensor& a, const Tensor& b) { return binary(ops::ge, a, b); }

}  // namespace tessel
