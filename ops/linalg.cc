// Matrix products: matmul (2-D op; 1-D and batched forms composed from views and bmm), bmm and
// linear. Kernels read strided operands in place when each matrix is row- or column-major
// (a transpose is then free), and copy to a dense workspace only otherwise.
#include "ops/linalg.h"

#include <algorithm>

#include "ops/cpu/f32_fallback.h"
#include "ops/cpu/gemm.h"
#include "ops/cpu/strided_copy.h"
#include "ops/math/matrix_layout.h"
#include "ops/ops.h"
#include "ops/registry_helpers.h"

namespace tessel {

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
  const int64_t ndim = matrix.dim();
  const MatrixLayout layout = operand_layout(
      matrix.size(ndim - 2), matrix.size(ndim - 1), matrix.stride(ndim - 2),
      matrix.stride(ndim - 1), ndim == 3 ? matrix.size(0) : 1, ndim == 3 ? matrix.stride(0) : 0);
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
  Tensor target;
  T* data = nullptr;
  int64_t ld = 0;
  int64_t batch_stride = 0;
  bool staged = false;

  GemmResult(KernelContext& context, const Tensor& output) : target(output) {
    const int64_t ndim = output.dim();
    const MatrixLayout layout =
        result_layout(output.size(ndim - 2), output.size(ndim - 1), output.stride(ndim - 2),
                      output.stride(ndim - 1), ndim == 3 ? output.size(0) : 1,
                      ndim == 3 ? output.stride(0) : 0, shares_storage(output, context.inputs));
    staged = !layout.in_place;
    if (staged) target = context.workspace(output.sizes(), output.dtype());
    data = target.data_ptr<T>();
    ld = layout.ld;
    batch_stride = layout.batch_stride;
  }
  void finish(const Tensor& output) const {
    if (staged) cpu::copy_strided(target, output);
  }
};

// a (B, n, k) x b (B, k, m) -> out (B, n, m); 2-D tensors are one batch entry.
template <typename T>
void batched_product_kernel(KernelContext& context) {
  const Tensor& a = context.inputs[0];
  const Tensor& b = context.inputs[1];
  const Tensor& out = context.outputs[0];
  if (out.numel() == 0) return;
  const int64_t ndim = out.dim();
  const int64_t n = out.size(ndim - 2), m = out.size(ndim - 1), k = a.size(ndim - 1);
  const int64_t batch = ndim == 3 ? out.size(0) : 1;
  GemmOperand<T> lhs = gemm_operand<T>(context, a);
  GemmOperand<T> rhs = gemm_operand<T>(context, b);
  GemmResult<T> result(context, out);
  cpu::gemm_batched(lhs.transposed, rhs.transposed, n, m, k, T(1), lhs.data, lhs.ld,
                    lhs.batch_stride, rhs.data, rhs.ld, rhs.batch_stride, T(0), result.data,
                    result.ld, result.batch_stride, batch);
  result.finish(out);
}

void check_float_pair(const char* op, const Tensor& a, const char* a_name, const Tensor& b,
                      const char* b_name) {
  // 16-bit floats are accepted for autocast (CPU kernels compute them in f32).
  TESSEL_CHECK(is_floating(a.dtype()), op, ": expected a f32 or f64 tensor for ", a_name, ", got ",
               dtype_name(a.dtype()),
               " (bf16 and f16 work too; convert with .to(DType::kFloat32))");
  TESSEL_CHECK(a.dtype() == b.dtype(), op, ": ", a_name, " is ", dtype_name(a.dtype()), " but ",
               b_name, " is ", dtype_name(b.dtype()), "; convert one with .to()");
}

OpCost product_cost(double n, double m, double k, double batch, const std::vector<Tensor>& inputs,
                    const std::vector<Tensor>& outputs) {
  double bytes = 0;
  for (const auto& t : inputs)
    if (t.defined()) bytes += static_cast<double>(t.nbytes());
  for (const auto& t : outputs) bytes += static_cast<double>(t.nbytes());
  return OpCost{2.0 * batch * n * m * k, bytes};
}

// out (..., out_features) = x (..., in) W^T + bias.
template <typename T>
void linear_kernel(KernelContext& context) {
  Tensor x = context.inputs[0];
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
  if (x_ld < 0) {
    x = cpu::dense_input(context, x);
    x_ld = std::max<int64_t>(in_features, 1);
  }
  // Dense scratch when the output is strided or aliases an input; one row-major matrix otherwise.
  Tensor target = out;
  const bool staged = !out.is_contiguous() || shares_storage(out, context.inputs);
  if (staged) target = context.workspace(out.sizes(), out.dtype());
  T* result = target.data_ptr<T>();

  T beta = T(0);
  if (bias.defined()) {
    const T* bias_data = bias.data_ptr<T>();
    const int64_t bias_stride = bias.stride(0);
    parallel_for(0, rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(out_features, 1)),
                 [&](int64_t begin, int64_t end) {
                   for (int64_t r = begin; r < end; ++r) {
                     T* row = result + r * out_features;
                     for (int64_t j = 0; j < out_features; ++j) row[j] = bias_data[j * bias_stride];
                   }
                 });
    beta = T(1);
  }
  // W^T: a row-major W (out, in) is read transposed; a transposed view of one is read as is.
  GemmOperand<T> w = gemm_operand<T>(context, weight);
  cpu::gemm(x_transposed, !w.transposed, rows, out_features, in_features, T(1), x.data_ptr<T>(),
            x_ld, w.data, w.ld, beta, result, std::max<int64_t>(out_features, 1));
  if (staged) cpu::copy_strided(target, out);
}

// sum over `dims`, accumulated in f32 for 16-bit gradients (autocast) and returned in their dtype.
Tensor sum_in_f32(const Tensor& grad, const std::vector<int64_t>& dims) {
  if (!cpu::is_16bit_float(grad.dtype())) return sum(grad, dims);
  return to_dtype(sum(to_dtype(grad, DType::kFloat32), dims), grad.dtype());
}

Tensor matmul_2d(const Tensor& a, const Tensor& b) { return dispatch(ops::matmul, {a, b})[0]; }

void register_matmul() {
  // matmul: a (n, k) x b (k, m) -> (n, m). The public matmul builds every other form on it.
  OpDef& op = OpRegistry::get().define(ops::matmul);
  op.kind = OpKind::kGemm;
  op.autocast = AutocastPolicy::kLowerPrecision;
  op.shape = [](const std::vector<Tensor>& in, const Attrs&) {
    const Tensor& a = in.at(0);
    const Tensor& b = in.at(1);
    TESSEL_CHECK(a.dim() == 2 && b.dim() == 2, "matmul: the registered op takes 2-D tensors, got ",
                 "shapes ", shape_str(a.sizes()), " and ", shape_str(b.sizes()));
    check_float_pair("matmul", a, "a", b, "b");
    TESSEL_CHECK(a.size(1) == b.size(0), "matmul: inner dimensions differ: a has shape ",
                 shape_str(a.sizes()), " and b has shape ", shape_str(b.sizes()), " (", a.size(1),
                 " vs ", b.size(0), ")");
    return std::vector<OutputSpec>{{{a.size(0), b.size(1)}, a.dtype()}};
  };
  op.kernels[static_cast<int>(DeviceType::kCpu)] =
      cpu::with_f32_fallback([](KernelContext& context) {
        visit_float_dtype(context.outputs[0].dtype(), "matmul",
                          [&](auto tag) { batched_product_kernel<decltype(tag)>(context); });
      });
  op.save_inputs = {0, 1};
  op.backward = [](const BackwardContext& context) -> std::vector<Tensor> {
    const Tensor& grad = context.grad_outputs[0];
    const Tensor& a = context.saved_inputs[0];
    const Tensor& b = context.saved_inputs[1];
    Tensor grad_a, grad_b;
    if (context.needs_input_grad[0]) grad_a = matmul_2d(grad, transpose(b, 0, 1));
    if (context.needs_input_grad[1]) grad_b = matmul_2d(transpose(a, 0, 1), grad);
    return {grad_a, grad_b};
  };
  op.cost = [](const std::vector<Tensor>& in, const std::vector<Tensor>& out, const Attrs&) {
    return product_cost(in[0].size(0), in[1].size(1), in[0].size(1), 1, in, out);
  };
  op.splits = {{0, {0, -1}}};
}

void register_bmm() {
  // bmm: a (B, n, k) x b (B, k, m) -> (B, n, m); batch strides of 0 read one matrix for all.
  OpDef& op = OpRegistry::get().define(ops::bmm);
  op.kind = OpKind::kGemm;
  op.autocast = AutocastPolicy::kLowerPrecision;
  op.planner.split = ParallelSplit::kBatchedHeads;
  op.shape = [](const std::vector<Tensor>& in, const Attrs&) {
    const Tensor& a = in.at(0);
    const Tensor& b = in.at(1);
    TESSEL_CHECK(a.dim() == 3 && b.dim() == 3,
                 "bmm: expected 3-D tensors (B, n, k) and (B, k, m), got ", "shapes ",
                 shape_str(a.sizes()), " and ", shape_str(b.sizes()));
    check_float_pair("bmm", a, "a", b, "b");
    TESSEL_CHECK(a.size(0) == b.size(0), "bmm: batch sizes differ: a has shape ",
                 shape_str(a.sizes()), " and b has shape ", shape_str(b.sizes()));
    TESSEL_CHECK(a.size(2) == b.size(1), "bmm: inner dimensions differ: a has shape ",
                 shape_str(a.sizes()), " and b has shape ", shape_str(b.sizes()), " (", a.size(2),
                 " vs ", b.size(1), ")");
    return std::vector<OutputSpec>{{{a.size(0), a.size(1), b.size(2)}, a.dtype()}};
  };
  op.kernels[static_cast<int>(DeviceType::kCpu)] =
      cpu::with_f32_fallback([](KernelContext& context) {
        visit_float_dtype(context.outputs[0].dtype(), "bmm",
                          [&](auto tag) { batched_product_kernel<decltype(tag)>(context); });
      });
  op.save_inputs = {0, 1};
  op.backward = [](const BackwardContext& context) -> std::vector<Tensor> {
    const Tensor& grad = context.grad_outputs[0];
    const Tensor& a = context.saved_inputs[0];
    const Tensor& b = context.saved_inputs[1];
    Tensor grad_a, grad_b;
    if (context.needs_input_grad[0]) grad_a = bmm(grad, transpose(b, 1, 2));
    if (context.needs_input_grad[1]) grad_b = bmm(transpose(a, 1, 2), grad);
    return {grad_a, grad_b};
  };
  op.cost = [](const std::vector<Tensor>& in, const std::vector<Tensor>& out, const Attrs&) {
    return product_cost(in[0].size(1), in[1].size(2), in[0].size(2), in[0].size(0), in, out);
  };
  op.splits = {{0, {0, 0}}};
}

void register_linear() {
  // linear: x (..., in), weight (out, in), optional bias (out) -> (..., out). x has at least
  // 2 dims here (the public function lifts a 1-D x), so dim 0 is always a row dim.
  OpDef& op = OpRegistry::get().define(ops::linear);
  op.kind = OpKind::kGemm;
  op.autocast = AutocastPolicy::kLowerPrecision;
  op.planner.split = ParallelSplit::kLinearWeight;
  op.shape = [](const std::vector<Tensor>& in, const Attrs&) {
    const Tensor& x = in.at(0);
    const Tensor& weight = in.at(1);
    const Tensor& bias = in.at(2);
    TESSEL_CHECK(weight.dim() == 2, "linear: weight must be 2-D (out_features, in_features), got ",
                 "shape ", shape_str(weight.sizes()));
    TESSEL_CHECK(x.dim() >= 2, "linear: input must have at least 2 dimensions here, got shape ",
                 shape_str(x.sizes()));
    check_float_pair("linear", x, "input", weight, "weight");
    TESSEL_CHECK(x.size(-1) == weight.size(1), "linear: input has ", x.size(-1),
                 " features (last dim of shape ", shape_str(x.sizes()), ") but weight expects ",
                 weight.size(1), " (weight shape ", shape_str(weight.sizes()), ")");
    if (bias.defined()) {
      TESSEL_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0), "linear: bias has shape ",
                   shape_str(bias.sizes()), " but weight has ", weight.size(0),
                   " output features (weight shape ", shape_str(weight.sizes()), ")");
      TESSEL_CHECK(bias.dtype() == weight.dtype(), "linear: bias is ", dtype_name(bias.dtype()),
                   " but weight is ", dtype_name(weight.dtype()));
    }
    Shape sizes = x.sizes();
    sizes.back() = weight.size(0);
    return std::vector<OutputSpec>{{sizes, x.dtype()}};
  };
  op.kernels[static_cast<int>(DeviceType::kCpu)] =
      cpu::with_f32_fallback([](KernelContext& context) {
        visit_float_dtype(context.outputs[0].dtype(), "linear",
                          [&](auto tag) { linear_kernel<decltype(tag)>(context); });
      });
  op.save_inputs = {0, 1};
  op.backward = [](const BackwardContext& context) -> std::vector<Tensor> {
    const Tensor& grad = context.grad_outputs[0];  // (..., out)
    const Tensor& x = context.saved_inputs[0];     // (..., in)
    const Tensor& weight = context.saved_inputs[1];
    const int64_t out_features = weight.size(0), in_features = weight.size(1);
    Tensor grad_x, grad_weight, grad_bias;
    if (context.needs_input_grad[0]) grad_x = matmul(grad, weight);
    Tensor grad_rows = reshape(grad, {-1, out_features});
    if (context.needs_input_grad[1])
      grad_weight = matmul_2d(transpose(grad_rows, 0, 1), reshape(x, {-1, in_features}));
    if (context.needs_input_grad[2]) grad_bias = sum_in_f32(grad_rows, {0});
    return {grad_x, grad_weight, grad_bias};
  };
  op.cost = [](const std::vector<Tensor>& in, const std::vector<Tensor>& out, const Attrs&) {
    double rows = static_cast<double>(in[0].numel()) / std::max<int64_t>(in[1].size(1), 1);
    return product_cost(rows, in[1].size(0), in[1].size(1), 1, in, out);
  };
  op.splits = {{0, {0, -1, -1}}};
}

}  // namespace

TESSEL_REGISTER_OPS(linalg) {
  register_matmul();
  register_bmm();
  register_linear();
}

Tensor matmul(const Tensor& a, const Tensor& b) {
  TESSEL_CHECK(a.dim() >= 1 && b.dim() >= 1,
               "matmul: both arguments need at least 1 dimension, got shapes ",
               shape_str(a.sizes()), " and ", shape_str(b.sizes()));
  const int64_t a_dims = a.dim(), b_dims = b.dim();
  const int64_t k_a = a.size(-1);
  const int64_t k_b = b_dims == 1 ? b.size(0) : b.size(-2);
  TESSEL_CHECK(k_a == k_b, "matmul: inner dimensions differ: a has shape ", shape_str(a.sizes()),
               " and b has shape ", shape_str(b.sizes()), " (", k_a, " vs ", k_b, ")");
  if (a_dims <= 2 && b_dims <= 2) {
    Tensor a_matrix = a_dims == 1 ? unsqueeze(a, 0) : a;
    Tensor b_matrix = b_dims == 1 ? unsqueeze(b, 1) : b;
    Tensor product = matmul_2d(a_matrix, b_matrix);
    if (b_dims == 1) product = squeeze(product, 1);
    if (a_dims == 1) product = squeeze(product, 0);
    return product;
  }
  if (b_dims <= 2) {
    // (..., n, k) x (k, m): fold the batch into the rows of one 2-D product.
    Tensor b_matrix = b_dims == 1 ? unsqueeze(b, 1) : b;
    Shape sizes(a.sizes().begin(), a.sizes().end() - 1);
    Tensor product = matmul_2d(reshape(a, {shape_numel(sizes), k_a}), b_matrix);
    if (b_dims == 2) sizes.push_back(b.size(1));
    return reshape(product, sizes);
  }
  // Batched on both sides (or a vector times a batch): broadcast the batch dims, run bmm.
  Tensor a_batched = a_dims == 1 ? unsqueeze(a, 0) : a;
  Tensor b_batched = b;
  const int64_t n = a_batched.size(-2), m = b_batched.size(-1);
  Shape a_batch(a_batched.sizes().begin(), a_batched.sizes().end() - 2);
  Shape b_batch(b_batched.sizes().begin(), b_batched.sizes().end() - 2);
  Shape batch;
  try {
    batch = broadcast_shapes(a_batch, b_batch, "matmul");
  } catch (const Error&) {
    TESSEL_FAIL("matmul: batch dimensions do not broadcast: a has shape ", shape_str(a.sizes()),
                " and b has shape ", shape_str(b.sizes()));
  }
  const int64_t batch_count = shape_numel(batch);
  Shape a_sizes = batch, b_sizes = batch;
  a_sizes.insert(a_sizes.end(), {n, k_a});
  b_sizes.insert(b_sizes.end(), {k_a, m});
  Tensor product = bmm(reshape(expand(a_batched, a_sizes), {batch_count, n, k_a}),
                       reshape(expand(b_batched, b_sizes), {batch_count, k_a, m}));
  Shape sizes = batch;
  if (a_dims > 1) sizes.push_back(n);
  sizes.push_back(m);
  return reshape(product, sizes);
}

Tensor bmm(const Tensor& a, const Tensor& b) { return dispatch(ops::bmm, {a, b})[0]; }

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  TESSEL_CHECK(x.dim() >= 1, "linear: input must have at least 1 dimension, got shape ",
               shape_str(x.sizes()));
  if (x.dim() == 1) return squeeze(dispatch(ops::linear, {unsqueeze(x, 0), weight, bias})[0], 0);
  return dispatch(ops::linear, {x, weight, bias})[0];
}

}  // namespace tessel
