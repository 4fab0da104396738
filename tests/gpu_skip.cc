#include "tests/gpu_skip.h"

#include <cstdlib>
#include <cstring>

namespace tessel::testing {

bool gpu_required() {
  const char* value = std::getenv("TESSEL_REQUIRE_GPU");
  return value != nullptr && value[0] != '\0' && std::strcmp(value, "0") != 0;
}

std::string missing_gpu_reason(int available, int needed) {
  if (available >= needed) return "";
  if (available == 0) return "no GPU (cuda::device_count() == 0)";
  return "needs " + std::to_string(needed) + " GPUs, " + std::to_string(available) + " visible";
}

}  // namespace tessel::testing
