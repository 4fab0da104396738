// The default CPU allocator keeps freed tensor memory for the next tensor (core/allocator.cc):
// a second tensor of the same size reuses the pages the first one faulted in, as evaluation's
// short-lived activations need.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstdlib>

#include "core/allocator.h"
#include "core/tensor.h"
#include "ops/ops.h"

namespace tessel {
namespace {

int64_t minor_page_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

// Makes a tensor of `bytes`, writes every byte, frees it; returns the page faults that took.
int64_t faults_of_a_written_tensor(int64_t bytes) {
  const int64_t before = minor_page_faults();
  {
    Tensor t = empty({bytes / 4});
    t.fill_(1.0);
  }
  return minor_page_faults() - before;
}

TEST(CpuAllocator, ASecondTensorOfTheSameSizeReusesTheFreedPages) {
  if (std::getenv("MALLOC_MMAP_THRESHOLD_") || std::getenv("MALLOC_TRIM_THRESHOLD_"))
    GTEST_SKIP() << "the environment sets glibc's thresholds";
  if (memory::kAddressSanitizer) GTEST_SKIP() << "AddressSanitizer's allocator replaces glibc's";
  constexpr int64_t kBytes = 24 << 20;  // an activation of evaluation at batch 500 is this large
  const int64_t pages = kBytes / 4096;
  const int64_t held = memory::allocator_for(Device::cpu())->stats().allocated_bytes;
  const int64_t first = faults_of_a_written_tensor(kBytes);
  EXPECT_GT(first, pages / 2);  // fresh memory: faulted in
  const int64_t second = faults_of_a_written_tensor(kBytes);
  EXPECT_LT(second, pages / 20) << "first " << first << " faults";
  // Freed as far as the allocator's counts go.
  EXPECT_EQ(memory::allocator_for(Device::cpu())->stats().allocated_bytes, held);
}

}  // namespace
}  // namespace tessel
