// dropout: the documented mask rule (kept iff uniform_at(state, i) >= p), 1 / (1 - p) scaling,
// reproducibility from a seed and from the recorded attributes, gradients, and bad p.
#include "ops/dropout.h"

#include <cmath>
#include <limits>

#include "core/autograd.h"
#include "core/op.h"
#include "core/rng.h"
#include "ops/ops.h"
#include "tests/testing.h"

namespace tessel {
namespace {

using testing::bitwise_equal;
using testing::gradcheck;
using testing::kF64;
using testing::throws_error;

TEST(Dropout, IsTheIdentityInEvalOrWithZeroProbability) {
  Tensor x = randn({4, 5});
  EXPECT_TRUE(dropout(x, 0.5, false).is_same(x));
  EXPECT_TRUE(dropout(x, 0.0, true).is_same(x));
}

TEST(Dropout, KeepsElementIffItsUniformNumberReachesP) {
  Tensor x = randn({7, 9});
  manual_seed(1234);
  const RngState state = get_rng_state();
  const double p = 0.3;
  Tensor y = dropout(x, p, true);
  std::vector<float> xs = x.to_vector<float>(), ys = y.to_vector<float>();
  int kept = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const bool keep = uniform_at(state, i) >= p;
    kept += keep;
    const float expected = keep ? xs[i] * static_cast<float>(1.0 / (1.0 - p)) : 0.0f;
    EXPECT_FLOAT_EQ(ys[i], expected) << "element " << i;
  }
  EXPECT_GT(kept, 0);
  EXPECT_LT(kept, 63);
  // The call consumed ceil(63 / 4) = 16 Philox counters.
  EXPECT_EQ(get_rng_state().offset, state.offset + 16);
}

TEST(Dropout, LargeTensorFollowsTheSameRuleOnEveryThread) {
  Tensor x = ones({20011});
  manual_seed(8);
  const RngState state = get_rng_state();
  std::vector<float> ys = dropout(x, 0.5, true).to_vector<float>();
  int mismatches = 0;
  for (size_t i = 0; i < ys.size(); ++i)
    mismatches += (ys[i] != 0.0f) != (uniform_at(state, i) >= 0.5);
  EXPECT_EQ(mismatches, 0);
}

// Probabilities whose threshold p * 2^24 is and is not a whole number, in f32 and f64, over a
// length that is not a whole number of Philox counters: values exact.
TEST(Dropout, EveryProbabilityAndTypeFollowsTheRuleExactly) {
  for (const DType dtype : {DType::kFloat32, DType::kFloat64}) {
    for (const double p : {0.1, 1.0 / 3.0, 0.5, 0.9}) {
      Tensor x = randn({5 * 64 + 7}).to(dtype);
      manual_seed(21);
      const RngState state = get_rng_state();
      const std::vector<double> xs = x.to(kF64).to_vector<double>();
      const std::vector<double> ys = dropout(x, p, true).to(kF64).to_vector<double>();
      for (size_t i = 0; i < xs.size(); ++i) {
        const bool keep = uniform_at(state, i) >= p;
        const double expected = dtype == DType::kFloat32
                                    ? static_cast<double>(static_cast<float>(xs[i]) *
                                                          static_cast<float>(1.0 / (1.0 - p)))
                                    : xs[i] * (1.0 / (1.0 - p));
        ASSERT_EQ(ys[i], keep ? expected : 0.0) << dtype_name(dtype) << " p " << p << " i " << i;
      }
    }
  }
}

TEST(Dropout, SameSeedGivesTheSameMaskAndNextCallADifferentOne) {
  Tensor x = ones({1000}, kF64);
  manual_seed(99);
  Tensor first = dropout(x, 0.5, true);
  Tensor second = dropout(x, 0.5, true);
  manual_seed(99);
  Tensor again = dropout(x, 0.5, true);
  EXPECT_TRUE(bitwise_equal(first, again));
  EXPECT_FALSE(bitwise_equal(first, second));
  // About half kept (each kept element is 2.0); a very loose band, never flaky.
  double total = sum(first).item<double>();
  EXPECT_GT(total, 2.0 * 350);
  EXPECT_LT(total, 2.0 * 650);
}

TEST(Dropout, ReplayWithRecordedAttributesIsBitwiseIdentical) {
  const OpDef& op = ops::dropout;
  EXPECT_TRUE(op.flags.random);
  Tensor x = randn({3, 17});
  Attrs attrs{{"p", 0.25}, {"rng_seed", int64_t{77}}, {"rng_offset", int64_t{5}}};
  std::vector<Tensor> outputs = dispatch(op, {x}, attrs);
  Tensor y_before = outputs[0].clone();
  Tensor mask_before = outputs[1].clone();
  auto call = make_op_call(op, {x}, outputs, attrs);
  outputs[0].storage()->release_bytes(Residency::kEvicted);
  outputs[1].storage()->release_bytes(Residency::kEvicted);
  replay_op_call(*call);
  EXPECT_TRUE(bitwise_equal(outputs[0], y_before));
  EXPECT_TRUE(bitwise_equal(outputs[1], mask_before));
  // The dispatcher leaves recorded seed and offset alone, so a second dispatch agrees too.
  EXPECT_TRUE(bitwise_equal(dispatch(op, {x}, attrs)[0], y_before));
}

TEST(Dropout, MaskIsBoolAndMarksKeptElements) {
  manual_seed(3);
  Tensor x = ones({50}, kF64);
  std::vector<Tensor> outputs = dispatch(ops::dropout, {x}, Attrs{{"p", 0.4}});
  ASSERT_EQ(outputs.size(), 2u);
  EXPECT_EQ(outputs[1].dtype(), DType::kBool);
  std::vector<bool> mask = outputs[1].to_vector<bool>();
  std::vector<double> y = outputs[0].to_vector<double>();
  for (size_t i = 0; i < y.size(); ++i) EXPECT_EQ(y[i] != 0.0, mask[i]) << "element " << i;
}

TEST(Dropout, TransposedInputUsesRowMajorElementOrder) {
  Tensor base = randn({6, 5});
  Tensor x = base.t();
  manual_seed(11);
  Tensor from_view = dropout(x, 0.5, true);
  manual_seed(11);
  Tensor from_copy = dropout(x.contiguous(), 0.5, true);
  EXPECT_TRUE(bitwise_equal(from_view, from_copy));
}

TEST(Dropout, ProbabilityOneGivesZeros) {
  Tensor x = randn({4, 4}, kF64).set_requires_grad(true);
  Tensor y = dropout(x, 1.0, true);
  EXPECT_TRUE(bitwise_equal(y, zeros({4, 4}, kF64)));
  sum(y).backward();
  EXPECT_TRUE(bitwise_equal(x.grad(), zeros({4, 4}, kF64)));
}

TEST(Dropout, GradientIsTheMaskScaled) {
  Tensor x = randn({5, 6}, kF64).set_requires_grad(true);
  manual_seed(21);
  Tensor y = dropout(x, 0.4, true);
  sum(y).backward();
  std::vector<double> ys = y.to_vector<double>(), grads = x.grad().to_vector<double>();
  for (size_t i = 0; i < ys.size(); ++i)
    EXPECT_DOUBLE_EQ(grads[i], ys[i] != 0.0 ? 1.0 / 0.6 : 0.0) << "element " << i;
}

TEST(Dropout, GradientsMatchFiniteDifferencesWithAFixedSeed) {
  Tensor x = randn({4, 6}, kF64).t().set_requires_grad(true);
  EXPECT_TRUE(gradcheck(
      [](const std::vector<Tensor>& in) {
        manual_seed(5);  // every evaluation draws the same mask
        return dropout(in[0], 0.3, true);
      },
      {x}));
}

TEST(Dropout, ProbabilityOutsideZeroToOneIsAnError) {
  Tensor x = ones({3});
  EXPECT_TRUE(throws_error([&] { dropout(x, -0.1, true); }, "p must be in [0, 1], got -0.1"));
  EXPECT_TRUE(throws_error([&] { dropout(x, 1.5, true); }, "p must be in [0, 1], got 1.5"));
  EXPECT_TRUE(throws_error([&] { dropout(x, std::nan(""), true); }, "p must be in [0, 1]"));
  EXPECT_TRUE(throws_error([&] { dropout(x, 2.0, false); }, "p must be in [0, 1]"));
  EXPECT_TRUE(
      throws_error([] { dropout(ones({3}, DType::kInt64), 0.5, true); }, "f32 or f64 input"));
}

}  // namespace
}  // namespace tessel
