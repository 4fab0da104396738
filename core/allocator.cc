#include "core/allocator.h"

#include <cstdlib>
#include <map>
#include <mutex>
#include <utility>

#include "core/error.h"

namespace tessel::memory {

void* CountingCpuAllocator::allocate(size_t nbytes, Stream) {
  size_t rounded = (nbytes + 63) / 64 * 64;
  if (rounded == 0) rounded = 64;
  void* ptr = std::aligned_alloc(64, rounded);
  if (!ptr) {
    throw TESSEL_ERROR_TYPE(OutOfMemory, "cpu: could not allocate ", nbytes, " bytes (",
                            allocated_.load(), " bytes in use)");
  }
  int64_t now = allocated_.fetch_add(static_cast<int64_t>(nbytes)) + static_cast<int64_t>(nbytes);
  int64_t peak = peak_.load();
  while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
  }
  allocations_.fetch_add(1);
  return ptr;
}

void CountingCpuAllocator::deallocate(void* ptr, size_t nbytes, Stream) {
  if (!ptr) return;
  std::free(ptr);
  allocated_.fetch_sub(static_cast<int64_t>(nbytes));
  frees_.fetch_add(1);
}

AllocatorStats CountingCpuAllocator::stats() const {
  AllocatorStats stats;
  stats.allocated_bytes = allocated_.load();
  stats.peak_allocated_bytes = peak_.load();
  stats.reserved_bytes = stats.allocated_bytes;
  stats.num_allocations = allocations_.load();
  stats.num_frees = frees_.load();
  return stats;
}

void CountingCpuAllocator::reset_peak() { peak_.store(allocated_.load()); }

namespace {
struct AllocatorTable {
  std::mutex mutex;
  std::shared_ptr<Allocator> by_type[kNumDeviceTypes];
  std::map<std::pair<DeviceType, int>, std::shared_ptr<Allocator>> by_device;
  AllocatorFactory factories[kNumDeviceTypes] = {};
};
AllocatorTable& table() {
  static AllocatorTable* instance = [] {
    auto* t = new AllocatorTable;
    t->by_type[static_cast<int>(DeviceType::kCpu)] = std::make_shared<CountingCpuAllocator>();
    return t;
  }();
  return *instance;
}
}  // namespace

std::shared_ptr<Allocator> allocator_for(Device device) {
  auto& t = table();
  AllocatorFactory factory = nullptr;
  {
    std::lock_guard<std::mutex> lock(t.mutex);
    auto found = t.by_device.find({device.type, device.index});
    if (found != t.by_device.end()) return found->second;
    if (const auto& allocator = t.by_type[static_cast<int>(device.type)]) return allocator;
    factory = t.factories[static_cast<int>(device.type)];
  }
  TESSEL_CHECK(factory != nullptr, "no allocator for device ", device.str(),
               device.is_cuda() ? " (is the CUDA backend linked? build with --config=cuda)" : "");
  // Outside the lock: a factory may install allocators itself.
  return factory(device.index);
}

std::shared_ptr<Allocator> set_allocator(DeviceType type, std::shared_ptr<Allocator> allocator) {
  auto& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  std::swap(t.by_type[static_cast<int>(type)], allocator);
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
  return previous;
}

void set_allocator_factory(DeviceType type, AllocatorFactory factory) {
  auto& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  t.factories[static_cast<int>(type)] = factory;
}

}  // namespace tessel::memory
