// Creation, random, copy and conversion ops: values, dtypes, RNG replay and bad input.
#include "ops/factory.h"

#include <cmath>

#include "core/autograd.h"
#include "core/op.h"
#include "core/rng.h"
#include "ops/ops.h"
#include "tests/testing.h"

namespace tessel {
namespace {

using testing::all_close;
using testing::bitwise_equal;
using testing::kF64;
using testing::throws_error;

TEST(Full, FillsShapeDtypeAndValue) {
  Tensor x = full({2, 3}, 2.5, kF64);
  EXPECT_EQ(x.sizes(), (Shape{2, 3}));
  EXPECT_EQ(x.dtype(), kF64);
  EXPECT_EQ(x.to_vector<double>(), std::vector<double>(6, 2.5));
  EXPECT_EQ(full({3}, 7, DType::kInt32).to_vector<int32_t>(), (std::vector<int32_t>{7, 7, 7}));
  EXPECT_EQ(full({}, 1, DType::kBool).item<bool>(), true);
}

TEST(Full, ZerosOnesAndLikeKeepDtype) {
  Tensor like = full({2, 2}, 3.0, DType::kInt64);
  EXPECT_EQ(zeros_like(like).dtype(), DType::kInt64);
  EXPECT_EQ(ones_like(like).to_vector<int64_t>(), (std::vector<int64_t>{1, 1, 1, 1}));
  EXPECT_EQ(full_like(like, 9).to_vector<int64_t>(), (std::vector<int64_t>{9, 9, 9, 9}));
  EXPECT_EQ(zeros({3}).to_vector<float>(), (std::vector<float>{0, 0, 0}));
  EXPECT_EQ(ones({2}, kF64).to_vector<double>(), (std::vector<double>{1, 1}));
}

TEST(Full, RequiresGradFromOptions) {
  Tensor x = zeros({2}, TensorOptions(kF64).requires_grad(true));
  EXPECT_TRUE(x.requires_grad());
  EXPECT_TRUE(x.is_leaf());
}

TEST(Full, MetaDeviceGivesShapeWithoutData) {
  Tensor x = full({4, 5}, 1.0, TensorOptions().device(Device::meta()));
  EXPECT_TRUE(x.device().is_meta());
  EXPECT_EQ(x.sizes(), (Shape{4, 5}));
}

TEST(Full, EngineAttributeFormWorks) {
  // The autograd engine builds its seed gradient with exactly these attributes.
  Tensor x = dispatch(ops::full, {},
                      Attrs{{"shape", std::vector<int64_t>{2}},
                            {"value", 1.0},
                            {"dtype", std::string("f64")},
                            {"device", std::string("cpu")}})[0];
  EXPECT_EQ(x.to_vector<double>(), (std::vector<double>{1, 1}));
}

TEST(Full, RejectsNegativeSizeAndUnknownDtype) {
  EXPECT_TRUE(throws_error([] { full({2, -1}, 0.0); }, "negative size"));
  EXPECT_TRUE(throws_error(
      [] {
        (void)dispatch(
            ops::full, {},
            Attrs{
                {"shape", std::vector<int64_t>{2}}, {"value", 1.0}, {"dtype", std::string("f17")}});
      },
      "unknown dtype name 'f17'"));
}

TEST(Arange, EndFormIsInt64FromZero) {
  Tensor x = arange(5);
  EXPECT_EQ(x.dtype(), DType::kInt64);
  EXPECT_EQ(x.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(arange(0).numel(), 0);
}

TEST(Arange, StartEndStepLengthLikePyTorch) {
  // torch.arange(0, 1, 0.3) -> [0.0, 0.3, 0.6, 0.9]
  Tensor x = arange(0.0, 1.0, 0.3);
  EXPECT_EQ(x.dtype(), DType::kFloat32);
  EXPECT_TRUE(all_close(x, tensor({0.0f, 0.3f, 0.6f, 0.9f}, {4})));
  EXPECT_EQ(arange(5.0, 1.0, -2.0, kF64).to_vector<double>(), (std::vector<double>{5, 3}));
  EXPECT_EQ(arange(3.0, 1.0).numel(), 0);
}

TEST(Arange, RejectsZeroStep) {
  EXPECT_TRUE(throws_error([] { arange(0.0, 1.0, 0.0); }, "arange: step"));
}

TEST(Rand, UniformInUnitIntervalAndReproducibleFromSeed) {
  manual_seed(123);
  Tensor first = rand({1000});
  manual_seed(123);
  Tensor second = rand({1000});
  EXPECT_TRUE(bitwise_equal(first, second));
  for (float value : first.to_vector<float>()) {
    EXPECT_GE(value, 0.0f);
    EXPECT_LT(value, 1.0f);
  }
  manual_seed(124);
  EXPECT_FALSE(bitwise_equal(rand({1000}), first));
}

TEST(Rand, ReplaysEqualFromSavedRngState) {
  manual_seed(7);
  rand({3});
  RngState saved = get_rng_state();
  Tensor a = randn({5, 3}, kF64);
  Tensor b = rand({10});
  set_rng_state(saved);
  EXPECT_TRUE(bitwise_equal(randn({5, 3}, kF64), a));
  EXPECT_TRUE(bitwise_equal(rand({10}), b));
}

TEST(Rand, ConsumesOneCounterPerFourNumbers) {
  manual_seed(1);
  RngState before = get_rng_state();
  rand({9});
  EXPECT_EQ(get_rng_state().offset, before.offset + 3);
  randn({4});
  EXPECT_EQ(get_rng_state().offset, before.offset + 4);
}

TEST(Rand, ElementDependsOnlyOnSeedOffsetAndIndex) {
  manual_seed(99);
  RngState saved = get_rng_state();
  Tensor small = rand({10});
  set_rng_state(saved);
  Tensor big = rand({4, 5});
  auto small_values = small.to_vector<float>();
  auto big_values = big.to_vector<float>();
  for (size_t i = 0; i < small_values.size(); ++i) EXPECT_EQ(small_values[i], big_values[i]);
  EXPECT_EQ(small_values[3], uniform_at(saved, 3));
}

TEST(Rand, ValuesAreTheRngFunctionsAtEachIndex) {
  manual_seed(42);
  rand({1});  // an offset that is not zero
  RngState saved = get_rng_state();
  auto uniform = rand({2, 7}, kF64).to_vector<double>();
  RngState after_uniform = get_rng_state();
  auto normal = randn({13}, kF64).to_vector<double>();
  auto integers = randint(0, 1000, {11}).to_vector<int64_t>();
  for (size_t i = 0; i < uniform.size(); ++i) EXPECT_EQ(uniform[i], uniform_at(saved, i));
  for (size_t i = 0; i < normal.size(); ++i) EXPECT_EQ(normal[i], normal_at(after_uniform, i));
  RngState after_normal{after_uniform.seed, after_uniform.offset + 4};
  for (size_t i = 0; i < integers.size(); ++i)
    EXPECT_EQ(integers[i], static_cast<int64_t>(random_bits(after_normal, i) % 1000));
}

TEST(Rand, RecordedSeedAndOffsetReplayBitwise) {
  // A recompute re-dispatches the op with the rng attributes recorded the first time.
  Attrs attrs{{"shape", std::vector<int64_t>{3, 5}},
              {"dtype", std::string("f32")},
              {"rng_seed", int64_t{17}},
              {"rng_offset", int64_t{40}}};
  RngState before = get_rng_state();
  Tensor first = dispatch(ops::randn, {}, attrs)[0];
  Tensor second = dispatch(ops::randn, {}, attrs)[0];
  EXPECT_TRUE(bitwise_equal(first, second));
  EXPECT_EQ(get_rng_state(), before);  // nothing reserved when the state is given
}

TEST(Randn, HasStandardNormalMoments) {
  manual_seed(5);
  auto values = randn({20000}, kF64).to_vector<double>();
  double mean = 0, square = 0;
  for (double v : values) mean += v, square += v * v;
  mean /= values.size();
  double variance = square / values.size() - mean * mean;
  EXPECT_NEAR(mean, 0.0, 0.03);
  EXPECT_NEAR(variance, 1.0, 0.05);
}

TEST(Randint, StaysInRange) {
  manual_seed(3);
  Tensor x = randint(-2, 3, {500});
  EXPECT_EQ(x.dtype(), DType::kInt64);
  std::vector<int> counts(5, 0);
  for (int64_t v : x.to_vector<int64_t>()) {
    ASSERT_GE(v, -2);
    ASSERT_LT(v, 3);
    ++counts[v + 2];
  }
  for (int count : counts) EXPECT_GT(count, 50);
  EXPECT_TRUE(throws_error([] { randint(3, 3, {2}); }, "randint: expected low < high"));
}

TEST(Rand, RejectsIntegerDtype) {
  EXPECT_TRUE(throws_error([] { rand({2}, DType::kInt64); }, "rand: expected a floating dtype"));
}

TEST(Initialisers, UniformAndNormalWriteInPlaceIntoParameters) {
  manual_seed(11);
  Tensor weight = zeros({100, 10}, TensorOptions(DType::kFloat32).requires_grad(true));
  uniform_(weight, -0.5, 0.25);
  for (float v : weight.to_vector<float>()) {
    ASSERT_GE(v, -0.5f);
    ASSERT_LT(v, 0.25f);
  }
  EXPECT_TRUE(weight.requires_grad());
  EXPECT_TRUE(weight.is_leaf());
  normal_(weight, 3.0, 0.01);
  for (float v : weight.to_vector<float>()) EXPECT_NEAR(v, 3.0f, 0.1f);
}

TEST(Initialisers, UniformOnAStridedViewWritesOnlyTheView) {
  Tensor base = zeros({4, 6}, kF64);
  Tensor columns = narrow(base, 1, 2, 3);
  uniform_(columns, 1.0, 2.0);
  auto values = base.to_vector<double>();
  for (int64_t row = 0; row < 4; ++row) {
    for (int64_t col = 0; col < 6; ++col) {
      double v = values[row * 6 + col];
      if (col >= 2 && col < 5) {
        EXPECT_GE(v, 1.0);
      } else {
        EXPECT_EQ(v, 0.0);
      }
    }
  }
}

TEST(Initialisers, ElementIndexIsTheViewsRowMajorIndex) {
  Tensor base = zeros({50, 40});
  Tensor view = transpose(base, 0, 1);  // [40, 50], walked in tiles
  manual_seed(12);
  RngState saved = get_rng_state();
  uniform_(view, 0.0, 1.0);
  auto values = view.to_vector<float>();
  for (size_t i = 0; i < values.size(); ++i) ASSERT_EQ(values[i], uniform_at(saved, i)) << i;
}

TEST(Clone, CopiesAStridedInputIntoRowMajor) {
  Tensor x = tensor({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor copy = clone(transpose(x, 0, 1));
  EXPECT_TRUE(copy.is_contiguous());
  EXPECT_EQ(copy.sizes(), (Shape{3, 2}));
  EXPECT_EQ(copy.to_vector<float>(), (std::vector<float>{1, 4, 2, 5, 3, 6}));
  EXPECT_NE(copy.storage(), x.storage());
}

TEST(Clone, GradientPassesThrough) {
  Tensor x = randn({3, 4}, kF64).set_requires_grad(true);
  EXPECT_TRUE(testing::gradcheck([](const std::vector<Tensor>& in) { return clone(in[0]); },
                                 {transpose(x, 0, 1)}));
  EXPECT_TRUE(testing::gradcheck([](const std::vector<Tensor>& in) { return contiguous(in[0]); },
                                 {transpose(x, 0, 1)}));
}

TEST(Contiguous, ReturnsTheSameTensorWhenAlreadyContiguous) {
  Tensor x = zeros({2, 3});
  EXPECT_TRUE(contiguous(x).is_same(x));
  Tensor t = transpose(x, 0, 1);
  Tensor c = contiguous(t);
  EXPECT_FALSE(c.is_same(t));
  EXPECT_TRUE(c.is_contiguous());
}

TEST(ToDtype, ConvertsBetweenAllEightDtypesBothWays) {
  const DType all[] = {DType::kFloat32, DType::kFloat64, DType::kBFloat16, DType::kFloat16,
                       DType::kInt32,   DType::kInt64,   DType::kUInt8,    DType::kBool};
  std::vector<double> values{0, 1, 1, 0, 1};
  for (DType from : all) {
    Tensor source = from_vector<double>(values, {5}, from);
    for (DType to : all) {
      Tensor converted = to_dtype(source, to);
      EXPECT_EQ(converted.dtype(), to);
      EXPECT_EQ(converted.to_vector<double>(), values)
          << dtype_name(from) << " -> " << dtype_name(to);
      EXPECT_EQ(to_dtype(converted, from).to_vector<double>(), values);
    }
  }
}

TEST(ToDtype, FloatToIntegerTruncatesTowardZeroAndNonZeroIsTrue) {
  Tensor x = tensor({2.7f, -2.7f, 0.0f, 0.25f}, {4});
  EXPECT_EQ(to_dtype(x, DType::kInt32).to_vector<int32_t>(), (std::vector<int32_t>{2, -2, 0, 0}));
  EXPECT_EQ(to_dtype(x, DType::kBool).to_vector<bool>(),
            (std::vector<bool>{true, true, false, true}));
  Tensor strided = transpose(tensor({1, 2, 3, 4, 5, 6}, {2, 3}), 0, 1);
  EXPECT_EQ(to_dtype(strided, DType::kInt64).to_vector<int64_t>(),
            (std::vector<int64_t>{1, 4, 2, 5, 3, 6}));
}

TEST(ToDtype, BackwardCastsTheGradientBack) {
  Tensor x = tensor({1, 2, 3}, {3}).set_requires_grad(true);
  Tensor y = to_dtype(x, kF64);
  sum(mul(y, y)).backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_EQ(x.grad().dtype(), DType::kFloat32);
  EXPECT_TRUE(all_close(x.grad(), tensor({2, 4, 6}, {3})));
  EXPECT_TRUE(to_dtype(x, DType::kFloat32).is_same(x));
}

TEST(Fill, FillsOnlyTheViewInPlace) {
  Tensor base = zeros({3, 4}, DType::kInt32);
  Tensor column = select(base, 1, 2);
  column.fill_(5);
  EXPECT_EQ(base.to_vector<int32_t>(), (std::vector<int32_t>{0, 0, 5, 0, 0, 0, 5, 0, 0, 0, 5, 0}));
  uint64_t version = base.version();
  base.zero_();
  EXPECT_GT(base.version(), version);
  EXPECT_EQ(base.to_vector<int32_t>(), std::vector<int32_t>(12, 0));
}

TEST(Copy, BroadcastsAndConvertsTheSource) {
  Tensor dest = zeros({2, 3}, kF64);
  dest.copy_(from_vector<int32_t>({1, 2, 3}, {3}));
  EXPECT_EQ(dest.to_vector<double>(), (std::vector<double>{1, 2, 3, 1, 2, 3}));
}

TEST(Copy, OverlappingSourceReadsValuesFromBeforeTheCall) {
  Tensor x = tensor({1, 2, 3, 4}, {2, 2});
  x.copy_(transpose(x, 0, 1));
  EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{1, 3, 2, 4}));
}

TEST(Copy, RejectsUnbroadcastableShapesNamingBoth) {
  Tensor dest = zeros({2, 3});
  EXPECT_TRUE(throws_error([&] { dest.copy_(zeros({4})); }, "[4]"));
  EXPECT_TRUE(throws_error([&] { dest.copy_(zeros({4})); }, "[2, 3]"));
}

}  // namespace
}  // namespace tessel
