// Vectorisable f32 math for CPU kernels: functions `omp simd` loops can inline, where the C
// library's are scalar calls.
#pragma once

#include <cstdint>
#include <cstring>

namespace tessel::cpu {

// exp of this is the smallest normal f32; below it exp_nonpositive_f32 gives 0.
constexpr float kExpLowestF32 = -87.33654f;

// exp of an f32 argument <= 0 (or NaN), written so that `omp simd` loops vectorise it: std::exp
// does not vectorise without -ffast-math, and scalar exps over (positions, 30522 classes) were
// most of BERT's loss. Cephes' expf polynomial, within 1.5 ulp; 0 below kExpLowestF32, NaN kept.
inline float exp_nonpositive_f32(float x) {
  // max(x, lowest) as a bit blend: a float select followed by arithmetic does not vectorise
  // under GCC's default -ftrapping-math.
  constexpr float kLowest = kExpLowestF32;
  int32_t x_bits, lowest_bits;
  std::memcpy(&x_bits, &x, sizeof(x_bits));
  std::memcpy(&lowest_bits, &kLowest, sizeof(lowest_bits));
  const int32_t below = -static_cast<int32_t>(x < kLowest);
  const int32_t clamped_bits = (x_bits & ~below) | (lowest_bits & below);
  float clamped;
  std::memcpy(&clamped, &clamped_bits, sizeof(clamped));
  // x = n ln2 + r, |r| <= ln2 / 2; adding 1.5 * 2^23 rounds n into the low mantissa bits.
  const float shifted = clamped * 1.44269504088896341f + 12582912.0f;
  int32_t shifted_bits;
  std::memcpy(&shifted_bits, &shifted, sizeof(shifted_bits));
  const float n = shifted - 12582912.0f;
  const float r = clamped - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t scale_bits = (shifted_bits - 0x4B400000 + 127) << 23;  // 2^n
  float scale;
  std::memcpy(&scale, &scale_bits, sizeof(scale));
  // Selects between constants and x only (these vectorise).
  const float keep = x < kLowest ? 0.0f : 1.0f;
  const float nan = x != x ? x : 0.0f;
  return p * scale * keep + nan;
}

}  // namespace tessel::cpu
