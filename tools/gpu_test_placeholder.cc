// The body of every gpu_test (tools/cuda.bzl) in the default, CPU-only build: its real sources
// need the CUDA toolkit, so the test only says how to build it. Under TESSEL_REQUIRE_GPU (set by
// tools/gpu_check.sh run) it fails: a placeholder run on a GPU machine tested nothing.
#include "gtest/gtest.h"
#include "tests/gpu_skip.h"

TEST(GpuTest, NeedsTheCudaBuild) {
  if (tessel::testing::gpu_required())
    GTEST_FAIL() << "GPU test built without CUDA, and TESSEL_REQUIRE_GPU is set: rebuild with "
                    "--config=cuda (tools/gpu_check.sh build)";
  GTEST_SKIP() << "GPU test built without CUDA: bazel test --config=cuda, or tools/gpu_check.sh";
}
