// The CUDA kernels' shared host/device functions (Philox, the uniform and normal transforms,
// 16-bit float casts) give core's CPU results bit for bit: on the host (no GPU needed) and, for
// the normal transform, in a kernel on the GPU.
#include "tests/cuda/device_functions.h"

#include "cuda/runtime.h"
#include "gtest/gtest.h"
#include "tests/gpu_skip.h"

namespace tessel::cuda {
namespace {

TEST(CudaDeviceFunctions, PhiloxStreamAndCastsMatchTheCpuBitForBit) {
  const DeviceFunctionMismatches mismatches = compare_device_functions_with_core(200000);
  EXPECT_EQ(mismatches.philox_words, 0);
  EXPECT_EQ(mismatches.uniform, 0);
  EXPECT_EQ(mismatches.normal, 0);
  EXPECT_EQ(mismatches.to_bf16, 0);
  EXPECT_EQ(mismatches.to_f16, 0);
  EXPECT_EQ(mismatches.from_half, 0);
}

// randn on the GPU draws the CPU's numbers: CUDA's double log, sqrt, sin and cos are within an
// ulp or two of glibc's, which the rounding to float absorbs.
TEST(CudaDeviceFunctions, NormalsDrawnOnTheGpuMatchTheCpuBitForBit) {
  TESSEL_SKIP_IF_NO_GPU();
  EXPECT_EQ(count_gpu_normal_mismatches(1 << 20), 0);
}

}  // namespace
}  // namespace tessel::cuda
