#include "tools/gpu_smoke/smoke_kernel.h"

namespace tessel::gpu_smoke {
namespace {

__global__ void axpy_kernel(float a, const float* x, float* y, int64_t count) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += stride)
    y[i] = a * x[i] + y[i];
}

}  // namespace

cudaError_t launch_axpy(float a, const float* x, float* y, int64_t count) {
  constexpr int kThreads = 256;
  const int64_t blocks = (count + kThreads - 1) / kThreads;
  axpy_kernel<<<static_cast<unsigned>(blocks < 4096 ? blocks : 4096), kThreads>>>(a, x, y, count);
  return cudaGetLastError();
}

}  // namespace tessel::gpu_smoke
