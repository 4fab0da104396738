// Host-side planning of strided, broadcasting element-wise loops, shared by the CPU loops
// (ops/cpu/loops.h) and the CUDA launchers (cuda/ops/loops.cuh): broadcast strides, dims
// coalesced (size-1 dims dropped, dims adjacent in memory for every operand merged, row-major
// order kept, so an element's row-major index is unchanged), and the device offset calculator.
//   CoalescedLoop<2> loop = coalesce_loop<2>(out.sizes(), {out.strides(), broadcast_strides(in,
//   out.sizes())});
#pragma once

#include <array>
#include <cstdint>
#include <limits>

#include "core/error.h"
#include "core/shape.h"
#include "core/tensor.h"
#include "ops/math/strided_offsets.h"

namespace tessel {

// Strides (in elements) of a tensor of `own_sizes` / `own_strides` read as if broadcast to
// `sizes`: 0 on broadcast dims.
inline Shape broadcast_strides(const Shape& own_sizes, const Shape& own_strides,
                               const Shape& sizes) {
  Shape strides(sizes.size(), 0);
  const size_t lead = sizes.size() - own_sizes.size();
  for (size_t i = 0; i < own_sizes.size(); ++i)
    strides[lead + i] = own_sizes[i] == 1 ? 0 : own_strides[i];
  return strides;
}

inline Shape broadcast_strides(const Tensor& tensor, const Shape& sizes) {
  return broadcast_strides(tensor.sizes(), tensor.strides(), sizes);
}

// A loop shape after coalescing, with each operand's element strides; at least one dim (a
// 0-d loop is one element: size 1, strides 0).
template <size_t N>
struct CoalescedLoop {
  Shape sizes;
  std::array<Shape, N> strides{};

  int64_t numel() const { return shape_numel(sizes); }
  // One dim that every operand walks with stride 1 (or a single element): offset == index.
  bool contiguous() const {
    if (sizes.size() != 1) return false;
    if (sizes[0] <= 1) return true;
    for (size_t k = 0; k < N; ++k)
      if (strides[k][0] != 1) return false;
    return true;
  }
  // Whether every index and offset of the loop fits in 31 bits (strides >= 0), so device code
  // may compute them in 32-bit arithmetic.
  bool fits_32bit() const {
    constexpr int64_t kLimit = std::numeric_limits<int32_t>::max();
    if (numel() > kLimit) return false;
    for (size_t k = 0; k < N; ++k) {
      int64_t last = 0;  // offset of the last element
      for (size_t d = 0; d < sizes.size(); ++d) {
        if (strides[k][d] < 0) return false;
        if (sizes[d] > 0 && strides[k][d] > kLimit) return false;
        last += (sizes[d] > 0 ? sizes[d] - 1 : 0) * strides[k][d];
        if (last > kLimit) return false;
      }
    }
    return true;
  }
};

template <size_t N>
CoalescedLoop<N> coalesce_loop(const Shape& loop_sizes,
                               const std::array<Shape, N>& element_strides) {
  CoalescedLoop<N> loop;
  for (size_t d = 0; d < loop_sizes.size(); ++d) {
    if (loop_sizes[d] == 1) continue;
    bool merged = !loop.sizes.empty();
    for (size_t k = 0; merged && k < N; ++k)
      merged = loop.strides[k].back() == element_strides[k][d] * loop_sizes[d];
    if (merged) {
      loop.sizes.back() *= loop_sizes[d];
      for (size_t k = 0; k < N; ++k) loop.strides[k].back() = element_strides[k][d];
    } else {
      loop.sizes.push_back(loop_sizes[d]);
      for (size_t k = 0; k < N; ++k) loop.strides[k].push_back(element_strides[k][d]);
    }
  }
  if (loop.sizes.empty()) {
    loop.sizes.push_back(1);
    for (size_t k = 0; k < N; ++k) loop.strides[k].push_back(0);
  }
  return loop;
}

// The device form of `loop`; Index uint32_t only when loop.fits_32bit().
template <size_t N, typename Index>
OffsetCalculator<static_cast<int>(N), Index> offset_calculator(const CoalescedLoop<N>& loop) {
  TESSEL_CHECK(loop.sizes.size() <= static_cast<size_t>(kMaxLoopDims), "element-wise loop over ",
               loop.sizes.size(), " non-mergeable dims (sizes ", shape_str(loop.sizes),
               ") exceeds the limit of ", kMaxLoopDims, "; call .contiguous() first");
  OffsetCalculator<static_cast<int>(N), Index> calculator;
  calculator.ndim = static_cast<int>(loop.sizes.size());
  for (size_t d = 0; d < loop.sizes.size(); ++d) {
    calculator.sizes[d] = static_cast<Index>(loop.sizes[d]);
    for (size_t k = 0; k < N; ++k)
      calculator.strides[k][d] = static_cast<Index>(loop.strides[k][d]);
  }
  return calculator;
}

}  // namespace tessel
