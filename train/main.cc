// The `train` binary: ./tessel train [--recipe=NAME] [flags]; --help lists the flags.
#include <iostream>

#include "train/cli.h"

int main(int argc, char** argv) { return tessel::train::run_cli(argc, argv, std::cout, std::cerr); }
