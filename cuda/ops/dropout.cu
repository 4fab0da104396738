// The CUDA kernel of dropout (ops/dropout.cc): the CPU's Philox stream and per-counter rule
// (ops/math/dropout.h), one thread per counter.
#include "core/rng.h"
#include "cuda/ops/loops.cuh"
#include "ops/dropout.h"
#include "ops/math/dropout.h"
#include "ops/registry_helpers.h"

namespace tessel::cuda {

namespace {

constexpr DeviceType kCuda = DeviceType::kCuda;

// One thread per Philox counter: four elements, kept iff uniform >= p, scaled by 1 / (1 - p).
template <typename T>
__global__ void dropout_kernel(const T* x, T* y, bool* mask, int64_t numel, uint64_t seed,
                               uint64_t offset, double p, T scale) {
  const int64_t counters = (numel + 3) / 4;
  for (int64_t counter = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       counter < counters; counter += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dropout_counter(x, y, mask, numel, seed, offset, counter, p, scale);
}

}  // namespace

TESSEL_REGISTER_OPS(cuda_dropout) {
  ops::dropout.set_kernel(kCuda, [](KernelContext& context) {
    const double p = context.attrs.get<double>("p");
    const RngState state = rng_attrs(context.attrs);
    visit_float_dtype(context.inputs[0].dtype(), ops::dropout.name(), [&](auto tag) {
      using T = decltype(tag);
      const Tensor x = dense_input(context, context.inputs[0]);
      DenseOutput y(context, context.outputs[0]);
      DenseOutput mask(context, context.outputs[1]);
      const int64_t numel = x.numel();
      if (numel > 0) {
        KernelDevice device(context);
        const T scale = static_cast<T>(p < 1.0 ? 1.0 / (1.0 - p) : 0.0);
        dropout_kernel<T><<<grid_for((numel + 3) / 4), kThreads, 0, device.stream()>>>(
            device_data<const T>(x), y.data<T>(), mask.data<bool>(), numel, state.seed,
            state.offset, p, scale);
        check_launch();
      }
      y.finish();
      mask.finish();
    });
  });
}

}  // namespace tessel::cuda
