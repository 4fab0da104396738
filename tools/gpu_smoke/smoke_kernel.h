// The gpu_smoke check's own kernel, apart from Tessel's: y = a * x + y over device memory.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tessel::gpu_smoke {

// Queues y[i] = a * x[i] + y[i] for i < count on the default stream; returns the launch status
// (cudaErrorNoKernelImageForDevice on a GPU older than the code was built for).
cudaError_t launch_axpy(float a, const float* x, float* y, int64_t count);

}  // namespace tessel::gpu_smoke
