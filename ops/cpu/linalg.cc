// The CPU kernels of matmul, bmm, linear and addmm: one (batched) GEMM through ops/cpu/gemm.h.
// Kernels read strided operands in place when each matrix is row- or column-major (a transpose is
// then free), and copy to a dense workspace only otherwise.
#include <algorithm>
#include <vector>

#include "ops/cpu/gemm.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/strided_copy.h"
#include "ops/math/matrix_layout.h"
#include "ops/ops.h"
#include "ops/registry_helpers.h"

namespace tessel::cpu {

namespace {

// One operand of a (batched) GEMM as gemm.h reads it.
template <typename T>
struct GemmOperand {
  const T* data = nullptr;
  int64_t ld = 0;
  int64_t batch_stride = 0;
  bool transposed = false;
};

// The last two dims of `matrix` (2-D, or 3-D with a batch dim in front) as a GEMM operand,
// reading it in place when possible and from a dense copy otherwise.
template <typename T>
GemmOperand<T> gemm_operand(KernelContext& context, const Tensor& matrix) {
  const Shape& sizes = matrix.sizes();
  const Shape& strides = matrix.strides();
  const size_t ndim = sizes.size();
  const MatrixLayout layout =
      operand_layout(sizes[ndim - 2], sizes[ndim - 1], strides[ndim - 2], strides[ndim - 1],
                     ndim == 3 ? sizes[0] : 1, ndim == 3 ? strides[0] : 0);
  GemmOperand<T> operand;
  operand.data = layout.in_place ? matrix.data_ptr<T>()
                                 : cpu::dense_input(context, matrix).template data_ptr<T>();
  operand.ld = layout.ld;
  operand.batch_stride = layout.batch_stride;
  operand.transposed = layout.transposed;
  return operand;
}

bool shares_storage(const Tensor& output, const std::vector<Tensor>& inputs) {
  for (const auto& input : inputs)
    if (input.defined() && input.storage() == output.storage()) return true;
  return false;
}

// Where a kernel writes a (batched) row-major result: the output itself when its layout allows
// and it aliases no input, else a dense workspace copied back by `finish`.
template <typename T>
struct GemmResult {
  Tensor workspace;  // defined when staged
  T* data = nullptr;
  int64_t ld = 0;
  int64_t batch_stride = 0;

  GemmResult(KernelContext& context, const Tensor& output) {
    const Shape& sizes = output.sizes();
    const Shape& strides = output.strides();
    const size_t ndim = sizes.size();
    const MatrixLayout layout =
        result_layout(sizes[ndim - 2], sizes[ndim - 1], strides[ndim - 2], strides[ndim - 1],
                      ndim == 3 ? sizes[0] : 1, ndim == 3 ? strides[0] : 0,
                      shares_storage(output, context.inputs));
    if (!layout.in_place) workspace = context.workspace(output.sizes(), output.dtype());
    data = (layout.in_place ? output : workspace).template data_ptr<T>();
    ld = layout.ld;
    batch_stride = layout.batch_stride;
  }
  void finish(const Tensor& output) const {
    if (workspace.defined()) cpu::copy_strided(workspace, output);
  }
};

// a (B, n, k) x b (B, k, m) -> out (B, n, m); 2-D tensors are one batch entry.
template <typename T>
void batched_product_kernel(KernelContext& context) {
  const Tensor& a = context.inputs[0];
  const Tensor& b = context.inputs[1];
  const Tensor& out = context.outputs[0];
  const Shape& sizes = out.sizes();
  const size_t ndim = sizes.size();
  const int64_t n = sizes[ndim - 2], m = sizes[ndim - 1], k = a.sizes()[ndim - 1];
  const int64_t batch = ndim == 3 ? sizes[0] : 1;
  if (n == 0 || m == 0 || batch == 0) return;
  GemmOperand<T> lhs = gemm_operand<T>(context, a);
  GemmOperand<T> rhs = gemm_operand<T>(context, b);
  GemmResult<T> result(context, out);
  if (batch == 1) {
    cpu::gemm(lhs.transposed, rhs.transposed, n, m, k, T(1), lhs.data, lhs.ld, rhs.data, rhs.ld,
              T(0), result.data, result.ld);
  } else {
    cpu::gemm_batched(lhs.transposed, rhs.transposed, n, m, k, T(1), lhs.data, lhs.ld,
                      lhs.batch_stride, rhs.data, rhs.ld, rhs.batch_stride, T(0), result.data,
                      result.ld, result.batch_stride, batch);
  }
  result.finish(out);
}

// out (..., out_features) = x (..., in) W^T + bias.
template <typename T>
void linear_product_kernel(KernelContext& context) {
  const Tensor& x = context.inputs[0];
  const Tensor& weight = context.inputs[1];
  const Tensor& bias = context.inputs[2];
  const Tensor& out = context.outputs[0];
  if (out.numel() == 0) return;
  const int64_t in_features = weight.size(1), out_features = weight.size(0);
  const int64_t rows = x.numel() / std::max<int64_t>(in_features, 1);

  int64_t x_ld = collapsed_row_stride(x.sizes().data(), x.strides().data(), x.dim());
  bool x_transposed = false;
  if (x_ld >= 0 && in_features > 1 && x.stride(-1) != 1) x_ld = -1;
  if (x_ld < 0 && x.dim() == 2) {
    // A transposed 2-D input (e.g. x.t()) is still read in place.
    int64_t column_ld = row_major_ld(in_features, rows, x.stride(1), x.stride(0));
    if (column_ld >= 0) x_ld = column_ld, x_transposed = true;
  }
  const T* x_data = x_ld < 0 ? cpu::dense_data<T>(context, x) : x.data_ptr<T>();
  if (x_ld < 0) x_ld = std::max<int64_t>(in_features, 1);
  // Dense scratch when the output is strided or aliases an input; one row-major matrix otherwise.
  Tensor staged;
  if (!out.is_contiguous() || shares_storage(out, context.inputs))
    staged = context.workspace(out.sizes(), out.dtype());
  T* result = (staged.defined() ? staged : out).data_ptr<T>();

  // W^T: a row-major W (out, in) is read transposed; a transposed view of one is read as is.
  GemmOperand<T> w = gemm_operand<T>(context, weight);
  const int64_t ldc = std::max<int64_t>(out_features, 1);
  if (!bias.defined()) {
    cpu::gemm(x_transposed, !w.transposed, rows, out_features, in_features, T(1), x_data, x_ld,
              w.data, w.ld, T(0), result, ldc);
  } else {
    // The product starts from the bias in every row (the kernel reads it where C's old value
    // would be), so the output is written once.
    cpu::gemm_onto_row(x_transposed, !w.transposed, rows, out_features, in_features, T(1), x_data,
                       x_ld, w.data, w.ld, cpu::dense_data<T>(context, bias), result, ldc);
  }
  if (staged.defined()) cpu::copy_strided(staged, out);
}

// out (n, m) = c + a (n, k) b (k, m): out holds c first (it is c when called in place), then the
// GEMM adds the product onto it.
template <typename T>
void addmm_product_kernel(KernelContext& context) {
  const Tensor& c = context.inputs[0];
  const Tensor& a = context.inputs[1];
  const Tensor& b = context.inputs[2];
  const Tensor& out = context.outputs[0];
  if (out.numel() == 0) return;
  const int64_t n = out.size(0), m = out.size(1), k = a.size(1);
  const AccumulateLayout layout = accumulate_layout(out, c, a, b);
  Tensor target = layout.result.in_place ? out : context.workspace(out.sizes(), out.dtype());
  if (layout.copy_c) cpu::copy_strided(c, target);
  if (k > 0) {
    GemmOperand<T> lhs = gemm_operand<T>(context, a);
    GemmOperand<T> rhs = gemm_operand<T>(context, b);
    cpu::gemm(lhs.transposed, rhs.transposed, n, m, k, T(1), lhs.data, lhs.ld, rhs.data, rhs.ld,
              T(1), target.data_ptr<T>(), layout.result.ld);
  }
  if (!target.is_same(out)) cpu::copy_strided(target, out);
}

}  // namespace

void addmm_kernel(KernelContext& context) {
  visit_float_dtype(context.outputs[0].dtype(), "addmm",
                    [&](auto tag) { addmm_product_kernel<decltype(tag)>(context); });
}

void matmul_kernel(KernelContext& context) {
  visit_float_dtype(context.outputs[0].dtype(), "matmul",
                    [&](auto tag) { batched_product_kernel<decltype(tag)>(context); });
}

void bmm_kernel(KernelContext& context) {
  visit_float_dtype(context.outputs[0].dtype(), "bmm",
                    [&](auto tag) { batched_product_kernel<decltype(tag)>(context); });
}

void linear_kernel(KernelContext& context) {
  visit_float_dtype(context.outputs[0].dtype(), "linear",
                    [&](auto tag) { linear_product_kernel<decltype(tag)>(context); });
}

}  // namespace tessel::cpu
