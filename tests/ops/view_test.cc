// View ops: geometry (sizes, strides, offsets), storage sharing, copies only where needed,
// gradients, and errors.
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

std::vector<double> values_of(const Tensor& t) { return t.to_vector<double>(); }

Tensor leaf(const Tensor& t) {
  Tensor copy = t;
  return copy.set_requires_grad(true);
}

TEST(View, SharesStorageWithTheBase) {
  Tensor x = iota({3, 4});
  Tensor v = x.view({4, 3});
  EXPECT_EQ(v.storage(), x.storage());
  EXPECT_EQ(v.sizes(), (Shape{4, 3}));
  EXPECT_EQ(v.strides(), (Shape{3, 1}));
  EXPECT_EQ(values_of(v), values_of(x));
}

TEST(View, WritesThroughASliceChangeTheBase) {
  Tensor x = zeros({3, 4}, kF64);
  x.slice(1, 1, 3).fill_(7.0);
  EXPECT_EQ(values_of(x), (std::vector<double>{0, 7, 7, 0, 0, 7, 7, 0, 0, 7, 7, 0}));
  x.select(0, 2).copy_(iota({4}));
  EXPECT_EQ(values_of(x), (std::vector<double>{0, 7, 7, 0, 0, 7, 7, 0, 0, 1, 2, 3}));
  x.transpose(0, 1).select(0, 0).fill_(-1.0);  // column 0
  EXPECT_EQ(values_of(x), (std::vector<double>{-1, 7, 7, 0, -1, 7, 7, 0, -1, 1, 2, 3}));
}

TEST(View, ErrorNamesTheShapeAndStridesWhenImpossible) {
  Tensor x = iota({3, 4}).t();
  EXPECT_TRUE(throws_error([&] { x.view({12}); }, "strides [1, 4]"));
  EXPECT_TRUE(throws_error([&] { x.view({12}); }, "shape [12]"));
  EXPECT_TRUE(throws_error([&] { x.view({12}); }, "reshape"));
}

TEST(View, WorksOnNonContiguousInputsWhenTheStridesAllow) {
  // Splitting or merging dims inside one contiguous chunk of a transposed tensor is a view.
  Tensor x = iota({4, 6}).t();  // (6, 4), strides (1, 6)
  Tensor v = x.view({2, 3, 4});
  EXPECT_EQ(v.storage(), x.storage());
  EXPECT_EQ(v.strides(), (Shape{3, 1, 6}));
  EXPECT_EQ(values_of(v), values_of(x));
}

TEST(Reshape, InfersOneMinusOne) {
  Tensor x = iota({2, 3, 4});
  EXPECT_EQ(x.reshape({-1, 4}).sizes(), (Shape{6, 4}));
  EXPECT_EQ(x.reshape({2, -1}).sizes(), (Shape{2, 12}));
  EXPECT_EQ(x.reshape({-1}).sizes(), (Shape{24}));
}

TEST(Reshape, CopiesOnlyWhenTheStridesForbidAView) {
  Tensor x = iota({3, 4});
  Tensor same = x.reshape({2, 6});
  EXPECT_EQ(same.storage(), x.storage());

  Tensor transposed = x.t();
  Tensor copied = transposed.reshape({12});
  EXPECT_NE(copied.storage(), x.storage());
  EXPECT_TRUE(copied.is_contiguous());
  EXPECT_EQ(values_of(copied), values_of(transposed));
}

TEST(Reshape, RejectsBadShapes) {
  Tensor x = iota({2, 3});
  EXPECT_TRUE(throws_error([&] { x.reshape({-1, -1}); }, "only one dimension can be -1"));
  EXPECT_TRUE(throws_error([&] { x.reshape({4, 2}); }, "invalid for an input of 6 elements"));
  EXPECT_TRUE(throws_error([&] { x.reshape({4, -1}); }, "shape [4, -1]"));
  EXPECT_TRUE(throws_error([&] { x.reshape({-2, 3}); }, "invalid size -2"));
}

TEST(Reshape, ZeroDimAndEmptyTensors) {
  Tensor scalar = scalar_tensor(5.0, kF64);
  EXPECT_EQ(scalar.reshape({1, 1}).sizes(), (Shape{1, 1}));
  EXPECT_EQ(scalar.reshape({1}).reshape({}).item<double>(), 5.0);
  Tensor empty_tensor = zeros({0, 3}, kF64);
  EXPECT_EQ(empty_tensor.reshape({3, 0}).sizes(), (Shape{3, 0}));
  EXPECT_TRUE(throws_error([&] { empty_tensor.reshape({-1, 0}); }, "cannot infer"));
}

TEST(Transpose, SwapsSizesAndStrides) {
  Tensor x = iota({2, 3, 4});
  Tensor y = x.transpose(0, 2);
  EXPECT_EQ(y.sizes(), (Shape{4, 3, 2}));
  EXPECT_EQ(y.strides(), (Shape{1, 4, 12}));
  EXPECT_EQ(y.storage_offset(), 0);
  EXPECT_FALSE(y.is_contiguous());
  Tensor dense = y.contiguous();
  EXPECT_TRUE(dense.is_contiguous());
  // y[i][j][k] = x[k][j][i] = 12k + 4j + i
  EXPECT_EQ(values_of(dense)[1 * 6 + 2 * 2 + 1], 12 * 1 + 4 * 2 + 1);
  EXPECT_EQ(x.transpose(-1, -3).strides(), y.strides());
}

TEST(Transpose, TIsForTwoDimensionsOnly) {
  EXPECT_EQ(iota({2, 3}).t().sizes(), (Shape{3, 2}));
  EXPECT_TRUE(throws_error([] { iota({2, 3, 4}).t(); }, "2-D"));
  EXPECT_TRUE(throws_error([] { iota({2, 3}).transpose(0, 2); }, "out of range"));
}

TEST(Permute, ReordersSizesAndStrides) {
  Tensor x = iota({2, 3, 4});
  Tensor y = x.permute({2, 0, 1});
  EXPECT_EQ(y.sizes(), (Shape{4, 2, 3}));
  EXPECT_EQ(y.strides(), (Shape{1, 12, 4}));
  Tensor dense = y.contiguous();
  // y[i][j][k] = x[j][k][i]
  EXPECT_EQ(values_of(dense)[3 * 6 + 1 * 3 + 2], 12 * 1 + 4 * 2 + 3);
  EXPECT_EQ(x.permute({-1, 0, 1}).strides(), y.strides());
}

TEST(Permute, RejectsAnythingButAPermutation) {
  Tensor x = iota({2, 3, 4});
  EXPECT_TRUE(throws_error([&] { x.permute({0, 0, 1}); }, "appears twice"));
  EXPECT_TRUE(throws_error([&] { x.permute({0, 1}); }, "got 2 dims"));
  EXPECT_TRUE(throws_error([&] { x.permute({0, 1, 3}); }, "out of range"));
}

TEST(Slice, StepMultipliesTheStrideAndStartMovesTheOffset) {
  Tensor x = iota({10});
  Tensor y = x.slice(0, 1, 8, 3);
  EXPECT_EQ(y.sizes(), (Shape{3}));
  EXPECT_EQ(y.strides(), (Shape{3}));
  EXPECT_EQ(y.storage_offset(), 1);
  EXPECT_EQ(values_of(y), (std::vector<double>{1, 4, 7}));
  EXPECT_EQ(values_of(y.contiguous()), (std::vector<double>{1, 4, 7}));

  Tensor m = iota({4, 5});
  Tensor columns = m.slice(1, 1, 5, 2);
  EXPECT_EQ(columns.sizes(), (Shape{4, 2}));
  EXPECT_EQ(columns.strides(), (Shape{5, 2}));
  EXPECT_EQ(columns.storage_offset(), 1);
  EXPECT_EQ(values_of(columns.contiguous()), (std::vector<double>{1, 3, 6, 8, 11, 13, 16, 18}));
}

TEST(Slice, ClampsAndWrapsLikePython) {
  Tensor x = iota({10});
  EXPECT_EQ(values_of(x.slice(0, -3, 100)), (std::vector<double>{7, 8, 9}));
  EXPECT_EQ(values_of(x.slice(0, -100, 2)), (std::vector<double>{0, 1}));
  EXPECT_EQ(x.slice(0, 20, 30).numel(), 0);
  EXPECT_EQ(x.slice(0, 6, 3).numel(), 0);
  EXPECT_EQ(values_of(x.slice(0, 0, -8)), (std::vector<double>{0, 1}));
  EXPECT_TRUE(throws_error([&] { x.slice(0, 0, 5, 0); }, "step must be positive"));
  EXPECT_TRUE(throws_error([&] { x.slice(1, 0, 5); }, "out of range"));
}

TEST(Narrow, IsASliceOfGivenLength) {
  Tensor x = iota({3, 5});
  Tensor y = x.narrow(1, 2, 3);
  EXPECT_EQ(y.sizes(), (Shape{3, 3}));
  EXPECT_EQ(y.storage_offset(), 2);
  EXPECT_EQ(values_of(x.narrow(0, -1, 1)), (std::vector<double>{10, 11, 12, 13, 14}));
  EXPECT_TRUE(throws_error([&] { x.narrow(1, 3, 3); }, "exceeds dimension 1 of size 5"));
}

TEST(Select, RemovesTheDimension) {
  Tensor x = iota({3, 4});
  Tensor column = x.select(1, -1);
  EXPECT_EQ(column.sizes(), (Shape{3}));
  EXPECT_EQ(column.strides(), (Shape{4}));
  EXPECT_EQ(column.storage_offset(), 3);
  EXPECT_EQ(values_of(column.contiguous()), (std::vector<double>{3, 7, 11}));
  Tensor row = x.select(0, 1);
  EXPECT_EQ(row.strides(), (Shape{1}));
  EXPECT_EQ(row.storage_offset(), 4);
  EXPECT_EQ(row.select(0, 2).dim(), 0);
  EXPECT_EQ(row.select(0, 2).item<double>(), 6.0);
}

TEST(Select, RejectsAnOutOfRangeIndex) {
  Tensor x = iota({3, 4});
  EXPECT_TRUE(throws_error([&] { x.select(0, 3); },
                           "index 3 is out of range for dimension 0 of "
                           "size 3"));
  EXPECT_TRUE(throws_error([&] { x.select(1, -5); }, "index -5"));
  EXPECT_TRUE(throws_error([&] { scalar_tensor(1.0).select(0, 0); }, "0-d"));
}

TEST(Expand, UsesZeroStridesForExpandedAndNewDims) {
  Tensor x = iota({3, 1});
  Tensor y = x.expand({2, 3, 4});
  EXPECT_EQ(y.sizes(), (Shape{2, 3, 4}));
  EXPECT_EQ(y.strides(), (Shape{0, 1, 0}));
  EXPECT_EQ(y.storage(), x.storage());
  EXPECT_TRUE(y.has_internal_overlap());
  Tensor dense = y.contiguous();
  EXPECT_EQ(values_of(dense)[1 * 12 + 2 * 4 + 3], 2.0);
  EXPECT_EQ(x.expand({-1, 5}).sizes(), (Shape{3, 5}));
}

TEST(Expand, RejectsIncompatibleSizes) {
  Tensor x = iota({3, 1});
  EXPECT_TRUE(throws_error([&] { x.expand({4, 4}); }, "cannot expand shape [3, 1] to [4, 4]"));
  EXPECT_TRUE(throws_error([&] { x.expand({3}); }, "fewer dimensions"));
  EXPECT_TRUE(throws_error([&] { x.expand({-1, 3, 1}); }, "-1 is only allowed"));
}

TEST(Expand, InPlaceWritesIntoAnExpandedViewAreRefused) {
  Tensor x = zeros({3, 1}, kF64);
  Tensor y = x.expand({3, 4});
  EXPECT_TRUE(throws_error([&] { y.fill_(1.0); }, "expanded view"));
  EXPECT_TRUE(throws_error([&] { y.copy_(iota({3, 4})); }, "expanded view"));
}

TEST(SqueezeUnsqueeze, RemoveAndInsertSizeOneDims) {
  Tensor x = iota({2, 1, 3});
  Tensor squeezed = x.squeeze(1);
  EXPECT_EQ(squeezed.sizes(), (Shape{2, 3}));
  EXPECT_EQ(squeezed.strides(), (Shape{3, 1}));
  EXPECT_EQ(x.squeeze(0).sizes(), x.sizes());  // size 2: unchanged, like PyTorch
  EXPECT_EQ(x.squeeze(-2).sizes(), (Shape{2, 3}));

  Tensor t = iota({2, 3}).t();  // (3, 2), strides (1, 3)
  EXPECT_EQ(t.unsqueeze(0).sizes(), (Shape{1, 3, 2}));
  EXPECT_EQ(t.unsqueeze(0).strides(), (Shape{3, 1, 3}));
  EXPECT_EQ(t.unsqueeze(2).sizes(), (Shape{3, 2, 1}));
  EXPECT_EQ(t.unsqueeze(2).strides(), (Shape{1, 3, 1}));
  EXPECT_EQ(t.unsqueeze(-1).sizes(), (Shape{3, 2, 1}));
  EXPECT_EQ(values_of(t.unsqueeze(1).contiguous()), values_of(t.contiguous()));
  EXPECT_TRUE(throws_error([&] { t.unsqueeze(4); }, "out of range"));
  EXPECT_TRUE(throws_error([&] { t.squeeze(2); }, "out of range"));
}

TEST(Flatten, MergesARangeOfDims) {
  Tensor x = iota({2, 3, 4, 5});
  EXPECT_EQ(x.flatten().sizes(), (Shape{120}));
  EXPECT_EQ(x.flatten(1).sizes(), (Shape{2, 60}));
  EXPECT_EQ(x.flatten(1, 2).sizes(), (Shape{2, 12, 5}));
  EXPECT_EQ(x.flatten(1, 2).storage(), x.storage());
  EXPECT_EQ(scalar_tensor(1.0).flatten().sizes(), (Shape{1}));
  EXPECT_TRUE(throws_error([&] { x.flatten(2, 1); }, "comes after"));
}

TEST(Views, WorkOnTheMetaDevice) {
  Tensor x = empty({2, 3, 4}, TensorOptions(kF64).device(Device::meta()));
  EXPECT_EQ(x.transpose(0, 1).reshape({3, 8}).sizes(), (Shape{3, 8}));
  EXPECT_EQ(x.slice(2, 0, 4, 2).select(0, 1).sizes(), (Shape{3, 2}));
  EXPECT_EQ(x.unsqueeze(0).expand({5, 2, 3, 4}).sizes(), (Shape{5, 2, 3, 4}));
  EXPECT_TRUE(x.permute({2, 1, 0}).device().is_meta());
}

TEST(Views, ContiguousOfAContiguousTensorIsItself) {
  Tensor x = iota({2, 3});
  EXPECT_TRUE(x.contiguous().is_same(x));
  EXPECT_FALSE(x.t().contiguous().is_same(x));
}

TEST(ViewGradients, ReshapeAndView) {
  Tensor x = leaf(randn({3, 4}, kF64));
  EXPECT_TRUE(gradcheck([](auto& in) { return in[0].reshape({2, -1, 2}); }, {x}));
  EXPECT_TRUE(gradcheck([](auto& in) { return in[0].view({4, 3}); }, {x}));
  // A transposed input makes reshape copy; the gradient still flows to the leaf.
  Tensor t = leaf(randn({4, 3}, kF64).t());
  EXPECT_TRUE(gradcheck([](auto& in) { return in[0].reshape({12}); }, {t}));
  EXPECT_TRUE(gradcheck([](auto& in) { return in[0].flatten(); }, {t}));
}

TEST(ViewGradients, TransposeAndPermute) {
  Tensor x = leaf(randn({2, 3, 4}, kF64));
  EXPECT_TRUE(gradcheck([](auto& in) { return in[0].transpose(0, 2); }, {x}));
  EXPECT_TRUE(gradcheck([](auto& in) { return in[0].permute({1, 2, 0}); }, {x}));
  EXPECT_TRUE(gradcheck([](auto& in) { return in[0].permute({-1, 0, 1}); }, {x}));
  Tensor t = leaf(randn({4, 3}, kF64).t());
  EXPECT_TRUE(gradcheck([](auto& in) { return in[0].t(); }, {t}));
}

TEST(ViewGradients, SliceSelectAndNarrow) {
  Tensor x = leaf(randn({5, 6}, kF64));
  EXPECT_TRUE(gradcheck([](auto& in) { return in[0].slice(1, 1, 6, 2); }, {x}));
  EXPECT_TRUE(gradcheck([](auto& in) { return in[0].slice(0, -3, 100); }, {x}));
  EXPECT_TRUE(gradcheck([](auto& in) { return in[0].select(1, -2); }, {x}));
  EXPECT_TRUE(gradcheck([](auto& in) { return in[0].narrow(0, 1, 2); }, {x}));
  Tensor t = leaf(randn({6, 5}, kF64).t());
  EXPECT_TRUE(gradcheck([](auto& in) { return in[0].slice(0, 0, 5, 3).select(1, 4); }, {t}));
}

TEST(ViewGradients, ExpandSumsOverExpandedDims) {
  Tensor x = leaf(randn({3, 1}, kF64));
  EXPECT_TRUE(gradcheck([](auto& in) { return in[0].expand({2, 3, 4}); }, {x}));
  Tensor middle = leaf(randn({2, 1, 3}, kF64));
  EXPECT_TRUE(gradcheck([](auto& in) { return in[0].expand({2, 5, 3}); }, {middle}));
  Tensor y = expand(middle, {2, 5, 3});
  y.sum().backward();
  EXPECT_TRUE(all_close(middle.grad(), full({2, 1, 3}, 5.0, kF64)));
}

TEST(ViewGradients, SqueezeAndUnsqueeze) {
  Tensor x = leaf(randn({2, 1, 3}, kF64));
  EXPECT_TRUE(gradcheck([](auto& in) { return in[0].squeeze(1); }, {x}));
  EXPECT_TRUE(gradcheck([](auto& in) { return in[0].unsqueeze(3); }, {x}));
  Tensor t = leaf(randn({3, 2}, kF64).t());
  EXPECT_TRUE(gradcheck([](auto& in) { return in[0].unsqueeze(1); }, {t}));
}

TEST(ViewGradients, SliceGradientIsZeroOutsideTheSlice) {
  Tensor x = leaf(zeros({4}, kF64));
  x.slice(0, 1, 4, 2).sum().backward();
  EXPECT_EQ(values_of(x.grad()), (std::vector<double>{0, 1, 0, 1}));
}

TEST(ViewGradients, SliceBackwardOfALargeGradientMatchesAReference) {
  Tensor x = leaf(zeros({300, 500}, kF64));
  Tensor grad = randn({100, 500}, kF64);
  x.slice(0, 1, 300, 3).backward(grad);
  std::vector<double> g = grad.to_vector<double>();
  std::vector<double> expected(300 * 500, 0.0);
  for (int64_t r = 0; r < 100; ++r)
    for (int64_t c = 0; c < 500; ++c) expected[(1 + 3 * r) * 500 + c] = g[r * 500 + c];
  EXPECT_EQ(values_of(x.grad()), expected);
}

TEST(TensorMethods, ConvertDTypeAndDevice) {
  Tensor x = iota({2, 3}, DType::kFloat32);
  EXPECT_TRUE(x.to(DType::kFloat32).is_same(x));
  Tensor y = x.to(kF64);
  EXPECT_EQ(y.dtype(), kF64);
  EXPECT_EQ(values_of(y), values_of(x));
  EXPECT_TRUE(x.to(Device::cpu()).is_same(x));
  Tensor meta = x.to(Device::meta());
  EXPECT_TRUE(meta.device().is_meta());
  EXPECT_EQ(meta.sizes(), x.sizes());
  EXPECT_EQ(meta.dtype(), x.dtype());
  EXPECT_TRUE(throws_error([&] { meta.to(Device::cpu()); }, "no data"));
  if (OpRegistry::get().find_or_null("to_device") == nullptr) {
    EXPECT_TRUE(throws_error([&] { x.to(Device::cuda()); }, "CUDA backend is not built"));
  }
}

TEST(TensorMethods, InPlaceUpdates) {
  Tensor x = iota({2, 2});
  x.mul_(2.0);
  EXPECT_EQ(values_of(x), (std::vector<double>{0, 2, 4, 6}));
  x.add_(ones({2, 2}, kF64), 0.5);
  EXPECT_EQ(values_of(x), (std::vector<double>{0.5, 2.5, 4.5, 6.5}));
  x.zero_();
  EXPECT_EQ(values_of(x), (std::vector<double>{0, 0, 0, 0}));
  x.t().copy_(iota({2, 2}));
  EXPECT_EQ(values_of(x), (std::vector<double>{0, 2, 1, 3}));
  Tensor c = x.clone();
  EXPECT_NE(c.storage(), x.storage());
  EXPECT_EQ(values_of(c), values_of(x));
}

TEST(TensorMethods, ReductionsAndMatmul) {
  Tensor x = iota({2, 3});
  EXPECT_EQ(x.sum().item<double>(), 15.0);
  EXPECT_EQ(x.mean().item<double>(), 2.5);
  EXPECT_EQ(values_of(x.sum({1})), (std::vector<double>{3, 12}));
  EXPECT_EQ(x.mean({0}, true).sizes(), (Shape{1, 3}));
  EXPECT_EQ(values_of(x.matmul(x.t())), (std::vector<double>{5, 14, 14, 50}));
}

}  // namespace
}  // namespace tessel
