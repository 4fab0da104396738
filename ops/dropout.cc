// Dropout: element i is kept iff uniform_at(state, i) >= p and scaled by 1 / (1 - p), with the
// state (rng_seed, rng_offset) the dispatcher records in the attributes, so a replay with the
// recorded attributes reproduces the mask bitwise on any device. This file holds the op's
// definition (shape rule, backward, cost, flags); the CPU kernel is in ops/cpu/dropout.cc.
#include "ops/dropout.h"

#include <vector>

#include "ops/cpu/kernels.h"
#include "ops/ops.h"
#include "ops/registry_helpers.h"

namespace tessel {

namespace {

using cpu::keep_scale;

void check_probability(double p) {
  TESSEL_CHECK(p >= 0.0 && p <= 1.0, "dropout: probability p must be in [0, 1], got ", p);
}

}  // namespace

TESSEL_REGISTER_OPS(dropout) {
  OpDef& op = OpRegistry::get().define(ops::dropout);
  op.kind = OpKind::kPointwise;
  op.autocast = AutocastPolicy::kWiden;
  op.planner.split = ParallelSplit::kPointwise;
  op.planner.rate = "dropout";  // its random numbers cost more than a pointwise op's bytes
  op.shape = [](const std::vector<Tensor>& in, const Attrs& attrs) {
    const Tensor& x = in.at(0);
    TESSEL_CHECK(x.dtype() == DType::kFloat32 || x.dtype() == DType::kFloat64,
                 "dropout: expected a f32 or f64 input, got ", dtype_name(x.dtype()), " (shape ",
                 shape_str(x.sizes()), ")");
    check_probability(attrs.get<double>("p"));
    return std::vector<OutputSpec>{{x.sizes(), x.dtype()}, {x.sizes(), DType::kBool}};
  };
  op.kernels[static_cast<int>(DeviceType::kCpu)] = cpu::dropout_kernel;
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
  return first_output(dispatch(ops::dropout, {x}, Attrs{{"p", p}}));
}

}  // namespace tessel
