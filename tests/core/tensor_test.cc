#include "core/tensor.h"

#include "core/allocator.h"
#include "gtest/gtest.h"
#include "ops/ops.h"
#include "tests/testing.h"

namespace tessel {
namespace {

using testing::throws_error;

TEST(Tensor, FromVectorIsRowMajorAndContiguous) {
  Tensor t = tensor({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(t.sizes(), (Shape{2, 3}));
  EXPECT_EQ(t.strides(), (Shape{3, 1}));
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.nbytes(), 24u);
  EXPECT_EQ(t.dtype(), DType::kFloat32);
  EXPECT_EQ(t.device(), Device::cpu());
}

TEST(Tensor, ValuesOfAStridedViewComeOutInRowMajorOrder) {
  Tensor t = tensor({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor transposed = make_view(t, {3, 2}, {1, 3}, 0);
  EXPECT_FALSE(transposed.is_contiguous());
  EXPECT_EQ(transposed.to_vector<float>(), (std::vector<float>{1, 4, 2, 5, 3, 6}));
  Tensor broadcast = make_view(t, {2, 3}, {0, 1}, 3);
  EXPECT_TRUE(broadcast.has_internal_overlap());
  EXPECT_EQ(broadcast.to_vector<float>(), (std::vector<float>{4, 5, 6, 4, 5, 6}));
}

TEST(Tensor, AnEmptyTensorIsContiguousWhateverItsStrides) {
  // contiguous_strides gives [3, 1] for [0, 3] and [1, 1] for [3, 0]: both hold no element.
  for (const Shape& sizes : {Shape{0, 3}, Shape{3, 0}, Shape{2, 0, 4}}) {
    Tensor empty_tensor = zeros(sizes);
    EXPECT_TRUE(empty_tensor.is_contiguous()) << shape_str(sizes);
    EXPECT_EQ(empty_tensor.clone().sizes(), sizes);
  }
}

TEST(Tensor, RawBytesNeedAnAccessScope) {
  Tensor t = tensor({1, 2}, {2});
  EXPECT_TRUE(throws_error([&] { t.data_ptr<float>(); }, "outside an access scope"));
  StorageAccess access(*t.storage());
  EXPECT_EQ(t.data_ptr<float>()[1], 2.0f);
  EXPECT_TRUE(throws_error([&] { t.data_ptr<double>(); }, "tensor has dtype f32, asked for f64"));
}

TEST(Tensor, UserReferencesCountTensorsNotHandles) {
  Tensor t = tensor({1, 2}, {2});
  auto storage = t.storage();
  EXPECT_EQ(storage->user_refs(), 1);
  Tensor handle_copy = t;
  EXPECT_EQ(storage->user_refs(), 1);
  Tensor alias = t.detach();
  EXPECT_EQ(storage->user_refs(), 2);
  alias = Tensor();
  EXPECT_EQ(storage->user_refs(), 1);
}

TEST(Tensor, AllocationsAreCountedAndFreed) {
  auto allocator = memory::allocator_for(Device::cpu());
  int64_t before = allocator->stats().allocated_bytes;
  {
    Tensor t = empty({1000}, DType::kFloat64);
    EXPECT_EQ(allocator->stats().allocated_bytes, before + 8000);
  }
  EXPECT_EQ(allocator->stats().allocated_bytes, before);
}

TEST(Tensor, BadInputsGiveClearErrors) {
  EXPECT_TRUE(throws_error([] { tensor({1, 2, 3}, {2, 2}); }, "3 values do not fill shape [2, 2]"));
  EXPECT_TRUE(throws_error([] { empty({2, -1}); }, "negative size"));
  EXPECT_TRUE(throws_error([] { Tensor().sizes(); }, "undefined tensor"));
  EXPECT_TRUE(throws_error([] { tensor({1, 2}, {2}).item<float>(); }, "one-element tensor"));
  EXPECT_TRUE(throws_error([] { Device::parse("tpu"); }, "unknown device 'tpu'"));
  EXPECT_TRUE(throws_error([] { tensor({1}, {1}).size(3); }, "dim 3 is out of range"));
  Tensor integers = from_vector<int64_t>({1, 2}, {2});
  EXPECT_TRUE(
      throws_error([&] { integers.set_requires_grad(true); }, "only floating-point tensors"));
}

TEST(Tensor, MetaTensorsHaveShapesButNoBytes) {
  auto allocator = memory::allocator_for(Device::cpu());
  int64_t before = allocator->stats().allocated_bytes;
  Tensor t = empty({1 << 20, 1 << 10}, TensorOptions().device(Device::meta()));
  EXPECT_EQ(t.numel(), int64_t{1} << 30);
  EXPECT_EQ(allocator->stats().allocated_bytes, before);
  EXPECT_TRUE(throws_error([&] { t.to_vector<float>(); }, "meta tensor has no values"));
}

TEST(Tensor, DTypesRoundTripThroughStorage) {
  Tensor halves = from_vector<float>({0.5f, -1.25f, 3.0f}, {3}, DType::kFloat16);
  EXPECT_EQ(halves.nbytes(), 6u);
  EXPECT_EQ(halves.to_vector<float>(), (std::vector<float>{0.5f, -1.25f, 3.0f}));
  Tensor brains = from_vector<float>({0.5f, -1.25f, 3.0f}, {3}, DType::kBFloat16);
  EXPECT_EQ(brains.to_vector<float>(), (std::vector<float>{0.5f, -1.25f, 3.0f}));
}

}  // namespace
}  // namespace tessel
