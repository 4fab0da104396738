// Dropout (p 0.1, training) of f32 activations the size of BERT's: a layer's output [8, 128, 256]
// and its attention probabilities [8, 4, 128, 128], through the dispatcher (mask included).
// bench/torch_compare.py times each against torch.nn.functional.dropout, interleaved.
//   bazel run //bench:dropout_bench -- --threads=2
#include "bench/bench_main.h"
#include "core/tensor.h"
#include "ops/ops.h"

namespace {

void BM_DropoutF32(benchmark::State& state) {
  tessel::Tensor x = tessel::randn({state.range(0)});
  for (auto _ : state) {
    tessel::Tensor y = tessel::dropout(x, 0.1, true);
    benchmark::DoNotOptimize(y);
  }
  // One "operation" per element: the table's GFLOP/s columns read as G elements/s.
  state.counters["flops"] = benchmark::Counter(static_cast<double>(state.range(0)),
                                               benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace

BENCHMARK(BM_DropoutF32)
    ->Arg(8 * 128 * 256)
    ->Arg(8 * 4 * 128 * 128)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

TESSEL_BENCHMARK_MAIN()
