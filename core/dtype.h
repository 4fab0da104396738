// Element types: f32, f64, bf16, f16 (storage and conversion: core/half.h), i32, i64, u8, bool.
// Promotion follows PyTorch's category rule: bool < integers < floating; wider wins.
//   DType t = promote_types(DType::kInt64, DType::kFloat32);  // kFloat32
#pragma once

#include <cstdint>
#include <cstring>
#include <ostream>
#include <string>

#include "core/error.h"
#include "core/half.h"

namespace tessel {

enum class DType : uint8_t {
  kFloat32,
  kFloat64,
  kBFloat16,
  kFloat16,
  kInt32,
  kInt64,
  kUInt8,
  kBool
};

constexpr int kNumDTypes = 8;

[[noreturn]] void fail_unknown_dtype(DType dtype);
inline size_t element_size(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
    case DType::kInt32:
      return 4;
    case DType::kFloat64:
    case DType::kInt64:
      return 8;
    case DType::kBFloat16:
    case DType::kFloat16:
      return 2;
    case DType::kUInt8:
    case DType::kBool:
      return 1;
  }
  fail_unknown_dtype(dtype);
}
const char* dtype_name(DType dtype);             // "f32", "f64", ...
DType dtype_from_name(const std::string& name);  // accepts "f32" and "float32"; throws on unknown
bool is_floating(DType dtype);
bool is_integral(DType dtype);  // integers and bool
DType promote_types(DType a, DType b);
inline std::ostream& operator<<(std::ostream& out, DType dtype) { return out << dtype_name(dtype); }

template <typename T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::kFloat32;
};
template <>
struct DTypeOf<double> {
  static constexpr DType value = DType::kFloat64;
};
template <>
struct DTypeOf<BFloat16> {
  static constexpr DType value = DType::kBFloat16;
};
template <>
struct DTypeOf<Float16> {
  static constexpr DType value = DType::kFloat16;
};
template <>
struct DTypeOf<int32_t> {
  static constexpr DType value = DType::kInt32;
};
template <>
struct DTypeOf<int64_t> {
  static constexpr DType value = DType::kInt64;
};
template <>
struct DTypeOf<uint8_t> {
  static constexpr DType value = DType::kUInt8;
};
template <>
struct DTypeOf<bool> {
  static constexpr DType value = DType::kBool;
};

// Calls fn(T{}) with T the C++ type of `dtype`, for every dtype.
template <typename Fn>
decltype(auto) visit_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32:
      return fn(float{});
    case DType::kFloat64:
      return fn(double{});
    case DType::kBFloat16:
      return fn(BFloat16{});
    case DType::kFloat16:
      return fn(Float16{});
    case DType::kInt32:
      return fn(int32_t{});
    case DType::kInt64:
      return fn(int64_t{});
    case DType::kUInt8:
      return fn(uint8_t{});
    case DType::kBool:
      return fn(bool{});
  }
  TESSEL_FAIL("unknown dtype ", static_cast<int>(dtype));
}

// Calls fn(T{}) for the dtypes kernels compute in (f32, f64); a clear error otherwise.
template <typename Fn>
decltype(auto) visit_float_dtype(DType dtype, const char* op, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32:
      return fn(float{});
    case DType::kFloat64:
      return fn(double{});
    default:
      TESSEL_FAIL(op, ": expected a f32 or f64 tensor, got ", dtype_name(dtype),
                  " (convert with .to(DType::kFloat32))");
  }
}

}  // namespace tessel
