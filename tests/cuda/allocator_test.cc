// The CUDA caching allocator: budget from free device memory, immediate reuse on the compute
// stream, reuse after the event for blocks still used by the copy stream, pinned host memory,
// and the host link's copies on the copy stream. Tests needing a GPU skip without one.
#include "cuda/allocator.h"

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "core/allocator.h"
#include "core/error.h"
#include "cuda/runtime.h"
#include "memory/host_link.h"
#include "memory/memory.h"
#include "memory/residency_manager.h"
#include "ops/ops.h"
#include "tests/gpu_skip.h"
#include "tests/testing.h"

namespace tessel {
namespace {

using memory::CachingAllocatorOptions;
using testing::bitwise_equal;
using testing::throws_error;

constexpr size_t kMiB = size_t{1} << 20;

// Holds a stream at a host-side gate until open() (or destruction), so work queued behind it is
// known to be incomplete.
class StreamGate {
 public:
  explicit StreamGate(cudaStream_t stream) {
    TESSEL_CUDA_CHECK(cudaLaunchHostFunc(stream, &StreamGate::wait, &open_));
  }
  ~StreamGate() { open(); }
  void open() { open_.store(true); }

 private:
  static void wait(void* flag) {
    while (!static_cast<std::atomic<bool>*>(flag)->load()) std::this_thread::yield();
  }
  std::atomic<bool> open_{false};
};

TEST(CudaAllocator, WithoutAGpuTheFirstAllocationSaysSo) {
  if (cuda::device_count() > 0) GTEST_SKIP() << "a GPU is present";
  EXPECT_TRUE(throws_error([] { empty({4}, TensorOptions().device(Device::cuda())); },
                           "device_count() == 0"));
  EXPECT_TRUE(throws_error([] { cuda::caching_allocator(0); }, "no CUDA device available"));
  EXPECT_TRUE(throws_error(
      [] { memory::MemoryScope scope(memory::MemoryOptions().device(Device::cuda(0))); },
      "no CUDA device available"));
}

TEST(CudaAllocator, EachDeviceHasItsOwnAllocator) {
  TESSEL_SKIP_IF_NO_GPU();
  if (cuda::device_count() < 2) GTEST_SKIP() << "one GPU: nothing to compare cuda:1 with";
  Tensor values = randn({256, 256});
  Tensor on_0 = values.to(Device::cuda(0));
  Tensor on_1 = values.to(Device::cuda(1));  // allocated while cuda:0 is current
  EXPECT_EQ(on_1.storage()->allocator().get(), cuda::caching_allocator(1).get());
  EXPECT_NE(cuda::caching_allocator(0).get(), cuda::caching_allocator(1).get());
  Tensor sum = add(on_1, on_1);
  EXPECT_EQ(sum.device(), Device::cuda(1));
  EXPECT_TRUE(bitwise_equal(sum.to(Device::cpu()), add(values, values)));
  EXPECT_TRUE(bitwise_equal(on_1.to(Device::cuda(0)).to(Device::cpu()), values));  // peer copy
}

TEST(CudaAllocator, AMemoryScopeBudgetsItsGpuAndGivesItBackAfter) {
  TESSEL_SKIP_IF_NO_GPU();
  auto outside = cuda::caching_allocator(0);
  {
    memory::MemoryScope scope(memory::MemoryOptions()
                                  .device(Device::cuda(0))
                                  .budget(64 * kMiB)
                                  .policy(memory::Policy::kNone));
    EXPECT_EQ(cuda::caching_allocator(0).get(), &scope.allocator());
    EXPECT_EQ(scope.allocator().budget(), 64 * kMiB);
    Tensor fits = empty({8 * 1024 * 1024}, TensorOptions().device(Device::cuda()));  // 32 MiB
    EXPECT_EQ(fits.storage()->allocator().get(), &scope.allocator());
    EXPECT_TRUE(throws_error(
        [] { empty({16 * 1024 * 1024}, TensorOptions().device(Device::cuda())); }, "budget"));
    EXPECT_NE(memory::allocator_for(Device::cpu()).get(), &scope.allocator());  // the GPU's only
  }
  EXPECT_EQ(cuda::caching_allocator(0).get(), outside.get());
}

TEST(CudaAllocator, BudgetDefaultsToTheFreeDeviceMemory) {
  TESSEL_SKIP_IF_NO_GPU();
  size_t free_bytes = 0, total_bytes = 0;
  TESSEL_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  cuda::CudaCachingAllocator allocator(0);
  ASSERT_TRUE(allocator.has_budget());
  EXPECT_LE(allocator.budget(), free_bytes);
  EXPECT_GE(allocator.budget() + cuda::kLibraryHeadroomBytes + 256 * kMiB, free_bytes);
}

TEST(CudaAllocator, AnExplicitBudgetIsAHardLimit) {
  TESSEL_SKIP_IF_NO_GPU();
  cuda::CudaCachingAllocator allocator(0, CachingAllocatorOptions().budget(8 * kMiB));
  void* first = allocator.allocate(6 * kMiB, cuda::kComputeStreamId);
  EXPECT_THROW(allocator.allocate(4 * kMiB, cuda::kComputeStreamId), OutOfMemory);
  allocator.deallocate(first, 6 * kMiB, cuda::kComputeStreamId);
  void* again = allocator.allocate(4 * kMiB, cuda::kComputeStreamId);
  allocator.deallocate(again, 4 * kMiB, cuda::kComputeStreamId);
}

TEST(CudaAllocator, ComputeStreamFreesAreReusedAtOnce) {
  TESSEL_SKIP_IF_NO_GPU();
  cuda::CudaCachingAllocator allocator(0, CachingAllocatorOptions().budget(64 * kMiB));
  void* first = allocator.allocate(3 * kMiB, cuda::kComputeStreamId);
  TESSEL_CUDA_CHECK(cudaMemsetAsync(first, 1, 3 * kMiB, cuda::compute_stream(0)));
  allocator.deallocate(first, 3 * kMiB, cuda::kComputeStreamId);
  EXPECT_EQ(allocator.pending_frees(), 0);
  void* second = allocator.allocate(3 * kMiB, cuda::kComputeStreamId);
  EXPECT_EQ(second, first);
  allocator.deallocate(second, 3 * kMiB, cuda::kComputeStreamId);
  cuda::synchronize(0);
}

TEST(CudaAllocator, ABlockStillUsedByTheCopyStreamIsReusedOnlyAfterItsEvent) {
  TESSEL_SKIP_IF_NO_GPU();
  cuda::CudaCachingAllocator allocator(0, CachingAllocatorOptions().budget(64 * kMiB));
  void* block = allocator.allocate(3 * kMiB, cuda::kCopyStreamId);
  StreamGate gate(cuda::copy_stream(0));
  TESSEL_CUDA_CHECK(cudaMemsetAsync(block, 2, 3 * kMiB, cuda::copy_stream(0)));
  allocator.deallocate(block, 3 * kMiB, cuda::kCopyStreamId);
  EXPECT_EQ(allocator.pending_frees(), 1);
  void* other = allocator.allocate(3 * kMiB, cuda::kComputeStreamId);
  EXPECT_NE(other, block);  // the copy stream has not finished with it
  gate.open();
  allocator.process_pending_frees(/*wait=*/true);
  EXPECT_EQ(allocator.pending_frees(), 0);
  void* reused = allocator.allocate(3 * kMiB, cuda::kComputeStreamId);
  EXPECT_EQ(reused, block);
  allocator.deallocate(reused, 3 * kMiB, cuda::kComputeStreamId);
  allocator.deallocate(other, 3 * kMiB, cuda::kComputeStreamId);
}

TEST(CudaAllocator, RecordStreamDefersTheReuseOfAComputeBlock) {
  TESSEL_SKIP_IF_NO_GPU();
  cuda::CudaCachingAllocator allocator(0, CachingAllocatorOptions().budget(64 * kMiB));
  void* block = allocator.allocate(3 * kMiB, cuda::kComputeStreamId);
  StreamGate gate(cuda::copy_stream(0));
  allocator.record_stream(block, cuda::copy_stream(0));
  allocator.deallocate(block, 3 * kMiB, cuda::kComputeStreamId);
  EXPECT_EQ(allocator.pending_frees(), 1);
  gate.open();
  allocator.process_pending_frees(/*wait=*/true);
  void* reused = allocator.allocate(3 * kMiB, cuda::kComputeStreamId);
  EXPECT_EQ(reused, block);
  allocator.deallocate(reused, 3 * kMiB, cuda::kComputeStreamId);
}

TEST(CudaAllocator, OutOfMemoryWaitsForPendingFreesBeforeGivingUp) {
  TESSEL_SKIP_IF_NO_GPU();
  cuda::CudaCachingAllocator allocator(0, CachingAllocatorOptions().budget(4 * kMiB));
  void* block = allocator.allocate(4 * kMiB, cuda::kCopyStreamId);
  auto gate = std::make_unique<StreamGate>(cuda::copy_stream(0));
  allocator.deallocate(block, 4 * kMiB, cuda::kCopyStreamId);
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    gate->open();
  });
  void* again = allocator.allocate(4 * kMiB, cuda::kComputeStreamId);
  opener.join();
  EXPECT_EQ(again, block);
  allocator.deallocate(again, 4 * kMiB, cuda::kComputeStreamId);
}

TEST(CudaAllocator, TensorsOnCudaComeFromTheInstalledCachingAllocator) {
  TESSEL_SKIP_IF_NO_GPU();
  auto allocator = cuda::caching_allocator(0);
  EXPECT_EQ(memory::allocator_for(Device::cuda()).get(), allocator.get());
  const int64_t before = allocator->stats().allocated_bytes;
  Tensor x = empty({1024, 1024}, TensorOptions().device(Device::cuda()));
  EXPECT_GE(allocator->stats().allocated_bytes, before + int64_t{4} * 1024 * 1024);
  EXPECT_EQ(x.storage()->allocator().get(), allocator.get());
}

TEST(CudaAllocator, SwapsUsePinnedHostMemory) {
  TESSEL_SKIP_IF_NO_GPU();
  cuda::caching_allocator(0);
  void* host = memory::host_allocator()->allocate(kMiB, memory::Stream{});
  cudaPointerAttributes attributes{};
  TESSEL_CUDA_CHECK(cudaPointerGetAttributes(&attributes, host));
  EXPECT_EQ(attributes.type, cudaMemoryTypeHost);
  memory::host_allocator()->deallocate(host, kMiB, memory::Stream{});
}

TEST(CudaAllocator, TheHostLinkCopiesBothWaysOnTheCopyStream) {
  TESSEL_SKIP_IF_NO_GPU();
  auto engine = memory::copy_engine_for(DeviceType::kCuda);
  ASSERT_NE(engine, nullptr);
  memory::HostLink link(25e9, engine);
  auto allocator = cuda::caching_allocator(0);
  const size_t bytes = 3 * kMiB + 7;
  void* device = allocator->allocate(bytes, cuda::kComputeStreamId);
  std::vector<unsigned char> out(bytes), back(bytes, 0);
  for (size_t i = 0; i < bytes; ++i) out[i] = static_cast<unsigned char>(i * 31 + 7);
  link.wait(link.copy_async(device, out.data(), bytes));
  link.wait(link.copy_async(back.data(), device, bytes));
  EXPECT_EQ(out, back);
  allocator->deallocate(device, bytes, cuda::kComputeStreamId);
}

TEST(CudaResidency, ASwappedTensorComesBackBitwiseThroughPinnedMemory) {
  TESSEL_SKIP_IF_NO_GPU();
  auto allocator = cuda::caching_allocator(0);
  auto manager = std::make_shared<memory::ResidencyManager>(
      allocator, memory::ResidencyOptions(memory::Policy::kSwap).min_candidate_bytes(0));
  allocator->set_pressure_handler(manager.get());
  auto previous = set_residency_hooks(manager);
  Tensor values = randn({512, 1024});
  Tensor x = values.to(Device::cuda());
  const int64_t before = allocator->stats().allocated_bytes;
  manager->swap_out(*x.storage());
  EXPECT_EQ(x.storage()->state(), Residency::kOnHost);
  EXPECT_LT(allocator->stats().allocated_bytes, before);
  EXPECT_TRUE(bitwise_equal(x.to(Device::cpu()), values));  // swapped back in on access
  EXPECT_EQ(x.storage()->state(), Residency::kResident);
  manager->restore_and_detach();
  set_residency_hooks(previous);
  allocator->set_pressure_handler(nullptr);
}

}  // namespace
}  // namespace tessel
