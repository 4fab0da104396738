#include "core/dtype.h"

namespace tessel {

void fail_unknown_dtype(DType dtype) { TESSEL_FAIL("unknown dtype ", static_cast<int>(dtype)); }

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "f32";
    case DType::kFloat64:
      return "f64";
    case DType::kBFloat16:
      return "bf16";
    case DType::kFloat16:
      return "f16";
    case DType::kInt32:
      return "i32";
    case DType::kInt64:
      return "i64";
    case DType::kUInt8:
      return "u8";
    case DType::kBool:
      return "bool";
  }
  return "?";
}

DType dtype_from_name(const std::string& name) {
  for (int i = 0; i < kNumDTypes; ++i) {
    auto dtype = static_cast<DType>(i);
    if (name == dtype_name(dtype)) return dtype;
  }
  if (name == "float32" || name == "float") return DType::kFloat32;
  if (name == "float64" || name == "double") return DType::kFloat64;
  if (name == "bfloat16") return DType::kBFloat16;
  if (name == "float16" || name == "half") return DType::kFloat16;
  if (name == "int32") return DType::kInt32;
  if (name == "int64" || name == "long") return DType::kInt64;
  if (name == "uint8") return DType::kUInt8;
  TESSEL_FAIL("unknown dtype name '", name,
              "' (expected one of f32, f64, bf16, f16, i32, i64, u8, bool)");
}

bool is_floating(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat64 || dtype == DType::kBFloat16 ||
         dtype == DType::kFloat16;
}

bool is_integral(DType dtype) { return !is_floating(dtype); }

namespace {
// Rank within a category: bool 0, u8 1, i32 2, i64 3; f16/bf16 4, f32 5, f64 6.
int rank(DType dtype) {
  switch (dtype) {
    case DType::kBool:
      return 0;
    case DType::kUInt8:
      return 1;
    case DType::kInt32:
      return 2;
    case DType::kInt64:
      return 3;
    case DType::kFloat16:
    case DType::kBFloat16:
      return 4;
    case DType::kFloat32:
      return 5;
    case DType::kFloat64:
      return 6;
  }
  return 0;
}
}  // namespace

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  // f16 with bf16 has no common 16-bit type.
  if ((a == DType::kFloat16 && b == DType::kBFloat16) ||
      (a == DType::kBFloat16 && b == DType::kFloat16))
    return DType::kFloat32;
  return rank(a) >= rank(b) ? a : b;
}

}  // namespace tessel
