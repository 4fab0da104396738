// The CPU kernel of dropout: one Philox counter's four elements at a time (ops/math/dropout.h,
// as the CUDA kernel does), so the mask depends only on the recorded state, not on threads.
#include "ops/math/dropout.h"

#include <array>
#include <cmath>

#include "core/rng.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/strided_copy.h"
#include "ops/ops.h"
#include "ops/registry_helpers.h"

namespace tessel::cpu {

double keep_scale(double p) { return p < 1.0 ? 1.0 / (1.0 - p) : 0.0; }

// inputs (x); outputs (y, mask): y = x * mask / (1 - p), mask bool (true: kept).
void dropout_kernel(KernelContext& context) {
  const double p = context.attrs.get<double>("p");
  const RngState state{static_cast<uint64_t>(context.attrs.get<int64_t>("rng_seed")),
                       static_cast<uint64_t>(context.attrs.get<int64_t>("rng_offset"))};
  visit_float_dtype(context.inputs[0].dtype(), "dropout", [&](auto tag) {
    using T = decltype(tag);
    const Tensor x = cpu::dense_input(context, context.inputs[0]);
    const Tensor& y_out = context.outputs[0];
    const Tensor& mask_out = context.outputs[1];
    const Tensor y =
        y_out.is_contiguous() ? y_out : context.workspace(y_out.sizes(), y_out.dtype());
    const Tensor mask =
        mask_out.is_contiguous() ? mask_out : context.workspace(mask_out.sizes(), DType::kBool);
    const T* x_data = x.data_ptr<T>();
    T* y_data = y.data_ptr<T>();
    bool* mask_data = mask.data_ptr<bool>();
    const int64_t numel = x.numel();
    const T scale = static_cast<T>(keep_scale(p));
    // One Philox call gives the four numbers of a counter (uniform_at's numbers).
    const int64_t counters = (numel + 3) / 4;
    parallel_for(0, counters, 1024, [&](int64_t begin, int64_t end) {
      for (int64_t counter = begin; counter < end; ++counter)
        dropout_counter(x_data, y_data, mask_data, numel, state.seed, state.offset, counter, p,
                        scale);
    });
    if (!y.is_same(y_out)) cpu::copy_strided(y, y_out);
    if (!mask.is_same(mask_out)) cpu::copy_strided(mask, mask_out);
  });
}

}  // namespace tessel::cpu
