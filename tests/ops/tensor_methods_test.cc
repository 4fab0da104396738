// Tensor methods and operators (ops/tensor_methods.cc): each method gives exactly what its free
// function gives, comparisons are element-wise, compound assignment writes in place under
// autograd's rules, and operator<< prints values, shape, dtype and device.
#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "core/autograd.h"
#include "gtest/gtest.h"
#include "ops/ops.h"
#include "tests/testing.h"

namespace tessel {
namespace {

using testing::bitwise_equal;
using testing::gradcheck;
using testing::kF64;
using testing::throws_error;

std::string printed(const Tensor& tensor) {
  std::ostringstream out;
  out << tensor;
  return out.str();
}

TEST(TensorMethods, ElementWiseMethodsEqualTheFreeFunctions) {
  manual_seed(1);
  const Tensor x = randn({3, 4});
  const Tensor y = rand({3, 4}) + 0.5;
  const Tensor positive = rand({3, 4}) + 0.1;
  EXPECT_TRUE(bitwise_equal(x.add(y), add(x, y)));
  EXPECT_TRUE(bitwise_equal(x.add(y, 2.5), add(x, y, 2.5)));
  EXPECT_TRUE(bitwise_equal(x.add(1.5), add(x, 1.5)));
  EXPECT_TRUE(bitwise_equal(x.sub(y), sub(x, y)));
  EXPECT_TRUE(bitwise_equal(x.sub(y, 0.5), sub(x, y, 0.5)));
  EXPECT_TRUE(bitwise_equal(x.sub(2.0), sub(x, 2.0)));
  EXPECT_TRUE(bitwise_equal(x.mul(y), mul(x, y)));
  EXPECT_TRUE(bitwise_equal(x.mul(3.0), mul(x, 3.0)));
  EXPECT_TRUE(bitwise_equal(x.div(y), div(x, y)));
  EXPECT_TRUE(bitwise_equal(x.div(4.0), div(x, 4.0)));
  EXPECT_TRUE(bitwise_equal(positive.pow(y), pow(positive, y)));
  EXPECT_TRUE(bitwise_equal(x.pow(2), pow(x, 2.0)));
  EXPECT_TRUE(bitwise_equal(x.maximum(y), maximum(x, y)));
  EXPECT_TRUE(bitwise_equal(x.minimum(y), minimum(x, y)));
  EXPECT_TRUE(bitwise_equal(x.neg(), neg(x)));
  EXPECT_TRUE(bitwise_equal(x.abs(), abs(x)));
  EXPECT_TRUE(bitwise_equal(x.exp(), exp(x)));
  EXPECT_TRUE(bitwise_equal(positive.log(), log(positive)));
  EXPECT_TRUE(bitwise_equal(positive.sqrt(), sqrt(positive)));
  EXPECT_TRUE(bitwise_equal(positive.rsqrt(), rsqrt(positive)));
  EXPECT_TRUE(bitwise_equal(x.tanh(), tanh(x)));
  EXPECT_TRUE(bitwise_equal(x.sigmoid(), sigmoid(x)));
  EXPECT_TRUE(bitwise_equal(x.relu(), relu(x)));
  EXPECT_TRUE(bitwise_equal(x.gelu(), gelu(x)));
  EXPECT_TRUE(bitwise_equal(x.gelu("tanh"), gelu(x, "tanh")));
  EXPECT_TRUE(bitwise_equal(x.clamp(-0.5, 0.5), clamp(x, -0.5, 0.5)));
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_TRUE(bitwise_equal(x.clamp_min(0.25), clamp(x, 0.25, inf)));
  EXPECT_TRUE(bitwise_equal(x.clamp_max(0.25), clamp(x, -inf, 0.25)));
  const Tensor mask = gt(x, zeros({}));
  EXPECT_TRUE(bitwise_equal(x.masked_fill(mask, 7.0), masked_fill(x, mask, 7.0)));
  EXPECT_TRUE(bitwise_equal(x.matmul(y.t()), matmul(x, transpose(y, 0, 1))));
}

TEST(TensorMethods, ReductionsAndShapeMethodsEqualTheFreeFunctions) {
  manual_seed(2);
  const Tensor x = randn({2, 3, 4});
  EXPECT_TRUE(bitwise_equal(x.sum(), sum(x)));
  EXPECT_TRUE(bitwise_equal(x.sum({0, 2}, true), sum(x, {0, 2}, true)));
  EXPECT_TRUE(bitwise_equal(x.sum(1), sum(x, {1})));  // a single dim, as libtorch's x.sum(1)
  EXPECT_TRUE(bitwise_equal(x.sum(-1, true), sum(x, {-1}, true)));
  EXPECT_TRUE(bitwise_equal(x.sum({}), sum(x)));  // an empty list is every dim, not dim 0
  EXPECT_TRUE(bitwise_equal(x.mean(), mean(x)));
  EXPECT_TRUE(bitwise_equal(x.mean(2), mean(x, {2})));
  EXPECT_TRUE(bitwise_equal(x.mean({1}, true), mean(x, {1}, true)));
  EXPECT_TRUE(bitwise_equal(x.var(), var(x)));
  EXPECT_TRUE(bitwise_equal(x.var({1}, false, true), var(x, {1}, false, true)));
  EXPECT_TRUE(bitwise_equal(x.max(), max(x)));
  EXPECT_TRUE(bitwise_equal(x.min(), min(x)));
  EXPECT_TRUE(bitwise_equal(x.argmax(2), argmax(x, 2)));
  EXPECT_TRUE(bitwise_equal(x.argmax(0, true), argmax(x, 0, true)));
  EXPECT_TRUE(bitwise_equal(x.softmax(1), softmax(x, 1)));
  EXPECT_TRUE(bitwise_equal(x.log_softmax(-1), log_softmax(x, -1)));
  const Tensor index = from_vector<int64_t>({2, 0}, {2});
  EXPECT_TRUE(bitwise_equal(x.index_select(1, index), index_select(x, 1, index)));
  const Tensor gather_index = zeros({2, 3, 1}, DType::kInt64);
  EXPECT_TRUE(bitwise_equal(x.gather(2, gather_index), gather(x, 2, gather_index)));
  const auto pieces = x.split(2, 2);
  const auto expected_pieces = split(x, 2, 2);
  ASSERT_EQ(pieces.size(), expected_pieces.size());
  for (size_t i = 0; i < pieces.size(); ++i)
    EXPECT_TRUE(bitwise_equal(pieces[i], expected_pieces[i]));
  EXPECT_EQ(x.chunk(3, 1).size(), chunk(x, 3, 1).size());
  EXPECT_TRUE(bitwise_equal(x.to(DType::kFloat64), to_dtype(x, DType::kFloat64)));
}

TEST(TensorMethods, MaxAndMinAlongADimGiveValuesAndIndices) {
  const Tensor x = tensor({1, 5, 3, 7, 2, 7}, {2, 3});
  auto [values, indices] = x.max(1);
  EXPECT_EQ(values.to_vector<float>(), (std::vector<float>{5, 7}));
  EXPECT_EQ(indices.dtype(), DType::kInt64);
  EXPECT_EQ(indices.to_vector<int64_t>(), (std::vector<int64_t>{1, 0}));  // the first on ties
  EXPECT_TRUE(bitwise_equal(values, max(x, 1)));
  EXPECT_TRUE(bitwise_equal(indices, argmax(x, 1)));
  auto [low, low_at] = x.min(0, /*keepdim=*/true);
  EXPECT_EQ(low.sizes(), (Shape{1, 3}));
  EXPECT_EQ(low.to_vector<float>(), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(low_at.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 0}));
  EXPECT_TRUE(bitwise_equal(low, min(x, 0, true)));
}

TEST(TensorMethods, MaxAlongADimPassesItsGradientToTheWinner) {
  Tensor x = tensor({1, 5, 3, 7, 2, 4}, {2, 3}).set_requires_grad(true);
  std::get<0>(x.max(1)).sum().backward();
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{0, 1, 0, 1, 0, 0}));
}

TEST(TensorMethods, ArgmaxWithoutDimIndexesTheFlattenedTensor) {
  const Tensor x = tensor({1, 5, 3, 7, 9, 2}, {2, 3});
  const Tensor index = x.argmax();
  EXPECT_EQ(index.dim(), 0);
  EXPECT_EQ(index.item<int64_t>(), 4);
}

TEST(TensorMethods, SqueezeWithoutDimDropsEveryDimOfSizeOne) {
  const Tensor x = zeros({1, 3, 1, 2});
  const Tensor squeezed = x.squeeze();
  EXPECT_EQ(squeezed.sizes(), (Shape{3, 2}));
  EXPECT_EQ(squeezed.storage(), x.storage());  // a view
  EXPECT_EQ(x.squeeze(2).sizes(), (Shape{1, 3, 2}));
  EXPECT_EQ(x.unsqueeze(0).sizes(), (Shape{1, 1, 3, 1, 2}));
  EXPECT_EQ(zeros({1, 1}).squeeze().dim(), 0);
}

TEST(TensorMethods, RequiresGradUnderscoreSetsTheFlag) {
  Tensor x = zeros({2});
  EXPECT_TRUE(x.requires_grad_().requires_grad());
  EXPECT_FALSE(x.requires_grad_(false).requires_grad());
}

TEST(TensorMethods, GradientsThroughMethodsPassGradcheck) {
  manual_seed(3);
  const Tensor a = randn({3, 4}, kF64).set_requires_grad(true);
  const Tensor b = (rand({4, 2}, kF64) + 0.5).set_requires_grad(true);
  EXPECT_TRUE(gradcheck(
      [](const std::vector<Tensor>& in) {
        return in[0].tanh().matmul(in[1]).log_softmax(1).mul(in[0].sum(1, true).sigmoid());
      },
      {a, b}));
  EXPECT_TRUE(gradcheck(
      [](const std::vector<Tensor>& in) { return in[1].sqrt().pow(3.0).t().exp().mean(0); },
      {a, b}));
}

TEST(TensorOperators, ComparisonsAreElementWiseBoolTensors) {
  const Tensor a = tensor({1, 2, 3, 4}, {4});
  const Tensor b = tensor({4, 2, 1, 4}, {4});
  const Tensor equal = a == b;
  EXPECT_EQ(equal.dtype(), DType::kBool);
  EXPECT_EQ(equal.sizes(), (Shape{4}));
  EXPECT_TRUE(bitwise_equal(equal, eq(a, b)));
  EXPECT_TRUE(bitwise_equal(a != b, ne(a, b)));
  EXPECT_TRUE(bitwise_equal(a < b, lt(a, b)));
  EXPECT_TRUE(bitwise_equal(a <= b, le(a, b)));
  EXPECT_TRUE(bitwise_equal(a > b, gt(a, b)));
  EXPECT_TRUE(bitwise_equal(a >= b, ge(a, b)));
  EXPECT_EQ((a < b).to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 0, 0}));
  EXPECT_EQ((a >= b).to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 1, 1}));
  // Methods give the same.
  EXPECT_TRUE(bitwise_equal(a.eq(b), a == b));
  EXPECT_TRUE(bitwise_equal(a.ne(b), a != b));
  EXPECT_TRUE(bitwise_equal(a.lt(b), a < b));
  EXPECT_TRUE(bitwise_equal(a.le(b), a <= b));
  EXPECT_TRUE(bitwise_equal(a.gt(b), a > b));
  EXPECT_TRUE(bitwise_equal(a.ge(b), a >= b));
  // Broadcasting, as the free functions.
  const Tensor column = tensor({2, 3}, {2, 1});
  EXPECT_EQ((a > column).sizes(), (Shape{2, 4}));
  EXPECT_EQ((a > column).to_vector<int64_t>(), (std::vector<int64_t>{0, 0, 1, 1, 0, 0, 0, 1}));
}

TEST(TensorOperators, ComparisonsWithScalarsOnEitherSide) {
  const Tensor a = tensor({1, 2, 3, 4}, {4});
  EXPECT_EQ((a == 2).to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 0, 0}));
  EXPECT_EQ((a != 2).to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 1, 1}));
  EXPECT_EQ((a < 2.5).to_vector<int64_t>(), (std::vector<int64_t>{1, 1, 0, 0}));
  EXPECT_EQ((a <= 2).to_vector<int64_t>(), (std::vector<int64_t>{1, 1, 0, 0}));
  EXPECT_EQ((a > 3).to_vector<int64_t>(), (std::vector<int64_t>{0, 0, 0, 1}));
  EXPECT_EQ((a >= 3).to_vector<int64_t>(), (std::vector<int64_t>{0, 0, 1, 1}));
  EXPECT_TRUE(bitwise_equal(2.5 < a, a > 2.5));
  EXPECT_TRUE(bitwise_equal(2 >= a, a <= 2));
  EXPECT_TRUE(bitwise_equal(3 == a, a == 3));
  EXPECT_TRUE(bitwise_equal(3 != a, a != 3));
  EXPECT_TRUE(bitwise_equal(3 <= a, a >= 3));
  EXPECT_TRUE(bitwise_equal(3 > a, a < 3));
  EXPECT_TRUE(bitwise_equal(a.gt(2), gt(a, 2)));
  EXPECT_TRUE(bitwise_equal(a.le(2), a <= 2));
  // An integer tensor compared with a fraction is not compared with its integer part.
  const Tensor integers = from_vector<int64_t>({1, 2, 3}, {3});
  EXPECT_EQ((integers == 2.5).to_vector<int64_t>(), (std::vector<int64_t>{0, 0, 0}));
  EXPECT_EQ((integers < 2.5).to_vector<int64_t>(), (std::vector<int64_t>{1, 1, 0}));
  EXPECT_EQ((integers == 2).to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 0}));
  // A float tensor compares in its own dtype, as libtorch: 0.1f == 0.1 there.
  EXPECT_EQ((tensor({0.1f}, {1}) == 0.1).item<bool>(), true);
}

TEST(TensorOperators, ComparisonsCarryNoGradient) {
  const Tensor x = randn({3}).set_requires_grad(true);
  EXPECT_FALSE((x > 0).requires_grad());
  EXPECT_FALSE((x == x).requires_grad());
}

TEST(TensorOperators, CompoundAssignmentWritesIntoTheSameStorage) {
  Tensor x = tensor({1, 2, 3, 4}, {2, 2});
  const Tensor alias = x;             // shares the handle
  const Tensor row = x.select(0, 1);  // a view of the second row
  const auto storage = x.storage();
  const uint64_t version = x.version();
  x += tensor({10, 20}, {2});  // broadcast over the rows
  EXPECT_EQ(x.storage(), storage);
  EXPECT_GT(x.version(), version);
  EXPECT_EQ(alias.to_vector<float>(), (std::vector<float>{11, 22, 13, 24}));
  EXPECT_EQ(row.to_vector<float>(), (std::vector<float>{13, 24}));
  x -= 1;
  EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{10, 21, 12, 23}));
  x *= 2;
  EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{20, 42, 24, 46}));
  x /= 4;
  EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{5, 10.5, 6, 11.5}));
  x *= tensor({2, 0}, {2});
  EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{10, 0, 12, 0}));
  x -= tensor({1, 1, 2, 2}, {2, 2});
  EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{9, -1, 10, -2}));
  x /= tensor({3, 1}, {2});
  EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{3, -1, 10.0f / 3, -2}));
  x += 0.5;
  EXPECT_FLOAT_EQ(x.to_vector<float>()[0], 3.5f);
  EXPECT_EQ(x.storage(), storage);
  // The result must fit the tensor: no broadcasting of the target, no silent dtype change.
  EXPECT_TRUE(throws_error([&] { x += zeros({3, 2, 2}); }, "has shape"));
  Tensor integers = from_vector<int64_t>({4, 6}, {2});
  integers += from_vector<int64_t>({1, 1}, {2});
  integers *= 3;
  EXPECT_EQ(integers.to_vector<int64_t>(), (std::vector<int64_t>{15, 21}));
  EXPECT_TRUE(throws_error([&] { integers /= from_vector<int64_t>({2, 2}, {2}); }, "dtype"));
}

TEST(TensorOperators, InPlaceOnALeafThatRequiresGradIsAClearError) {
  Tensor w = tensor({1, 2}, {2}).set_requires_grad(true);
  const uint64_t version = w.version();
  const std::string message = "a leaf tensor that requires grad";
  EXPECT_TRUE(throws_error([&] { w += 1; }, message));
  EXPECT_TRUE(throws_error([&] { w -= tensor({1, 1}, {2}); }, message));
  EXPECT_TRUE(throws_error([&] { w *= 2; }, message));
  EXPECT_TRUE(throws_error([&] { w /= 2; }, "NoGradGuard"));
  EXPECT_TRUE(throws_error([&] { w.zero_(); }, message));
  EXPECT_TRUE(throws_error([&] { w.copy_(zeros({2})); }, message));
  EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{1, 2}));  // untouched
  EXPECT_EQ(w.version(), version);

  // What an optimizer does: the update inside NoGradGuard, the gradient kept.
  (w * w).sum().backward();
  {
    NoGradGuard no_grad;
    w -= w.grad() * 0.25;
  }
  EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{0.5, 1}));
  EXPECT_TRUE(w.requires_grad());
  EXPECT_TRUE(w.is_leaf());
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{2, 4}));

  // A result with history cannot be written in place either (autograd records no in-place
  // op); one that takes no part in autograd can.
  Tensor hidden = w * 2;
  EXPECT_TRUE(throws_error([&] { hidden += 1; }, "not recorded"));
  Tensor plain = zeros({2});
  EXPECT_TRUE(throws_error([&] { plain += w; }, "not recorded"));
  plain += w.detach();
  EXPECT_EQ(plain.to_vector<float>(), (std::vector<float>{0.5, 1}));
}

TEST(TensorPrinting, SmallTensorsShowEveryValueShapeDtypeAndDevice) {
  EXPECT_EQ(printed(tensor({1, 2.5, -3, 4}, {2, 2})),
            "tensor([[ 1.0000,  2.5000],\n"
            "        [-3.0000,  4.0000]], shape=[2, 2], dtype=f32, device=cpu)");
  EXPECT_EQ(printed(from_vector<int64_t>({3, -12, 7}, {3})),
            "tensor([  3, -12,   7], shape=[3], dtype=i64, device=cpu)");
  EXPECT_EQ(printed(scalar_tensor(0.5, kF64)), "tensor(0.5000, shape=[], dtype=f64, device=cpu)");
  EXPECT_EQ(printed(tensor({1, 2}, {2}) > 1.5),
            "tensor([false,  true], shape=[2], dtype=bool, device=cpu)");
  EXPECT_EQ(printed(zeros({2}).set_requires_grad(true)),
            "tensor([0.0000, 0.0000], shape=[2], dtype=f32, device=cpu, requires_grad)");
  EXPECT_EQ(printed(tensor({1e-6f, 2e9f}, {2})),
            "tensor([1.0000e-06, 2.0000e+09], shape=[2], dtype=f32, device=cpu)");
  EXPECT_EQ(printed(Tensor()), "tensor(undefined)");
  EXPECT_EQ(printed(empty({2, 3}, TensorOptions().device(Device::meta()))),
            "tensor(..., shape=[2, 3], dtype=f32, device=meta)");
}

TEST(TensorPrinting, ThreeDimensionsSeparateMatricesByABlankLine) {
  EXPECT_EQ(printed(arange(8).reshape({2, 2, 2})),
            "tensor([[[0, 1],\n"
            "         [2, 3]],\n"
            "\n"
            "        [[4, 5],\n"
            "         [6, 7]]], shape=[2, 2, 2], dtype=i64, device=cpu)");
}

TEST(TensorPrinting, LargeTensorsShowOnlyTheirEdges) {
  const std::string text = printed(arange(2000));
  EXPECT_EQ(text,
            "tensor([   0,    1,    2, ..., 1997, 1998, 1999], shape=[2000], dtype=i64, "
            "device=cpu)");
  const std::string matrix = printed(arange(100 * 30).reshape({100, 30}));
  EXPECT_NE(matrix.find("[   0,    1,    2, ...,   27,   28,   29]"), std::string::npos) << matrix;
  EXPECT_NE(matrix.find("...,\n"), std::string::npos) << matrix;  // rows left out
  EXPECT_NE(matrix.find("[2970, 2971, 2972, ..., 2997, 2998, 2999]]"), std::string::npos) << matrix;
  EXPECT_LT(matrix.size(), 400u);
  // Summarising is not part of any computation.
  const Tensor x = randn({50, 50}).set_requires_grad(true);
  EXPECT_NE(printed(x).find("requires_grad"), std::string::npos);
}

}  // namespace
}  // namespace tessel
