#include <vector>

#include "cuda/runtime.h"
#include "cuda/selftest.h"

namespace tessel::cuda {
namespace {

__global__ void fill_kernel(float* out, int64_t count, float value) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < count) out[i] = value;
}

}  // namespace

bool selftest_fill(int device, int64_t count, float value) {
  DeviceGuard guard(device);
  cudaStream_t stream = compute_stream(device);
  float* buffer = nullptr;
  TESSEL_CUDA_CHECK(cudaMallocAsync(&buffer, count * sizeof(float), stream));
  const int threads = 256;
  fill_kernel<<<static_cast<unsigned>((count + threads - 1) / threads), threads, 0, stream>>>(
      buffer, count, value);
  TESSEL_CUDA_CHECK(cudaGetLastError());
  std::vector<float> host(count);
  TESSEL_CUDA_CHECK(
      cudaMemcpyAsync(host.data(), buffer, count * sizeof(float), cudaMemcpyDeviceToHost, stream));
  TESSEL_CUDA_CHECK(cudaFreeAsync(buffer, stream));
  TESSEL_CUDA_CHECK(cudaStreamSynchronize(stream));
  for (float x : host) {
    if (x != value) return false;
  }
  return true;
}

}  // namespace tessel::cuda
