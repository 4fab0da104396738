// A tiny tool for run_main_exit_test.sh: prints progress to stdout, then, as its first argument
// says, returns normally ("exit=N"), throws a tessel::Error ("error") or an OutOfMemory ("oom").
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include "core/error.h"
#include "core/run_main.h"

int main(int argc, char** argv) {
  return tessel::run_main(argc, argv, [](int count, char** arguments) {
    const std::string mode = count > 1 ? arguments[1] : "";
    std::cout << "step 1 done\n";
    std::printf("step 2 done\n");
    if (mode.rfind("exit=", 0) == 0) return std::atoi(mode.c_str() + 5);
    if (mode == "oom") throw TESSEL_ERROR_TYPE(tessel::OutOfMemory, "no room for step 3");
    TESSEL_FAIL("step 3 failed: ", mode);
  });
}
