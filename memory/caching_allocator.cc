#include "memory/caching_allocator.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <sstream>

#include "core/error.h"

namespace tessel::memory {

// A run of bytes inside a segment; neighbours in address order are linked, so a free can
// coalesce in O(1) and a snapshot walks each segment from its head.
struct CachingAllocator::Block {
  uintptr_t address = 0;
  size_t size = 0;
  bool allocated = false;
  Block* prev = nullptr;
  Block* next = nullptr;
  Segment* segment = nullptr;
  size_t requested = 0;
  int64_t allocated_at = 0;
  std::string owner;
};

struct CachingAllocator::Segment {
  uintptr_t base = 0;
  size_t size = 0;
  Pool* pool = nullptr;
  Block* head = nullptr;
};

bool CachingAllocator::BlockOrder::operator()(const Block* a, const Block* b) const {
  if (a->size != b->size) return a->size < b->size;
  return a->address < b->address;
}

struct CachingAllocator::Pool {
  enum Kind { kSmall, kLarge, kArena } kind;
  explicit Pool(Kind pool_kind) : kind(pool_kind) {}
  // Free blocks by (size, address): lower_bound on the size is the best fit.
  std::set<Block*, BlockOrder> free_blocks;

  // The large pool keeps a remainder of 1 MiB or less with the block (as PyTorch does), so
  // small requests do not fragment large segments; elsewhere any remainder is split off.
  bool should_split(size_t remaining) const {
    if (kind == kLarge) return remaining > kSmallRequest;
    return remaining >= kMinBlockSize;
  }
};

namespace {

constexpr size_t kMaxRequest = size_t(1) << 62;
constexpr size_t kHostAlignment = 4096;

size_t round_up(size_t value, size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

size_t usable_arena_bytes(size_t budget) {
  return budget / CachingAllocator::kMinBlockSize * CachingAllocator::kMinBlockSize;
}

void check_budget(size_t bytes) {
  TESSEL_CHECK(bytes >= CachingAllocator::kMinBlockSize,
               "CachingAllocator: the budget must be at least ", CachingAllocator::kMinBlockSize,
               " bytes (one block), got ", bytes,
               bytes == 0 ? " (leave the budget unset for an unlimited allocator)" : "");
}

bool env_requests_checks() {
  const char* value = std::getenv("TESSEL_MEMORY_CHECK");
  return value && std::string(value) == "1";
}

std::string hex_address(uintptr_t address) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "0x%llx", static_cast<unsigned long long>(address));
  return buffer;
}

thread_local std::string current_allocation_owner;

class HostSegmentSource : public SegmentSource {
 public:
  void* allocate_segment(size_t bytes) override {
    if (bytes == 0 || bytes > kMaxRequest) return nullptr;
    return std::aligned_alloc(kHostAlignment, round_up(bytes, kHostAlignment));
  }
  void free_segment(void* ptr, size_t) override { std::free(ptr); }
};

}  // namespace

std::string describe_bytes(size_t bytes) {
  if (bytes < 1024) return std::to_string(bytes) + " bytes";
  return format_bytes(static_cast<double>(bytes)) + " (" + std::to_string(bytes) + " bytes)";
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  double value = bytes;
  while (std::abs(value) >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  char buffer[64];
  if (unit == 0) {
    std::snprintf(buffer, sizeof(buffer), "%.0f B", value);
  } else {
    std::snprintf(buffer, sizeof(buffer), "%.2f %s", value, units[unit]);
  }
  return buffer;
}

std::shared_ptr<SegmentSource> host_segment_source() {
  static auto source = std::make_shared<HostSegmentSource>();
  return source;
}

size_t CachingAllocator::round_size(size_t nbytes) {
  if (nbytes == 0) return kMinBlockSize;
  return round_up(nbytes, kMinBlockSize);
}

CachingAllocator::CachingAllocator(Device device, CachingAllocatorOptions options,
                                   std::shared_ptr<SegmentSource> source)
    : device_(device),
      source_(std::move(source)),
      arena_(options.arena_),
      small_pool_(std::make_unique<Pool>(Pool::kSmall)),
      large_pool_(std::make_unique<Pool>(Pool::kLarge)),
      arena_pool_(std::make_unique<Pool>(Pool::kArena)),
      timeline_capacity_(options.timeline_capacity_) {
  TESSEL_CHECK(source_ != nullptr, "CachingAllocator: the segment source is null");
  TESSEL_CHECK(!device.is_meta() || source_ != host_segment_source(),
               "CachingAllocator: the meta device holds no bytes (the memory simulator gives it a "
               "virtual segment source)");
#ifdef NDEBUG
  constexpr bool kDebugBuild = false;
#else
  constexpr bool kDebugBuild = true;
#endif
  debug_checks_ = options.debug_checks_ || env_requests_checks() || kDebugBuild;
  if (options.has_budget_) {
    check_budget(options.budget_);
    budget_ = options.budget_;
    has_budget_ = true;
  }
  timeline_.reserve(std::min<size_t>(timeline_capacity_, 4096));
  std::lock_guard<std::mutex> lock(mutex_);
  if (arena_mode()) build_arena_locked(usable_arena_bytes(budget_));
}

CachingAllocator::~CachingAllocator() {
  for (auto& [base, segment] : segments_) {
    for (Block* block = segment->head; block;) {
      Block* next = block->next;
      delete block;
      block = next;
    }
    source_->free_segment(reinterpret_cast<void*>(base), segment->size);
  }
}

CachingAllocator::Pool& CachingAllocator::pool_for(size_t size) {
  if (arena_mode()) return *arena_pool_;
  return size <= kSmallRequest ? *small_pool_ : *large_pool_;
}

void* CachingAllocator::allocate(size_t nbytes, Stream /*stream*/) {
  std::unique_lock<std::mutex> lock(mutex_);
  size_t size = nbytes > kMaxRequest ? kMaxRequest : round_size(nbytes);
  if (nbytes <= kMaxRequest) {
    while (true) {
      // While a policy can make room, large free blocks are kept whole (kKeepWholeFrom).
      if (Block* block = try_allocate_locked(size, nbytes, pressure_handler_ != nullptr)) {
        return reinterpret_cast<void*>(block->address);
      }
      PressureHandler* handler = pressure_handler_;
      if (!handler) break;
      size_t largest = largest_free_locked(&pool_for(size));
      ++pressure_calls_;
      // The handler frees through this allocator (evictions, swaps): it must not hold the lock.
      lock.unlock();
      bool retry = handler->relieve(size, largest);
      lock.lock();
      if (retry) continue;
      // Nothing more to free: cut a large block after all.
      if (Block* block = try_allocate_locked(size, nbytes, /*keep_large_whole=*/false)) {
        return reinterpret_cast<void*>(block->address);
      }
      break;
    }
  }
  ++ooms_;
  push_event_locked("oom", size, 0);
  std::string report = oom_report_locked(nbytes, size, pool_for(size));
  PressureHandler* handler = pressure_handler_;
  lock.unlock();
  // The policy's part of the report, whatever asked (an op, a data loader thread, a restore).
  if (handler) report = handler->explain_out_of_memory(report);
  throw TESSEL_ERROR_TYPE(OutOfMemory, report);
}

CachingAllocator::Block* CachingAllocator::try_allocate_locked(size_t size, size_t nbytes,
                                                               bool keep_large_whole) {
  Pool& pool = pool_for(size);
  Block* block = best_fit_locked(pool, size, keep_large_whole);
  if (!block && !arena_mode()) block = new_segment_locked(pool, size);
  if (!block) return nullptr;

  pool.free_blocks.erase(block);
  size_t remaining = block->size - size;
  if (pool.should_split(remaining)) {
    auto* rest = new Block;
    rest->address = block->address + size;
    rest->size = remaining;
    rest->segment = block->segment;
    rest->prev = block;
    rest->next = block->next;
    if (block->next) block->next->prev = rest;
    block->next = rest;
    block->size = size;
    pool.free_blocks.insert(rest);
  }
  block->allocated = true;
  block->requested = nbytes;
  block->owner = current_allocation_owner;
  allocated_blocks_[reinterpret_cast<const void*>(block->address)] = block;

  stats_.allocated_bytes += static_cast<int64_t>(block->size);
  if (stats_.allocated_bytes > stats_.peak_allocated_bytes) {
    stats_.peak_allocated_bytes = stats_.allocated_bytes;
    reserved_at_peak_ = stats_.reserved_bytes;
  }
  ++stats_.num_allocations;
  requested_bytes_ += static_cast<int64_t>(nbytes);
  push_event_locked("alloc", block->size, block->address);
  block->allocated_at = clock_;
  if (debug_checks_) check_invariants_locked();
  return block;
}

CachingAllocator::Block* CachingAllocator::best_fit_locked(Pool& pool, size_t size,
                                                           bool keep_large_whole) {
  Block key;
  key.size = size;
  key.address = 0;
  auto it = pool.free_blocks.lower_bound(&key);
  if (it == pool.free_blocks.end()) return nullptr;
  // The best fit is the smallest block that fits: if it is too large to cut, so is every other.
  if (keep_large_whole && pool.kind == Pool::kLarge && (*it)->size >= kKeepWholeFrom &&
      static_cast<double>((*it)->size) > kKeepWholeRatio * static_cast<double>(size))
    return nullptr;
  return *it;
}

CachingAllocator::Block* CachingAllocator::new_segment_locked(Pool& pool, size_t size) {
  size_t bytes = pool.kind == Pool::kSmall ? kSmallSegment : round_up(size, kLargeSegmentRound);
  if (has_budget_) {
    auto reserved = static_cast<size_t>(stats_.reserved_bytes);
    if (reserved + bytes > budget_) {
      release_free_segments_locked(false);
      reserved = static_cast<size_t>(stats_.reserved_bytes);
    }
    if (reserved + bytes > budget_) {
      // The last part of the budget: a segment just big enough.
      size_t room = usable_arena_bytes(budget_ - std::min(budget_, reserved));
      if (room < size) return nullptr;
      bytes = room;
    }
  }
  Segment* segment = add_segment_locked(pool, bytes);
  if (!segment) {
    // The system is out of memory: give back what is cached and try once more.
    release_free_segments_locked(false);
    segment = add_segment_locked(pool, bytes);
  }
  return segment ? segment->head : nullptr;
}

CachingAllocator::Segment* CachingAllocator::add_segment_locked(Pool& pool, size_t bytes) {
  void* base = source_->allocate_segment(bytes);
  if (!base) return nullptr;
  auto address = reinterpret_cast<uintptr_t>(base);
  if (address % 64 != 0) {
    source_->free_segment(base, bytes);
    TESSEL_FAIL("CachingAllocator: the segment source returned ", hex_address(address),
                ", which is not aligned to 64 bytes");
  }
  auto segment = std::make_unique<Segment>();
  segment->base = address;
  segment->size = bytes;
  segment->pool = &pool;
  auto* head = new Block;
  head->address = address;
  head->size = bytes;
  head->segment = segment.get();
  segment->head = head;
  pool.free_blocks.insert(head);
  Segment* result = segment.get();
  segments_[address] = std::move(segment);
  stats_.reserved_bytes += static_cast<int64_t>(bytes);
  push_event_locked("reserve", bytes, address);
  return result;
}

void CachingAllocator::release_segment_locked(Segment* segment) {
  Block* head = segment->head;
  segment->pool->free_blocks.erase(head);
  delete head;
  uintptr_t base = segment->base;
  size_t size = segment->size;
  source_->free_segment(reinterpret_cast<void*>(base), size);
  stats_.reserved_bytes -= static_cast<int64_t>(size);
  segments_.erase(base);
  push_event_locked("release", size, base);
}

void CachingAllocator::release_free_segments_locked(bool arena_too) {
  std::vector<Segment*> unused;
  for (auto& [base, segment] : segments_) {
    bool whole_free = !segment->head->allocated && segment->head->next == nullptr;
    if (whole_free && (arena_too || segment->pool != arena_pool_.get())) {
      unused.push_back(segment.get());
    }
  }
  for (Segment* segment : unused) release_segment_locked(segment);
}

void CachingAllocator::build_arena_locked(size_t usable_bytes) {
  if (!add_segment_locked(*arena_pool_, usable_bytes)) {
    throw TESSEL_ERROR_TYPE(OutOfMemory, "CachingAllocator: could not reserve an arena of ",
                            describe_bytes(usable_bytes), " for the ", device_.str(),
                            " budget from the system");
  }
}

void CachingAllocator::deallocate(void* ptr, size_t /*nbytes*/, Stream /*stream*/) {
  if (!ptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = allocated_blocks_.find(ptr);
  TESSEL_CHECK(it != allocated_blocks_.end(),
               "CachingAllocator::deallocate: ", hex_address(reinterpret_cast<uintptr_t>(ptr)),
               " was not allocated by this allocator, or was already freed");
  Block* block = it->second;
  allocated_blocks_.erase(it);
  size_t freed = block->size;
  uintptr_t address = block->address;
  stats_.allocated_bytes -= static_cast<int64_t>(freed);
  ++stats_.num_frees;
  requested_bytes_ -= static_cast<int64_t>(block->requested);
  block->allocated = false;
  block->requested = 0;
  block->owner.clear();

  Pool& pool = *block->segment->pool;
  if (Block* prev = block->prev; prev && !prev->allocated) {
    pool.free_blocks.erase(prev);
    prev->size += block->size;
    prev->next = block->next;
    if (block->next) block->next->prev = prev;
    delete block;
    block = prev;
  }
  if (Block* next = block->next; next && !next->allocated) {
    pool.free_blocks.erase(next);
    block->size += next->size;
    block->next = next->next;
    if (next->next) next->next->prev = block;
    delete next;
  }
  pool.free_blocks.insert(block);
  push_event_locked("free", freed, address);
  if (debug_checks_) check_invariants_locked();
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
  reserved_at_peak_ = stats_.reserved_bytes;
}

void CachingAllocator::set_pressure_handler(PressureHandler* handler) {
  std::lock_guard<std::mutex> lock(mutex_);
  pressure_handler_ = handler;
}

void CachingAllocator::set_budget(size_t bytes) {
  check_budget(bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  if (device_.is_cpu()) {
    if (allocated_blocks_.empty()) {
      release_free_segments_locked(true);
      build_arena_locked(usable_arena_bytes(bytes));
    } else {
      TESSEL_CHECK(has_budget_, "CachingAllocator::set_budget: a CPU allocator becomes an arena ",
                   "of the budget's size, so set the budget before allocating (",
                   allocated_blocks_.size(), " blocks are live)");
      TESSEL_CHECK(bytes >= budget_, "CachingAllocator::set_budget: cannot shrink the budget from ",
                   describe_bytes(budget_), " to ", describe_bytes(bytes), " while ",
                   describe_bytes(static_cast<size_t>(stats_.allocated_bytes)),
                   " are allocated; free everything first");
      size_t reserved = static_cast<size_t>(stats_.reserved_bytes);
      size_t usable = usable_arena_bytes(bytes);
      if (usable > reserved && !add_segment_locked(*arena_pool_, usable - reserved)) {
        throw TESSEL_ERROR_TYPE(OutOfMemory, "CachingAllocator::set_budget: could not reserve ",
                                describe_bytes(usable - reserved), " more from the system");
      }
    }
  } else {
    if (static_cast<size_t>(stats_.reserved_bytes) > bytes) release_free_segments_locked(false);
    TESSEL_CHECK(static_cast<size_t>(stats_.reserved_bytes) <= bytes,
                 "CachingAllocator::set_budget: cannot lower the budget to ", describe_bytes(bytes),
                 ": live blocks hold segments of ",
                 describe_bytes(static_cast<size_t>(stats_.reserved_bytes)));
  }
  budget_ = bytes;
  has_budget_ = true;
  if (debug_checks_) check_invariants_locked();
}

size_t CachingAllocator::budget() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return has_budget_ ? budget_ : 0;
}

bool CachingAllocator::has_budget() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return has_budget_;
}

size_t CachingAllocator::largest_free_locked(const Pool* pool) const {
  size_t largest = 0;
  for (const Pool* candidate : {small_pool_.get(), large_pool_.get(), arena_pool_.get()}) {
    if (pool && candidate != pool) continue;
    if (!candidate->free_blocks.empty()) {
      largest = std::max(largest, (*candidate->free_blocks.rbegin())->size);
    }
  }
  return largest;
}

size_t CachingAllocator::free_bytes_locked() const {
  return static_cast<size_t>(stats_.reserved_bytes - stats_.allocated_bytes);
}

size_t CachingAllocator::largest_free_block() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return largest_free_locked(nullptr);
}

size_t CachingAllocator::largest_allocatable() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!has_budget_) return std::numeric_limits<size_t>::max();
  return std::max(largest_free_locked(nullptr), unreserved_locked());
}

size_t CachingAllocator::unreserved_locked() const {
  if (!has_budget_ || arena_mode()) return 0;
  const auto reserved = static_cast<size_t>(stats_.reserved_bytes);
  return budget_ > reserved ? budget_ - reserved : 0;
}

size_t CachingAllocator::unreserved_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return unreserved_locked();
}

size_t CachingAllocator::free_bytes_adjacent_locked(const void* ptr, const char* caller) const {
  auto it = allocated_blocks_.find(ptr);
  TESSEL_CHECK(it != allocated_blocks_.end(), "CachingAllocator::", caller, ": ",
               hex_address(reinterpret_cast<uintptr_t>(ptr)), " is not an allocated block");
  const Block* block = it->second;
  size_t bytes = 0;
  if (block->prev && !block->prev->allocated) bytes += block->prev->size;
  if (block->next && !block->next->allocated) bytes += block->next->size;
  return bytes;
}

size_t CachingAllocator::room_if_freed(const void* ptr) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const size_t with_neighbours = free_bytes_adjacent_locked(ptr, "room_if_freed");
  const Block* block = allocated_blocks_.at(ptr);
  if (!has_budget_ || arena_mode()) return block->size + with_neighbours;
  for (const Block* other = block->segment->head; other; other = other->next)
    if (other != block && other->allocated) return block->size + with_neighbours;
  return block->segment->size + unreserved_locked();
}

size_t CachingAllocator::free_bytes_adjacent(const void* ptr) const {
  if (!ptr) return 0;
  std::lock_guard<std::mutex> lock(mutex_);
  return free_bytes_adjacent_locked(ptr, "free_bytes_adjacent");
}

size_t CachingAllocator::free_bytes_below(const void* ptr) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = allocated_blocks_.find(ptr);
  TESSEL_CHECK(it != allocated_blocks_.end(), "CachingAllocator::free_bytes_below: ",
               hex_address(reinterpret_cast<uintptr_t>(ptr)), " is not an allocated block");
  const Block* prev = it->second->prev;
  return prev && !prev->allocated ? prev->size : 0;
}

void* CachingAllocator::slide_down(const void* ptr,
                                   const std::function<void(void* to)>& move_bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = allocated_blocks_.find(ptr);
  TESSEL_CHECK(it != allocated_blocks_.end(),
               "CachingAllocator::slide_down: ", hex_address(reinterpret_cast<uintptr_t>(ptr)),
               " is not an allocated block");
  Block* block = it->second;
  Block* below = block->prev;
  TESSEL_CHECK(below && !below->allocated, "CachingAllocator::slide_down: no free block below ",
               hex_address(block->address));
  move_bytes(reinterpret_cast<void*>(below->address));
  Pool& pool = *block->segment->pool;
  pool.free_blocks.erase(below);
  allocated_blocks_.erase(it);
  push_event_locked("free", block->size, block->address);
  // The lower node becomes the allocated block, the upper one the free bytes.
  const size_t free_size = below->size;
  below->allocated = true;
  below->size = block->size;
  below->requested = block->requested;
  below->allocated_at = block->allocated_at;
  below->owner = std::move(block->owner);
  block->allocated = false;
  block->address = below->address + below->size;
  block->size = free_size;
  block->requested = 0;
  block->owner.clear();
  if (Block* next = block->next; next && !next->allocated) {
    pool.free_blocks.erase(next);
    block->size += next->size;
    block->next = next->next;
    if (next->next) next->next->prev = block;
    delete next;
  }
  pool.free_blocks.insert(block);
  allocated_blocks_[reinterpret_cast<const void*>(below->address)] = below;
  push_event_locked("alloc", below->size, below->address);
  if (debug_checks_) check_invariants_locked();
  return reinterpret_cast<void*>(below->address);
}

MemoryStats CachingAllocator::memory_stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  MemoryStats result;
  result.base = stats_;
  result.budget = has_budget_ ? budget_ : 0;
  result.largest_free_block = largest_free_locked(nullptr);
  result.free_bytes = free_bytes_locked();
  result.free_blocks =
      static_cast<int64_t>(small_pool_->free_blocks.size() + large_pool_->free_blocks.size() +
                           arena_pool_->free_blocks.size());
  result.fragmentation = result.free_bytes == 0
                             ? 0.0
                             : 1.0 - static_cast<double>(result.largest_free_block) /
                                         static_cast<double>(result.free_bytes);
  result.policy = policy_;
  result.requested_bytes = requested_bytes_;
  result.reserved_at_peak = reserved_at_peak_;
  result.segments = static_cast<int64_t>(segments_.size());
  result.pressure_calls = pressure_calls_;
  result.ooms = ooms_;
  return result;
}

void CachingAllocator::record_event(const std::string& kind, size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto amount = static_cast<int64_t>(bytes);
  if (kind == "evict") {
    ++policy_.evictions;
    policy_.evicted_bytes += amount;
  } else if (kind == "recompute") {
    ++policy_.recomputes;
    policy_.recomputed_bytes += amount;
  } else if (kind == "swap_out") {
    ++policy_.swaps_out;
    policy_.swapped_out_bytes += amount;
  } else if (kind == "swap_in") {
    ++policy_.swaps_in;
    policy_.swapped_in_bytes += amount;
  } else if (kind == "split") {
    ++policy_.splits;
  }
  push_event_locked(kind, bytes, 0);
}

PolicyCounters CachingAllocator::policy_counters() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return policy_;
}

std::vector<BlockInfo> CachingAllocator::snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<BlockInfo> blocks;
  int64_t index = 0;
  for (const auto& [base, segment] : segments_) {
    for (const Block* block = segment->head; block; block = block->next) {
      BlockInfo info{block->address, block->size, block->allocated, block->owner};
      info.requested = block->requested;
      info.segment = index;
      info.allocated_at = block->allocated ? block->allocated_at : 0;
      blocks.push_back(std::move(info));
    }
    ++index;
  }
  return blocks;
}

void CachingAllocator::set_owner(const void* ptr, std::string owner) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = allocated_blocks_.find(ptr);
  TESSEL_CHECK(it != allocated_blocks_.end(),
               "CachingAllocator::set_owner: ", hex_address(reinterpret_cast<uintptr_t>(ptr)),
               " is not an allocated block");
  it->second->owner = std::move(owner);
}

void CachingAllocator::push_event_locked(std::string kind, size_t bytes, uintptr_t address) {
  TimelineEvent event{++clock_, std::move(kind),      bytes, stats_.allocated_bytes,
                      address,  stats_.reserved_bytes};
  if (timeline_capacity_ == 0) {
    ++timeline_dropped_;
  } else if (timeline_.size() < timeline_capacity_) {
    timeline_.push_back(std::move(event));
  } else {
    timeline_[timeline_next_] = std::move(event);
    timeline_next_ = (timeline_next_ + 1) % timeline_capacity_;
    ++timeline_dropped_;
  }
}

std::vector<TimelineEvent> CachingAllocator::timeline() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<TimelineEvent> events;
  events.reserve(timeline_.size());
  // Once full, timeline_next_ is the oldest event.
  for (size_t i = 0; i < timeline_.size(); ++i) {
    events.push_back(timeline_[(timeline_next_ + i) % timeline_.size()]);
  }
  return events;
}

int64_t CachingAllocator::timeline_dropped() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return timeline_dropped_;
}

int64_t CachingAllocator::clock() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return clock_;
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  release_free_segments_locked(false);
}

std::string CachingAllocator::oom_report_locked(size_t nbytes, size_t size,
                                                const Pool& pool) const {
  std::ostringstream out;
  out << "out of memory on " << device_.str() << ": cannot allocate " << describe_bytes(nbytes);
  if (nbytes <= kMaxRequest && size != nbytes) out << ", " << size << " bytes after rounding";
  out << "\n  budget: "
      << (has_budget_ ? describe_bytes(budget_) : std::string("none (the system has no more)"));
  out << "\n  in use: " << describe_bytes(static_cast<size_t>(stats_.allocated_bytes)) << " in "
      << allocated_blocks_.size() << " blocks; peak "
      << describe_bytes(static_cast<size_t>(stats_.peak_allocated_bytes)) << "; reserved "
      << describe_bytes(static_cast<size_t>(stats_.reserved_bytes));
  size_t free_total = free_bytes_locked();
  size_t largest = largest_free_locked(&pool);
  size_t largest_anywhere = largest_free_locked(nullptr);
  size_t holes = small_pool_->free_blocks.size() + large_pool_->free_blocks.size() +
                 arena_pool_->free_blocks.size();
  double fragmentation = free_total == 0 ? 0.0
                                         : 1.0 - static_cast<double>(largest_anywhere) /
                                                     static_cast<double>(free_total);
  char fragmentation_text[32];
  std::snprintf(fragmentation_text, sizeof(fragmentation_text), "%.2f", fragmentation);
  out << "\n  free: " << describe_bytes(free_total) << " in " << holes
      << " blocks; largest free block " << describe_bytes(largest) << "; fragmentation "
      << fragmentation_text;
  if (has_budget_ && size <= free_total && size > largest) {
    out << "\n  the free total would fit the request but no single free block does: memory "
           "is fragmented";
  }

  std::vector<const Block*> live;
  live.reserve(allocated_blocks_.size());
  for (const auto& entry : allocated_blocks_) live.push_back(entry.second);
  std::sort(live.begin(), live.end(), [](const Block* a, const Block* b) {
    return a->size != b->size ? a->size > b->size : a->address < b->address;
  });
  constexpr size_t kHoldersShown = 10;
  if (!live.empty()) out << "\n  largest live blocks:";
  for (size_t i = 0; i < live.size() && i < kHoldersShown; ++i) {
    out << "\n    " << describe_bytes(live[i]->size) << " at " << hex_address(live[i]->address)
        << ", owner: " << (live[i]->owner.empty() ? "(unlabelled)" : live[i]->owner);
  }
  if (live.size() > kHoldersShown)
    out << "\n    ... and " << live.size() - kHoldersShown << " more";
  // With a policy at work (it installed the pressure handler) the report it appends says what it
  // could not move and the least budget this op needs.
  if (pressure_handler_ != nullptr)
    out << "\n  options: a larger budget or a smaller batch (the memory policy below could not "
           "make room)";
  else
    out << "\n  options: a memory policy (dtr, swap, split, auto), a larger budget, or a smaller "
           "batch";
  return out.str();
}

void CachingAllocator::check_invariants() const {
  std::lock_guard<std::mutex> lock(mutex_);
  check_invariants_locked();
}

void CachingAllocator::check_invariants_locked() const {
  int64_t allocated = 0, reserved = 0;
  size_t allocated_count = 0, free_count = 0;
  auto fail = [](const std::string& what) {
    throw TESSEL_ERROR_TYPE(Error, "CachingAllocator invariant broken: ", what);
  };
  for (const auto& [base, segment] : segments_) {
    reserved += static_cast<int64_t>(segment->size);
    if (segment->base != base || !segment->head || segment->head->prev) {
      fail("segment " + hex_address(base) + " has a bad head");
    }
    uintptr_t expected = base;
    for (const Block* block = segment->head; block; block = block->next) {
      std::string where = "block " + hex_address(block->address);
      if (block->address != expected) fail(where + " leaves a gap or overlaps its neighbour");
      if (block->segment != segment.get()) fail(where + " points to another segment");
      if (block->size == 0 || block->size % kMinBlockSize != 0) fail(where + " has a bad size");
      if (block->next && block->next->prev != block) fail(where + ": next->prev is not itself");
      if (block->allocated) {
        ++allocated_count;
        allocated += static_cast<int64_t>(block->size);
        auto it = allocated_blocks_.find(reinterpret_cast<const void*>(block->address));
        if (it == allocated_blocks_.end() || it->second != block) fail(where + " is not indexed");
      } else {
        ++free_count;
        if (block->prev && !block->prev->allocated) fail(where + " was not coalesced");
        if (!segment->pool->free_blocks.count(const_cast<Block*>(block))) {
          fail(where + " is free but not in its pool");
        }
      }
      expected = block->address + block->size;
    }
    if (expected != base + segment->size) fail("segment " + hex_address(base) + " is not covered");
  }
  size_t pooled = small_pool_->free_blocks.size() + large_pool_->free_blocks.size() +
                  arena_pool_->free_blocks.size();
  if (pooled != free_count) fail("the pools hold blocks that are not in any segment");
  if (allocated_count != allocated_blocks_.size()) fail("the allocated index has stale entries");
  if (allocated != stats_.allocated_bytes) fail("allocated bytes disagree with the blocks");
  if (reserved != stats_.reserved_bytes) fail("reserved bytes disagree with the segments");
  if (has_budget_ && static_cast<size_t>(reserved) > budget_) {
    fail("reserved " + std::to_string(reserved) + " bytes exceed the budget of " +
         std::to_string(budget_));
  }
  if (has_budget_ && static_cast<size_t>(allocated) > budget_) {
    fail("allocated " + std::to_string(allocated) + " bytes exceed the budget of " +
         std::to_string(budget_));
  }
}

std::shared_ptr<CachingAllocator> install_caching_allocator(Device device,
                                                            CachingAllocatorOptions options,
                                                            std::shared_ptr<SegmentSource> source) {
  TESSEL_CHECK(source || device.is_cpu(), "install_caching_allocator: ", device.str(),
               " needs its backend's segment source (host memory serves only the CPU)");
  if (!source) source = host_segment_source();
  auto allocator = std::make_shared<CachingAllocator>(device, options, std::move(source));
  set_allocator(device.type, allocator);
  return allocator;
}

namespace {
std::mutex& makers_mutex() {
  static std::mutex mutex;
  return mutex;
}
CachingAllocatorMaker& maker_for(DeviceType type) {
  static CachingAllocatorMaker makers[kNumDeviceTypes] = {};
  return makers[static_cast<int>(type)];
}
}  // namespace

void set_caching_allocator_maker(DeviceType type, CachingAllocatorMaker maker) {
  std::lock_guard<std::mutex> lock(makers_mutex());
  maker_for(type) = maker;
}

std::shared_ptr<CachingAllocator> make_caching_allocator(Device device,
                                                         const CachingAllocatorOptions& options) {
  if (device.is_cpu()) return std::make_shared<CachingAllocator>(device, options);
  CachingAllocatorMaker maker = nullptr;
  {
    std::lock_guard<std::mutex> lock(makers_mutex());
    maker = maker_for(device.type);
  }
  TESSEL_CHECK(maker != nullptr || !device.is_meta(),
               "memory budget: the meta device holds no bytes (a budget on it needs the memory "
               "simulator, memory::sim::Simulation)");
  TESSEL_CHECK(maker != nullptr, "memory budget on ", device.str(),
               ": the CUDA backend is not built (build with --config=cuda)");
  return maker(device, options);
}

ScopedAllocationOwner::ScopedAllocationOwner(std::string owner)
    : previous_(std::move(current_allocation_owner)) {
  current_allocation_owner = std::move(owner);
}

ScopedAllocationOwner::~ScopedAllocationOwner() { current_allocation_owner = std::move(previous_); }

}  // namespace tessel::memory
