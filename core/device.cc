#include "core/device.h"

#include "core/error.h"

namespace tessel {

Device Device::parse(const std::string& text) {
  if (text == "cpu") return cpu();
  if (text == "meta") return meta();
  if (text == "cuda") return cuda(0);
  if (text.rfind("cuda:", 0) == 0) {
    try {
      size_t used = 0;
      int index = std::stoi(text.substr(5), &used);
      if (used == text.size() - 5 && index >= 0) return cuda(index);
    } catch (const std::exception&) {
    }
  }
  TESSEL_FAIL("unknown device '", text, "' (expected cpu, meta, cuda or cuda:N)");
}

std::string Device::str() const {
  switch (type) {
    case DeviceType::kCpu:
      return "cpu";
    case DeviceType::kMeta:
      return "meta";
    case DeviceType::kCuda:
      return "cuda:" + std::to_string(index);
  }
  return "?";
}

}  // namespace tessel
