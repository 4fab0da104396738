#include "core/rng.h"

#include <mutex>

#include "core/philox.h"

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
  const PhiloxWords words = philox4x32_words(seed, counter);
  return {words.w[0], words.w[1], words.w[2], words.w[3]};
}

uint32_t random_bits(const RngState& state, uint64_t index) {
  return philox4x32_words(state.seed, state.offset + index / 4).w[index % 4];
}

float uniform_at(const RngState& state, uint64_t index) {
  return uniform_from_bits(random_bits(state, index));
}

float normal_at(const RngState& state, uint64_t index) {
  return normal_from_words(philox4x32_words(state.seed, state.offset + index / 4), index);
}

}  // namespace tessel
