// run_main: the frame of a command-line tool's main(). An exception escaping the tool becomes one
// clean line on stderr, "<program>: error: <message>", after stdout is flushed, and exit code 1.
//   int main(int argc, char** argv) { return tessel::run_main(argc, argv, run_tool); }
#pragma once

#include <functional>

namespace tessel {

// Runs body(argc, argv) and returns its exit code. A tessel::Error prints its message without
// the source location, an OutOfMemory prints "<program>: out of memory: <report>", any other
// exception its what(); each then returns 1. <program> is argv[0]'s file name.
int run_main(int argc, char** argv, const std::function<int(int, char**)>& body);

}  // namespace tessel
