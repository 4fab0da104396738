// cross_entropy, nll_loss and mse_loss: values against PyTorch 1.13 (literals below were
// printed by torch.nn.functional on these inputs), finite-difference gradients for every
// reduction, ignore_index and label smoothing, and clear errors on bad targets and shapes.
#include "ops/loss.h"

#include "core/autograd.h"
#include "core/op.h"
#include "ops/ops.h"
#include "tests/testing.h"

namespace tessel {
namespace {

using testing::all_close;
using testing::gradcheck;
using testing::kF64;
using testing::throws_error;

Tensor f64(const std::vector<double>& values, const Shape& sizes) {
  return from_vector<double>(values, sizes);
}
Tensor targets(const std::vector<int64_t>& values, const Shape& sizes) {
  return from_vector<int64_t>(values, sizes);
}

// Four rows of five classes; the second target is ignored (-100).
const std::vector<double> kLogits = {-0.31, -0.71, -0.73, -0.3,  0.87,  -3.7, -1.81,
                                     -1.84, 0.09,  0.51,  0.6,   1.29,  -2.1, 1.58,
                                     1.08,  0.89,  -1.93, -0.27, -0.14, 2.57};
const std::vector<int64_t> kTargets = {1, -100, 3, 0};

TEST(CrossEntropy, EachReductionMatchesPyTorch) {
  Tensor logits = f64(kLogits, {4, 5});
  Tensor target = targets(kTargets, {4});
  EXPECT_TRUE(all_close(cross_entropy(logits, target, -100, 0.0, "none"),
                        f64({2.2858251, 0, 1.0135366, 1.9594826}, {4})));
  // Mean divides by the three targets that are not ignored.
  EXPECT_TRUE(all_close(cross_entropy(logits, target), f64({1.7529481}, {})));
  EXPECT_TRUE(all_close(cross_entropy(logits, target, -100, 0.0, "sum"), f64({5.2588444}, {})));
}

TEST(CrossEntropy, LabelSmoothingMatchesPyTorch) {
  Tensor logits = f64(kLogits, {4, 5});
  Tensor target = targets(kTargets, {4});
  EXPECT_TRUE(all_close(cross_entropy(logits, target, -100, 0.2, "none"),
                        f64({2.1910251, 0, 1.2315366, 2.0926826}, {4})));
  EXPECT_TRUE(all_close(cross_entropy(logits, target, -100, 0.2, "mean"), f64({1.8384148}, {})));
  EXPECT_TRUE(all_close(cross_entropy(logits, target, -100, 0.2, "sum"), f64({5.5152444}, {})));
}

TEST(CrossEntropy, IgnoreIndexMayBeAValidClass) {
  Tensor logits = f64(kLogits, {4, 5});
  // Targets [1, 2, 3, 0] with ignore_index 2 give the same mean as ignoring the second row.
  EXPECT_TRUE(
      all_close(cross_entropy(logits, targets({1, 2, 3, 0}, {4}), 2), f64({1.7529481}, {})));
}

TEST(CrossEntropy, FloatLogitsGiveAFloatLoss) {
  Tensor loss = cross_entropy(f64(kLogits, {4, 5}).to(DType::kFloat32), targets(kTargets, {4}));
  EXPECT_EQ(loss.dtype(), DType::kFloat32);
  EXPECT_TRUE(all_close(loss, f64({1.7529481}, {})));
}

TEST(CrossEntropy, SpatialTargetsMatchPyTorch) {
  // logits (2, 3, 2), targets (2, 2), label_smoothing 0.1.
  Tensor logits =
      f64({0.83, -0.25, -0.8, 0.24, 0.29, 0.69, -0.63, 0.88, -0.68, 0.45, 0.29, -0.83}, {2, 3, 2});
  Tensor target = targets({0, 2, 1, -100}, {2, 2});
  EXPECT_TRUE(all_close(cross_entropy(logits, target, -100, 0.1, "none"),
                        f64({0.64820363, 0.75350964, 1.5112653, 0}, {2, 2})));
  EXPECT_TRUE(all_close(cross_entropy(logits, target, -100, 0.1), f64({0.97099286}, {})));
  EXPECT_TRUE(all_close(cross_entropy(logits, target, -100, 0.1, "sum"), f64({2.9129786}, {})));
}

TEST(CrossEntropy, OneDimensionalLogitsTakeAScalarTarget) {
  Tensor loss = cross_entropy(f64({-0.55, 0.64, -0.4, -0.66}, {4}), targets({2}, {}));
  EXPECT_TRUE(all_close(loss, f64({1.6976276}, {})));
}

TEST(CrossEntropy, GradientsMatchFiniteDifferencesForEveryReduction) {
  Tensor target = targets({2, -100, 0, 4, 1}, {5});
  for (const char* reduction : {"mean", "sum", "none"}) {
    for (double smoothing : {0.0, 0.3}) {
      Tensor logits = randn({5, 6}, kF64).set_requires_grad(true);
      EXPECT_TRUE(gradcheck(
          [&](const std::vector<Tensor>& in) {
            return cross_entropy(in[0], target, -100, smoothing, reduction);
          },
          {logits}))
          << reduction << ", label_smoothing " << smoothing;
    }
  }
}

TEST(CrossEntropy, GradientsMatchFiniteDifferencesForSpatialAndTransposedLogits) {
  Tensor logits = randn({2, 4, 3}, kF64).set_requires_grad(true);
  Tensor target = targets({0, 3, -100, 1, 2, 2}, {2, 3});
  EXPECT_TRUE(gradcheck(
      [&](const std::vector<Tensor>& in) { return cross_entropy(in[0], target, -100, 0.2); },
      {logits}));
  Tensor transposed = randn({6, 3}, kF64).t().set_requires_grad(true);  // (3, 6)
  Tensor row_targets = targets({5, 0, 3}, {3});
  EXPECT_TRUE(gradcheck(
      [&](const std::vector<Tensor>& in) {
        return cross_entropy(in[0], row_targets, -100, 0.0, "none");
      },
      {transposed}));
}

TEST(CrossEntropy, LogProbabilitiesOutputIsDifferentiableToo) {
  Tensor logits = randn({3, 4}, kF64).set_requires_grad(true);
  Tensor target = targets({1, 0, 3}, {3});
  EXPECT_TRUE(gradcheck(
      [&](const std::vector<Tensor>& in) {
        std::vector<Tensor> outputs = dispatch(
            ops::cross_entropy, {in[0], target},
            Attrs{{"ignore_index", int64_t{-100}}, {"label_smoothing", 0.1}, {"reduction", "sum"}});
        return add(outputs[1], outputs[0]);  // both outputs carry gradient
      },
      {logits}));
}

TEST(CrossEntropy, LargeBatchAgreesWithNllOfLogSoftmax) {
  Tensor logits = randn({3000, 40}, kF64).set_requires_grad(true);
  Tensor target = randint(0, 40, {3000});
  Tensor loss = cross_entropy(logits, target);
  EXPECT_TRUE(all_close(loss, nll_loss(log_softmax(logits, 1), target)));
  loss.backward();
  // Each row's gradient is (softmax - onehot) / N, which sums to zero over the classes.
  EXPECT_LT(max(abs(sum(logits.grad(), {1}))).item<double>(), 1e-12);
}

TEST(CrossEntropy, OutOfRangeTargetNamesTheValueAndClassCount) {
  Tensor logits = f64(kLogits, {4, 5});
  EXPECT_TRUE(throws_error(
      [&] {
        cross_entropy(logits, targets({1, 5, 3, 0}, {4}));
      },
      "target 5 (at flat index 1) is out of range for 5 classes"));
  EXPECT_TRUE(throws_error(
      [&] {
        cross_entropy(logits, targets({1, -1, 3, 0}, {4}));
      },
      "target -1"));
}

TEST(CrossEntropy, BadTargetsAndArgumentsAreErrors) {
  Tensor logits = f64(kLogits, {4, 5});
  EXPECT_TRUE(throws_error([&] { cross_entropy(logits, targets(kTargets, {4}).to(DType::kInt32)); },
                           "expected target to hold class indices as i64, got dtype i32"));
  EXPECT_TRUE(throws_error([&] { cross_entropy(logits, ones({4})); }, "got dtype f32"));
  EXPECT_TRUE(throws_error(
      [&] {
        cross_entropy(logits, targets({1, 2, 3}, {3}));
      },
      "target has shape [3] but logits have shape [4, 5]"));
  EXPECT_TRUE(throws_error([&] { cross_entropy(logits, targets(kTargets, {4}), -100, 0.0, "avg"); },
                           "reduction must be"));
  EXPECT_TRUE(throws_error([&] { cross_entropy(logits, targets(kTargets, {4}), -100, 1.5); },
                           "label_smoothing must be in [0, 1]"));
  EXPECT_TRUE(throws_error([&] { cross_entropy(logits.to(DType::kInt64), targets(kTargets, {4})); },
                           "f32 or f64"));
}

TEST(NllLoss, EachReductionMatchesPyTorch) {
  // F.log_softmax of kLogits along dim 1.
  Tensor log_probs =
      f64({-1.8858251, -2.2858251, -2.3058251,  -1.8758251, -0.70582512, -4.8335484, -2.9435484,
           -2.9735484, -1.0435484, -0.62354838, -1.9935366, -1.3035366,  -4.6935366, -1.0135366,
           -1.5135366, -1.9594826, -4.7794826,  -3.1194826, -2.9894826,  -0.27948263},
          {4, 5});
  Tensor target = targets(kTargets, {4});
  EXPECT_TRUE(all_close(nll_loss(log_probs, target, -100, "none"),
                        f64({2.2858251, 0, 1.0135366, 1.9594826}, {4})));
  EXPECT_TRUE(all_close(nll_loss(log_probs, target), f64({1.7529481}, {})));
  EXPECT_TRUE(all_close(nll_loss(log_probs, target, -100, "sum"), f64({5.2588444}, {})));
}

TEST(NllLoss, AgreesWithCrossEntropyOnLogSoftmax) {
  Tensor logits = randn({3, 4, 2}, kF64);
  Tensor target = targets({0, 3, 1, -100, 2, 2}, {3, 2});
  EXPECT_TRUE(all_close(nll_loss(log_softmax(logits, 1), target), cross_entropy(logits, target)));
}

TEST(NllLoss, GradientsMatchFiniteDifferencesForEveryReduction) {
  Tensor target = targets({2, -100, 0, 3}, {4});
  for (const char* reduction : {"mean", "sum", "none"}) {
    Tensor log_probs = randn({4, 5}, kF64).set_requires_grad(true);
    EXPECT_TRUE(gradcheck(
        [&](const std::vector<Tensor>& in) { return nll_loss(in[0], target, -100, reduction); },
        {log_probs}))
        << reduction;
  }
  Tensor spatial = randn({3, 2, 4}, kF64).transpose(1, 2).set_requires_grad(true);  // (3, 4, 2)
  Tensor spatial_target = targets({0, 1, 3, 2, -100, 0}, {3, 2});
  EXPECT_TRUE(gradcheck(
      [&](const std::vector<Tensor>& in) { return nll_loss(in[0], spatial_target); }, {spatial}));
}

TEST(NllLoss, BadTargetsAreErrors) {
  Tensor log_probs = zeros({2, 3}, kF64);
  EXPECT_TRUE(throws_error(
      [&] {
        nll_loss(log_probs, targets({0, 3}, {2}));
      },
      "target 3 (at flat index 1) is out of range for 3 classes"));
  EXPECT_TRUE(throws_error(
      [&] {
        nll_loss(log_probs, targets({0, 1, 2}, {3}));
      },
      "target has shape [3] but log_probs have shape [2, 3]"));
  EXPECT_TRUE(throws_error([&] { nll_loss(log_probs, ones({2}, kF64)); }, "as i64"));
}

TEST(MseLoss, EachReductionMatchesPyTorch) {
  Tensor input = f64({-1.64, 0.98, -0.04, -0.82, 0.31, -1.14}, {2, 3});
  Tensor target = f64({0.38, -0.28, -2.57, -1.43, 0.5, 0.54}, {2, 3});
  EXPECT_TRUE(all_close(mse_loss(input, target, "none"),
                        f64({4.0804, 1.5876, 6.4009, 0.3721, 0.0361, 2.8224}, {2, 3})));
  EXPECT_TRUE(all_close(mse_loss(input, target), f64({2.5499167}, {})));
  EXPECT_TRUE(all_close(mse_loss(input, target, "sum"), f64({15.2995}, {})));
}

TEST(MseLoss, GradientsMatchFiniteDifferencesForBothArguments) {
  for (const char* reduction : {"mean", "sum", "none"}) {
    Tensor input = randn({4, 3}, kF64).t().set_requires_grad(true);
    Tensor target = randn({3, 4}, kF64).set_requires_grad(true);
    EXPECT_TRUE(
        gradcheck([&](const std::vector<Tensor>& in) { return mse_loss(in[0], in[1], reduction); },
                  {input, target}))
        << reduction;
  }
}

TEST(MseLoss, MismatchedShapesOrDtypesAreErrors) {
  EXPECT_TRUE(throws_error(
      [] {
        mse_loss(ones({2, 3}), ones({3, 3}));
      },
      "target has shape [3, 3] but input has shape [2, 3]"));
  EXPECT_TRUE(throws_error([] { mse_loss(ones({2}), ones({2}, kF64)); }, "target has dtype f64"));
  EXPECT_TRUE(throws_error([] { mse_loss(ones({2}), ones({2}), "max"); }, "reduction must be"));
}

}  // namespace
}  // namespace tessel
