// 3x3 convolutions (stride 1, padding 1, no bias) on ResNet's stage shapes, forward and
// backward (gradient of the input and of the weight, the two ops autograd runs). Arguments are
// batch / channels / height (= width).
//   bazel run //bench:conv_bench -- --threads=2 --benchmark_format=json
#include "bench/bench_main.h"
#include "core/op.h"
#include "core/tensor.h"
#include "ops/conv.h"
#include "ops/ops.h"

namespace {

tessel::Attrs conv_attrs() {
  return {{"stride", std::vector<int64_t>{1, 1}},
          {"padding", std::vector<int64_t>{1, 1}},
          {"dilation", std::vector<int64_t>{1, 1}},
          {"groups", int64_t{1}}};
}

double conv_flops(int64_t batch, int64_t channels, int64_t size) {
  return 2.0 * batch * channels * size * size * channels * 9;
}

void BM_Conv2dForward(benchmark::State& state) {
  const int64_t batch = state.range(0), channels = state.range(1), size = state.range(2);
  tessel::Tensor x = tessel::randn({batch, channels, size, size});
  tessel::Tensor w = tessel::randn({channels, channels, 3, 3});
  for (auto _ : state) {
    tessel::Tensor y = tessel::conv2d(x, w, tessel::Tensor(), {1, 1}, {1, 1});
    benchmark::DoNotOptimize(y);
  }
  state.counters["flops"] = benchmark::Counter(conv_flops(batch, channels, size),
                                               benchmark::Counter::kIsIterationInvariantRate);
}

void BM_Conv2dBackward(benchmark::State& state) {
  const int64_t batch = state.range(0), channels = state.range(1), size = state.range(2);
  tessel::Tensor x = tessel::randn({batch, channels, size, size});
  tessel::Tensor w = tessel::randn({channels, channels, 3, 3});
  tessel::Tensor grad = tessel::randn({batch, channels, size, size});
  const tessel::OpDef& backward_input = tessel::ops::conv2d_backward_input;
  const tessel::OpDef& backward_weight = tessel::ops::conv2d_backward_weight;
  tessel::Attrs input_attrs = conv_attrs();
  input_attrs.set("input_size", x.sizes());
  tessel::Attrs weight_attrs = conv_attrs();
  weight_attrs.set("weight_size", w.sizes());
  for (auto _ : state) {
    tessel::Tensor grad_x = tessel::dispatch(backward_input, {grad, w}, input_attrs)[0];
    tessel::Tensor grad_w = tessel::dispatch(backward_weight, {grad, x}, weight_attrs)[0];
    benchmark::DoNotOptimize(grad_x);
    benchmark::DoNotOptimize(grad_w);
  }
  state.counters["flops"] = benchmark::Counter(2 * conv_flops(batch, channels, size),
                                               benchmark::Counter::kIsIterationInvariantRate);
}

// ResNet's stages at 224x224 (56x56 down to 7x7), then its small-image stages (32x32 images:
// 32x32 down to 4x4).
void resnet_shapes(benchmark::internal::Benchmark* bench) {
  for (auto [channels, size] : {std::pair<int64_t, int64_t>{64, 56},
                                {128, 28},
                                {256, 14},
                                {512, 7},
                                {64, 32},
                                {128, 16},
                                {256, 8},
                                {512, 4}})
    bench->Args({32, channels, size});
}

// One part of a 3x3 convolution (padding 1, no bias) of any shape: 0 forward, 1 the input's
// gradient, 2 the weight's. Arguments: batch / in channels / out channels / height (= width) /
// stride / part.
void BM_Conv2dPart(benchmark::State& state) {
  const int64_t batch = state.range(0), ins = state.range(1), outs = state.range(2);
  const int64_t size = state.range(3), stride = state.range(4), part = state.range(5);
  tessel::Tensor x = tessel::randn({batch, ins, size, size});
  tessel::Tensor w = tessel::randn({outs, ins, 3, 3});
  const int64_t out_size = (size - 1) / stride + 1;
  tessel::Tensor grad = tessel::randn({batch, outs, out_size, out_size});
  tessel::Attrs attrs = conv_attrs();
  attrs.set("stride", std::vector<int64_t>{stride, stride});
  attrs.set("input_size", x.sizes());
  attrs.set("weight_size", w.sizes());
  for (auto _ : state) {
    tessel::Tensor result =
        part == 0   ? tessel::dispatch(tessel::ops::conv2d, {x, w, tessel::Tensor()}, attrs)[0]
        : part == 1 ? tessel::dispatch(tessel::ops::conv2d_backward_input, {grad, w}, attrs)[0]
                    : tessel::dispatch(tessel::ops::conv2d_backward_weight, {grad, x}, attrs)[0];
    benchmark::DoNotOptimize(result);
  }
  state.counters["flops"] = benchmark::Counter(2.0 * batch * outs * out_size * out_size * ins * 9,
                                               benchmark::Counter::kIsIterationInvariantRate);
}

// The convolutions of a small CNN on 28x28 Fashion-MNIST (bench/compare_pytorch's
// user_cnn_fashion), batch 128: 1 -> 32, 32 -> 64 stride 2, 64 -> 64 at 14x14; then ResNet's
// stride-1 stages at 224x224, batch 32, and ResNet-18's on 32x32 images.
void conv_parts(benchmark::internal::Benchmark* bench) {
  for (int64_t part = 0; part < 3; ++part) {
    bench->Args({128, 1, 32, 28, 1, part});
    bench->Args({128, 32, 64, 28, 2, part});
    bench->Args({128, 64, 64, 14, 1, part});
    for (auto [channels, size] :
         {std::pair<int64_t, int64_t>{64, 56}, {128, 28}, {256, 14}, {512, 7}})
      bench->Args({32, channels, channels, size, 1, part});
    // ResNet-18 on 32x32 images (the small-image stem), batch 32: its 3x3 stages and the
    // stride-2 convolutions between them.
    for (auto [channels, size] :
         {std::pair<int64_t, int64_t>{64, 32}, {128, 16}, {256, 8}, {512, 4}}) {
      bench->Args({32, channels, channels, size, 1, part});
      if (channels < 512) bench->Args({32, channels, 2 * channels, size, 2, part});
    }
  }
}

}  // namespace

BENCHMARK(BM_Conv2dPart)->Apply(conv_parts)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Conv2dForward)->Apply(resnet_shapes)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Conv2dBackward)->Apply(resnet_shapes)->UseRealTime()->Unit(benchmark::kMillisecond);

TESSEL_BENCHMARK_MAIN()
