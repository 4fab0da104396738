// Losses: cross_entropy (log_softmax fused in; it keeps the log-probabilities for backward),
// nll_loss and mse_loss, with PyTorch's reductions, ignore_index and label smoothing. The class
// losses take logits (C), (N, C) or (N, C, d1, ...) and i64 targets (), (N) or (N, d1, ...).
// This file holds their definitions (shape rules, backward, cost); the CPU kernels are in
// ops/cpu/loss.cc.
#include "ops/loss.h"

#include <algorithm>
#include <string>
#include <vector>

#include "ops/cpu/kernels.h"
#include "ops/ops.h"
#include "ops/registry_helpers.h"

namespace tessel {

namespace {

using cpu::class_layout;
using cpu::parse_reduction;
using cpu::Reduction;
using cpu::reduction_of;

bool is_f32_or_f64(DType dtype) { return dtype == DType::kFloat32 || dtype == DType::kFloat64; }

// The target shape that goes with scores of `sizes`: the sizes without the class dimension.
Shape target_shape_for(const Shape& sizes) {
  Shape result = sizes;
  result.erase(result.begin() + (sizes.size() == 1 ? 0 : 1));
  return result;
}

// Checks scores (logits or log-probabilities) and class-index targets; returns the loss spec.
OutputSpec check_class_loss(const char* op, const char* scores_name, const Tensor& scores,
                            const Tensor& target, const Attrs& attrs) {
  TESSEL_CHECK(is_f32_or_f64(scores.dtype()), op, ": expected ", scores_name,
               " to be f32 or f64, got ", dtype_name(scores.dtype()));
  TESSEL_CHECK(scores.dim() >= 1, op, ": expected ", scores_name,
               " of shape (C), (N, C) or (N, C, d1, ...), got a 0-d tensor");
  TESSEL_CHECK(target.dtype() == DType::kInt64, op,
               ": expected target to hold class indices as i64, got dtype ",
               dtype_name(target.dtype()), " (convert with .to(DType::kInt64))");
  const Shape expected = target_shape_for(scores.sizes());
  TESSEL_CHECK(target.sizes() == expected, op, ": target has shape ", shape_str(target.sizes()),
               " but ", scores_name, " have shape ", shape_str(scores.sizes()),
               "; expected target shape ", shape_str(expected),
               " (one class index per batch entry and position)");
  TESSEL_CHECK(class_layout(scores.sizes()).classes > 0, op, ": ", scores_name,
               " have no classes (shape ", shape_str(scores.sizes()), ")");
  const Reduction reduction = reduction_of(op, attrs);
  return {reduction == Reduction::kNone ? expected : Shape{}, scores.dtype()};
}

// The gradient of a class loss's scores from its dedicated backward op (none for the target).
std::vector<Tensor> class_loss_input_grad(const BackwardContext& context,
                                          const OpHandle& backward_op,
                                          const std::vector<Tensor>& inputs, Attrs attrs) {
  if (!context.grad_outputs[0].defined() || !context.needs_input_grad[0])
    return {Tensor(), Tensor()};
  return {dispatch(backward_op, inputs, std::move(attrs))[0], Tensor()};
}

Attrs class_loss_attrs(int64_t ignore_index, const std::string& reduction) {
  return Attrs{{"ignore_index", ignore_index}, {"reduction", reduction}};
}

void register_cross_entropy() {
  OpDef& op = OpRegistry::get().define(ops::cross_entropy);
  op.kind = OpKind::kLoss;
  op.autocast = AutocastPolicy::kWiden;
  op.planner = {ParallelSplit::kSoftmaxLossClasses, "loss"};
  op.shape = [](const std::vector<Tensor>& in, const Attrs& attrs) {
    const OutputSpec loss = check_class_loss("cross_entropy", "logits", in.at(0), in.at(1), attrs);
    const double smoothing = attrs.get<double>("label_smoothing");
    TESSEL_CHECK(smoothing >= 0.0 && smoothing <= 1.0,
                 "cross_entropy: label_smoothing must be in [0, 1], got ", smoothing);
    return std::vector<OutputSpec>{loss, {in[0].sizes(), in[0].dtype()}};
  };
  op.kernels[static_cast<int>(DeviceType::kCpu)] = cpu::cross_entropy_kernel;
  op.save_inputs = {1};
  op.save_outputs = {1};
  op.backward = [](const BackwardContext& context) -> std::vector<Tensor> {
    const Tensor& log_probs = context.saved_outputs[1];
    std::vector<Tensor> grads = class_loss_input_grad(
        context, ops::cross_entropy_backward,
        {context.grad_outputs[0], log_probs, context.saved_inputs[1]}, context.attrs);
    // The log-probabilities output is differentiable too (rarely used):
    // d lp / d logits applied to g is g - softmax * sum_c g.
    const Tensor& grad_log_probs = context.grad_outputs[1];
    if (grad_log_probs.defined() && context.needs_input_grad[0]) {
      const int64_t class_dim = log_probs.dim() == 1 ? 0 : 1;
      Tensor through =
          sub(grad_log_probs, mul(exp(log_probs), sum(grad_log_probs, {class_dim}, true)));
      grads[0] = grads[0].defined() ? add(grads[0], through) : through;
    }
    return grads;
  };
  op.cost = [](const std::vector<Tensor>& in, const std::vector<Tensor>&, const Attrs&) {
    const double numel = static_cast<double>(in[0].numel());
    return OpCost{6 * numel, 2 * numel * static_cast<double>(in[0].element_size())};
  };
  // Rows of the batch in one pass: the reduced loss sums over the chunks.
  op.splits = {{0, {0, 0}}};
  op.chunk_passes = 1;
}

void register_cross_entropy_backward() {
  OpDef& op = OpRegistry::get().define(ops::cross_entropy_backward);
  op.kind = OpKind::kLoss;
  op.autocast = AutocastPolicy::kWiden;
  op.shape = [](const std::vector<Tensor>& in, const Attrs&) {
    return std::vector<OutputSpec>{{in.at(1).sizes(), in[1].dtype()}};
  };
  op.kernels[static_cast<int>(DeviceType::kCpu)] = cpu::cross_entropy_backward_kernel;
  op.cost = [](const std::vector<Tensor>& in, const std::vector<Tensor>&, const Attrs&) {
    const double numel = static_cast<double>(in[1].numel());
    return OpCost{4 * numel, 2 * numel * static_cast<double>(in[1].element_size())};
  };
  // Rows of the batch in two passes (the kept targets are counted first).
  op.splits = {{0, {-1, 0, 0}}};
  op.chunk_passes = 2;
}

void register_nll_loss() {
  OpDef& op = OpRegistry::get().define(ops::nll_loss);
  op.kind = OpKind::kLoss;
  op.autocast = AutocastPolicy::kWiden;
  op.planner = {ParallelSplit::kLossClasses, "loss"};
  op.shape = [](const std::vector<Tensor>& in, const Attrs& attrs) {
    return std::vector<OutputSpec>{
        check_class_loss("nll_loss", "log_probs", in.at(0), in.at(1), attrs)};
  };
  op.kernels[static_cast<int>(DeviceType::kCpu)] = cpu::nll_loss_kernel;
  op.save_inputs = {1};
  op.backward = [](const BackwardContext& context) -> std::vector<Tensor> {
    Attrs attrs = context.attrs;
    attrs.set("input_shape", context.input_specs[0].sizes);
    return class_loss_input_grad(context, ops::nll_loss_backward,
                                 {context.grad_outputs[0], context.saved_inputs[1]}, attrs);
  };
  op.cost = [](const std::vector<Tensor>& in, const std::vector<Tensor>&, const Attrs&) {
    const double positions = static_cast<double>(in[1].numel());
    return OpCost{positions, positions * 16};
  };
  // Rows of the batch in one pass: the reduced loss sums over the chunks.
  op.splits = {{0, {0, 0}}};
  op.chunk_passes = 1;
}

void register_nll_loss_backward() {
  OpDef& op = OpRegistry::get().define(ops::nll_loss_backward);
  op.kind = OpKind::kLoss;
  op.autocast = AutocastPolicy::kWiden;
  op.shape = [](const std::vector<Tensor>& in, const Attrs& attrs) {
    return std::vector<OutputSpec>{
        {attrs.get<std::vector<int64_t>>("input_shape"), in.at(0).dtype()}};
  };
  op.kernels[static_cast<int>(DeviceType::kCpu)] = cpu::nll_loss_backward_kernel;
  op.cost = [](const std::vector<Tensor>& in, const std::vector<Tensor>& out, const Attrs&) {
    return OpCost{static_cast<double>(in[1].numel()),
                  static_cast<double>(out[0].numel() * out[0].element_size())};
  };
}

void register_mse_loss() {
  OpDef& op = OpRegistry::get().define(ops::mse_loss);
  op.kind = OpKind::kLoss;
  op.autocast = AutocastPolicy::kWiden;
  op.shape = [](const std::vector<Tensor>& in, const Attrs& attrs) {
    const Tensor &input = in.at(0), &target = in.at(1);
    TESSEL_CHECK(is_f32_or_f64(input.dtype()), "mse_loss: expected input to be f32 or f64, got ",
                 dtype_name(input.dtype()));
    TESSEL_CHECK(target.dtype() == input.dtype(), "mse_loss: target has dtype ",
                 dtype_name(target.dtype()), " but input has dtype ", dtype_name(input.dtype()));
    TESSEL_CHECK(target.sizes() == input.sizes(), "mse_loss: target has shape ",
                 shape_str(target.sizes()), " but input has shape ", shape_str(input.sizes()),
                 "; they must match");
    const Reduction reduction = reduction_of("mse_loss", attrs);
    return std::vector<OutputSpec>{
        {reduction == Reduction::kNone ? input.sizes() : Shape{}, input.dtype()}};
  };
  op.kernels[static_cast<int>(DeviceType::kCpu)] = cpu::mse_loss_kernel;
  op.save_inputs = {0, 1};
  op.backward = [](const BackwardContext& context) -> std::vector<Tensor> {
    const Tensor& grad = context.grad_outputs[0];
    if (!grad.defined()) return {Tensor(), Tensor()};
    const Tensor &input = context.saved_inputs[0], &target = context.saved_inputs[1];
    double factor = 2.0;
    if (reduction_of("mse_loss", context.attrs) == Reduction::kMean)
      factor /= static_cast<double>(std::max<int64_t>(input.numel(), 1));
    // d/d input of (input - target)^2 is 2 (input - target); the scalar factor goes on the
    // (small) incoming gradient first.
    const Tensor grad_input = mul(sub(input, target), mul(grad, factor));
    return {context.needs_input_grad[0] ? grad_input : Tensor(),
            context.needs_input_grad[1] ? neg(grad_input) : Tensor()};
  };
  op.cost = [](const std::vector<Tensor>& in, const std::vector<Tensor>&, const Attrs&) {
    const double numel = static_cast<double>(in[0].numel());
    return OpCost{3 * numel, 2 * numel * static_cast<double>(in[0].element_size())};
  };
}

}  // namespace

TESSEL_REGISTER_OPS(loss) {
  register_cross_entropy();
  register_cross_entropy_backward();
  register_nll_loss();
  register_nll_loss_backward();
  register_mse_loss();
}

Tensor cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                     double label_smoothing, const std::string& reduction) {
  parse_reduction("cross_entropy", reduction);
  Attrs attrs = class_loss_attrs(ignore_index, reduction);
  attrs.set("label_smoothing", label_smoothing);
  return first_output(dispatch(ops::cross_entropy, {logits, target}, attrs));
}

Tensor nll_loss(const Tensor& log_probs, const Tensor& target, int64_t ignore_index,
                const std::string& reduction) {
  parse_reduction("nll_loss", reduction);
  return first_output(
      dispatch(ops::nll_loss, {log_probs, target}, class_loss_attrs(ignore_index, reduction)));
}

Tensor mse_loss(const Tensor& input, const Tensor& target, const std::string& reduction) {
  parse_reduction("mse_loss", reduction);
  return first_output(dispatch(ops::mse_loss, {input, target}, Attrs{{"reduction", reduction}}));
}

}  // namespace tessel
