// The CPU kernels of matmul, bmm and linear (ops/cpu/linalg.cc); the ops' definitions are in
// ops/linalg.cc.
#pragma once

#include "core/op.h"

namespace tessel::cpu {

// The kernels, for f32 and f64 (16-bit floats go through cpu::with_f32_fallback).
void matmul_kernel(KernelContext& context);
void bmm_kernel(KernelContext& context);
void linear_kernel(KernelContext& context);

}  // namespace tessel::cpu
