// A main() for Tessel's Google Benchmark binaries: takes --threads=N (Tessel's intra-op threads,
// default: all cores) out of argv, then hands the rest to Google Benchmark.
//   TESSEL_BENCHMARK_MAIN()   // at the end of a *_bench.cc, instead of BENCHMARK_MAIN()
#pragma once

#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>

#include "core/run_main.h"
#include "core/threading.h"
#include "ops/cpu/gemm.h"

namespace tessel::bench {

inline int run_benchmarks(int argc, char** argv) {
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--threads=", 10) == 0) {
      tessel::set_num_threads(std::atoi(argv[i] + 10));
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  benchmark::AddCustomContext("tessel_threads", std::to_string(tessel::get_num_threads()));
  benchmark::AddCustomContext("tessel_gemm_isa", tessel::cpu::gemm_isa());
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

}  // namespace tessel::bench

#define TESSEL_BENCHMARK_MAIN()                                         \
  int main(int argc, char** argv) {                                     \
    return tessel::run_main(argc, argv, tessel::bench::run_benchmarks); \
  }
