// The to_device op in a build without CUDA: clear errors for CUDA targets, host copies that
// keep dtype and values of non-contiguous sources, and a gradient that goes back.
#include "ops/transfer.h"

#include "core/op.h"
#include "ops/ops.h"
#include "tests/testing.h"

namespace tessel {
namespace {

using testing::all_close;
using testing::bitwise_equal;
using testing::gradcheck;
using testing::kF64;
using testing::throws_error;

Tensor host_transfer(const Tensor& x) {
  return dispatch(ops::to_device, {x},
                  Attrs{{"device", std::string("cpu")}, {"source_device", std::string("cpu")}})[0];
}

TEST(ToDevice, CudaTargetWithoutTheCudaBuildIsAClearError) {
  ASSERT_FALSE(cuda_transfers_built());
  EXPECT_TRUE(throws_error(
      [] {
        ones({2, 3}).to(Device::cuda());
      },
      "built without CUDA (rebuild with --config=cuda"));
  EXPECT_TRUE(throws_error([] { to_device(ones({2}), Device::cuda(1), true); },
                           "to(cuda:1): Tessel was built without CUDA"));
}

TEST(ToDevice, SameDeviceReturnsTheTensorItself) {
  Tensor x = ones({3});
  Tensor y = x.to(Device::cpu());
  EXPECT_EQ(y.impl(), x.impl());
}

TEST(ToDevice, HostCopyOfATransposedTensorIsContiguousAndKeepsDtype) {
  Tensor x = arange(12, DType::kInt64).reshape({3, 4}).t();
  Tensor y = host_transfer(x);
  EXPECT_TRUE(y.is_contiguous());
  EXPECT_EQ(y.dtype(), DType::kInt64);
  EXPECT_NE(y.storage(), x.storage());
  EXPECT_TRUE(bitwise_equal(y, x.contiguous()));
}

TEST(ToDevice, HostCopyIsBitwiseForEveryDtype) {
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kInt64, DType::kBool,
                      DType::kBFloat16, DType::kFloat16, DType::kInt32}) {
    Tensor x = (randn({7, 5}) * 100.0).to(dtype);
    Tensor y = host_transfer(x.t());
    EXPECT_EQ(y.dtype(), dtype);
    EXPECT_TRUE(bitwise_equal(y, x.t().contiguous())) << dtype_name(dtype);
  }
}

TEST(ToDevice, HostCopyOfABroadcastTensor) {
  Tensor x = randn({1, 4}).expand({3, 4});
  EXPECT_TRUE(bitwise_equal(host_transfer(x), x.contiguous()));
}

TEST(ToDevice, GradientGoesBackThroughTheTransfer) {
  Tensor x = randn({4, 3}, TensorOptions(kF64)).t().set_requires_grad(true);
  EXPECT_TRUE(
      gradcheck([](const std::vector<Tensor>& in) { return host_transfer(in[0]) * 2.0; }, {x}));
}

TEST(ToDevice, MetaTensorsHaveNothingToMove) {
  Tensor meta = empty({2}, TensorOptions().device(Device::meta()));
  EXPECT_TRUE(throws_error([&] { meta.to(Device::cpu()); }, "has no data to move"));
}

}  // namespace
}  // namespace tessel
