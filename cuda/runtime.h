// The CUDA runtime layer every CUDA file uses: checked calls (errors become tessel::Error with
// file, line and the library's message), per-device compute and copy streams, cuBLAS and cuDNN
// handles bound to the compute stream, and device guards. Only built under --config=cuda.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <nccl.h>

#include <cstdint>

#include "core/allocator.h"
#include "core/device.h"
#include "cuda/index_error.h"

namespace tessel::cuda {

namespace internal {
[[noreturn]] void throw_cuda_error(cudaError_t status, const char* expr, const char* file,
                                   int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* expr, const char* file,
                                     int line);
[[noreturn]] void throw_cudnn_error(cudnnStatus_t status, const char* expr, const char* file,
                                    int line);
[[noreturn]] void throw_nccl_error(ncclResult_t status, const char* expr, const char* file,
                                   int line);
const char* cublas_status_name(cublasStatus_t status);
}  // namespace internal

// Number of visible GPUs; 0 when there is no driver or no GPU. Never throws.
int device_count();
// Devices Tessel addresses at most (per-device tables are sized by it).
constexpr int kMaxDevices = 64;
// Throws a clear tessel::Error when `index` is not a usable GPU (none visible, or out of range);
// `what` names the caller in the message.
void check_device(int index, const char* what = "cuda");
int current_device();

// Whether the process has created `device`'s primary context (used it); never creates one.
bool has_context(int device);

// Makes `device` current on the calling thread for good and records it as the process's device
// (one rank, one GPU): threads started later (copy threads) bind to it with bind_thread.
void set_process_device(int device);
// The device set by set_process_device; -1 when none was set.
int process_device();
// Makes `device` current on the calling thread for good, if it is not already: a thread that
// serves one device (a copy thread) keeps it current instead of switching for every call.
void bind_thread(int device);

// Makes `index` the current device for its lifetime, then restores the one that was current
// before, unless the process never used that one: restoring it would create its context.
class DeviceGuard {
 public:
  explicit DeviceGuard(int index);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

// One non-blocking compute stream and one copy stream per device, created on first use and
// kept for the life of the process. Thread-safe.
cudaStream_t compute_stream(int device);
cudaStream_t copy_stream(int device);
// The memory::Stream ids the allocator sees for these streams.
constexpr memory::Stream kComputeStreamId{0};
constexpr memory::Stream kCopyStreamId{1};
cudaStream_t stream_for(int device, memory::Stream stream);

// Handles bound to compute_stream(device), created on first use. cuBLAS math mode is the
// default (no TF32) unless set_allow_tf32(true).
cublasHandle_t cublas_handle(int device);
cudnnHandle_t cudnn_handle(int device);
void set_allow_tf32(bool allow);
bool allow_tf32();

// Waits for every stream of `device`, then reports a bad index its kernels recorded.
void synchronize(int device);

// The record where `device`'s kernels write the first bad index they find (IndexError::op is
// kNone while there is none): pinned host memory mapped into the device, so the host reads it
// without a copy. Created on first use.
IndexError* device_error_record(int device);
// At a synchronisation point (the compute stream of `device` waited for): throws the bad index
// recorded since the last report, if any, as a tessel::Error, and clears the record.
void raise_device_errors(int device);

// An owned cudaEvent_t (timing disabled) created on the current device.
class Event {
 public:
  Event();
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record(cudaStream_t stream);
  bool query() const;  // true once the recorded work completed
  void synchronize() const;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// Makes `waiter` wait (on the device, host not blocked) for all work queued so far on `producer`.
void stream_wait(cudaStream_t waiter, cudaStream_t producer);

}  // namespace tessel::cuda

#define TESSEL_CUDA_CHECK(expr)                                                                   \
  do {                                                                                            \
    cudaError_t tessel_cuda_status_ = (expr);                                                     \
    if (tessel_cuda_status_ != cudaSuccess)                                                       \
      ::tessel::cuda::internal::throw_cuda_error(tessel_cuda_status_, #expr, __FILE__, __LINE__); \
  } while (0)

#define TESSEL_CUBLAS_CHECK(expr)                                                          \
  do {                                                                                     \
    cublasStatus_t tessel_cublas_status_ = (expr);                                         \
    if (tessel_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                    \
      ::tessel::cuda::internal::throw_cublas_error(tessel_cublas_status_, #expr, __FILE__, \
                                                   __LINE__);                              \
  } while (0)

#define TESSEL_CUDNN_CHECK(expr)                                                         \
  do {                                                                                   \
    cudnnStatus_t tessel_cudnn_status_ = (expr);                                         \
    if (tessel_cudnn_status_ != CUDNN_STATUS_SUCCESS)                                    \
      ::tessel::cuda::internal::throw_cudnn_error(tessel_cudnn_status_, #expr, __FILE__, \
                                                  __LINE__);                             \
  } while (0)

#define TESSEL_NCCL_CHECK(expr)                                                                   \
  do {                                                                                            \
    ncclResult_t tessel_nccl_status_ = (expr);                                                    \
    if (tessel_nccl_status_ != ncclSuccess)                                                       \
      ::tessel::cuda::internal::throw_nccl_error(tessel_nccl_status_, #expr, __FILE__, __LINE__); \
  } while (0)
