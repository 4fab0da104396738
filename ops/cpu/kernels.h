// The CPU kernels of the op families, one section per family: each family's kernels are
// defined in ops/cpu/NAME.cc and attached by its definition in ops/NAME.cc (conv, whose geometry
// is an API of its own, has ops/cpu/conv.h). With them, what a family's definition and kernels
// share (attribute parsing, layouts).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/op.h"
#include "ops/math/elementwise.h"
#include "ops/math/pooling.h"

namespace tessel::cpu {

// ---- dropout ----
// The CPU kernel of dropout (ops/cpu/dropout.cc), and the scale of kept elements, which the op's
// backward (ops/dropout.cc) applies too.

// 1 / (1 - p), the factor kept elements are scaled by (0 when p is 1).
double keep_scale(double p);

// inputs (x); outputs (y, mask): y = x * mask / (1 - p), mask bool (true: kept). f32 and f64.
void dropout_kernel(KernelContext& context);

// ---- elementwise ----
// The CPU kernels of the element-wise ops (ops/cpu/elementwise.cc); the ops' definitions are in
// ops/elementwise.cc. Ops of one kind (binary, comparison, scalar, unary) share a kernel that
// takes the kind and the op's name.

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

// ---- factory ----
// The CPU kernels of the factories, random tensors, copies and casts (ops/cpu/factory.cc); the
// ops' definitions are in ops/factory.cc.

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

// ---- index ----
// The CPU kernels of cat and the gathering ops with their scatter-add gradients
// (ops/cpu/index.cc); the ops' definitions are in ops/index.cc.

// Any dtype (the gradients: f32 and f64); i64 or i32 indices, checked against the sizes.
void cat_kernel(KernelContext& ctx);
void index_select_kernel(KernelContext& ctx);
void index_select_backward_kernel(KernelContext& ctx);
void gather_kernel(KernelContext& ctx);
void gather_backward_kernel(KernelContext& ctx);
void embedding_kernel(KernelContext& ctx);
void embedding_backward_kernel(KernelContext& ctx);

// ---- linalg ----
// The CPU kernels of matmul, bmm and linear (ops/cpu/linalg.cc); the ops' definitions are in
// ops/linalg.cc.

// The kernels, for f32 and f64 (16-bit floats go through cpu::with_f32_fallback).
void matmul_kernel(KernelContext& context);
void bmm_kernel(KernelContext& context);
void linear_kernel(KernelContext& context);
void addmm_kernel(KernelContext& context);

// ---- loss ----
// The CPU kernels of the losses and their gradients (ops/cpu/loss.cc), and what the losses'
// definitions (ops/loss.cc) share with them: the reduction attribute and the class layout.

enum class Reduction { kNone, kMean, kSum };

// The `reduction` attribute ("none", "mean" or "sum"); `op` names the op in the error.
Reduction parse_reduction(const char* op, const std::string& reduction);
Reduction reduction_of(const char* op, const Attrs& attrs);

// Scores viewed as (outer, classes, inner): (C) is (1, C, 1), (N, C, d...) is (N, C, prod d).
struct ClassLayout {
  int64_t outer, classes, inner;
  int64_t positions() const { return outer * inner; }
};

ClassLayout class_layout(const Shape& sizes);

// f32 and f64; the inputs and outputs each op's definition lists.
void cross_entropy_kernel(KernelContext& context);
void cross_entropy_backward_kernel(KernelContext& context);
void nll_loss_kernel(KernelContext& context);
void nll_loss_backward_kernel(KernelContext& context);
void mse_loss_kernel(KernelContext& context);

// ---- norm ----
// The CPU kernels of batch_norm (training and eval), layer_norm and their backward ops
// (ops/cpu/norm.cc); the ops' definitions are in ops/norm.cc.

// f32 and f64; the inputs and outputs each op's definition lists.
void batch_norm_train_kernel(KernelContext& context);
void batch_norm_eval_kernel(KernelContext& context);
void batch_norm_backward_kernel(KernelContext& context);
void layer_norm_kernel(KernelContext& context);
void layer_norm_backward_kernel(KernelContext& context);

// ---- pool ----
// The CPU kernels of the pooling ops and their gradients (ops/cpu/pool.cc), and the window
// geometry that the ops' definitions (ops/pool.cc) check shapes with.

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

// ---- reduce ----
// The CPU kernels of the reductions and of softmax / log_softmax (ops/cpu/reduce.cc); the ops'
// definitions are in ops/reduce.cc. Ops that share a kernel pass what tells them apart.

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

// ---- shape ----
// The CPU kernel of slice_backward (ops/cpu/shape.cc), and the slice geometry that the view ops'
// definitions (ops/shape.cc) and the kernel share.

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
