// The `train` binary: ./tessel train [--recipe=NAME] [flags]; --help lists the flags.
#include <unistd.h>

#include <cstdlib>
#include <iostream>

#include "core/run_main.h"
#include "parallel/launch.h"
#include "train/cli.h"

int main(int argc, char** argv) {
  // `bazel run` starts programs inside the runfiles tree; relative paths (--metrics,
  // --checkpoint_dir) should mean the folder the user ran the command from.
  if (const char* directory = std::getenv("BUILD_WORKING_DIRECTORY")) {
    if (::chdir(directory) != 0) std::cerr << "train: cannot enter " << directory << std::endl;
  }
  // Started by mpirun: one rank of a dp x tp grid (--dp, --tp, --plan). MPI starts only then, so a
  // plain run needs no MPI runtime; a failing rank ends the whole job instead of leaving the
  // others waiting in a collective.
  if (std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMIX_RANK") || std::getenv("PMI_RANK")) {
    return tessel::parallel::run_ranks(argc, argv, [](int count, char** arguments) {
      const int code = tessel::train::run_cli(count, arguments, std::cout, std::cerr);
      if (code != 0 && tessel::parallel::world_size() > 1)
        tessel::parallel::abort_job("train failed (its error is printed above)");
      return code;
    });
  }
  // run_cli reports a failing recipe itself; run_main catches what escapes before or after it.
  return tessel::run_main(argc, argv, [](int count, char** arguments) {
    return tessel::train::run_cli(count, arguments, std::cout, std::cerr);
  });
}
