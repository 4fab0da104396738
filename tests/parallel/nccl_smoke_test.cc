// NcclCommunicator on one rank and one GPU (tagged gpu): every collective runs through NCCL and
// leaves the values one rank implies, and CPU tensors are refused with a clear error. Skips when
// no GPU is visible.
#include <mpi.h>

#include <vector>

#include "core/device.h"
#include "cuda/runtime.h"
#include "gtest/gtest.h"
#include "ops/ops.h"
#include "parallel/nccl_communicator.h"
#include "tests/gpu_skip.h"
#include "tests/parallel/one_rank_mpi.h"
#include "tests/testing.h"

namespace tessel::parallel {
namespace {

using tessel::testing::all_close;
using tessel::testing::throws_error;

const auto* const kMpi = ::testing::AddGlobalTestEnvironment(new OneRankMpiEnvironment);

Tensor on_gpu(const std::vector<float>& values, const Shape& sizes) {
  return from_vector<float>(values, sizes).to(Device::cuda(0));
}

TEST(NcclCommunicator, OneRankCollectivesKeepTheValues) {
  TESSEL_SKIP_IF_NO_GPU();
  auto nccl = NcclCommunicator::world(0);
  EXPECT_EQ(nccl->rank(), 0);
  EXPECT_EQ(nccl->size(), 1);
  const Tensor expected = from_vector<float>({1, 2, 3, 4, 5, 6}, {3, 2});

  Tensor sum = on_gpu({1, 2, 3, 4, 5, 6}, {3, 2});
  nccl->all_reduce(sum, ReduceOp::kSum);
  EXPECT_TRUE(all_close(sum.to(Device::cpu()), expected));

  Tensor mean = on_gpu({1, 2, 3, 4, 5, 6}, {3, 2});
  nccl->all_reduce_async(transpose(mean, 0, 1), ReduceOp::kMean)->wait();
  EXPECT_TRUE(all_close(mean.to(Device::cpu()), expected));

  Tensor gathered = zeros({3, 2}, TensorOptions(DType::kFloat32).device(Device::cuda(0)));
  nccl->all_gather(on_gpu({1, 2, 3, 4, 5, 6}, {3, 2}), gathered);
  EXPECT_TRUE(all_close(gathered.to(Device::cpu()), expected));

  Tensor scattered = zeros({3, 2}, TensorOptions(DType::kFloat32).device(Device::cuda(0)));
  nccl->reduce_scatter(on_gpu({1, 2, 3, 4, 5, 6}, {3, 2}), scattered, ReduceOp::kMax);
  EXPECT_TRUE(all_close(scattered.to(Device::cpu()), expected));

  Tensor root = on_gpu({1, 2, 3, 4, 5, 6}, {3, 2});
  nccl->broadcast(root, 0);
  EXPECT_TRUE(all_close(root.to(Device::cpu()), expected));

  Tensor flags = from_vector<int64_t>({0, 7}, {2}).to(Device::cuda(0));
  nccl->all_reduce(flags, ReduceOp::kMin);
  nccl->barrier();
  EXPECT_EQ(flags.to(Device::cpu()).to_vector<int64_t>(), (std::vector<int64_t>{0, 7}));
}

TEST(NcclCommunicator, BadArgumentsAreClearErrors) {
  TESSEL_SKIP_IF_NO_GPU();
  auto nccl = NcclCommunicator::world(0);
  Tensor on_cpu = ones({4});
  EXPECT_TRUE(throws_error([&] { nccl->all_reduce(on_cpu); }, "MPI communicators take CPU"));
  Tensor integers = from_vector<int64_t>({1, 2}, {2}).to(Device::cuda(0));
  EXPECT_TRUE(throws_error([&] { nccl->all_reduce(integers, ReduceOp::kMean); },
                           "mean needs a floating-point tensor"));
  Tensor wrong = zeros({5, 2}, TensorOptions(DType::kFloat32).device(Device::cuda(0)));
  EXPECT_TRUE(throws_error(
      [&] {
        nccl->all_gather(on_gpu({1, 2, 3, 4, 5, 6}, {3, 2}), wrong);
      },
      "input must be"));
  EXPECT_TRUE(throws_error([&] { nccl->broadcast(wrong, 1); }, "root 1 is not a rank"));
}

}  // namespace
}  // namespace tessel::parallel
