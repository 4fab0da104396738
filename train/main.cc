// The `train` binary: ./tessel train [--recipe=NAME] [flags]; --help lists the flags.
#include <unistd.h>

#include <cstdlib>
#include <iostream>

#include "train/cli.h"

int main(int argc, char** argv) {
  // `bazel run` starts programs inside the runfiles tree; relative paths (--metrics,
  // --checkpoint_dir) should mean the folder the user ran the command from.
  if (const char* directory = std::getenv("BUILD_WORKING_DIRECTORY")) {
    if (::chdir(directory) != 0) std::cerr << "train: cannot enter " << directory << std::endl;
  }
  return tessel::train::run_cli(argc, argv, std::cout, std::cerr);
}
