// matmul (every rank combination), bmm and linear: values against PyTorch, the GEMM paths
// against a plain triple loop, gradients by finite differences, and bad inputs.
#include "ops/linalg.h"

#include <cmath>

#include "core/autograd.h"
#include "core/op.h"
#include "core/threading.h"
#include "ops/ops.h"
#include "tests/ops/patterns.h"
#include "tests/testing.h"

namespace tessel {
namespace {

using testing::all_close;
using testing::expected;
using testing::gradcheck;
using testing::kF64;
using testing::pattern;
using testing::throws_error;

// C = A B with a plain loop in double, A (n, k) and B (k, m) given as row-major values.
std::vector<double> reference_product(const std::vector<double>& a, const std::vector<double>& b,
                                      int64_t n, int64_t k, int64_t m) {
  std::vector<double> c(static_cast<size_t>(n * m), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t p = 0; p < k; ++p)
      for (int64_t j = 0; j < m; ++j) c[i * m + j] += a[i * k + p] * b[p * m + j];
  return c;
}

TEST(Matmul, TwoByTwoMatchesPyTorch) {
  // torch.matmul(pat((2,3)), pat((3,4), 5))
  Tensor out = matmul(pattern({2, 3}), pattern({3, 4}, 5));
  EXPECT_TRUE(all_close(
      out,
      expected({0.875, 0.171875, 0, -0.703125, -0.109375, 0.453125, -0.84375, -0.28125}, {2, 4})));
}

TEST(Matmul, F32MatchesPyTorch) {
  Tensor out = matmul(pattern({2, 3}, 0, DType::kFloat32), pattern({3, 4}, 5, DType::kFloat32));
  EXPECT_EQ(out.dtype(), DType::kFloat32);
  EXPECT_TRUE(all_close(
      out,
      expected({0.875, 0.171875, 0, -0.703125, -0.109375, 0.453125, -0.84375, -0.28125}, {2, 4})));
}

TEST(Matmul, BroadcastsBatchDimsLikePyTorch) {
  // torch.matmul(pat((2,1,2,3)), pat((3,3,2), 3))
  Tensor out = matmul(pattern({2, 1, 2, 3}), pattern({3, 3, 2}, 3));
  EXPECT_TRUE(
      all_close(out, expected({0.328125, 0.15625,   0.75,     -0.546875, 0.09375,   -0.078125,
                               0.9375,   -0.359375, 0.390625, -0.3125,   -0.734375, -0.171875,
                               0.375,    0.078125,  0.796875, -0.625,    0.1875,    -0.109375,
                               1.03125,  -0.390625, 0.265625, -0.296875, -0.859375, -0.15625},
                              {2, 3, 2, 2})));
}

TEST(Matmul, VectorOperandsDropTheirDimLikePyTorch) {
  // torch.matmul(pat((3,)), pat((2,3,2), 7)); torch.matmul(pat((2,2,3)), pat((3,), 2));
  // torch.matmul(pat((4,)), pat((4,), 9))
  EXPECT_TRUE(all_close(matmul(pattern({3}), pattern({2, 3, 2}, 7)),
                        expected({-0.078125, -0.78125, -0.3125, 0.3125}, {2, 2})));
  EXPECT_TRUE(all_close(matmul(pattern({2, 2, 3}), pattern({3}, 2)),
                        expected({0.984375, -0.28125, 0.84375, -0.421875}, {2, 2})));
  Tensor dot = matmul(pattern({4}), pattern({4}, 9));
  EXPECT_EQ(dot.dim(), 0);
  EXPECT_NEAR(dot.item<double>(), -0.765625, 1e-12);
  // Matrix times vector and vector times matrix keep one dim.
  EXPECT_EQ(matmul(pattern({2, 3}), pattern({3})).sizes(), (Shape{2}));
  EXPECT_EQ(matmul(pattern({3}), pattern({3, 5})).sizes(), (Shape{5}));
}

TEST(Matmul, ReadsTransposedOperandsInPlace) {
  Tensor a = randn({37, 19}, kF64);
  Tensor b = randn({37, 23}, kF64);
  Tensor at = transpose(a, 0, 1);  // (19, 37), column-major
  EXPECT_FALSE(at.is_contiguous());
  Tensor out = matmul(at, b);
  auto reference =
      reference_product(contiguous(at).to_vector<double>(), b.to_vector<double>(), 19, 37, 23);
  EXPECT_TRUE(all_close(out, from_vector<double>(reference, {19, 23}), 1e-12, 1e-12));
  // Both operands transposed, and a column slice with a row stride larger than its width.
  Tensor bt = transpose(randn({23, 37}, kF64), 0, 1);
  EXPECT_TRUE(all_close(matmul(at, bt), matmul(contiguous(at), contiguous(bt)), 1e-12, 1e-12));
  Tensor wide = randn({19, 50}, kF64);
  Tensor sliced = slice(wide, 1, 5, 42);
  EXPECT_TRUE(all_close(matmul(sliced, b), matmul(contiguous(sliced), b), 1e-12, 1e-12));
  // A stepped slice has no unit stride anywhere: it is copied, with the same result.
  Tensor stepped = slice(randn({19, 74}, kF64), 1, 0, 74, 2);
  EXPECT_TRUE(all_close(matmul(stepped, b), matmul(contiguous(stepped), b), 1e-12, 1e-12));
}

TEST(Matmul, LargeF32ProductMatchesPlainLoop) {
  // Big enough for Eigen's blocked, threaded path; odd sizes exercise the edges.
  const int64_t n = 133, k = 257, m = 71;
  Tensor a = randn({n, k});
  Tensor b = randn({k, m});
  auto reference = reference_product(a.to_vector<double>(), b.to_vector<double>(), n, k, m);
  EXPECT_TRUE(all_close(matmul(a, b), from_vector<double>(reference, {n, m}), 1e-5, 1e-4));
}

TEST(Matmul, LargeTransposedProductsSplitAcrossThreads) {
  // Big enough that each thread takes a slice of C: rows of a transposed A, then columns of a
  // transposed B.
  Tensor at = transpose(randn({100, 150}, kF64), 0, 1);  // (150, 100)
  Tensor b = randn({100, 90}, kF64);
  EXPECT_TRUE(all_close(matmul(at, b),
                        from_vector<double>(reference_product(contiguous(at).to_vector<double>(),
                                                              b.to_vector<double>(), 150, 100, 90),
                                            {150, 90}),
                        1e-12, 1e-12));
  Tensor a = randn({40, 100}, kF64);
  Tensor bt = transpose(randn({150, 100}, kF64), 0, 1);  // (100, 150)
  EXPECT_TRUE(all_close(
      matmul(a, bt),
      from_vector<double>(reference_product(a.to_vector<double>(),
                                            contiguous(bt).to_vector<double>(), 40, 100, 150),
                          {40, 150}),
      1e-12, 1e-12));
}

TEST(Matmul, WritesIntoAStridedOutView) {
  Tensor a = randn({4, 5}, kF64);
  Tensor b = randn({5, 3}, kF64);
  Tensor big = zeros({4, 8}, kF64);
  Tensor window = slice(big, 1, 2, 5);
  dispatch(ops::matmul, {a, b}, {}, {window});
  EXPECT_TRUE(all_close(slice(big, 1, 2, 5), matmul(a, b), 1e-12, 1e-12));
  EXPECT_TRUE(all_close(slice(big, 1, 0, 2), zeros({4, 2}, kF64)));
  // A column-major output is computed in scratch and copied.
  Tensor column_major = transpose(zeros({3, 4}, kF64), 0, 1);
  dispatch(ops::matmul, {a, b}, {}, {column_major});
  EXPECT_TRUE(all_close(column_major, matmul(a, b), 1e-12, 1e-12));
}

TEST(Matmul, EmptyInnerDimensionGivesZeros) {
  Tensor out = matmul(zeros({3, 0}), zeros({0, 4}));
  EXPECT_TRUE(all_close(out, zeros({3, 4})));
}

TEST(Matmul, GradientsMatchFiniteDifferences) {
  Tensor a = randn({3, 4}, kF64).set_requires_grad(true);
  Tensor b = randn({4, 2}, kF64).set_requires_grad(true);
  EXPECT_TRUE(
      gradcheck([](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); }, {a, b}));
  // Transposed (non-contiguous) operands.
  Tensor at = transpose(randn({4, 3}, kF64), 0, 1).set_requires_grad(true);
  EXPECT_TRUE(
      gradcheck([](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); }, {at, b}));
}

TEST(Matmul, BatchedBroadcastGradientsMatchFiniteDifferences) {
  Tensor a = randn({2, 1, 3, 4}, kF64).set_requires_grad(true);
  Tensor b = randn({3, 4, 2}, kF64).set_requires_grad(true);
  EXPECT_TRUE(
      gradcheck([](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); }, {a, b}));
  // Batched times matrix folds the batch into rows.
  Tensor matrix = randn({4, 5}, kF64).set_requires_grad(true);
  EXPECT_TRUE(
      gradcheck([](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); }, {a, matrix}));
}

TEST(Matmul, VectorGradientsMatchFiniteDifferences) {
  Tensor v = randn({4}, kF64).set_requires_grad(true);
  Tensor w = randn({4}, kF64).set_requires_grad(true);
  Tensor m = randn({4, 3}, kF64).set_requires_grad(true);
  Tensor batch = randn({2, 4, 3}, kF64).set_requires_grad(true);
  auto product = [](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); };
  EXPECT_TRUE(gradcheck(product, {v, w}));
  EXPECT_TRUE(gradcheck(product, {v, m}));
  EXPECT_TRUE(gradcheck(product, {transpose(m, 0, 1), v}));
  EXPECT_TRUE(gradcheck(product, {v, batch}));
}

TEST(Matmul, CostCountsTwoFlopsPerMultiplyAdd) {
  const OpDef& op = ops::matmul;
  Tensor a = zeros({6, 5});
  Tensor b = zeros({5, 7});
  Tensor out = zeros({6, 7});
  OpCost cost = op.cost({a, b}, {out}, {});
  EXPECT_DOUBLE_EQ(cost.flops, 2.0 * 6 * 7 * 5);
  EXPECT_DOUBLE_EQ(cost.bytes, 4.0 * (30 + 35 + 42));
  ASSERT_EQ(op.splits.size(), 1u);
  EXPECT_EQ(op.splits[0].output_dim, 0);
  EXPECT_EQ(op.splits[0].input_dims, (std::vector<int>{0, -1}));
}

TEST(Matmul, InnerDimensionMismatchNamesBothShapes) {
  EXPECT_TRUE(throws_error(
      [] {
        matmul(zeros({2, 3}), zeros({4, 5}));
      },
      "matmul: inner dimensions differ: a has shape [2, 3] and b has shape "
      "[4, 5]"));
  EXPECT_TRUE(throws_error([] { matmul(zeros({2, 2, 3}), zeros({2, 4, 5})); }, "[2, 4, 5]"));
  EXPECT_TRUE(throws_error([] { matmul(zeros({3}), zeros({4})); }, "(3 vs 4)"));
  EXPECT_TRUE(throws_error(
      [] {
        matmul(zeros({2, 2, 3}), zeros({3, 3, 5}));
      },
      "batch dimensions do not broadcast"));
}

TEST(Matmul, RejectsScalarsAndNonFloatDtypes) {
  EXPECT_TRUE(throws_error([] { matmul(zeros({}), zeros({3})); }, "at least 1 dimension"));
  EXPECT_TRUE(throws_error(
      [] {
        matmul(zeros({2, 3}, DType::kInt64), zeros({3, 2}, DType::kInt64));
      },
      "expected a f32 or f64 tensor for a, got i64"));
  EXPECT_TRUE(throws_error(
      [] {
        matmul(zeros({2, 3}), zeros({3, 2}, kF64));
      },
      "a is f32 but b is f64"));
}

TEST(Bmm, MatchesPyTorch) {
  // torch.bmm(pat((2,2,3)), pat((2,3,2), 6))
  EXPECT_TRUE(all_close(
      bmm(pattern({2, 2, 3}), pattern({2, 3, 2}, 6)),
      expected({0.15625, -0.546875, -0.546875, 0.015625, -0.109375, -0.671875, -0.390625, 0.3125},
               {2, 2, 2})));
}

TEST(Bmm, ManySmallMatricesMatchPlainLoop) {
  // A batch much larger than the thread count runs whole matrices per thread.
  const int64_t batch = 17, n = 5, k = 6, m = 4;
  Tensor a = randn({batch, n, k}, kF64);
  Tensor b = transpose(randn({batch, m, k}, kF64), 1, 2);
  Tensor out = bmm(a, b);
  auto av = a.to_vector<double>();
  auto bv = contiguous(b).to_vector<double>();
  std::vector<double> reference;
  for (int64_t i = 0; i < batch; ++i) {
    std::vector<double> ai(av.begin() + i * n * k, av.begin() + (i + 1) * n * k);
    std::vector<double> bi(bv.begin() + i * k * m, bv.begin() + (i + 1) * k * m);
    auto ci = reference_product(ai, bi, n, k, m);
    reference.insert(reference.end(), ci.begin(), ci.end());
  }
  EXPECT_TRUE(all_close(out, from_vector<double>(reference, {batch, n, m}), 1e-12, 1e-12));
}

TEST(Bmm, ExpandedBatchReusesOneMatrix) {
  Tensor a = randn({4, 3, 5}, kF64);
  Tensor shared = randn({1, 5, 2}, kF64);
  Tensor out = bmm(a, expand(shared, {4, 5, 2}));
  for (int64_t i = 0; i < 4; ++i)
    EXPECT_TRUE(
        all_close(select(out, 0, i), matmul(select(a, 0, i), select(shared, 0, 0)), 1e-12, 1e-12));
}

TEST(Bmm, GradientsMatchFiniteDifferences) {
  Tensor a = randn({3, 2, 4}, kF64).set_requires_grad(true);
  Tensor b = transpose(randn({3, 5, 4}, kF64), 1, 2).set_requires_grad(true);
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return bmm(in[0], in[1]); }, {a, b}));
}

TEST(Bmm, ShapeErrorsNameBothShapes) {
  EXPECT_TRUE(throws_error(
      [] {
        bmm(zeros({2, 3, 4}), zeros({3, 4, 5}));
      },
      "bmm: batch sizes differ: a has shape [2, 3, 4] and b has shape [3, 4, 5]"));
  EXPECT_TRUE(throws_error(
      [] {
        bmm(zeros({2, 3, 4}), zeros({2, 5, 5}));
      },
      "bmm: inner dimensions differ: a has shape [2, 3, 4] and b has shape "
      "[2, 5, 5]"));
  EXPECT_TRUE(throws_error([] { bmm(zeros({3, 4}), zeros({4, 5})); }, "expected 3-D tensors"));
  const OpDef& op = ops::bmm;
  EXPECT_EQ(op.splits.at(0).input_dims, (std::vector<int>{0, 0}));
}

TEST(Addmm, MatchesPyTorch) {
  // torch.addmm(pat((3,4),5), pat((3,2)), pat((2,4),9))
  Tensor out = addmm(pattern({3, 4}, 5), pattern({3, 2}), pattern({2, 4}, 9));
  EXPECT_TRUE(all_close(out, expected({-0.1875, -0.421875, -0.65625, 1.234375, -1.09375, -0.765625,
                                       -0.4375, 0.421875, 0.125, 1.015625, -0.21875, -0.390625},
                                      {3, 4})));
}

TEST(Addmm, InPlaceAccumulatesIntoTheSameStorage) {
  Tensor a = randn({6, 5}, kF64);
  Tensor b = transpose(randn({4, 5}, kF64), 0, 1);  // (5, 4), read transposed
  Tensor c = randn({6, 4}, kF64);
  Tensor expected_sum = add(c, matmul(a, b));
  const auto storage = c.storage();
  c.addmm_(a, b);
  EXPECT_EQ(c.storage(), storage);
  EXPECT_TRUE(all_close(c, expected_sum, 1e-12, 1e-12));
  // Into a window of a larger tensor: the columns around it keep their values.
  Tensor big = zeros({6, 8}, kF64);
  Tensor window = slice(big, 1, 2, 6);
  window.addmm_(a, b);
  EXPECT_TRUE(all_close(window, matmul(a, b), 1e-12, 1e-12));
  EXPECT_TRUE(all_close(slice(big, 1, 0, 2), zeros({6, 2}, kF64)));
  EXPECT_TRUE(all_close(slice(big, 1, 6, 8), zeros({6, 2}, kF64)));
  // A column-major c is summed in scratch and copied back.
  Tensor column_major = transpose(randn({4, 6}, kF64), 0, 1);
  Tensor before = contiguous(column_major);
  column_major.addmm_(a, b);
  EXPECT_TRUE(all_close(column_major, add(before, matmul(a, b)), 1e-12, 1e-12));
}

TEST(Addmm, AnOperandThatIsAlsoTheAccumulatorIsReadBeforeItIsWritten) {
  Tensor c = randn({4, 4}, kF64);
  Tensor b = randn({4, 4}, kF64);
  Tensor expected_sum = add(c, matmul(c, b));
  c.addmm_(c, b);
  EXPECT_TRUE(all_close(c, expected_sum, 1e-12, 1e-12));
}

TEST(Addmm, SumsChunkProductsLikeOneProduct) {
  // The use it is made for: a sum of products over chunks of rows equals the whole product.
  Tensor a = randn({48, 32});
  Tensor x = randn({32, 24});
  Tensor sum = zeros({48, 24});
  for (int64_t begin = 0; begin < 32; begin += 8)
    sum.addmm_(narrow(a, 1, begin, 8), x.narrow(0, begin, 8));
  EXPECT_TRUE(all_close(sum, matmul(a, x), 1e-4, 1e-5));
}

TEST(Addmm, EmptyInnerDimensionGivesC) {
  Tensor c = randn({3, 4}, kF64);
  EXPECT_TRUE(all_close(addmm(c, zeros({3, 0}, kF64), zeros({0, 4}, kF64)), c));
}

TEST(Addmm, GradientsMatchFiniteDifferences) {
  Tensor c = randn({3, 2}, kF64).set_requires_grad(true);
  Tensor a = transpose(randn({4, 3}, kF64), 0, 1).set_requires_grad(true);
  Tensor b = randn({4, 2}, kF64).set_requires_grad(true);
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return addmm(in[0], in[1], in[2]); },
                        {c, a, b}));
}

TEST(Addmm, CostAndSplitsFollowTheRows) {
  const OpDef& op = ops::addmm;
  OpCost cost = op.cost({zeros({3, 5}), zeros({3, 4}), zeros({4, 5})}, {zeros({3, 5})}, {});
  EXPECT_DOUBLE_EQ(cost.flops, 2.0 * 3 * 5 * 4);
  EXPECT_EQ(op.splits.at(0).input_dims, (std::vector<int>{0, 0, -1}));
}

TEST(Addmm, BadInputsAreNamedAndLeaveCUnchanged) {
  Tensor c = randn({2, 5}, kF64);
  const Tensor before = contiguous(c).clone();
  EXPECT_TRUE(throws_error(
      [&] {
        c.addmm_(zeros({2, 3}, kF64), zeros({4, 5}, kF64));
      },
      "addmm: inner dimensions differ: a has shape [2, 3] and b has shape "
      "[4, 5] (3 vs 4)"));
  EXPECT_TRUE(throws_error(
      [&] {
        c.addmm_(zeros({3, 3}, kF64), zeros({3, 5}, kF64));
      },
      "addmm: c has shape [2, 5] but a b has shape [3, 5]"));
  EXPECT_TRUE(throws_error(
      [&] {
        c.addmm_(zeros({2, 3}), zeros({3, 5}));
      },
      "c is f64 but a is f32"));
  EXPECT_TRUE(throws_error(
      [&] {
        addmm(zeros({5}, kF64), zeros({1, 3}, kF64), zeros({3, 5}, kF64));
      },
      "addmm: expected 2-D tensors"));
  EXPECT_TRUE(all_close(c, before));
  // A leaf that requires grad is not modified in place while gradients are recorded.
  Tensor leaf = zeros({2, 5}, kF64).set_requires_grad(true);
  EXPECT_TRUE(throws_error(
      [&] {
        leaf.addmm_(zeros({2, 3}, kF64), zeros({3, 5}, kF64));
      },
      "addmm_: a leaf tensor that requires grad"));
}

TEST(Linear, MatchesPyTorchWithBias) {
  // F.linear(pat((2,2,3)), pat((4,3), 4), pat((4,), 11))
  Tensor out = linear(pattern({2, 2, 3}), pattern({4, 3}, 4), pattern({4}, 11));
  EXPECT_TRUE(all_close(
      out, expected({0.890625, -0.3125, -0.71875, -0.59375, 0.46875, 0.671875, -0.71875, -1.578125,
                     0.84375, -0.203125, -0.71875, -0.703125, 0.421875, 0.78125, -0.71875, -1.6875},
                    {2, 2, 4})));
}

TEST(Linear, WithoutBiasEqualsMatmulWithTransposedWeight) {
  Tensor x = randn({5, 7}, kF64);
  Tensor w = randn({3, 7}, kF64);
  EXPECT_TRUE(all_close(linear(x, w), matmul(x, transpose(w, 0, 1)), 1e-12, 1e-12));
  // A 1-D input gives a 1-D output.
  Tensor v = randn({7}, kF64);
  EXPECT_EQ(linear(v, w).sizes(), (Shape{3}));
  EXPECT_TRUE(all_close(linear(v, w), matmul(w, v), 1e-12, 1e-12));
}

TEST(Linear, NonContiguousInputsGiveTheSameResult) {
  Tensor x = transpose(randn({4, 6, 3}, kF64), 0, 1);  // (6, 4, 3), leading dims not collapsible
  Tensor xt = transpose(randn({7, 6}, kF64), 0, 1);    // (6, 7) column-major
  Tensor w = randn({5, 3}, kF64);
  Tensor w7 = transpose(randn({7, 5}, kF64), 0, 1);  // (5, 7) transposed weight
  Tensor bias = slice(randn({10}, kF64), 0, 0, 10, 2);
  EXPECT_TRUE(
      all_close(linear(x, w, bias), linear(contiguous(x), w, contiguous(bias)), 1e-12, 1e-12));
  EXPECT_TRUE(all_close(linear(xt, w7), linear(contiguous(xt), contiguous(w7)), 1e-12, 1e-12));
}

TEST(Linear, GradientsMatchFiniteDifferences) {
  Tensor x = transpose(randn({3, 2, 4}, kF64), 0, 1).set_requires_grad(true);  // (2, 3, 4)
  Tensor w = randn({5, 4}, kF64).set_requires_grad(true);
  Tensor b = randn({5}, kF64).set_requires_grad(true);
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); },
                        {x, w, b}));
  Tensor v = randn({4}, kF64).set_requires_grad(true);
  EXPECT_TRUE(
      gradcheck([](const std::vector<Tensor>& in) { return linear(in[0], in[1]); }, {v, w}));
}

TEST(Linear, CostAndSplitsFollowTheRows) {
  const OpDef& op = ops::linear;
  OpCost cost = op.cost({zeros({2, 3, 4}), zeros({5, 4}), Tensor()}, {zeros({2, 3, 5})}, {});
  EXPECT_DOUBLE_EQ(cost.flops, 2.0 * 6 * 5 * 4);
  EXPECT_EQ(op.splits.at(0).input_dims, (std::vector<int>{0, -1, -1}));
}

TEST(Linear, BadShapesAndDtypesAreNamed) {
  EXPECT_TRUE(throws_error(
      [] {
        linear(zeros({2, 3}), zeros({5, 4}));
      },
      "linear: input has 3 features (last dim of shape [2, 3]) but weight "
      "expects 4 (weight shape [5, 4])"));
  EXPECT_TRUE(throws_error(
      [] {
        linear(zeros({2, 4}), zeros({5, 4}), zeros({4}));
      },
      "linear: bias has shape [4] but weight has 5 output features"));
  EXPECT_TRUE(throws_error([] { linear(zeros({2, 4}), zeros({4})); }, "weight must be 2-D"));
  EXPECT_TRUE(throws_error(
      [] {
        linear(zeros({2, 4}, DType::kInt32), zeros({5, 4}, DType::kInt32));
      },
      "got i32"));
}

TEST(Linear, SingleThreadGivesTheSameValues) {
  Tensor x = randn({64, 96});
  Tensor w = randn({80, 96});
  Tensor threaded = linear(x, w);
  int threads = get_num_threads();
  set_num_threads(1);
  Tensor serial = linear(x, w);
  set_num_threads(threads);
  EXPECT_TRUE(all_close(threaded, serial));
}

}  // namespace
}  // namespace tessel
