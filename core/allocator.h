// The allocator interface every byte of tensor memory comes from. core ships a counting CPU
// allocator; memory/ installs the caching, budgeted one, and the CUDA backend its own.
//   void* p = memory::allocator_for(Device::cpu()).allocate(1024, memory::Stream{});
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "core/device.h"

namespace tessel::memory {

// Whether this is an AddressSanitizer build (gcc says so by __SANITIZE_ADDRESS__, clang by
// __has_feature): its malloc quarantines freed memory, and caches of freed blocks step aside.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kAddressSanitizer = true;
#else
constexpr bool kAddressSanitizer = false;
#endif
#else
constexpr bool kAddressSanitizer = false;
#endif

// A stream orders work on a device; CPU has one implicit stream (id 0).
struct Stream {
  int64_t id = 0;
};

struct AllocatorStats {
  int64_t allocated_bytes = 0;  // in use by tensors
  int64_t peak_allocated_bytes = 0;
  int64_t reserved_bytes = 0;  // held from the system, used or cached
  int64_t num_allocations = 0;
  int64_t num_frees = 0;
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  // Returns at least `nbytes` bytes aligned to 64; throws tessel::OutOfMemory when impossible.
  virtual void* allocate(size_t nbytes, Stream stream) = 0;
  virtual void deallocate(void* ptr, size_t nbytes, Stream stream) = 0;
  virtual AllocatorStats stats() const = 0;
  virtual void reset_peak() = 0;
};

// malloc-backed, thread-safe, counts bytes; the default for CPU until memory/ replaces it.
// Blocks of 32 MiB and more are kept for reuse when freed (up to kKeptLargeBytes, the oldest
// given back first): glibc maps each of them anew and unmaps it on free, so every allocation
// page-faulted all of it in again (about 4 us a page on a virtual machine: 9 ms for a 37 MiB
// Winograd kernel, every call). reserved_bytes counts them.
class CountingCpuAllocator : public Allocator {
 public:
  static constexpr size_t kLargeBlock = size_t{32} << 20;
  static constexpr size_t kKeptLargeBytes = size_t{512} << 20;

  ~CountingCpuAllocator() override;
  void* allocate(size_t nbytes, Stream stream) override;
  void deallocate(void* ptr, size_t nbytes, Stream stream) override;
  AllocatorStats stats() const override;
  void reset_peak() override;

 private:
  void* reuse_large(size_t bytes);
  bool keep_large(void* ptr);

  // Counts events from many threads without a locked instruction: each of the first kSlots
  // threads to count adds to a slot of its own (a plain load and store), later ones share one.
  class EventCount {
   public:
    void add();
    int64_t total() const;

   private:
    static constexpr int kSlots = 64;
    struct alignas(64) Slot {
      std::atomic<int64_t> value{0};
    };
    Slot slots_[kSlots];
    std::atomic<int64_t> shared_{0};
  };

  mutable std::mutex large_mutex_;
  std::unordered_map<void*, size_t> large_in_use_;  // pointer -> its block's size
  std::list<std::pair<size_t, void*>> large_kept_;  // freed blocks, oldest first
  int64_t large_kept_bytes_ = 0;
  std::atomic<int64_t> allocated_{0};
  std::atomic<int64_t> peak_{0};
  EventCount allocations_;
  EventCount frees_;
};

// The allocator of a device (meta has none): the one installed for that device, else the one
// for its type, else what the type's factory makes for it. Thread-safe. Storage keeps the
// returned pointer, so bytes go back to the allocator that gave them even after set_allocator.
std::shared_ptr<Allocator> allocator_for(Device device);
// The allocator installed for `device` or its type, else null (no factory is asked).
std::shared_ptr<Allocator> installed_allocator(Device device);
// Installs `allocator` for every device of `type` without one of its own; returns the previous.
std::shared_ptr<Allocator> set_allocator(DeviceType type, std::shared_ptr<Allocator> allocator);
// Installs `allocator` for `device` alone (nullptr: back to its type's); returns the previous
// one of that device (nullptr when it had none of its own).
std::shared_ptr<Allocator> set_allocator(Device device, std::shared_ptr<Allocator> allocator);
// Makes the allocator of a device of `type` that has none installed (the CUDA backend creates
// each GPU's caching allocator on first use this way). The factory keeps what it makes.
using AllocatorFactory = std::shared_ptr<Allocator> (*)(int device_index);
void set_allocator_factory(DeviceType type, AllocatorFactory factory);

}  // namespace tessel::memory
