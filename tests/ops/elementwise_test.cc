// Element-wise ops: values, broadcasting, type promotion, gradients (f64 finite differences on
// broadcast and non-contiguous inputs) and bad input.
#include "ops/elementwise.h"

#include <cmath>
#include <limits>

#include "core/autograd.h"
#include "core/op.h"
#include "core/rng.h"
#include "ops/ops.h"
#include "tests/testing.h"

namespace tessel {
namespace {

using testing::all_close;
using testing::gradcheck;
using testing::kF64;
using testing::throws_error;

Tensor f64(const std::vector<double>& values, const Shape& sizes) {
  return from_vector<double>(values, sizes, kF64);
}

// A [rows, cols] f64 tensor that requires grad and is a transposed (non-contiguous) view.
Tensor transposed_leaf(int64_t rows, int64_t cols) {
  Tensor base = randn({cols, rows}, kF64).set_requires_grad(true);
  return transpose(base, 0, 1);
}

Tensor positive_leaf(const Shape& sizes) {
  return add(rand(sizes, kF64), 0.5).detach().set_requires_grad(true);
}

TEST(Add, BroadcastsLikePyTorch) {
  Tensor a = tensor({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = tensor({10, 20, 30}, {3});
  EXPECT_TRUE(all_close(add(a, b), tensor({11, 22, 33, 14, 25, 36}, {2, 3})));
  Tensor column = tensor({100, 200}, {2, 1});
  EXPECT_TRUE(all_close(add(b, column), tensor({110, 120, 130, 210, 220, 230}, {2, 3})));
  EXPECT_TRUE(all_close(add(a, b, 2.0), tensor({21, 42, 63, 24, 45, 66}, {2, 3})));
  EXPECT_TRUE(all_close(a + b, add(a, b)));
}

TEST(Binary, ValuesMatchHandComputedResults) {
  Tensor a = tensor({1, -2, 3, 4}, {4});
  Tensor b = tensor({2, 2, -1, 0.5}, {4});
  EXPECT_TRUE(all_close(sub(a, b), tensor({-1, -4, 4, 3.5}, {4})));
  EXPECT_TRUE(all_close(sub(a, b, 2.0), tensor({-3, -6, 5, 3}, {4})));
  EXPECT_TRUE(all_close(mul(a, b), tensor({2, -4, -3, 2}, {4})));
  EXPECT_TRUE(all_close(div(a, b), tensor({0.5, -1, -3, 8}, {4})));
  EXPECT_TRUE(
      all_close(pow(tensor({2, 3, 4}, {3}), tensor({3, 2, 0.5}, {3})), tensor({8, 9, 2}, {3})));
  EXPECT_TRUE(all_close(maximum(a, b), tensor({2, 2, 3, 4}, {4})));
  EXPECT_TRUE(all_close(minimum(a, b), tensor({1, -2, -1, 0.5}, {4})));
  EXPECT_TRUE(all_close(a - b, sub(a, b)));
  EXPECT_TRUE(all_close(a * b, mul(a, b)));
  EXPECT_TRUE(all_close(a / b, div(a, b)));
}

TEST(Binary, MaximumAndMinimumPropagateNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor a = tensor({nan, 1}, {2});
  Tensor b = tensor({0, nan}, {2});
  for (float v : maximum(a, b).to_vector<float>()) EXPECT_TRUE(std::isnan(v));
  for (float v : minimum(b, a).to_vector<float>()) EXPECT_TRUE(std::isnan(v));
}

TEST(Binary, TypePromotionFollowsPyTorch) {
  Tensor i64 = from_vector<int64_t>({1, 2}, {2});
  Tensor i32 = from_vector<int32_t>({3, 4}, {2});
  Tensor u8 = from_vector<uint8_t>({5, 6}, {2});
  Tensor flag = from_vector<bool>({true, false}, {2});
  Tensor f32 = tensor({0.5, 0.25}, {2});
  Tensor d = f64({1, 2}, {2});
  EXPECT_EQ(add(i64, f32).dtype(), DType::kFloat32);
  EXPECT_TRUE(all_close(add(i64, f32), tensor({1.5, 2.25}, {2})));
  EXPECT_EQ(add(i32, i64).dtype(), DType::kInt64);
  EXPECT_EQ(add(i32, i64).to_vector<int64_t>(), (std::vector<int64_t>{4, 6}));
  EXPECT_EQ(mul(f32, d).dtype(), kF64);
  EXPECT_EQ(add(u8, flag).dtype(), DType::kUInt8);
  EXPECT_EQ(add(u8, flag).to_vector<int64_t>(), (std::vector<int64_t>{6, 6}));
  EXPECT_EQ(mul(f32, flag).dtype(), DType::kFloat32);
  EXPECT_EQ(mul(flag, flag).dtype(), DType::kBool);
  // True division: integers divide to f32.
  Tensor quotient = div(from_vector<int64_t>({7, -3}, {2}), from_vector<int64_t>({2, 2}, {2}));
  EXPECT_EQ(quotient.dtype(), DType::kFloat32);
  EXPECT_TRUE(all_close(quotient, tensor({3.5, -1.5}, {2})));
  EXPECT_EQ(lt(i64, f32).dtype(), DType::kBool);
}

TEST(Scalar, FormsKeepTheTensorDtype) {
  Tensor i64 = from_vector<int64_t>({1, 2, 3}, {3});
  EXPECT_EQ(mul(i64, 2.0).dtype(), DType::kInt64);
  EXPECT_EQ(mul(i64, 2.0).to_vector<int64_t>(), (std::vector<int64_t>{2, 4, 6}));
  Tensor x = tensor({1, 2, 4}, {3});
  EXPECT_EQ(add(x, 1.0).dtype(), DType::kFloat32);
  EXPECT_TRUE(all_close(add(x, 1.0), tensor({2, 3, 5}, {3})));
  EXPECT_TRUE(all_close(sub(x, 1.0), tensor({0, 1, 3}, {3})));
  EXPECT_TRUE(all_close(div(x, 4.0), tensor({0.25, 0.5, 1}, {3})));
  EXPECT_TRUE(all_close(pow(x, 2.0), tensor({1, 4, 16}, {3})));
  EXPECT_TRUE(all_close(pow(x, 0.5), tensor({1, std::sqrt(2.0f), 2}, {3})));
  EXPECT_TRUE(all_close(x * 3.0, tensor({3, 6, 12}, {3})));
  EXPECT_TRUE(all_close(3.0 * x, tensor({3, 6, 12}, {3})));
  EXPECT_TRUE(all_close(x + 1.0, add(x, 1.0)));
  EXPECT_TRUE(all_close(x - 1.0, sub(x, 1.0)));
  EXPECT_TRUE(all_close(x / 2.0, div(x, 2.0)));
  EXPECT_TRUE(all_close(-x, tensor({-1, -2, -4}, {3})));
}

TEST(Unary, ValuesMatchTheMathLibrary) {
  std::vector<double> values{-2.0, -0.5, 0.25, 1.5};
  Tensor x = f64(values, {4});
  auto expect = [&](const Tensor& result, double (*fn)(double)) {
    auto got = result.to_vector<double>();
    for (size_t i = 0; i < values.size(); ++i) EXPECT_NEAR(got[i], fn(values[i]), 1e-12);
  };
  expect(neg(x), [](double v) { return -v; });
  expect(abs(x), [](double v) { return std::abs(v); });
  expect(exp(x), [](double v) { return std::exp(v); });
  expect(tanh(x), [](double v) { return std::tanh(v); });
  expect(sigmoid(x), [](double v) { return 1 / (1 + std::exp(-v)); });
  expect(relu(x), [](double v) { return v > 0 ? v : 0.0; });
  Tensor positive = f64({0.25, 1, 4}, {3});
  EXPECT_TRUE(all_close(log(positive), f64({std::log(0.25), 0, std::log(4.0)}, {3})));
  EXPECT_TRUE(all_close(sqrt(positive), f64({0.5, 1, 2}, {3})));
  EXPECT_TRUE(all_close(rsqrt(positive), f64({2, 1, 0.5}, {3})));
  EXPECT_EQ(abs(from_vector<int64_t>({-3, 4}, {2})).to_vector<int64_t>(),
            (std::vector<int64_t>{3, 4}));
}

TEST(Gelu, MatchesPyTorchInBothForms) {
  Tensor x = f64({-3.0, -1.0, -0.5, 0.0, 0.5, 1.0, 3.0}, {7});
  // torch.nn.functional.gelu(x) and gelu(x, approximate='tanh'), torch 1.13.1, f64.
  Tensor exact = f64({-0.00404969409489031, -0.15865525393145702, -0.15426876936299344, 0.0,
                      0.34573123063700656, 0.841344746068543, 2.99595030590511},
                     {7});
  Tensor approximate = f64({-0.0036373920817729943, -0.15880800939172324, -0.15428599017485606, 0.0,
                            0.34571400982514394, 0.8411919906082768, 2.996362607918227},
                           {7});
  EXPECT_TRUE(all_close(gelu(x), exact, 1e-12, 1e-14));
  EXPECT_TRUE(all_close(gelu(x, "tanh"), approximate, 1e-12, 1e-14));
  EXPECT_TRUE(throws_error([&] { gelu(x, "fast"); }, "approximate must be"));
}

TEST(Clamp, LimitsValuesAndAcceptsInfiniteBounds) {
  Tensor x = tensor({-3, -1, 0, 2, 5}, {5});
  EXPECT_TRUE(all_close(clamp(x, -1, 2), tensor({-1, -1, 0, 2, 2}, {5})));
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_TRUE(all_close(clamp(x, 0, inf), tensor({0, 0, 0, 2, 5}, {5})));
  EXPECT_TRUE(all_close(clamp(x, -inf, 0), tensor({-3, -1, 0, 0, 0}, {5})));
  EXPECT_EQ(clamp(from_vector<int64_t>({-5, 5}, {2}), -2, inf).to_vector<int64_t>(),
            (std::vector<int64_t>{-2, 5}));
}

TEST(Clamp, GradientPassesAtTheBoundsLikePyTorch) {
  // torch.clamp(tensor([-2., 0., 2.]), -2, 2).sum().backward() gives grad [1, 1, 1].
  Tensor x = tensor({-2, 0, 2, 3}, {4}).set_requires_grad(true);
  sum(clamp(x, -2, 2)).backward();
  EXPECT_TRUE(all_close(x.grad(), tensor({1, 1, 1, 0}, {4})));
}

TEST(Where, SelectsWithBoolOrByteCondition) {
  Tensor a = tensor({1, 2, 3}, {3});
  Tensor b = tensor({-1, -2, -3}, {3});
  Tensor condition = from_vector<bool>({true, false, true}, {3});
  EXPECT_TRUE(all_close(where(condition, a, b), tensor({1, -2, 3}, {3})));
  Tensor byte_condition = from_vector<uint8_t>({0, 1, 0}, {3});
  EXPECT_TRUE(all_close(where(byte_condition, a, b), tensor({-1, 2, -3}, {3})));
  // Broadcast condition [2, 1] against [3].
  Tensor rows = from_vector<bool>({true, false}, {2, 1});
  EXPECT_TRUE(all_close(where(rows, a, b), tensor({1, 2, 3, -1, -2, -3}, {2, 3})));
}

TEST(MaskedFill, FillsWhereTheMaskIsSet) {
  Tensor x = tensor({1, 2, 3, 4}, {2, 2});
  Tensor mask = from_vector<bool>({false, true}, {2});
  EXPECT_TRUE(all_close(masked_fill(x, mask, -9), tensor({1, -9, 3, -9}, {2, 2})));
}

TEST(Compare, ReturnsBoolWithBroadcasting) {
  Tensor a = tensor({1, 2, 3}, {3});
  Tensor b = tensor({2}, {1});
  auto as_bools = [](const Tensor& t) {
    EXPECT_EQ(t.dtype(), DType::kBool);
    return t.to_vector<bool>();
  };
  EXPECT_EQ(as_bools(eq(a, b)), (std::vector<bool>{false, true, false}));
  EXPECT_EQ(as_bools(ne(a, b)), (std::vector<bool>{true, false, true}));
  EXPECT_EQ(as_bools(lt(a, b)), (std::vector<bool>{true, false, false}));
  EXPECT_EQ(as_bools(le(a, b)), (std::vector<bool>{true, true, false}));
  EXPECT_EQ(as_bools(gt(a, b)), (std::vector<bool>{false, false, true}));
  EXPECT_EQ(as_bools(ge(a, b)), (std::vector<bool>{false, true, true}));
  EXPECT_EQ(as_bools(eq(from_vector<int64_t>({2}, {1}), a)),
            (std::vector<bool>{false, true, false}));
}

TEST(Compare, IsNotDifferentiable) {
  Tensor a = randn({3}, kF64).set_requires_grad(true);
  EXPECT_FALSE(gt(a, zeros({3}, kF64)).requires_grad());
}

TEST(Elementwise, LargeStridedBroadcastMatchesScalarLoop) {
  manual_seed(2);
  Tensor a = transpose(randn({700, 300}), 0, 1);  // [300, 700], non-contiguous
  Tensor b = randn({700});
  Tensor result = mul(a, b);
  auto av = a.to_vector<float>(), bv = b.to_vector<float>(), rv = result.to_vector<float>();
  for (int64_t i = 0; i < 300; ++i)
    for (int64_t j = 0; j < 700; ++j) ASSERT_EQ(rv[i * 700 + j], av[i * 700 + j] * bv[j]);
}

TEST(Elementwise, TransposedThreeDimInputsWalkedInTilesMatchScalarLoop) {
  manual_seed(3);
  Tensor a = transpose(randn({3, 50, 40}, kF64), 1, 2);  // [3, 40, 50]
  Tensor b = randn({40, 1}, kF64);
  Tensor c = randn({3, 40, 50}, kF64);
  Tensor result = where(gt(c, zeros({}, kF64)), sub(a, b), c);
  auto av = a.to_vector<double>(), bv = b.to_vector<double>(), cv = c.to_vector<double>();
  auto rv = result.to_vector<double>();
  for (int64_t n = 0; n < 3; ++n)
    for (int64_t i = 0; i < 40; ++i)
      for (int64_t j = 0; j < 50; ++j) {
        int64_t at = (n * 40 + i) * 50 + j;
        double expected = cv[at] > 0 ? av[at] - bv[i] : cv[at];
        ASSERT_EQ(rv[at], expected) << n << " " << i << " " << j;
      }
}

TEST(Elementwise, WritesIntoAStridedOutView) {
  Tensor base = zeros({3, 4}, kF64);
  Tensor middle = narrow(base, 1, 1, 2);  // [3, 2], row stride 4
  Tensor a = f64({1, 2, 3, 4, 5, 6}, {3, 2});
  Tensor b = f64({10, 20}, {2});
  dispatch(ops::add, {a, b}, {}, {middle});
  EXPECT_EQ(base.to_vector<double>(),
            (std::vector<double>{0, 11, 22, 0, 0, 13, 24, 0, 0, 15, 26, 0}));
}

TEST(Elementwise, InPlaceAddAccumulates) {
  Tensor x = f64({1, 2}, {2});
  x.add_(f64({3, 4}, {2}), 0.5);
  EXPECT_EQ(x.to_vector<double>(), (std::vector<double>{2.5, 4}));
  x.mul_(2.0);
  EXPECT_EQ(x.to_vector<double>(), (std::vector<double>{5, 8}));
}

// ---- gradients ----

TEST(BinaryGrad, MatchesFiniteDifferencesWithBroadcastAndTransposedInputs) {
  manual_seed(21);
  auto check = [](const char* name, Tensor (*fn)(const Tensor&, const Tensor&)) {
    Tensor a = transposed_leaf(2, 3);
    Tensor b = randn({3}, kF64).set_requires_grad(true);
    EXPECT_TRUE(gradcheck([fn](const std::vector<Tensor>& in) { return fn(in[0], in[1]); }, {a, b}))
        << name;
    Tensor column = randn({2, 1}, kF64).set_requires_grad(true);
    EXPECT_TRUE(
        gradcheck([fn](const std::vector<Tensor>& in) { return fn(in[0], in[1]); }, {column, b}))
        << name << " (both broadcast)";
  };
  check("add", [](const Tensor& a, const Tensor& b) { return add(a, b); });
  check("add alpha", [](const Tensor& a, const Tensor& b) { return add(a, b, -1.5); });
  check("sub", [](const Tensor& a, const Tensor& b) { return sub(a, b); });
  check("sub alpha", [](const Tensor& a, const Tensor& b) { return sub(a, b, 2.0); });
  check("mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); });
  check("maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); });
  check("minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); });
}

TEST(BinaryGrad, DivAndPowMatchFiniteDifferences) {
  manual_seed(22);
  Tensor a = transposed_leaf(2, 3);
  Tensor positive = positive_leaf({3});
  EXPECT_TRUE(
      gradcheck([](const std::vector<Tensor>& in) { return div(in[0], in[1]); }, {a, positive}));
  Tensor base = transpose(positive_leaf({3, 2}), 0, 1);
  Tensor exponent = randn({3}, kF64).set_requires_grad(true);
  EXPECT_TRUE(
      gradcheck([](const std::vector<Tensor>& in) { return pow(in[0], in[1]); }, {base, exponent}));
}

TEST(BinaryGrad, MaximumSplitsTiesLikePyTorch) {
  // torch.maximum([1, 2], [1, 1]).sum().backward(): a.grad [0.5, 1], b.grad [0.5, 0].
  Tensor a = tensor({1, 2}, {2}).set_requires_grad(true);
  Tensor b = tensor({1, 1}, {2}).set_requires_grad(true);
  sum(maximum(a, b)).backward();
  EXPECT_TRUE(all_close(a.grad(), tensor({0.5, 1}, {2})));
  EXPECT_TRUE(all_close(b.grad(), tensor({0.5, 0}, {2})));
}

TEST(BinaryGrad, MixedDtypesGiveEachInputItsOwnDtype) {
  Tensor a = tensor({1, 2}, {2}).set_requires_grad(true);
  Tensor b = f64({3, 4}, {2}).set_requires_grad(true);
  sum(mul(a, b)).backward();
  EXPECT_EQ(a.grad().dtype(), DType::kFloat32);
  EXPECT_EQ(b.grad().dtype(), kF64);
  EXPECT_TRUE(all_close(a.grad(), tensor({3, 4}, {2})));
}

TEST(ScalarGrad, MatchesFiniteDifferences) {
  manual_seed(23);
  Tensor x = transposed_leaf(3, 2);
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return add(in[0], 2.5); }, {x}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return sub(in[0], 2.5); }, {x}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return mul(in[0], -3.0); }, {x}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return div(in[0], 4.0); }, {x}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return pow(in[0], 2.0); }, {x}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return pow(in[0], 3.0); }, {x}));
  Tensor positive = transpose(positive_leaf({2, 3}), 0, 1);
  EXPECT_TRUE(
      gradcheck([](const std::vector<Tensor>& in) { return pow(in[0], -1.5); }, {positive}));
}

// f32 exp over dense tensors runs blocks within [-87.3, 0] vectorised: within 2 ulp of std::exp
// there, and std::exp's own values for arguments outside (large, subnormal results, infinities),
// NaN kept.
TEST(Unary, ExpOfF32MatchesTheMathLibraryInEveryBlock) {
  constexpr int64_t kCount = 3 * 4096;
  std::vector<float> values(kCount);
  for (int64_t i = 0; i < kCount; ++i) {
    const double t = static_cast<double>(i) / kCount;
    // The first two thirds in [-87.3, 0] (a NaN and an exact 0 among them), then [-104, 20].
    values[i] =
        i < 2 * 4096 ? static_cast<float>(-87.3 * t * 1.5) : static_cast<float>(-104 + 124 * t);
  }
  values[5] = 0.0f;
  values[77] = std::numeric_limits<float>::quiet_NaN();
  values[kCount - 3] = std::numeric_limits<float>::infinity();
  values[kCount - 2] = -std::numeric_limits<float>::infinity();
  const std::vector<float> got = exp(from_vector(values, {kCount})).to_vector<float>();
  for (int64_t i = 0; i < kCount; ++i) {
    const float expected = std::exp(values[i]);
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(got[i])) << i;
    } else if (values[i] > 0 || values[i] < -87.33654f) {
      EXPECT_EQ(got[i], expected) << "entry " << i << " of " << values[i];
    } else {
      EXPECT_NEAR(got[i], expected, 2.5e-7f * expected) << "entry " << i << " of " << values[i];
    }
  }
  EXPECT_EQ(got[5], 1.0f);
  // A strided view goes through the strided loop: the math library's values.
  Tensor strided = narrow(from_vector(values, {2, kCount / 2}), 1, 0, 100);
  const std::vector<float> strided_got = exp(strided).to_vector<float>();
  EXPECT_EQ(strided_got[1], std::exp(values[1]));
}

TEST(UnaryGrad, MatchesFiniteDifferencesOnTransposedInputs) {
  manual_seed(24);
  using UnaryFn = Tensor (*)(const Tensor&);
  const std::pair<const char*, UnaryFn> any_sign[] = {
      {"neg", [](const Tensor& x) { return neg(x); }},
      {"abs", [](const Tensor& x) { return abs(x); }},
      {"exp", [](const Tensor& x) { return exp(x); }},
      {"tanh", [](const Tensor& x) { return tanh(x); }},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }},
      {"relu", [](const Tensor& x) { return relu(x); }},
      {"gelu", [](const Tensor& x) { return gelu(x); }},
      {"gelu tanh", [](const Tensor& x) { return gelu(x, "tanh"); }},
      {"clamp", [](const Tensor& x) { return clamp(x, -0.5, 0.7); }},
      {"operator-", [](const Tensor& x) { return -x; }},
  };
  for (const auto& [name, fn] : any_sign) {
    Tensor x = transposed_leaf(3, 4);
    EXPECT_TRUE(gradcheck([fn = fn](const std::vector<Tensor>& in) { return fn(in[0]); }, {x}))
        << name;
  }
  const std::pair<const char*, UnaryFn> positive_only[] = {
      {"log", [](const Tensor& x) { return log(x); }},
      {"sqrt", [](const Tensor& x) { return sqrt(x); }},
      {"rsqrt", [](const Tensor& x) { return rsqrt(x); }},
  };
  for (const auto& [name, fn] : positive_only) {
    Tensor x = transpose(positive_leaf({4, 3}), 0, 1);
    EXPECT_TRUE(gradcheck([fn = fn](const std::vector<Tensor>& in) { return fn(in[0]); }, {x}))
        << name;
  }
}

TEST(SelectionGrad, WhereAndMaskedFillMatchFiniteDifferences) {
  manual_seed(25);
  Tensor condition = from_vector<bool>({true, false, true}, {3});
  Tensor a = transposed_leaf(2, 3);
  Tensor b = randn({2, 1}, kF64).set_requires_grad(true);
  EXPECT_TRUE(gradcheck(
      [&](const std::vector<Tensor>& in) { return where(condition, in[0], in[1]); }, {a, b}));
  Tensor mask = from_vector<bool>({false, true}, {2, 1});
  EXPECT_TRUE(
      gradcheck([&](const std::vector<Tensor>& in) { return masked_fill(in[0], mask, 3.0); }, {a}));
}

// ---- bad input ----

TEST(ElementwiseErrors, ShapeMismatchNamesBothShapes) {
  Tensor a = zeros({2, 3});
  Tensor b = zeros({4});
  EXPECT_TRUE(throws_error([&] { add(a, b); }, "[2, 3]"));
  EXPECT_TRUE(throws_error([&] { add(a, b); }, "[4]"));
  EXPECT_TRUE(throws_error([&] { mul(a, b); }, "mul"));
  EXPECT_TRUE(throws_error([&] { where(from_vector<bool>({true, false}, {2}), a, a); }, "[2]"));
  EXPECT_TRUE(throws_error([&] { masked_fill(a, zeros({4}, DType::kBool), 0); }, "[4]"));
}

TEST(ElementwiseErrors, WrongDtypeIsRefused) {
  Tensor integers = from_vector<int64_t>({1, 2}, {2});
  EXPECT_TRUE(throws_error([&] { exp(integers); }, "exp: expected a f32 or f64 tensor"));
  EXPECT_TRUE(throws_error([&] { gelu(integers); }, "gelu: expected a f32 or f64 tensor"));
  Tensor half = to_dtype(zeros({2}), DType::kFloat16);
  EXPECT_TRUE(throws_error([&] { add(half, half); }, "f16"));
  Tensor flags = from_vector<bool>({true, false}, {2});
  EXPECT_TRUE(throws_error([&] { sub(flags, flags); }, "sub: not supported for two bool"));
  EXPECT_TRUE(throws_error([&] { where(zeros({2}), zeros({2}), zeros({2})); },
                           "where: condition must be bool or u8, got f32"));
  EXPECT_TRUE(throws_error([&] { masked_fill(zeros({2}), zeros({2}), 1); },
                           "masked_fill: mask must be bool or u8"));
}

TEST(ElementwiseErrors, WrongDeviceIsRefused) {
  Tensor cpu = zeros({2});
  Tensor meta = zeros({2}, TensorOptions().device(Device::meta()));
  EXPECT_TRUE(throws_error([&] { add(cpu, meta); }, "is on meta"));
  EXPECT_TRUE(throws_error(
      [&] {
        where(from_vector<bool>({true, false}, {2}), cpu, meta);
      },
      "is on meta"));
}

TEST(ElementwiseErrors, MetaTensorsGiveShapesOnly) {
  Tensor a = zeros({2, 1, 3}, TensorOptions().device(Device::meta()));
  Tensor b = zeros({4, 1}, TensorOptions().device(Device::meta()));
  Tensor c = mul(relu(a), b);
  EXPECT_EQ(c.sizes(), (Shape{2, 4, 3}));
  EXPECT_TRUE(c.device().is_meta());
}

TEST(ElementwiseErrors, InPlaceAddIntoAnExpandedViewIsRefused) {
  Tensor row = zeros({1, 3});
  Tensor expanded = expand(row, {4, 3});
  EXPECT_TRUE(throws_error(
      [&] {
        dispatch(ops::add, {expanded, ones({4, 3})}, {}, {expanded});
      },
      "expanded view"));
}

TEST(ElementwiseErrors, InPlaceOutShapeMustMatchTheResult) {
  Tensor small = zeros({3});
  EXPECT_TRUE(throws_error(
      [&] {
        dispatch(ops::add, {small, ones({2, 3})}, {}, {small});
      },
      "out= tensor 0 has shape [3]"));
}

}  // namespace
}  // namespace tessel
