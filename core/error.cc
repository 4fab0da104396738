#include "core/error.h"

#include <cstring>

namespace tessel {
namespace {
std::string with_location(const std::string& message, const char* file, int line) {
  const char* base = std::strrchr(file, '/');
  return message + " (" + (base ? base + 1 : file) + ":" + std::to_string(line) + ")";
}
}  // namespace

Error::Error(std::string message, const char* file, int line)
    : std::runtime_error(with_location(message, file, line)),
      message_(std::move(message)),
      file_(file),
      line_(line) {}

}  // namespace tessel
