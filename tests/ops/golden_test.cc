// Every op of ops/ops.h against PyTorch: tests/golden/make_golden_ops.py stores inputs, outputs,
// an upstream gradient and the input gradients per case in tests/golden/ops.safetensors; each
// case here repeats the same call with Tessel's ops and compares outputs and gradients.

#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/autograd.h"
#include "core/op.h"
#include "ops/ops.h"
#include "tests/testing.h"

namespace tessel {
namespace {

using testing::load_golden;
using Inputs = std::vector<Tensor>;
using Outputs = std::vector<Tensor>;
using Golden = std::map<std::string, Tensor>;

constexpr double kInf = std::numeric_limits<double>::infinity();

// The closeness rule (tests/testing.h) for one f32 op, for every case: the references are exactly
// rounded f64 results, and no family (reductions, matmul and convolution included) needs more.
constexpr double kRtol = 1e-5;
constexpr double kAtol = 1e-6;

struct GoldenCase {
  std::string name;  // the fixture prefix: <name>.in0, <name>.out0, <name>.grad0, ...
  std::function<Outputs(const Inputs&)> run;
  // Inputs the op updates in place, compared after the call: {fixture suffix, input index}.
  std::vector<std::pair<std::string, int>> inputs_after = {};
};

// One case whose body is a single expression over `in`.
#define GOLDEN(case_name, expression)                                   \
  GoldenCase {                                                          \
    case_name, [](const Inputs& in) -> Outputs { return {expression}; } \
  }

bool has(const Golden& golden, const std::string& key) { return golden.count(key) > 0; }

Inputs case_inputs(const Golden& golden, const std::string& name) {
  Inputs inputs;
  while (has(golden, name + ".in" + std::to_string(inputs.size())))
    inputs.push_back(golden.at(name + ".in" + std::to_string(inputs.size())));
  return inputs;
}

::testing::AssertionResult close_with_dtype(const Tensor& actual, const Tensor& expected) {
  if (!actual.defined()) return ::testing::AssertionFailure() << "undefined result";
  if (actual.dtype() != expected.dtype()) {
    return ::testing::AssertionFailure() << "dtype " << dtype_name(actual.dtype()) << ", expected "
                                         << dtype_name(expected.dtype());
  }
  return testing::all_close(actual, expected, kRtol, kAtol);
}

bool all_zero(const Tensor& tensor) {
  for (double value : tensor.to_vector<double>())
    if (value != 0) return false;
  return true;
}

// Runs one case: forward, outputs, in-place updates, then gradients of sum(out * gout).
void check_case(const Golden& golden, const GoldenCase& golden_case) {
  const std::string& name = golden_case.name;
  SCOPED_TRACE("golden case " + name);
  Inputs inputs = case_inputs(golden, name);
  if (inputs.empty() && !has(golden, name + ".out0")) {
    ADD_FAILURE() << "the fixture has no case '" << name
                  << "'; run tests/golden/make_golden_ops.py";
    return;
  }
  std::vector<int> wrt_index;
  Inputs wrt;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!has(golden, name + ".grad" + std::to_string(i))) continue;
    inputs[i].set_requires_grad(true);
    wrt_index.push_back(static_cast<int>(i));
    wrt.push_back(inputs[i]);
  }

  Outputs outputs;
  try {
    outputs = golden_case.run(inputs);
  } catch (const std::exception& error) {
    ADD_FAILURE() << name << " threw: " << error.what();
    return;
  }
  size_t expected_outputs = 0;
  while (has(golden, name + ".out" + std::to_string(expected_outputs))) ++expected_outputs;
  if (outputs.size() != expected_outputs) {
    ADD_FAILURE() << name << " returned " << outputs.size() << " outputs, PyTorch "
                  << expected_outputs;
    return;
  }
  for (size_t k = 0; k < outputs.size(); ++k) {
    EXPECT_TRUE(close_with_dtype(outputs[k], golden.at(name + ".out" + std::to_string(k))))
        << name << ".out" << k;
  }
  for (const auto& [suffix, index] : golden_case.inputs_after) {
    EXPECT_TRUE(close_with_dtype(inputs.at(index), golden.at(name + "." + suffix)))
        << name << "." << suffix;
  }
  if (wrt.empty()) return;

  Outputs roots, root_grads;
  for (size_t k = 0; k < outputs.size(); ++k) {
    std::string gout_key = name + ".gout" + std::to_string(k);
    if (!has(golden, gout_key)) continue;
    if (!outputs[k].requires_grad()) {
      ADD_FAILURE() << name << ".out" << k << " does not require grad";
      return;
    }
    roots.push_back(outputs[k]);
    root_grads.push_back(golden.at(gout_key));
  }
  Outputs grads;
  try {
    grads = grad(roots, wrt, root_grads);
  } catch (const std::exception& error) {
    ADD_FAILURE() << name << " backward threw: " << error.what();
    return;
  }
  ASSERT_EQ(grads.size(), wrt.size());
  for (size_t w = 0; w < wrt.size(); ++w) {
    std::string key = name + ".grad" + std::to_string(wrt_index[w]);
    const Tensor& expected = golden.at(key);
    if (!grads[w].defined()) {
      EXPECT_TRUE(all_zero(expected)) << key << ": no gradient, PyTorch has a non-zero one";
      continue;
    }
    EXPECT_TRUE(close_with_dtype(grads[w], expected)) << key;
  }
}

void check_family(const std::vector<GoldenCase>& cases) {
  Golden golden = load_golden("ops");  // fresh tensors: cases mark them and update them in place
  for (const auto& golden_case : cases) check_case(golden, golden_case);
}

// ---- case tables, in the order of make_golden_ops.py ----

std::vector<GoldenCase> creation_cases() {
  return {
      GOLDEN("full_2x3", full({2, 3}, 1.5)),
      GOLDEN("zeros_2x3", zeros({2, 3})),
      GOLDEN("ones_4", ones({4})),
      GOLDEN("zeros_like", zeros_like(in[0])),
      GOLDEN("ones_like", ones_like(in[0])),
      GOLDEN("full_like", full_like(in[0], -0.25)),
      GOLDEN("arange_int64_7", arange(7)),
      GOLDEN("arange_float_start_end_step", arange(0.5, 3.0, 0.25)),
      GOLDEN("arange_float_inexact_length", arange(-1.0, 1.0, 0.3)),
  };
}

std::vector<GoldenCase> copy_cases() {
  return {
      GOLDEN("clone", clone(in[0])),
      GOLDEN("contiguous_of_transposed", contiguous(transpose(in[0], 0, 1))),
      GOLDEN("to_dtype_f32_to_f64", to_dtype(in[0], DType::kFloat64)),
      GOLDEN("to_dtype_f32_to_i64_truncates", to_dtype(in[0], DType::kInt64)),
      GOLDEN("to_dtype_i64_to_f32", to_dtype(in[0], DType::kFloat32)),
      GOLDEN("to_dtype_bool_to_f32", to_dtype(in[0], DType::kFloat32)),
      GOLDEN("to_dtype_f32_to_bool", to_dtype(in[0], DType::kBool)),
      // In-place Tensor methods, applied to a fresh copy.
      GOLDEN("copy_broadcast_row", clone(in[0]).copy_(in[1])),
      GOLDEN("fill_", clone(in[0]).fill_(2.5)),
      GOLDEN("zero_", clone(in[0]).zero_()),
      GOLDEN("add_inplace_alpha", clone(in[0]).add_(in[1], -0.5)),
      GOLDEN("mul_inplace_scalar", clone(in[0]).mul_(3.0)),
  };
}

std::vector<GoldenCase> binary_cases() {
  using BinaryFn = Tensor (*)(const Tensor&, const Tensor&);
  const std::vector<std::pair<std::string, BinaryFn>> ops = {
      {"add", [](const Tensor& a, const Tensor& b) { return add(a, b); }},
      {"sub", [](const Tensor& a, const Tensor& b) { return sub(a, b); }},
      {"mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); }},
      {"div", [](const Tensor& a, const Tensor& b) { return div(a, b); }},
      {"maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); }},
      {"minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); }},
  };
  std::vector<GoldenCase> cases;
  for (const auto& [op_name, fn] : ops) {
    for (const char* variant : {"_same_shape", "_broadcast_row", "_broadcast_both"}) {
      BinaryFn op = fn;
      cases.push_back(
          {op_name + variant, [op](const Inputs& in) -> Outputs { return {op(in[0], in[1])}; }});
    }
  }
  std::vector<GoldenCase> others = {
      GOLDEN("add_alpha", add(in[0], in[1], 0.5)),
      GOLDEN("sub_alpha", sub(in[0], in[1], 2.0)),
      GOLDEN("add_zero_dim_tensor", add(in[0], in[1])),
      GOLDEN("add_transposed_input", transpose(in[0], 0, 1) + in[1]),
      GOLDEN("mul_int64_by_float32_promotes", in[0] * in[1]),
      GOLDEN("maximum_with_ties", maximum(in[0], in[1])),
      GOLDEN("minimum_with_ties", minimum(in[0], in[1])),
      GOLDEN("pow_same_shape", pow(in[0], in[1])),
      GOLDEN("pow_broadcast_exponent", pow(in[0], in[1])),
      GOLDEN("add_scalar", in[0] + 2.5),
      GOLDEN("sub_scalar", in[0] - 0.75),
      GOLDEN("mul_scalar", in[0] * -1.5),
      GOLDEN("div_scalar", in[0] / 4.0),
      GOLDEN("scalar_times_tensor", 3.0 * in[0]),
      GOLDEN("pow_scalar_3", pow(in[0], 3.0)),
      GOLDEN("pow_scalar_half", pow(in[0], 0.5)),
      GOLDEN("pow_scalar_negative", pow(in[0], -1.5)),
      GOLDEN("pow_scalar_2", pow(in[0], 2.0)),
  };
  cases.insert(cases.end(), others.begin(), others.end());
  return cases;
}

std::vector<GoldenCase> unary_cases() {
  return {
      GOLDEN("neg", neg(in[0])),
      GOLDEN("unary_minus_operator", -in[0]),
      GOLDEN("abs", abs(in[0])),
      GOLDEN("exp", exp(in[0])),
      GOLDEN("log", log(in[0])),
      GOLDEN("sqrt", sqrt(in[0])),
      GOLDEN("rsqrt", rsqrt(in[0])),
      GOLDEN("tanh", tanh(in[0])),
      GOLDEN("sigmoid", sigmoid(in[0])),
      GOLDEN("relu", relu(in[0])),
      GOLDEN("gelu_erf", gelu(in[0], "none")),
      GOLDEN("gelu_tanh", gelu(in[0], "tanh")),
      GOLDEN("clamp_both_bounds", clamp(in[0], -0.5, 0.7)),
      GOLDEN("clamp_max_only", clamp(in[0], -kInf, 0.3)),
      GOLDEN("clamp_min_only", clamp(in[0], -0.2, kInf)),
      GOLDEN("relu_at_zero", relu(in[0])),
      GOLDEN("abs_at_zero", abs(in[0])),
      GOLDEN("clamp_at_bounds", clamp(in[0], -1.0, 1.0)),
      GOLDEN("relu_of_strided_slice", relu(slice(in[0], 1, 0, 8, 2))),
      GOLDEN("exp_of_transposed", exp(transpose(in[0], 0, 1))),
  };
}

std::vector<GoldenCase> selection_cases() {
  return {
      GOLDEN("where_broadcast", where(in[0], in[1], in[2])),
      GOLDEN("where_condition_broadcast", where(in[0], in[1], in[2])),
      GOLDEN("masked_fill_same_shape", masked_fill(in[0], in[1], -2.5)),
      GOLDEN("masked_fill_broadcast_mask", masked_fill(in[0], in[1], 1e4)),
      GOLDEN("eq_broadcast_with_ties", eq(in[0], in[1])),
      GOLDEN("ne_broadcast_with_ties", ne(in[0], in[1])),
      GOLDEN("lt_broadcast_with_ties", lt(in[0], in[1])),
      GOLDEN("le_broadcast_with_ties", le(in[0], in[1])),
      GOLDEN("gt_broadcast_with_ties", gt(in[0], in[1])),
      GOLDEN("ge_broadcast_with_ties", ge(in[0], in[1])),
      GOLDEN("eq_int64", eq(in[0], in[1])),
  };
}

std::vector<GoldenCase> reduction_cases() {
  return {
      GOLDEN("sum_all", sum(in[0])),
      GOLDEN("sum_dim1", sum(in[0], {1})),
      GOLDEN("sum_dims_0_2_keepdim", sum(in[0], {0, 2}, true)),
      GOLDEN("sum_negative_dim", sum(in[0], {-1})),
      GOLDEN("sum_of_transposed_dim0", sum(transpose(in[0], 0, 1), {0})),
      GOLDEN("expand_then_sum_dim0", sum(expand(in[0], {5, 3, 4}), {0})),
      GOLDEN("mean_all", mean(in[0])),
      GOLDEN("mean_dim1_keepdim", mean(in[0], {1}, true)),
      GOLDEN("mean_dims_0_2", mean(in[0], {0, 2})),
      GOLDEN("max_dim1", tessel::max(in[0], 1)),
      GOLDEN("max_dim0_keepdim", tessel::max(in[0], 0, true)),
      GOLDEN("min_dim2", tessel::min(in[0], 2)),
      GOLDEN("min_negative_dim_keepdim", tessel::min(in[0], -1, true)),
      GOLDEN("max_all", tessel::max(in[0])),
      GOLDEN("min_all", tessel::min(in[0])),
      GOLDEN("argmax_dim1", argmax(in[0], 1)),
      GOLDEN("argmax_dim0_keepdim", argmax(in[0], 0, true)),
      GOLDEN("argmax_with_ties_picks_first", argmax(in[0], 1)),
      GOLDEN("max_dim_with_ties", tessel::max(in[0], 1)),
      GOLDEN("max_all_with_ties", tessel::max(in[0])),
      GOLDEN("var_all_unbiased", var(in[0], {}, true)),
      GOLDEN("var_all_biased", var(in[0], {}, false)),
      GOLDEN("var_dim1_biased", var(in[0], {1}, false)),
      GOLDEN("var_dims_0_2_unbiased_keepdim", var(in[0], {0, 2}, true, true)),
      GOLDEN("softmax_dim1", softmax(in[0], 1)),
      GOLDEN("softmax_last_dim", softmax(in[0], -1)),
      GOLDEN("softmax_large_logits", softmax(in[0], -1)),
      GOLDEN("softmax_of_transposed", softmax(transpose(in[0], 0, 1), 0)),
      GOLDEN("softmax_size1_dim", softmax(in[0], 1)),
      GOLDEN("log_softmax_dim0", log_softmax(in[0], 0)),
      GOLDEN("log_softmax_last_dim", log_softmax(in[0], -1)),
      GOLDEN("log_softmax_large_logits", log_softmax(in[0], -1)),
  };
}

std::vector<GoldenCase> view_cases() {
  return {
      GOLDEN("reshape_3x4x5_to_4x15", reshape(in[0], {4, 15})),
      GOLDEN("reshape_infer_dim", reshape(in[0], {-1, 10})),
      GOLDEN("reshape_of_transposed_copies", reshape(transpose(in[0], 0, 1), {12})),
      GOLDEN("view_3x4x5_to_12x5", view(in[0], {12, 5})),
      GOLDEN("transpose_0_2_contiguous", contiguous(transpose(in[0], 0, 2))),
      GOLDEN("transpose_then_matmul", matmul(transpose(in[0], 0, 1), in[1])),
      GOLDEN("permute_2_0_1", permute(in[0], {2, 0, 1})),
      GOLDEN("permute_contiguous", contiguous(permute(in[0], {1, 2, 0}))),
      GOLDEN("narrow_dim1", narrow(in[0], 1, 1, 2)),
      GOLDEN("slice_step2", slice(in[0], 1, 1, 7, 2)),
      GOLDEN("slice_step3_dim0", slice(in[0], 0, 0, 8, 3)),
      GOLDEN("select_dim1", select(in[0], 1, 2)),
      GOLDEN("select_negative_index", select(in[0], 0, -1)),
      GOLDEN("expand_3x1_to_2x3x4", expand(in[0], {2, 3, 4})),
      GOLDEN("expand_keep_size", expand(in[0], {-1, 4})),
      GOLDEN("squeeze_dim1", squeeze(in[0], 1)),
      GOLDEN("unsqueeze_dim0", unsqueeze(in[0], 0)),
      GOLDEN("unsqueeze_last", unsqueeze(in[0], -1)),
      GOLDEN("flatten_all", flatten(in[0])),
      GOLDEN("flatten_1_2", flatten(in[0], 1, 2)),
  };
}

std::vector<GoldenCase> join_and_index_cases() {
  return {
      GOLDEN("cat_dim0_three", cat({in[0], in[1], in[2]}, 0)),
      GOLDEN("cat_dim1", cat({in[0], in[1]}, 1)),
      GOLDEN("cat_negative_dim", cat({in[0], in[1]}, -1)),
      GOLDEN("stack_dim0", stack({in[0], in[1], in[2]}, 0)),
      GOLDEN("stack_dim1", stack({in[0], in[1]}, 1)),
      {"split_size2_dim1", [](const Inputs& in) { return split(in[0], 2, 1); }},
      {"chunk_3_dim0", [](const Inputs& in) { return chunk(in[0], 3, 0); }},
      GOLDEN("index_select_dim0_repeated", index_select(in[0], 0, in[1])),
      GOLDEN("index_select_dim1", index_select(in[0], 1, in[1])),
      GOLDEN("index_select_int32_index", index_select(in[0], 0, in[1])),
      GOLDEN("gather_dim1", gather(in[0], 1, in[1])),
      GOLDEN("gather_dim0_smaller_index", gather(in[0], 0, in[1])),
  };
}

std::vector<GoldenCase> linalg_cases() {
  return {
      GOLDEN("matmul_1d_1d", matmul(in[0], in[1])),
      GOLDEN("matmul_2d_1d", matmul(in[0], in[1])),
      GOLDEN("matmul_1d_2d", matmul(in[0], in[1])),
      GOLDEN("matmul_2d_2d", matmul(in[0], in[1])),
      GOLDEN("matmul_3d_2d", matmul(in[0], in[1])),
      GOLDEN("matmul_1d_3d", matmul(in[0], in[1])),
      GOLDEN("matmul_batched_broadcast", matmul(in[0], in[1])),
      GOLDEN("matmul_expanded_lhs", matmul(expand(in[0], {3, 4}), in[1])),
      GOLDEN("matmul_transposed_rhs", matmul(in[0], transpose(in[1], 0, 1))),
      GOLDEN("bmm", bmm(in[0], in[1])),
      GOLDEN("bmm_transposed_lhs", bmm(transpose(in[0], 1, 2), in[1])),
      GOLDEN("linear_with_bias_3d_input", linear(in[0], in[1], in[2])),
      GOLDEN("linear_no_bias", linear(in[0], in[1])),
      GOLDEN("addmm", addmm(in[0], in[1], in[2])),
      GOLDEN("addmm_transposed_lhs", addmm(in[0], transpose(in[1], 0, 1), in[2])),
  };
}

std::vector<GoldenCase> conv_cases() {
  return {
      GOLDEN("conv2d_basic", conv2d(in[0], in[1], in[2])),
      GOLDEN("conv2d_stride2_pad1", conv2d(in[0], in[1], in[2], {2, 2}, {1, 1})),
      GOLDEN("conv2d_dilation2_pad2", conv2d(in[0], in[1], in[2], {1, 1}, {2, 2}, {2, 2})),
      GOLDEN("conv2d_stride2_pad1_groups2", conv2d(in[0], in[1], in[2], {2, 2}, {1, 1}, {1, 1}, 2)),
      GOLDEN("conv2d_depthwise", conv2d(in[0], in[1], in[2], {1, 1}, {1, 1}, {1, 1}, 4)),
      GOLDEN("conv2d_of_nhwc_permuted_input",
             conv2d(permute(in[0], {0, 3, 1, 2}), in[1], in[2], {1, 1}, {1, 1})),
      GOLDEN("conv2d_1x1_no_bias", conv2d(in[0], in[1])),
      GOLDEN("conv2d_rect_kernel_stride_pad_no_bias",
             conv2d(in[0], in[1], Tensor(), {2, 1}, {1, 0})),
  };
}

std::vector<GoldenCase> pool_cases() {
  return {
      GOLDEN("max_pool2d_k2", max_pool2d(in[0], {2, 2})),
      GOLDEN("max_pool2d_k3_s2_pad1", max_pool2d(in[0], {3, 3}, {2, 2}, {1, 1})),
      GOLDEN("max_pool2d_ceil_mode", max_pool2d(in[0], {2, 2}, {2, 2}, {0, 0}, {1, 1}, true)),
      GOLDEN("max_pool2d_dilation2", max_pool2d(in[0], {2, 2}, {1, 1}, {0, 0}, {2, 2})),
      GOLDEN("max_pool2d_rect", max_pool2d(in[0], {2, 3}, {1, 2}, {1, 1})),
      GOLDEN("avg_pool2d_k2", avg_pool2d(in[0], {2, 2})),
      GOLDEN("avg_pool2d_k3_s2_pad1_include_pad", avg_pool2d(in[0], {3, 3}, {2, 2}, {1, 1})),
      GOLDEN("avg_pool2d_k3_s2_pad1_exclude_pad",
             avg_pool2d(in[0], {3, 3}, {2, 2}, {1, 1}, false, false)),
      GOLDEN("avg_pool2d_ceil_mode", avg_pool2d(in[0], {3, 3}, {2, 2}, {0, 0}, true)),
      GOLDEN("avg_pool2d_ceil_mode_pad1_exclude_pad",
             avg_pool2d(in[0], {3, 3}, {2, 2}, {1, 1}, true, false)),
      GOLDEN("avg_pool2d_ceil_mode_pad1_include_pad",
             avg_pool2d(in[0], {3, 3}, {2, 2}, {1, 1}, true, true)),
      GOLDEN("adaptive_avg_pool2d_7_to_3", adaptive_avg_pool2d(in[0], {3, 3})),
      GOLDEN("adaptive_avg_pool2d_5x6_to_2x4", adaptive_avg_pool2d(in[0], {2, 4})),
      GOLDEN("adaptive_avg_pool2d_global", adaptive_avg_pool2d(in[0], {1, 1})),
      GOLDEN("adaptive_avg_pool2d_3_to_4_upsamples", adaptive_avg_pool2d(in[0], {4, 4})),
  };
}

std::vector<GoldenCase> norm_cases() {
  // batch_norm inputs: x, weight, bias, running_mean, running_var.
  const std::vector<std::pair<std::string, int>> running = {{"running_mean_after", 3},
                                                            {"running_var_after", 4}};
  return {
      {"batch_norm_train_4d",
       [](const Inputs& in) -> Outputs {
         return {batch_norm(in[0], in[1], in[2], in[3], in[4], true, 0.1, 1e-5)};
       },
       running},
      {"batch_norm_train_2d_momentum_0_3_eps_1e-3",
       [](const Inputs& in) -> Outputs {
         return {batch_norm(in[0], in[1], in[2], in[3], in[4], true, 0.3, 1e-3)};
       },
       running},
      {"batch_norm_train_no_affine",
       [](const Inputs& in) -> Outputs {
         return {batch_norm(in[0], Tensor(), Tensor(), in[1], in[2], true, 0.1, 1e-5)};
       },
       {{"running_mean_after", 1}, {"running_var_after", 2}}},
      {"batch_norm_eval",
       [](const Inputs& in) -> Outputs {
         return {batch_norm(in[0], in[1], in[2], in[3], in[4], false, 0.1, 1e-5)};
       },
       running},
      {"batch_norm_eval_2d",
       [](const Inputs& in) -> Outputs {
         return {batch_norm(in[0], in[1], in[2], in[3], in[4], false, 0.1, 1e-5)};
       },
       running},
      GOLDEN("layer_norm_affine_last_dim", layer_norm(in[0], {4}, in[1], in[2], 1e-5)),
      GOLDEN("layer_norm_affine_last_two_dims", layer_norm(in[0], {3, 4}, in[1], in[2], 1e-5)),
      GOLDEN("layer_norm_no_affine", layer_norm(in[0], {3, 4})),
      GOLDEN("layer_norm_of_transposed_input",
             layer_norm(transpose(in[0], 0, 1), {3}, in[1], in[2], 1e-5)),
      GOLDEN("layer_norm_eps_1e-2", layer_norm(in[0], {5}, in[1], in[2], 1e-2)),
  };
}

std::vector<GoldenCase> embedding_and_dropout_cases() {
  return {
      GOLDEN("embedding", embedding(in[0], in[1])),
      GOLDEN("embedding_padding_idx0", embedding(in[0], in[1], 0)),
      GOLDEN("dropout_eval_is_identity", dropout(in[0], 0.5, false)),
      GOLDEN("dropout_p0_train_is_identity", dropout(in[0], 0.0, true)),
      GOLDEN("dropout_p1_train_zeroes_everything", dropout(in[0], 1.0, true)),
  };
}

std::vector<GoldenCase> loss_cases() {
  std::vector<GoldenCase> cases;
  for (std::string reduction : {"mean", "sum", "none"}) {
    auto cross_entropy_with = [reduction](double label_smoothing) {
      return [reduction, label_smoothing](const Inputs& in) -> Outputs {
        return {cross_entropy(in[0], in[1], -100, label_smoothing, reduction)};
      };
    };
    cases.push_back({"cross_entropy_" + reduction, cross_entropy_with(0.0)});
    cases.push_back({"cross_entropy_ignore_index_" + reduction, cross_entropy_with(0.0)});
    cases.push_back({"cross_entropy_label_smoothing_0_1_" + reduction, cross_entropy_with(0.1)});
  }
  std::vector<GoldenCase> others = {
      GOLDEN("cross_entropy_custom_ignore_index2", cross_entropy(in[0], in[1], 2)),
      GOLDEN("cross_entropy_label_smoothing_0_1_ignore_index",
             cross_entropy(in[0], in[1], -100, 0.1)),
      GOLDEN("cross_entropy_large_logits", cross_entropy(in[0], in[1])),
  };
  cases.insert(cases.end(), others.begin(), others.end());
  for (std::string reduction : {"mean", "sum", "none"}) {
    cases.push_back({"nll_loss_" + reduction, [reduction](const Inputs& in) -> Outputs {
                       return {nll_loss(in[0], in[1], -100, reduction)};
                     }});
  }
  cases.push_back(GOLDEN("nll_loss_ignore_index_mean", nll_loss(in[0], in[1])));
  cases.push_back(GOLDEN("nll_loss_custom_ignore_index3_sum", nll_loss(in[0], in[1], 3, "sum")));
  for (std::string reduction : {"mean", "sum", "none"}) {
    cases.push_back({"mse_loss_" + reduction, [reduction](const Inputs& in) -> Outputs {
                       return {mse_loss(in[0], in[1], reduction)};
                     }});
  }
  return cases;
}

std::vector<std::vector<GoldenCase>> all_families() {
  return {creation_cases(),
          copy_cases(),
          binary_cases(),
          unary_cases(),
          selection_cases(),
          reduction_cases(),
          view_cases(),
          join_and_index_cases(),
          linalg_cases(),
          conv_cases(),
          pool_cases(),
          norm_cases(),
          embedding_and_dropout_cases(),
          loss_cases()};
}

// ---- one test per family ----

TEST(GoldenOps, CreationMatchesPyTorch) { check_family(creation_cases()); }
TEST(GoldenOps, CopiesAndCastsMatchPyTorch) { check_family(copy_cases()); }
TEST(GoldenOps, BinaryOpsWithBroadcastingMatchPyTorch) { check_family(binary_cases()); }
TEST(GoldenOps, UnaryOpsMatchPyTorch) { check_family(unary_cases()); }
TEST(GoldenOps, SelectionAndComparisonMatchPyTorch) { check_family(selection_cases()); }
TEST(GoldenOps, ReductionsAndSoftmaxMatchPyTorch) { check_family(reduction_cases()); }
TEST(GoldenOps, ViewsMatchPyTorch) { check_family(view_cases()); }
TEST(GoldenOps, JoiningAndIndexingMatchPyTorch) { check_family(join_and_index_cases()); }
TEST(GoldenOps, MatmulBmmLinearMatchPyTorch) { check_family(linalg_cases()); }
TEST(GoldenOps, Conv2dMatchesPyTorch) { check_family(conv_cases()); }
TEST(GoldenOps, PoolingMatchesPyTorch) { check_family(pool_cases()); }
TEST(GoldenOps, NormalizationMatchesPyTorch) { check_family(norm_cases()); }
TEST(GoldenOps, EmbeddingAndDropoutMatchPyTorch) { check_family(embedding_and_dropout_cases()); }
TEST(GoldenOps, LossesMatchPyTorch) { check_family(loss_cases()); }

// ---- the table, the fixture and the registry agree ----

TEST(GoldenOps, TableAndFixtureHaveTheSameCases) {
  Golden golden = load_golden("ops");
  std::set<std::string> fixture_cases;
  for (const auto& [key, tensor] : golden) fixture_cases.insert(key.substr(0, key.rfind('.')));
  std::set<std::string> table_cases;
  for (const auto& family : all_families())
    for (const auto& golden_case : family) {
      EXPECT_TRUE(table_cases.insert(golden_case.name).second) << "twice: " << golden_case.name;
      EXPECT_TRUE(fixture_cases.count(golden_case.name))
          << "not in the fixture: " << golden_case.name;
    }
  for (const auto& name : fixture_cases)
    EXPECT_TRUE(table_cases.count(name)) << "fixture case without a test: " << name;
}

// Registered ops that golden forward calls cannot reach, each with the reason.
const std::set<std::string>& untestable_ops() {
  static const std::set<std::string> ops = {
      // Random: Tessel's Philox streams differ from PyTorch's generator, so there is no
      // reference; their own tests check distributions and replay.
      "rand",
      "randn",
      "randint",
      // A device transfer: PyTorch has nothing to compare it with on CPU; transfer_test checks
      // its copies bitwise and tests/cuda checks it on a GPU.
      "to_device",
  };
  return ops;
}

// Internal ops that only backward functions dispatch (not in ops/ops.h): a golden case's
// gradient must reach each of them, so the gradient comparisons check them.
const std::set<std::string>& backward_helper_ops() {
  static const std::set<std::string> ops = {
      "batch_norm_backward",    "conv2d_backward_input",
      "conv2d_backward_weight", "cross_entropy_backward",
      "embedding_backward",     "gather_backward",
      "gelu_backward",          "index_select_backward",
      "layer_norm_backward",    "nll_loss_backward",
      "slice_backward",         "max_pool2d_backward",
      "avg_pool2d_backward",    "adaptive_avg_pool2d_backward",
      "relu_backward",
  };
  return ops;
}

// Records the name of every op dispatched while it is alive, into `forward` or `backward`
// depending on the phase.
class OpNameRecorder {
 public:
  OpNameRecorder()
      : previous_(set_trace_hook(
            [this](const OpDef& op, const std::vector<Tensor>&, const std::vector<Tensor>&,
                   const Attrs&) { (in_backward_ ? backward : forward).insert(op.name); })) {}
  ~OpNameRecorder() { set_trace_hook(previous_); }
  void set_backward(bool in_backward) { in_backward_ = in_backward; }
  std::set<std::string> forward, backward;

 private:
  bool in_backward_ = false;
  TraceHook previous_;
};

// Runs a case forward and backward without checking values (its family test does that).
void trace_case(const Golden& golden, const GoldenCase& golden_case, OpNameRecorder& recorder) {
  const std::string& name = golden_case.name;
  Inputs inputs = case_inputs(golden, name);
  Inputs wrt;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!has(golden, name + ".grad" + std::to_string(i))) continue;
    inputs[i].set_requires_grad(true);
    wrt.push_back(inputs[i]);
  }
  try {
    recorder.set_backward(false);
    Outputs outputs = golden_case.run(inputs);
    recorder.set_backward(true);
    Outputs roots, root_grads;
    for (size_t k = 0; k < outputs.size(); ++k) {
      std::string gout_key = name + ".gout" + std::to_string(k);
      if (!has(golden, gout_key) || !outputs[k].requires_grad()) continue;
      roots.push_back(outputs[k]);
      root_grads.push_back(golden.at(gout_key));
    }
    if (!wrt.empty() && !roots.empty()) grad(roots, wrt, root_grads);
  } catch (const std::exception&) {
    // Reported by the family test; whatever was dispatched before the error still counts.
  }
}

std::string joined(const std::vector<std::string>& names) {
  std::string text;
  for (const auto& name : names) text += " " + name;
  return text;
}

TEST(GoldenOps, EveryRegisteredOpIsCheckedByAGoldenCase) {
  Golden golden = load_golden("ops");
  OpNameRecorder recorder;
  for (const auto& family : all_families())
    for (const auto& golden_case : family) trace_case(golden, golden_case, recorder);

  std::vector<std::string> public_missing, helpers_missing;
  for (const auto& name : OpRegistry::get().names()) {
    if (untestable_ops().count(name)) continue;
    if (backward_helper_ops().count(name)) {
      if (!recorder.backward.count(name)) helpers_missing.push_back(name);
    } else if (!recorder.forward.count(name)) {
      public_missing.push_back(name);
    }
  }
  EXPECT_TRUE(public_missing.empty())
      << "registered ops that no golden case calls (add a case to "
         "tests/golden/make_golden_ops.py, or list internal ones here):"
      << joined(public_missing);
  EXPECT_TRUE(helpers_missing.empty())
      << "backward helpers that no golden gradient reaches:" << joined(helpers_missing);
}

}  // namespace
}  // namespace tessel
