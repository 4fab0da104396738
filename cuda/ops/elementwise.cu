// CUDA kernels for the element-wise ops of ops/elementwise.cc: binary arithmetic with
// broadcasting and type promotion (inputs converted to the result dtype first, as on CPU),
// scalar forms, comparisons, unary math and activations, gelu and its backward, clamp, where
// and masked_fill. Every operand may have any strides, including stride-0 broadcasts. The
// per-element math is the CPU's (ops/math/elementwise.h); one kernel serves every kind of an
// op family (the kind is a functor field, uniform across threads).
#include <type_traits>

#include "cuda/ops/loops.cuh"
#include "ops/elementwise.h"
#include "ops/math/dtype_visit.h"
#include "ops/math/elementwise.h"
#include "ops/registry_helpers.h"

namespace tessel::cuda {

namespace {

constexpr DeviceType kCuda = DeviceType::kCuda;

using math::Binary;
using math::Compare;
using math::ScalarOp;
using math::Unary;

void binary_kernel(Binary kind, KernelContext& context) {
  const char* name = context.op.name.c_str();
  const Tensor& out = context.outputs[0];
  visit_arithmetic_dtype(out.dtype(), name, math::binary_allows_bool(kind), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_floating_point_v<T>) {
      TESSEL_CHECK(kind != Binary::kDiv, name, ": not supported for ", dtype_name(out.dtype()),
                   " tensors");
    }
    const double alpha = context.attrs.get_or<double>("alpha", 1.0);
    Tensor a = converted(context, context.inputs[0], out.dtype());
    Tensor b = converted(context, context.inputs[1], out.dtype());
    launch_binary<T, T, T>(out, a, b,
                           math::BinaryFunctor<T>{kind, alpha == 1.0, static_cast<T>(alpha)});
  });
}

void compare_kernel(Compare kind, KernelContext& context) {
  DType compute = promote_types(context.inputs[0].dtype(), context.inputs[1].dtype());
  if (compute == DType::kBFloat16 || compute == DType::kFloat16) compute = DType::kFloat32;
  visit_arithmetic_dtype(compute, context.op.name.c_str(), true, [&](auto tag) {
    using T = decltype(tag);
    Tensor a = converted(context, context.inputs[0], compute);
    Tensor b = converted(context, context.inputs[1], compute);
    launch_binary<bool, T, T>(context.outputs[0], a, b, math::CompareFunctor<T>{kind});
  });
}

void scalar_kernel(ScalarOp kind, const char* attr, KernelContext& context) {
  const double value = context.attrs.get<double>(attr);
  visit_arithmetic_dtype(context.outputs[0].dtype(), context.op.name.c_str(), false, [&](auto tag) {
    using T = decltype(tag);
    launch_unary<T, T>(context.outputs[0], context.inputs[0],
                       math::ScalarFunctor<T>{kind, value, static_cast<T>(value)});
  });
}

void unary_kernel(Unary kind, KernelContext& context) {
  visit_arithmetic_dtype(context.outputs[0].dtype(), context.op.name.c_str(), false, [&](auto tag) {
    using T = decltype(tag);
    launch_unary<T, T>(context.outputs[0], context.inputs[0], math::UnaryFunctor<T>{kind});
  });
}

bool gelu_uses_tanh(const Attrs& attrs) {
  return attrs.get_or<std::string>("approximate", "none") == "tanh";
}

void register_binary(const OpHandle& op, Binary kind) {
  op.set_kernel(kCuda, [kind](KernelContext& context) { binary_kernel(kind, context); });
}

void register_compare(const OpHandle& op, Compare kind) {
  op.set_kernel(kCuda, [kind](KernelContext& context) { compare_kernel(kind, context); });
}

void register_scalar(const OpHandle& op, ScalarOp kind, const char* attr) {
  op.set_kernel(kCuda,
                [kind, attr](KernelContext& context) { scalar_kernel(kind, attr, context); });
}

void register_unary(const OpHandle& op, Unary kind) {
  op.set_kernel(kCuda, [kind](KernelContext& context) { unary_kernel(kind, context); });
}

}  // namespace

TESSEL_REGISTER_OPS(cuda_elementwise) {
  register_binary(ops::add, Binary::kAdd);
  register_binary(ops::sub, Binary::kSub);
  register_binary(ops::mul, Binary::kMul);
  register_binary(ops::div, Binary::kDiv);
  register_binary(ops::pow, Binary::kPow);
  register_binary(ops::maximum, Binary::kMaximum);
  register_binary(ops::minimum, Binary::kMinimum);

  register_scalar(ops::add_scalar, ScalarOp::kAdd, "value");
  register_scalar(ops::mul_scalar, ScalarOp::kMul, "value");
  register_scalar(ops::div_scalar, ScalarOp::kDiv, "value");
  register_scalar(ops::pow_scalar, ScalarOp::kPow, "exponent");

  register_compare(ops::eq, Compare::kEq);
  register_compare(ops::ne, Compare::kNe);
  register_compare(ops::lt, Compare::kLt);
  register_compare(ops::le, Compare::kLe);
  register_compare(ops::gt, Compare::kGt);
  register_compare(ops::ge, Compare::kGe);

  register_unary(ops::neg, Unary::kNeg);
  register_unary(ops::abs, Unary::kAbs);
  register_unary(ops::exp, Unary::kExp);
  register_unary(ops::log, Unary::kLog);
  register_unary(ops::sqrt, Unary::kSqrt);
  register_unary(ops::rsqrt, Unary::kRsqrt);
  register_unary(ops::tanh, Unary::kTanh);
  register_unary(ops::sigmoid, Unary::kSigmoid);
  register_unary(ops::relu, Unary::kRelu);

  ops::gelu.set_kernel(kCuda, [](KernelContext& context) {
    const bool tanh_form = gelu_uses_tanh(context.attrs);
    visit_float_dtype(context.outputs[0].dtype(), ops::gelu.name(), [&](auto tag) {
      using T = decltype(tag);
      launch_unary<T, T>(context.outputs[0], context.inputs[0], math::GeluFunctor<T>{tanh_form});
    });
  });
  ops::gelu_backward.set_kernel(kCuda, [](KernelContext& context) {
    const bool tanh_form = gelu_uses_tanh(context.attrs);
    visit_float_dtype(context.outputs[0].dtype(), ops::gelu_backward.name(), [&](auto tag) {
      using T = decltype(tag);
      launch_binary<T, T, T>(context.outputs[0], context.inputs[0], context.inputs[1],
                             math::GeluBackwardFunctor<T>{tanh_form});
    });
  });
  ops::relu_backward.set_kernel(kCuda, [](KernelContext& context) {
    visit_float_dtype(context.outputs[0].dtype(), ops::relu_backward.name(), [&](auto tag) {
      using T = decltype(tag);
      launch_binary<T, T, T>(context.outputs[0], context.inputs[0], context.inputs[1],
                             math::ReluBackwardFunctor<T>{});
    });
  });
  ops::clamp.set_kernel(kCuda, [](KernelContext& context) {
    const double low = context.attrs.get<double>("min"), high = context.attrs.get<double>("max");
    visit_arithmetic_dtype(context.outputs[0].dtype(), ops::clamp.name(), false, [&](auto tag) {
      using T = decltype(tag);
      launch_unary<T, T>(context.outputs[0], context.inputs[0], math::ClampFunctor<T>{low, high});
    });
  });
  ops::where.set_kernel(kCuda, [](KernelContext& context) {
    const Tensor& out = context.outputs[0];
    Tensor a = converted(context, context.inputs[1], out.dtype());
    Tensor b = converted(context, context.inputs[2], out.dtype());
    Tensor condition = converted(context, context.inputs[0], DType::kBool);
    visit_dtype(out.dtype(), [&](auto tag) {
      using T = decltype(tag);
      launch_ternary<T, bool, T, T>(out, condition, a, b, math::WhereFunctor<T>{});
    });
  });
  ops::masked_fill.set_kernel(kCuda, [](KernelContext& context) {
    const Tensor& out = context.outputs[0];
    Tensor mask = converted(context, context.inputs[1], DType::kBool);
    const double value = context.attrs.get<double>("value");
    visit_dtype(out.dtype(), [&](auto tag) {
      using T = decltype(tag);
      launch_binary<T, T, bool>(out, context.inputs[0], mask,
                                math::MaskedFillFunctor<T>{convert_value<T>(value)});
    });
  });
}

}  // namespace tessel::cuda
