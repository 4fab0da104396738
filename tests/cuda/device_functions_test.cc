// The CUDA kernels' shared host/device functions (Philox, the uniform and normal transforms,
// 16-bit float casts) give core's CPU results bit for bit. Runs on the host: no GPU needed.
#include "tests/cuda/device_functions.h"

#include "gtest/gtest.h"

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

}  // namespace
}  // namespace tessel::cuda
