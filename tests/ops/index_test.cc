// Joining and indexing ops: cat, stack, split, chunk, index_select, gather, embedding. Forward
// values, gradients (also with non-contiguous inputs) and errors.
#include "ops/index.h"

#include <numeric>

#include "core/autograd.h"
#include "ops/ops.h"
#include "tests/ops/patterns.h"
#include "tests/testing.h"

namespace tessel {
namespace {

using testing::all_close;
using testing::gradcheck;
using testing::iota;
using testing::kF64;
using testing::throws_error;

Tensor indices(const std::vector<int64_t>& values, const Shape& sizes) {
  return from_vector<int64_t>(values, sizes);
}

std::vector<double> values_of(const Tensor& t) { return t.to_vector<double>(); }

Tensor leaf(const Tensor& t) {
  Tensor copy = t;
  return copy.set_requires_grad(true);
}

TEST(Cat, JoinsAlongAnyDim) {
  Tensor a = iota({2, 2});
  Tensor b = iota({1, 2});
  Tensor rows = cat({a, b}, 0);
  EXPECT_EQ(rows.sizes(), (Shape{3, 2}));
  EXPECT_EQ(values_of(rows), (std::vector<double>{0, 1, 2, 3, 0, 1}));
  Tensor columns = cat({a, iota({2, 3}), a}, -1);
  EXPECT_EQ(columns.sizes(), (Shape{2, 7}));
  EXPECT_EQ(values_of(columns), (std::vector<double>{0, 1, 0, 1, 2, 0, 1, 2, 3, 3, 4, 5, 2, 3}));
}

TEST(Cat, ReadsNonContiguousInputs) {
  Tensor a = iota({3, 2}).t();                // (2, 3)
  Tensor b = iota({2, 6}).slice(1, 0, 6, 2);  // (2, 3), stride 2
  Tensor joined = cat({a, b}, 0);
  EXPECT_EQ(values_of(joined), (std::vector<double>{0, 2, 4, 1, 3, 5, 0, 2, 4, 6, 8, 10}));
}

TEST(Cat, WorksForIntegerTensors) {
  Tensor joined = cat({indices({1, 2}, {2}), indices({3}, {1})});
  EXPECT_EQ(joined.dtype(), DType::kInt64);
  EXPECT_EQ(joined.to_vector<int64_t>(), (std::vector<int64_t>{1, 2, 3}));
}

TEST(Cat, GradientsSplitBackToEachInput) {
  Tensor a = leaf(randn({2, 3}, kF64));
  Tensor b = leaf(randn({4, 2}, kF64).t());  // non-contiguous (2, 4)
  EXPECT_TRUE(gradcheck([](auto& in) { return cat({in[0], in[1]}, 1); }, {a, b}));
  Tensor c = leaf(randn({3, 3}, kF64));
  EXPECT_TRUE(gradcheck([](auto& in) { return cat({in[0], in[1].t()}, 0); }, {a, c}));
}

TEST(Cat, NamesMismatchedShapesAndDTypes) {
  Tensor a = iota({2, 3});
  EXPECT_TRUE(throws_error(
      [&] {
        cat({a, iota({2, 4})}, 0);
      },
      "tensor 1 has shape [2, 4] but tensor 0 has shape [2, 3]"));
  EXPECT_TRUE(throws_error([&] { cat({a, iota({6})}, 0); }, "tensor 1 has shape [6]"));
  EXPECT_TRUE(throws_error(
      [&] {
        cat({a, iota({2, 3}, DType::kFloat32)}, 0);
      },
      "tensor 1 has dtype f32 but tensor 0 has dtype f64"));
  EXPECT_TRUE(throws_error([&] { cat({}, 0); }, "at least one tensor"));
  EXPECT_TRUE(throws_error([&] { cat({a, a}, 2); }, "out of range"));
}

TEST(Stack, InsertsANewDim) {
  Tensor a = iota({2, 3});
  Tensor b = iota({2, 3}) * 10.0;
  EXPECT_EQ(stack({a, b}).sizes(), (Shape{2, 2, 3}));
  Tensor last = stack({a, b}, -1);
  EXPECT_EQ(last.sizes(), (Shape{2, 3, 2}));
  EXPECT_EQ(values_of(last.select(2, 1)), values_of(b));
  EXPECT_EQ(values_of(stack({a, b}, 1).select(1, 0)), values_of(a));
  EXPECT_TRUE(throws_error(
      [&] {
        stack({a, iota({3, 2})});
      },
      "tensor 1 has shape [3, 2] but tensor 0 has shape [2, 3]"));
  EXPECT_TRUE(throws_error([&] { stack({a, b}, 3); }, "out of range"));
}

TEST(Stack, Gradients) {
  Tensor a = leaf(randn({2, 3}, kF64));
  Tensor b = leaf(randn({3, 2}, kF64).t());
  EXPECT_TRUE(gradcheck([](auto& in) { return stack({in[0], in[1]}, 1); }, {a, b}));
}

TEST(Split, ReturnsViewsAndALastSmallerPiece) {
  Tensor x = iota({5, 2});
  std::vector<Tensor> parts = split(x, 2);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0].sizes(), (Shape{2, 2}));
  EXPECT_EQ(parts[2].sizes(), (Shape{1, 2}));
  EXPECT_EQ(parts[1].storage(), x.storage());
  EXPECT_EQ(values_of(parts[2]), (std::vector<double>{8, 9}));
  std::vector<Tensor> columns = split(x, 1, 1);
  ASSERT_EQ(columns.size(), 2u);
  EXPECT_EQ(values_of(columns[1]), (std::vector<double>{1, 3, 5, 7, 9}));
  EXPECT_TRUE(throws_error([&] { split(x, 0); }, "split_size must be positive"));
}

TEST(Chunk, SplitsLikePyTorch) {
  Tensor x = iota({5});
  std::vector<Tensor> three = chunk(x, 3);
  ASSERT_EQ(three.size(), 3u);
  EXPECT_EQ(three[0].numel(), 2);
  EXPECT_EQ(three[2].numel(), 1);
  // ceil(6 / 4) = 2, so only three chunks come back, as in PyTorch.
  EXPECT_EQ(chunk(iota({6}), 4).size(), 3u);
  EXPECT_EQ(chunk(iota({2, 8}), 4, 1)[3].sizes(), (Shape{2, 2}));
  EXPECT_TRUE(throws_error([&] { chunk(x, 0); }, "chunks must be positive"));
}

TEST(Split, GradientsFlowThroughEveryPiece) {
  Tensor x = leaf(randn({5, 3}, kF64));
  EXPECT_TRUE(gradcheck(
      [](auto& in) {
        auto parts = split(in[0], 2);
        return cat({parts[2], parts[0] * 2.0, parts[1]}, 0);
      },
      {x}));
  Tensor t = leaf(randn({3, 6}, kF64).t());
  EXPECT_TRUE(gradcheck(
      [](auto& in) {
        auto parts = chunk(in[0], 3, 0);
        return parts[0] * parts[2];
      },
      {t}));
}

TEST(IndexSelect, PicksRowsAndColumns) {
  Tensor x = iota({4, 3});
  Tensor rows = index_select(x, 0, indices({3, 0, 3}, {3}));
  EXPECT_EQ(rows.sizes(), (Shape{3, 3}));
  EXPECT_EQ(values_of(rows), (std::vector<double>{9, 10, 11, 0, 1, 2, 9, 10, 11}));
  Tensor columns = index_select(x, 1, from_vector<int32_t>({2, 1}, {2}));
  EXPECT_EQ(values_of(columns), (std::vector<double>{2, 1, 5, 4, 8, 7, 11, 10}));
  Tensor from_transposed = index_select(x.t(), 1, indices({1}, {1}));
  EXPECT_EQ(values_of(from_transposed), (std::vector<double>{3, 4, 5}));
  EXPECT_EQ(index_select(x, 0, indices({}, {0})).sizes(), (Shape{0, 3}));
}

TEST(IndexSelect, GradientsAccumulateRepeatedIndices) {
  Tensor x = leaf(randn({4, 3}, kF64));
  Tensor index = indices({3, 0, 3, 3}, {4});
  EXPECT_TRUE(gradcheck([&](auto& in) { return index_select(in[0], 0, index); }, {x}));
  Tensor small = indices({2, 0, 2}, {3});
  EXPECT_TRUE(gradcheck([&](auto& in) { return index_select(in[0], 1, small); }, {x}));
  Tensor t = leaf(randn({3, 2, 4}, kF64).permute({2, 0, 1}));
  EXPECT_TRUE(gradcheck([&](auto& in) { return index_select(in[0], 1, small); }, {t}));

  Tensor y = leaf(zeros({3}, kF64));
  index_select(y, 0, indices({2, 2, 0}, {3})).sum().backward();
  EXPECT_EQ(values_of(y.grad()), (std::vector<double>{1, 0, 2}));
}

TEST(IndexSelect, RejectsBadIndices) {
  Tensor x = iota({4, 3});
  EXPECT_TRUE(throws_error(
      [&] {
        index_select(x, 0, indices({1, 4}, {2}));
      },
      "index 4 is out of range for dimension 0 of size 4"));
  EXPECT_TRUE(throws_error([&] { index_select(x, 1, indices({-1}, {1})); }, "index -1"));
  EXPECT_TRUE(throws_error([&] { index_select(x, 0, indices({0, 1}, {1, 2})); }, "must be 1-D"));
  EXPECT_TRUE(throws_error([&] { index_select(x, 0, iota({2})); }, "must be i64 or i32"));
  EXPECT_TRUE(throws_error([&] { index_select(x, 2, indices({0}, {1})); }, "out of range"));
}

TEST(Gather, PicksAlongADim) {
  Tensor x = iota({2, 3});  // [[0,1,2],[3,4,5]]
  Tensor along_columns = gather(x, 1, indices({2, 0, 1, 1}, {2, 2}));
  EXPECT_EQ(values_of(along_columns), (std::vector<double>{2, 0, 4, 4}));
  Tensor along_rows = gather(x, 0, indices({1, 0, 1}, {1, 3}));
  EXPECT_EQ(values_of(along_rows), (std::vector<double>{3, 1, 5}));
  // index may be longer than the input along dim.
  EXPECT_EQ(values_of(gather(x, 1, indices({0, 0, 0, 0}, {1, 4}))),
            (std::vector<double>{0, 0, 0, 0}));
  Tensor transposed = gather(x.t(), 0, indices({2, 0}, {1, 2}));  // x.t() = [[0,3],[1,4],[2,5]]
  EXPECT_EQ(values_of(transposed), (std::vector<double>{2, 3}));
}

TEST(Gather, GradientsScatterAdd) {
  Tensor x = leaf(randn({3, 4}, kF64));
  Tensor index = indices({0, 3, 3, 1, 2, 2, 0, 0, 1}, {3, 3});
  EXPECT_TRUE(gradcheck([&](auto& in) { return gather(in[0], 1, index); }, {x}));
  Tensor rows = indices({0, 2, 2, 1, 1, 0, 2, 0, 1}, {3, 3});
  EXPECT_TRUE(gradcheck([&](auto& in) { return gather(in[0], 0, rows.t()); }, {x}));
  Tensor t = leaf(randn({4, 3}, kF64).t());
  EXPECT_TRUE(gradcheck([&](auto& in) { return gather(in[0], 1, index); }, {t}));
}

TEST(Gather, RejectsBadIndices) {
  Tensor x = iota({2, 3});
  EXPECT_TRUE(throws_error(
      [&] {
        gather(x, 1, indices({3}, {1, 1}));
      },
      "index 3 is out of range for dimension 1 of size 3"));
  EXPECT_TRUE(throws_error([&] { gather(x, 1, indices({0, 1}, {2})); }, "index has 1 dimensions"));
  EXPECT_TRUE(throws_error(
      [&] {
        gather(x, 1, indices({0, 0, 0}, {3, 1}));
      },
      "exceeds input shape [2, 3] in dimension 0"));
}

TEST(Embedding, LooksUpRows) {
  Tensor weight = iota({5, 2});
  Tensor ids = indices({4, 0, 4, 1, 2, 3}, {2, 3});
  Tensor out = embedding(weight, ids);
  EXPECT_EQ(out.sizes(), (Shape{2, 3, 2}));
  EXPECT_EQ(values_of(out), (std::vector<double>{8, 9, 0, 1, 8, 9, 2, 3, 4, 5, 6, 7}));
  Tensor from_i32 = embedding(weight, from_vector<int32_t>({1}, {}));
  EXPECT_EQ(from_i32.sizes(), (Shape{2}));
  EXPECT_EQ(values_of(from_i32), (std::vector<double>{2, 3}));
  Tensor tied = embedding(iota({2, 5}).t(), indices({3}, {1}));  // non-contiguous weight
  EXPECT_EQ(values_of(tied), (std::vector<double>{3, 8}));
}

TEST(Embedding, GradientsAccumulateRowsAndSkipPadding) {
  Tensor weight = leaf(randn({5, 3}, kF64));
  Tensor ids = indices({4, 0, 4, 1, 2, 4}, {2, 3});
  EXPECT_TRUE(gradcheck([&](auto& in) { return embedding(in[0], ids); }, {weight}));
  Tensor transposed = leaf(randn({3, 5}, kF64).t());
  EXPECT_TRUE(gradcheck([&](auto& in) { return embedding(in[0], ids.t()); }, {transposed}));

  Tensor table = leaf(zeros({5, 2}, kF64));
  embedding(table, ids, /*padding_idx=*/4).sum().backward();
  EXPECT_EQ(values_of(table.grad()), (std::vector<double>{1, 1, 1, 1, 1, 1, 0, 0, 0, 0}));
  Tensor unpadded = leaf(zeros({5, 2}, kF64));
  embedding(unpadded, ids).sum().backward();
  EXPECT_EQ(values_of(unpadded.grad()), (std::vector<double>{1, 1, 1, 1, 1, 1, 0, 0, 3, 3}));
}

TEST(Embedding, RejectsBadInputs) {
  Tensor weight = iota({5, 2});
  EXPECT_TRUE(throws_error([&] { embedding(weight, indices({5}, {1})); },
                           "index 5 is out of range for an embedding table of size 5"));
  EXPECT_TRUE(throws_error([&] { embedding(weight, indices({-2}, {1})); }, "index -2"));
  EXPECT_TRUE(throws_error([&] { embedding(iota({5}), indices({0}, {1})); }, "must be 2-D"));
  EXPECT_TRUE(throws_error([&] { embedding(weight, iota({2})); }, "must be i64 or i32"));
  EXPECT_TRUE(throws_error([&] { embedding(weight, indices({0}, {1}), 5); }, "padding_idx 5"));
}

TEST(Indexing, ShapesOnTheMetaDevice) {
  TensorOptions meta = TensorOptions(kF64).device(Device::meta());
  Tensor a = empty({2, 3}, meta);
  EXPECT_EQ(cat({a, empty({4, 3}, meta)}).sizes(), (Shape{6, 3}));
  Tensor ids = empty({7, 4}, TensorOptions(DType::kInt64).device(Device::meta()));
  EXPECT_EQ(embedding(empty({10, 5}, meta), ids).sizes(), (Shape{7, 4, 5}));
  EXPECT_EQ(gather(empty({7, 9}, meta), 1, ids).sizes(), (Shape{7, 4}));
}

TEST(Indexing, KernelsWriteIntoStridedOutputs) {
  // A split op writes chunks into slices of one output: every kernel must honour out= strides.
  NoGradGuard no_grad;
  Tensor big = zeros({4, 6}, kF64);
  Tensor target = big.slice(1, 0, 6, 2);  // (4, 3), strides (6, 2)
  dispatch(ops::cat, {iota({1, 3}), iota({3, 3})}, Attrs{{"dim", int64_t{0}}}, {target});
  EXPECT_EQ(values_of(target), (std::vector<double>{0, 1, 2, 0, 1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(values_of(big.select(1, 1)), (std::vector<double>{0, 0, 0, 0}));

  Tensor transposed = zeros({3, 4}, kF64).t();  // (4, 3)
  dispatch(ops::index_select, {iota({5, 3}), indices({4, 0, 1, 4}, {4})},
           Attrs{{"dim", int64_t{0}}}, {transposed});
  EXPECT_EQ(values_of(transposed),
            values_of(index_select(iota({5, 3}), 0, indices({4, 0, 1, 4}, {4}))));

  Tensor rows = zeros({2, 3}, kF64).t();  // (3, 2)
  dispatch(ops::embedding, {iota({4, 2}), indices({3, 1, 0}, {3})},
           Attrs{{"padding_idx", int64_t{-1}}}, {rows});
  EXPECT_EQ(values_of(rows), (std::vector<double>{6, 7, 2, 3, 0, 1}));

  Tensor gathered = zeros({2, 2}, kF64).t();
  dispatch(ops::gather, {iota({2, 3}), indices({2, 0, 1, 1}, {2, 2})}, Attrs{{"dim", int64_t{1}}},
           {gathered});
  EXPECT_EQ(values_of(gathered), (std::vector<double>{2, 0, 4, 4}));
}

TEST(Embedding, LargeTablesMatchAReferenceLoop) {
  // Big enough that the kernels run on several threads.
  const int64_t rows = 300, columns = 700, count = 2000;
  Tensor weight = randn({rows, columns}, kF64);
  Tensor ids = randint(0, rows, {count});
  Tensor grad = randn({count, columns}, kF64);
  std::vector<double> w = weight.to_vector<double>();
  std::vector<int64_t> id = ids.to_vector<int64_t>();
  std::vector<double> g = grad.to_vector<double>();

  std::vector<double> expected_out(static_cast<size_t>(count * columns));
  std::vector<double> expected_grad(static_cast<size_t>(rows * columns), 0.0);
  for (int64_t i = 0; i < count; ++i) {
    for (int64_t c = 0; c < columns; ++c) {
      expected_out[i * columns + c] = w[id[i] * columns + c];
      if (id[i] != 7) expected_grad[id[i] * columns + c] += g[i * columns + c];
    }
  }
  EXPECT_EQ(embedding(weight, ids).to_vector<double>(), expected_out);
  Tensor table = leaf(weight.clone());
  embedding(table, ids, /*padding_idx=*/7).backward(grad);
  EXPECT_TRUE(
      all_close(table.grad(), from_vector<double>(expected_grad, {rows, columns}), 1e-12, 1e-12));
}

TEST(Embedding, IsSplittableAlongTheIndices) {
  const OpDef& op = ops::embedding;
  ASSERT_EQ(op.splits.size(), 1u);
  EXPECT_EQ(op.splits[0].output_dim, 0);
  EXPECT_EQ(op.splits[0].input_dims, (std::vector<int>{-1, 0}));
}

}  // namespace
}  // namespace tessel
