// GEMM f32 throughput: the raw strided GEMM (ops/cpu/gemm.h) into a preallocated C, and the
// matmul op through the dispatcher (allocation included). Square n x n x n.
//   bazel run //bench:gemm_bench -- --threads=2 --benchmark_format=json
#include <vector>

#include "bench/bench_main.h"
#include "core/tensor.h"
#include "ops/cpu/gemm.h"
#include "ops/ops.h"

namespace {

void set_gflops(benchmark::State& state, int64_t n) {
  state.counters["flops"] = benchmark::Counter(2.0 * static_cast<double>(n) * n * n,
                                               benchmark::Counter::kIsIterationInvariantRate);
}

void BM_GemmF32(benchmark::State& state) {
  const int64_t n = state.range(0);
  std::vector<float> a(n * n), b(n * n), c(n * n);
  for (int64_t i = 0; i < n * n; ++i) {
    a[i] = static_cast<float>((i * 37) % 17 - 8) / 8.0f;
    b[i] = static_cast<float>((i * 29) % 13 - 6) / 6.0f;
  }
  for (auto _ : state) {
    tessel::cpu::gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  set_gflops(state, n);
}

void BM_MatmulF32(benchmark::State& state) {
  const int64_t n = state.range(0);
  tessel::Tensor a = tessel::randn({n, n});
  tessel::Tensor b = tessel::randn({n, n});
  for (auto _ : state) {
    tessel::Tensor c = tessel::matmul(a, b);
    benchmark::DoNotOptimize(c);
  }
  set_gflops(state, n);
}

}  // namespace

BENCHMARK(BM_GemmF32)
    ->Arg(256)
    ->Arg(512)
    ->Arg(1024)
    ->Arg(2048)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MatmulF32)
    ->Arg(256)
    ->Arg(512)
    ->Arg(1024)
    ->Arg(2048)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

TESSEL_BENCHMARK_MAIN()
