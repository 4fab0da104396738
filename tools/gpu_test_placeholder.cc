// The body of every gpu_test (tools/cuda.bzl) in the default, CPU-only build: its real sources
// need the CUDA toolkit, so the test only says how to build it.
#include "gtest/gtest.h"

TEST(GpuTest, NeedsTheCudaBuild) {
  GTEST_SKIP() << "GPU test built without CUDA: bazel test --config=cuda, or tools/gpu_check.sh";
}
