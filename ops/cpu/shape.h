// The CPU kernel of slice_backward (ops/cpu/shape.cc), and the slice geometry that the view
// ops' definitions (ops/shape.cc) and the kernel share.
#pragma once

#include <cstdint>

#include "core/op.h"

namespace tessel::cpu {

// Python-style slice bounds: negative indices count from the end, out-of-range ones clamp.
struct SliceRange {
  int64_t start;
  int64_t length;
};

SliceRange normalize_slice(int64_t size, int64_t start, int64_t end, int64_t step);
// The view of `x` that slice's attributes (dim, start, end, step) select.
Tensor slice_geometry(const Tensor& x, const Attrs& attrs);

// Zeros of input_sizes with input 0 (the gradient) written into the slice; any dtype.
void slice_backward_kernel(KernelContext& ctx);

}  // namespace tessel::cpu
