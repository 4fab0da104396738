// Normalisation: batch_norm (training and eval are two ops, because only training updates the
// running statistics and only eval splits along the batch in independent chunks) and layer_norm,
// each with a dedicated backward op so the gradient is one pass over the data: their definitions
// (shape rules, backward, cost, splits). The CPU kernels are in ops/cpu/norm.cc.
#include "ops/norm.h"

#include <vector>

#include "core/autograd.h"
#include "ops/cpu/kernels.h"
#include "ops/math/channel_layout.h"
#include "ops/ops.h"
#include "ops/registry_helpers.h"

namespace tessel {

namespace {

void check_float_input(const char* op, const char* what, const Tensor& tensor) {
  TESSEL_CHECK(tensor.dtype() == DType::kFloat32 || tensor.dtype() == DType::kFloat64, op,
               ": expected ", what, " to be f32 or f64, got ", dtype_name(tensor.dtype()),
               " (shape ", shape_str(tensor.sizes()), ")");
}

// A per-channel (or per-feature) parameter: undefined, or exactly `expected` shape and x's dtype.
void check_parameter(const char* op, const char* what, const Tensor& parameter, const Tensor& x,
                     const Shape& expected, const char* meaning) {
  if (!parameter.defined()) return;
  TESSEL_CHECK(parameter.sizes() == expected, op, ": ", what, " has shape ",
               shape_str(parameter.sizes()), " but expected ", shape_str(expected), " (", meaning,
               ", input shape ", shape_str(x.sizes()), ")");
  TESSEL_CHECK(parameter.dtype() == x.dtype(), op, ": ", what, " has dtype ",
               dtype_name(parameter.dtype()), " but the input has dtype ", dtype_name(x.dtype()));
}

void check_batch_norm_inputs(const char* op, const std::vector<Tensor>& in) {
  const Tensor& x = in.at(0);
  check_float_input(op, "input", x);
  TESSEL_CHECK(x.dim() >= 2, op, ": expected an input of shape (N, C) or (N, C, ...), got shape ",
               shape_str(x.sizes()));
  const Shape channels{x.size(1)};
  const char* meaning = "one value per channel";
  check_parameter(op, "weight", in.at(1), x, channels, meaning);
  check_parameter(op, "bias", in.at(2), x, channels, meaning);
  check_parameter(op, "running_mean", in.at(3), x, channels, meaning);
  check_parameter(op, "running_var", in.at(4), x, channels, meaning);
}

OpCost batch_norm_cost(const std::vector<Tensor>& in, const std::vector<Tensor>&, const Attrs&) {
  const double numel = static_cast<double>(in[0].numel());
  return OpCost{8 * numel, 3 * numel * static_cast<double>(in[0].element_size())};
}

// batch_norm_backward's out= tensors: grad_x written into the incoming gradient when nothing else
// holds it, or else over the saved input x when only the node holds that (a residual block's
// gradient feeds its shortcut too); the kernels read a channel's gradient and input whole before
// writing that channel, and each element once as they write it. The per-channel gradients are
// new. {} when neither can be reused.
std::vector<Tensor> batch_norm_backward_outputs(const BackwardContext& context, const Tensor& x) {
  std::vector<Tensor> reused = context.reusable_grad(0, {x.sizes(), x.dtype()});
  if (reused.empty()) reused = context.reusable_saved_input(0, {x.sizes(), x.dtype()});
  if (reused.empty()) return {};
  const Shape channels{x.size(1)};
  const TensorOptions options = TensorOptions(x.dtype()).device(x.device());
  reused.push_back(empty(channels, options));
  reused.push_back(empty(channels, options));
  return reused;
}

// The gradients batch_norm_backward produced, kept only where an input needs one.
std::vector<Tensor> batch_norm_input_grads(const BackwardContext& context,
                                           const std::vector<Tensor>& grads) {
  std::vector<Tensor> result(5);
  for (int i = 0; i < 3; ++i)
    if (context.needs_input_grad[i]) result[i] = grads[i];
  return result;
}

void check_layer_norm_inputs(const std::vector<Tensor>& in, const Shape& normalized) {
  const Tensor& x = in.at(0);
  check_float_input("layer_norm", "input", x);
  TESSEL_CHECK(!normalized.empty(), "layer_norm: normalized_shape must not be empty");
  const size_t k = normalized.size();
  bool matches = static_cast<size_t>(x.dim()) >= k;
  for (size_t i = 0; matches && i < k; ++i) matches = x.sizes()[x.dim() - k + i] == normalized[i];
  TESSEL_CHECK(matches, "layer_norm: normalized_shape ", shape_str(normalized),
               " does not match the trailing dimensions of input shape ", shape_str(x.sizes()));
  const char* meaning = "one value per normalized element";
  check_parameter("layer_norm", "weight", in.at(1), x, normalized, meaning);
  check_parameter("layer_norm", "bias", in.at(2), x, normalized, meaning);
}

Shape row_statistics_shape(const Shape& sizes, size_t normalized_dims) {
  Shape result(sizes.begin(), sizes.end() - static_cast<int64_t>(normalized_dims));
  result.resize(sizes.size(), 1);
  return result;
}

void register_batch_norm() {
  OpDef& op = OpRegistry::get().define(ops::batch_norm);
  op.kind = OpKind::kNorm;
  op.autocast = AutocastPolicy::kWiden;
  op.planner = {ParallelSplit::kChannels, "batch_norm"};
  op.shape = [](const std::vector<Tensor>& in, const Attrs&) {
    check_batch_norm_inputs("batch_norm", in);
    const Tensor& x = in[0];
    const ChannelLayout layout(x.sizes());
    TESSEL_CHECK(layout.per_channel() > 1,
                 "batch_norm: expected more than 1 value per channel when training, got input "
                 "shape ",
                 shape_str(x.sizes()));
    const Shape channels{x.size(1)};
    return std::vector<OutputSpec>{
        {x.sizes(), x.dtype()}, {channels, x.dtype()}, {channels, x.dtype()}};
  };
  op.kernels[static_cast<int>(DeviceType::kCpu)] = cpu::batch_norm_train_kernel;
  op.save_inputs = {0, 1};
  op.save_outputs = {1, 2};
  op.backward = [](const BackwardContext& context) -> std::vector<Tensor> {
    if (!context.grad_outputs[0].defined()) return std::vector<Tensor>(5);
    std::vector<Tensor> grads = dispatch(
        ops::batch_norm_backward,
        {context.grad_outputs[0], context.saved_inputs[0], context.saved_inputs[1],
         context.saved_outputs[1], context.saved_outputs[2]},
        Attrs{{"training", true}}, batch_norm_backward_outputs(context, context.saved_inputs[0]));
    return batch_norm_input_grads(context, grads);
  };
  op.cost = batch_norm_cost;
  // Batch statistics couple every entry of the batch: chunks of it run in three passes (sums,
  // centred squares, y). The running statistics are written in place, once per forward (in the
  // last chunk of a run over chunks), never on replay.
  op.splits = {{0, {0, -1, -1, -1, -1}, {}, {1, 2}}};
  op.chunk_passes = 3;
  op.flags.side_effects = true;
  op.mutated_inputs = {3, 4};
}

void register_batch_norm_eval() {
  OpDef& op = OpRegistry::get().define(ops::batch_norm_eval);
  op.kind = OpKind::kNorm;
  op.autocast = AutocastPolicy::kWiden;
  op.planner = {ParallelSplit::kChannels, "batch_norm"};
  op.shape = [](const std::vector<Tensor>& in, const Attrs&) {
    check_batch_norm_inputs("batch_norm", in);
    TESSEL_CHECK(in[3].defined() && in[4].defined(),
                 "batch_norm: running_mean and running_var must be defined in evaluation mode");
    return one_output(in[0].sizes(), in[0].dtype());
  };
  op.kernels[static_cast<int>(DeviceType::kCpu)] = cpu::batch_norm_eval_kernel;
  op.save_inputs = {0, 1, 3, 4};
  op.backward = [](const BackwardContext& context) -> std::vector<Tensor> {
    TESSEL_CHECK(!context.attrs.get_or<bool>("relu", false),
                 "batch_norm_eval: the form with relu fused in is for inference and has no "
                 "backward; call relu(batch_norm(...)) where gradients are needed");
    std::vector<Tensor> grads =
        dispatch(ops::batch_norm_backward,
                 {context.grad_outputs[0], context.saved_inputs[0], context.saved_inputs[1],
                  context.saved_inputs[3], context.saved_inputs[4]},
                 Attrs{{"training", false}, {"eps", context.attrs.get<double>("eps")}},
                 batch_norm_backward_outputs(context, context.saved_inputs[0]));
    return batch_norm_input_grads(context, grads);
  };
  op.cost = batch_norm_cost;
  op.splits = {{0, {0, -1, -1, -1, -1}}};
}

void register_batch_norm_backward() {
  OpDef& op = OpRegistry::get().define(ops::batch_norm_backward);
  op.kind = OpKind::kNorm;
  op.autocast = AutocastPolicy::kWiden;
  op.shape = [](const std::vector<Tensor>& in, const Attrs&) {
    const Tensor& x = in.at(1);
    TESSEL_CHECK(in.at(0).sizes() == x.sizes(), "batch_norm_backward: grad_y has shape ",
                 shape_str(in[0].sizes()), " but the input has shape ", shape_str(x.sizes()));
    TESSEL_CHECK(in[0].dtype() == x.dtype(), "batch_norm_backward: grad_y has dtype ",
                 dtype_name(in[0].dtype()), " but the input has dtype ", dtype_name(x.dtype()));
    const Shape channels{x.size(1)};
    return std::vector<OutputSpec>{
        {x.sizes(), x.dtype()}, {channels, x.dtype()}, {channels, x.dtype()}};
  };
  op.kernels[static_cast<int>(DeviceType::kCpu)] = cpu::batch_norm_backward_kernel;
  op.cost = batch_norm_cost;
  // Chunks of the batch in two passes: the per-channel sums, then grad_x.
  op.splits = {{0, {0, 0, -1, -1, -1}, {}, {1, 2}}};
  op.chunk_passes = 2;
}

void register_layer_norm() {
  OpDef& op = OpRegistry::get().define(ops::layer_norm);
  op.kind = OpKind::kNorm;
  op.autocast = AutocastPolicy::kWiden;
  op.planner.rate = "layer_norm";
  op.shape = [](const std::vector<Tensor>& in, const Attrs& attrs) {
    const auto& normalized = attrs.get<std::vector<int64_t>>("normalized_shape");
    check_layer_norm_inputs(in, normalized);
    const Tensor& x = in[0];
    const Shape statistics = row_statistics_shape(x.sizes(), normalized.size());
    return std::vector<OutputSpec>{
        {x.sizes(), x.dtype()}, {statistics, x.dtype()}, {statistics, x.dtype()}};
  };
  op.kernels[static_cast<int>(DeviceType::kCpu)] = cpu::layer_norm_kernel;
  op.save_inputs = {0, 1};
  op.save_outputs = {1, 2};
  op.backward = [](const BackwardContext& context) -> std::vector<Tensor> {
    if (!context.grad_outputs[0].defined()) return std::vector<Tensor>(3);
    std::vector<Tensor> grads = dispatch(
        ops::layer_norm_backward,
        {context.grad_outputs[0], context.saved_inputs[0], context.saved_outputs[1],
         context.saved_outputs[2], context.saved_inputs[1]},
        Attrs{{"normalized_shape", context.attrs.get<std::vector<int64_t>>("normalized_shape")}});
    std::vector<Tensor> result(3);
    for (int i = 0; i < 3; ++i)
      if (context.needs_input_grad[i]) result[i] = grads[i];
    return result;
  };
  op.cost = [](const std::vector<Tensor>& in, const std::vector<Tensor>&, const Attrs&) {
    const double numel = static_cast<double>(in[0].numel());
    return OpCost{8 * numel, 2 * numel * static_cast<double>(in[0].element_size())};
  };
  // Rows are independent: split along the first leading dimension (every output has it).
  op.splits = {{0, {0, -1, -1}}};
}

void register_layer_norm_backward() {
  OpDef& op = OpRegistry::get().define(ops::layer_norm_backward);
  op.kind = OpKind::kNorm;
  op.autocast = AutocastPolicy::kWiden;
  op.shape = [](const std::vector<Tensor>& in, const Attrs& attrs) {
    const auto& normalized = attrs.get<std::vector<int64_t>>("normalized_shape");
    const Tensor& x = in.at(1);
    TESSEL_CHECK(in.at(0).sizes() == x.sizes() && in[0].dtype() == x.dtype(),
                 "layer_norm_backward: grad_y (", shape_str(in[0].sizes()), " ",
                 dtype_name(in[0].dtype()), ") does not match the input (", shape_str(x.sizes()),
                 " ", dtype_name(x.dtype()), ")");
    return std::vector<OutputSpec>{
        {x.sizes(), x.dtype()}, {normalized, x.dtype()}, {normalized, x.dtype()}};
  };
  op.kernels[static_cast<int>(DeviceType::kCpu)] = cpu::layer_norm_backward_kernel;
  op.cost = [](const std::vector<Tensor>& in, const std::vector<Tensor>&, const Attrs&) {
    const double numel = static_cast<double>(in[1].numel());
    return OpCost{12 * numel, 3 * numel * static_cast<double>(in[1].element_size())};
  };
  // Rows are independent; the weight's and bias's gradients sum over them, chunk after chunk.
  op.splits = {{0, {0, 0, 0, 0, -1}, {}, {1, 2}}};
  op.chunk_passes = 1;
}

}  // namespace

TESSEL_REGISTER_OPS(norm) {
  register_batch_norm();
  register_batch_norm_eval();
  register_batch_norm_backward();
  register_layer_norm();
  register_layer_norm_backward();
}

Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias,
                  const Tensor& running_mean, const Tensor& running_var, bool training,
                  double momentum, double eps) {
  if (training) {
    return dispatch(ops::batch_norm, {x, weight, bias, running_mean, running_var},
                    Attrs{{"momentum", momentum}, {"eps", eps}})[0];
  }
  return dispatch(ops::batch_norm_eval, {x, weight, bias, running_mean, running_var},
                  Attrs{{"eps", eps}})[0];
}

Tensor batch_norm_relu_eval(const Tensor& x, const Tensor& weight, const Tensor& bias,
                            const Tensor& running_mean, const Tensor& running_var, double eps) {
  if (GradMode::is_enabled()) {
    for (const Tensor* input : {&x, &weight, &bias})
      TESSEL_CHECK(!input->defined() || !input->requires_grad(),
                   "batch_norm_relu_eval: is for inference and has no backward, but an input "
                   "requires a gradient; run it under NoGradGuard or call "
                   "relu(batch_norm(...))");
  }
  return dispatch(ops::batch_norm_eval, {x, weight, bias, running_mean, running_var},
                  Attrs{{"eps", eps}, {"relu", true}})[0];
}

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                  const Tensor& bias, double eps) {
  return dispatch(ops::layer_norm, {x, weight, bias},
                  Attrs{{"normalized_shape", normalized_shape}, {"eps", eps}})[0];
}

}  // namespace tessel
