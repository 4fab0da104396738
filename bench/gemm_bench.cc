// GEMM f32 throughput: the raw strided GEMM (ops/cpu/gemm.h) into a preallocated C (plain, B
// transposed as linear reads it, batched as bmm runs it), and the matmul, linear and bmm ops
// through the dispatcher (allocation included). Square n x n x n. bench/op_overhead.py times
// each op against its kernel, interleaved.
//   bazel run //bench:gemm_bench -- --threads=2 --benchmark_format=json
#include <cstdlib>
#include <new>
#include <vector>

#include "bench/bench_main.h"
#include "core/tensor.h"
#include "ops/cpu/gemm.h"
#include "ops/ops.h"

namespace {

// The kernel's operands start on a cache line, as a tensor's do (and PyTorch's): a plain
// std::vector's buffer is only 16-byte aligned (a large one starts 16 bytes past a page), which
// splits vector loads and stores of C across two lines.
template <typename T>
struct CacheLineAllocator {
  using value_type = T;
  CacheLineAllocator() = default;
  template <typename U>
  explicit CacheLineAllocator(const CacheLineAllocator<U>&) {}
  T* allocate(size_t count) {
    void* data = std::aligned_alloc(64, (count * sizeof(T) + 63) / 64 * 64);
    if (data == nullptr) throw std::bad_alloc();
    return static_cast<T*>(data);
  }
  void deallocate(T* data, size_t) { std::free(data); }
  bool operator==(const CacheLineAllocator&) const { return true; }
  bool operator!=(const CacheLineAllocator&) const { return false; }
};
using Matrix = std::vector<float, CacheLineAllocator<float>>;

void set_gflops(benchmark::State& state, int64_t n) {
  state.counters["flops"] = benchmark::Counter(2.0 * static_cast<double>(n) * n * n,
                                               benchmark::Counter::kIsIterationInvariantRate);
}

void BM_GemmF32(benchmark::State& state) {
  const int64_t n = state.range(0);
  Matrix a(n * n), b(n * n), c(n * n);
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

// A GEMM with B read transposed, into C (beta = 0) or added to what C holds (beta = 1).
void BM_GemmF32TransposedB(benchmark::State& state) {
  const int64_t n = state.range(0);
  const bool accumulate = state.range(1) != 0;
  Matrix a(n * n), b(n * n), c(n * n);
  for (int64_t i = 0; i < n * n; ++i) {
    a[i] = static_cast<float>((i * 37) % 17 - 8) / 8.0f;
    b[i] = static_cast<float>((i * 29) % 13 - 6) / 6.0f;
  }
  for (auto _ : state) {
    tessel::cpu::gemm(false, true, n, n, n, 1.0f, a.data(), n, b.data(), n,
                      accumulate ? 1.0f : 0.0f, c.data(), n);
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  set_gflops(state, n);
}

// The linear op's kernel alone: B read transposed, every row of C starting from the bias row
// (gemm_onto_row), into a preallocated C.
void BM_GemmF32OntoRow(benchmark::State& state) {
  const int64_t n = state.range(0);
  Matrix a(n * n), b(n * n), c(n * n), row(n);
  for (int64_t i = 0; i < n * n; ++i) {
    a[i] = static_cast<float>((i * 37) % 17 - 8) / 8.0f;
    b[i] = static_cast<float>((i * 29) % 13 - 6) / 6.0f;
  }
  for (int64_t j = 0; j < n; ++j) row[j] = static_cast<float>(j % 7 - 3) / 3.0f;
  for (auto _ : state) {
    tessel::cpu::gemm_onto_row(false, true, n, n, n, 1.0f, a.data(), n, b.data(), n, row.data(),
                               c.data(), n);
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  set_gflops(state, n);
}

// The bmm op's kernel alone: eight n x n x n products in one batched GEMM into a preallocated C.
void BM_GemmF32Batched(benchmark::State& state) {
  const int64_t n = state.range(0);
  constexpr int64_t kBatch = 8;
  Matrix a(kBatch * n * n), b(kBatch * n * n), c(kBatch * n * n);
  for (int64_t i = 0; i < kBatch * n * n; ++i) {
    a[i] = static_cast<float>((i * 37) % 17 - 8) / 8.0f;
    b[i] = static_cast<float>((i * 29) % 13 - 6) / 6.0f;
  }
  for (auto _ : state) {
    tessel::cpu::gemm_batched(false, false, n, n, n, 1.0f, a.data(), n, n * n, b.data(), n, n * n,
                              0.0f, c.data(), n, n * n, kBatch);
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  state.counters["flops"] = benchmark::Counter(2.0 * kBatch * static_cast<double>(n) * n * n,
                                               benchmark::Counter::kIsIterationInvariantRate);
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

// x (n, n) W^T + b: the linear op (a transposed operand read in place, the bias added).
void BM_LinearF32(benchmark::State& state) {
  const int64_t n = state.range(0);
  tessel::Tensor x = tessel::randn({n, n});
  tessel::Tensor weight = tessel::randn({n, n});
  tessel::Tensor bias = tessel::randn({n});
  for (auto _ : state) {
    tessel::Tensor y = tessel::linear(x, weight, bias);
    benchmark::DoNotOptimize(y);
  }
  set_gflops(state, n);
}

// Eight n x n x n products in one batched op.
void BM_BmmF32(benchmark::State& state) {
  const int64_t n = state.range(0);
  constexpr int64_t kBatch = 8;
  tessel::Tensor a = tessel::randn({kBatch, n, n});
  tessel::Tensor b = tessel::randn({kBatch, n, n});
  for (auto _ : state) {
    tessel::Tensor c = tessel::bmm(a, b);
    benchmark::DoNotOptimize(c);
  }
  state.counters["flops"] = benchmark::Counter(2.0 * kBatch * static_cast<double>(n) * n * n,
                                               benchmark::Counter::kIsIterationInvariantRate);
}

// Square sizes from 64 up to `largest`, timed in milliseconds of wall time.
void sizes_up_to(benchmark::internal::Benchmark* registered, int64_t largest) {
  for (int64_t n = 64; n <= largest; n *= 2) registered->Arg(n);
  registered->UseRealTime()->Unit(benchmark::kMillisecond);
}
void up_to_2048(benchmark::internal::Benchmark* registered) { sizes_up_to(registered, 2048); }
void up_to_512(benchmark::internal::Benchmark* registered) { sizes_up_to(registered, 512); }

}  // namespace

BENCHMARK(BM_GemmF32)->Apply(up_to_2048);
BENCHMARK(BM_GemmF32TransposedB)
    ->ArgsProduct({{64, 128, 256, 512, 1024, 2048}, {0, 1}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GemmF32OntoRow)->Apply(up_to_2048);
BENCHMARK(BM_MatmulF32)->Apply(up_to_2048);
BENCHMARK(BM_LinearF32)->Apply(up_to_2048);
BENCHMARK(BM_BmmF32)->Apply(up_to_512);
BENCHMARK(BM_GemmF32Batched)->Apply(up_to_512);

TESSEL_BENCHMARK_MAIN()
