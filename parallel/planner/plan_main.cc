// bazel run //parallel/planner:plan -- --model=bert_base --devices=8 --memory_per_device=16GiB
#include <iostream>

#include "parallel/planner/plan_cli.h"

int main(int argc, char** argv) {
  return tessel::planner::run_plan_cli(argc, argv, std::cout, std::cerr);
}
