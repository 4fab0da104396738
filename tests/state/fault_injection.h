// Crash and disk-failure injection for the checkpoint tests. Linking this library into a test
// binary puts its definitions of the libc calls a save makes (write, writev, fsync, rename,
// remove, unlink, unlinkat, rmdir) in front of libc's, so every such call - the checkpoint
// code's own and libstdc++'s inside std::ofstream and std::filesystem - passes through here.
// While armed for a folder, each call on a path inside it is one numbered fault point; at point
// `at` the process kills itself with SIGKILL (a crash at that instant) or the call fails with
// `error` (ENOSPC, EIO: a full or failing disk). Unarmed, every call goes straight to libc.
//   fault::arm({dir, fault::Action::kKill, /*at=*/7});  ... save ...  fault::disarm();
#pragma once

#include <cstdint>
#include <string>

namespace tessel::testing::fault {

enum class Action {
  kCount,  // only count the points
  kKill,   // SIGKILL at point `at`
  kFail,   // fail point `at` with `error`; only data calls (write, writev, fsync) are points
};

struct Plan {
  std::string folder;  // absolute; calls on paths below it are points
  Action action = Action::kCount;
  int64_t at = 0;  // 1-based
  int error = 0;   // for kFail
};

void arm(const Plan& plan);
void disarm();
// Points seen since the last arm().
int64_t points_seen();

}  // namespace tessel::testing::fault
