// gpu_smoke: does this machine run CUDA code at all? The first thing tools/gpu_check.sh runs on a
// GPU machine, so that a broken driver, a missing library or a hidden GPU is told apart from a
// bug in Tessel. Each check runs the same computation on the CPU and compares:
//   - the devices (count, name, compute capability, memory),
//   - an own kernel (axpy, not Tessel's),
//   - a cuBLAS SGEMM, a cuDNN convolution, a one-rank NCCL all-reduce (own unique id, no MPI),
//   - Tessel's CUDA backend: matmul and relu of tensors on cuda:0.
// Usage: gpu_smoke             the checks; exit 0 all passed, 1 a check failed, 2 no GPU usable
//        gpu_smoke --versions  driver, runtime, cuDNN, cuBLAS and NCCL versions as loaded (and as
//                              built against), the loaded libraries' paths; needs no GPU
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <link.h>
#include <nccl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "ops/ops.h"
#include "tools/gpu_smoke/smoke_kernel.h"

namespace tessel::gpu_smoke {
namespace {

// A failed check: the message goes into the check's line.
struct CheckFailure {
  std::string message;
};

std::string cuda_error_text(cudaError_t status) {
  return std::string(cudaGetErrorName(status)) + " (" + cudaGetErrorString(status) + ")";
}

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw CheckFailure{std::string(what) + ": " + cuda_error_text(status)};
}

void check_cublas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw CheckFailure{std::string(what) + ": " + cublasGetStatusName(status) + " (" +
                       cublasGetStatusString(status) + ")"};
}

void check_cudnn(cudnnStatus_t status, const char* what) {
  if (status != CUDNN_STATUS_SUCCESS)
    throw CheckFailure{std::string(what) + ": " + cudnnGetErrorString(status)};
}

void check_nccl(ncclResult_t status, const char* what, ncclComm_t comm = nullptr) {
  if (status != ncclSuccess)
    throw CheckFailure{std::string(what) + ": " + ncclGetErrorString(status) + " (" +
                       ncclGetLastError(comm) + ")"};
}

// "13.0" from CUDA's 13000.
std::string cuda_version_text(int version) {
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

// Device memory freed at scope exit.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t count) : count_(count) {
    check_cuda(cudaMalloc(&data_, count * sizeof(T)), "cudaMalloc");
  }
  ~DeviceBuffer() { cudaFree(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* get() const { return data_; }
  void upload(const std::vector<T>& values) {
    check_cuda(cudaMemcpy(data_, values.data(), count_ * sizeof(T), cudaMemcpyHostToDevice),
               "cudaMemcpy to the device");
  }
  std::vector<T> download() const {
    std::vector<T> values(count_);
    check_cuda(cudaMemcpy(values.data(), data_, count_ * sizeof(T), cudaMemcpyDeviceToHost),
               "cudaMemcpy to the host");
    return values;
  }

 private:
  T* data_ = nullptr;
  size_t count_;
};

// Throws unless max|actual - expected| <= atol + rtol * max|expected|.
void expect_close(const std::vector<float>& actual, const std::vector<double>& expected,
                  double rtol, double atol) {
  if (actual.size() != expected.size())
    throw CheckFailure{"got " + std::to_string(actual.size()) + " values, expected " +
                       std::to_string(expected.size())};
  double largest = 0, worst = 0;
  size_t worst_index = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    largest = std::max(largest, std::abs(expected[i]));
    const double difference = std::abs(actual[i] - expected[i]);
    if (!(difference <= worst)) {  // also catches NaN
      worst = std::isnan(difference) ? INFINITY : difference;
      worst_index = i;
    }
  }
  if (!(worst <= atol + rtol * largest)) {
    char text[200];
    std::snprintf(text, sizeof(text), "differs from the CPU at [%zu]: %.7g vs %.7g (max|cpu| %.3g)",
                  worst_index, actual[worst_index], expected[worst_index], largest);
    throw CheckFailure{text};
  }
}

std::vector<float> ramp(size_t count, int period, float scale) {
  std::vector<float> values(count);
  for (size_t i = 0; i < count; ++i) values[i] = scale * static_cast<float>(i % period) - 1.0f;
  return values;
}

std::string check_own_kernel() {
  constexpr int64_t kCount = 1 << 20;
  // Small integers: every product and sum is exact in float, so the comparison is exact too.
  std::vector<float> x(kCount), y(kCount);
  for (int64_t i = 0; i < kCount; ++i) {
    x[i] = static_cast<float>(i % 1000);
    y[i] = static_cast<float>(2 * (i % 7));
  }
  DeviceBuffer<float> device_x(kCount), device_y(kCount);
  device_x.upload(x);
  device_y.upload(y);
  check_cuda(launch_axpy(3.0f, device_x.get(), device_y.get(), kCount), "axpy launch");
  check_cuda(cudaDeviceSynchronize(), "axpy");
  const std::vector<float> result = device_y.download();
  for (int64_t i = 0; i < kCount; ++i) {
    if (result[i] != 3.0f * x[i] + y[i])
      throw CheckFailure{"y[" + std::to_string(i) + "] = " + std::to_string(result[i]) +
                         ", the CPU says " + std::to_string(3.0f * x[i] + y[i])};
  }
  return "axpy over 2^20 floats, bitwise equal";
}

std::string check_cublas_gemm() {
  constexpr int kM = 96, kN = 80, kK = 64;  // column-major C(m x n) = A(m x k) B(k x n)
  const std::vector<float> a = ramp(kM * kK, 13, 0.25f), b = ramp(kK * kN, 11, 0.125f);
  std::vector<double> expected(kM * kN, 0.0);
  for (int j = 0; j < kN; ++j)
    for (int p = 0; p < kK; ++p)
      for (int i = 0; i < kM; ++i)
        expected[i + j * kM] += static_cast<double>(a[i + p * kM]) * b[p + j * kK];
  DeviceBuffer<float> device_a(a.size()), device_b(b.size()), device_c(expected.size());
  device_a.upload(a);
  device_b.upload(b);
  cublasHandle_t handle = nullptr;
  check_cublas(cublasCreate(&handle), "cublasCreate");
  const float one = 1.0f, zero = 0.0f;
  const cublasStatus_t status =
      cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, kM, kN, kK, &one, device_a.get(), kM,
                  device_b.get(), kK, &zero, device_c.get(), kM);
  cublasDestroy(handle);
  check_cublas(status, "cublasSgemm");
  check_cuda(cudaDeviceSynchronize(), "cublasSgemm");
  expect_close(device_c.download(), expected, 1e-5, 1e-5);
  return "SGEMM 96x80x64 matches the CPU";
}

std::string check_cudnn_convolution() {
  constexpr int kN = 2, kC = 3, kH = 9, kW = 9, kK = 4, kR = 3, kS = 3, kPad = 1, kStride = 2;
  constexpr int kP = (kH + 2 * kPad - kR) / kStride + 1, kQ = (kW + 2 * kPad - kS) / kStride + 1;
  const std::vector<float> input = ramp(kN * kC * kH * kW, 17, 0.1f);
  const std::vector<float> filter = ramp(kK * kC * kR * kS, 7, 0.3f);
  std::vector<double> expected(kN * kK * kP * kQ, 0.0);
  for (int n = 0; n < kN; ++n)
    for (int k = 0; k < kK; ++k)
      for (int p = 0; p < kP; ++p)
        for (int q = 0; q < kQ; ++q) {
          double sum = 0;
          for (int c = 0; c < kC; ++c)
            for (int r = 0; r < kR; ++r)
              for (int s = 0; s < kS; ++s) {
                const int h = p * kStride - kPad + r, w = q * kStride - kPad + s;
                if (h < 0 || h >= kH || w < 0 || w >= kW) continue;
                sum += static_cast<double>(input[((n * kC + c) * kH + h) * kW + w]) *
                       filter[((k * kC + c) * kR + r) * kS + s];
              }
          expected[((n * kK + k) * kP + p) * kQ + q] = sum;
        }

  cudnnHandle_t handle = nullptr;
  check_cudnn(cudnnCreate(&handle), "cudnnCreate");
  cudnnTensorDescriptor_t x_desc = nullptr, y_desc = nullptr;
  cudnnFilterDescriptor_t w_desc = nullptr;
  cudnnConvolutionDescriptor_t conv_desc = nullptr;
  std::string failure;
  try {
    check_cudnn(cudnnCreateTensorDescriptor(&x_desc), "cudnnCreateTensorDescriptor");
    check_cudnn(cudnnCreateTensorDescriptor(&y_desc), "cudnnCreateTensorDescriptor");
    check_cudnn(cudnnCreateFilterDescriptor(&w_desc), "cudnnCreateFilterDescriptor");
    check_cudnn(cudnnCreateConvolutionDescriptor(&conv_desc), "cudnnCreateConvolutionDescriptor");
    check_cudnn(
        cudnnSetTensor4dDescriptor(x_desc, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, kN, kC, kH, kW),
        "cudnnSetTensor4dDescriptor(x)");
    check_cudnn(
        cudnnSetFilter4dDescriptor(w_desc, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, kK, kC, kR, kS),
        "cudnnSetFilter4dDescriptor");
    check_cudnn(cudnnSetConvolution2dDescriptor(conv_desc, kPad, kPad, kStride, kStride, 1, 1,
                                                CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
                "cudnnSetConvolution2dDescriptor");
    int n = 0, k = 0, p = 0, q = 0;
    check_cudnn(cudnnGetConvolution2dForwardOutputDim(conv_desc, x_desc, w_desc, &n, &k, &p, &q),
                "cudnnGetConvolution2dForwardOutputDim");
    if (n != kN || k != kK || p != kP || q != kQ)
      throw CheckFailure{"cuDNN output shape " + std::to_string(n) + "x" + std::to_string(k) + "x" +
                         std::to_string(p) + "x" + std::to_string(q)};
    check_cudnn(
        cudnnSetTensor4dDescriptor(y_desc, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, kN, kK, kP, kQ),
        "cudnnSetTensor4dDescriptor(y)");
    // Implicit GEMM: supported for every shape, no workspace.
    const cudnnConvolutionFwdAlgo_t algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
    size_t workspace_bytes = 0;
    check_cudnn(cudnnGetConvolutionForwardWorkspaceSize(handle, x_desc, w_desc, conv_desc, y_desc,
                                                        algo, &workspace_bytes),
                "cudnnGetConvolutionForwardWorkspaceSize");
    DeviceBuffer<float> device_x(input.size()), device_w(filter.size()), device_y(expected.size());
    DeviceBuffer<char> workspace(std::max<size_t>(workspace_bytes, 1));
    device_x.upload(input);
    device_w.upload(filter);
    const float one = 1.0f, zero = 0.0f;
    check_cudnn(cudnnConvolutionForward(handle, &one, x_desc, device_x.get(), w_desc,
                                        device_w.get(), conv_desc, algo, workspace.get(),
                                        workspace_bytes, &zero, y_desc, device_y.get()),
                "cudnnConvolutionForward");
    check_cuda(cudaDeviceSynchronize(), "cudnnConvolutionForward");
    expect_close(device_y.download(), expected, 1e-5, 1e-5);
  } catch (const CheckFailure& error) {
    failure = error.message;
  }
  cudnnDestroyConvolutionDescriptor(conv_desc);
  cudnnDestroyFilterDescriptor(w_desc);
  cudnnDestroyTensorDescriptor(y_desc);
  cudnnDestroyTensorDescriptor(x_desc);
  cudnnDestroy(handle);
  if (!failure.empty()) throw CheckFailure{failure};
  return "3x3 convolution (stride 2, padding 1) matches the CPU";
}

std::string check_nccl_all_reduce() {
  constexpr size_t kCount = 4096;
  const std::vector<float> values = ramp(kCount, 101, 0.5f);
  ncclUniqueId id;
  check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  ncclComm_t comm = nullptr;
  check_nccl(ncclCommInitRank(&comm, 1, id, 0), "ncclCommInitRank(1 rank)");
  std::string failure;
  try {
    DeviceBuffer<float> buffer(kCount);
    buffer.upload(values);
    // One rank: the sum over ranks is the rank's own values, the CPU's answer.
    check_nccl(ncclAllReduce(buffer.get(), buffer.get(), kCount, ncclFloat, ncclSum, comm,
                             cudaStreamPerThread),
               "ncclAllReduce", comm);
    check_cuda(cudaStreamSynchronize(cudaStreamPerThread), "ncclAllReduce");
    expect_close(buffer.download(), std::vector<double>(values.begin(), values.end()), 0, 0);
  } catch (const CheckFailure& error) {
    failure = error.message;
  }
  ncclCommDestroy(comm);
  if (!failure.empty()) throw CheckFailure{failure};
  return "sum over one rank of 4096 floats, in place, equal to the input";
}

std::string check_tessel_backend() {
  manual_seed(3);
  const Tensor a = randn({33, 17}), b = randn({17, 9});
  const Tensor on_cpu = relu(matmul(a, b));
  const Tensor on_gpu = relu(matmul(a.to(Device::cuda(0)), b.to(Device::cuda(0))));
  if (!on_gpu.device().is_cuda()) throw CheckFailure{"the result is on " + on_gpu.device().str()};
  const std::vector<float> expected = on_cpu.to_vector<float>();
  expect_close(on_gpu.to(Device::cpu()).to_vector<float>(),
               std::vector<double>(expected.begin(), expected.end()), 1e-5, 1e-6);
  return "relu(matmul) of 33x17 and 17x9 tensors on cuda:0 matches the CPU";
}

// The paths of the shared objects loaded so far, in load order.
std::vector<std::string> loaded_libraries() {
  std::vector<std::string> names;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* out) {
        if (info->dlpi_name != nullptr && info->dlpi_name[0] != '\0')
          static_cast<std::vector<std::string>*>(out)->push_back(info->dlpi_name);
        return 0;
      },
      &names);
  return names;
}

int print_versions() {
  int driver = 0, runtime = 0;
  const cudaError_t driver_status = cudaDriverGetVersion(&driver);
  const cudaError_t runtime_status = cudaRuntimeGetVersion(&runtime);
  std::printf("CUDA driver:  %s\n",
              driver_status != cudaSuccess ? cuda_error_text(driver_status).c_str()
              : driver == 0
                  ? "none (no driver library loaded)"
                  : (cuda_version_text(driver) + " (" + std::to_string(driver) + ")").c_str());
  std::printf("CUDA runtime: %s (cudart linked statically; built with %s)\n",
              runtime_status != cudaSuccess ? cuda_error_text(runtime_status).c_str()
                                            : cuda_version_text(runtime).c_str(),
              cuda_version_text(CUDART_VERSION).c_str());
  int devices = 0;
  const cudaError_t count_status = cudaGetDeviceCount(&devices);
  std::printf("devices:      %s\n", count_status == cudaSuccess
                                        ? std::to_string(devices).c_str()
                                        : cuda_error_text(count_status).c_str());
  std::printf("cuDNN:        %zu loaded (cudart %zu), built against %d\n", cudnnGetVersion(),
              cudnnGetCudartVersion(), CUDNN_VERSION);
  int major = -1, minor = -1, patch = -1;
  cublasGetProperty(MAJOR_VERSION, &major);
  cublasGetProperty(MINOR_VERSION, &minor);
  cublasGetProperty(PATCH_LEVEL, &patch);
  std::printf("cuBLAS:       %d.%d.%d loaded, built against %d.%d.%d\n", major, minor, patch,
              CUBLAS_VER_MAJOR, CUBLAS_VER_MINOR, CUBLAS_VER_PATCH);
  int nccl = 0;
  const ncclResult_t nccl_status = ncclGetVersion(&nccl);
  std::printf(
      "NCCL:         %s loaded, built against %d\n",
      nccl_status == ncclSuccess ? std::to_string(nccl).c_str() : ncclGetErrorString(nccl_status),
      NCCL_VERSION_CODE);
  std::printf("loaded libraries:\n");
  for (const std::string& name : loaded_libraries()) std::printf("  %s\n", name.c_str());
  return 0;
}

// Why no GPU is usable, with what the environment says about it.
std::string no_gpu_reason(cudaError_t status, int count) {
  std::string reason;
  if (status == cudaErrorInsufficientDriver) {
    int driver = 0;
    cudaDriverGetVersion(&driver);
    reason = driver == 0 ? "no CUDA driver found (libcuda.so.1 is not loadable: "
                           "cudaErrorInsufficientDriver)"
                         : "the driver is too old for this CUDA " +
                               cuda_version_text(CUDART_VERSION) + " runtime (it supports CUDA " +
                               cuda_version_text(driver) + "): cudaErrorInsufficientDriver";
  } else if (status != cudaSuccess) {
    reason = "cudaGetDeviceCount: " + cuda_error_text(status);
  } else {
    reason = "cudaGetDeviceCount found " + std::to_string(count) + " devices";
  }
  struct stat info;
  if (stat("/dev/nvidiactl", &info) != 0 && stat("/dev/nvidia0", &info) != 0)
    reason += "; no /dev/nvidia* device files";
  if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES")) {
    reason += std::string("; CUDA_VISIBLE_DEVICES='") + visible + "'";
    if (visible[0] == '\0') reason += " (set but empty: it hides every GPU)";
  }
  return reason;
}

int run_checks() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    std::printf("no GPU: %s\n", no_gpu_reason(status, count).c_str());
    return 2;
  }
  for (int device = 0; device < count; ++device) {
    cudaDeviceProp properties;
    check_cuda(cudaGetDeviceProperties(&properties, device), "cudaGetDeviceProperties");
    std::printf("device %d: %s, compute capability %d.%d, %.1f GiB\n", device, properties.name,
                properties.major, properties.minor,
                static_cast<double>(properties.totalGlobalMem) / (1u << 30));
  }
  const std::vector<std::pair<const char*, std::function<std::string()>>> checks = {
      {"own kernel", check_own_kernel},
      {"cuBLAS GEMM", check_cublas_gemm},
      {"cuDNN convolution", check_cudnn_convolution},
      {"NCCL all-reduce", check_nccl_all_reduce},
      {"Tessel CUDA backend", check_tessel_backend},
  };
  int failed = 0;
  for (const auto& [name, check] : checks) {
    std::string outcome;
    bool ok = false;
    try {
      outcome = check();
      ok = true;
    } catch (const CheckFailure& failure) {
      outcome = failure.message;
    } catch (const std::exception& error) {
      outcome = error.what();
    }
    failed += ok ? 0 : 1;
    std::printf("%-5s %s: %s\n", ok ? "ok" : "FAIL", name, outcome.c_str());
    std::fflush(stdout);
    // A sticky error (an illegal address) poisons every later check: say so once, stop.
    const cudaError_t sticky = ok ? cudaSuccess : cudaDeviceSynchronize();
    if (sticky != cudaSuccess) {
      std::printf("FAIL  the CUDA context is broken (%s); later checks not run\n",
                  cuda_error_text(sticky).c_str());
      return 1;
    }
  }
  std::printf("gpu_smoke: %s\n",
              failed == 0 ? ("all " + std::to_string(checks.size()) + " checks passed").c_str()
                          : (std::to_string(failed) + " of " + std::to_string(checks.size()) +
                             " checks failed")
                                .c_str());
  return failed == 0 ? 0 : 1;
}

}  // namespace
}  // namespace tessel::gpu_smoke

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc == 2 && std::string(argv[1]) == "--versions") return tessel::gpu_smoke::print_versions();
  if (argc != 1) {
    std::fprintf(stderr, "usage: gpu_smoke [--versions]\n");
    return 64;
  }
  try {
    return tessel::gpu_smoke::run_checks();
  } catch (const std::exception& error) {
    std::printf("FAIL  %s\n", error.what());
    return 1;
  } catch (const tessel::gpu_smoke::CheckFailure& failure) {
    std::printf("FAIL  %s\n", failure.message.c_str());
    return 1;
  }
}
