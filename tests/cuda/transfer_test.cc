// Tensor::to(Device) with CUDA: round trips are bitwise for every dtype, non-contiguous and
// broadcast sources arrive contiguous, non-blocking copies are ordered before later work, the
// gradient comes back, and without a GPU the error says so.
#include "ops/transfer.h"

#include "core/autograd.h"
#include "cuda/copy.h"
#include "cuda/runtime.h"
#include "ops/ops.h"
#include "tests/gpu_skip.h"
#include "tests/testing.h"

namespace tessel {
namespace {

using testing::bitwise_equal;
using testing::throws_error;

TEST(CudaTransfer, TheCudaBuildHasTheTransfer) { EXPECT_TRUE(cuda_transfers_built()); }

TEST(CudaTransfer, WithoutAGpuMovingToCudaSaysSo) {
  if (cuda::device_count() > 0) GTEST_SKIP() << "a GPU is present";
  EXPECT_TRUE(throws_error([] { ones({2, 3}).to(Device::cuda()); }, "device_count() == 0"));
}

TEST(CudaTransfer, RoundTripIsBitwiseForEveryDtype) {
  TESSEL_SKIP_IF_NO_GPU();
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kInt64, DType::kBool,
                      DType::kBFloat16, DType::kFloat16, DType::kInt32}) {
    Tensor x = (randn({37, 5}) * 100.0).to(dtype);
    Tensor on_gpu = x.to(Device::cuda());
    EXPECT_TRUE(on_gpu.device().is_cuda());
    EXPECT_EQ(on_gpu.dtype(), dtype);
    EXPECT_TRUE(bitwise_equal(on_gpu.to(Device::cpu()), x)) << dtype_name(dtype);
  }
}

TEST(CudaTransfer, NonContiguousSourcesArriveContiguous) {
  TESSEL_SKIP_IF_NO_GPU();
  Tensor x = randn({6, 4, 5});
  Tensor transposed = x.permute({2, 0, 1});
  Tensor on_gpu = transposed.to(Device::cuda());
  EXPECT_TRUE(on_gpu.is_contiguous());
  EXPECT_TRUE(bitwise_equal(on_gpu.to(Device::cpu()), transposed.contiguous()));
  // Strided on the device too: the gather kernel.
  Tensor back = on_gpu.transpose(0, 2).to(Device::cpu());
  EXPECT_TRUE(bitwise_equal(back, transposed.transpose(0, 2).contiguous()));
  Tensor slice = x.to(Device::cuda()).slice(1, 1, 4, 2);
  EXPECT_TRUE(bitwise_equal(slice.to(Device::cpu()), x.slice(1, 1, 4, 2).contiguous()));
}

TEST(CudaTransfer, BroadcastSourcesAreExpandedOnBothSides) {
  TESSEL_SKIP_IF_NO_GPU();
  Tensor row = randn({1, 7});
  Tensor expanded = row.expand({5, 7});
  EXPECT_TRUE(bitwise_equal(expanded.to(Device::cuda()).to(Device::cpu()), expanded.contiguous()));
  Tensor on_gpu = row.to(Device::cuda()).expand({5, 7});
  EXPECT_TRUE(bitwise_equal(on_gpu.to(Device::cpu()), expanded.contiguous()));
}

TEST(CudaTransfer, NonBlockingCopiesAreOrderedBeforeLaterWork) {
  TESSEL_SKIP_IF_NO_GPU();
  std::vector<Tensor> sources, copies;
  for (int i = 0; i < 8; ++i) {
    sources.push_back(randn({256, 1024}));
    copies.push_back(to_device(sources.back(), Device::cuda(), /*non_blocking=*/true));
  }
  // The copies back run on the compute stream, which waits for the copy stream's events.
  for (int i = 0; i < 8; ++i) EXPECT_TRUE(bitwise_equal(copies[i].to(Device::cpu()), sources[i]));
}

TEST(CudaTransfer, EmptyTensorsMove) {
  TESSEL_SKIP_IF_NO_GPU();
  Tensor x = randn({0, 3});
  EXPECT_EQ(x.to(Device::cuda()).to(Device::cpu()).sizes(), x.sizes());
}

TEST(CudaTransfer, TheGradientComesBackToTheSourceDevice) {
  TESSEL_SKIP_IF_NO_GPU();
  Tensor x = randn({3, 4}, DType::kFloat64).set_requires_grad(true);
  Tensor y = x.to(Device::cuda());
  Tensor z = y.to(Device::cpu());
  (z * 3.0).sum().backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_TRUE(x.grad().device().is_cpu());
  EXPECT_TRUE(bitwise_equal(x.grad(), full({3, 4}, 3.0, DType::kFloat64)));
}

TEST(CudaGather, MergesDimensionsAndRefusesTooManyUnmergeable) {
  // Host side of the same layout logic: runs without a GPU.
  std::vector<float> values(2 * 3 * 4);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
  std::vector<float> out(values.size());
  cuda::gather_contiguous_host(values.data(), {4, 3, 2}, {1, 4, 12}, sizeof(float), out.data());
  EXPECT_EQ(out[1], 12.0f);
  EXPECT_EQ(out[2], 4.0f);
  Shape sizes(9, 2), strides(9);
  for (int d = 0; d < 9; ++d) strides[d] = int64_t{1} << (2 * (8 - d) + 1);
  std::vector<float> big(size_t{1} << 18);
  EXPECT_TRUE(
      throws_error([&] { cuda::gather_contiguous_host(big.data(), sizes, strides, 4, out.data()); },
                   "cannot be merged"));
}

}  // namespace
}  // namespace tessel
