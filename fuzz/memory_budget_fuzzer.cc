// Memory budget strings ("1.5GiB", "512 mib", "0.4", "4096"): memory::parse_budget (the train
// CLI's --memory_budget) must return bytes of at least the smallest block or a fraction in
// (0, 1], or throw tessel::Error; so must the planner's parse_bytes (--memory_per_device and
// profiles) return a positive, finite size. Each line of the input is one string.
#include <cmath>
#include <string>

#include "fuzz/harness.h"
#include "memory/caching_allocator.h"
#include "memory/memory.h"
#include "parallel/planner/cost_model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessel;
  for (const std::string& text : fuzz::split(fuzz::as_string(data, size), '\n')) {
    fuzz::expect_only_tessel_errors([&] {
      const memory::Budget budget = memory::parse_budget(text);
      if (budget.is_fraction()) {
        TESSEL_FUZZ_CHECK(budget.fraction > 0 && budget.fraction <= 1, "fraction ", budget.fraction,
                          " from '", text, "'");
        const size_t resolved = budget.resolve(1000, 5000);
        TESSEL_FUZZ_CHECK(resolved >= 1000 && resolved <= 5000, "resolved to ", resolved);
      } else {
        TESSEL_FUZZ_CHECK(budget.bytes >= memory::CachingAllocator::kMinBlockSize, budget.bytes,
                          " bytes from '", text, "'");
      }
      budget.str();
    });
    fuzz::expect_only_tessel_errors([&] {
      const double bytes = planner::parse_bytes(text, "fuzz input");
      TESSEL_FUZZ_CHECK(std::isfinite(bytes) && bytes > 0, bytes, " bytes from '", text, "'");
    });
    fuzz::expect_only_tessel_errors([&] { memory::parse_policy(text); });
  }
  return 0;
}
