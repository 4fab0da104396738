// Philox 4x32-10 and the transforms every random op applies to its words, shared by the CPU
// kernels (core/rng.h) and the CUDA kernels, so both devices draw the same numbers for the same
// (seed, offset). Number `index` of a stream uses word index % 4 of counter offset + index / 4.
//   PhiloxWords words = philox4x32_words(seed, offset + index / 4);
//   float u = uniform_from_bits(words.w[index % 4]);  float z = normal_from_words(words, index);
#pragma once

#include <cmath>
#include <cstdint>

#include "core/host_device.h"

namespace tessel {

struct PhiloxWords {
  uint32_t w[4];
};

// Each round multiplies words 0 and 2 by these and adds the Weyl constants to the key.
constexpr uint32_t kPhiloxMul0 = 0xD2511F53, kPhiloxMul1 = 0xCD9E8D57;
constexpr uint32_t kPhiloxWeyl0 = 0x9E3779B9, kPhiloxWeyl1 = 0xBB67AE85;

TESSEL_HOST_DEVICE inline PhiloxWords philox4x32_words(uint64_t seed, uint64_t counter) {
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32), c2 = 0,
           c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  TESSEL_UNROLL
  for (int round = 0; round < 10; ++round) {
    const uint64_t product0 = static_cast<uint64_t>(kPhiloxMul0) * c0;
    const uint64_t product1 = static_cast<uint64_t>(kPhiloxMul1) * c2;
    const uint32_t next0 = static_cast<uint32_t>(product1 >> 32) ^ c1 ^ k0;
    const uint32_t next1 = static_cast<uint32_t>(product1);
    const uint32_t next2 = static_cast<uint32_t>(product0 >> 32) ^ c3 ^ k1;
    const uint32_t next3 = static_cast<uint32_t>(product0);
    c0 = next0, c1 = next1, c2 = next2, c3 = next3;
    k0 += kPhiloxWeyl0;
    k1 += kPhiloxWeyl1;
  }
  return PhiloxWords{{c0, c1, c2, c3}};
}

// Uniform in [0, 1) from one word: 24 random bits scaled, exact in f32.
TESSEL_HOST_DEVICE inline float uniform_from_bits(uint32_t bits) {
  return static_cast<float>(bits >> 8) * (1.0f / 16777216.0f);
}

// Box-Muller over the words (u1, u2) of one pair: radius sqrt(-2 log u1) with u1 in (0, 1] so
// the log is finite, angle 2 pi u2. log, sqrt, sin and cos are computed in double and rounded
// to float: correctly rounded on any libm and on CUDA, so every device gets the same bits.
TESSEL_HOST_DEVICE inline float box_muller_radius(uint32_t u1_bits) {
  const float u1 = (static_cast<float>(u1_bits >> 8) + 1.0f) * (1.0f / 16777216.0f);
  const float log_u1 = static_cast<float>(::log(static_cast<double>(u1)));
  return static_cast<float>(::sqrt(static_cast<double>(-2.0f * log_u1)));
}

TESSEL_HOST_DEVICE inline float box_muller_angle(uint32_t u2_bits) {
  return 6.283185307179586f * uniform_from_bits(u2_bits);
}

// The normal of one pair: cos for the first number of the pair, sin for the second.
TESSEL_HOST_DEVICE inline float box_muller_normal(float radius, float angle, bool second) {
  const double trig =
      second ? ::sin(static_cast<double>(angle)) : ::cos(static_cast<double>(angle));
  return radius * static_cast<float>(trig);
}

// Number `index` of the standard normal stream, from the words of counter index / 4: the pair
// of words (2k, 2k + 1) holding it.
TESSEL_HOST_DEVICE inline float normal_from_words(const PhiloxWords& words, uint64_t index) {
  const int pair = static_cast<int>((index % 4) / 2);
  return box_muller_normal(box_muller_radius(words.w[2 * pair]),
                           box_muller_angle(words.w[2 * pair + 1]), (index & 1) != 0);
}

}  // namespace tessel
