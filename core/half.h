// 16-bit floats (bf16, f16) stored as raw bits, and their exact conversions to and from f32
// (round to nearest even), shared by CPU loops and CUDA kernels so casts agree bit for bit.
//   BFloat16 b(1.5f);  float f = b;  uint16_t raw = float_to_f16_bits(0.1f);
#pragma once

#include <cstdint>
#include <cstring>

#include "core/host_device.h"

namespace tessel {

TESSEL_HOST_DEVICE inline uint32_t float_to_bits(float value) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(value);
#else
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  return bits;
#endif
}

TESSEL_HOST_DEVICE inline float bits_to_float(uint32_t bits) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(bits);
#else
  float value;
  std::memcpy(&value, &bits, 4);
  return value;
#endif
}

TESSEL_HOST_DEVICE inline uint16_t float_to_bf16_bits(float value) {
  if (value != value) return 0x7fc0;  // one quiet NaN
  const uint32_t bits32 = float_to_bits(value);
  const uint32_t rounding = 0x7fff + ((bits32 >> 16) & 1);  // round to nearest even
  return static_cast<uint16_t>((bits32 + rounding) >> 16);
}

TESSEL_HOST_DEVICE inline float bf16_bits_to_float(uint16_t bits) {
  return bits_to_float(static_cast<uint32_t>(bits) << 16);
}

TESSEL_HOST_DEVICE inline uint16_t float_to_f16_bits(float value) {
  const uint32_t x = float_to_bits(value);
  const uint32_t sign = (x >> 16) & 0x8000;
  const int32_t exponent = static_cast<int32_t>((x >> 23) & 0xff) - 127 + 15;
  uint32_t mantissa = x & 0x7fffff;
  if (((x >> 23) & 0xff) == 0xff)  // inf or nan
    return static_cast<uint16_t>(sign | 0x7c00 | (mantissa ? 0x200 : 0));
  if (exponent >= 31) return static_cast<uint16_t>(sign | 0x7c00);  // overflow to inf
  if (exponent <= 0) {                                              // subnormal or zero
    if (exponent < -10) return static_cast<uint16_t>(sign);
    mantissa |= 0x800000;
    const uint32_t shift = static_cast<uint32_t>(14 - exponent);
    uint32_t half_mantissa = mantissa >> shift;
    const uint32_t remainder = mantissa & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (remainder > halfway || (remainder == halfway && (half_mantissa & 1))) ++half_mantissa;
    return static_cast<uint16_t>(sign | half_mantissa);
  }
  uint32_t half = sign | (static_cast<uint32_t>(exponent) << 10) | (mantissa >> 13);
  const uint32_t remainder = mantissa & 0x1fff;
  if (remainder > 0x1000 || (remainder == 0x1000 && (half & 1)))
    ++half;  // may carry into the exponent: correct
  return static_cast<uint16_t>(half);
}

TESSEL_HOST_DEVICE inline float f16_bits_to_float(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1f;
  const uint32_t mantissa = bits & 0x3ff;
  if (exponent == 0) {
    if (mantissa == 0) return bits_to_float(sign);
    // Subnormal: value = mantissa * 2^-24.
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) return bits_to_float(sign | 0x7f800000 | (mantissa << 13));
  return bits_to_float(sign | ((exponent - 15 + 127) << 23) | (mantissa << 13));
}

// Arithmetic on these types converts through float.
struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  TESSEL_HOST_DEVICE explicit BFloat16(float value) : bits(float_to_bf16_bits(value)) {}
  TESSEL_HOST_DEVICE operator float() const { return bf16_bits_to_float(bits); }
  TESSEL_HOST_DEVICE static BFloat16 from_bits(uint16_t raw) {
    BFloat16 result;
    result.bits = raw;
    return result;
  }
};

struct Float16 {
  uint16_t bits = 0;
  Float16() = default;
  TESSEL_HOST_DEVICE explicit Float16(float value) : bits(float_to_f16_bits(value)) {}
  TESSEL_HOST_DEVICE operator float() const { return f16_bits_to_float(bits); }
  TESSEL_HOST_DEVICE static Float16 from_bits(uint16_t raw) {
    Float16 result;
    result.bits = raw;
    return result;
  }
};

}  // namespace tessel
