// The libm functions element-wise math calls, for f32 and f64, on the host (std::) and in CUDA
// device code (CUDA's math library), behind one name each.
//   float y = math::exp(x);  double p = math::integer_power(3.0, 4.0);  // 81
#pragma once

#include <cmath>
#include <limits>
#include <type_traits>

#include "core/host_device.h"

namespace tessel::math {

#ifdef __CUDA_ARCH__
#define TESSEL_MATH_FUNCTION(name)            \
  template <typename T>                       \
  TESSEL_HOST_DEVICE inline T name(T x) {     \
    if constexpr (std::is_same_v<T, float>) { \
      return ::name##f(x);                    \
    } else {                                  \
      return ::name(x);                       \
    }                                         \
  }
#else
#define TESSEL_MATH_FUNCTION(name)        \
  template <typename T>                   \
  TESSEL_HOST_DEVICE inline T name(T x) { \
    return std::name(x);                  \
  }
#endif

TESSEL_MATH_FUNCTION(exp)
TESSEL_MATH_FUNCTION(log)
TESSEL_MATH_FUNCTION(sqrt)
TESSEL_MATH_FUNCTION(tanh)
TESSEL_MATH_FUNCTION(erf)
TESSEL_MATH_FUNCTION(fabs)

#undef TESSEL_MATH_FUNCTION

template <typename T>
TESSEL_HOST_DEVICE inline T pow(T x, T y) {
#ifdef __CUDA_ARCH__
  if constexpr (std::is_same_v<T, float>) {
    return ::powf(x, y);
  } else {
    return ::pow(x, y);
  }
#else
  return std::pow(x, y);
#endif
}

// base^exponent by repeated squaring for integral |exponent| <= 64, pow otherwise: exact where
// the result is a representable integer (as a correctly rounded pow is), which CUDA's pow is not
// guaranteed to be.
TESSEL_HOST_DEVICE inline double integer_power_by_squaring(double base, double exponent) {
  if (exponent == ::floor(exponent) && ::fabs(exponent) <= 64) {
    double result = 1, factor = base;
    const long long magnitude = static_cast<long long>(exponent < 0 ? -exponent : exponent);
    for (long long n = magnitude; n; n >>= 1) {
      if (n & 1) result *= factor;
      factor *= factor;
    }
    return exponent < 0 ? 1.0 / result : result;
  }
  return ::pow(base, exponent);
}

// A double as the integer type T: truncated toward zero, clamped to T's range, NaN as 0, as
// CUDA's conversions do. A plain cast of a double outside T's range (inf from 0^-1 or x/0 in
// integer pow and scalar ops) is undefined behaviour on the host.
template <typename T>
TESSEL_HOST_DEVICE inline T saturating_cast(double value) {
  if (value != value) return T(0);
  if (value <= static_cast<double>(std::numeric_limits<T>::lowest()))
    return std::numeric_limits<T>::lowest();
  if (value >= static_cast<double>(std::numeric_limits<T>::max()))
    return std::numeric_limits<T>::max();
  return static_cast<T>(value);
}

// pow for integer tensors, computed in double: the host's correctly rounded pow on the CPU,
// repeated squaring on the device (the same values wherever the result is an exact integer).
TESSEL_HOST_DEVICE inline double integer_power(double base, double exponent) {
#ifdef __CUDA_ARCH__
  return integer_power_by_squaring(base, exponent);
#else
  return std::pow(base, exponent);
#endif
}

}  // namespace tessel::math
