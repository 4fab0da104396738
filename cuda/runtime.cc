#include "cuda/runtime.h"

#include <cuda.h>

#include <array>
#include <atomic>
#include <cstring>
#include <mutex>
#include <new>
#include <string>

#include "core/error.h"

namespace tessel::cuda {
namespace {

const char* base_name(const char* file) {
  const char* slash = std::strrchr(file, '/');
  return slash ? slash + 1 : file;
}

[[noreturn]] void throw_with(const std::string& message, const char* expr, const char* file,
                             int line) {
  throw Error(::tessel::detail::str_cat(base_name(file), ":", line, ": ", expr, ": ", message),
              file, line);
}

struct DeviceCount {
  int count = 0;
  std::string reason;  // why there is none, when count is 0
};

const DeviceCount& probe_devices() {
  static const DeviceCount probed = [] {
    DeviceCount result;
    int count = 0;
    cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) {
      result.reason =
          ::tessel::detail::str_cat(cudaGetErrorName(status), ": ", cudaGetErrorString(status));
      cudaGetLastError();  // clear it: not having a GPU is not a sticky error
      count = 0;
    } else if (count == 0) {
      result.reason = "the driver reports no device";
    }
    result.count = count;
    return result;
  }();
  return probed;
}

// Lazily created per-device objects, created once under a lock and read lock-free after.
template <typename Handle>
struct PerDevice {
  std::array<std::atomic<Handle>, kMaxDevices> handles{};
  std::mutex mutex;

  template <typename Create>
  Handle get(int device, const char* what, Create create) {
    check_device(device, what);
    Handle handle = handles[device].load(std::memory_order_acquire);
    if (handle) return handle;
    std::lock_guard<std::mutex> lock(mutex);
    handle = handles[device].load(std::memory_order_relaxed);
    if (!handle) {
      DeviceGuard guard(device);
      handle = create(device);
      handles[device].store(handle, std::memory_order_release);
    }
    return handle;
  }
};

cudaStream_t new_stream(int) {
  cudaStream_t stream = nullptr;
  TESSEL_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  return stream;
}

PerDevice<cudaStream_t>& compute_streams() {
  static auto* streams = new PerDevice<cudaStream_t>();  // never destroyed: used at exit
  return *streams;
}
PerDevice<cudaStream_t>& copy_streams() {
  static auto* streams = new PerDevice<cudaStream_t>();
  return *streams;
}
PerDevice<cublasHandle_t>& cublas_handles() {
  static auto* handles = new PerDevice<cublasHandle_t>();
  return *handles;
}
PerDevice<cudnnHandle_t>& cudnn_handles() {
  static auto* handles = new PerDevice<cudnnHandle_t>();
  return *handles;
}

PerDevice<IndexError*>& error_records() {
  static auto* records = new PerDevice<IndexError*>();
  return *records;
}

std::atomic<bool> tf32_allowed{false};
std::atomic<int> the_process_device{-1};

// cuDevicePrimaryCtxGetState through the runtime's entry point lookup, so that the binary needs
// no link against the driver library; null when the driver does not have it.
using PrimaryContextState = CUresult (*)(CUdevice, unsigned int*, int*);
using DeviceFromOrdinal = CUresult (*)(CUdevice*, int);
struct DriverFunctions {
  PrimaryContextState primary_context_state = nullptr;
  DeviceFromOrdinal device_from_ordinal = nullptr;
};
const DriverFunctions& driver_functions() {
  static const DriverFunctions functions = [] {
    DriverFunctions found;
    void* symbol = nullptr;
    cudaDriverEntryPointQueryResult result{};
    if (cudaGetDriverEntryPointByVersion("cuDevicePrimaryCtxGetState", &symbol, 12000,
                                         cudaEnableDefault, &result) == cudaSuccess &&
        result == cudaDriverEntryPointSuccess)
      found.primary_context_state = reinterpret_cast<PrimaryContextState>(symbol);
    symbol = nullptr;
    if (cudaGetDriverEntryPointByVersion("cuDeviceGet", &symbol, 12000, cudaEnableDefault,
                                         &result) == cudaSuccess &&
        result == cudaDriverEntryPointSuccess)
      found.device_from_ordinal = reinterpret_cast<DeviceFromOrdinal>(symbol);
    cudaGetLastError();
    return found;
  }();
  return functions;
}

}  // namespace

namespace internal {

const char* cublas_status_name(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "CUBLAS_STATUS_LICENSE_ERROR";
    default:
      return "CUBLAS_STATUS_UNKNOWN";
  }
}

void throw_cuda_error(cudaError_t status, const char* expr, const char* file, int line) {
  cudaGetLastError();  // reset a non-sticky error so the next call does not report it again
  throw_with(
      ::tessel::detail::str_cat(cudaGetErrorString(status), " (", cudaGetErrorName(status), ")"),
      expr, file, line);
}

void throw_cublas_error(cublasStatus_t status, const char* expr, const char* file, int line) {
  throw_with(::tessel::detail::str_cat(cublas_status_name(status), " (cuBLAS error ",
                                       static_cast<int>(status), ")"),
             expr, file, line);
}

void throw_cudnn_error(cudnnStatus_t status, const char* expr, const char* file, int line) {
  throw_with(::tessel::detail::str_cat(cudnnGetErrorString(status), " (cuDNN error ",
                                       static_cast<int>(status), ")"),
             expr, file, line);
}

void throw_nccl_error(ncclResult_t status, const char* expr, const char* file, int line) {
  const char* last = ncclGetLastError(nullptr);
  throw_with(::tessel::detail::str_cat(
                 ncclGetErrorString(status), " (NCCL error ", static_cast<int>(status), ")",
                 last && *last ? ::tessel::detail::str_cat(": ", last) : std::string()),
             expr, file, line);
}

}  // namespace internal

int device_count() { return probe_devices().count; }

void check_device(int index, const char* what) {
  const DeviceCount& devices = probe_devices();
  TESSEL_CHECK(devices.count > 0, what,
               ": no CUDA device available (device_count() == 0: ", devices.reason,
               "); this binary was built with CUDA but needs an NVIDIA GPU and ",
               "driver at run time, or use Device::cpu()");
  TESSEL_CHECK(
      index >= 0 && index < devices.count && index < kMaxDevices, what, ": no device cuda:", index,
      " (", devices.count, " CUDA device", devices.count == 1 ? "" : "s", " visible: cuda:0",
      devices.count > 1 ? ::tessel::detail::str_cat("..cuda:", devices.count - 1) : std::string(),
      ")");
}

int current_device() {
  int device = 0;
  TESSEL_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

bool has_context(int device) {
  const DriverFunctions& driver = driver_functions();
  CUdevice handle = 0;
  unsigned int flags = 0;
  int active = 0;
  if (!driver.primary_context_state || !driver.device_from_ordinal ||
      driver.device_from_ordinal(&handle, device) != CUDA_SUCCESS ||
      driver.primary_context_state(handle, &flags, &active) != CUDA_SUCCESS)
    return true;  // unknown: restoring is the safe choice for correctness
  return active != 0;
}

void set_process_device(int device) {
  check_device(device, "set_process_device");
  TESSEL_CUDA_CHECK(cudaSetDevice(device));
  the_process_device.store(device);
}

int process_device() { return the_process_device.load(); }

void bind_thread(int device) {
  int now = -1;
  TESSEL_CUDA_CHECK(cudaGetDevice(&now));
  if (now == device) return;
  check_device(device, "bind_thread");
  TESSEL_CUDA_CHECK(cudaSetDevice(device));
}

DeviceGuard::DeviceGuard(int index) {
  check_device(index, "DeviceGuard");
  TESSEL_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != index) TESSEL_CUDA_CHECK(cudaSetDevice(index));
}

DeviceGuard::~DeviceGuard() {
  int now = -1;
  if (previous_ < 0 || cudaGetDevice(&now) != cudaSuccess || now == previous_) return;
  // A thread starts on device 0 without having used it: going back there would create a context
  // on a GPU this process has no work for (every rank on GPU 0). Stay on the guarded one instead.
  if (!has_context(previous_)) return;
  cudaSetDevice(previous_);  // destructors must not throw
}

cudaStream_t compute_stream(int device) {
  return compute_streams().get(device, "compute_stream", new_stream);
}

cudaStream_t copy_stream(int device) {
  return copy_streams().get(device, "copy_stream", new_stream);
}

cudaStream_t stream_for(int device, memory::Stream stream) {
  return stream.id == kCopyStreamId.id ? copy_stream(device) : compute_stream(device);
}

cublasHandle_t cublas_handle(int device) {
  cublasHandle_t handle = cublas_handles().get(device, "cublas_handle", [](int index) {
    cublasHandle_t created = nullptr;
    TESSEL_CUBLAS_CHECK(cublasCreate(&created));
    TESSEL_CUBLAS_CHECK(cublasSetStream(created, compute_stream(index)));
    return created;
  });
  TESSEL_CUBLAS_CHECK(cublasSetMathMode(
      handle, tf32_allowed.load() ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  return handle;
}

cudnnHandle_t cudnn_handle(int device) {
  return cudnn_handles().get(device, "cudnn_handle", [](int index) {
    cudnnHandle_t created = nullptr;
    TESSEL_CUDNN_CHECK(cudnnCreate(&created));
    TESSEL_CUDNN_CHECK(cudnnSetStream(created, compute_stream(index)));
    return created;
  });
}

void set_allow_tf32(bool allow) { tf32_allowed.store(allow); }
bool allow_tf32() { return tf32_allowed.load(); }

void synchronize(int device) {
  DeviceGuard guard(device);
  TESSEL_CUDA_CHECK(cudaDeviceSynchronize());
  raise_device_errors(device);
}

IndexError* device_error_record(int device) {
  return error_records().get(device, "device_error_record", [](int) {
    void* record = nullptr;
    TESSEL_CUDA_CHECK(
        cudaHostAlloc(&record, sizeof(IndexError), cudaHostAllocMapped | cudaHostAllocPortable));
    return new (record) IndexError();
  });
}

void raise_device_errors(int device) {
  if (device < 0 || device >= kMaxDevices) return;
  IndexError* record = error_records().handles[device].load(std::memory_order_acquire);
  if (!record) return;  // no kernel of this device has checked an index yet
  // The compute stream was waited for: its kernels' writes are visible and none writes now.
  const IndexError found = *record;
  if (found.op == IndexOp::kNone) return;
  record->op = IndexOp::kNone;
  TESSEL_FAIL(index_error_message(found, device));
}

Event::Event() { TESSEL_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming)); }

Event::~Event() {
  if (event_) cudaEventDestroy(event_);
}

void Event::record(cudaStream_t stream) { TESSEL_CUDA_CHECK(cudaEventRecord(event_, stream)); }

bool Event::query() const {
  cudaError_t status = cudaEventQuery(event_);
  if (status == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  TESSEL_CUDA_CHECK(status);
  return true;
}

void Event::synchronize() const { TESSEL_CUDA_CHECK(cudaEventSynchronize(event_)); }

void stream_wait(cudaStream_t waiter, cudaStream_t producer) {
  if (waiter == producer) return;
  Event event;
  event.record(producer);
  TESSEL_CUDA_CHECK(cudaStreamWaitEvent(waiter, event.get(), 0));
}

}  // namespace tessel::cuda
