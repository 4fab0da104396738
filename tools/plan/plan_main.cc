// bazel run //parallel:plan -- --model=bert_base --devices=8 --memory_per_device=16GiB
#include <iostream>

#include "core/run_main.h"
#include "tools/plan/plan_cli.h"

int main(int argc, char** argv) {
  return tessel::run_main(argc, argv, [](int count, char** arguments) {
    return tessel::planner::run_plan_cli(count, arguments, std::cout, std::cerr);
  });
}
