// The CPU kernels of batch_norm (training and eval), layer_norm and their backward ops
// (ops/cpu/norm.cc); the ops' definitions are in ops/norm.cc.
#pragma once

#include "core/op.h"

namespace tessel::cpu {

// f32 and f64; the inputs and outputs each op's definition lists.
void batch_norm_train_kernel(KernelContext& context);
void batch_norm_eval_kernel(KernelContext& context);
void batch_norm_backward_kernel(KernelContext& context);
void layer_norm_kernel(KernelContext& context);
void layer_norm_backward_kernel(KernelContext& context);

}  // namespace tessel::cpu
