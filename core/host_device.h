// TESSEL_HOST_DEVICE marks a function that CUDA kernels and CPU loops both call: under nvcc it
// is compiled for the host and for the device, elsewhere it is an ordinary inline function.
// Headers that use it include only what device code can use (<cstdint>, <cmath>, <cstring>).
//   TESSEL_HOST_DEVICE inline float twice(float x) { return 2 * x; }
#pragma once

#ifdef __CUDACC__
#define TESSEL_HOST_DEVICE __host__ __device__
#else
#define TESSEL_HOST_DEVICE
#endif

// Unrolls the next loop in device code (gcc has no plain `#pragma unroll`).
#ifdef __CUDA_ARCH__
#define TESSEL_UNROLL _Pragma("unroll")
#else
#define TESSEL_UNROLL
#endif
