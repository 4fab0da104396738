#include "core/allocator.h"

#include <malloc.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <utility>

#include "core/error.h"

namespace tessel::memory {

namespace {

constexpr size_t kAlignment = 64;

// glibc gives a freed block above its mmap threshold, and a free heap top above its trim
// threshold, back to the system at once, so the next tensor of that size page-faults all of its
// memory in again. Evaluation, which frees each activation as soon as the next op has read it,
// spent about a fifth of its time in those page faults. Tensors are large and recycled every
// step: blocks up to 32 MiB (glibc's largest mmap threshold) come from the heap, and up to 1 GiB
// of freed heap stays for reuse. MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ set by the user
// win.
void keep_freed_tensor_memory() {
#ifdef __GLIBC__
  if (!std::getenv("MALLOC_MMAP_THRESHOLD_")) mallopt(M_MMAP_THRESHOLD, 32 << 20);
  if (!std::getenv("MALLOC_TRIM_THRESHOLD_")) mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
}

// 64-byte aligned blocks from plain malloc, the block's start kept just below the aligned
// pointer: glibc's aligned_alloc and posix_memalign page-fault a large block in anew on every
// allocation, whatever the thresholds, where malloc reuses the freed one.
void* aligned_malloc(size_t bytes) {
  void* block = std::malloc(bytes + kAlignment);
  if (!block) return nullptr;
  // malloc aligns to 16, so at least 16 bytes lie between the block and the aligned pointer.
  const auto aligned = (reinterpret_cast<uintptr_t>(block) + kAlignment) & ~(kAlignment - 1);
  reinterpret_cast<void**>(aligned)[-1] = block;
  return reinterpret_cast<void*>(aligned);
}

void aligned_free(void* ptr) { std::free(reinterpret_cast<void**>(ptr)[-1]); }

}  // namespace

namespace {
std::atomic<int> threads_counting{0};
}  // namespace

void CountingCpuAllocator::EventCount::add() {
  thread_local const int slot = threads_counting.fetch_add(1);
  if (slot >= kSlots) {
    shared_.fetch_add(1);
    return;
  }
  std::atomic<int64_t>& value = slots_[slot].value;
  value.store(value.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
}

int64_t CountingCpuAllocator::EventCount::total() const {
  int64_t total = shared_.load();
  for (const Slot& slot : slots_) total += slot.value.load(std::memory_order_relaxed);
  return total;
}

CountingCpuAllocator::~CountingCpuAllocator() {
  for (const auto& [bytes, ptr] : large_kept_) aligned_free(ptr);
}

// A kept block of at least `bytes` and at most an eighth more (the smallest such), or null.
void* CountingCpuAllocator::reuse_large(size_t bytes) {
  std::lock_guard<std::mutex> lock(large_mutex_);
  auto best = large_kept_.end();
  for (auto it = large_kept_.begin(); it != large_kept_.end(); ++it)
    if (it->first >= bytes && it->first <= bytes + bytes / 8 &&
        (best == large_kept_.end() || it->first < best->first))
      best = it;
  if (best == large_kept_.end()) return nullptr;
  void* ptr = best->second;
  large_in_use_[ptr] = best->first;
  large_kept_bytes_ -= static_cast<int64_t>(best->first);
  large_kept_.erase(best);
  return ptr;
}

// Keeps a freed large block, giving back the oldest beyond kKeptLargeBytes; false when `ptr`
// is not one.
bool CountingCpuAllocator::keep_large(void* ptr) {
  std::lock_guard<std::mutex> lock(large_mutex_);
  auto used = large_in_use_.find(ptr);
  if (used == large_in_use_.end()) return false;
  large_kept_.emplace_back(used->second, ptr);
  large_kept_bytes_ += static_cast<int64_t>(used->second);
  large_in_use_.erase(used);
  while (large_kept_bytes_ > static_cast<int64_t>(kKeptLargeBytes)) {
    aligned_free(large_kept_.front().second);
    large_kept_bytes_ -= static_cast<int64_t>(large_kept_.front().first);
    large_kept_.pop_front();
  }
  return true;
}

void* CountingCpuAllocator::allocate(size_t nbytes, Stream) {
  size_t rounded = (nbytes + kAlignment - 1) / kAlignment * kAlignment;
  if (rounded == 0) rounded = kAlignment;
  const bool large = rounded >= kLargeBlock;
  void* ptr = large ? reuse_large(rounded) : nullptr;
  if (!ptr) ptr = aligned_malloc(rounded);
  if (ptr && large) {
    std::lock_guard<std::mutex> lock(large_mutex_);
    large_in_use_.try_emplace(ptr, rounded);
  }
  if (!ptr) {
    throw TESSEL_ERROR_TYPE(OutOfMemory, "cpu: could not allocate ", nbytes, " bytes (",
                            allocated_.load(), " bytes in use)");
  }
  int64_t now = allocated_.fetch_add(static_cast<int64_t>(nbytes)) + static_cast<int64_t>(nbytes);
  int64_t peak = peak_.load();
  while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
  }
  allocations_.add();
  return ptr;
}

void CountingCpuAllocator::deallocate(void* ptr, size_t nbytes, Stream) {
  if (!ptr) return;
  if (nbytes < kLargeBlock - kAlignment || !keep_large(ptr)) aligned_free(ptr);
  allocated_.fetch_sub(static_cast<int64_t>(nbytes));
  frees_.add();
}

AllocatorStats CountingCpuAllocator::stats() const {
  AllocatorStats stats;
  stats.allocated_bytes = allocated_.load();
  stats.peak_allocated_bytes = peak_.load();
  std::lock_guard<std::mutex> lock(large_mutex_);
  stats.reserved_bytes = stats.allocated_bytes + large_kept_bytes_;
  stats.num_allocations = allocations_.total();
  stats.num_frees = frees_.total();
  return stats;
}

void CountingCpuAllocator::reset_peak() { peak_.store(allocated_.load()); }

namespace {
struct AllocatorTable {
  std::mutex mutex;
  std::shared_ptr<Allocator> by_type[kNumDeviceTypes];
  std::map<std::pair<DeviceType, int>, std::shared_ptr<Allocator>> by_device;
  AllocatorFactory factories[kNumDeviceTypes] = {};
  // The CPU's own allocator and whether it is the one for every CPU device: every CPU tensor
  // asks, so that answer takes no lock. It lives as long as the program (the table is never
  // freed), so storages hold it by a handle that counts no references.
  std::shared_ptr<Allocator> default_cpu;
  std::shared_ptr<Allocator> default_cpu_handle;
  std::atomic<bool> cpu_default_only{true};

  // After a change, under the lock.
  void update_cpu_default_only() {
    bool only = by_type[static_cast<int>(DeviceType::kCpu)] == default_cpu;
    for (const auto& [key, allocator] : by_device) only = only && key.first != DeviceType::kCpu;
    cpu_default_only.store(only, std::memory_order_release);
  }
};
AllocatorTable& table() {
  static AllocatorTable* instance = [] {
    auto* t = new AllocatorTable;
    keep_freed_tensor_memory();
    t->default_cpu = std::make_shared<CountingCpuAllocator>();
    t->default_cpu_handle =
        std::shared_ptr<Allocator>(std::shared_ptr<Allocator>(), t->default_cpu.get());
    t->by_type[static_cast<int>(DeviceType::kCpu)] = t->default_cpu;
    return t;
  }();
  return *instance;
}
}  // namespace

std::shared_ptr<Allocator> allocator_for(Device device) {
  if (auto allocator = installed_allocator(device)) return allocator;
  auto& t = table();
  AllocatorFactory factory = nullptr;
  {
    std::lock_guard<std::mutex> lock(t.mutex);
    factory = t.factories[static_cast<int>(device.type)];
  }
  TESSEL_CHECK(factory != nullptr, "no allocator for device ", device.str(),
               device.is_cuda() ? " (is the CUDA backend linked? build with --config=cuda)" : "");
  // Outside the lock: a factory may install allocators itself.
  return factory(device.index);
}

std::shared_ptr<Allocator> installed_allocator(Device device) {
  auto& t = table();
  if (device.type == DeviceType::kCpu && t.cpu_default_only.load(std::memory_order_acquire))
    return t.default_cpu_handle;
  std::lock_guard<std::mutex> lock(t.mutex);
  auto found = t.by_device.find({device.type, device.index});
  if (found != t.by_device.end()) return found->second;
  return t.by_type[static_cast<int>(device.type)];
}

std::shared_ptr<Allocator> set_allocator(DeviceType type, std::shared_ptr<Allocator> allocator) {
  auto& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  std::swap(t.by_type[static_cast<int>(type)], allocator);
  t.update_cpu_default_only();
  return allocator;
}

std::shared_ptr<Allocator> set_allocator(Device device, std::shared_ptr<Allocator> allocator) {
  auto& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  const std::pair<DeviceType, int> key{device.type, device.index};
  auto found = t.by_device.find(key);
  std::shared_ptr<Allocator> previous;
  if (found != t.by_device.end()) {
    previous = std::move(found->second);
    t.by_device.erase(found);
  }
  if (allocator) t.by_device.emplace(key, std::move(allocator));
  t.update_cpu_default_only();
  return previous;
}

void set_allocator_factory(DeviceType type, AllocatorFactory factory) {
  auto& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  t.factories[static_cast<int>(type)] = factory;
}

}  // namespace tessel::memory
