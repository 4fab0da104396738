#include "cuda/allocator.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "cuda/runtime.h"

namespace tessel::cuda {
namespace {

memory::CachingAllocatorOptions with_default_budget(int device,
                                                    memory::CachingAllocatorOptions options) {
  if (options.has_budget_) return options;
  DeviceGuard guard(device);
  size_t free_bytes = 0, total_bytes = 0;
  TESSEL_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  // Leave room for the libraries' own allocations; on a tiny device keep half of what is free.
  size_t budget =
      free_bytes > 2 * kLibraryHeadroomBytes ? free_bytes - kLibraryHeadroomBytes : free_bytes / 2;
  return options.budget(std::max<size_t>(budget, memory::CachingAllocator::kMinBlockSize));
}

// Registered at load time: no CUDA call happens until the first CUDA allocation, which creates
// the device's allocator through core's factory.
std::shared_ptr<memory::Allocator> make_device_allocator(int device) {
  return default_caching_allocator(device);
}

// A MemoryScope's allocator for a GPU: budgeted, installed for that device while the scope lasts.
// The allocator it replaces gives its cached segments back to the device first, so the budget
// can be backed by real memory.
std::shared_ptr<memory::CachingAllocator> make_scoped_allocator(
    Device device, const memory::CachingAllocatorOptions& options) {
  check_device(device.index, "memory budget");
  const auto current = caching_allocator(device.index);
  current->process_pending_frees(/*wait=*/true);
  current->empty_cache();
  if (options.has_budget_) {
    DeviceGuard guard(device.index);
    size_t free_bytes = 0, total_bytes = 0;
    TESSEL_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    TESSEL_CHECK(options.budget_ <= free_bytes, "memory budget of ",
                 memory::format_bytes(static_cast<double>(options.budget_)), " on ", device.str(),
                 ": only ", memory::format_bytes(static_cast<double>(free_bytes)), " of its ",
                 memory::format_bytes(static_cast<double>(total_bytes)),
                 " are free; ask for less (without a budget the free memory is the budget)");
  }
  auto allocator = std::make_shared<CudaCachingAllocator>(device.index, options);
  install_host_memory();
  return allocator;
}

const bool factory_installed = [] {
  memory::set_allocator_factory(DeviceType::kCuda, &make_device_allocator);
  memory::set_caching_allocator_maker(DeviceType::kCuda, &make_scoped_allocator);
  memory::set_copy_engine(DeviceType::kCuda, std::make_shared<CudaCopyEngine>());
  return true;
}();

}  // namespace

// ---- segment sources ----

void* CudaSegmentSource::allocate_segment(size_t bytes) {
  DeviceGuard guard(device_);
  void* ptr = nullptr;
  cudaError_t status = cudaMalloc(&ptr, bytes);
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // not sticky: the caching allocator frees its cache and retries
    return nullptr;
  }
  TESSEL_CUDA_CHECK(status);
  return ptr;
}

void CudaSegmentSource::free_segment(void* ptr, size_t) {
  // Also runs at exit, when the runtime may already be unloading: errors are ignored.
  int previous = -1;
  cudaGetDevice(&previous);
  cudaSetDevice(device_);
  cudaFree(ptr);
  if (previous >= 0) cudaSetDevice(previous);
  cudaGetLastError();
}

void* PinnedSegmentSource::allocate_segment(size_t bytes) {
  // cudaHostAlloc works in the current device's context, creating it if needed.
  std::unique_ptr<DeviceGuard> guard;
  if (process_device() >= 0) guard = std::make_unique<DeviceGuard>(process_device());
  void* ptr = nullptr;
  if (cudaHostAlloc(&ptr, bytes, cudaHostAllocPortable) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return ptr;
}

void PinnedSegmentSource::free_segment(void* ptr, size_t) {
  cudaFreeHost(ptr);
  cudaGetLastError();
}

namespace {
std::atomic<size_t>& pinned_reserve_setting() {
  static std::atomic<size_t> bytes{[] {
    const char* megabytes = std::getenv("TESSEL_PINNED_RESERVE_MB");
    if (!megabytes || !*megabytes) return kDefaultPinnedReserveBytes;
    char* end = nullptr;
    const unsigned long long value = std::strtoull(megabytes, &end, 10);
    TESSEL_CHECK(end && *end == '\0', "TESSEL_PINNED_RESERVE_MB: expected a whole number of MiB, ",
                 "got '", megabytes, "'");
    return static_cast<size_t>(value) << 20;
  }()};
  return bytes;
}
}  // namespace

void set_pinned_reserve_bytes(size_t bytes) { pinned_reserve_setting().store(bytes); }
size_t pinned_reserve_bytes() { return pinned_reserve_setting().load(); }

std::shared_ptr<memory::ReservedSegmentSource> pinned_segments() {
  // Never destroyed: pinned blocks may be freed during static destruction.
  static auto* segments = new std::shared_ptr<memory::ReservedSegmentSource>(
      std::make_shared<memory::ReservedSegmentSource>(std::make_shared<PinnedSegmentSource>(),
                                                      pinned_reserve_bytes()));
  return *segments;
}

// ---- the caching allocator of one device ----

CudaCachingAllocator::CudaCachingAllocator(int device, memory::CachingAllocatorOptions options)
    : memory::CachingAllocator(Device::cuda(device), with_default_budget(device, options),
                               std::make_shared<CudaSegmentSource>(device)),
      device_(device) {}

CudaCachingAllocator::~CudaCachingAllocator() {
  try {
    process_pending_frees(true);
  } catch (...) {  // the runtime may be gone at exit
  }
  for (cudaEvent_t event : spare_events_) cudaEventDestroy(event);
  cudaGetLastError();
}

cudaEvent_t CudaCachingAllocator::take_event_locked() {
  if (!spare_events_.empty()) {
    cudaEvent_t event = spare_events_.back();
    spare_events_.pop_back();
    return event;
  }
  cudaEvent_t event = nullptr;
  TESSEL_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  return event;
}

void* CudaCachingAllocator::allocate(size_t nbytes, memory::Stream stream) {
  if (pending_frees() > 0) process_pending_frees(false);
  if (stream.id != kComputeStreamId.id) {
    // A recycled block may still be read or written by compute work queued before its free.
    DeviceGuard guard(device_);  // the event belongs to this device
    stream_wait(stream_for(device_, stream), compute_stream(device_));
  }
  try {
    return memory::CachingAllocator::allocate(nbytes, stream);
  } catch (const OutOfMemory&) {
    if (pending_frees() == 0) throw;
  }
  process_pending_frees(true);  // blocks held only by in-flight work: wait for it, then retry
  return memory::CachingAllocator::allocate(nbytes, stream);
}

void CudaCachingAllocator::deallocate(void* ptr, size_t nbytes, memory::Stream stream) {
  if (!ptr) return;
  std::vector<cudaStream_t> users;
  {
    std::lock_guard<std::mutex> lock(pending_mutex_);
    auto it = extra_streams_.find(ptr);
    if (it != extra_streams_.end()) {
      users = std::move(it->second);
      extra_streams_.erase(it);
    }
  }
  try {
    if (stream.id != kComputeStreamId.id) users.push_back(stream_for(device_, stream));
    if (!users.empty()) {
      DeviceGuard guard(device_);
      PendingFree pending{ptr, nbytes, {}};
      std::lock_guard<std::mutex> lock(pending_mutex_);
      for (cudaStream_t user : users) {
        cudaEvent_t event = take_event_locked();
        TESSEL_CUDA_CHECK(cudaEventRecord(event, user));
        pending.events.push_back(event);
      }
      pending_.push_back(std::move(pending));
      return;
    }
  } catch (const Error&) {
    // No events (the runtime is shutting down): the device is idle or gone, free at once.
    cudaGetLastError();
  }
  memory::CachingAllocator::deallocate(ptr, nbytes, stream);
}

void CudaCachingAllocator::record_stream(void* ptr, cudaStream_t stream) {
  if (stream == compute_stream(device_)) return;
  std::lock_guard<std::mutex> lock(pending_mutex_);
  auto& users = extra_streams_[ptr];
  if (std::find(users.begin(), users.end(), stream) == users.end()) users.push_back(stream);
}

int64_t CudaCachingAllocator::pending_frees() const {
  std::lock_guard<std::mutex> lock(pending_mutex_);
  return static_cast<int64_t>(pending_.size());
}

void CudaCachingAllocator::process_pending_frees(bool wait) {
  std::vector<PendingFree> ready;
  {
    std::lock_guard<std::mutex> lock(pending_mutex_);
    for (auto it = pending_.begin(); it != pending_.end();) {
      bool done = true;
      for (cudaEvent_t event : it->events) {
        if (wait) {
          TESSEL_CUDA_CHECK(cudaEventSynchronize(event));
          continue;
        }
        cudaError_t status = cudaEventQuery(event);
        if (status == cudaErrorNotReady) {
          cudaGetLastError();
          done = false;
          break;
        }
        TESSEL_CUDA_CHECK(status);
      }
      if (!done) {
        ++it;
        continue;
      }
      for (cudaEvent_t event : it->events) spare_events_.push_back(event);
      ready.push_back(std::move(*it));
      it = pending_.erase(it);
    }
  }
  for (const PendingFree& free : ready)
    memory::CachingAllocator::deallocate(free.ptr, free.nbytes, kComputeStreamId);
}

std::shared_ptr<CudaCachingAllocator> default_caching_allocator(int device) {
  static std::mutex mutex;
  // Never destroyed: tensors may be freed during static destruction.
  static auto* allocators = new std::array<std::shared_ptr<CudaCachingAllocator>, kMaxDevices>();
  check_device(device, "CUDA allocator");  // also bounds `device` by kMaxDevices
  std::lock_guard<std::mutex> lock(mutex);
  auto& allocator = (*allocators)[device];
  if (!allocator) {
    allocator = std::make_shared<CudaCachingAllocator>(device);
    install_host_memory();
  }
  return allocator;
}

std::shared_ptr<CudaCachingAllocator> caching_allocator(int device) {
  check_device(device, "CUDA allocator");
  auto installed =
      std::dynamic_pointer_cast<CudaCachingAllocator>(memory::allocator_for(Device::cuda(device)));
  return installed ? installed : default_caching_allocator(device);
}

// ---- pinned staging ----

void* PinnedStagingPool::allocate(size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  process_locked(false);
  try {
    return pool_.allocate(bytes, memory::Stream{});
  } catch (const OutOfMemory&) {
    if (pending_.empty()) throw;
  }
  process_locked(true);  // buffers held only by copies in flight: wait for them, then retry
  return pool_.allocate(bytes, memory::Stream{});
}

void PinnedStagingPool::free_after(void* ptr, size_t bytes, cudaStream_t stream) {
  cudaEvent_t event = nullptr;
  TESSEL_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  TESSEL_CUDA_CHECK(cudaEventRecord(event, stream));
  std::lock_guard<std::mutex> lock(mutex_);
  pending_.push_back({ptr, bytes, event});
}

int64_t PinnedStagingPool::pending() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(pending_.size());
}

void PinnedStagingPool::process_locked(bool wait) {
  for (auto it = pending_.begin(); it != pending_.end();) {
    cudaError_t status = wait ? cudaEventSynchronize(it->event) : cudaEventQuery(it->event);
    if (status == cudaErrorNotReady) {
      cudaGetLastError();
      ++it;
      continue;
    }
    TESSEL_CUDA_CHECK(status);
    cudaEventDestroy(it->event);
    pool_.deallocate(it->ptr, it->bytes, memory::Stream{});
    it = pending_.erase(it);
  }
}

PinnedStagingPool& staging_pool() {
  static auto* pool = new PinnedStagingPool();  // never destroyed: CUDA may be gone at exit
  return *pool;
}

// ---- host link copies ----

namespace {
// Created with the copy's device current (the event belongs to it).
struct CopyState {
  CopyState(int device, bool issued) : device(device), issued(issued) {}
  const int device;
  const bool issued;  // issue_for_device: `event` marks the copy's end on the copy stream
  Event event;        // queued copies: the compute stream's work at submission, which they follow
};

// The device of a device pointer, or -1 for host memory.
int device_of(const void* ptr) {
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, ptr) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged
             ? attributes.device
             : -1;
}

// The device a copy between `destination` and `source` runs on; -1 for host to host.
int copy_device(void* destination, const void* source) {
  const int device = device_of(destination);
  return device >= 0 ? device : device_of(source);
}
}  // namespace

std::shared_ptr<void> CudaCopyEngine::prepare(void* destination, const void* source, size_t) {
  const int device = copy_device(destination, source);
  if (device < 0) return nullptr;  // host to host
  DeviceGuard guard(device);       // the event belongs to the device
  auto prepared = std::make_shared<CopyState>(device, /*issued=*/false);
  prepared->event.record(compute_stream(device));
  return prepared;
}

void CudaCopyEngine::copy(void* destination, const void* source, size_t bytes,
                          const std::shared_ptr<void>& prepared) {
  if (!prepared) {
    std::memcpy(destination, source, bytes);
    return;
  }
  const auto& state = *static_cast<const CopyState*>(prepared.get());
  DeviceGuard guard(state.device);  // nothing to switch on a bound link thread
  if (!state.issued) {
    cudaStream_t stream = copy_stream(state.device);
    TESSEL_CUDA_CHECK(cudaStreamWaitEvent(stream, state.event.get(), 0));
    TESSEL_CUDA_CHECK(cudaMemcpyAsync(destination, source, bytes, cudaMemcpyDefault, stream));
    Event done;
    done.record(stream);
    done.synchronize();
    return;
  }
  state.event.synchronize();  // issued by the submitter: only its end is waited for here
}

void CudaCopyEngine::bind_link_thread(const std::shared_ptr<void>& prepared) {
  if (prepared) bind_thread(static_cast<const CopyState*>(prepared.get())->device);
}

std::shared_ptr<void> CudaCopyEngine::issue_for_device(void* destination, const void* source,
                                                       size_t bytes) {
  const int device = device_of(destination);
  if (device < 0) return nullptr;
  DeviceGuard guard(device);
  cudaStream_t stream = copy_stream(device);
  // The destination block may be one that work still queued on the compute stream used last.
  stream_wait(stream, compute_stream(device));
  TESSEL_CUDA_CHECK(cudaMemcpyAsync(destination, source, bytes, cudaMemcpyDefault, stream));
  auto issued = std::make_shared<CopyState>(device, /*issued=*/true);
  issued->event.record(stream);
  return issued;
}

void CudaCopyEngine::order_device_after(const std::shared_ptr<void>& issued) {
  const auto& state = *static_cast<const CopyState*>(issued.get());
  DeviceGuard guard(state.device);
  TESSEL_CUDA_CHECK(cudaStreamWaitEvent(compute_stream(state.device), state.event.get(), 0));
}

void install_host_memory() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Swapped tensors already on pageable host blocks must go back to the pool they came from.
    if (memory::host_allocator()->stats().allocated_bytes == 0) {
      memory::set_host_allocator(std::make_shared<memory::HostAllocator>(pinned_segments()));
    }
  });
}

}  // namespace tessel::cuda
