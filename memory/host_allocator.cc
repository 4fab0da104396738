#include "memory/host_allocator.h"

#include <algorithm>
#include <iterator>
#include <mutex>

#include "core/error.h"

namespace tessel::memory {

ReservedSegmentSource::ReservedSegmentSource(std::shared_ptr<SegmentSource> source,
                                             size_t reserve_bytes)
    : source_(std::move(source)), reserve_bytes_(reserve_bytes) {
  TESSEL_CHECK(source_ != nullptr, "ReservedSegmentSource: the source is null");
}

ReservedSegmentSource::~ReservedSegmentSource() {
  for (const Reservation& reservation : reservations_)
    source_->free_segment(reservation.base, reservation.size);
}

void* ReservedSegmentSource::carve_locked(Reservation& reservation, size_t bytes) {
  for (auto it = reservation.free.begin(); it != reservation.free.end(); ++it) {
    if (it->second < bytes) continue;
    const size_t offset = it->first, left = it->second - bytes;
    reservation.free.erase(it);
    if (left > 0) reservation.free.emplace(offset + bytes, left);
    return reservation.base + offset;
  }
  return nullptr;
}

void* ReservedSegmentSource::allocate_segment(size_t bytes) {
  bytes = (std::max<size_t>(bytes, 1) + kAlignment - 1) / kAlignment * kAlignment;
  std::lock_guard<std::mutex> lock(mutex_);
  for (Reservation& reservation : reservations_)
    if (void* segment = carve_locked(reservation, bytes)) return segment;
  // Every reservation is full: reserve as much again as there is (at least the setting), so
  // growing takes few, rare calls; settle for the segment alone when that much is refused.
  const size_t wanted = std::max({bytes, reserve_bytes_, reserved_bytes_});
  size_t size = wanted;
  void* base = source_->allocate_segment(size);
  if (!base && wanted > bytes) base = source_->allocate_segment(size = bytes);
  if (!base) return nullptr;
  reservations_.push_back({static_cast<char*>(base), size, {}});
  reserved_bytes_ += size;
  if (size > bytes) reservations_.back().free.emplace(bytes, size - bytes);
  return base;
}

void ReservedSegmentSource::free_segment(void* ptr, size_t bytes) {
  bytes = (std::max<size_t>(bytes, 1) + kAlignment - 1) / kAlignment * kAlignment;
  const char* address = static_cast<const char*>(ptr);
  std::lock_guard<std::mutex> lock(mutex_);
  for (Reservation& reservation : reservations_) {
    if (address < reservation.base || address >= reservation.base + reservation.size) continue;
    size_t offset = static_cast<size_t>(address - reservation.base);
    TESSEL_CHECK(offset + bytes <= reservation.size, "ReservedSegmentSource: a segment of ", bytes,
                 " bytes at offset ", offset, " overruns its reservation of ", reservation.size);
    auto next = reservation.free.lower_bound(offset);
    if (next != reservation.free.end() && next->first == offset + bytes) {
      bytes += next->second;
      next = reservation.free.erase(next);
    }
    if (next != reservation.free.begin()) {
      auto previous = std::prev(next);
      if (previous->first + previous->second == offset) {
        offset = previous->first;
        bytes += previous->second;
        reservation.free.erase(previous);
      }
    }
    reservation.free.emplace(offset, bytes);
    return;
  }
  TESSEL_FAIL("ReservedSegmentSource: ", ptr, " is not a segment of its reservations");
}

size_t ReservedSegmentSource::reserved_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return reserved_bytes_;
}

int64_t ReservedSegmentSource::reservations() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(reservations_.size());
}

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
