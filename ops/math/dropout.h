// The dropout of one Philox counter, shared by the CPU and CUDA kernels: its four elements
// (fewer at the end) are kept iff their uniform number is >= p, and kept ones are scaled.
//   for (counter < (numel + 3) / 4) dropout_counter(x, y, mask, numel, seed, offset, counter, p,
//   s);
#pragma once

#include <cstdint>

#include "core/host_device.h"
#include "core/philox.h"

namespace tessel {

template <typename T>
TESSEL_HOST_DEVICE inline void dropout_counter(const T* x, T* y, bool* mask, int64_t numel,
                                               uint64_t seed, uint64_t offset, int64_t counter,
                                               double p, T scale) {
  const PhiloxWords words = philox4x32_words(seed, offset + static_cast<uint64_t>(counter));
  for (int lane = 0; lane < 4; ++lane) {
    const int64_t i = counter * 4 + lane;
    if (i >= numel) break;
    const bool keep = static_cast<double>(uniform_from_bits(words.w[lane])) >= p;
    mask[i] = keep;
    y[i] = keep ? static_cast<T>(x[i] * scale) : T(0);
  }
}

}  // namespace tessel
