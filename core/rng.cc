#include "core/rng.h"

#include <cmath>
#include <mutex>

namespace tessel {

namespace {
std::mutex rng_mutex;
RngState global_state{67280421310721ull, 0};
}  // namespace

void manual_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(rng_mutex);
  global_state = RngState{seed, 0};
}

RngState get_rng_state() {
  std::lock_guard<std::mutex> lock(rng_mutex);
  return global_state;
}

void set_rng_state(const RngState& state) {
  std::lock_guard<std::mutex> lock(rng_mutex);
  global_state = state;
}

RngState reserve_rng(uint64_t counters) {
  std::lock_guard<std::mutex> lock(rng_mutex);
  RngState start = global_state;
  global_state.offset += counters;
  return start;
}

std::array<uint32_t, 4> philox4x32(uint64_t seed, uint64_t counter) {
  constexpr uint32_t kMul0 = 0xD2511F53, kMul1 = 0xCD9E8D57;
  constexpr uint32_t kWeyl0 = 0x9E3779B9, kWeyl1 = 0xBB67AE85;
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32), c2 = 0,
           c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
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
  return {c0, c1, c2, c3};
}

uint32_t random_bits(const RngState& state, uint64_t index) {
  return philox4x32(state.seed, state.offset + index / 4)[index % 4];
}

float uniform_at(const RngState& state, uint64_t index) {
  return static_cast<float>(random_bits(state, index) >> 8) * (1.0f / 16777216.0f);
}

float normal_at(const RngState& state, uint64_t index) {
  uint64_t pair = index & ~uint64_t{1};
  // u1 in (0, 1] so the log is finite.
  float u1 = (static_cast<float>(random_bits(state, pair) >> 8) + 1.0f) * (1.0f / 16777216.0f);
  float u2 = uniform_at(state, pair + 1);
  // log, sin and cos in double, rounded to float: correctly rounded on any libm (glibc's float
  // versions are not, in about 1% of cases), so the CUDA kernels give the same bits.
  float radius = std::sqrt(-2.0f * static_cast<float>(std::log(static_cast<double>(u1))));
  float angle = 6.283185307179586f * u2;
  double trig =
      (index & 1) ? std::sin(static_cast<double>(angle)) : std::cos(static_cast<double>(angle));
  return radius * static_cast<float>(trig);
}

}  // namespace tessel
