// A host-side wait against a deadline, as the NCCL communicator does it (its initialisation, its
// collectives, its closing): poll a state until it settles; on a failure, or once the deadline
// has passed, abort and raise a tessel::Error. Kept apart from NCCL so a fake can drive it.
//   wait_until_done({poll, failure, abort}, Clock::now() + 300s, 300, "all_reduce #4 on 'dp'");
#pragma once

#include <chrono>
#include <functional>
#include <string>

namespace tessel::parallel {

enum class PollState { kPending, kDone, kFailed };

struct DeadlineWait {
  std::function<PollState()> poll;       // the state now; may throw (the wait ends with it)
  std::function<std::string()> failure;  // why, after poll answered kFailed
  std::function<void()> abort;           // before the error is raised (failure or time out)
};

// Polls `wait` (every 50 us) until kDone. After kFailed: abort, then an error "<what> failed:
// <failure>". Past `deadline` (set `timeout_s` from the start): abort, then an error "<what> did
// not finish within <timeout_s> s: <late_reason>; ...aborted".
void wait_until_done(const DeadlineWait& wait, std::chrono::steady_clock::time_point deadline,
                     double timeout_s, const std::string& what, const std::string& late_reason);

}  // namespace tessel::parallel
