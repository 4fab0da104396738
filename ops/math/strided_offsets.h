// Offsets of N operands over one loop shape, from the row-major index of an element: what the
// CUDA element-wise kernels compute per element. Index is uint32_t when the loop and every
// offset fit in 31 bits (a 32-bit divide per dim instead of a 64-bit one), int64_t otherwise.
// Built on the host from a coalesced loop (ops/math/loop_geometry.h).
//   uint32_t offsets[2];  calculator.offsets(i, offsets);  out[offsets[0]] = f(in[offsets[1]]);
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace tessel {

// Dims a device loop may have after coalescing.
constexpr int kMaxLoopDims = 8;

template <int N, typename Index>
struct OffsetCalculator {
  int ndim = 1;  // at least one dim
  Index sizes[kMaxLoopDims] = {};
  Index strides[N][kMaxLoopDims] = {};

  TESSEL_HOST_DEVICE void offsets(Index linear, Index (&result)[N]) const {
    TESSEL_UNROLL
    for (int k = 0; k < N; ++k) result[k] = 0;
    for (int d = ndim - 1; d > 0; --d) {
      const Index rest = linear / sizes[d];
      const Index index = linear - rest * sizes[d];
      linear = rest;
      TESSEL_UNROLL
      for (int k = 0; k < N; ++k) result[k] += index * strides[k][d];
    }
    // The outermost index is what is left: linear < numel needs no last divide.
    TESSEL_UNROLL
    for (int k = 0; k < N; ++k) result[k] += linear * strides[k][0];
  }
};

}  // namespace tessel
