// Reductions and softmax: values, keepdim / dims handling, accuracy of long f32 sums,
// gradients (f64 finite differences on non-contiguous inputs) and bad input.
#include <cmath>
#include <limits>

#include "core/autograd.h"
#include "core/rng.h"
#include "core/threading.h"
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
  return from_vector<double>(values, sizes, kF64);
}

// [2, 3, 4] holding 0..23.
Tensor counting_cube() { return to_dtype(reshape(arange(24), {2, 3, 4}), kF64); }

Tensor transposed_leaf(int64_t rows, int64_t cols) {
  Tensor base = randn({cols, rows}, kF64).set_requires_grad(true);
  return transpose(base, 0, 1);
}

TEST(Sum, ReducesAllOrTheGivenDims) {
  Tensor x = tensor({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(sum(x).sizes(), Shape{});
  EXPECT_FLOAT_EQ(sum(x).item<float>(), 21);
  EXPECT_TRUE(all_close(sum(x, {0}), tensor({5, 7, 9}, {3})));
  EXPECT_TRUE(all_close(sum(x, {1}), tensor({6, 15}, {2})));
  EXPECT_TRUE(all_close(sum(x, {-1}, true), tensor({6, 15}, {2, 1})));
  EXPECT_TRUE(all_close(sum(x, {0, 1}, true), tensor({21}, {1, 1})));
}

TEST(Sum, NonAdjacentDimsAndStridedInputs) {
  Tensor cube = counting_cube();
  // sum over dims 0 and 2 of 0..23 shaped [2, 3, 4]: rows j give 12 + 16 j + 12 * 4 ...
  // (hand computed: j=0: (0+1+2+3)+(12+13+14+15) = 60; j=1: 92; j=2: 124)
  EXPECT_TRUE(all_close(sum(cube, {0, 2}), f64({60, 92, 124}, {3})));
  EXPECT_TRUE(all_close(sum(cube, {2, 0}, true), f64({60, 92, 124}, {1, 3, 1})));
  Tensor transposed = transpose(cube, 0, 2);  // [4, 3, 2]
  EXPECT_TRUE(all_close(sum(transposed, {0, 2}), f64({60, 92, 124}, {3})));
  EXPECT_TRUE(all_close(sum(transposed, {1}), transpose(sum(cube, {1}), 0, 1)));
}

TEST(Sum, IntegersAndBoolsSumToInt64) {
  Tensor x = from_vector<int32_t>({1, 2, 3}, {3});
  EXPECT_EQ(sum(x).dtype(), DType::kInt64);
  EXPECT_EQ(sum(x).item<int64_t>(), 6);
  Tensor flags = from_vector<bool>({true, false, true, true}, {4});
  EXPECT_EQ(sum(flags).item<int64_t>(), 3);
}

TEST(Sum, OfAZeroDimTensorIsItsValue) {
  Tensor x = scalar_tensor(3.5, kF64);
  EXPECT_EQ(sum(x).sizes(), Shape{});
  EXPECT_DOUBLE_EQ(sum(x).item<double>(), 3.5);
  EXPECT_DOUBLE_EQ(sum(x, {0}).item<double>(), 3.5);
}

TEST(Sum, EmptyReductionIsZero) {
  EXPECT_EQ(sum(zeros({0, 3}), {0}).to_vector<float>(), (std::vector<float>{0, 0, 0}));
}

TEST(Sum, MillionFloat32ElementsStayAccurate) {
  const int64_t n = 1000000;
  Tensor x = full({n}, 0.1);  // 0.1f each
  double expected = static_cast<double>(n) * static_cast<double>(0.1f);
  EXPECT_NEAR(sum(x).item<float>(), expected, expected * 1e-7);
  manual_seed(4);
  Tensor noise = rand({n});
  double reference = 0;
  for (float v : noise.to_vector<float>()) reference += v;
  EXPECT_NEAR(sum(noise).item<float>(), reference, std::abs(reference) * 1e-7);
  EXPECT_NEAR(mean(noise).item<float>(), reference / n, 1e-7);
}

TEST(Sum, SameBitsForAnyThreadCount) {
  manual_seed(8);
  Tensor x = randn({3, 400000});
  int threads = get_num_threads();
  set_num_threads(1);
  Tensor one = sum(x, {1});
  Tensor all_one = sum(x);
  set_num_threads(std::max(threads, 2));
  Tensor many = sum(x, {1});
  Tensor all_many = sum(x);
  set_num_threads(threads);
  EXPECT_TRUE(bitwise_equal(one, many));
  EXPECT_TRUE(bitwise_equal(all_one, all_many));
}

TEST(Mean, AveragesOverDims) {
  Tensor x = tensor({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_FLOAT_EQ(mean(x).item<float>(), 3.5f);
  EXPECT_TRUE(all_close(mean(x, {0}), tensor({2.5, 3.5, 4.5}, {3})));
  EXPECT_TRUE(all_close(mean(x, {1}, true), tensor({2, 5}, {2, 1})));
}

TEST(Max, AlongADimGivesValuesAndFirstIndexOnTies) {
  Tensor x = tensor({1, 3, 3, 7, 2, 7}, {2, 3});
  EXPECT_TRUE(all_close(max(x, 1), tensor({3, 7}, {2})));
  EXPECT_TRUE(all_close(max(x, 0, true), tensor({7, 3, 7}, {1, 3})));
  EXPECT_TRUE(all_close(min(x, 1), tensor({1, 2}, {2})));
  Tensor indices = argmax(x, 1);
  EXPECT_EQ(indices.dtype(), DType::kInt64);
  EXPECT_EQ(indices.to_vector<int64_t>(), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(argmax(x, 0, true).sizes(), (Shape{1, 3}));
  EXPECT_EQ(argmax(x, 0).to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 1}));
}

// Long contiguous rows take a vectorised pass: the same value and first index as entry by entry,
// NaN winning, of +0 and -0 the first one.
TEST(Max, AlongLongContiguousRowsKeepsFirstIndexNanAndSignedZero) {
  constexpr int64_t kWidth = 1000;
  std::vector<float> values(4 * kWidth);
  for (int64_t i = 0; i < 4 * kWidth; ++i) values[i] = static_cast<float>((i * 37) % 101) - 200;
  values[0 * kWidth + 500] = 7.0f;  // row 0: a tie, the first wins
  values[0 * kWidth + 900] = 7.0f;
  values[1 * kWidth + 600] = std::numeric_limits<float>::quiet_NaN();  // row 1: NaN
  values[1 * kWidth + 700] = 50.0f;
  values[2 * kWidth + 10] = -0.0f;  // row 2: -0 before +0
  values[2 * kWidth + 20] = 0.0f;
  values[3 * kWidth + 999] = 3.0f;  // row 3: the last entry
  const Tensor x = from_vector(values, {4, kWidth});
  const std::vector<float> maxima = max(x, 1).to_vector<float>();
  const std::vector<int64_t> where = argmax(x, 1).to_vector<int64_t>();
  EXPECT_EQ(maxima[0], 7.0f);
  EXPECT_EQ(where[0], 500);
  EXPECT_TRUE(std::isnan(maxima[1]));
  EXPECT_EQ(where[1], 600);
  EXPECT_EQ(maxima[2], 0.0f);
  EXPECT_TRUE(std::signbit(maxima[2]));
  EXPECT_EQ(where[2], 10);
  EXPECT_EQ(maxima[3], 3.0f);
  EXPECT_EQ(where[3], 999);
  EXPECT_EQ(min(x, 1).to_vector<float>()[0], -200.0f);
}

// The row's pass goes chunk by chunk: a NaN in a chunk after the one holding the maximum still
// wins, a larger value in a later chunk replaces an earlier one, and of ties across chunks the
// first wins; min takes the same pass.
TEST(Max, AlongLongContiguousRowsAcrossChunks) {
  constexpr int64_t kWidth = 3000;
  std::vector<float> values(3 * kWidth, 0.5f);
  values[0 * kWidth + 100] = 9.0f;  // row 0: the maximum early, a NaN late
  values[0 * kWidth + 2900] = std::numeric_limits<float>::quiet_NaN();
  values[1 * kWidth + 10] = 4.0f;  // row 1: a larger value in a later chunk, then a tie
  values[1 * kWidth + 1500] = 6.0f;
  values[1 * kWidth + 2999] = 6.0f;
  values[2 * kWidth + 700] = -3.0f;  // row 2: the minimum in two chunks
  values[2 * kWidth + 2000] = -3.0f;
  const Tensor x = from_vector(values, {3, kWidth});
  const std::vector<float> maxima = max(x, 1).to_vector<float>();
  const std::vector<int64_t> where = argmax(x, 1).to_vector<int64_t>();
  EXPECT_TRUE(std::isnan(maxima[0]));
  EXPECT_EQ(where[0], 2900);
  EXPECT_EQ(maxima[1], 6.0f);
  EXPECT_EQ(where[1], 1500);
  EXPECT_EQ(maxima[2], 0.5f);
  EXPECT_EQ(where[2], 0);
  const std::vector<float> minima = min(x, 1).to_vector<float>();
  EXPECT_TRUE(std::isnan(minima[0]));
  EXPECT_EQ(minima[2], -3.0f);
}

TEST(Max, OverAllElements) {
  Tensor x = tensor({4, -1, 9, 2}, {2, 2});
  EXPECT_EQ(max(x).sizes(), Shape{});
  EXPECT_FLOAT_EQ(max(x).item<float>(), 9);
  EXPECT_FLOAT_EQ(min(x).item<float>(), -1);
  EXPECT_EQ(max(from_vector<int64_t>({3, 8, 1}, {3})).item<int64_t>(), 8);
}

TEST(Max, GradientRoutesToTheFirstWinnerAlongADim) {
  // torch.tensor([[1., 3., 3.]]).max(1).values.sum().backward() gives [[0, 1, 0]].
  Tensor x = tensor({1, 3, 3}, {1, 3}).set_requires_grad(true);
  sum(max(x, 1)).backward();
  EXPECT_TRUE(all_close(x.grad(), tensor({0, 1, 0}, {1, 3})));
}

TEST(Max, GradientOverAllIsSharedAmongTiesLikePyTorch) {
  // torch.tensor([1., 3., 3., 2.]).max().backward() gives [0, 0.5, 0.5, 0].
  Tensor x = tensor({1, 3, 3, 2}, {4}).set_requires_grad(true);
  max(x).backward();
  EXPECT_TRUE(all_close(x.grad(), tensor({0, 0.5, 0.5, 0}, {4})));
}

TEST(Var, UnbiasedAndBiasedLikePyTorch) {
  Tensor y = f64({1, 2, 3, -1, 0, 4}, {2, 3});
  // torch.var(y) = 3.5; torch.var(y, 1, unbiased=False) = [2/3, 14/3].
  EXPECT_DOUBLE_EQ(var(y).item<double>(), 3.5);
  EXPECT_TRUE(all_close(var(y, {1}, false), f64({2.0 / 3, 14.0 / 3}, {2})));
  EXPECT_TRUE(all_close(var(y, {1}, false, true), f64({2.0 / 3, 14.0 / 3}, {2, 1})));
  Tensor shifted = add(y, 1e8);
  EXPECT_NEAR(var(shifted).item<double>(), 3.5, 1e-6);
}

TEST(Softmax, MatchesPyTorch) {
  Tensor y = f64({1, 2, 3, -1, 0, 4}, {2, 3});
  // torch.softmax(y, 1) and torch.log_softmax(y, 0), torch 1.13.1, f64.
  Tensor expected_softmax = f64({0.09003057317038045, 0.2447284710547976, 0.6652409557748218,
                                 0.006573263185309083, 0.0178679818703045, 0.9755587549443865},
                                {2, 3});
  Tensor expected_log = f64({-0.1269280110429726, -0.1269280110429726, -1.3132616875182228,
                             -2.1269280110429727, -2.1269280110429727, -0.31326168751822286},
                            {2, 3});
  EXPECT_TRUE(all_close(softmax(y, 1), expected_softmax, 1e-12, 1e-15));
  EXPECT_TRUE(all_close(softmax(y, -1), expected_softmax, 1e-12, 1e-15));
  EXPECT_TRUE(all_close(log_softmax(y, 0), expected_log, 1e-12, 1e-15));
  EXPECT_TRUE(all_close(softmax(transpose(y, 0, 1), 0), transpose(expected_softmax, 0, 1)));
}

TEST(Softmax, IsStableForLargeInputs) {
  Tensor x = tensor({1000, 1001, 1002}, {3});
  Tensor expected = tensor({0.09003057f, 0.24472847f, 0.66524096f}, {3});
  EXPECT_TRUE(all_close(softmax(x, 0), expected));
  auto logs = log_softmax(x, 0).to_vector<float>();
  for (float v : logs) EXPECT_TRUE(std::isfinite(v));
  EXPECT_NEAR(logs[2], -0.40760596f, 1e-5);
}

// ---- gradients ----

TEST(ReduceGrad, SumAndMeanMatchFiniteDifferences) {
  manual_seed(31);
  Tensor x = transposed_leaf(3, 4);
  auto check = [&](const std::vector<int64_t>& dims, bool keepdim) {
    EXPECT_TRUE(
        gradcheck([&](const std::vector<Tensor>& in) { return sum(in[0], dims, keepdim); }, {x}));
    EXPECT_TRUE(
        gradcheck([&](const std::vector<Tensor>& in) { return mean(in[0], dims, keepdim); }, {x}));
  };
  check({}, false);
  check({0}, false);
  check({1}, true);
  check({-1, 0}, false);
  Tensor cube = transpose(randn({4, 3, 2}, kF64).set_requires_grad(true), 0, 2);
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return sum(in[0], {0, 2}); }, {cube}));
}

TEST(ReduceGrad, MaxMinAlongADimAndOverAllMatchFiniteDifferences) {
  manual_seed(32);
  Tensor x = transposed_leaf(3, 4);
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return max(in[0], 1); }, {x}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return min(in[0], 0, true); }, {x}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return max(in[0]); }, {x}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return min(in[0]); }, {x}));
}

TEST(ReduceGrad, VarMatchesFiniteDifferences) {
  manual_seed(33);
  Tensor x = transposed_leaf(3, 4);
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return var(in[0]); }, {x}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return var(in[0], {1}, false); }, {x}));
  EXPECT_TRUE(
      gradcheck([](const std::vector<Tensor>& in) { return var(in[0], {0}, true, true); }, {x}));
}

TEST(ReduceGrad, SoftmaxAndLogSoftmaxMatchFiniteDifferences) {
  manual_seed(34);
  Tensor x = transposed_leaf(3, 4);
  for (int64_t dim : {0, 1, -1}) {
    EXPECT_TRUE(
        gradcheck([dim](const std::vector<Tensor>& in) { return softmax(in[0], dim); }, {x}));
    EXPECT_TRUE(
        gradcheck([dim](const std::vector<Tensor>& in) { return log_softmax(in[0], dim); }, {x}));
  }
}

// ---- bad input ----

TEST(ReduceErrors, BadDimsAreNamed) {
  Tensor x = zeros({2, 3});
  EXPECT_TRUE(throws_error([&] { sum(x, {2}); }, "sum: dim 2 is out of range for a 2-d tensor"));
  EXPECT_TRUE(throws_error([&] { sum(x, {1, -1}); }, "appears twice"));
  EXPECT_TRUE(throws_error([&] { max(x, -3); }, "max: dim -3 is out of range"));
  EXPECT_TRUE(throws_error([&] { softmax(x, 5); }, "softmax: dim 5"));
  EXPECT_TRUE(throws_error([&] { argmax(x, 2); }, "argmax: dim 2"));
}

TEST(ReduceErrors, WrongDtypesAreRefused) {
  Tensor integers = from_vector<int64_t>({1, 2}, {2});
  EXPECT_TRUE(throws_error([&] { mean(integers); }, "mean: expected a f32 or f64 tensor, got i64"));
  EXPECT_TRUE(throws_error([&] { softmax(integers, 0); }, "softmax: expected a f32 or f64"));
  EXPECT_TRUE(throws_error([&] { var(integers); }, "var: expected a f32 or f64"));
}

TEST(ReduceErrors, EmptyMaxIsRefused) {
  EXPECT_TRUE(throws_error([] { max(zeros({0})); }, "cannot reduce over zero elements"));
  EXPECT_TRUE(throws_error([] { max(zeros({2, 0}), 1); }, "cannot reduce over zero elements"));
}

TEST(ReduceErrors, MetaTensorsGiveShapesOnly) {
  Tensor x = zeros({5, 6, 7}, TensorOptions().device(Device::meta()));
  EXPECT_EQ(sum(x, {1}).sizes(), (Shape{5, 7}));
  EXPECT_EQ(softmax(x, 2).sizes(), (Shape{5, 6, 7}));
  EXPECT_EQ(max(x, 0, true).sizes(), (Shape{1, 6, 7}));
}

}  // namespace
}  // namespace tessel
