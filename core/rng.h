// Counter-based random numbers (Philox 4x32-10): element i of a random op depends only on
// (seed, offset, i), so a recompute replays it exactly, a resume is exact, and CPU and CUDA
// produce the same numbers.
//   manual_seed(42); RngState saved = get_rng_state(); ...; set_rng_state(saved);
#pragma once

#include <array>
#include <cstdint>

namespace tessel {

struct RngState {
  uint64_t seed = 0;
  uint64_t offset = 0;  // in Philox counters (4 numbers each) already consumed
  bool operator==(const RngState& other) const {
    return seed == other.seed && offset == other.offset;
  }
};

// The process-wide generator (thread-safe).
void manual_seed(uint64_t seed);
RngState get_rng_state();
void set_rng_state(const RngState& state);
// Reserves `counters` Philox counters; returns the state to generate them from.
RngState reserve_rng(uint64_t counters);

// Philox 4x32-10: four 32-bit random words for counter `counter` under key `seed` (the function
// of core/philox.h, which CUDA kernels share).
std::array<uint32_t, 4> philox4x32(uint64_t seed, uint64_t counter);

// Number `index` (0-based) of the stream starting at `state`, as used by every random kernel.
uint32_t random_bits(const RngState& state, uint64_t index);
// Uniform in [0, 1): 24 random bits scaled, exact in f32.
float uniform_at(const RngState& state, uint64_t index);
// Standard normal by Box-Muller over numbers (2k, 2k+1); `index` picks cos (even) or sin (odd).
float normal_at(const RngState& state, uint64_t index);

}  // namespace tessel
