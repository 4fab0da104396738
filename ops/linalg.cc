// Matrix products: matmul (2-D op; 1-D and batched forms composed from views and bmm), bmm,
// linear and addmm: their definitions (shape rules, backward, cost, splits). The CPU kernels are in
// ops/cpu/linalg.cc.
#include "ops/linalg.h"

#include <algorithm>
#include <vector>

#include "ops/cpu/f32_fallback.h"
#include "ops/cpu/kernels.h"
#include "ops/ops.h"
#include "ops/registry_helpers.h"

namespace tessel {

namespace {

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

// sum over `dims`, accumulated in f32 for 16-bit gradients (autocast) and returned in their dtype.
Tensor sum_in_f32(const Tensor& grad, const std::vector<int64_t>& dims) {
  if (!cpu::is_16bit_float(grad.dtype())) return sum(grad, dims);
  return to_dtype(sum(to_dtype(grad, DType::kFloat32), dims), grad.dtype());
}

Tensor matmul_2d(const Tensor& a, const Tensor& b) {
  return first_output(dispatch(ops::matmul, inputs_of(a, b)));
}

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
    return one_output({a.size(0), b.size(1)}, a.dtype());
  };
  op.kernels[static_cast<int>(DeviceType::kCpu)] = cpu::with_f32_fallback(cpu::matmul_kernel);
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
    return one_output({a.size(0), a.size(1), b.size(2)}, a.dtype());
  };
  op.kernels[static_cast<int>(DeviceType::kCpu)] = cpu::with_f32_fallback(cpu::bmm_kernel);
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
    return one_output(std::move(sizes), x.dtype());
  };
  op.kernels[static_cast<int>(DeviceType::kCpu)] = cpu::with_f32_fallback(cpu::linear_kernel);
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

void register_addmm() {
  // addmm: c (n, m) + a (n, k) x b (k, m) -> (n, m). With c as its out= tensor (Tensor::addmm_)
  // the GEMM accumulates into c's storage directly.
  OpDef& op = OpRegistry::get().define(ops::addmm);
  op.kind = OpKind::kGemm;
  // The sum keeps c's precision: autocast leaves the operands as they are.
  op.autocast = AutocastPolicy::kKeep;
  op.shape = [](const std::vector<Tensor>& in, const Attrs&) {
    const Tensor& c = in.at(0);
    const Tensor& a = in.at(1);
    const Tensor& b = in.at(2);
    TESSEL_CHECK(c.dim() == 2 && a.dim() == 2 && b.dim() == 2,
                 "addmm: expected 2-D tensors c (n, m), a (n, k) and b (k, m), got shapes ",
                 shape_str(c.sizes()), ", ", shape_str(a.sizes()), " and ", shape_str(b.sizes()));
    check_float_pair("addmm", a, "a", b, "b");
    check_float_pair("addmm", c, "c", a, "a");
    TESSEL_CHECK(a.size(1) == b.size(0), "addmm: inner dimensions differ: a has shape ",
                 shape_str(a.sizes()), " and b has shape ", shape_str(b.sizes()), " (", a.size(1),
                 " vs ", b.size(0), ")");
    TESSEL_CHECK(c.size(0) == a.size(0) && c.size(1) == b.size(1), "addmm: c has shape ",
                 shape_str(c.sizes()), " but a b has shape [", a.size(0), ", ", b.size(1), "]");
    return std::vector<OutputSpec>{{c.sizes(), c.dtype()}};
  };
  op.kernels[static_cast<int>(DeviceType::kCpu)] = cpu::with_f32_fallback(cpu::addmm_kernel);
  op.save_inputs = {1, 2};
  op.backward = [](const BackwardContext& context) -> std::vector<Tensor> {
    const Tensor& grad = context.grad_outputs[0];
    const Tensor& a = context.saved_inputs[1];
    const Tensor& b = context.saved_inputs[2];
    Tensor grad_a, grad_b;
    if (context.needs_input_grad[1]) grad_a = matmul_2d(grad, transpose(b, 0, 1));
    if (context.needs_input_grad[2]) grad_b = matmul_2d(transpose(a, 0, 1), grad);
    return {context.needs_input_grad[0] ? grad : Tensor(), grad_a, grad_b};
  };
  op.cost = [](const std::vector<Tensor>& in, const std::vector<Tensor>& out, const Attrs&) {
    return product_cost(in[1].size(0), in[2].size(1), in[1].size(1), 1, in, out);
  };
  op.splits = {{0, {0, 0, -1}}};
}

}  // namespace

TESSEL_REGISTER_OPS(linalg) {
  register_matmul();
  register_bmm();
  register_linear();
  register_addmm();
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
  if (a_dims == 2 && b_dims == 2) return matmul_2d(a, b);
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

Tensor bmm(const Tensor& a, const Tensor& b) {
  return first_output(dispatch(ops::bmm, inputs_of(a, b)));
}

Tensor addmm(const Tensor& c, const Tensor& a, const Tensor& b) {
  return first_output(dispatch(ops::addmm, inputs_of(c, a, b)));
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  TESSEL_CHECK(x.dim() >= 1, "linear: input must have at least 1 dimension, got shape ",
               shape_str(x.sizes()));
  if (x.dim() == 1) return squeeze(dispatch(ops::linear, {unsqueeze(x, 0), weight, bias})[0], 0);
  return first_output(dispatch(ops::linear, inputs_of(x, weight, bias)));
}

}  // namespace tessel
