// cuBLAS kernels for matmul, bmm, linear and addmm on CUDA tensors: f32, f64, and bf16/f16 with f32
// accumulation (cublasGemmEx / cublasGemmStridedBatchedEx). Row- or column-major operands are
// read in place through cuBLAS's transposes; other layouts are copied dense first. TF32 for f32
// products is off unless cuda::set_allow_tf32(true) or TESSEL_ALLOW_TF32=1.
#include <cublas_v2.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "cuda/ops/loops.cuh"
#include "ops/linalg.h"
#include "ops/math/matrix_layout.h"
#include "ops/registry_helpers.h"

namespace tessel::cuda {

namespace {

constexpr DeviceType kCuda = DeviceType::kCuda;

// A logical row-major matrix (rows x cols) as cuBLAS reads it: `column_major` when its memory
// holds it column by column (a transposed view), with leading dimension `ld`.
struct Matrix {
  void* data = nullptr;
  int64_t ld = 0;
  int64_t batch_stride = 0;
  bool column_major = false;
};

// The last two dims of `tensor` (2-D, or 3-D with a batch dim in front), in place when it is row-
// or column-major, else from a dense copy (ops/math/matrix_layout.h, as on CPU).
Matrix matrix_operand(KernelContext& context, const Tensor& tensor) {
  const int64_t ndim = tensor.dim();
  const MatrixLayout layout = operand_layout(
      tensor.size(ndim - 2), tensor.size(ndim - 1), tensor.stride(ndim - 2),
      tensor.stride(ndim - 1), ndim == 3 ? tensor.size(0) : 1, ndim == 3 ? tensor.stride(0) : 0);
  Matrix matrix;
  matrix.data = layout.in_place ? tensor.raw_data() : dense_input(context, tensor).raw_data();
  matrix.ld = layout.ld;
  matrix.batch_stride = layout.batch_stride;
  matrix.column_major = layout.transposed;
  return matrix;
}

bool shares_storage(const Tensor& output, const std::vector<Tensor>& inputs) {
  for (const auto& input : inputs)
    if (input.defined() && input.storage() == output.storage()) return true;
  return false;
}

// Where a product writes its (batched) row-major result: the output itself when its layout allows
// and it aliases no input, else a dense workspace that finish() copies back.
struct Result {
  Tensor output, target;
  Matrix matrix;
  Result(KernelContext& context, const Tensor& out) : output(out), target(out) {
    const int64_t ndim = out.dim();
    const MatrixLayout layout =
        result_layout(out.size(ndim - 2), out.size(ndim - 1), out.stride(ndim - 2),
                      out.stride(ndim - 1), ndim == 3 ? out.size(0) : 1,
                      ndim == 3 ? out.stride(0) : 0, shares_storage(out, context.inputs));
    if (!layout.in_place) target = context.workspace(out.sizes(), out.dtype());
    matrix.data = target.raw_data();
    matrix.ld = layout.ld;
    matrix.batch_stride = layout.batch_stride;
  }
  void finish() const {
    if (!target.is_same(output)) copy_convert(output, target);
  }
};

struct GemmTypes {
  cudaDataType_t data;
  cublasComputeType_t compute;
  bool double_scale;
};

GemmTypes gemm_types(DType dtype, const char* op) {
  switch (dtype) {
    case DType::kFloat32:
      return {CUDA_R_32F, allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, false};
    case DType::kFloat64:
      return {CUDA_R_64F, CUBLAS_COMPUTE_64F, true};
    case DType::kBFloat16:
      return {CUDA_R_16BF, CUBLAS_COMPUTE_32F, false};
    case DType::kFloat16:
      return {CUDA_R_16F, CUBLAS_COMPUTE_32F, false};
    default:
      TESSEL_FAIL(op, ": expected a f32, f64, bf16 or f16 tensor on CUDA, got ", dtype_name(dtype));
  }
}

int as_int(int64_t value, const char* op, const char* what) {
  TESSEL_CHECK(value >= 0 && value <= INT_MAX, op, ": ", what, " ", value,
               " is beyond what one cuBLAS call takes (", INT_MAX, ")");
  return static_cast<int>(value);
}

// Row-major C (batch x n x m) = A (n x k) B (k x m) + beta C. cuBLAS is column-major, so it
// computes C^T = B^T A^T: a row-major matrix is its transpose seen column-major, a column-major
// one (a transposed view) needs op T.
void gemm(const char* op, int device, DType dtype, int64_t batch, int64_t n, int64_t m, int64_t k,
          const Matrix& a, const Matrix& b, double beta, const Matrix& c) {
  const GemmTypes types = gemm_types(dtype, op);
  cublasHandle_t handle = cublas_handle(device);
  const cublasOperation_t op_b = b.column_major ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = a.column_major ? CUBLAS_OP_T : CUBLAS_OP_N;
  const float alpha_f = 1.0f, beta_f = static_cast<float>(beta);
  const double alpha_d = 1.0, beta_d = beta;
  const void* alpha = types.double_scale ? static_cast<const void*>(&alpha_d) : &alpha_f;
  const void* beta_ptr = types.double_scale ? static_cast<const void*>(&beta_d) : &beta_f;
  const int mi = as_int(m, op, "size"), ni = as_int(n, op, "size"), ki = as_int(k, op, "size");
  const int ldb = as_int(b.ld, op, "leading dimension"),
            lda = as_int(a.ld, op, "leading dimension");
  const int ldc = as_int(c.ld, op, "leading dimension");
  if (batch == 1) {
    TESSEL_CUBLAS_CHECK(cublasGemmEx(handle, op_b, op_a, mi, ni, ki, alpha, b.data, types.data, ldb,
                                     a.data, types.data, lda, beta_ptr, c.data, types.data, ldc,
                                     types.compute, CUBLAS_GEMM_DEFAULT));
    return;
  }
  TESSEL_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      handle, op_b, op_a, mi, ni, ki, alpha, b.data, types.data, ldb, b.batch_stride, a.data,
      types.data, lda, a.batch_stride, beta_ptr, c.data, types.data, ldc, c.batch_stride,
      as_int(batch, op, "batch"), types.compute, CUBLAS_GEMM_DEFAULT));
}

// matmul a (n, k) x b (k, m) and bmm a (B, n, k) x b (B, k, m).
void product_kernel(KernelContext& context, const char* op) {
  const Tensor& a = context.inputs[0];
  const Tensor& b = context.inputs[1];
  const Tensor& out = context.outputs[0];
  if (out.numel() == 0) return;
  KernelDevice device(context);
  const int64_t ndim = out.dim();
  const int64_t n = out.size(ndim - 2), m = out.size(ndim - 1), k = a.size(ndim - 1);
  const int64_t batch = ndim == 3 ? out.size(0) : 1;
  if (k == 0) {
    Tensor zeros = context.workspace(out.sizes(), out.dtype());
    TESSEL_CUDA_CHECK(cudaMemsetAsync(zeros.raw_data(), 0, zeros.nbytes(), device.stream()));
    copy_convert(out, zeros);
    return;
  }
  Result result(context, out);
  Matrix lhs = matrix_operand(context, a);
  Matrix rhs = matrix_operand(context, b);
  gemm(op, device.index(), out.dtype(), batch, n, m, k, lhs, rhs, 0.0, result.matrix);
  result.finish();
}

// out (..., out_features) = x (..., in) W^T + bias.
void linear_kernel(KernelContext& context) {
  const Tensor& x = context.inputs[0];
  const Tensor& weight = context.inputs[1];
  const Tensor& bias = context.inputs[2];
  const Tensor& out = context.outputs[0];
  if (out.numel() == 0) return;
  KernelDevice device(context);
  const int64_t in_features = weight.size(1), out_features = weight.size(0);
  const int64_t rows = out.numel() / out_features;

  Matrix lhs;
  int64_t x_ld = collapsed_row_stride(x.sizes().data(), x.strides().data(), x.dim());
  if (x_ld >= 0 && in_features > 1 && x.stride(-1) != 1) x_ld = -1;
  if (x_ld >= 0) {
    lhs.data = x.raw_data();
    lhs.ld = x_ld;
  } else if (x.dim() == 2 && row_major_ld(in_features, rows, x.stride(1), x.stride(0)) >= 0) {
    lhs.data = x.raw_data();  // x.t() of a row-major matrix: read transposed in place
    lhs.ld = row_major_ld(in_features, rows, x.stride(1), x.stride(0));
    lhs.column_major = true;
  } else {
    lhs.data = dense_input(context, x).raw_data();
    lhs.ld = std::max<int64_t>(in_features, 1);
  }
  // W^T (in x out): a row-major W is W^T stored column-major, and the other way round.
  Matrix rhs = matrix_operand(context, weight);
  rhs.column_major = !rhs.column_major;

  // The result as one dense row-major (rows x out_features) matrix.
  const bool direct = out.is_contiguous() && !shares_storage(out, context.inputs);
  Tensor target = direct ? out : context.workspace(out.sizes(), out.dtype());
  Tensor target_2d =
      make_view(target, {rows, out_features}, {out_features, 1}, target.storage_offset());
  Matrix result;
  result.data = target.raw_data();
  result.ld = std::max<int64_t>(out_features, 1);
  double beta = 0.0;
  if (bias.defined()) {
    copy_convert(target_2d, bias);  // broadcast along the rows, then accumulate onto it
    beta = 1.0;
  }
  if (in_features == 0) {
    if (!bias.defined())
      TESSEL_CUDA_CHECK(cudaMemsetAsync(result.data, 0, target.nbytes(), device.stream()));
  } else {
    gemm(ops::linear.name(), device.index(), out.dtype(), 1, rows, out_features, in_features, lhs,
         rhs, beta, result);
  }
  if (!direct) copy_convert(out, target);
}

// out (n, m) = c + a (n, k) b (k, m): out holds c first (it is c when called in place), then the
// GEMM adds the product onto it (beta 1).
void addmm_kernel(KernelContext& context) {
  const Tensor& c = context.inputs[0];
  const Tensor& a = context.inputs[1];
  const Tensor& b = context.inputs[2];
  const Tensor& out = context.outputs[0];
  if (out.numel() == 0) return;
  KernelDevice device(context);
  const int64_t n = out.size(0), m = out.size(1), k = a.size(1);
  const AccumulateLayout layout = accumulate_layout(out, c, a, b);
  Tensor target = layout.result.in_place ? out : context.workspace(out.sizes(), out.dtype());
  if (layout.copy_c) copy_convert(target, c);
  if (k > 0) {
    Matrix result;
    result.data = target.raw_data();
    result.ld = layout.result.ld;
    gemm(ops::addmm.name(), device.index(), out.dtype(), 1, n, m, k, matrix_operand(context, a),
         matrix_operand(context, b), 1.0, result);
  }
  if (!target.is_same(out)) copy_convert(out, target);
}

}  // namespace

TESSEL_REGISTER_OPS(cuda_blas) {
  if (const char* flag = std::getenv("TESSEL_ALLOW_TF32"); flag && std::strcmp(flag, "1") == 0)
    set_allow_tf32(true);
  ops::matmul.set_kernel(
      kCuda, [](KernelContext& context) { product_kernel(context, ops::matmul.name()); });
  ops::bmm.set_kernel(kCuda,
                      [](KernelContext& context) { product_kernel(context, ops::bmm.name()); });
  ops::linear.set_kernel(kCuda, linear_kernel);
  ops::addmm.set_kernel(kCuda, addmm_kernel);
}

}  // namespace tessel::cuda
