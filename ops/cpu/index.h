// The CPU kernels of cat and the gathering ops with their scatter-add gradients
// (ops/cpu/index.cc); the ops' definitions are in ops/index.cc.
#pragma once

#include "core/op.h"

namespace tessel::cpu {

// Any dtype (the gradients: f32 and f64); i64 or i32 indices, checked against the sizes.
void cat_kernel(KernelContext& ctx);
void index_select_kernel(KernelContext& ctx);
void index_select_backward_kernel(KernelContext& ctx);
void gather_kernel(KernelContext& ctx);
void gather_backward_kernel(KernelContext& ctx);
void embedding_kernel(KernelContext& ctx);
void embedding_backward_kernel(KernelContext& ctx);

}  // namespace tessel::cpu
