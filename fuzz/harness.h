// What every fuzz target shares: the rule that a tessel::Error is the expected answer to bad input
// and anything else is a finding, invariant checks that abort, and inputs as files for the loaders
// that only read paths.
//   extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
//     tessel::fuzz::expect_only_tessel_errors([&] { parse(tessel::fuzz::as_string(data, size)); });
//     return 0;
//   }
// A target is run by libFuzzer (`./tessel fuzz`) or by replay_main.cc (its corpus plus bounded
// random mutations, in `./tessel test`); either way an abort marks the input as a finding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace tessel::fuzz {

// Prints "fuzz finding: <what>" to stderr and aborts.
[[noreturn]] void fail(const std::string& what);

// Runs `body`. A tessel::Error (bad input rejected) returns false; success returns true. Any other
// exception is a finding: reported and aborted on.
template <typename Body>
bool expect_only_tessel_errors(Body&& body) {
  try {
    body();
    return true;
  } catch (const Error&) {
    return false;
  } catch (const std::exception& error) {
    fail(std::string("exception other than tessel::Error: ") + error.what());
  } catch (...) {
    fail("exception of an unknown type");
  }
}

// For formats Tessel writes as well as reads: `value`, which `read` accepted, written with `write`
// must read back and be written the same way again.
template <typename Value, typename Read, typename Write>
void check_reads_back(const Value& value, Read&& read, Write&& write) {
  const std::string written = write(value);
  Value reread;
  if (!expect_only_tessel_errors([&] { reread = read(written); }))
    fail("what was read does not read back once written:\n" + written);
  if (write(reread) != written) fail("written and read back, it changed:\n" + written);
}

inline std::string as_string(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

// The parts of `text` between `separator`s (empty parts kept; one part when there is none).
std::vector<std::string> split(const std::string& text, char separator);

// A folder of this process for input files, created on first use (under $TEST_TMPDIR, else
// $TMPDIR, else /tmp), so that parallel fuzzing jobs never share files.
const std::string& scratch_dir();
// Writes `bytes` to scratch_dir()/name (replacing it) and returns the path.
std::string write_scratch_file(const std::string& name, const std::string& bytes);

}  // namespace tessel::fuzz

// Aborts with the streamed parts when `cond` does not hold: a broken invariant is a finding.
#define TESSEL_FUZZ_CHECK(cond, ...)                                                             \
  do {                                                                                           \
    if (!(cond))                                                                                 \
      ::tessel::fuzz::fail(::tessel::detail::str_cat("check failed: " #cond ": ", __VA_ARGS__)); \
  } while (0)
