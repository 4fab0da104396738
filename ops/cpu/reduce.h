// The CPU kernels of the reductions and of softmax / log_softmax (ops/cpu/reduce.cc); the ops'
// definitions are in ops/reduce.cc. Ops that share a kernel pass what tells them apart.
#pragma once

#include "core/op.h"

namespace tessel::cpu {

// sum (integers summed in i64) or mean (`is_mean`); `name` names the op in errors.
Kernel sum_mean_kernel(const char* name, bool is_mean);
// max or min along a dim: outputs values and i64 indices (the first on ties).
Kernel extremum_dim_kernel(const char* name, bool is_max);
// max or min over all elements: one 0-d output.
Kernel extremum_all_kernel(const char* all_name, bool is_max);
void argmax_kernel(KernelContext& context);
void var_kernel(KernelContext& context);
// softmax, or log_softmax (`log_form`).
Kernel softmax_kernel(const char* name, bool log_form);

}  // namespace tessel::cpu
