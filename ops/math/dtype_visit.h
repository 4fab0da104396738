// Host-side dtype dispatch shared by the CPU and CUDA kernels: which element types an op family
// computes in, with the same error messages on every device. (visit_dtype and
// visit_float_dtype are in core/dtype.h.)
//   visit_arithmetic_dtype(out.dtype(), "add", /*allow_bool=*/true, [&](auto tag) { ... });
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "ops/math/convert.h"

namespace tessel {

// Calls fn(T{}) for the dtypes reductions read and arithmetic runs in: f32, f64, integers and
// bool; the 16-bit floats are refused.
template <typename Fn>
void visit_reduce_dtype(DType dtype, const char* op, Fn&& fn) {
  if (dtype == DType::kBFloat16 || dtype == DType::kFloat16) {
    TESSEL_FAIL(op, ": expected a f32, f64 or integer tensor, got ", dtype_name(dtype),
                " (convert with .to(DType::kFloat32))");
  }
  visit_dtype(dtype, [&](auto tag) {
    if constexpr (!kIsHalf<decltype(tag)>) fn(tag);
  });
}

// Calls fn(T{}) for the dtypes arithmetic kernels run in (f32, f64, integers); bool only where
// `allow_bool`.
template <typename Fn>
void visit_arithmetic_dtype(DType dtype, const char* op, bool allow_bool, Fn&& fn) {
  if (dtype == DType::kBool && !allow_bool) TESSEL_FAIL(op, ": not supported for bool tensors");
  return visit_reduce_dtype(dtype, op, fn);
}

}  // namespace tessel
