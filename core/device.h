// Devices: cpu, cuda:N and meta (shapes only, no bytes; the planner traces on it).
//   Device d = Device::parse("cuda:1");   d.type == DeviceType::kCuda, d.index == 1
#pragma once

#include <ostream>
#include <string>

namespace tessel {

enum class DeviceType : uint8_t { kCpu, kCuda, kMeta };
constexpr int kNumDeviceTypes = 3;

struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = 0;

  static Device cpu() { return {DeviceType::kCpu, 0}; }
  static Device cuda(int index = 0) { return {DeviceType::kCuda, index}; }
  static Device meta() { return {DeviceType::kMeta, 0}; }
  static Device parse(const std::string& text);  // "cpu", "cuda", "cuda:2", "meta"

  bool is_cpu() const { return type == DeviceType::kCpu; }
  bool is_cuda() const { return type == DeviceType::kCuda; }
  bool is_meta() const { return type == DeviceType::kMeta; }
  std::string str() const;
  bool operator==(const Device& other) const { return type == other.type && index == other.index; }
  bool operator!=(const Device& other) const { return !(*this == other); }
};

inline std::ostream& operator<<(std::ostream& out, const Device& device) {
  return out << device.str();
}

}  // namespace tessel
