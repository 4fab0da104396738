// What a gpu test does when the GPUs it needs are not there: it skips, unless TESSEL_REQUIRE_GPU
// is set (tools/gpu_check.sh run sets it), in which case it fails, so a run on a GPU machine
// never reads "passed" for tests that silently had no device.
//   TEST(CudaFoo, Bar) { TESSEL_SKIP_IF_NO_GPU(); ... }
// The macro names cuda::device_count(), so the file using it includes cuda/runtime.h. Tests that
// skip because a GPU IS present (the no-GPU error paths) or that need a second GPU keep a plain
// GTEST_SKIP: a machine with one GPU is not a broken machine.
#pragma once

#include <string>

#include "gtest/gtest.h"

namespace tessel::testing {

// True when TESSEL_REQUIRE_GPU is set to anything but "" or "0".
bool gpu_required();

// Why a test needing `needed` GPUs cannot run when `available` are visible; "" when it can.
std::string missing_gpu_reason(int available, int needed);

}  // namespace tessel::testing

// Skips the current test (or fails it under TESSEL_REQUIRE_GPU) when fewer than `needed` GPUs are
// visible. Like GTEST_SKIP, it returns from the enclosing void function.
#define TESSEL_SKIP_IF_FEWER_GPUS(available, needed)                                         \
  do {                                                                                       \
    const std::string tessel_gpu_reason_ =                                                   \
        ::tessel::testing::missing_gpu_reason((available), (needed));                        \
    if (!tessel_gpu_reason_.empty()) {                                                       \
      if (::tessel::testing::gpu_required())                                                 \
        GTEST_FAIL() << tessel_gpu_reason_ << ", and TESSEL_REQUIRE_GPU is set: a gpu test " \
                     << "that cannot run is a failure";                                      \
      GTEST_SKIP() << tessel_gpu_reason_;                                                    \
    }                                                                                        \
  } while (0)

#define TESSEL_SKIP_IF_NO_GPU() TESSEL_SKIP_IF_FEWER_GPUS(::tessel::cuda::device_count(), 1)
