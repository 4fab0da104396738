// Host memory for swapped-out tensors, pooled and counted apart from the device allocator.
// On CPU it is plain page-aligned host memory; the CUDA backend gives it a cudaHostAlloc source.
//   void* bytes = memory::host_allocator()->allocate(storage.nbytes(), memory::Stream{});
#pragma once

#include <cstddef>
#include <memory>

#include "core/allocator.h"
#include "memory/caching_allocator.h"

namespace tessel::memory {

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
