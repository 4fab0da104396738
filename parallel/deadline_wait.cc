#include "parallel/deadline_wait.h"

#include <thread>

#include "core/error.h"

namespace tessel::parallel {

void wait_until_done(const DeadlineWait& wait, std::chrono::steady_clock::time_point deadline,
                     double timeout_s, const std::string& what, const std::string& late_reason) {
  while (true) {
    const PollState state = wait.poll();
    if (state == PollState::kDone) return;
    if (state == PollState::kFailed) {
      const std::string why = wait.failure();
      wait.abort();
      TESSEL_FAIL(what, " failed: ", why, "; the communicator is aborted");
    }
    // Checked after the poll: work that settled just in time is not reported late.
    if (std::chrono::steady_clock::now() > deadline) {
      wait.abort();
      TESSEL_FAIL(what, " did not finish within ", timeout_s, " s (its deadline): ", late_reason,
                  "; the communicator is aborted");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

}  // namespace tessel::parallel
