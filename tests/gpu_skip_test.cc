// TESSEL_SKIP_IF_FEWER_GPUS on a machine without GPUs: a skip normally, a failure under
// TESSEL_REQUIRE_GPU, nothing when enough GPUs are there. The test part results are intercepted,
// so the skip or failure is looked at rather than reported.
#include "tests/gpu_skip.h"

#include <cstdlib>
#include <optional>
#include <string>

#include "gtest/gtest-spi.h"
#include "gtest/gtest.h"

namespace tessel::testing {
namespace {

// Sets (or, with nullopt, unsets) TESSEL_REQUIRE_GPU for its lifetime, then restores it.
class RequireGpuVariable {
 public:
  explicit RequireGpuVariable(const std::optional<std::string>& value) {
    if (const char* old = std::getenv("TESSEL_REQUIRE_GPU")) previous_ = old;
    if (value)
      setenv("TESSEL_REQUIRE_GPU", value->c_str(), 1);
    else
      unsetenv("TESSEL_REQUIRE_GPU");
  }
  ~RequireGpuVariable() {
    if (previous_)
      setenv("TESSEL_REQUIRE_GPU", previous_->c_str(), 1);
    else
      unsetenv("TESSEL_REQUIRE_GPU");
  }

 private:
  std::optional<std::string> previous_;
};

// What the macro records when `available` GPUs are visible and a test needs `needed`;
// `reached_end` says whether the code after it ran.
struct Outcome {
  ::testing::TestPartResultArray results;
  bool reached_end = false;
};

void guarded_body(int available, int needed, bool* reached_end) {
  TESSEL_SKIP_IF_FEWER_GPUS(available, needed);
  *reached_end = true;
}

void run_guarded(int available, int needed, Outcome* outcome) {
  ::testing::ScopedFakeTestPartResultReporter reporter(
      ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD,
      &outcome->results);
  guarded_body(available, needed, &outcome->reached_end);
}

TEST(GpuSkip, WithoutTheVariableNoGpuIsASkip) {
  RequireGpuVariable unset(std::nullopt);
  Outcome outcome;
  run_guarded(0, 1, &outcome);
  EXPECT_FALSE(outcome.reached_end);
  ASSERT_EQ(outcome.results.size(), 1);
  EXPECT_TRUE(outcome.results.GetTestPartResult(0).skipped());
  EXPECT_NE(std::string(outcome.results.GetTestPartResult(0).message()).find("no GPU"),
            std::string::npos);
}

TEST(GpuSkip, WithTheVariableNoGpuIsAFailure) {
  RequireGpuVariable set("1");
  Outcome outcome;
  run_guarded(0, 1, &outcome);
  EXPECT_FALSE(outcome.reached_end);
  ASSERT_EQ(outcome.results.size(), 1);
  const ::testing::TestPartResult& result = outcome.results.GetTestPartResult(0);
  EXPECT_TRUE(result.fatally_failed());
  EXPECT_NE(std::string(result.message()).find("no GPU"), std::string::npos);
  EXPECT_NE(std::string(result.message()).find("TESSEL_REQUIRE_GPU"), std::string::npos);
}

TEST(GpuSkip, TooFewGpusUnderTheVariableIsAFailureNamingTheCounts) {
  RequireGpuVariable set("yes");
  Outcome outcome;
  run_guarded(1, 2, &outcome);
  ASSERT_EQ(outcome.results.size(), 1);
  EXPECT_TRUE(outcome.results.GetTestPartResult(0).fatally_failed());
  EXPECT_NE(std::string(outcome.results.GetTestPartResult(0).message()).find("needs 2 GPUs, 1"),
            std::string::npos);
}

TEST(GpuSkip, EnoughGpusRunTheTestEitherWay) {
  for (const std::optional<std::string>& value :
       {std::optional<std::string>(), std::optional<std::string>("1")}) {
    RequireGpuVariable variable(value);
    Outcome outcome;
    run_guarded(2, 1, &outcome);
    EXPECT_TRUE(outcome.reached_end);
    EXPECT_EQ(outcome.results.size(), 0);
  }
}

TEST(GpuSkip, EmptyOrZeroDoesNotRequireAGpu) {
  for (const char* value : {"", "0"}) {
    RequireGpuVariable variable{std::string(value)};
    EXPECT_FALSE(gpu_required()) << "'" << value << "'";
    Outcome outcome;
    run_guarded(0, 1, &outcome);
    ASSERT_EQ(outcome.results.size(), 1);
    EXPECT_TRUE(outcome.results.GetTestPartResult(0).skipped()) << "'" << value << "'";
  }
  RequireGpuVariable set("1");
  EXPECT_TRUE(gpu_required());
}

}  // namespace
}  // namespace tessel::testing
