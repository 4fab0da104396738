// What every op does beside its kernel without locked instructions, checked from many threads:
// the pool of tensor and storage headers, the CPU allocator's counts, storage ids, and raw bytes
// reached by kernels whose operands the dispatcher leaves unpinned.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <thread>
#include <vector>

#include "core/allocator.h"
#include "core/small_object_pool.h"
#include "ops/ops.h"
#include "tests/testing.h"

namespace tessel {
namespace {

using testing::throws_error;

TEST(SmallObjectPool, HandsAFreedBlockBackToItsThread) {
  void* first = pool_allocate(200);
  pool_free(first, 200);
  // Any size of the same 64-byte class takes the block back.
  void* second = pool_allocate(250);
  EXPECT_EQ(second, first);
  void* other = pool_allocate(250);
  EXPECT_NE(other, second);
  pool_free(second, 250);
  pool_free(other, 250);
}

TEST(SmallObjectPool, LargerBlocksComeFromTheHeapAndBlocksCrossThreads) {
  void* large = pool_allocate(kPoolLargestBlock + 1);
  ASSERT_NE(large, nullptr);
  pool_free(large, kPoolLargestBlock + 1);
  // Blocks made on one thread and freed on another (and the other way round) stay usable.
  std::vector<void*> made(1000);
  for (void*& block : made) block = pool_allocate(96);
  std::thread freeing([&] {
    for (void* block : made) pool_free(block, 96);
    for (void*& block : made) {
      block = pool_allocate(96);
      static_cast<char*>(block)[95] = 1;
    }
  });
  freeing.join();
  for (void* block : made) pool_free(block, 96);
}

TEST(SmallObjectPool, TensorsMadeAndDroppedOnManyThreadsKeepTheirValues) {
  std::vector<std::thread> threads;
  std::vector<int> wrong(8, 0);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([t, &wrong] {
      for (int i = 0; i < 200; ++i) {
        Tensor x = full({3}, static_cast<double>(t * 1000 + i));
        Tensor y = add(x, x);
        if (y.to_vector<float>() != std::vector<float>(3, 2.0f * (t * 1000 + i))) ++wrong[t];
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(wrong, std::vector<int>(8, 0));
}

TEST(CountingCpuAllocator, CountsExactlyFromMoreThreadsThanItHasSlots) {
  memory::CountingCpuAllocator allocator;
  constexpr int kThreads = 80;  // more than the allocator's per-thread slots
  constexpr int kEach = 50;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&allocator] {
      std::vector<void*> blocks;
      for (int i = 0; i < kEach; ++i) blocks.push_back(allocator.allocate(128, {}));
      for (int i = 0; i < kEach - 1; ++i) allocator.deallocate(blocks[i], 128, {});
    });
  }
  for (auto& thread : threads) thread.join();
  const memory::AllocatorStats stats = allocator.stats();
  EXPECT_EQ(stats.num_allocations, kThreads * kEach);
  EXPECT_EQ(stats.num_frees, kThreads * (kEach - 1));
  EXPECT_EQ(stats.allocated_bytes, kThreads * 128);
}

TEST(StorageIds, StayUniqueAcrossThreadsAndGrowAlongEach) {
  constexpr int kThreads = 4;
  constexpr int kEach = 3000;  // several of a thread's blocks of ids
  std::vector<std::vector<uint64_t>> ids(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, &ids] {
      for (int i = 0; i < kEach; ++i) ids[t].push_back(StorageImpl(4, Device::cpu()).id());
    });
  }
  for (auto& thread : threads) thread.join();
  std::set<uint64_t> all;
  for (const auto& mine : ids) {
    EXPECT_TRUE(std::is_sorted(mine.begin(), mine.end()));
    all.insert(mine.begin(), mine.end());
  }
  EXPECT_EQ(all.size(), static_cast<size_t>(kThreads * kEach));
}

TEST(RawBytes, UnpinnedOnlyInsideKernels) {
  Tensor x = ones({4});
  // Outside a kernel the bytes stay out of reach, before and after ops ran on the tensor.
  EXPECT_TRUE(throws_error([&] { x.data_ptr<float>(); }, "outside an access scope"));
  Tensor y = mul(x, x);
  EXPECT_TRUE(throws_error([&] { y.data_ptr<float>(); }, "outside an access scope"));
  EXPECT_EQ(y.storage()->pins(), 0);
  {
    UnpinnedKernelScope kernel(true);
    EXPECT_NE(y.data_ptr<float>(), nullptr);
  }
  {
    UnpinnedKernelScope pinned_kernel(false);  // a kernel whose operands were pinned
    EXPECT_TRUE(throws_error([&] { y.data_ptr<float>(); }, "outside an access scope"));
  }
  EXPECT_EQ(y.to_vector<float>(), std::vector<float>(4, 1.0f));
}

}  // namespace
}  // namespace tessel
