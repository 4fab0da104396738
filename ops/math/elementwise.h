// The per-element math of the element-wise ops, shared by the CPU loops (ops/cpu/elementwise.cc)
// and the CUDA kernels (cuda/ops/elementwise.cu): binary arithmetic, comparisons, scalar
// forms, unary math and activations, gelu and its derivative, relu_backward, clamp, where and
// masked_fill.
//
// Functors whose op is picked at run time take the kind as a `Kind` parameter: the enum itself
// (one CUDA kernel serves every kind; the branch is uniform across threads) or Fixed<kind> (a
// compile-time constant: the switch folds away and CPU loops vectorise).
//   cpu::binary_loop<float, float, float>(out, a, b, BinaryFunctor<float, Fixed<Binary::kMul>>{});
//   cuda::launch_binary<float, float, float>(out, a, b, BinaryFunctor<float>{Binary::kMul});
#pragma once

#include <cmath>
#include <type_traits>

#include "core/host_device.h"
#include "ops/math/functions.h"

namespace tessel::math {

// A compile-time value for a functor's Kind (or flag) parameter.
template <auto kValue>
using Fixed = std::integral_constant<decltype(kValue), kValue>;

// ---- binary arithmetic ----

enum class Binary { kAdd, kSub, kMul, kDiv, kPow, kMaximum, kMinimum };

// Binary ops defined on bool (add = or, mul = and, maximum = or, minimum = and).
TESSEL_HOST_DEVICE constexpr bool binary_allows_bool(Binary kind) {
  return kind == Binary::kAdd || kind == Binary::kMul || kind == Binary::kMaximum ||
         kind == Binary::kMinimum;
}

// NaN wins, as in PyTorch.
template <typename T>
TESSEL_HOST_DEVICE inline T nan_aware_maximum(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (a != a) return a;
    if (b != b) return b;
  }
  return a > b ? a : b;
}

template <typename T>
TESSEL_HOST_DEVICE inline T nan_aware_minimum(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (a != a) return a;
    if (b != b) return b;
  }
  return a < b ? a : b;
}

// a (kind) b; add and sub scale b by alpha unless `unit_alpha`. Integer division is not
// defined (true division of integers computes in f32).
template <typename T>
TESSEL_HOST_DEVICE inline T binary_value(Binary kind, T a, T b, bool unit_alpha, T alpha) {
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
          return math::pow(a, b);
        } else {
          return saturating_cast<T>(integer_power(static_cast<double>(a), static_cast<double>(b)));
        }
      case Binary::kMaximum:
        return nan_aware_maximum(a, b);
      case Binary::kMinimum:
        return nan_aware_minimum(a, b);
    }
    return a;
  }
}

template <typename T, typename Kind = Binary, typename UnitAlpha = bool>
struct BinaryFunctor {
  Kind kind{};
  UnitAlpha unit_alpha{};
  T alpha{};
  TESSEL_HOST_DEVICE T operator()(T a, T b) const {
    return binary_value<T>(static_cast<Binary>(kind), a, b, static_cast<bool>(unit_alpha), alpha);
  }
};

// ---- comparisons (bool result) ----

enum class Compare { kEq, kNe, kLt, kLe, kGt, kGe };

template <typename T>
TESSEL_HOST_DEVICE inline bool compare_value(Compare kind, T x, T y) {
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

template <typename T, typename Kind = Compare>
struct CompareFunctor {
  Kind kind{};
  TESSEL_HOST_DEVICE bool operator()(T x, T y) const {
    return compare_value<T>(static_cast<Compare>(kind), x, y);
  }
};

// ---- scalar forms: the tensor's dtype is kept ----

enum class ScalarOp { kAdd, kMul, kDiv, kPow };

// x (kind) value: floats in their own type (the scalar rounded to it), integers through double.
template <typename T>
TESSEL_HOST_DEVICE inline T scalar_value(ScalarOp kind, T x, double value, T scalar) {
  if constexpr (std::is_floating_point_v<T>) {
    switch (kind) {
      case ScalarOp::kAdd:
        return x + scalar;
      case ScalarOp::kMul:
        return x * scalar;
      case ScalarOp::kDiv:
        return x / scalar;
      case ScalarOp::kPow:
        return value == 2.0 ? x * x : math::pow(x, scalar);
    }
  } else {
    const double v = static_cast<double>(x);
    switch (kind) {
      case ScalarOp::kAdd:
        return saturating_cast<T>(v + value);
      case ScalarOp::kMul:
        return saturating_cast<T>(v * value);
      case ScalarOp::kDiv:
        return saturating_cast<T>(v / value);
      case ScalarOp::kPow:
        return saturating_cast<T>(integer_power(v, value));
    }
  }
  return x;
}

template <typename T, typename Kind = ScalarOp>
struct ScalarFunctor {
  Kind kind{};
  double value = 0;
  T scalar{};
  TESSEL_HOST_DEVICE T operator()(T x) const {
    return scalar_value<T>(static_cast<ScalarOp>(kind), x, value, scalar);
  }
};

// ---- unary math and activations ----

enum class Unary { kNeg, kAbs, kExp, kLog, kSqrt, kRsqrt, kTanh, kSigmoid, kRelu };

// Unary ops defined on integer tensors (the others need f32 or f64).
TESSEL_HOST_DEVICE constexpr bool unary_allows_integers(Unary kind) {
  return kind == Unary::kNeg || kind == Unary::kAbs || kind == Unary::kRelu;
}

// Integer tensors: neg, abs and relu; other kinds return x (the shape rule rejects them).
template <typename T>
TESSEL_HOST_DEVICE inline T unary_value(Unary kind, T x) {
  if constexpr (std::is_floating_point_v<T>) {
    switch (kind) {
      case Unary::kNeg:
        return -x;
      case Unary::kAbs:
        return math::fabs(x);
      case Unary::kExp:
        return math::exp(x);
      case Unary::kLog:
        return math::log(x);
      case Unary::kSqrt:
        return math::sqrt(x);
      case Unary::kRsqrt:
        return T(1) / math::sqrt(x);
      case Unary::kTanh:
        return math::tanh(x);
      case Unary::kSigmoid:
        return T(1) / (T(1) + math::exp(-x));
      case Unary::kRelu:
        return x < T(0) ? T(0) : x;  // NaN stays NaN, as in PyTorch
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

template <typename T, typename Kind = Unary>
struct UnaryFunctor {
  Kind kind{};
  TESSEL_HOST_DEVICE T operator()(T x) const { return unary_value<T>(static_cast<Unary>(kind), x); }
};

// ---- gelu: x * Phi(x), or its tanh approximation ----

constexpr double kSqrtHalf = 0.70710678118654752440;
constexpr double kSqrtTwoOverPi = 0.79788456080286535588;
constexpr double kInvSqrtTwoPi = 0.39894228040143267794;
constexpr double kGeluCubic = 0.044715;

template <typename T>
TESSEL_HOST_DEVICE inline T gelu_value(T x, bool tanh_form) {
  if (tanh_form) {
    const T inner = T(kSqrtTwoOverPi) * (x + T(kGeluCubic) * x * x * x);
    return T(0.5) * x * (T(1) + math::tanh(inner));
  }
  return T(0.5) * x * (T(1) + math::erf(x * T(kSqrtHalf)));
}

template <typename T>
TESSEL_HOST_DEVICE inline T gelu_derivative(T x, bool tanh_form) {
  if (tanh_form) {
    const T inner = T(kSqrtTwoOverPi) * (x + T(kGeluCubic) * x * x * x);
    const T t = math::tanh(inner);
    const T d_inner = T(kSqrtTwoOverPi) * (T(1) + T(3 * kGeluCubic) * x * x);
    return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * d_inner;
  }
  const T cdf = T(0.5) * (T(1) + math::erf(x * T(kSqrtHalf)));
  const T pdf = T(kInvSqrtTwoPi) * math::exp(T(-0.5) * x * x);
  return cdf + x * pdf;
}

template <typename T>
struct GeluFunctor {
  bool tanh_form = false;
  TESSEL_HOST_DEVICE T operator()(T x) const { return gelu_value(x, tanh_form); }
};

// grad * gelu'(x).
template <typename T>
struct GeluBackwardFunctor {
  bool tanh_form = false;
  TESSEL_HOST_DEVICE T operator()(T grad, T x) const {
    return grad * gelu_derivative(x, tanh_form);
  }
};

// grad where the relu output y > 0, else 0 (PyTorch's threshold_backward).
template <typename T>
struct ReluBackwardFunctor {
  TESSEL_HOST_DEVICE T operator()(T grad, T y) const { return y > T(0) ? grad : T(0); }
};

// ---- clamp, where, masked_fill ----

// min(max(x, low), high): floats against the bounds rounded to T (NaN passes through, as in
// PyTorch), integers through double.
template <typename T>
struct ClampFunctor {
  double low = 0, high = 0;
  TESSEL_HOST_DEVICE T operator()(T x) const {
    if constexpr (std::is_floating_point_v<T>) {
      const T lo = static_cast<T>(low), hi = static_cast<T>(high);
      const T raised = x < lo ? lo : x;
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
  TESSEL_HOST_DEVICE T operator()(bool condition, T a, T b) const { return condition ? a : b; }
};

template <typename T>
struct MaskedFillFunctor {
  T filled{};
  TESSEL_HOST_DEVICE T operator()(T x, bool masked) const { return masked ? filled : x; }
};

}  // namespace tessel::math
