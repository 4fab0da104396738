#include "core/run_main.h"

#include <cstdio>
#include <exception>
#include <iostream>
#include <string>

#include "core/error.h"

namespace tessel {
namespace {

std::string program_name(int argc, char** argv) {
  if (argc < 1 || argv == nullptr || argv[0] == nullptr || argv[0][0] == '\0') return "tessel";
  const std::string path = argv[0];
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// What the tool printed so far comes first, even when stdout is a buffered file or pipe.
int report(const std::string& program, const char* kind, const std::string& message) {
  std::cout.flush();
  std::fflush(stdout);
  std::cerr << program << ": " << kind << ": " << message << std::endl;
  return 1;
}

}  // namespace

int run_main(int argc, char** argv, const std::function<int(int, char**)>& body) {
  try {
    return body(argc, argv);
  } catch (const OutOfMemory& error) {
    return report(program_name(argc, argv), "out of memory", error.message());
  } catch (const Error& error) {
    return report(program_name(argc, argv), "error", error.message());
  } catch (const std::exception& error) {
    return report(program_name(argc, argv), "error", error.what());
  } catch (...) {
    return report(program_name(argc, argv), "error", "an exception of unknown type");
  }
}

}  // namespace tessel
