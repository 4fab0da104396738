// Creation (full, arange), random tensors (rand, randn, randint and the in-place initialisers),
// copies and conversions (clone, contiguous, to_dtype, fill_, copy_): their definitions (shape
// rules, backward, cost, flags). The CPU kernels are in ops/cpu/factory.cc.
#include "ops/factory.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "ops/cpu/kernels.h"
#include "ops/ops.h"
#include "ops/registry_helpers.h"

namespace tessel {

namespace {

Shape shape_attr(const char* op, const Attrs& attrs) {
  const auto& shape = attrs.get<std::vector<int64_t>>("shape");
  for (int64_t size : shape)
    TESSEL_CHECK(size >= 0, op, ": negative size in shape ", shape_str(shape));
  return shape;
}

DType dtype_attr(const Attrs& attrs) {
  return dtype_from_name(attrs.get_or<std::string>("dtype", "f32"));
}

// Attributes every creation op carries: the shape, dtype and device of its one output.
Attrs creation_attrs(const Shape& sizes, const TensorOptions& options) {
  return Attrs{{"shape", std::vector<int64_t>(sizes)},
               {"dtype", std::string(dtype_name(options.dtype_))},
               {"device", options.device_.str()}};
}

Tensor finish_creation(Tensor result, const TensorOptions& options) {
  if (options.requires_grad_) result.set_requires_grad(true);
  return result;
}

OpCost write_only_cost(const std::vector<Tensor>&, const std::vector<Tensor>& outputs,
                       const Attrs&) {
  return OpCost{0, static_cast<double>(outputs.at(0).nbytes())};
}

OpCost copy_cost(const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                 const Attrs&) {
  return OpCost{0, static_cast<double>(inputs.back().nbytes() + outputs.at(0).nbytes())};
}

// One Philox counter yields 4 numbers.
uint64_t counters_for_shape(const std::vector<Tensor>&, const Attrs& attrs) {
  return (static_cast<uint64_t>(shape_numel(attrs.get<std::vector<int64_t>>("shape"))) + 3) / 4;
}

std::vector<OutputSpec> creation_shape(const char* op, const Attrs& attrs) {
  return {{shape_attr(op, attrs), dtype_attr(attrs)}};
}

std::vector<Tensor> grad_passthrough(const BackwardContext& context) {
  return {context.grad_outputs[0]};
}

void register_full() {
  // Attrs: shape, value, dtype (name), device. No inputs.
  OpDef& op = OpRegistry::get().define(ops::full);
  op.kind = OpKind::kFactory;
  op.autocast = AutocastPolicy::kWiden;
  op.shape = [](const std::vector<Tensor>&, const Attrs& attrs) {
    return creation_shape("full", attrs);
  };
  op.kernels[static_cast<int>(DeviceType::kCpu)] = cpu::full_kernel;
  op.cost = write_only_cost;
  op.splits = {{0, {}}};
}

void register_arange() {
  // Attrs: start, end, step, dtype, device. Element i is start + i * step.
  OpDef& op = OpRegistry::get().define(ops::arange);
  op.kind = OpKind::kFactory;
  op.autocast = AutocastPolicy::kWiden;
  op.shape = [](const std::vector<Tensor>&, const Attrs& attrs) {
    double start = attrs.get<double>("start"), end = attrs.get<double>("end"),
           step = attrs.get<double>("step");
    TESSEL_CHECK(step != 0 && std::isfinite(step), "arange: step must be finite and non-zero, got ",
                 step);
    TESSEL_CHECK(std::isfinite(start) && std::isfinite(end), "arange: start (", start,
                 ") and end (", end, ") must be finite");
    int64_t length = static_cast<int64_t>(std::ceil((end - start) / step));
    return std::vector<OutputSpec>{{{std::max<int64_t>(length, 0)}, dtype_attr(attrs)}};
  };
  op.kernels[static_cast<int>(DeviceType::kCpu)] = cpu::arange_kernel;
  op.cost = write_only_cost;
}

void register_rand() {
  // Uniform in [low, high). Attrs: shape, dtype, device, low, high (+ rng_seed, rng_offset).
  OpDef& op = OpRegistry::get().define(ops::rand);
  op.kind = OpKind::kFactory;
  op.autocast = AutocastPolicy::kWiden;
  op.shape = [](const std::vector<Tensor>&, const Attrs& attrs) {
    auto specs = creation_shape("rand", attrs);
    TESSEL_CHECK(is_floating(specs[0].dtype), "rand: expected a floating dtype, got ",
                 dtype_name(specs[0].dtype), " (use randint for integers)");
    return specs;
  };
  op.kernels[static_cast<int>(DeviceType::kCpu)] = cpu::rand_kernel;
  op.cost = write_only_cost;
  op.flags.pure = false;
  op.flags.random = true;
  op.rng_counters = counters_for_shape;
}

void register_randn() {
  // Normal(mean, std). Attrs: shape, dtype, device, mean, std (+ rng_seed, rng_offset).
  OpDef& op = OpRegistry::get().define(ops::randn);
  op.kind = OpKind::kFactory;
  op.autocast = AutocastPolicy::kWiden;
  op.shape = [](const std::vector<Tensor>&, const Attrs& attrs) {
    auto specs = creation_shape("randn", attrs);
    TESSEL_CHECK(is_floating(specs[0].dtype), "randn: expected a floating dtype, got ",
                 dtype_name(specs[0].dtype));
    return specs;
  };
  op.kernels[static_cast<int>(DeviceType::kCpu)] = cpu::randn_kernel;
  op.cost = write_only_cost;
  op.flags.pure = false;
  op.flags.random = true;
  op.rng_counters = counters_for_shape;
}

void register_randint() {
  // Integers uniform in [low, high). Attrs: shape, dtype, device, low, high (int64).
  OpDef& op = OpRegistry::get().define(ops::randint);
  op.kind = OpKind::kFactory;
  op.autocast = AutocastPolicy::kWiden;
  op.shape = [](const std::vector<Tensor>&, const Attrs& attrs) {
    int64_t low = attrs.get<int64_t>("low"), high = attrs.get<int64_t>("high");
    TESSEL_CHECK(low < high, "randint: expected low < high, got low=", low, ", high=", high);
    TESSEL_CHECK(static_cast<uint64_t>(high - low) <= (uint64_t{1} << 32), "randint: the range [",
                 low, ", ", high, ") is wider than 2^32");
    auto specs = creation_shape("randint", attrs);
    TESSEL_CHECK(specs[0].dtype != DType::kBool, "randint: bool is not an integer dtype");
    return specs;
  };
  op.kernels[static_cast<int>(DeviceType::kCpu)] = cpu::randint_kernel;
  op.cost = write_only_cost;
  op.flags.pure = false;
  op.flags.random = true;
  op.rng_counters = counters_for_shape;
}

void register_copies() {
  // Copies: a row-major copy of any strided input.
  for (const OpHandle* copy : {&ops::clone, &ops::contiguous}) {
    OpDef& op = OpRegistry::get().define(*copy);
    op.kind = OpKind::kDataMovement;
    op.autocast = AutocastPolicy::kWiden;
    op.planner.split = ParallelSplit::kPointwise;
    op.shape = [](const std::vector<Tensor>& inputs, const Attrs&) {
      return std::vector<OutputSpec>{{inputs.at(0).sizes(), inputs[0].dtype()}};
    };
    op.kernels[static_cast<int>(DeviceType::kCpu)] = cpu::clone_kernel;
    op.backward = grad_passthrough;
    op.cost = copy_cost;
    op.splits = {{0, {0}}};
  }
}

void register_to_dtype() {
  // Attr: dtype (name). Any dtype to any dtype.
  OpDef& op = OpRegistry::get().define(ops::to_dtype);
  op.kind = OpKind::kDataMovement;
  op.autocast = AutocastPolicy::kKeep;
  op.planner.split = ParallelSplit::kPointwise;
  op.shape = [](const std::vector<Tensor>& inputs, const Attrs& attrs) {
    return std::vector<OutputSpec>{
        {inputs.at(0).sizes(), dtype_from_name(attrs.get<std::string>("dtype"))}};
  };
  op.kernels[static_cast<int>(DeviceType::kCpu)] = cpu::to_dtype_kernel;
  op.backward = [](const BackwardContext& context) -> std::vector<Tensor> {
    if (!context.grad_outputs[0].defined()) return {Tensor()};
    return {to_dtype(context.grad_outputs[0], context.input_specs[0].dtype)};
  };
  op.cost = copy_cost;
  op.splits = {{0, {0}}};
}

void register_fill_() {
  // In place: inputs {self}, out {self}, attr value.
  OpDef& op = OpRegistry::get().define(ops::fill_);
  op.kind = OpKind::kFactory;
  op.autocast = AutocastPolicy::kWiden;
  op.planner.split = ParallelSplit::kPointwise;
  op.shape = [](const std::vector<Tensor>& inputs, const Attrs&) {
    TESSEL_CHECK(inputs.size() == 1, "fill_: expected one input (the tensor to fill), got ",
                 inputs.size());
    return std::vector<OutputSpec>{{inputs[0].sizes(), inputs[0].dtype()}};
  };
  op.kernels[static_cast<int>(DeviceType::kCpu)] = cpu::fill_inplace_kernel;
  op.cost = write_only_cost;
  op.flags.pure = false;
}

void register_copy_() {
  // In place: inputs {dest, source}, out {dest}. Source is broadcast to dest and converted.
  OpDef& op = OpRegistry::get().define(ops::copy_);
  op.kind = OpKind::kDataMovement;
  op.autocast = AutocastPolicy::kWiden;
  op.planner.split = ParallelSplit::kPointwise;
  op.shape = [](const std::vector<Tensor>& inputs, const Attrs&) {
    TESSEL_CHECK(inputs.size() == 2, "copy_: expected inputs {dest, source}, got ", inputs.size(),
                 " inputs");
    const Tensor& dest = inputs[0];
    const Tensor& source = inputs[1];
    TESSEL_CHECK(broadcastable_to(source.sizes(), dest.sizes()), "copy_: source of shape ",
                 shape_str(source.sizes()), " cannot be broadcast to destination shape ",
                 shape_str(dest.sizes()));
    return std::vector<OutputSpec>{{dest.sizes(), dest.dtype()}};
  };
  op.kernels[static_cast<int>(DeviceType::kCpu)] = cpu::copy_inplace_kernel;
  op.cost = copy_cost;
  op.flags.pure = false;
}

}  // namespace

TESSEL_REGISTER_OPS(factory) {
  register_full();
  register_arange();
  register_rand();
  register_randn();
  register_randint();
  register_copies();
  register_to_dtype();
  register_fill_();
  register_copy_();
}

Tensor full(const Shape& sizes, double value, TensorOptions options) {
  Attrs attrs = creation_attrs(sizes, options);
  attrs.set("value", value);
  return finish_creation(dispatch(ops::full, {}, std::move(attrs))[0], options);
}

Tensor zeros(const Shape& sizes, TensorOptions options) { return full(sizes, 0.0, options); }
Tensor ones(const Shape& sizes, TensorOptions options) { return full(sizes, 1.0, options); }

Tensor full_like(const Tensor& like, double value) {
  return full(like.sizes(), value, TensorOptions(like.dtype()).device(like.device()));
}
Tensor zeros_like(const Tensor& like) { return full_like(like, 0.0); }
Tensor ones_like(const Tensor& like) { return full_like(like, 1.0); }

Tensor arange(int64_t end, TensorOptions options) {
  return arange(0.0, static_cast<double>(end), 1.0, options);
}

Tensor arange(double start, double end, double step, TensorOptions options) {
  Attrs attrs{{"start", start},
              {"end", end},
              {"step", step},
              {"dtype", std::string(dtype_name(options.dtype_))},
              {"device", options.device_.str()}};
  return finish_creation(dispatch(ops::arange, {}, std::move(attrs))[0], options);
}

Tensor rand(const Shape& sizes, TensorOptions options) {
  return finish_creation(dispatch(ops::rand, {}, creation_attrs(sizes, options))[0], options);
}

Tensor randn(const Shape& sizes, TensorOptions options) {
  return finish_creation(dispatch(ops::randn, {}, creation_attrs(sizes, options))[0], options);
}

Tensor randint(int64_t low, int64_t high, const Shape& sizes, TensorOptions options) {
  Attrs attrs = creation_attrs(sizes, options);
  attrs.set("low", low);
  attrs.set("high", high);
  return finish_creation(dispatch(ops::randint, {}, std::move(attrs))[0], options);
}

Tensor& uniform_(Tensor& tensor, double low, double high) {
  TESSEL_CHECK(low <= high, "uniform_: expected low <= high, got low=", low, ", high=", high);
  // An initialiser: not recorded by autograd, like torch.nn.init.
  NoGradGuard no_grad;
  Attrs attrs =
      creation_attrs(tensor.sizes(), TensorOptions(tensor.dtype()).device(tensor.device()));
  attrs.set("low", low);
  attrs.set("high", high);
  dispatch(ops::rand, {}, std::move(attrs), {tensor});
  return tensor;
}

Tensor& normal_(Tensor& tensor, double mean, double stddev) {
  TESSEL_CHECK(stddev >= 0, "normal_: expected stddev >= 0, got ", stddev);
  NoGradGuard no_grad;
  Attrs attrs =
      creation_attrs(tensor.sizes(), TensorOptions(tensor.dtype()).device(tensor.device()));
  attrs.set("mean", mean);
  attrs.set("std", stddev);
  dispatch(ops::randn, {}, std::move(attrs), {tensor});
  return tensor;
}

Tensor clone(const Tensor& x) { return first_output(dispatch(ops::clone, {x})); }

Tensor contiguous(const Tensor& x) {
  if (x.is_contiguous()) return x;
  return first_output(dispatch(ops::contiguous, {x}));
}

Tensor to_dtype(const Tensor& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  return first_output(
      dispatch(ops::to_dtype, {x}, Attrs{{"dtype", std::string(dtype_name(dtype))}}));
}

}  // namespace tessel
