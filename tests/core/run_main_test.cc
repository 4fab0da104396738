#include "core/run_main.h"

#include <functional>
#include <stdexcept>
#include <string>
#include <utility>

#include "core/error.h"
#include "gtest/gtest.h"

namespace tessel {
namespace {

// Runs run_main with argv[0] = "/usr/bin/tool" and returns (exit code, stderr).
std::pair<int, std::string> run_tool(const std::function<int(int, char**)>& body) {
  char program[] = "/usr/bin/tool";
  char flag[] = "--flag";
  char* argv[] = {program, flag, nullptr};
  ::testing::internal::CaptureStderr();
  const int code = run_main(2, argv, body);
  return {code, ::testing::internal::GetCapturedStderr()};
}

TEST(RunMain, ReturnsTheBodysExitCodeAndPassesItsArguments) {
  auto [code, err] = run_tool([](int argc, char** argv) {
    EXPECT_EQ(argc, 2);
    EXPECT_EQ(std::string(argv[1]), "--flag");
    return 3;
  });
  EXPECT_EQ(code, 3);
  EXPECT_EQ(err, "");
}

TEST(RunMain, ATesselErrorIsOneLineWithoutItsSourceLocation) {
  auto [code, err] = run_tool([](int, char**) -> int {
    TESSEL_CHECK(1 + 1 == 3, "the checkpoint ", "ckpt/3", " is truncated");
    return 0;
  });
  EXPECT_EQ(code, 1);
  EXPECT_EQ(err, "tool: error: the checkpoint ckpt/3 is truncated\n");
}

TEST(RunMain, OutOfMemorySaysSo) {
  auto [code, err] = run_tool([](int, char**) -> int {
    throw TESSEL_ERROR_TYPE(OutOfMemory, "cpu: 4 GiB asked, 1 GiB free");
  });
  EXPECT_EQ(code, 1);
  EXPECT_EQ(err, "tool: out of memory: cpu: 4 GiB asked, 1 GiB free\n");
}

TEST(RunMain, OtherExceptionsPrintWhat) {
  auto [code, err] = run_tool([](int, char**) -> int { throw std::out_of_range("index 9"); });
  EXPECT_EQ(code, 1);
  EXPECT_EQ(err, "tool: error: index 9\n");
  auto [unknown_code, unknown_err] = run_tool([](int, char**) -> int { throw 42; });
  EXPECT_EQ(unknown_code, 1);
  EXPECT_EQ(unknown_err, "tool: error: an exception of unknown type\n");
}

}  // namespace
}  // namespace tessel
