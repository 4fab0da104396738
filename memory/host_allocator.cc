#include "memory/host_allocator.h"

#include <mutex>

#include "core/error.h"

namespace tessel::memory {

HostAllocator::HostAllocator(std::shared_ptr<SegmentSource> source, CachingAllocatorOptions options)
    : pool_(std::make_unique<CachingAllocator>(Device::cpu(), options, std::move(source))) {}

void* HostAllocator::allocate(size_t nbytes, Stream stream) {
  return pool_->allocate(nbytes, stream);
}

void HostAllocator::deallocate(void* ptr, size_t nbytes, Stream stream) {
  pool_->deallocate(ptr, nbytes, stream);
}

AllocatorStats HostAllocator::stats() const { return pool_->stats(); }

void HostAllocator::reset_peak() { pool_->reset_peak(); }

namespace {
std::mutex host_mutex;
std::shared_ptr<HostAllocator>& installed_host_allocator() {
  static auto* allocator = new std::shared_ptr<HostAllocator>();
  return *allocator;
}
}  // namespace

std::shared_ptr<HostAllocator> host_allocator() {
  std::lock_guard<std::mutex> lock(host_mutex);
  auto& allocator = installed_host_allocator();
  if (!allocator) allocator = std::make_shared<HostAllocator>();
  return allocator;
}

std::shared_ptr<HostAllocator> set_host_allocator(std::shared_ptr<HostAllocator> allocator) {
  TESSEL_CHECK(allocator != nullptr, "set_host_allocator: the allocator is null");
  std::lock_guard<std::mutex> lock(host_mutex);
  std::swap(installed_host_allocator(), allocator);
  return allocator;
}

}  // namespace tessel::memory
