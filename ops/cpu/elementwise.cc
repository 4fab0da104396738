// The CPU kernels of the element-wise ops: strided, broadcasting loops (ops/cpu/loops.h) over
// the per-element math of ops/math/elementwise.h, one loop per op kind so each one vectorises.
#include "ops/math/elementwise.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>

#include "ops/cpu/kernels.h"
#include "ops/cpu/loops.h"
#include "ops/cpu/vector_math.h"
#include "ops/math/dtype_visit.h"
#include "ops/ops.h"
#include "ops/registry_helpers.h"

namespace tessel::cpu {

namespace {

using math::Binary;
using math::Compare;
using math::Fixed;
using math::ScalarOp;
using math::Unary;

template <typename T, typename Fn>
void run_binary(KernelContext& context, const Fn& fn) {
  const Tensor& out = context.outputs[0];
  Tensor a = cpu::converted(context, context.inputs[0], out.dtype());
  Tensor b = cpu::converted(context, context.inputs[1], out.dtype());
  cpu::binary_loop<T, T, T>(out, a, b, fn);
}

// One loop per kind (and per alpha == 1 for add / sub), so each one vectorises.
template <Binary kKind, typename T>
void run_binary_kind(KernelContext& context) {
  if constexpr ((kKind == Binary::kAdd || kKind == Binary::kSub) && !std::is_same_v<T, bool>) {
    const double alpha = context.attrs.get_or<double>("alpha", 1.0);
    if (alpha != 1.0) {
      return run_binary<T>(context, math::BinaryFunctor<T, Fixed<kKind>, Fixed<false>>{
                                        {}, {}, static_cast<T>(alpha)});
    }
  }
  run_binary<T>(context, math::BinaryFunctor<T, Fixed<kKind>, Fixed<true>>{});
}

template <Compare kKind, typename T>
void run_compare(const Tensor& out, const Tensor& a, const Tensor& b) {
  cpu::binary_loop<bool, T, T>(out, a, b, math::CompareFunctor<T, Fixed<kKind>>{});
}

template <ScalarOp kKind, typename T>
void run_scalar(KernelContext& context, double value) {
  cpu::unary_loop<T, T>(context.outputs[0], context.inputs[0],
                        math::ScalarFunctor<T, Fixed<kKind>>{{}, value, static_cast<T>(value)});
}

template <Unary kKind, typename T>
void run_unary(const Tensor& out, const Tensor& in) {
  cpu::unary_loop<T, T>(out, in, math::UnaryFunctor<T, Fixed<kKind>>{});
}

// exp of `count` dense f32 entries: where all lie in [kExpLowestF32, 0] (scores less their
// maximum, log-probabilities) the vectorised exp_nonpositive_f32 (within 1.5 ulp of std::exp),
// else std::exp entry by entry.
void exp_block_f32(const float* x, float* y, int64_t count) {
  // Two plain reductions in the form GCC vectorises (std::min / std::max, a combined loop or a
  // count of comparisons stay scalar). A NaN leaves them as they were and takes the vectorised
  // path, which keeps it.
  float lowest = 0, highest = kExpLowestF32;
#pragma omp simd reduction(min : lowest)
  for (int64_t i = 0; i < count; ++i) lowest = lowest > x[i] ? x[i] : lowest;
#pragma omp simd reduction(max : highest)
  for (int64_t i = 0; i < count; ++i) highest = highest < x[i] ? x[i] : highest;
  if (lowest >= kExpLowestF32 && highest <= 0) {
#pragma omp simd
    for (int64_t i = 0; i < count; ++i) y[i] = exp_nonpositive_f32(x[i]);
  } else {
    for (int64_t i = 0; i < count; ++i) y[i] = std::exp(x[i]);
  }
}

// exp of an f32 tensor: dense ones block by block (exp_block_f32), others through the strided
// loop.
void exp_f32(const Tensor& out, const Tensor& in) {
  if (!out.is_contiguous() || !in.is_contiguous() || out.sizes() != in.sizes())
    return run_unary<Unary::kExp, float>(out, in);
  constexpr int64_t kBlock = 1024;
  const float* x = in.data_ptr<float>();
  float* y = out.data_ptr<float>();
  parallel_for(0, out.numel(), kElementwiseGrain, [&](int64_t begin, int64_t end) {
    for (int64_t block = begin; block < end; block += kBlock)
      exp_block_f32(x + block, y + block, std::min(end, block + kBlock) - block);
  });
}

template <typename T>
void unary_loop(Unary kind, const Tensor& out, const Tensor& in) {
  switch (kind) {
    case Unary::kNeg:
      return run_unary<Unary::kNeg, T>(out, in);
    case Unary::kAbs:
      return run_unary<Unary::kAbs, T>(out, in);
    case Unary::kRelu:
      return run_unary<Unary::kRelu, T>(out, in);
    default:
      break;
  }
  if constexpr (std::is_floating_point_v<T>) {
    switch (kind) {
      case Unary::kExp:
        if constexpr (std::is_same_v<T, float>) return exp_f32(out, in);
        return run_unary<Unary::kExp, T>(out, in);
      case Unary::kLog:
        return run_unary<Unary::kLog, T>(out, in);
      case Unary::kSqrt:
        return run_unary<Unary::kSqrt, T>(out, in);
      case Unary::kRsqrt:
        return run_unary<Unary::kRsqrt, T>(out, in);
      case Unary::kTanh:
        return run_unary<Unary::kTanh, T>(out, in);
      case Unary::kSigmoid:
        return run_unary<Unary::kSigmoid, T>(out, in);
      default:
        break;
    }
  }
}

}  // namespace

void binary_kernel(Binary kind, KernelContext& context) {
  const char* name = context.op.name.c_str();
  visit_arithmetic_dtype(context.outputs[0].dtype(), name, math::binary_allows_bool(kind),
                         [&](auto tag) {
                           using T = decltype(tag);
                           switch (kind) {
                             case Binary::kAdd:
                               return run_binary_kind<Binary::kAdd, T>(context);
                             case Binary::kSub:
                               if constexpr (!std::is_same_v<T, bool>)
                                 return run_binary_kind<Binary::kSub, T>(context);
                               break;
                             case Binary::kMul:
                               return run_binary_kind<Binary::kMul, T>(context);
                             case Binary::kDiv:
                               if constexpr (std::is_floating_point_v<T>)
                                 return run_binary_kind<Binary::kDiv, T>(context);
                               break;
                             case Binary::kPow:
                               if constexpr (!std::is_same_v<T, bool>)
                                 return run_binary_kind<Binary::kPow, T>(context);
                               break;
                             case Binary::kMaximum:
                               return run_binary_kind<Binary::kMaximum, T>(context);
                             case Binary::kMinimum:
                               return run_binary_kind<Binary::kMinimum, T>(context);
                           }
                           TESSEL_FAIL(name, ": not supported for ",
                                       dtype_name(context.outputs[0].dtype()), " tensors");
                         });
}

Kernel comparison_kernel(const char* name, Compare kind) {
  return [name, kind](KernelContext& context) {
    DType compute = promote_types(context.inputs[0].dtype(), context.inputs[1].dtype());
    if (compute == DType::kBFloat16 || compute == DType::kFloat16) compute = DType::kFloat32;
    visit_arithmetic_dtype(compute, name, /*allow_bool=*/true, [&](auto tag) {
      using T = decltype(tag);
      Tensor a = cpu::converted(context, context.inputs[0], compute);
      Tensor b = cpu::converted(context, context.inputs[1], compute);
      const Tensor& out = context.outputs[0];
      switch (kind) {
        case Compare::kEq:
          return run_compare<Compare::kEq, T>(out, a, b);
        case Compare::kNe:
          return run_compare<Compare::kNe, T>(out, a, b);
        case Compare::kLt:
          return run_compare<Compare::kLt, T>(out, a, b);
        case Compare::kLe:
          return run_compare<Compare::kLe, T>(out, a, b);
        case Compare::kGt:
          return run_compare<Compare::kGt, T>(out, a, b);
        case Compare::kGe:
          return run_compare<Compare::kGe, T>(out, a, b);
      }
    });
  };
}

Kernel scalar_kernel(const char* name, ScalarOp kind, const char* attr) {
  return [name, kind, attr](KernelContext& context) {
    double value = context.attrs.get<double>(attr);
    visit_arithmetic_dtype(context.outputs[0].dtype(), name, false, [&](auto tag) {
      using T = decltype(tag);
      // One loop per kind, so each one vectorises.
      switch (kind) {
        case ScalarOp::kAdd:
          return run_scalar<ScalarOp::kAdd, T>(context, value);
        case ScalarOp::kMul:
          return run_scalar<ScalarOp::kMul, T>(context, value);
        case ScalarOp::kDiv:
          return run_scalar<ScalarOp::kDiv, T>(context, value);
        case ScalarOp::kPow:
          if (value == 2.0) {  // the exponent a constant here: the square loop vectorises
            return cpu::unary_loop<T, T>(context.outputs[0], context.inputs[0], [](T x) {
              return math::scalar_value<T>(ScalarOp::kPow, x, 2.0, static_cast<T>(2.0));
            });
          }
          return run_scalar<ScalarOp::kPow, T>(context, value);
      }
    });
  };
}

Kernel unary_kernel(const char* name, Unary kind) {
  return [name, kind](KernelContext& context) {
    visit_arithmetic_dtype(context.outputs[0].dtype(), name, false, [&](auto tag) {
      using T = decltype(tag);
      unary_loop<T>(kind, context.outputs[0], context.inputs[0]);
    });
  };
}

void gelu_kernel(KernelContext& context) {
  bool tanh_form = gelu_uses_tanh(context.attrs);
  visit_float_dtype(context.outputs[0].dtype(), "gelu", [&](auto tag) {
    using T = decltype(tag);
    cpu::unary_loop<T, T>(context.outputs[0], context.inputs[0], math::GeluFunctor<T>{tanh_form});
  });
}

void gelu_backward_kernel(KernelContext& context) {
  bool tanh_form = gelu_uses_tanh(context.attrs);
  visit_float_dtype(context.outputs[0].dtype(), "gelu_backward", [&](auto tag) {
    using T = decltype(tag);
    cpu::binary_loop<T, T, T>(context.outputs[0], context.inputs[0], context.inputs[1],
                              math::GeluBackwardFunctor<T>{tanh_form});
  });
}

void relu_backward_kernel(KernelContext& context) {
  visit_float_dtype(context.outputs[0].dtype(), "relu_backward", [&](auto tag) {
    using T = decltype(tag);
    cpu::binary_loop<T, T, T>(context.outputs[0], context.inputs[0], context.inputs[1],
                              math::ReluBackwardFunctor<T>{});
  });
}

void clamp_kernel(KernelContext& context) {
  double low = context.attrs.get<double>("min"), high = context.attrs.get<double>("max");
  visit_arithmetic_dtype(context.outputs[0].dtype(), "clamp", false, [&](auto tag) {
    using T = decltype(tag);
    cpu::unary_loop<T, T>(context.outputs[0], context.inputs[0], math::ClampFunctor<T>{low, high});
  });
}

void where_kernel(KernelContext& context) {
  const Tensor& out = context.outputs[0];
  Tensor a = cpu::converted(context, context.inputs[1], out.dtype());
  Tensor b = cpu::converted(context, context.inputs[2], out.dtype());
  Tensor condition = cpu::converted(context, context.inputs[0], DType::kBool);
  visit_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::ternary_loop<T, bool, T, T>(out, condition, a, b, math::WhereFunctor<T>{});
  });
}

void masked_fill_kernel(KernelContext& context) {
  const Tensor& out = context.outputs[0];
  Tensor mask = cpu::converted(context, context.inputs[1], DType::kBool);
  double value = context.attrs.get<double>("value");
  visit_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::binary_loop<T, T, bool>(out, context.inputs[0], mask,
                                 math::MaskedFillFunctor<T>{convert_value<T>(value)});
  });
}

bool gelu_uses_tanh(const Attrs& attrs) {
  const std::string& approximate = attrs.get_or<std::string>("approximate", "none");
  TESSEL_CHECK(approximate == "none" || approximate == "tanh",
               "gelu: approximate must be \"none\" or \"tanh\", got \"", approximate, "\"");
  return approximate == "tanh";
}

}  // namespace tessel::cpu
