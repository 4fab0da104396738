// wait_until_done with fake polls: what the NCCL communicator's initialisation and collectives
// do when NCCL settles, fails, or never finishes.
#include "parallel/deadline_wait.h"

#include <chrono>
#include <stdexcept>
#include <string>

#include "gtest/gtest.h"
#include "tests/testing.h"

namespace tessel::parallel {
namespace {

using Clock = std::chrono::steady_clock;
using testing::throws_error;

// A fake NCCL: pending for `pending_polls` polls, then `final_state`; counts polls and aborts.
struct FakeWork {
  int pending_polls = 0;
  PollState final_state = PollState::kDone;
  int polls = 0, aborts = 0;

  DeadlineWait wait() {
    DeadlineWait wait;
    wait.poll = [this] { return ++polls <= pending_polls ? PollState::kPending : final_state; };
    wait.failure = [] { return std::string("unhandled system error (NCCL error 2)"); };
    wait.abort = [this] { ++aborts; };
    return wait;
  }
};

TEST(DeadlineWait, ReturnsOnceThePollSettlesWithoutAborting) {
  FakeWork work;
  work.pending_polls = 3;
  wait_until_done(work.wait(), Clock::now() + std::chrono::seconds(60), 60, "joining", "late");
  EXPECT_EQ(work.polls, 4);
  EXPECT_EQ(work.aborts, 0);
}

TEST(DeadlineWait, AFailureAbortsAndNamesTheOperationAndTheCause) {
  FakeWork work;
  work.pending_polls = 1;
  work.final_state = PollState::kFailed;
  EXPECT_TRUE(throws_error(
      [&] {
        wait_until_done(work.wait(), Clock::now() + std::chrono::seconds(60), 60,
                        "all_reduce #2 on NCCL communicator 'dp'", "late");
      },
      "all_reduce #2 on NCCL communicator 'dp' failed: unhandled system error (NCCL error 2); "
      "the communicator is aborted"));
  EXPECT_EQ(work.polls, 2);
  EXPECT_EQ(work.aborts, 1);
}

TEST(DeadlineWait, PastTheDeadlineItAbortsAndNamesTheDeadline) {
  FakeWork work;
  work.pending_polls = 1 << 30;  // never joins
  EXPECT_TRUE(throws_error(
      [&] {
        wait_until_done(work.wait(), Clock::now() + std::chrono::milliseconds(200), 0.2,
                        "joining on cuda:1 on NCCL communicator 'world' (rank 1 of 2)",
                        "a rank never joined");
      },
      "joining on cuda:1 on NCCL communicator 'world' (rank 1 of 2) did not finish within 0.2 s "
      "(its deadline): a rank never joined; the communicator is aborted"));
  EXPECT_EQ(work.aborts, 1);
  EXPECT_GT(work.polls, 1);
}

TEST(DeadlineWait, WorkDoneByTheLastPollIsNotLateEvenPastTheDeadline) {
  FakeWork work;
  work.pending_polls = 0;
  wait_until_done(work.wait(), Clock::now() - std::chrono::seconds(1), 1, "closing", "late");
  EXPECT_EQ(work.polls, 1);
  EXPECT_EQ(work.aborts, 0);
}

TEST(DeadlineWait, AnErrorThrownByThePollEndsTheWaitAsItIs) {
  DeadlineWait wait;
  int aborts = 0;
  wait.poll = []() -> PollState { throw std::runtime_error("cudaEventQuery failed"); };
  wait.failure = [] { return std::string(); };
  wait.abort = [&] { ++aborts; };
  EXPECT_THROW(wait_until_done(wait, Clock::now() + std::chrono::seconds(1), 1, "x", "late"),
               std::runtime_error);
  EXPECT_EQ(aborts, 0);
}

}  // namespace
}  // namespace tessel::parallel
