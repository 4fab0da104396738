// The caching, budgeted allocator behind memory::Allocator: best fit with block splitting and
// coalescing, sizes rounded to 512 B, small and large pools, a hard budget, statistics, a
// snapshot of blocks and an event timeline. On CPU a budget makes it one arena of that size
// (a simulated device), so every memory policy is exercised without a GPU.
//   auto options = CachingAllocatorOptions().budget(size_t(1) << 30);
//   auto allocator = install_caching_allocator(Device::cpu(), options);
//   MemoryStats stats = allocator->memory_stats();  // allocated, peak, fragmentation...
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/allocator.h"
#include "core/device.h"

namespace tessel::memory {

// Where segments come from: host memory for the CPU (and the simulated device), cudaMalloc for
// CUDA (the CUDA backend supplies its own).
class SegmentSource {
 public:
  virtual ~SegmentSource() = default;
  virtual void* allocate_segment(size_t bytes) = 0;  // nullptr when the system has none
  virtual void free_segment(void* ptr, size_t bytes) = 0;
};

// Page-aligned host memory (std::aligned_alloc); the default source. Shared, stateless.
std::shared_ptr<SegmentSource> host_segment_source();

// Called when a request does not fit in any free block (the residency manager implements it):
// free something (evict, swap) and return true to have the allocator retry, or false to give up.
// It runs without the allocator's lock held, so it may free (and allocate) through the allocator.
// Returning true without freeing anything makes the allocator ask again.
class PressureHandler {
 public:
  virtual ~PressureHandler() = default;
  virtual bool relieve(size_t bytes_needed, size_t largest_free_block) = 0;
  // The allocator's out-of-memory report with what the handler knows added (what it could not
  // move, the least budget); called without the allocator's lock held.
  virtual std::string explain_out_of_memory(const std::string& report) { return report; }
};

struct CachingAllocatorOptions {
  size_t budget_ = 0;  // 0: unlimited (segments grow as needed)
  bool has_budget_ = false;
  size_t timeline_capacity_ = 100000;  // events kept (a ring buffer: the newest survive)
  bool debug_checks_ = false;          // verify every block list after each allocate and free
  bool arena_ = false;                 // one arena under a budget on any device (see arena())

  // A hard limit in bytes (at least 512; the usable part is a multiple of 512).
  CachingAllocatorOptions& budget(size_t bytes) {
    budget_ = bytes;
    has_budget_ = true;
    return *this;
  }
  // With a budget, hold every block in one arena of the budget's size, as the CPU always does,
  // instead of segments taken on demand (the memory simulator lays out a CPU run this way).
  CachingAllocatorOptions& arena(bool on) {
    arena_ = on;
    return *this;
  }
  CachingAllocatorOptions& timeline_capacity(size_t events) {
    timeline_capacity_ = events;
    return *this;
  }
  // Also on when TESSEL_MEMORY_CHECK=1 is set, and always in builds without NDEBUG.
  CachingAllocatorOptions& debug_checks(bool on) {
    debug_checks_ = on;
    return *this;
  }
};

// Counters kept beside the allocator's own (the residency manager reports into them through
// CachingAllocator::record_event).
struct PolicyCounters {
  int64_t evictions = 0, evicted_bytes = 0;
  int64_t recomputes = 0, recomputed_bytes = 0;
  int64_t swaps_out = 0, swapped_out_bytes = 0;
  int64_t swaps_in = 0, swapped_in_bytes = 0;
  int64_t splits = 0;
};

struct MemoryStats {
  AllocatorStats base;            // allocated (rounded block sizes), peak, reserved, counts
  size_t budget = 0;              // 0: unlimited
  size_t largest_free_block = 0;  // within reserved memory (and within the budget)
  double fragmentation = 0;  // 1 - largest_free_block / total free bytes (0 when no free bytes)
  PolicyCounters policy;
  size_t free_bytes = 0;        // free blocks inside reserved memory
  int64_t free_blocks = 0;      // how many free blocks (holes)
  int64_t requested_bytes = 0;  // bytes asked for by live allocations, before rounding
  // Reserved when the allocated bytes reached their peak: reserved_at_peak - peak is the
  // fragmentation at the peak (what the device holds beyond what tensors use, MegEngine's measure).
  int64_t reserved_at_peak = 0;
  int64_t segments = 0;        // segments held from the source (1 for a CPU arena)
  int64_t pressure_calls = 0;  // PressureHandler::relieve calls
  int64_t ooms = 0;            // OutOfMemory errors raised
};

struct BlockInfo {
  uintptr_t address;
  size_t size;
  bool allocated;
  std::string owner;         // what made it ("conv2d output", "parameter"...), when known
  size_t requested = 0;      // bytes asked for (allocated blocks)
  int64_t segment = 0;       // index of its segment in address order
  int64_t allocated_at = 0;  // logical clock of its allocation (allocated blocks)
};

struct TimelineEvent {
  int64_t clock;  // logical clock
  // "alloc", "free", "evict", "recompute", "swap_out", "swap_in", "split", "oom"; segments
  // taken from and given back to the source: "reserve", "release".
  std::string kind;
  size_t bytes;
  int64_t allocated_after;
  uintptr_t address = 0;  // the block, for alloc and free
  int64_t reserved_after = 0;
};

class CachingAllocator : public Allocator {
 public:
  // With a budget on CPU: one arena of the budget's size, taken from `source` now, holds every
  // block. Otherwise segments come from `source` on demand (capped by the budget if any) and are
  // cached: requests up to 1 MiB share 2 MiB small segments, larger ones get their own segment
  // rounded up to 2 MiB.
  explicit CachingAllocator(Device device, CachingAllocatorOptions options = {},
                            std::shared_ptr<SegmentSource> source = host_segment_source());
  ~CachingAllocator() override;
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // Rounds to 512 B and takes the smallest free block that fits. When none fits, asks the
  // PressureHandler while it returns true; then throws tessel::OutOfMemory with a report.
  void* allocate(size_t nbytes, Stream stream) override;
  // `nbytes` is not trusted: the block knows its size. Throws for a pointer it did not give.
  void deallocate(void* ptr, size_t nbytes, Stream stream) override;
  AllocatorStats stats() const override;
  void reset_peak() override;

  Device device() const { return device_; }
  // Not owned; nullptr removes it.
  void set_pressure_handler(PressureHandler* handler);
  // Changes the budget (at least 512 B). A CPU arena is rebuilt while nothing is allocated and
  // may only grow (by one more segment) while something is.
  void set_budget(size_t bytes);
  size_t budget() const;  // 0 when unlimited
  bool has_budget() const;

  size_t largest_free_block() const;
  // Roughly the largest request that fits now without relieving pressure: the largest free block,
  // or, when segments come on demand under a budget, the budget not yet reserved if that is more
  // (a segment's rounding may take a little of it); unlimited without a budget.
  size_t largest_allocatable() const;
  // Bytes of the free blocks directly left and right of the allocated block at `ptr` (what an
  // eviction of it would join into one hole).
  size_t free_bytes_adjacent(const void* ptr) const;
  // Bytes of the free block directly below the allocated block at `ptr` (0 when none).
  size_t free_bytes_below(const void* ptr) const;
  // When segments come on demand under a budget, the part of it not reserved as segments yet
  // (room a new segment may still take); 0 otherwise.
  size_t unreserved_bytes() const;
  // The largest request that freeing the allocated block at `ptr` would make room for: the block
  // with its free neighbours or, where it is the last allocated block of its segment and segments
  // come on demand under a budget, the whole segment (given back) plus the budget not reserved.
  size_t room_if_freed(const void* ptr) const;
  // Moves the allocated block at `ptr` down to the start of the free block below it, so the free
  // bytes join those above; returns the new address. `move_bytes(to)` moves the contents (the
  // two ranges may overlap); it runs under the allocator's lock, so no other allocation takes
  // either range meanwhile, and must not allocate from this allocator.
  void* slide_down(const void* ptr, const std::function<void(void* to)>& move_bytes);
  MemoryStats memory_stats() const;

  // Policy events from the residency manager: counted ("evict", "recompute", "swap_out",
  // "swap_in", "split"; `bytes` moved) and put on the timeline (any kind).
  void record_event(const std::string& kind, size_t bytes);
  PolicyCounters policy_counters() const;

  // Every block, allocated or free, in address order.
  std::vector<BlockInfo> snapshot() const;
  // Labels the allocated block at `ptr` (shown in snapshots and OOM reports).
  void set_owner(const void* ptr, std::string owner);
  // The kept events, oldest first, and how many older ones the ring buffer dropped.
  std::vector<TimelineEvent> timeline() const;
  int64_t timeline_dropped() const;
  int64_t clock() const;

  // Returns segments with no allocated block to the source (a CPU arena stays).
  void empty_cache();
  // Throws tessel::Error when block lists, free sets, counters or the budget disagree.
  void check_invariants() const;
  // Whether check_invariants runs after every allocate and free (see CachingAllocatorOptions).
  bool debug_checks_enabled() const { return debug_checks_; }

  static constexpr size_t kMinBlockSize = 512;
  static constexpr size_t kSmallRequest = 1 << 20;  // up to this: the small pool
  static constexpr size_t kSmallSegment = 2 << 20;
  static constexpr size_t kLargeSegmentRound = 2 << 20;
  // While a memory policy can make room (a pressure handler is set), a free block of at least
  // kKeepWholeFrom bytes is not cut for a request of less than 1 / kKeepWholeRatio of it: the
  // policy frees a block nearer the request's size first, and the large hole stays whole for the
  // large tensors that need it (cutting 48 MiB pieces from the 384 MiB holes of attention
  // tensors otherwise leaves gigabytes free in holes no request fits). Where the policy can free
  // nothing, the block is cut after all.
  static constexpr size_t kKeepWholeFrom = 32 << 20;
  static constexpr double kKeepWholeRatio = 2.5;
  static size_t round_size(size_t nbytes);

 private:
  struct Segment;
  struct Block;
  struct Pool;
  struct BlockOrder {
    bool operator()(const Block* a, const Block* b) const;
  };

  bool arena_mode() const { return (device_.is_cpu() || arena_) && has_budget_; }
  Pool& pool_for(size_t size);
  // keep_large_whole: see kKeepWholeFrom.
  Block* try_allocate_locked(size_t size, size_t nbytes, bool keep_large_whole);
  Block* best_fit_locked(Pool& pool, size_t size, bool keep_large_whole);
  Block* new_segment_locked(Pool& pool, size_t size);
  Segment* add_segment_locked(Pool& pool, size_t bytes);
  void release_segment_locked(Segment* segment);
  // Segments without an allocated block; the arena too when `arena_too`.
  void release_free_segments_locked(bool arena_too);
  void build_arena_locked(size_t usable_bytes);
  void push_event_locked(std::string kind, size_t bytes, uintptr_t address);
  size_t largest_free_locked(const Pool* pool) const;
  size_t unreserved_locked() const;
  // Bytes of the free blocks beside the allocated block at `ptr`; `caller` names it in the error.
  size_t free_bytes_adjacent_locked(const void* ptr, const char* caller) const;
  size_t free_bytes_locked() const;
  std::string oom_report_locked(size_t nbytes, size_t size, const Pool& pool) const;
  void check_invariants_locked() const;

  const Device device_;
  const std::shared_ptr<SegmentSource> source_;
  bool debug_checks_;
  const bool arena_;
  mutable std::mutex mutex_;

  size_t budget_ = 0;
  bool has_budget_ = false;
  std::unique_ptr<Pool> small_pool_, large_pool_, arena_pool_;
  std::map<uintptr_t, std::unique_ptr<Segment>> segments_;
  std::unordered_map<const void*, Block*> allocated_blocks_;
  PressureHandler* pressure_handler_ = nullptr;

  AllocatorStats stats_;
  int64_t reserved_at_peak_ = 0;
  PolicyCounters policy_;
  int64_t requested_bytes_ = 0;
  int64_t pressure_calls_ = 0;
  int64_t ooms_ = 0;

  std::vector<TimelineEvent> timeline_;  // ring buffer
  size_t timeline_capacity_;
  size_t timeline_next_ = 0;  // where the next event goes once full
  int64_t timeline_dropped_ = 0;
  int64_t clock_ = 0;
};

// Installs a caching allocator for every device of `device`'s type and returns it. Tensors
// allocated before keep (and free into) the allocator they came from. `source` may be left
// out only for the CPU (host memory); other devices pass their backend's source.
std::shared_ptr<CachingAllocator> install_caching_allocator(
    Device device, CachingAllocatorOptions options = {},
    std::shared_ptr<SegmentSource> source = nullptr);

// Makes a caching allocator for a device of one type; the CUDA backend registers one whose frees
// are ordered across streams. The CPU's needs none (host memory).
using CachingAllocatorMaker =
    std::shared_ptr<CachingAllocator> (*)(Device device, const CachingAllocatorOptions& options);
void set_caching_allocator_maker(DeviceType type, CachingAllocatorMaker maker);
// A new caching allocator for `device`, not installed: host segments for the CPU, the
// registered maker for other devices (an error naming the missing backend without one).
std::shared_ptr<CachingAllocator> make_caching_allocator(Device device,
                                                         const CachingAllocatorOptions& options);

// Blocks this thread allocates while one is alive get `owner` as their label (innermost wins).
class ScopedAllocationOwner {
 public:
  explicit ScopedAllocationOwner(std::string owner);
  ~ScopedAllocationOwner();
  ScopedAllocationOwner(const ScopedAllocationOwner&) = delete;
  ScopedAllocationOwner& operator=(const ScopedAllocationOwner&) = delete;

 private:
  std::string previous_;
};

// "1.50 MiB" style, for reports.
std::string format_bytes(double bytes);
// "1.00 KiB (1024 bytes)": readable, and exact for tests and scripts.
std::string describe_bytes(size_t bytes);

}  // namespace tessel::memory
