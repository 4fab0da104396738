// The CUDA transfer kernel of `to_device` (defined in ops/transfer.cc): CPU<->CUDA and
// CUDA<->CUDA copies, dtype-preserving, non-contiguous sources gathered first. Registered for
// both device types, as the dispatcher picks the kernel by the output's device. Copies to a GPU
// go through pinned staging and never wait for the device; copies to the host wait (the host
// reads the bytes next).
#include "cuda/copy.h"

#include <cstring>
#include <memory>

#include "core/op.h"
#include "cuda/allocator.h"
#include "cuda/peer_access.h"
#include "cuda/runtime.h"
#include "ops/registry_helpers.h"
#include "ops/transfer.h"

namespace tessel::cuda {
namespace {

// Device scratch from the caching allocator, freed (stream-ordered) at scope end.
class DeviceScratch {
 public:
  DeviceScratch(int device, size_t bytes)
      : allocator_(caching_allocator(device)),
        bytes_(bytes),
        ptr_(allocator_->allocate(bytes, kComputeStreamId)) {}
  ~DeviceScratch() { allocator_->deallocate(ptr_, bytes_, kComputeStreamId); }
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;
  void* get() const { return ptr_; }

 private:
  std::shared_ptr<CudaCachingAllocator> allocator_;
  size_t bytes_;
  void* ptr_;
};

// The process's peer access table over the CUDA runtime.
PeerAccessTable& peer_access() {
  static auto* table = new PeerAccessTable({
      [](int device, int peer) {
        int can_access = 0;
        TESSEL_CUDA_CHECK(cudaDeviceCanAccessPeer(&can_access, device, peer));
        return can_access != 0;
      },
      [](int device, int peer) {
        DeviceGuard guard(device);
        const cudaError_t status = cudaDeviceEnablePeerAccess(peer, 0);
        if (status == cudaErrorPeerAccessAlreadyEnabled) {
          cudaGetLastError();  // not sticky, but it would be reported by the next check
          return;
        }
        TESSEL_CUDA_CHECK(status);
      },
  });
  return *table;
}

// The source's bytes as one dense run on its device: the tensor itself when contiguous, else a
// gathered copy in `scratch` (on the compute stream).
const void* dense_device_source(const Tensor& x, std::unique_ptr<DeviceScratch>& scratch) {
  if (x.is_contiguous()) return x.raw_data();
  const int device = x.device().index;
  scratch = std::make_unique<DeviceScratch>(device, x.nbytes());
  gather_contiguous(x.raw_data(), x.sizes(), x.strides(), x.element_size(), scratch->get(),
                    compute_stream(device));
  return scratch->get();
}

// Blocking or not, through pinned staging: the source is copied (or gathered) there before this
// returns, so the caller may reuse it at once, and the device copy is asynchronous (from pageable
// memory it would be staged by the driver and block). Later work on the compute stream waits for
// it on the device; the host never waits for the device here.
void host_to_device(const Tensor& x, Tensor& out) {
  const int device = out.device().index;
  DeviceGuard guard(device);
  const size_t bytes = out.nbytes();
  cudaStream_t compute = compute_stream(device);
  PinnedStagingPool& pool = staging_pool();
  void* staging = pool.allocate(bytes);
  if (x.is_contiguous()) {
    std::memcpy(staging, x.raw_data(), bytes);
  } else {
    gather_contiguous_host(x.raw_data(), x.sizes(), x.strides(), x.element_size(), staging);
  }
  cudaStream_t copy = copy_stream(device);
  stream_wait(copy, compute);  // the output block may be recycled from queued compute work
  TESSEL_CUDA_CHECK(cudaMemcpyAsync(out.raw_data(), staging, bytes, cudaMemcpyHostToDevice, copy));
  stream_wait(compute, copy);  // every later kernel sees the bytes
  pool.free_after(staging, bytes, copy);
}

void device_to_host(const Tensor& x, Tensor& out) {
  const int device = x.device().index;
  DeviceGuard guard(device);
  cudaStream_t compute = compute_stream(device);
  std::unique_ptr<DeviceScratch> scratch;
  const void* source = dense_device_source(x, scratch);
  TESSEL_CUDA_CHECK(
      cudaMemcpyAsync(out.raw_data(), source, out.nbytes(), cudaMemcpyDeviceToHost, compute));
  // The host may read `out` as soon as the op returns.
  TESSEL_CUDA_CHECK(cudaStreamSynchronize(compute));
  raise_device_errors(device);  // a synchronisation point: a bad index found before it is raised
}

void device_to_device(const Tensor& x, Tensor& out, bool non_blocking) {
  const int source_device = x.device().index;
  const int target_device = out.device().index;
  const size_t bytes = out.nbytes();
  if (source_device == target_device) {
    DeviceGuard guard(target_device);
    cudaStream_t compute = compute_stream(target_device);
    if (x.is_contiguous()) {
      TESSEL_CUDA_CHECK(
          cudaMemcpyAsync(out.raw_data(), x.raw_data(), bytes, cudaMemcpyDeviceToDevice, compute));
    } else {
      gather_contiguous(x.raw_data(), x.sizes(), x.strides(), x.element_size(), out.raw_data(),
                        compute);
    }
    return;
  }
  // Between devices: on the source's compute stream, after the target's queued work. An event
  // belongs to the device current at its creation, and is recorded on a stream of that device.
  std::unique_ptr<Event> target_ready;
  {
    DeviceGuard guard(target_device);
    target_ready = std::make_unique<Event>();
    target_ready->record(compute_stream(target_device));
  }
  DeviceGuard guard(source_device);
  // The source's copy engine writes into the target directly where the GPUs allow it; otherwise
  // cudaMemcpyPeerAsync stages through host memory.
  peer_access().ensure(source_device, target_device);
  cudaStream_t source_stream = compute_stream(source_device);
  std::unique_ptr<DeviceScratch> scratch;
  const void* source = dense_device_source(x, scratch);
  TESSEL_CUDA_CHECK(cudaStreamWaitEvent(source_stream, target_ready->get(), 0));
  TESSEL_CUDA_CHECK(cudaMemcpyPeerAsync(out.raw_data(), target_device, source, source_device, bytes,
                                        source_stream));
  Event copied;
  copied.record(source_stream);
  {
    DeviceGuard target_guard(target_device);
    TESSEL_CUDA_CHECK(cudaStreamWaitEvent(compute_stream(target_device), copied.get(), 0));
  }
  if (!non_blocking) copied.synchronize();
}

void transfer_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  Tensor& out = ctx.outputs[0];
  TESSEL_CHECK(out.is_contiguous(), "to_device: the output must be contiguous");
  TESSEL_CHECK(x.dtype() == out.dtype(), "to_device: dtype changes from ", dtype_name(x.dtype()),
               " to ", dtype_name(out.dtype()), " (use to(dtype) for casts)");
  const bool non_blocking = ctx.attrs.get_or<bool>("non_blocking", false);
  if (out.nbytes() == 0) return;
  const Device from = x.device(), to = out.device();
  if (from.is_cpu() && to.is_cpu()) {
    gather_contiguous_host(x.raw_data(), x.sizes(), x.strides(), x.element_size(), out.raw_data());
  } else if (from.is_cpu()) {
    host_to_device(x, out);  // never waits for the device, blocking or not
  } else if (to.is_cpu()) {
    device_to_host(x, out);  // always blocking: the host reads it next
  } else {
    device_to_device(x, out, non_blocking);
  }
}

}  // namespace

TESSEL_REGISTER_OPS(cuda_transfer) {
  ops::to_device.set_kernel(DeviceType::kCuda, transfer_kernel);
  ops::to_device.set_kernel(DeviceType::kCpu, transfer_kernel);
}

}  // namespace tessel::cuda
