// The `plan` command: prints a model's (memory, time) frontier on D devices, marks the fastest
// plan that fits in memory, writes it as a plan file and draws the frontier.
//   bazel run //parallel:plan -- --model=bert_base --devices=8
//       --memory_per_device=16GiB --profile=h200_cluster --out=plan.json --png=frontier.png
#pragma once

#include <ostream>
#include <string>

namespace tessel::planner {

// Returns the exit code: 0 when a plan fits, 1 on errors (printed to `err` as "plan: error: ..."),
// 2 when no plan fits in the memory per device.
int run_plan_cli(int argc, const char* const* argv, std::ostream& out, std::ostream& err);

// A path as the user meant it: relative paths are taken from the directory `bazel run` was
// started in (BUILD_WORKING_DIRECTORY) when set.
std::string user_path(const std::string& path);

// A profile argument: a file path, or a name in parallel/profiles ("h200_cluster").
std::string find_profile(const std::string& name_or_path);

}  // namespace tessel::planner
