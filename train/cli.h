// The `train` command line: parses flags (CLI11) into a TrainConfig and runs the recipe.
// Returns the process exit code; --help prints every flag and the known recipes.
//   return tessel::train::run_cli(argc, argv, std::cout, std::cerr);
#pragma once

#include <ostream>

#include "train/recipes/recipe.h"

namespace tessel::train {

// Parses argv; on success fills `config` and returns -1. Otherwise (--help, an unknown flag, a
// bad value) prints to `out`/`err` and returns the exit code to finish with.
int parse_train_flags(int argc, const char* const* argv, TrainConfig* config, std::ostream& out,
                      std::ostream& err);
// Parses and runs; status lines go to `out`, errors to `err`. 0 on success.
int run_cli(int argc, const char* const* argv, std::ostream& out, std::ostream& err);

}  // namespace tessel::train
