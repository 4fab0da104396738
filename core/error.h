// Errors: tessel::Error carries file, line and an actionable message; OutOfMemory derives from it.
// Use TESSEL_CHECK(cond, parts...) everywhere: the parts are streamed into the message.
//   TESSEL_CHECK(a.dim() == 2, "matmul: expected a 2-D tensor, got shape ", a.sizes());
#pragma once

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace tessel {

class Error : public std::runtime_error {
 public:
  Error(std::string message, const char* file, int line);
  const std::string& message() const { return message_; }
  const char* file() const { return file_; }
  int line() const { return line_; }

 private:
  std::string message_;
  const char* file_;
  int line_;
};

// Raised when an allocation cannot be satisfied by any memory policy; `report` says why.
class OutOfMemory : public Error {
 public:
  OutOfMemory(std::string message, const char* file, int line)
      : Error(std::move(message), file, line) {}
};

namespace detail {
inline void stream_parts(std::ostringstream&) {}
template <typename T>
void stream_one(std::ostringstream& out, const T& value) {
  out << value;
}
template <typename T>
void stream_one(std::ostringstream& out, const std::vector<T>& values) {
  out << '[';
  for (size_t i = 0; i < values.size(); ++i) out << (i ? ", " : "") << values[i];
  out << ']';
}
template <typename T, typename... Rest>
void stream_parts(std::ostringstream& out, const T& first, const Rest&... rest) {
  stream_one(out, first);
  stream_parts(out, rest...);
}
template <typename... Parts>
std::string str_cat(const Parts&... parts) {
  std::ostringstream out;
  stream_parts(out, parts...);
  return out.str();
}
}  // namespace detail

}  // namespace tessel

#define TESSEL_ERROR_TYPE(ErrorType, ...) \
  ErrorType(::tessel::detail::str_cat(__VA_ARGS__), __FILE__, __LINE__)

// Throws tessel::Error with the streamed parts when `cond` is false.
#define TESSEL_CHECK(cond, ...)                                         \
  do {                                                                  \
    if (!(cond)) throw TESSEL_ERROR_TYPE(::tessel::Error, __VA_ARGS__); \
  } while (0)

#define TESSEL_FAIL(...) throw TESSEL_ERROR_TYPE(::tessel::Error, __VA_ARGS__)
