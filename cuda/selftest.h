// A tiny CUDA kernel used to check that nvcc, linking and a device work end to end.
//   cuda::selftest_fill(device, 1024, 3.0f) returns true when every element read back is 3.
#pragma once

#include <cstdint>

namespace tessel::cuda {

// Fills `count` floats on `device` with `value` in a kernel on compute_stream and reads them
// back; throws tessel::Error when there is no device.
bool selftest_fill(int device, int64_t count, float value);

}  // namespace tessel::cuda
