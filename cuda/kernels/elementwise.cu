// CUDA kernels for the element-wise ops of ops/elementwise.cc: binary arithmetic with
// broadcasting and type promotion (inputs converted to the result dtype first, as on CPU),
// scalar forms, comparisons, unary math and activations, gelu and its backward, clamp, where
// and masked_fill. Every operand may have any strides, including stride-0 broadcasts.
#include <cmath>
#include <type_traits>

#include "cuda/kernels/loops.cuh"
#include "ops/registry_helpers.h"

namespace tessel::cuda {

namespace {

constexpr DeviceType kCuda = DeviceType::kCuda;

// f32 / f64 overloads of the device math library.
template <typename T>
__device__ __forceinline__ T math_exp(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return expf(x);
  } else {
    return exp(x);
  }
}
template <typename T>
__device__ __forceinline__ T math_log(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return logf(x);
  } else {
    return log(x);
  }
}
template <typename T>
__device__ __forceinline__ T math_sqrt(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return sqrtf(x);
  } else {
    return sqrt(x);
  }
}
template <typename T>
__device__ __forceinline__ T math_tanh(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return tanhf(x);
  } else {
    return tanh(x);
  }
}
template <typename T>
__device__ __forceinline__ T math_erf(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return erff(x);
  } else {
    return erf(x);
  }
}
template <typename T>
__device__ __forceinline__ T math_pow(T x, T y) {
  if constexpr (std::is_same_v<T, float>) {
    return powf(x, y);
  } else {
    return pow(x, y);
  }
}

// base^exponent for integer kernels: exact by repeated squaring for integral exponents (as the
// correctly rounded pow of the CPU's libm is on exactly representable results), pow otherwise.
__device__ inline double integer_power(double base, double exponent) {
  if (exponent == floor(exponent) && fabs(exponent) <= 64) {
    double result = 1, factor = base;
    for (long long n = llabs(static_cast<long long>(exponent)); n; n >>= 1) {
      if (n & 1) result *= factor;
      factor *= factor;
    }
    return exponent < 0 ? 1.0 / result : result;
  }
  return pow(base, exponent);
}

// Calls fn(T{}) for the dtypes arithmetic kernels run in; bool only where `allow_bool`.
template <typename Fn>
void visit_arithmetic_dtype(DType dtype, const char* op, bool allow_bool, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32:
      return fn(float{});
    case DType::kFloat64:
      return fn(double{});
    case DType::kInt32:
      return fn(int32_t{});
    case DType::kInt64:
      return fn(int64_t{});
    case DType::kUInt8:
      return fn(uint8_t{});
    case DType::kBool:
      if (allow_bool) return fn(bool{});
      TESSEL_FAIL(op, ": not supported for bool tensors");
    default:
      TESSEL_FAIL(op, ": expected a f32, f64 or integer tensor, got ", dtype_name(dtype),
                  " (convert with .to(DType::kFloat32))");
  }
}

// ---- binary ----

enum class Binary { kAdd, kSub, kMul, kDiv, kPow, kMaximum, kMinimum };

template <typename T>
__device__ __forceinline__ T nan_aware_maximum(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (a != a) return a;
    if (b != b) return b;
  }
  return a > b ? a : b;
}

template <typename T>
__device__ __forceinline__ T nan_aware_minimum(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (a != a) return a;
    if (b != b) return b;
  }
  return a < b ? a : b;
}

template <typename T>
struct BinaryFunctor {
  Binary kind;
  bool unit_alpha;
  T alpha;
  __device__ T operator()(T a, T b) const {
    if constexpr (std::is_same_v<T, bool>) {
      switch (kind) {
        case Binary::kAdd:
        case Binary::kMaximum:
          return a || b;
        default:  // kMul, kMinimum
          return a && b;
      }
    } else {
      switch (kind) {
        case Binary::kAdd:
          return unit_alpha ? static_cast<T>(a + b) : static_cast<T>(a + alpha * b);
        case Binary::kSub:
          return unit_alpha ? static_cast<T>(a - b) : static_cast<T>(a - alpha * b);
        case Binary::kMul:
          return static_cast<T>(a * b);
        case Binary::kDiv:
          return static_cast<T>(a / b);
        case Binary::kPow:
          if constexpr (std::is_floating_point_v<T>) {
            return math_pow(a, b);
          } else {
            return static_cast<T>(integer_power(static_cast<double>(a), static_cast<double>(b)));
          }
        case Binary::kMaximum:
          return nan_aware_maximum(a, b);
        case Binary::kMinimum:
          return nan_aware_minimum(a, b);
      }
      return a;
    }
  }
};

void binary_kernel(Binary kind, KernelContext& context) {
  const char* name = context.op.name.c_str();
  const bool allow_bool = kind == Binary::kAdd || kind == Binary::kMul ||
                          kind == Binary::kMaximum || kind == Binary::kMinimum;
  const Tensor& out = context.outputs[0];
  visit_arithmetic_dtype(out.dtype(), name, allow_bool, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_floating_point_v<T>) {
      TESSEL_CHECK(kind != Binary::kDiv, name, ": not supported for ", dtype_name(out.dtype()),
                   " tensors");
    }
    const double alpha = context.attrs.get_or<double>("alpha", 1.0);
    Tensor a = converted(context, context.inputs[0], out.dtype());
    Tensor b = converted(context, context.inputs[1], out.dtype());
    launch_binary<T, T, T>(out, a, b, BinaryFunctor<T>{kind, alpha == 1.0, static_cast<T>(alpha)});
  });
}

// ---- comparisons ----

enum class Compare { kEq, kNe, kLt, kLe, kGt, kGe };

template <typename T>
struct CompareFunctor {
  Compare kind;
  __device__ bool operator()(T x, T y) const {
    switch (kind) {
      case Compare::kEq:
        return x == y;
      case Compare::kNe:
        return x != y;
      case Compare::kLt:
        return x < y;
      case Compare::kLe:
        return x <= y;
      case Compare::kGt:
        return x > y;
      case Compare::kGe:
        return x >= y;
    }
    return false;
  }
};

void compare_kernel(Compare kind, KernelContext& context) {
  DType compute = promote_types(context.inputs[0].dtype(), context.inputs[1].dtype());
  if (compute == DType::kBFloat16 || compute == DType::kFloat16) compute = DType::kFloat32;
  visit_arithmetic_dtype(compute, context.op.name.c_str(), true, [&](auto tag) {
    using T = decltype(tag);
    Tensor a = converted(context, context.inputs[0], compute);
    Tensor b = converted(context, context.inputs[1], compute);
    launch_binary<bool, T, T>(context.outputs[0], a, b, CompareFunctor<T>{kind});
  });
}

// ---- scalar forms ----

enum class ScalarOp { kAdd, kMul, kDiv, kPow };

template <typename T>
struct ScalarFunctor {
  ScalarOp kind;
  double value;
  T scalar;
  __device__ T operator()(T x) const {
    if constexpr (std::is_floating_point_v<T>) {
      switch (kind) {
        case ScalarOp::kAdd:
          return x + scalar;
        case ScalarOp::kMul:
          return x * scalar;
        case ScalarOp::kDiv:
          return x / scalar;
        case ScalarOp::kPow:
          return value == 2.0 ? x * x : math_pow(x, scalar);
      }
    } else {
      const double v = static_cast<double>(x);
      switch (kind) {
        case ScalarOp::kAdd:
          return static_cast<T>(v + value);
        case ScalarOp::kMul:
          return static_cast<T>(v * value);
        case ScalarOp::kDiv:
          return static_cast<T>(v / value);
        case ScalarOp::kPow:
          return static_cast<T>(integer_power(v, value));
      }
    }
    return x;
  }
};

void scalar_kernel(ScalarOp kind, const char* attr, KernelContext& context) {
  const double value = context.attrs.get<double>(attr);
  visit_arithmetic_dtype(context.outputs[0].dtype(), context.op.name.c_str(), false, [&](auto tag) {
    using T = decltype(tag);
    launch_unary<T, T>(context.outputs[0], context.inputs[0],
                       ScalarFunctor<T>{kind, value, static_cast<T>(value)});
  });
}

// ---- unary ----

enum class Unary { kNeg, kAbs, kExp, kLog, kSqrt, kRsqrt, kTanh, kSigmoid, kRelu };

template <typename T>
struct UnaryFunctor {
  Unary kind;
  __device__ T operator()(T x) const {
    if constexpr (std::is_floating_point_v<T>) {
      switch (kind) {
        case Unary::kNeg:
          return -x;
        case Unary::kAbs:
          if constexpr (std::is_same_v<T, float>) {
            return fabsf(x);
          } else {
            return fabs(x);
          }
        case Unary::kExp:
          return math_exp(x);
        case Unary::kLog:
          return math_log(x);
        case Unary::kSqrt:
          return math_sqrt(x);
        case Unary::kRsqrt:
          return T(1) / math_sqrt(x);
        case Unary::kTanh:
          return math_tanh(x);
        case Unary::kSigmoid:
          return T(1) / (T(1) + math_exp(-x));
        case Unary::kRelu:
          return x < T(0) ? T(0) : x;  // NaN stays NaN
      }
    } else {
      switch (kind) {
        case Unary::kNeg:
          return static_cast<T>(-x);
        case Unary::kAbs:
          if constexpr (std::is_signed_v<T>) return x < T(0) ? static_cast<T>(-x) : x;
          return x;
        case Unary::kRelu:
          if constexpr (std::is_signed_v<T>) return x < T(0) ? T(0) : x;
          return x;
        default:
          break;
      }
    }
    return x;
  }
};

void unary_kernel(Unary kind, KernelContext& context) {
  visit_arithmetic_dtype(context.outputs[0].dtype(), context.op.name.c_str(), false, [&](auto tag) {
    using T = decltype(tag);
    launch_unary<T, T>(context.outputs[0], context.inputs[0], UnaryFunctor<T>{kind});
  });
}

// ---- gelu ----

constexpr double kSqrtHalf = 0.70710678118654752440;
constexpr double kSqrtTwoOverPi = 0.79788456080286535588;
constexpr double kInvSqrtTwoPi = 0.39894228040143267794;
constexpr double kGeluCubic = 0.044715;

bool gelu_uses_tanh(const Attrs& attrs) {
  return attrs.get_or<std::string>("approximate", "none") == "tanh";
}

template <typename T>
struct GeluFunctor {
  bool tanh_form;
  __device__ T operator()(T x) const {
    if (tanh_form) {
      T inner = T(kSqrtTwoOverPi) * (x + T(kGeluCubic) * x * x * x);
      return T(0.5) * x * (T(1) + math_tanh(inner));
    }
    return T(0.5) * x * (T(1) + math_erf(x * T(kSqrtHalf)));
  }
};

template <typename T>
struct GeluBackwardFunctor {
  bool tanh_form;
  __device__ T operator()(T grad, T x) const {
    T derivative;
    if (tanh_form) {
      T inner = T(kSqrtTwoOverPi) * (x + T(kGeluCubic) * x * x * x);
      T t = math_tanh(inner);
      T d_inner = T(kSqrtTwoOverPi) * (T(1) + T(3 * kGeluCubic) * x * x);
      derivative = T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * d_inner;
    } else {
      T cdf = T(0.5) * (T(1) + math_erf(x * T(kSqrtHalf)));
      T pdf = T(kInvSqrtTwoPi) * math_exp(T(-0.5) * x * x);
      derivative = cdf + x * pdf;
    }
    return grad * derivative;
  }
};

// grad where the relu output y > 0, else 0.
template <typename T>
struct ReluBackwardFunctor {
  __device__ T operator()(T grad, T y) const { return y > T(0) ? grad : T(0); }
};

// ---- clamp, where, masked_fill ----

template <typename T>
struct ClampFunctor {
  double low, high;
  T lo, hi;
  __device__ T operator()(T x) const {
    if constexpr (std::is_floating_point_v<T>) {
      T raised = x < lo ? lo : x;  // NaN passes through
      return raised > hi ? hi : raised;
    } else {
      double value = static_cast<double>(x);
      value = value < low ? low : value;
      value = value > high ? high : value;
      return static_cast<T>(value);
    }
  }
};

template <typename T>
struct WhereFunctor {
  __device__ T operator()(bool condition, T a, T b) const { return condition ? a : b; }
};

template <typename T>
struct MaskedFillFunctor {
  T filled;
  __device__ T operator()(T x, bool masked) const { return masked ? filled : x; }
};

void register_binary(const char* name, Binary kind) {
  OpRegistry::get().set_kernel(name, kCuda,
                               [kind](KernelContext& context) { binary_kernel(kind, context); });
}

void register_compare(const char* name, Compare kind) {
  OpRegistry::get().set_kernel(name, kCuda,
                               [kind](KernelContext& context) { compare_kernel(kind, context); });
}

void register_scalar(const char* name, ScalarOp kind, const char* attr) {
  OpRegistry::get().set_kernel(
      name, kCuda, [kind, attr](KernelContext& context) { scalar_kernel(kind, attr, context); });
}

void register_unary(const char* name, Unary kind) {
  OpRegistry::get().set_kernel(name, kCuda,
                               [kind](KernelContext& context) { unary_kernel(kind, context); });
}

}  // namespace

TESSEL_REGISTER_OPS(cuda_elementwise) {
  register_binary("add", Binary::kAdd);
  register_binary("sub", Binary::kSub);
  register_binary("mul", Binary::kMul);
  register_binary("div", Binary::kDiv);
  register_binary("pow", Binary::kPow);
  register_binary("maximum", Binary::kMaximum);
  register_binary("minimum", Binary::kMinimum);

  register_scalar("add_scalar", ScalarOp::kAdd, "value");
  register_scalar("mul_scalar", ScalarOp::kMul, "value");
  register_scalar("div_scalar", ScalarOp::kDiv, "value");
  register_scalar("pow_scalar", ScalarOp::kPow, "exponent");

  register_compare("eq", Compare::kEq);
  register_compare("ne", Compare::kNe);
  register_compare("lt", Compare::kLt);
  register_compare("le", Compare::kLe);
  register_compare("gt", Compare::kGt);
  register_compare("ge", Compare::kGe);

  register_unary("neg", Unary::kNeg);
  register_unary("abs", Unary::kAbs);
  register_unary("exp", Unary::kExp);
  register_unary("log", Unary::kLog);
  register_unary("sqrt", Unary::kSqrt);
  register_unary("rsqrt", Unary::kRsqrt);
  register_unary("tanh", Unary::kTanh);
  register_unary("sigmoid", Unary::kSigmoid);
  register_unary("relu", Unary::kRelu);

  OpRegistry& registry = OpRegistry::get();
  registry.set_kernel("gelu", kCuda, [](KernelContext& context) {
    const bool tanh_form = gelu_uses_tanh(context.attrs);
    visit_float_dtype(context.outputs[0].dtype(), "gelu", [&](auto tag) {
      using T = decltype(tag);
      launch_unary<T, T>(context.outputs[0], context.inputs[0], GeluFunctor<T>{tanh_form});
    });
  });
  registry.set_kernel("gelu_backward", kCuda, [](KernelContext& context) {
    const bool tanh_form = gelu_uses_tanh(context.attrs);
    visit_float_dtype(context.outputs[0].dtype(), "gelu_backward", [&](auto tag) {
      using T = decltype(tag);
      launch_binary<T, T, T>(context.outputs[0], context.inputs[0], context.inputs[1],
                             GeluBackwardFunctor<T>{tanh_form});
    });
  });
  registry.set_kernel("relu_backward", kCuda, [](KernelContext& context) {
    visit_float_dtype(context.outputs[0].dtype(), "relu_backward", [&](auto tag) {
      using T = decltype(tag);
      launch_binary<T, T, T>(context.outputs[0], context.inputs[0], context.inputs[1],
                             ReluBackwardFunctor<T>{});
    });
  });
  registry.set_kernel("clamp", kCuda, [](KernelContext& context) {
    const double low = context.attrs.get<double>("min"), high = context.attrs.get<double>("max");
    visit_arithmetic_dtype(context.outputs[0].dtype(), "clamp", false, [&](auto tag) {
      using T = decltype(tag);
      launch_unary<T, T>(context.outputs[0], context.inputs[0],
                         ClampFunctor<T>{low, high, static_cast<T>(low), static_cast<T>(high)});
    });
  });
  registry.set_kernel("where", kCuda, [](KernelContext& context) {
    const Tensor& out = context.outputs[0];
    Tensor a = converted(context, context.inputs[1], out.dtype());
    Tensor b = converted(context, context.inputs[2], out.dtype());
    Tensor condition = converted(context, context.inputs[0], DType::kBool);
    visit_device_dtype(out.dtype(), [&](auto tag) {
      using T = decltype(tag);
      launch_ternary<T, bool, T, T>(out, condition, a, b, WhereFunctor<T>{});
    });
  });
  registry.set_kernel("masked_fill", kCuda, [](KernelContext& context) {
    const Tensor& out = context.outputs[0];
    Tensor mask = converted(context, context.inputs[1], DType::kBool);
    const double value = context.attrs.get<double>("value");
    visit_device_dtype(out.dtype(), [&](auto tag) {
      using T = decltype(tag);
      launch_binary<T, T, bool>(out, context.inputs[0], mask,
                                MaskedFillFunctor<T>{convert<T>(value)});
    });
  });
}

}  // namespace tessel::cuda
