// CUDA memory: the memory layer's caching allocator over cudaMalloc segments, with frees ordered
// across streams by events; pinned host memory (cudaHostAlloc) for swaps and staging; and the
// host link's copy engine on the copy stream. Each device has its own allocator, created by
// core's allocator factory on the device's first allocation; a MemoryScope on a CUDA device
// installs a budgeted one in its place for the scope's lifetime.
//   auto allocator = cuda::caching_allocator(0);   // budget: free device memory at creation
//   allocator->record_stream(ptr, cuda::copy_stream(0));  // reused only after that work
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "memory/caching_allocator.h"
#include "memory/host_allocator.h"
#include "memory/host_link.h"

namespace tessel::cuda {

// Segments from cudaMalloc on one device (nullptr when the device is out of memory).
class CudaSegmentSource : public memory::SegmentSource {
 public:
  explicit CudaSegmentSource(int device) : device_(device) {}
  void* allocate_segment(size_t bytes) override;
  void free_segment(void* ptr, size_t bytes) override;

 private:
  int device_;
};

// Page-locked host segments from cudaHostAlloc (portable: usable from every device), allocated
// on the process's device (set_process_device) so that no other GPU gets a context for them.
class PinnedSegmentSource : public memory::SegmentSource {
 public:
  void* allocate_segment(size_t bytes) override;
  void free_segment(void* ptr, size_t bytes) override;
};

// Pinned memory reserved at the first pinned request (a swap-out, the staging of a host-to-device
// copy), so that cudaHostAlloc, slow and synchronous, is not called per segment: 256 MiB unless
// the environment sets TESSEL_PINNED_RESERVE_MB or set_pinned_reserve_bytes is called before.
// When full, the pool grows by doubling (memory::ReservedSegmentSource).
constexpr size_t kDefaultPinnedReserveBytes = size_t{256} << 20;
void set_pinned_reserve_bytes(size_t bytes);
size_t pinned_reserve_bytes();
// The process's pinned pool: the segments of the host allocator of swaps and of staging buffers.
std::shared_ptr<memory::ReservedSegmentSource> pinned_segments();

// What the budget leaves to cuBLAS/cuDNN/NCCL and the CUDA context, which allocate outside it.
constexpr size_t kLibraryHeadroomBytes = size_t{512} << 20;

// The caching allocator of one device. Blocks freed on the compute stream (memory::Stream id 0,
// where every kernel runs) are reusable at once: later work on that stream is ordered after it.
// A block allocated on the copy stream, or marked with record_stream, is reused only after an
// event recorded on those streams at free time has completed. An allocation for the copy stream
// makes it wait for the compute stream first, so a recycled block is never written early.
class CudaCachingAllocator : public memory::CachingAllocator {
 public:
  // Without a budget in `options`: the device's free memory now, less kLibraryHeadroomBytes.
  CudaCachingAllocator(int device, memory::CachingAllocatorOptions options = {});
  ~CudaCachingAllocator() override;

  void* allocate(size_t nbytes, memory::Stream stream) override;
  void deallocate(void* ptr, size_t nbytes, memory::Stream stream) override;

  // `ptr` (a live block of this allocator) is also used by work queued on `stream`.
  void record_stream(void* ptr, cudaStream_t stream);
  // Frees waiting for their events.
  int64_t pending_frees() const;
  // Returns the blocks whose events completed; with `wait`, waits for all of them first.
  void process_pending_frees(bool wait);
  int device_index() const { return device_; }

 private:
  struct PendingFree {
    void* ptr;
    size_t nbytes;
    std::vector<cudaEvent_t> events;
  };
  cudaEvent_t take_event_locked();

  const int device_;
  mutable std::mutex pending_mutex_;
  std::unordered_map<void*, std::vector<cudaStream_t>> extra_streams_;
  std::deque<PendingFree> pending_;
  std::vector<cudaEvent_t> spare_events_;
};

// The allocator `device` starts with, created (and its budget measured) on first use: what
// memory::allocator_for(Device::cuda(device)) returns while nothing else is installed for it.
std::shared_ptr<CudaCachingAllocator> default_caching_allocator(int device);
// The caching allocator serving `device` now: the one installed for it (a MemoryScope's, with
// its budget) when that is a CudaCachingAllocator, else the default one. Thread-safe.
std::shared_ptr<CudaCachingAllocator> caching_allocator(int device);

// A pool of pinned host memory whose frees can wait for device work (staging buffers of
// non-blocking copies). Thread-safe.
class PinnedStagingPool {
 public:
  void* allocate(size_t bytes);
  // `ptr` goes back to the pool once the work queued on `stream` so far has completed.
  void free_after(void* ptr, size_t bytes, cudaStream_t stream);
  int64_t pending() const;

 private:
  void process_locked(bool wait);
  memory::HostAllocator pool_{pinned_segments()};
  mutable std::mutex mutex_;
  struct Pending {
    void* ptr;
    size_t bytes;
    cudaEvent_t event;
  };
  std::deque<Pending> pending_;
};
PinnedStagingPool& staging_pool();

// Host copies for the residency manager's HostLink on CUDA, on the copy stream (so they overlap
// compute), each ordered after the work queued on the compute stream when it is submitted (the
// source or destination block may be one that work uses). Swap-outs are queued, issued by the
// link's thread, and done when their bytes have arrived; swap-ins are issued at once by the
// submitter, and the compute stream, not the host, waits for them (order_device_after).
class CudaCopyEngine : public memory::CopyEngine {
 public:
  std::shared_ptr<void> prepare(void* destination, const void* source, size_t bytes) override;
  void bind_link_thread(const std::shared_ptr<void>& prepared) override;
  void copy(void* destination, const void* source, size_t bytes,
            const std::shared_ptr<void>& prepared) override;
  std::shared_ptr<void> issue_for_device(void* destination, const void* source,
                                         size_t bytes) override;
  void order_device_after(const std::shared_ptr<void>& issued) override;
};

// Installs, once and lazily (first CUDA allocation): pinned memory for the host allocator (when
// nothing is allocated from it yet) and the CUDA copy engine for host links of CUDA devices.
void install_host_memory();

}  // namespace tessel::cuda
