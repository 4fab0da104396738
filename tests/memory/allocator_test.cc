// CachingAllocator: rounding, best fit, splitting and coalescing, the budget (arena) and its
// out-of-memory report, the pressure handler, statistics, snapshots, the timeline, threads,
// unlimited (segment-caching) mode, the host allocator, JSON output, and tensors running on it.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include "core/error.h"
#include "memory/caching_allocator.h"
#include "memory/host_allocator.h"
#include "memory/memory_json.h"
#include "ops/ops.h"
#include "tests/testing.h"

namespace tessel::memory {
namespace {

using tessel::testing::throws_error;

constexpr size_t KiB = 1024;
constexpr size_t MiB = 1024 * 1024;

CachingAllocatorOptions arena(size_t budget) {
  return CachingAllocatorOptions().budget(budget).debug_checks(true);
}

void* alloc(CachingAllocator& allocator, size_t nbytes) {
  return allocator.allocate(nbytes, Stream{});
}

void release(CachingAllocator& allocator, void* ptr) { allocator.deallocate(ptr, 0, Stream{}); }

uintptr_t address(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr); }

// Runs `body` expecting tessel::OutOfMemory; returns its message.
std::string oom_message(const std::function<void()>& body) {
  try {
    body();
  } catch (const OutOfMemory& error) {
    return error.message();
  }
  ADD_FAILURE() << "expected tessel::OutOfMemory";
  return "";
}

// Host segments, counted; refuses once `limit` bytes are out (0: no limit).
class CountingSource : public SegmentSource {
 public:
  explicit CountingSource(size_t limit = 0) : limit_(limit) {}
  void* allocate_segment(size_t bytes) override {
    if (limit_ && live_bytes + bytes > limit_) return nullptr;
    ++segments_allocated;
    live_bytes += bytes;
    return host_segment_source()->allocate_segment(bytes);
  }
  void free_segment(void* ptr, size_t bytes) override {
    ++segments_freed;
    live_bytes -= bytes;
    host_segment_source()->free_segment(ptr, bytes);
  }
  int segments_allocated = 0;
  int segments_freed = 0;
  size_t live_bytes = 0;

 private:
  size_t limit_;
};

class CallbackPressureHandler : public PressureHandler {
 public:
  explicit CallbackPressureHandler(std::function<bool(size_t, size_t)> callback)
      : callback_(std::move(callback)) {}
  bool relieve(size_t bytes_needed, size_t largest_free_block) override {
    calls.push_back({bytes_needed, largest_free_block});
    return callback_(bytes_needed, largest_free_block);
  }
  std::vector<std::pair<size_t, size_t>> calls;

 private:
  std::function<bool(size_t, size_t)> callback_;
};

// Ten 1 KiB blocks fill a 10 KiB arena; freeing the even ones leaves five 1 KiB holes.
struct FragmentedArena {
  CachingAllocator allocator{Device::cpu(), arena(10 * KiB)};
  std::vector<void*> blocks;
  FragmentedArena() {
    for (int i = 0; i < 10; ++i) blocks.push_back(alloc(allocator, KiB));
    for (int i = 0; i < 10; i += 2) release(allocator, blocks[i]);
  }
};

TEST(CachingAllocator, RoundsEveryRequestUpTo512Bytes) {
  EXPECT_EQ(CachingAllocator::round_size(0), 512u);
  EXPECT_EQ(CachingAllocator::round_size(1), 512u);
  EXPECT_EQ(CachingAllocator::round_size(512), 512u);
  EXPECT_EQ(CachingAllocator::round_size(513), 1024u);
  EXPECT_EQ(CachingAllocator::round_size(1000), 1024u);

  CachingAllocator allocator(Device::cpu(), arena(64 * KiB));
  void* small = alloc(allocator, 1);
  void* odd = alloc(allocator, 1000);
  EXPECT_EQ(address(small) % 512, 0u);
  EXPECT_EQ(address(odd) - address(small), 512u);
  MemoryStats stats = allocator.memory_stats();
  EXPECT_EQ(stats.base.allocated_bytes, 512 + 1024);
  EXPECT_EQ(stats.requested_bytes, 1 + 1000);
  std::vector<BlockInfo> blocks = allocator.snapshot();
  ASSERT_EQ(blocks.size(), 3u);
  EXPECT_EQ(blocks[0].size, 512u);
  EXPECT_EQ(blocks[0].requested, 1u);
  EXPECT_EQ(blocks[1].size, 1024u);
}

TEST(CachingAllocator, BestFitTakesTheSmallestFreeBlockThatFits) {
  CachingAllocator allocator(Device::cpu(), arena(64 * KiB));
  void* a = alloc(allocator, 4 * KiB);
  alloc(allocator, 512);
  void* b = alloc(allocator, 2 * KiB);
  alloc(allocator, 512);
  void* c = alloc(allocator, 3 * KiB);
  alloc(allocator, 512);
  release(allocator, a);
  release(allocator, b);
  release(allocator, c);
  // Holes: 4 KiB at a, 2 KiB at b, 3 KiB at c, and the big tail.
  void* x = alloc(allocator, 2500);  // 2560 B: only the 3 KiB and 4 KiB holes and the tail fit
  EXPECT_EQ(x, c);
  void* y = alloc(allocator, 2 * KiB);
  EXPECT_EQ(y, b);
  void* z = alloc(allocator, 4000);
  EXPECT_EQ(z, a);
  // The 512 B left of c's hole is now the smallest free block.
  void* w = alloc(allocator, 1);
  EXPECT_EQ(address(w), address(c) + 2560);
}

TEST(CachingAllocator, SplitsBlocksAndCoalescesFreedNeighbours) {
  CachingAllocator allocator(Device::cpu(), arena(16 * KiB));
  void* a = alloc(allocator, KiB);
  void* b = alloc(allocator, 2 * KiB);
  void* c = alloc(allocator, 3 * KiB);
  std::vector<BlockInfo> blocks = allocator.snapshot();
  ASSERT_EQ(blocks.size(), 4u);  // a, b, c and the 10 KiB tail split off
  EXPECT_EQ(blocks[3].size, 10 * KiB);
  EXPECT_FALSE(blocks[3].allocated);

  release(allocator, b);
  release(allocator, a);
  blocks = allocator.snapshot();
  ASSERT_EQ(blocks.size(), 3u);
  EXPECT_EQ(blocks[0].address, address(a));
  EXPECT_EQ(blocks[0].size, 3 * KiB);
  EXPECT_FALSE(blocks[0].allocated);
  EXPECT_EQ(blocks[1].address, address(c));
  EXPECT_TRUE(blocks[1].allocated);

  release(allocator, c);
  blocks = allocator.snapshot();
  ASSERT_EQ(blocks.size(), 1u);
  EXPECT_EQ(blocks[0].size, 16 * KiB);
  EXPECT_FALSE(blocks[0].allocated);
  EXPECT_EQ(allocator.largest_free_block(), 16 * KiB);
}

TEST(CachingAllocator, FreeBytesAdjacentCountsTheHolesBesideABlock) {
  CachingAllocator allocator(Device::cpu(), arena(10 * KiB));
  void* a = alloc(allocator, KiB);
  void* b = alloc(allocator, 2 * KiB);
  void* c = alloc(allocator, 3 * KiB);
  void* d = alloc(allocator, 4 * KiB);
  EXPECT_EQ(allocator.free_bytes_adjacent(b), 0u);
  release(allocator, a);
  release(allocator, c);
  EXPECT_EQ(allocator.free_bytes_adjacent(b), 1 * KiB + 3 * KiB);
  EXPECT_EQ(allocator.free_bytes_adjacent(d), 3 * KiB);  // the arena ends right of d
  EXPECT_EQ(allocator.free_bytes_adjacent(nullptr), 0u);
  EXPECT_TRUE(throws_error([&] { allocator.free_bytes_adjacent(a); }, "not an allocated block"));
}

TEST(CachingAllocator, SlideDownMovesABlockOntoTheHoleBelowAndJoinsTheFreeBytesAbove) {
  CachingAllocator allocator(Device::cpu(), arena(12 * KiB));
  void* a = alloc(allocator, KiB);
  void* b = alloc(allocator, 2 * KiB);
  void* c = alloc(allocator, 3 * KiB);
  void* d = alloc(allocator, 4 * KiB);
  release(allocator, b);
  release(allocator, d);  // free: 2 KiB between a and c, 6 KiB above c
  EXPECT_EQ(allocator.largest_free_block(), 6 * KiB);
  EXPECT_EQ(allocator.free_bytes_below(c), 2 * KiB);
  EXPECT_EQ(allocator.free_bytes_below(a), 0u);  // the arena starts at a
  const auto nothing_to_move = [](void*) {};
  EXPECT_TRUE(
      throws_error([&] { allocator.slide_down(a, nothing_to_move); }, "no free block below"));
  EXPECT_TRUE(
      throws_error([&] { allocator.slide_down(b, nothing_to_move); }, "not an allocated block"));

  const auto allocated = allocator.memory_stats().base.allocated_bytes;
  void* moved_to = nullptr;
  void* moved = allocator.slide_down(c, [&](void* to) { moved_to = to; });
  EXPECT_EQ(moved_to, moved);
  EXPECT_EQ(address(moved), address(a) + KiB);
  std::vector<BlockInfo> blocks = allocator.snapshot();
  ASSERT_EQ(blocks.size(), 3u);  // a, c, and one free block of 8 KiB
  EXPECT_EQ(blocks[1].address, address(moved));
  EXPECT_EQ(blocks[1].size, 3 * KiB);
  EXPECT_TRUE(blocks[1].allocated);
  EXPECT_EQ(blocks[2].size, 8 * KiB);
  EXPECT_FALSE(blocks[2].allocated);
  EXPECT_EQ(allocator.largest_free_block(), 8 * KiB);
  EXPECT_EQ(allocator.memory_stats().base.allocated_bytes, allocated);
  EXPECT_TRUE(throws_error([&] { release(allocator, c); }, "was not allocated"));
  release(allocator, moved);
  release(allocator, a);
  EXPECT_EQ(allocator.largest_free_block(), 12 * KiB);
}

TEST(CachingAllocator, NeverExceedsItsBudgetUnderARandomWorkload) {
  const size_t budget = MiB + 300;  // the usable arena is the budget rounded down to 512
  CachingAllocator allocator(Device::cpu(), arena(budget));
  std::mt19937 rng(7);
  std::vector<void*> live;
  int ooms = 0;
  for (int step = 0; step < 4000; ++step) {
    if (live.empty() || rng() % 100 < 60) {
      try {
        live.push_back(alloc(allocator, 1 + rng() % (64 * KiB)));
      } catch (const OutOfMemory&) {
        ++ooms;
      }
    } else {
      size_t index = rng() % live.size();
      release(allocator, live[index]);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(index));
    }
    AllocatorStats stats = allocator.stats();
    ASSERT_LE(stats.allocated_bytes, static_cast<int64_t>(budget));
    ASSERT_EQ(stats.reserved_bytes, static_cast<int64_t>(MiB));
  }
  EXPECT_GT(ooms, 0);  // the workload reached the limit
  EXPECT_EQ(allocator.memory_stats().ooms, ooms);
  EXPECT_LE(allocator.stats().peak_allocated_bytes, static_cast<int64_t>(budget));
  for (void* ptr : live) release(allocator, ptr);
  std::vector<BlockInfo> blocks = allocator.snapshot();
  ASSERT_EQ(blocks.size(), 1u);
  EXPECT_EQ(blocks[0].size, MiB);
}

TEST(CachingAllocator, FragmentedRequestFailsWithAReportNamingTheLargestHole) {
  FragmentedArena fragmented;
  MemoryStats stats = fragmented.allocator.memory_stats();
  EXPECT_EQ(stats.free_bytes, 5 * KiB);
  EXPECT_EQ(stats.free_blocks, 5);
  EXPECT_EQ(stats.largest_free_block, KiB);
  EXPECT_DOUBLE_EQ(stats.fragmentation, 0.8);

  // 2 KiB is less than the 5 KiB free but more than any hole.
  std::string message = oom_message([&] { alloc(fragmented.allocator, 2 * KiB); });
  EXPECT_NE(message.find("cannot allocate 2.00 KiB (2048 bytes)"), std::string::npos) << message;
  EXPECT_NE(message.find("budget: 10.00 KiB (10240 bytes)"), std::string::npos) << message;
  EXPECT_NE(message.find("in use: 5.00 KiB (5120 bytes) in 5 blocks"), std::string::npos)
      << message;
  EXPECT_NE(message.find("peak 10.00 KiB"), std::string::npos) << message;
  EXPECT_NE(message.find("free: 5.00 KiB (5120 bytes) in 5 blocks"), std::string::npos) << message;
  EXPECT_NE(message.find("largest free block 1.00 KiB (1024 bytes)"), std::string::npos) << message;
  EXPECT_NE(message.find("fragmentation 0.80"), std::string::npos) << message;
  EXPECT_NE(message.find("fragmented"), std::string::npos) << message;
}

TEST(CachingAllocator, PressureHandlerIsAskedWithTheRightNumbersAndARetrySucceeds) {
  FragmentedArena fragmented;
  CachingAllocator& allocator = fragmented.allocator;
  // Freeing block 1 joins holes 0 and 2 into one 3 KiB hole.
  CallbackPressureHandler handler([&](size_t, size_t) {
    release(allocator, fragmented.blocks[1]);
    return true;
  });
  allocator.set_pressure_handler(&handler);
  void* ptr = alloc(allocator, 2 * KiB);
  ASSERT_EQ(handler.calls.size(), 1u);
  EXPECT_EQ(handler.calls[0].first, 2 * KiB);   // bytes needed, rounded
  EXPECT_EQ(handler.calls[0].second, 1 * KiB);  // the largest hole at the time
  EXPECT_EQ(ptr, fragmented.blocks[0]);         // the only hole that fits
  EXPECT_EQ(allocator.memory_stats().pressure_calls, 1);
  allocator.set_pressure_handler(nullptr);
}

TEST(CachingAllocator, PressureHandlerThatGivesUpLeadsToOutOfMemory) {
  FragmentedArena fragmented;
  CallbackPressureHandler handler([](size_t, size_t) { return false; });
  fragmented.allocator.set_pressure_handler(&handler);
  std::string message = oom_message([&] { alloc(fragmented.allocator, 4 * KiB); });
  EXPECT_NE(message.find("largest free block"), std::string::npos);
  EXPECT_EQ(handler.calls.size(), 1u);
}

TEST(CachingAllocator, PressureHandlerIsAskedAgainWhileItMakesProgress) {
  FragmentedArena fragmented;
  CachingAllocator& allocator = fragmented.allocator;
  // Each call frees the next odd block: after blocks 1 and 3, holes 0 to 4 are one 5 KiB hole.
  int next_odd = 1;
  CallbackPressureHandler handler([&](size_t, size_t) {
    if (next_odd > 9) return false;
    release(allocator, fragmented.blocks[next_odd]);
    next_odd += 2;
    return true;
  });
  allocator.set_pressure_handler(&handler);
  void* ptr = alloc(allocator, 4 * KiB);
  ASSERT_EQ(handler.calls.size(), 2u);
  EXPECT_EQ(handler.calls[1].second, 3 * KiB);  // after the first relief: blocks 0, 1, 2
  EXPECT_EQ(ptr, fragmented.blocks[0]);
}

TEST(CachingAllocator, OutOfMemoryReportListsTheLargestHoldersWithOwners) {
  CachingAllocator allocator(Device::cpu(), arena(8 * KiB));
  void* weights = alloc(allocator, 4 * KiB);
  allocator.set_owner(weights, "weights");
  {
    ScopedAllocationOwner owner("activations");
    alloc(allocator, 3 * KiB);
  }
  void* unlabelled = alloc(allocator, 512);
  std::string message = oom_message([&] { alloc(allocator, 2 * KiB); });
  size_t weights_at = message.find("4.00 KiB (4096 bytes) at ");
  size_t activations_at = message.find("3.00 KiB (3072 bytes) at ");
  ASSERT_NE(weights_at, std::string::npos) << message;
  ASSERT_NE(activations_at, std::string::npos) << message;
  EXPECT_LT(weights_at, activations_at);  // largest first
  EXPECT_NE(message.find("owner: weights"), std::string::npos) << message;
  EXPECT_NE(message.find("owner: activations"), std::string::npos) << message;
  EXPECT_NE(message.find("owner: (unlabelled)"), std::string::npos) << message;
  EXPECT_EQ(allocator.snapshot()[1].owner, "activations");
  release(allocator, unlabelled);
  EXPECT_TRUE(
      throws_error([&] { allocator.set_owner(unlabelled, "gone"); }, "not an allocated block"));
}

TEST(CachingAllocator, StaysUsableAfterOutOfMemory) {
  FragmentedArena fragmented;
  CachingAllocator& allocator = fragmented.allocator;
  oom_message([&] { alloc(allocator, 2 * KiB); });
  oom_message([&] { alloc(allocator, size_t(1) << 63); });  // absurd sizes fail cleanly too
  allocator.check_invariants();
  void* ptr = alloc(allocator, KiB);
  EXPECT_EQ(ptr, fragmented.blocks[0]);
  release(allocator, ptr);
  for (int i = 1; i < 10; i += 2) release(allocator, fragmented.blocks[i]);
  std::vector<BlockInfo> blocks = allocator.snapshot();
  ASSERT_EQ(blocks.size(), 1u);
  EXPECT_EQ(blocks[0].size, 10 * KiB);
  void* whole = alloc(allocator, 10 * KiB);
  EXPECT_NE(whole, nullptr);
  MemoryStats stats = allocator.memory_stats();
  EXPECT_EQ(stats.ooms, 2);
  EXPECT_EQ(stats.base.allocated_bytes, static_cast<int64_t>(10 * KiB));
  release(allocator, whole);
}

TEST(CachingAllocator, TracksPeakAndResetsIt) {
  CachingAllocator allocator(Device::cpu(), arena(64 * KiB));
  void* a = alloc(allocator, KiB);
  void* b = alloc(allocator, 2 * KiB);
  release(allocator, b);
  AllocatorStats stats = allocator.stats();
  EXPECT_EQ(stats.allocated_bytes, static_cast<int64_t>(KiB));
  EXPECT_EQ(stats.peak_allocated_bytes, static_cast<int64_t>(3 * KiB));
  EXPECT_EQ(stats.reserved_bytes, static_cast<int64_t>(64 * KiB));
  EXPECT_EQ(stats.num_allocations, 2);
  EXPECT_EQ(stats.num_frees, 1);
  allocator.reset_peak();
  EXPECT_EQ(allocator.stats().peak_allocated_bytes, static_cast<int64_t>(KiB));
  release(allocator, a);
  EXPECT_EQ(allocator.stats().peak_allocated_bytes, static_cast<int64_t>(KiB));
}

TEST(CachingAllocator, SnapshotCoversTheArenaInAddressOrder) {
  const size_t budget = 256 * KiB;
  CachingAllocator allocator(Device::cpu(), arena(budget));
  std::mt19937 rng(3);
  std::vector<void*> live;
  for (int i = 0; i < 40; ++i) live.push_back(alloc(allocator, 1 + rng() % (4 * KiB)));
  for (size_t i = 0; i < live.size(); i += 3) release(allocator, live[i]);
  allocator.set_owner(live[1], "labelled");

  std::vector<BlockInfo> blocks = allocator.snapshot();
  ASSERT_FALSE(blocks.empty());
  uintptr_t expected = blocks[0].address;
  size_t total = 0, allocated = 0;
  int labelled = 0;
  for (size_t i = 0; i < blocks.size(); ++i) {
    EXPECT_EQ(blocks[i].address, expected);
    EXPECT_EQ(blocks[i].segment, 0);
    if (i > 0) {
      EXPECT_FALSE(!blocks[i].allocated && !blocks[i - 1].allocated) << "not coalesced";
    }
    expected += blocks[i].size;
    total += blocks[i].size;
    if (blocks[i].allocated) allocated += blocks[i].size;
    if (blocks[i].owner == "labelled") {
      ++labelled;
      EXPECT_EQ(blocks[i].address, address(live[1]));
    }
  }
  EXPECT_EQ(total, budget);
  EXPECT_EQ(labelled, 1);
  MemoryStats stats = allocator.memory_stats();
  EXPECT_EQ(static_cast<int64_t>(allocated), stats.base.allocated_bytes);
  EXPECT_EQ(total - allocated, stats.free_bytes);
}

TEST(CachingAllocator, FourThreadsAllocatingAndFreeingEndWithOneCoalescedBlock) {
  const size_t budget = 32 * MiB;
  CachingAllocator allocator(Device::cpu(), arena(budget));
  std::atomic<int> failures{0};
  std::atomic<int> ooms{0};  // possible in principle (holes), not expected: at most 16 MiB live
  auto worker = [&](int thread) {
    std::mt19937 rng(100 + thread);
    struct Live {
      unsigned char* ptr;
      size_t size;
      unsigned char tag;
    };
    std::vector<Live> live;
    auto free_one = [&](size_t index) {
      Live block = live[index];
      // Nobody else wrote into this block while it was ours.
      for (size_t i = 0; i < block.size; i += 97) {
        if (block.ptr[i] != block.tag) ++failures;
      }
      release(allocator, block.ptr);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(index));
    };
    for (int step = 0; step < 2500; ++step) {
      if (live.size() < 32 && (live.empty() || rng() % 2 == 0)) {
        size_t size = 1 + rng() % (128 * KiB);
        unsigned char* ptr = nullptr;
        try {
          ptr = static_cast<unsigned char*>(alloc(allocator, size));
        } catch (const OutOfMemory&) {
          ++ooms;
          continue;
        }
        auto tag = static_cast<unsigned char>(thread * 50 + step % 50);
        std::memset(ptr, tag, size);
        live.push_back({ptr, size, tag});
      } else {
        free_one(rng() % live.size());
      }
    }
    while (!live.empty()) free_one(live.size() - 1);
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back(worker, t);
  for (auto& thread : threads) thread.join();

  EXPECT_EQ(failures.load(), 0);
  RecordProperty("ooms", ooms.load());
  std::vector<BlockInfo> blocks = allocator.snapshot();
  ASSERT_EQ(blocks.size(), 1u);
  EXPECT_EQ(blocks[0].size, budget);
  EXPECT_FALSE(blocks[0].allocated);
  AllocatorStats stats = allocator.stats();
  EXPECT_EQ(stats.allocated_bytes, 0);
  EXPECT_EQ(stats.num_allocations, stats.num_frees);
  EXPECT_LE(stats.peak_allocated_bytes, static_cast<int64_t>(budget));
  allocator.check_invariants();
}

// Puts the previous CPU allocator back even when a test fails half-way.
class RestoreCpuAllocator {
 public:
  RestoreCpuAllocator() : previous_(allocator_for(Device::cpu())) {}
  ~RestoreCpuAllocator() { set_allocator(DeviceType::kCpu, previous_); }

 private:
  std::shared_ptr<Allocator> previous_;
};

TEST(CachingAllocator, TensorsRunOnItAsTheCpuAllocator) {
  manual_seed(11);
  Tensor x = randn({2, 3, 9, 9});
  Tensor weight = randn({4, 3, 3, 3});
  Tensor bias = randn({4});
  Tensor a = randn({16, 24});
  Tensor b = randn({24, 8});
  auto run = [&](Tensor& conv_out, Tensor& x_grad, Tensor& product) {
    Tensor leaf = clone(x).set_requires_grad(true);
    conv_out = conv2d(leaf, weight, bias, {1, 1}, {1, 1});
    Tensor loss = sum(relu(max_pool2d(conv_out, {2, 2})));
    loss.backward();
    x_grad = leaf.grad();
    product = add(matmul(a, b), 1.0);
  };
  Tensor expected_conv, expected_grad, expected_product;
  run(expected_conv, expected_grad, expected_product);

  RestoreCpuAllocator restore;
  std::shared_ptr<CachingAllocator> caching =
      install_caching_allocator(Device::cpu(), arena(64 * MiB));
  EXPECT_EQ(allocator_for(Device::cpu()).get(), caching.get());
  {
    Tensor conv_out, x_grad, product;
    run(conv_out, x_grad, product);
    EXPECT_TRUE(tessel::testing::bitwise_equal(conv_out, expected_conv));
    EXPECT_TRUE(tessel::testing::bitwise_equal(x_grad, expected_grad));
    EXPECT_TRUE(tessel::testing::bitwise_equal(product, expected_product));
    AllocatorStats stats = caching->stats();
    EXPECT_GT(stats.num_allocations, 5);
    EXPECT_GE(stats.allocated_bytes, static_cast<int64_t>(conv_out.nbytes() + x_grad.nbytes()));
  }
  // Tensors made before the install still free into their own allocator.
  x = Tensor();
  AllocatorStats stats = caching->stats();
  EXPECT_EQ(stats.allocated_bytes, 0);
  EXPECT_EQ(stats.num_allocations, stats.num_frees);
  caching->check_invariants();
}

TEST(CachingAllocator, UnlimitedModeCachesSegmentsAndEmptyCacheReturnsThem) {
  auto source = std::make_shared<CountingSource>();
  CachingAllocator allocator(Device::cpu(), CachingAllocatorOptions().debug_checks(true), source);
  EXPECT_EQ(allocator.stats().reserved_bytes, 0);

  void* small = alloc(allocator, 1000);
  EXPECT_EQ(source->segments_allocated, 1);
  EXPECT_EQ(allocator.stats().reserved_bytes, static_cast<int64_t>(2 * MiB));
  release(allocator, small);
  void* again = alloc(allocator, 1000);
  EXPECT_EQ(again, small);                // the cached block, no new segment
  void* one_mib = alloc(allocator, MiB);  // still the small pool: same 2 MiB segment
  EXPECT_EQ(source->segments_allocated, 1);

  void* large = alloc(allocator, 5 * MiB);  // own segment, rounded up to 6 MiB
  EXPECT_EQ(source->segments_allocated, 2);
  EXPECT_EQ(allocator.stats().reserved_bytes, static_cast<int64_t>(8 * MiB));
  release(allocator, large);
  void* large_again = alloc(allocator, 5 * MiB);
  EXPECT_EQ(large_again, large);
  EXPECT_EQ(source->segments_allocated, 2);

  allocator.empty_cache();  // every segment still holds a live block
  EXPECT_EQ(source->segments_freed, 0);
  release(allocator, large_again);
  allocator.empty_cache();
  EXPECT_EQ(source->segments_freed, 1);
  release(allocator, again);
  release(allocator, one_mib);
  allocator.empty_cache();
  EXPECT_EQ(source->segments_freed, 2);
  EXPECT_EQ(source->live_bytes, 0u);
  EXPECT_EQ(allocator.stats().reserved_bytes, 0);
  EXPECT_TRUE(allocator.snapshot().empty());
}

TEST(CachingAllocator, LargePoolKeepsRemaindersOfAtMostOneMiBInTheBlock) {
  auto source = std::make_shared<CountingSource>();
  CachingAllocator allocator(Device::cpu(), CachingAllocatorOptions().debug_checks(true), source);
  void* ptr = alloc(allocator, 3 * MiB / 2);  // a 2 MiB segment; 512 KiB left is not split off
  std::vector<BlockInfo> blocks = allocator.snapshot();
  ASSERT_EQ(blocks.size(), 1u);
  EXPECT_EQ(blocks[0].size, 2 * MiB);
  EXPECT_EQ(allocator.stats().allocated_bytes, static_cast<int64_t>(2 * MiB));
  release(allocator, ptr);

  void* big = alloc(allocator, 7 * MiB);  // 8 MiB segment
  release(allocator, big);
  void* part = alloc(allocator, 5 * MiB / 2);  // best fit: the 8 MiB block, 5.5 MiB split off
  blocks = allocator.snapshot();
  ASSERT_EQ(blocks.size(), 3u);  // the 2 MiB segment's block, and the 8 MiB one's two blocks
  auto first = std::find_if(blocks.begin(), blocks.end(),
                            [&](const BlockInfo& block) { return block.address == address(part); });
  ASSERT_NE(first, blocks.end());
  ASSERT_NE(first + 1, blocks.end());
  EXPECT_EQ(first->size, 5 * MiB / 2);
  EXPECT_EQ((first + 1)->size, 11 * MiB / 2);
  EXPECT_FALSE((first + 1)->allocated);
  EXPECT_EQ((first + 1)->segment, first->segment);
  release(allocator, part);
}

TEST(CachingAllocator, UnlimitedModeGivesCachedSegmentsBackWhenTheSystemRunsOut) {
  auto source = std::make_shared<CountingSource>(/*limit=*/5 * MiB);
  CachingAllocator allocator(Device::cpu(), CachingAllocatorOptions().debug_checks(true), source);
  void* large = alloc(allocator, 3 * MiB);  // 4 MiB segment
  release(allocator, large);                // cached
  void* small = alloc(allocator, KiB);      // a 2 MiB segment does not fit beside it
  EXPECT_EQ(source->segments_freed, 1);
  EXPECT_EQ(allocator.stats().reserved_bytes, static_cast<int64_t>(2 * MiB));
  std::string message = oom_message([&] { alloc(allocator, 4 * MiB); });
  EXPECT_NE(message.find("budget: none"), std::string::npos) << message;
  release(allocator, small);
}

TEST(CachingAllocator, SegmentedModeCapsReservedBytesByTheBudget) {
  // As on a GPU: segments on demand, but never more than the budget reserved.
  auto source = std::make_shared<CountingSource>();
  CachingAllocator allocator(Device::cuda(), arena(5 * MiB), source);
  EXPECT_EQ(allocator.stats().reserved_bytes, 0);
  EXPECT_EQ(allocator.largest_free_block(), 0u);
  EXPECT_EQ(allocator.largest_allocatable(), 5 * MiB);  // the budget, not reserved yet
  void* large = alloc(allocator, 3 * MiB);              // 4 MiB segment
  EXPECT_EQ(allocator.largest_allocatable(), MiB);
  void* small = alloc(allocator, KiB);  // the last 1 MiB of the budget as a small segment
  EXPECT_EQ(allocator.stats().reserved_bytes, static_cast<int64_t>(5 * MiB));
  EXPECT_EQ(allocator.largest_allocatable(), allocator.largest_free_block());
  oom_message([&] { alloc(allocator, 2 * MiB); });
  release(allocator, large);
  void* reused = alloc(allocator, 4 * MiB);  // the cached 4 MiB block
  EXPECT_EQ(reused, large);
  release(allocator, reused);
  release(allocator, small);
}

// While a policy can make room, a small request does not cut a large free block: the policy frees
// a block near its size first, and the large hole stays whole for the large tensors that need it.
// Where the policy can free nothing, the block is cut after all.
TEST(CachingAllocator, ASmallRequestCutsALargeHoleOnlyWhenThePolicyCanFreeNothing) {
  auto source = std::make_shared<CountingSource>();
  CachingAllocator allocator(Device::cuda(), arena(150 * MiB), source);
  void* small = alloc(allocator, 30 * MiB);   // its own segment
  void* large = alloc(allocator, 120 * MiB);  // the rest of the budget
  release(allocator, large);
  void* front = alloc(allocator, 40 * MiB);  // no policy: cuts the 120 MiB block
  EXPECT_EQ(front, large);
  EXPECT_EQ(allocator.largest_free_block(), 80 * MiB);

  CallbackPressureHandler frees_small([&](size_t, size_t) {
    release(allocator, small);
    return true;
  });
  allocator.set_pressure_handler(&frees_small);
  void* again = alloc(allocator, 30 * MiB);
  EXPECT_EQ(frees_small.calls.size(), 1u);
  EXPECT_EQ(again, small);                              // the freed block of its size
  EXPECT_EQ(allocator.largest_free_block(), 80 * MiB);  // the large hole still whole

  CallbackPressureHandler gives_up([](size_t, size_t) { return false; });
  allocator.set_pressure_handler(&gives_up);
  void* cut = alloc(allocator, 30 * MiB);
  EXPECT_EQ(gives_up.calls.size(), 1u);
  EXPECT_EQ(address(cut), address(front) + 40 * MiB);
  EXPECT_EQ(allocator.largest_free_block(), 50 * MiB);
  allocator.set_pressure_handler(nullptr);
  for (void* ptr : {again, front, cut}) release(allocator, ptr);
}

// What freeing a block makes room for, as the residency manager's last resort ranks the tensors
// it may move: the block with its free neighbours, or, for the last block of a segment, the
// segment given back plus the budget not reserved yet.
TEST(CachingAllocator, RoomIfFreedCountsAWholeSegmentAndTheUnreservedBudget) {
  auto source = std::make_shared<CountingSource>();
  CachingAllocator allocator(Device::cuda(), arena(150 * MiB), source);
  void* alone = alloc(allocator, 30 * MiB);   // its own segment
  void* shared = alloc(allocator, 60 * MiB);  // another
  EXPECT_EQ(allocator.unreserved_bytes(), 60 * MiB);
  EXPECT_EQ(allocator.room_if_freed(alone), 30 * MiB + 60 * MiB);
  release(allocator, shared);
  void* first = alloc(allocator, 20 * MiB);   // cut from the free 60 MiB segment
  void* second = alloc(allocator, 10 * MiB);  // cut from its 40 MiB rest, 30 MiB left after it
  EXPECT_EQ(allocator.room_if_freed(first), 20 * MiB);
  EXPECT_EQ(allocator.room_if_freed(second), 10 * MiB + 30 * MiB);
  CachingAllocator cpu_arena(Device::cpu(), arena(8 * MiB));
  EXPECT_EQ(cpu_arena.unreserved_bytes(), 0u);  // one arena, reserved whole
  for (void* ptr : {alone, first, second}) release(allocator, ptr);
}

TEST(CachingAllocator, TimelineRecordsEventsInOrder) {
  CachingAllocator allocator(Device::cpu(), arena(8 * KiB));
  void* a = alloc(allocator, KiB);
  void* b = alloc(allocator, 2 * KiB);
  release(allocator, a);
  allocator.record_event("evict", 4096);
  allocator.record_event("swap_out", 100);
  allocator.record_event("split", 0);

  std::vector<TimelineEvent> events = allocator.timeline();
  std::vector<std::string> kinds;
  for (const auto& event : events) kinds.push_back(event.kind);
  EXPECT_EQ(kinds, (std::vector<std::string>{"reserve", "alloc", "alloc", "free", "evict",
                                             "swap_out", "split"}));
  for (size_t i = 0; i < events.size(); ++i)
    EXPECT_EQ(events[i].clock, static_cast<int64_t>(i + 1));
  EXPECT_EQ(events[1].bytes, KiB);
  EXPECT_EQ(events[1].address, address(a));
  EXPECT_EQ(events[1].allocated_after, static_cast<int64_t>(KiB));
  EXPECT_EQ(events[2].allocated_after, static_cast<int64_t>(3 * KiB));
  EXPECT_EQ(events[3].allocated_after, static_cast<int64_t>(2 * KiB));
  EXPECT_EQ(events[4].bytes, 4096u);
  EXPECT_EQ(events[4].reserved_after, static_cast<int64_t>(8 * KiB));
  EXPECT_EQ(allocator.clock(), 7);

  PolicyCounters policy = allocator.policy_counters();
  EXPECT_EQ(policy.evictions, 1);
  EXPECT_EQ(policy.evicted_bytes, 4096);
  EXPECT_EQ(policy.swaps_out, 1);
  EXPECT_EQ(policy.swapped_out_bytes, 100);
  EXPECT_EQ(policy.splits, 1);
  EXPECT_EQ(allocator.memory_stats().policy.evictions, 1);

  std::vector<BlockInfo> blocks = allocator.snapshot();
  EXPECT_EQ(blocks[1].address, address(b));
  EXPECT_EQ(blocks[1].allocated_at, 3);
  release(allocator, b);
}

TEST(CachingAllocator, TimelineKeepsOnlyTheNewestEventsWhenFull) {
  CachingAllocator allocator(Device::cpu(), arena(8 * KiB).timeline_capacity(4));
  for (int i = 0; i < 5; ++i) release(allocator, alloc(allocator, KiB));  // 1 + 10 events
  std::vector<TimelineEvent> events = allocator.timeline();
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events.front().clock, 8);
  EXPECT_EQ(events.back().clock, 11);
  EXPECT_EQ(events.back().kind, "free");
  EXPECT_EQ(allocator.timeline_dropped(), 7);
}

TEST(CachingAllocator, BudgetCanGrowWhileBlocksAreLive) {
  CachingAllocator allocator(Device::cpu(), arena(4 * KiB));
  void* first = alloc(allocator, 4 * KiB);
  oom_message([&] { alloc(allocator, 4 * KiB); });
  allocator.set_budget(8 * KiB);
  EXPECT_EQ(allocator.budget(), 8 * KiB);
  void* second = alloc(allocator, 4 * KiB);
  EXPECT_TRUE(throws_error([&] { allocator.set_budget(2 * KiB); }, "cannot shrink the budget"));
  release(allocator, first);
  release(allocator, second);
  allocator.set_budget(2 * KiB);  // nothing live: a new arena of the new size
  EXPECT_EQ(allocator.stats().reserved_bytes, static_cast<int64_t>(2 * KiB));
  EXPECT_EQ(allocator.snapshot().size(), 1u);
  oom_message([&] { alloc(allocator, 3 * KiB); });
}

TEST(CachingAllocator, UnlimitedCpuAllocatorTakesABudgetBeforeItsFirstAllocation) {
  CachingAllocator allocator(Device::cpu(), CachingAllocatorOptions().debug_checks(true));
  EXPECT_FALSE(allocator.has_budget());
  EXPECT_EQ(allocator.budget(), 0u);
  release(allocator, alloc(allocator, KiB));  // cached segment, nothing live
  allocator.set_budget(64 * KiB);
  EXPECT_TRUE(allocator.has_budget());
  EXPECT_EQ(allocator.stats().reserved_bytes, static_cast<int64_t>(64 * KiB));
  void* live = alloc(allocator, KiB);
  CachingAllocator other(Device::cpu(), CachingAllocatorOptions().debug_checks(true));
  void* other_live = alloc(other, KiB);
  EXPECT_TRUE(throws_error([&] { other.set_budget(64 * KiB); }, "set the budget before"));
  release(other, other_live);
  release(allocator, live);
}

TEST(CachingAllocator, RejectsZeroAndTinyBudgets) {
  EXPECT_TRUE(throws_error(
      [] { CachingAllocator zero(Device::cpu(), CachingAllocatorOptions().budget(0)); },
      "budget must be at least 512 bytes"));
  EXPECT_TRUE(throws_error(
      [] { CachingAllocator tiny(Device::cpu(), CachingAllocatorOptions().budget(100)); },
      "got 100"));
  CachingAllocator allocator(Device::cpu(), arena(KiB));
  EXPECT_TRUE(throws_error([&] { allocator.set_budget(0); }, "at least 512"));
  EXPECT_EQ(allocator.budget(), KiB);
  EXPECT_TRUE(throws_error([] { CachingAllocator meta(Device::meta()); }, "meta"));
  EXPECT_TRUE(throws_error([] { install_caching_allocator(Device::cuda()); }, "segment source"));
}

// No CUDA here: the kCuda entries of core's table serve as a device type with several devices.
std::shared_ptr<Allocator> counting_for_factory(int index) {
  static auto* made = new std::map<int, std::shared_ptr<Allocator>>;
  auto& allocator = (*made)[index];
  if (!allocator) allocator = std::make_shared<CountingCpuAllocator>();
  return allocator;
}

// Blocks of 32 MiB and more go back to CountingCpuAllocator's own list when freed (glibc would
// unmap them and fault them in again): the next request of that size, or up to an eighth less,
// gets the same block, reserved_bytes counts it while it waits, and beyond kKeptLargeBytes the
// oldest go back to the system.
TEST(CountingCpuAllocator, KeepsFreedLargeBlocksForTheNextOfTheirSize) {
  CountingCpuAllocator allocator;
  const int64_t large = static_cast<int64_t>(CountingCpuAllocator::kLargeBlock) + 4096;
  auto* first = static_cast<char*>(allocator.allocate(large, {}));
  std::memset(first, 1, large);
  allocator.deallocate(first, large, {});
  EXPECT_EQ(allocator.stats().allocated_bytes, 0);
  EXPECT_GE(allocator.stats().reserved_bytes, large);
  // Much smaller: a block of its own; a little smaller: the kept one.
  void* small = allocator.allocate(large / 2, {});
  EXPECT_NE(small, static_cast<void*>(first));
  void* again = allocator.allocate(large - 1000, {});
  EXPECT_EQ(again, static_cast<void*>(first));
  EXPECT_EQ(allocator.stats().allocated_bytes, large / 2 + large - 1000);
  EXPECT_EQ(allocator.stats().reserved_bytes, allocator.stats().allocated_bytes);
  allocator.deallocate(small, large / 2, {});
  allocator.deallocate(again, large - 1000, {});
  // Freed all at once, more than the list keeps: it holds no more than kKeptLargeBytes.
  std::vector<void*> blocks;
  const int64_t count = CountingCpuAllocator::kKeptLargeBytes / large + 2;
  for (int64_t i = 0; i < count; ++i) blocks.push_back(allocator.allocate(large, {}));
  for (void* block : blocks) allocator.deallocate(block, large, {});
  EXPECT_EQ(allocator.stats().allocated_bytes, 0);
  EXPECT_LE(allocator.stats().reserved_bytes,
            static_cast<int64_t>(CountingCpuAllocator::kKeptLargeBytes));
  EXPECT_GT(allocator.stats().reserved_bytes, 0);
}

TEST(AllocatorTable, ADeviceOfItsOwnComesBeforeItsTypeAndTheFactoryLast) {
  EXPECT_TRUE(
      throws_error([] { allocator_for(Device::cuda(2)); }, "no allocator for device cuda:2"));
  set_allocator_factory(DeviceType::kCuda, &counting_for_factory);
  std::shared_ptr<Allocator> made = allocator_for(Device::cuda(2));
  EXPECT_EQ(made.get(), counting_for_factory(2).get());
  EXPECT_NE(allocator_for(Device::cuda(1)).get(), made.get());  // one per device

  auto own = std::make_shared<CountingCpuAllocator>();
  EXPECT_EQ(set_allocator(Device::cuda(2), own), nullptr);
  EXPECT_EQ(allocator_for(Device::cuda(2)).get(), own.get());
  EXPECT_EQ(allocator_for(Device::cuda(1)).get(), counting_for_factory(1).get());

  auto for_type = std::make_shared<CountingCpuAllocator>();
  set_allocator(DeviceType::kCuda, for_type);
  EXPECT_EQ(allocator_for(Device::cuda(1)).get(), for_type.get());
  EXPECT_EQ(allocator_for(Device::cuda(2)).get(), own.get());  // its own still wins

  EXPECT_EQ(set_allocator(Device::cuda(2), nullptr).get(), own.get());
  EXPECT_EQ(allocator_for(Device::cuda(2)).get(), for_type.get());
  set_allocator(DeviceType::kCuda, nullptr);
  set_allocator_factory(DeviceType::kCuda, nullptr);
  EXPECT_TRUE(throws_error([] { allocator_for(Device::cuda(1)); }, "build with --config=cuda"));
}

// The CPU's own allocator is found without the table's lock while nothing else is installed for
// the CPU; one installed for the CPU device or for its type takes over at once, and the CPU's own
// comes back when it is removed.
TEST(AllocatorTable, AnAllocatorInstalledForTheCpuTakesOverFromItsOwn) {
  const std::shared_ptr<Allocator> own = allocator_for(Device::cpu());
  auto for_device = std::make_shared<CountingCpuAllocator>();
  auto for_type = std::make_shared<CountingCpuAllocator>();
  {
    RestoreCpuAllocator restore;
    EXPECT_EQ(set_allocator(Device::cpu(), for_device), nullptr);
    EXPECT_EQ(allocator_for(Device::cpu()).get(), for_device.get());
    Tensor x = empty({4, 4});
    EXPECT_EQ(x.storage()->allocator().get(), for_device.get());
    EXPECT_EQ(for_device->stats().allocated_bytes, 64);
    EXPECT_EQ(set_allocator(Device::cpu(), nullptr).get(), for_device.get());
    EXPECT_EQ(allocator_for(Device::cpu()).get(), own.get());
    set_allocator(DeviceType::kCpu, for_type);
    EXPECT_EQ(allocator_for(Device::cpu()).get(), for_type.get());
    EXPECT_EQ(empty({2}).storage()->allocator().get(), for_type.get());
  }
  EXPECT_EQ(for_device->stats().allocated_bytes, 0);  // x went back to the allocator it came from
  EXPECT_EQ(allocator_for(Device::cpu()).get(), own.get());
  EXPECT_EQ(empty({2}).storage()->allocator().get(), own.get());
}

TEST(CachingAllocator, ABudgetOnAGpuNeedsTheCudaBackend) {
  EXPECT_TRUE(
      throws_error([] { make_caching_allocator(Device::cuda(0), CachingAllocatorOptions()); },
                   "memory budget on cuda:0: the CUDA backend is not built"));
  EXPECT_TRUE(throws_error(
      [] { make_caching_allocator(Device::meta(), CachingAllocatorOptions()); }, "meta device"));
  EXPECT_EQ(make_caching_allocator(Device::cpu(), arena(KiB))->budget(), KiB);
}

TEST(CachingAllocator, DebugChecksAreOnWhenAskedOrWhenTheEnvironmentSaysSo) {
  EXPECT_TRUE(CachingAllocator(Device::cpu(), arena(KiB)).debug_checks_enabled());
  setenv("TESSEL_MEMORY_CHECK", "1", 1);
  EXPECT_TRUE(CachingAllocator(Device::cpu()).debug_checks_enabled());
  unsetenv("TESSEL_MEMORY_CHECK");
#ifdef NDEBUG
  EXPECT_FALSE(CachingAllocator(Device::cpu()).debug_checks_enabled());
#else
  EXPECT_TRUE(CachingAllocator(Device::cpu()).debug_checks_enabled());
#endif
}

TEST(CachingAllocator, DeallocatingAForeignPointerIsAClearError) {
  CachingAllocator allocator(Device::cpu(), arena(4 * KiB));
  int not_ours = 0;
  EXPECT_TRUE(
      throws_error([&] { release(allocator, &not_ours); }, "was not allocated by this allocator"));
  void* ptr = alloc(allocator, KiB);
  release(allocator, ptr);
  EXPECT_TRUE(throws_error([&] { release(allocator, ptr); }, "already freed"));
  allocator.deallocate(nullptr, 0, Stream{});  // a no-op, like free(nullptr)
}

TEST(HostAllocator, PoolsHostMemoryAndCountsItApart) {
  auto source = std::make_shared<CountingSource>();
  HostAllocator host(source);
  void* ptr = host.allocate(10000, Stream{});
  std::memset(ptr, 7, 10000);
  EXPECT_EQ(host.stats().allocated_bytes, 10240);
  EXPECT_EQ(host.stats().reserved_bytes, static_cast<int64_t>(2 * MiB));
  host.deallocate(ptr, 10000, Stream{});
  EXPECT_EQ(host.allocate(10000, Stream{}), ptr);  // reused from its pool
  host.deallocate(ptr, 10000, Stream{});
  host.empty_cache();
  EXPECT_EQ(source->live_bytes, 0u);
  EXPECT_EQ(host.memory_stats().base.num_allocations, 2);

  std::shared_ptr<HostAllocator> shared = host_allocator();
  EXPECT_EQ(host_allocator(), shared);
  auto replacement = std::make_shared<HostAllocator>();
  EXPECT_EQ(set_host_allocator(replacement), shared);
  EXPECT_EQ(host_allocator(), replacement);
  set_host_allocator(shared);
}

TEST(MemoryJson, WritesStatsBlocksAndTimelineThatParse) {
  CachingAllocator allocator(Device::cpu(), arena(16 * KiB));
  void* a = alloc(allocator, KiB);
  allocator.set_owner(a, "weights");
  void* b = alloc(allocator, 2 * KiB);
  release(allocator, b);
  allocator.record_event("evict", 2048);

  const char* tmpdir = std::getenv("TEST_TMPDIR");
  std::string path = std::string(tmpdir ? tmpdir : "/tmp") + "/memory.json";
  write_memory_json(path, allocator);
  std::ifstream in(path);
  nlohmann::json parsed = nlohmann::json::parse(in);

  EXPECT_EQ(parsed["device"], "cpu");
  EXPECT_EQ(parsed["stats"]["budget"], 16 * KiB);
  EXPECT_EQ(parsed["stats"]["allocated_bytes"], KiB);
  EXPECT_EQ(parsed["stats"]["policy"]["evictions"], 1);
  ASSERT_EQ(parsed["blocks"].size(), 2u);
  EXPECT_EQ(parsed["blocks"][0]["owner"], "weights");
  EXPECT_EQ(parsed["blocks"][0]["offset"], 0);
  EXPECT_EQ(parsed["blocks"][1]["offset"], KiB);
  EXPECT_EQ(parsed["blocks"][1]["allocated"], false);
  ASSERT_EQ(parsed["timeline"].size(), 5u);
  EXPECT_EQ(parsed["timeline"][4]["kind"], "evict");
  EXPECT_EQ(parsed["timeline"][2]["allocated_after"], 3 * KiB);
  EXPECT_EQ(parsed["timeline_dropped"], 0);
  EXPECT_EQ(parsed, memory_json(allocator));

  EXPECT_TRUE(throws_error([&] { write_memory_json("/nonexistent/dir/memory.json", allocator); },
                           "cannot open"));
  release(allocator, a);
}

}  // namespace
}  // namespace tessel::memory
