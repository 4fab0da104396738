// Dropout: element i is kept iff uniform_at(state, i) >= p and scaled by 1 / (1 - p), with the
// state (rng_seed, rng_offset) the dispatcher records in the attributes, so a replay with the
// recorded attributes reproduces the mask bitwise on any device.
#include "ops/dropout.h"

#include <array>
#include <cmath>

#include "core/rng.h"
#include "ops/cpu/strided_copy.h"
#include "ops/math/dropout.h"
#include "ops/ops.h"
#include "ops/registry_helpers.h"

namespace tessel {

namespace {

double keep_scale(double p) { return p < 1.0 ? 1.0 / (1.0 - p) : 0.0; }

void check_probability(double p) {
  TESSEL_CHECK(p >= 0.0 && p <= 1.0, "dropout: probability p must be in [0, 1], got ", p);
}

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

}  // namespace

TESSEL_REGISTER_OPS(dropout) {
  OpDef& op = OpRegistry::get().define(ops::dropout);
  op.kind = OpKind::kPointwise;
  op.autocast = AutocastPolicy::kWiden;
  op.planner.split = ParallelSplit::kPointwise;
  op.shape = [](const std::vector<Tensor>& in, const Attrs& attrs) {
    const Tensor& x = in.at(0);
    TESSEL_CHECK(x.dtype() == DType::kFloat32 || x.dtype() == DType::kFloat64,
                 "dropout: expected a f32 or f64 input, got ", dtype_name(x.dtype()), " (shape ",
                 shape_str(x.sizes()), ")");
    check_probability(attrs.get<double>("p"));
    return std::vector<OutputSpec>{{x.sizes(), x.dtype()}, {x.sizes(), DType::kBool}};
  };
  op.kernels[static_cast<int>(DeviceType::kCpu)] = dropout_kernel;
  op.save_outputs = {1};
  op.backward = [](const BackwardContext& context) -> std::vector<Tensor> {
    const Tensor& grad = context.grad_outputs[0];
    if (!grad.defined() || !context.needs_input_grad[0]) return {Tensor()};
    const Tensor& mask = context.saved_outputs[1];
    return {
        mul(mul(grad, to_dtype(mask, grad.dtype())), keep_scale(context.attrs.get<double>("p")))};
  };
  op.cost = [](const std::vector<Tensor>& in, const std::vector<Tensor>&, const Attrs&) {
    const double numel = static_cast<double>(in[0].numel());
    return OpCost{numel, numel * (2 * static_cast<double>(in[0].element_size()) + 1)};
  };
  op.flags.pure = false;
  op.flags.random = true;
  op.rng_counters = [](const std::vector<Tensor>& in, const Attrs&) {
    return static_cast<uint64_t>((in.at(0).numel() + 3) / 4);
  };
}

Tensor dropout(const Tensor& x, double p, bool training) {
  check_probability(p);
  if (!training || p == 0.0) return x;
  return dispatch(ops::dropout, {x}, Attrs{{"p", p}})[0];
}

}  // namespace tessel
