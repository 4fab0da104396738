// The CPU kernels of the factories, random tensors, copies and casts (ops/cpu/factory.cc); the
// ops' definitions are in ops/factory.cc.
#pragma once

#include "core/op.h"

namespace tessel::cpu {

// Creation: output 0 from the attributes alone, any dtype.
void full_kernel(KernelContext& context);
void arange_kernel(KernelContext& context);
// Random: element i from Philox counter i / 4 of the recorded (rng_seed, rng_offset), so the
// values do not depend on threads or strides.
void rand_kernel(KernelContext& context);
void randn_kernel(KernelContext& context);
void randint_kernel(KernelContext& context);
// clone and contiguous (a row-major copy of any strided input), to_dtype (any dtype to any).
void clone_kernel(KernelContext& context);
void to_dtype_kernel(KernelContext& context);
// In place: fill_ writes attr value; copy_ writes its source, broadcast and converted.
void fill_inplace_kernel(KernelContext& context);
void copy_inplace_kernel(KernelContext& context);

}  // namespace tessel::cpu
