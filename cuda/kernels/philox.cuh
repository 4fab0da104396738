// Philox 4x32-10 on the device: the same function as philox4x32 in core/rng.cc (same constants,
// rounds and word order), so a random op draws the same numbers on CUDA as on CPU for the same
// (seed, offset). The normal transform computes log, sin and cos in double and rounds to float,
// as core/rng.cc does, so both devices get the correctly rounded (identical) values.
//   Philox4 words = philox4x32_device(seed, offset + index / 4);  words.w[index % 4]
#pragma once

#include <cstdint>

namespace tessel::cuda {

struct Philox4 {
  uint32_t w[4];
};

__host__ __device__ inline Philox4 philox4x32_device(uint64_t seed, uint64_t counter) {
  constexpr uint32_t kMul0 = 0xD2511F53, kMul1 = 0xCD9E8D57;
  constexpr uint32_t kWeyl0 = 0x9E3779B9, kWeyl1 = 0xBB67AE85;
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32), c2 = 0,
           c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    uint64_t product0 = static_cast<uint64_t>(kMul0) * c0;
    uint64_t product1 = static_cast<uint64_t>(kMul1) * c2;
    uint32_t next0 = static_cast<uint32_t>(product1 >> 32) ^ c1 ^ k0;
    uint32_t next1 = static_cast<uint32_t>(product1);
    uint32_t next2 = static_cast<uint32_t>(product0 >> 32) ^ c3 ^ k1;
    uint32_t next3 = static_cast<uint32_t>(product0);
    c0 = next0, c1 = next1, c2 = next2, c3 = next3;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return Philox4{{c0, c1, c2, c3}};
}

// Uniform in [0, 1) from one word: 24 random bits scaled, exact in f32 (core/rng.h uniform_at).
__host__ __device__ inline float uniform_from_bits(uint32_t bits) {
  return static_cast<float>(bits >> 8) * (1.0f / 16777216.0f);
}

// Number `index` of the standard normal stream (core/rng.h normal_at): Box-Muller over the
// pair of words (2k, 2k + 1) of one counter; cos for even indices, sin for odd ones.
__host__ __device__ inline float normal_from_words(const Philox4& words, uint64_t index) {
  const int pair = static_cast<int>((index % 4) / 2);
  const float u1 = (static_cast<float>(words.w[2 * pair] >> 8) + 1.0f) * (1.0f / 16777216.0f);
  const float u2 = uniform_from_bits(words.w[2 * pair + 1]);
  const float log_u1 = static_cast<float>(log(static_cast<double>(u1)));
  const float radius = static_cast<float>(sqrt(static_cast<double>(-2.0f * log_u1)));
  const float angle = 6.283185307179586f * u2;
  const float trig = (index & 1) ? static_cast<float>(sin(static_cast<double>(angle)))
                                 : static_cast<float>(cos(static_cast<double>(angle)));
  return radius * trig;
}

}  // namespace tessel::cuda
