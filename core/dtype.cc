#include "core/dtype.h"

#include <cmath>

namespace tessel {

size_t element_size(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return 4;
    case DType::kFloat64:
      return 8;
    case DType::kBFloat16:
      return 2;
    case DType::kFloat16:
      return 2;
    case DType::kInt32:
      return 4;
    case DType::kInt64:
      return 8;
    case DType::kUInt8:
      return 1;
    case DType::kBool:
      return 1;
  }
  TESSEL_FAIL("unknown dtype ", static_cast<int>(dtype));
}

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

namespace {
uint32_t float_bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  return bits;
}
float bits_float(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, 4);
  return value;
}
}  // namespace

BFloat16::BFloat16(float value) {
  uint32_t bits32 = float_bits(value);
  if (std::isnan(value)) {
    bits = 0x7fc0;
    return;
  }
  // Round to nearest even.
  uint32_t rounding = 0x7fff + ((bits32 >> 16) & 1);
  bits = static_cast<uint16_t>((bits32 + rounding) >> 16);
}

BFloat16::operator float() const { return bits_float(static_cast<uint32_t>(bits) << 16); }

Float16::Float16(float value) {
  uint32_t x = float_bits(value);
  uint32_t sign = (x >> 16) & 0x8000;
  int32_t exponent = static_cast<int32_t>((x >> 23) & 0xff) - 127 + 15;
  uint32_t mantissa = x & 0x7fffff;
  if (((x >> 23) & 0xff) == 0xff) {  // inf or nan
    bits = static_cast<uint16_t>(sign | 0x7c00 | (mantissa ? 0x200 : 0));
    return;
  }
  if (exponent >= 31) {  // overflow to inf
    bits = static_cast<uint16_t>(sign | 0x7c00);
    return;
  }
  if (exponent <= 0) {  // subnormal or zero
    if (exponent < -10) {
      bits = static_cast<uint16_t>(sign);
      return;
    }
    mantissa |= 0x800000;
    uint32_t shift = static_cast<uint32_t>(14 - exponent);
    uint32_t half_mantissa = mantissa >> shift;
    uint32_t remainder = mantissa & ((1u << shift) - 1);
    uint32_t halfway = 1u << (shift - 1);
    if (remainder > halfway || (remainder == halfway && (half_mantissa & 1))) ++half_mantissa;
    bits = static_cast<uint16_t>(sign | half_mantissa);
    return;
  }
  uint32_t half = sign | (static_cast<uint32_t>(exponent) << 10) | (mantissa >> 13);
  uint32_t remainder = mantissa & 0x1fff;
  if (remainder > 0x1000 || (remainder == 0x1000 && (half & 1)))
    ++half;  // may carry into exponent: correct
  bits = static_cast<uint16_t>(half);
}

Float16::operator float() const {
  uint32_t sign = static_cast<uint32_t>(bits & 0x8000) << 16;
  uint32_t exponent = (bits >> 10) & 0x1f;
  uint32_t mantissa = bits & 0x3ff;
  if (exponent == 0) {
    if (mantissa == 0) return bits_float(sign);
    // Subnormal: value = mantissa * 2^-24.
    float value = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return sign ? -value : value;
  }
  if (exponent == 31) return bits_float(sign | 0x7f800000 | (mantissa << 13));
  return bits_float(sign | ((exponent - 15 + 127) << 23) | (mantissa << 13));
}

}  // namespace tessel
