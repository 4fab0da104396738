// linear_cross_entropy: the same loss and gradients as cross_entropy(linear(...)) (itself held to
// PyTorch in loss_test and linalg_test) for every chunking, reduction, ignore_index and label
// smoothing; finite-difference gradients; and clear errors on bad inputs.
#include <vector>

#include "core/autograd.h"
#include "ops/ops.h"
#include "tests/testing.h"

namespace tessel {
namespace {

using testing::all_close;
using testing::gradcheck;
using testing::kF64;
using testing::throws_error;

constexpr int64_t kRows = 10, kIn = 6, kClasses = 7;

// Rows whose targets include two ignored ones (-100).
Tensor make_targets() {
  return from_vector<int64_t>({3, -100, 0, 6, 2, 2, -100, 5, 1, 4}, {kRows});
}

struct Inputs {
  Tensor x = randn({kRows, kIn}, kF64).set_requires_grad(true);
  Tensor weight = randn({kClasses, kIn}, kF64).set_requires_grad(true);
  Tensor bias = randn({kClasses}, kF64).set_requires_grad(true);
  Tensor target = make_targets();
};

struct Result {
  Tensor loss, grad_x, grad_weight, grad_bias;
};

Result run(const Inputs& in, bool fused, double smoothing, const std::string& reduction,
           int64_t chunk_rows) {
  for (const Tensor* t : {&in.x, &in.weight, &in.bias}) t->set_grad(Tensor());
  Tensor loss = fused ? linear_cross_entropy(in.x, in.weight, in.bias, in.target, -100, smoothing,
                                             reduction, chunk_rows)
                      : cross_entropy(linear(in.x, in.weight, in.bias), in.target, -100, smoothing,
                                      reduction);
  loss.backward();
  return {loss.detach(), in.x.grad(), in.weight.grad(), in.bias.grad()};
}

TEST(LinearCrossEntropy, MatchesTheUnfusedLossAndGradientsForEveryChunking) {
  manual_seed(1);
  Inputs in;
  for (const std::string reduction : {"mean", "sum"}) {
    for (double smoothing : {0.0, 0.2}) {
      const Result expected = run(in, false, smoothing, reduction, 0);
      for (int64_t chunk_rows : {0, 1, 3, 4, 10, 64}) {
        SCOPED_TRACE(reduction + " smoothing " + std::to_string(smoothing) + " chunk_rows " +
                     std::to_string(chunk_rows));
        const Result fused = run(in, true, smoothing, reduction, chunk_rows);
        EXPECT_TRUE(all_close(fused.loss, expected.loss, 1e-12, 1e-12));
        EXPECT_TRUE(all_close(fused.grad_x, expected.grad_x, 1e-12, 1e-12));
        EXPECT_TRUE(all_close(fused.grad_weight, expected.grad_weight, 1e-12, 1e-12));
        EXPECT_TRUE(all_close(fused.grad_bias, expected.grad_bias, 1e-12, 1e-12));
      }
    }
  }
}

TEST(LinearCrossEntropy, FiniteDifferenceGradients) {
  manual_seed(2);
  Inputs in;
  for (int64_t chunk_rows : {3, 0}) {
    EXPECT_TRUE(gradcheck(
        [&](const std::vector<Tensor>& v) {
          return linear_cross_entropy(v[0], v[1], v[2], in.target, -100, 0.1, "mean", chunk_rows);
        },
        {in.x, in.weight, in.bias}));
  }
}

TEST(LinearCrossEntropy, ScalesItsGradientsByTheLossGradientAndFeedsSharedWeights) {
  manual_seed(3);
  Inputs in;
  // The weight is also used elsewhere (a tied embedding table): the gradients sum.
  const Tensor indices = from_vector<int64_t>({1, 4}, {2});
  auto total = [&](bool fused) {
    for (const Tensor* t : {&in.x, &in.weight, &in.bias}) t->set_grad(Tensor());
    Tensor head =
        fused ? linear_cross_entropy(in.x, in.weight, in.bias, in.target, -100, 0.0, "mean", 4)
              : cross_entropy(linear(in.x, in.weight, in.bias), in.target);
    Tensor loss = add(mul(head, 2.5), sum(embedding(in.weight, indices)));
    loss.backward();
    return std::vector<Tensor>{loss.detach(), in.x.grad(), in.weight.grad(), in.bias.grad()};
  };
  const std::vector<Tensor> expected = total(false), fused = total(true);
  for (size_t i = 0; i < expected.size(); ++i)
    EXPECT_TRUE(all_close(fused[i], expected[i], 1e-12, 1e-12)) << "tensor " << i;
}

TEST(LinearCrossEntropy, WithoutBiasOrWithSomeInputsFrozen) {
  manual_seed(4);
  Inputs in;
  Tensor frozen_x = in.x.detach();
  Tensor expected = cross_entropy(linear(frozen_x, in.weight), in.target, -100, 0.0, "sum");
  expected.backward();
  const Tensor expected_grad = in.weight.grad();
  in.weight.set_grad(Tensor());
  Tensor fused =
      linear_cross_entropy(frozen_x, in.weight, Tensor(), in.target, -100, 0.0, "sum", 3);
  fused.backward();
  EXPECT_TRUE(all_close(fused, expected, 1e-12, 1e-12));
  EXPECT_TRUE(all_close(in.weight.grad(), expected_grad, 1e-12, 1e-12));
  EXPECT_FALSE(frozen_x.grad().defined());
}

TEST(LinearCrossEntropy, WithoutGradientRecordingOnlyScores) {
  manual_seed(5);
  Inputs in;
  Tensor expected = cross_entropy(linear(in.x, in.weight, in.bias), in.target).detach();
  NoGradGuard no_grad;
  Tensor loss = linear_cross_entropy(in.x, in.weight, in.bias, in.target, -100, 0.0, "mean", 3);
  EXPECT_FALSE(loss.requires_grad());
  EXPECT_TRUE(all_close(loss, expected, 1e-12, 1e-12));
}

TEST(LinearCrossEntropy, RetainGraphRunsBackwardTwice) {
  manual_seed(6);
  Inputs in;
  Tensor loss = linear_cross_entropy(in.x, in.weight, in.bias, in.target, -100, 0.0, "mean", 3);
  loss.backward(Tensor(), /*retain_graph=*/true);
  const Tensor once = in.weight.grad().detach().clone();
  loss.backward();
  EXPECT_TRUE(all_close(in.weight.grad(), mul(once, 2.0), 1e-12, 1e-12));
  EXPECT_TRUE(throws_error([&] { loss.backward(); }, "retain_graph=true"));
}

TEST(LinearCrossEntropy, RejectsBadInputsClearly) {
  manual_seed(7);
  Inputs in;
  const Tensor& x = in.x;
  const Tensor& w = in.weight;
  const Tensor& b = in.bias;
  const Tensor& t = in.target;
  EXPECT_TRUE(throws_error([&] { linear_cross_entropy(x, w, b, t, -100, 0.0, "none"); },
                           "reduction must be \"mean\" or \"sum\""));
  EXPECT_TRUE(throws_error(
      [&] {
        linear_cross_entropy(x.reshape({2, 5, kIn}), w, b, t);
      },
      "expected x of shape (rows, in_features)"));
  EXPECT_TRUE(throws_error(
      [&] {
        linear_cross_entropy(x, randn({kClasses, 3}, kF64), b, t);
      },
      "expected weight of shape (classes, 6)"));
  EXPECT_TRUE(
      throws_error([&] { linear_cross_entropy(x, w, randn({3}, kF64), t); }, "expected bias"));
  EXPECT_TRUE(throws_error([&] { linear_cross_entropy(x, w, b, t.narrow(0, 0, 4)); },
                           "expected target shape (10)"));
  EXPECT_TRUE(throws_error([&] { linear_cross_entropy(x, w, b, t, -100, 0.0, "mean", -1); },
                           "chunk_rows must be >= 0"));
  EXPECT_TRUE(throws_error(
      [&] {
        linear_cross_entropy(x, w, b,
                             from_vector<int64_t>(std::vector<int64_t>(kRows, 9), {kRows}));
      },
      "out of range"));
  // Nothing was recorded or changed by the failed calls.
  EXPECT_FALSE(x.grad().defined());
}

}  // namespace
}  // namespace tessel
