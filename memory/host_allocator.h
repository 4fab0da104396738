// Host memory for swapped-out tensors, pooled and counted apart from the device allocator.
// On CPU it is plain page-aligned host memory; the CUDA backend gives it a cudaHostAlloc source.
//   void* bytes = memory::host_allocator()->allocate(storage.nbytes(), memory::Stream{});
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "core/allocator.h"
#include "memory/caching_allocator.h"

namespace tessel::memory {

// Segments carved from a few large reservations of another source, which is asked rarely: where
// each request is slow and synchronous (pinned memory: cudaHostAlloc), the pool is reserved up
// front and grown seldom. The first reservation is `reserve_bytes` (or the first segment, when
// larger); a later one, needed only when every reservation is full, doubles what is reserved.
// Freed segments go back to their reservation (joined with free neighbours); the reservations go
// back to the source when this is destroyed. Thread-safe.
class ReservedSegmentSource : public SegmentSource {
 public:
  // Segments are multiples of this (page size), so each starts page-aligned.
  static constexpr size_t kAlignment = 4096;

  ReservedSegmentSource(std::shared_ptr<SegmentSource> source, size_t reserve_bytes);
  ~ReservedSegmentSource() override;
  ReservedSegmentSource(const ReservedSegmentSource&) = delete;
  ReservedSegmentSource& operator=(const ReservedSegmentSource&) = delete;

  // nullptr when no reservation has room and the source has no more memory.
  void* allocate_segment(size_t bytes) override;
  void free_segment(void* ptr, size_t bytes) override;

  // Bytes taken from the source, and in how many reservations.
  size_t reserved_bytes() const;
  int64_t reservations() const;

 private:
  struct Reservation {
    char* base;
    size_t size;
    std::map<size_t, size_t> free;  // offset -> bytes, joined with their neighbours
  };
  void* carve_locked(Reservation& reservation, size_t bytes);

  const std::shared_ptr<SegmentSource> source_;
  const size_t reserve_bytes_;
  mutable std::mutex mutex_;
  std::vector<Reservation> reservations_;
  size_t reserved_bytes_ = 0;
};

// A caching allocator of its own over host segments: swaps in and out reuse its blocks.
class HostAllocator : public Allocator {
 public:
  // `options` may set a budget on host bytes; unlimited by default.
  explicit HostAllocator(std::shared_ptr<SegmentSource> source = host_segment_source(),
                         CachingAllocatorOptions options = {});

  void* allocate(size_t nbytes, Stream stream) override;
  void deallocate(void* ptr, size_t nbytes, Stream stream) override;
  AllocatorStats stats() const override;
  void reset_peak() override;

  MemoryStats memory_stats() const { return pool_->memory_stats(); }
  void empty_cache() { pool_->empty_cache(); }
  // The pool itself, for snapshots, timelines and JSON output.
  CachingAllocator& pool() { return *pool_; }
  const CachingAllocator& pool() const { return *pool_; }

 private:
  std::unique_ptr<CachingAllocator> pool_;
};

// The process-wide host allocator (created on first use), and a way to replace it, e.g. with
// one over pinned memory; returns the previous one. Thread-safe.
std::shared_ptr<HostAllocator> host_allocator();
std::shared_ptr<HostAllocator> set_host_allocator(std::shared_ptr<HostAllocator> allocator);

}  // namespace tessel::memory
