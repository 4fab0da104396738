// The CPU kernels of the element-wise ops (ops/cpu/elementwise.cc); the ops' definitions are in
// ops/elementwise.cc. Ops of one kind (binary, comparison, scalar, unary) share a kernel that
// takes the kind and the op's name.
#pragma once

#include "core/op.h"
#include "ops/math/elementwise.h"

namespace tessel::cpu {

// The output's dtype: f32, f64 or an integer one (bool where the kind allows it); inputs are
// converted to it first. Attr alpha scales b for add and sub.
void binary_kernel(math::Binary kind, KernelContext& context);
// Inputs compared in their promoted dtype (16-bit floats in f32); a bool output.
Kernel comparison_kernel(const char* name, math::Compare kind);
// `tensor (kind) scalar`, the scalar from attribute `attr`, in the tensor's dtype.
Kernel scalar_kernel(const char* name, math::ScalarOp kind, const char* attr);
Kernel unary_kernel(const char* name, math::Unary kind);
void gelu_kernel(KernelContext& context);
void gelu_backward_kernel(KernelContext& context);
void relu_backward_kernel(KernelContext& context);
void clamp_kernel(KernelContext& context);
void where_kernel(KernelContext& context);
void masked_fill_kernel(KernelContext& context);

// Whether gelu's attribute approximate is "tanh" (else "none"; anything else is an error).
bool gelu_uses_tanh(const Attrs& attrs);

}  // namespace tessel::cpu
