// The CPU kernels of the pooling ops and their gradients (ops/cpu/pool.cc), and the window
// geometry that the ops' definitions (ops/pool.cc) check shapes with.
#pragma once

#include <utility>
#include <vector>

#include "core/op.h"
#include "ops/math/pooling.h"

namespace tessel::cpu {

// The two values (h, w) of attribute `name`.
std::vector<int64_t> attr_pair(const Attrs& attrs, const char* op, const char* name);
// The two axes of a max/avg pool from its attributes and an input of `sizes` (N, C, H, W).
std::pair<PoolAxis, PoolAxis> pool_axes(const char* op, const Shape& sizes, const Attrs& attrs,
                                        bool with_dilation);

// The kernels, for f32 and f64 (the dtype of output 0).
void max_pool2d_kernel(KernelContext& context);
void max_pool2d_backward_kernel(KernelContext& context);
void avg_pool2d_kernel(KernelContext& context);
void avg_pool2d_backward_kernel(KernelContext& context);
void adaptive_avg_pool2d_kernel(KernelContext& context);
void adaptive_avg_pool2d_backward_kernel(KernelContext& context);

}  // namespace tessel::cpu
