// batch_norm and layer_norm: values against PyTorch 1.13 (literals below were printed by
// torch.nn.functional on these inputs), finite-difference gradients, running statistics updated
// exactly once per forward and never by a replay, and clear errors on bad input.
#include "ops/norm.h"

#include <cmath>

#include "core/autograd.h"
#include "core/op.h"
#include "ops/ops.h"
#include "tests/testing.h"

namespace tessel {
namespace {

using testing::all_close;
using testing::bitwise_equal;
using testing::gradcheck;
using testing::kF64;
using testing::throws_error;

Tensor f64(const std::vector<double>& values, const Shape& sizes) {
  return from_vector<double>(values, sizes);
}

// A (2, 3, 2, 2) batch with per-channel parameters, shared by the NCHW tests.
struct NchwCase {
  Tensor x = f64({-2.31, -0.37, -1.06, 1,     -0.88, -1.28, -0.62, -0.87, 0.24,  0.73, -1.32, 1.31,
                  -1.49, -0.71, 0.52,  -0.95, 0.67,  1.05,  0.15,  -0.75, -0.72, 0.09, -1.75, 1.04},
                 {2, 3, 2, 2});
  Tensor weight = f64({-0.04, 0.29, -0.01}, {3});
  Tensor bias = f64({-0.91, -1.09, -0.27}, {3});
  Tensor running_mean = f64({0.19, -0.22, 2.06}, {3});
  Tensor running_var = f64({0.54, 0.56, 1.27}, {3});
};

// F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1, eps=1e-5)
const std::vector<double> kNchwTrainY = {
    -0.84399116, -0.92213435, -0.89434115, -0.97731794, -1.2991002,  -1.4474639,
    -1.2026637,  -1.2953911,  -0.27275666, -0.27745496, -0.2577988,  -0.28301621,
    -0.87702075, -0.90843915, -0.95798354, -0.89877195, -0.72419064, -0.58324508,
    -0.91706351, -1.2508819,  -0.26355182, -0.2713184,  -0.2536758,  -0.28042735};

TEST(BatchNorm, TrainingNormalisesWithBatchStatisticsLikePyTorch) {
  NchwCase c;
  Tensor y = batch_norm(c.x, c.weight, c.bias, c.running_mean, c.running_var, true, 0.1, 1e-5);
  EXPECT_TRUE(all_close(y, f64(kNchwTrainY, {2, 3, 2, 2})));
  // Running statistics take the unbiased variance, with momentum 0.1.
  EXPECT_TRUE(all_close(c.running_mean, f64({0.103875, -0.229625, 1.84925}, {3})));
  EXPECT_TRUE(all_close(c.running_var, f64({0.59870125, 0.57386268, 1.2673079}, {3})));
}

TEST(BatchNorm, TrainingInFloat32MatchesPyTorch) {
  NchwCase c;
  Tensor running_mean = c.running_mean.to(DType::kFloat32);
  Tensor running_var = c.running_var.to(DType::kFloat32);
  Tensor y = batch_norm(c.x.to(DType::kFloat32), c.weight.to(DType::kFloat32),
                        c.bias.to(DType::kFloat32), running_mean, running_var, true);
  EXPECT_EQ(y.dtype(), DType::kFloat32);
  EXPECT_TRUE(all_close(y, f64(kNchwTrainY, {2, 3, 2, 2})));
  EXPECT_TRUE(all_close(running_var, f64({0.59870125, 0.57386268, 1.2673079}, {3})));
}

TEST(BatchNorm, TwoDimensionalInputWithoutAffineLikePyTorch) {
  Tensor x =
      f64({1.1, 2.76, 0.18, -0.93, -1.51, -0.66, 1.32, 0.04, -0.28, -0.13, 1.89, 3.11}, {4, 3});
  Tensor running_mean = zeros({3}, kF64);
  Tensor running_var = ones({3}, kF64);
  // F.batch_norm(x, rm, rv, None, None, training=True, momentum=0.2, eps=1e-3)
  Tensor y = batch_norm(x, Tensor(), Tensor(), running_mean, running_var, true, 0.2, 1e-3);
  EXPECT_TRUE(
      all_close(y, f64({0.82728516, 1.1877883, -0.2740851, -1.382437, -1.3933089, -0.83907033,
                        1.0667624, -0.45637667, -0.58348177, -0.51161056, 0.66189729, 1.6966372},
                       {4, 3})));
  EXPECT_TRUE(all_close(running_mean, f64({0.068, 0.159, 0.1175}, {3})));
  EXPECT_TRUE(all_close(running_var, f64({1.0247867, 1.5295533, 1.3891917}, {3})));
}

TEST(BatchNorm, EvalUsesRunningStatisticsAndLeavesThemAlone) {
  NchwCase c;
  uint64_t mean_version = c.running_mean.version();
  Tensor y = batch_norm(c.x, c.weight, c.bias, c.running_mean, c.running_var, false, 0.1, 1e-5);
  // F.batch_norm(x, rm, rv, w, b, training=False, eps=1e-5)
  EXPECT_TRUE(all_close(
      y, f64({-0.7739185,  -0.87951774, -0.84195925, -0.95409041, -1.3457667,  -1.5007769,
              -1.2450101,  -1.3418915,  -0.25385018, -0.2581982,  -0.24000747, -0.26334485,
              -0.81855323, -0.86101066, -0.92796276, -0.84794683, -0.74510245, -0.59784282,
              -0.94661562, -1.2953884,  -0.24533159, -0.25251915, -0.23619185, -0.260949},
             {2, 3, 2, 2})));
  EXPECT_TRUE(bitwise_equal(c.running_mean, NchwCase().running_mean));
  EXPECT_TRUE(bitwise_equal(c.running_var, NchwCase().running_var));
  EXPECT_EQ(c.running_mean.version(), mean_version);
}

TEST(BatchNorm, EvalSplitsAlongTheBatchInOnePassTrainingInPasses) {
  const OpDef& eval = ops::batch_norm_eval;
  ASSERT_EQ(eval.splits.size(), 1u);
  EXPECT_EQ(eval.splits[0].output_dim, 0);
  EXPECT_EQ(eval.splits[0].input_dims[0], 0);
  EXPECT_EQ(eval.chunk_passes, 0);
  const OpDef& train = ops::batch_norm;
  ASSERT_EQ(train.splits.size(), 1u);
  EXPECT_EQ(train.splits[0].input_dims, (std::vector<int>{0, -1, -1, -1, -1}));
  EXPECT_EQ(train.chunk_passes, 3);
  EXPECT_EQ(ops::batch_norm_backward->chunk_passes, 2);
  EXPECT_TRUE(train.flags.side_effects);
  EXPECT_EQ(train.mutated_inputs, (std::vector<int>{3, 4}));
}

TEST(BatchNorm, RunningStatisticsMoveExactlyOncePerForward) {
  NchwCase c;
  uint64_t mean_version = c.running_mean.version();
  batch_norm(c.x, c.weight, c.bias, c.running_mean, c.running_var, true, 0.1, 1e-5);
  EXPECT_EQ(c.running_mean.version(), mean_version + 1);
  batch_norm(c.x, c.weight, c.bias, c.running_mean, c.running_var, true, 0.1, 1e-5);
  // Two updates with the same batch: m2 = 0.9 * m1 + 0.1 * batch_mean, checked in closed form.
  // batch means from m1 = 0.9 * m0 + 0.1 * mu: mu = (m1 - 0.9 m0) / 0.1.
  std::vector<double> m0 = {0.19, -0.22, 2.06}, m1 = {0.103875, -0.229625, 1.84925};
  std::vector<double> expected(3);
  for (int i = 0; i < 3; ++i) expected[i] = 0.9 * m1[i] + (m1[i] - 0.9 * m0[i]);
  EXPECT_TRUE(all_close(c.running_mean, f64(expected, {3})));
  EXPECT_EQ(c.running_mean.version(), mean_version + 2);
}

TEST(BatchNorm, ReplayRecomputesTheOutputWithoutTouchingRunningStatistics) {
  NchwCase c;
  const OpDef& op = ops::batch_norm;
  Attrs attrs{{"momentum", 0.1}, {"eps", 1e-5}};
  std::vector<Tensor> inputs = {c.x, c.weight, c.bias, c.running_mean, c.running_var};
  std::vector<Tensor> outputs = dispatch(op, inputs, attrs);
  std::vector<double> mean_after_forward = c.running_mean.to_vector<double>();
  std::vector<double> var_after_forward = c.running_var.to_vector<double>();
  Tensor y_before = outputs[0].clone();
  auto call = make_op_call(op, inputs, outputs, attrs);

  outputs[0].storage()->release_bytes(Residency::kEvicted);
  replay_op_call(*call);
  EXPECT_TRUE(bitwise_equal(outputs[0], y_before));
  EXPECT_EQ(c.running_mean.to_vector<double>(), mean_after_forward);
  EXPECT_EQ(c.running_var.to_vector<double>(), var_after_forward);
  // A second replay (output resident: computed into scratch) still leaves them alone.
  replay_op_call(*call);
  EXPECT_EQ(c.running_var.to_vector<double>(), var_after_forward);
}

TEST(BatchNorm, SavesBatchMeanAndInverseStdAsOutputs) {
  NchwCase c;
  std::vector<Tensor> outputs =
      dispatch(ops::batch_norm, {c.x, c.weight, c.bias, Tensor(), Tensor()},
               Attrs{{"momentum", 0.1}, {"eps", 1e-5}});
  ASSERT_EQ(outputs.size(), 3u);
  EXPECT_TRUE(all_close(outputs[1], mean(c.x, {0, 2, 3})));
  Tensor variance = var(c.x, {0, 2, 3}, /*unbiased=*/false);
  EXPECT_TRUE(all_close(outputs[2], rsqrt(add(variance, 1e-5))));
}

TEST(BatchNorm, GradientsMatchFiniteDifferencesInTraining) {
  Tensor x = randn({3, 2, 2, 3}, kF64).set_requires_grad(true);
  Tensor weight = randn({2}, kF64).set_requires_grad(true);
  Tensor bias = randn({2}, kF64).set_requires_grad(true);
  Tensor running_mean = zeros({2}, kF64), running_var = ones({2}, kF64);
  EXPECT_TRUE(gradcheck(
      [&](const std::vector<Tensor>& in) {
        return batch_norm(in[0], in[1], in[2], running_mean, running_var, true);
      },
      {x, weight, bias}));
}

TEST(BatchNorm, GradientsMatchFiniteDifferencesInTrainingWithoutAffine2D) {
  Tensor x = randn({5, 3}, kF64).set_requires_grad(true);
  EXPECT_TRUE(gradcheck(
      [](const std::vector<Tensor>& in) {
        return batch_norm(in[0], Tensor(), Tensor(), Tensor(), Tensor(), true);
      },
      {x}));
}

TEST(BatchNorm, GradientsMatchFiniteDifferencesForTransposedInput) {
  // (3, 4, 2) transposed to (4, 3, 2): channels 3, non-contiguous.
  Tensor x = randn({3, 4, 2}, kF64).transpose(0, 1).set_requires_grad(true);
  Tensor weight = randn({3}, kF64).set_requires_grad(true);
  ASSERT_FALSE(x.is_contiguous());
  EXPECT_TRUE(gradcheck(
      [](const std::vector<Tensor>& in) {
        return batch_norm(in[0], in[1], Tensor(), Tensor(), Tensor(), true);
      },
      {x, weight}));
}

TEST(BatchNorm, GradientsMatchFiniteDifferencesInEval) {
  Tensor x = randn({3, 2, 2, 2}, kF64).set_requires_grad(true);
  Tensor weight = randn({2}, kF64).set_requires_grad(true);
  Tensor bias = randn({2}, kF64).set_requires_grad(true);
  Tensor running_mean = f64({0.3, -0.2}, {2}), running_var = f64({0.7, 1.9}, {2});
  EXPECT_TRUE(gradcheck(
      [&](const std::vector<Tensor>& in) {
        return batch_norm(in[0], in[1], in[2], running_mean, running_var, false);
      },
      {x, weight, bias}));
  Tensor x2 = randn({4, 2}, kF64).set_requires_grad(true);
  EXPECT_TRUE(gradcheck(
      [&](const std::vector<Tensor>& in) {
        return batch_norm(in[0], Tensor(), Tensor(), running_mean, running_var, false);
      },
      {x2}));
}

TEST(BatchNorm, LargeInputAgreesWithTheFormulaInPublicOps) {
  // Big enough for the threaded paths of forward and backward; the reference is the same
  // formula written with public ops, differentiated by their own backward functions.
  Tensor x = randn({8, 6, 16, 16}, kF64).set_requires_grad(true);
  Tensor weight = randn({6}, kF64).set_requires_grad(true);
  Tensor x_ref = x.detach().set_requires_grad(true);
  Tensor weight_ref = weight.detach().set_requires_grad(true);
  Tensor y = batch_norm(x, weight, Tensor(), Tensor(), Tensor(), true);
  Tensor centred = sub(x_ref, mean(x_ref, {0, 2, 3}, true));
  Tensor invstd = rsqrt(add(var(x_ref, {0, 2, 3}, false, true), 1e-5));
  Tensor reference = mul(mul(centred, invstd), reshape(weight_ref, {1, 6, 1, 1}));
  EXPECT_TRUE(all_close(y, reference));
  Tensor upstream = randn(y.sizes(), kF64);
  sum(mul(y, upstream)).backward();
  sum(mul(reference, upstream)).backward();
  EXPECT_TRUE(all_close(x.grad(), x_ref.grad(), 1e-6, 1e-9));
  EXPECT_TRUE(all_close(weight.grad(), weight_ref.grad(), 1e-6, 1e-9));
  Tensor eval = batch_norm(x, weight, Tensor(), zeros({6}, kF64), ones({6}, kF64), false);
  EXPECT_TRUE(
      all_close(eval, mul(mul(x, 1.0 / std::sqrt(1.0 + 1e-5)), reshape(weight, {1, 6, 1, 1}))));
}

TEST(BatchNorm, AcceptsTheExpandedGradientOfASum) {
  // d sum(y) / d x is zero in training (y has zero mean per channel); d / d bias counts N * S.
  Tensor x = randn({4, 2, 3}, kF64).set_requires_grad(true);
  Tensor bias = zeros({2}, kF64).set_requires_grad(true);
  sum(batch_norm(x, Tensor(), bias, Tensor(), Tensor(), true)).backward();
  EXPECT_TRUE(all_close(x.grad(), zeros({4, 2, 3}, kF64), 1e-5, 1e-9));
  EXPECT_TRUE(all_close(bias.grad(), f64({12, 12}, {2})));
}

TEST(BatchNorm, WeightWithWrongChannelCountIsAnError) {
  NchwCase c;
  EXPECT_TRUE(
      throws_error([&] { batch_norm(c.x, ones({4}, kF64), c.bias, Tensor(), Tensor(), true); },
                   "weight has shape [4] but expected [3]"));
  EXPECT_TRUE(throws_error(
      [&] { batch_norm(c.x, c.weight, c.bias, c.running_mean, ones({2}, kF64), false); },
      "running_var has shape [2]"));
  EXPECT_TRUE(throws_error(
      [&] { batch_norm(c.x, c.weight.to(DType::kFloat32), c.bias, Tensor(), Tensor(), true); },
      "weight has dtype f32"));
}

TEST(BatchNorm, BadInputsAreErrors) {
  EXPECT_TRUE(throws_error(
      [] { batch_norm(ones({3}, kF64), Tensor(), Tensor(), Tensor(), Tensor(), true); },
      "expected an input of shape (N, C)"));
  EXPECT_TRUE(throws_error(
      [] {
        batch_norm(ones({1, 3}, kF64), Tensor(), Tensor(), Tensor(), Tensor(), true);
      },
      "more than 1 value per channel"));
  EXPECT_TRUE(throws_error(
      [] {
        batch_norm(ones({2, 3}, kF64), Tensor(), Tensor(), Tensor(), Tensor(), false);
      },
      "must be defined in evaluation mode"));
  EXPECT_TRUE(throws_error(
      [] {
        batch_norm(ones({2, 3}, DType::kInt64), Tensor(), Tensor(), Tensor(), Tensor(), true);
      },
      "f32 or f64"));
}

TEST(BatchNorm, ReluFusedInEvalHasTheBitsOfReluAfterBatchNorm) {
  NchwCase c;
  // Both signs after normalising, a NaN that must stay NaN, f64 and f32, and planes long enough
  // for the vector loop (7x9) beside the short ones.
  std::vector<double> values = c.x.to_vector<double>();
  values[5] = std::nan("");
  const Tensor x = f64(values, c.x.sizes());
  Tensor wide = randn({3, 3, 7, 9}, kF64);
  for (const Tensor& input : {x, wide, wide.to(DType::kFloat32)}) {
    const DType dtype = input.dtype();
    const Tensor w = c.weight.to(dtype), b = c.bias.to(dtype);
    const Tensor mean = c.running_mean.to(dtype), var = c.running_var.to(dtype);
    NoGradGuard no_grad;
    const Tensor fused = batch_norm_relu_eval(input, w, b, mean, var, 1e-5);
    const Tensor apart = relu(batch_norm(input, w, b, mean, var, false, 0.1, 1e-5));
    EXPECT_TRUE(bitwise_equal(fused, apart)) << dtype_name(dtype);
    EXPECT_GT(fused.eq(zeros_like(fused)).sum().item<double>(), 0);
  }
}

TEST(BatchNorm, ReluFusedInEvalRefusesAutograd) {
  NchwCase c;
  Tensor x = c.x.clone().requires_grad_(true);
  EXPECT_TRUE(throws_error(
      [&] { batch_norm_relu_eval(x, c.weight, c.bias, c.running_mean, c.running_var); },
      "is for inference and has no backward"));
  // Dispatched directly, the op records a backward that refuses to run.
  Tensor y = dispatch(ops::batch_norm_eval, {x, c.weight, c.bias, c.running_mean, c.running_var},
                      Attrs{{"eps", 1e-5}, {"relu", true}})[0];
  EXPECT_TRUE(throws_error([&] { y.sum().backward(); }, "has no backward"));
  EXPECT_FALSE(x.grad().defined());
}

// (2, 3, 4) input, normalized over (3, 4) with affine parameters.
struct LayerNormCase {
  Tensor x = f64({-1.13, -0.09, 1,     -0.08, 0.18, 0.95, -1.76, 1.01,  0.54, 0.28,  -0.51, -1.47,
                  1.11,  0.28,  -0.69, -0.58, 1.12, 0.6,  -0.93, -1.32, 1.97, -0.04, -1.4,  -0.24},
                 {2, 3, 4});
  Tensor weight =
      f64({-2.5, 0.88, -2.67, -0.03, 0.5, -0.52, -0.25, -1.06, -0.56, -0.12, -0.16, -0.25}, {3, 4});
  Tensor bias =
      f64({-1.09, 0, 0.23, -0.82, -0.68, 1.43, 1.96, 0.77, 1.99, 0.72, -0.5, 1.31}, {3, 4});
};

TEST(LayerNorm, NormalisesTrailingDimensionsWithAffineLikePyTorch) {
  LayerNormCase c;
  Tensor y = layer_norm(c.x, {3, 4}, c.weight, c.bias, 1e-5);
  // F.layer_norm(x, (3, 4), w, b, 1e-5)
  EXPECT_TRUE(
      all_close(y, f64({1.7527725,  -4.466815e-17, -2.9520465, -0.82032801, -0.5323945,  0.83870332,
                        2.4164837,  -0.50487413,   1.6042576,  0.67145419,  -0.42652526, 1.687214,
                        -3.8619919, 0.25264726,    2.0274388,  -0.80307105, -0.12065163, 1.1159729,
                        2.1876993,  2.14471,       0.8922912,  0.72356399,  -0.27982464, 1.3669248},
                       {2, 3, 4})));
}

TEST(LayerNorm, WithoutAffineOverTheLastDimensionLikePyTorch) {
  LayerNormCase c;
  Tensor y = layer_norm(c.x.to(DType::kFloat32), {4});
  EXPECT_EQ(y.dtype(), DType::kFloat32);
  // F.layer_norm(x, (4,), None, None, 1e-5)
  EXPECT_TRUE(all_close(
      y, f64({-1.4007833,  -0.01991635, 1.4273384,   -0.0066387833, 0.075900875, 0.76347351,
              -1.656425,   0.81705059,  1.0595323,   0.72763059,    -0.28083988, -1.506323,
              1.4836901,   0.34344677,  -0.98912671, -0.83801013,   1.2294317,   0.71900899,
              -0.78281183, -1.1656289,  1.5651494,   -0.09279542,   -1.2145889,  -0.25776505},
             {2, 3, 4})));
}

TEST(LayerNorm, OutputsRowMeanAndInverseStdShapedLikePyTorch) {
  LayerNormCase c;
  std::vector<Tensor> outputs =
      dispatch(ops::layer_norm, {c.x, Tensor(), Tensor()},
               Attrs{{"normalized_shape", std::vector<int64_t>{4}}, {"eps", 1e-5}});
  ASSERT_EQ(outputs.size(), 3u);
  EXPECT_EQ(outputs[1].sizes(), (Shape{2, 3, 1}));
  EXPECT_TRUE(all_close(outputs[1], mean(c.x, {2}, true)));
  EXPECT_TRUE(all_close(outputs[2], rsqrt(add(var(c.x, {2}, false, true), 1e-5))));
  const OpDef& op = ops::layer_norm;
  ASSERT_EQ(op.splits.size(), 1u);
  EXPECT_EQ(op.splits[0].output_dim, 0);
}

TEST(LayerNorm, GradientsMatchFiniteDifferencesWithAffine) {
  Tensor x = randn({3, 2, 5}, kF64).set_requires_grad(true);
  Tensor weight = randn({2, 5}, kF64).set_requires_grad(true);
  Tensor bias = randn({2, 5}, kF64).set_requires_grad(true);
  EXPECT_TRUE(gradcheck(
      [](const std::vector<Tensor>& in) {
        return layer_norm(in[0], {2, 5}, in[1], in[2]);
      },
      {x, weight, bias}));
}

TEST(LayerNorm, GradientsMatchFiniteDifferencesWithoutAffineOnTransposedInput) {
  Tensor x = randn({6, 4}, kF64).t().set_requires_grad(true);  // (4, 6), non-contiguous
  ASSERT_FALSE(x.is_contiguous());
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return layer_norm(in[0], {6}); }, {x}));
  Tensor weight = randn({6}, kF64).set_requires_grad(true);
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return layer_norm(in[0], {6}, in[1]); },
                        {x, weight}));
}

TEST(LayerNorm, LargeInputAgreesWithTheFormulaInPublicOps) {
  Tensor x = randn({64, 10, 96}, kF64).set_requires_grad(true);
  Tensor weight = randn({96}, kF64).set_requires_grad(true);
  Tensor bias = randn({96}, kF64).set_requires_grad(true);
  Tensor x_ref = x.detach().set_requires_grad(true);
  Tensor weight_ref = weight.detach().set_requires_grad(true);
  Tensor y = layer_norm(x, {96}, weight, bias);
  Tensor centred = sub(x_ref, mean(x_ref, {2}, true));
  Tensor reference =
      add(mul(mul(centred, rsqrt(add(var(x_ref, {2}, false, true), 1e-5))), weight_ref), bias);
  EXPECT_TRUE(all_close(y, reference));
  Tensor upstream = randn(y.sizes(), kF64);
  sum(mul(y, upstream)).backward();
  sum(mul(reference, upstream)).backward();
  EXPECT_TRUE(all_close(x.grad(), x_ref.grad(), 1e-6, 1e-9));
  EXPECT_TRUE(all_close(weight.grad(), weight_ref.grad(), 1e-6, 1e-9));
}

TEST(LayerNorm, AcceptsTheExpandedGradientOfASum) {
  Tensor x = randn({3, 4}, kF64).set_requires_grad(true);
  Tensor bias = zeros({4}, kF64).set_requires_grad(true);
  sum(layer_norm(x, {4}, Tensor(), bias)).backward();
  EXPECT_TRUE(all_close(x.grad(), zeros({3, 4}, kF64), 1e-5, 1e-9));
  EXPECT_TRUE(all_close(bias.grad(), f64({3, 3, 3, 3}, {4})));
}

TEST(LayerNorm, BadShapesAreErrors) {
  EXPECT_TRUE(throws_error(
      [] {
        layer_norm(ones({2, 3}, kF64), {4});
      },
      "normalized_shape [4] does not match the trailing dimensions"));
  EXPECT_TRUE(throws_error(
      [] {
        layer_norm(ones({2, 3}, kF64), {3}, ones({2}, kF64));
      },
      "weight has shape [2] but expected [3]"));
  EXPECT_TRUE(throws_error(
      [] {
        layer_norm(ones({2, 3}, kF64), {3}, Tensor(), ones({3}));
      },
      "bias has dtype f32"));
}

}  // namespace
}  // namespace tessel
