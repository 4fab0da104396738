// The CPU kernel of dropout (ops/cpu/dropout.cc), and the scale of kept elements, which the
// op's backward (ops/dropout.cc) applies too.
#pragma once

#include "core/op.h"

namespace tessel::cpu {

// 1 / (1 - p), the factor kept elements are scaled by (0 when p is 1).
double keep_scale(double p);

// inputs (x); outputs (y, mask): y = x * mask / (1 - p), mask bool (true: kept). f32 and f64.
void dropout_kernel(KernelContext& context);

}  // namespace tessel::cpu
