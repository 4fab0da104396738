// Host runs of the host/device functions CUDA kernels share with the CPU (core/philox.h,
// core/half.h), compared with core's CPU entry points (rng.h, dtype.h); runs without a GPU.
//   DeviceFunctionMismatches m = compare_device_functions_with_core(100000);  // all zero
#pragma once

#include <cstdint>

namespace tessel::cuda {

// How many samples differ from core (rng.cc, dtype.cc), per function.
struct DeviceFunctionMismatches {
  int64_t philox_words = 0, uniform = 0, normal = 0, to_bf16 = 0, to_f16 = 0, from_half = 0;
};
DeviceFunctionMismatches compare_device_functions_with_core(int64_t samples);
// The same for the normal transform computed by a kernel on cuda:0 (CUDA's own log, sqrt, sin
// and cos), against core's: how many of `samples` normals differ in any bit. Needs a GPU.
int64_t count_gpu_normal_mismatches(int64_t samples);

}  // namespace tessel::cuda
