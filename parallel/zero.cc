#include "parallel/zero.h"

#include <cmath>

#include "core/autograd.h"
#include "core/shape.h"
#include "ops/ops.h"
#include "ops/transfer.h"
#include "optim/clip_grad.h"
#include "parallel/ddp.h"

namespace tessel::parallel {

struct ZeroOptimizer::Parts {
  std::shared_ptr<Communicator> group;
  std::vector<std::string> names;  // the trainable parameters', in module order
  std::vector<Tensor> parameters;  // the trainable parameters themselves
  std::vector<int64_t> begins;     // this rank's part of each flattened parameter
  std::vector<int64_t> counts;
  std::vector<Tensor> parts;  // views of this rank's ranges, which the shard optimizer updates

  // Stage 2: adds this rank's part of the group's mean of parameter i's gradient to the part's
  // gradient, and drops the parameter's whole gradient.
  void reduce_scatter_gradient(size_t i) {
    NoGradGuard no_grad;
    const Tensor& parameter = parameters[i];
    Tensor grad = parameter.grad();
    if (!grad.defined()) return;
    Tensor mine = zeros({counts[i]}, TensorOptions(grad.dtype()).device(grad.device()));
    group->reduce_scatter(grad.contiguous().reshape({-1}), mine, ReduceOp::kMean);
    parameter.set_grad(Tensor());
    Tensor held = parts[i].grad();
    parts[i].set_grad(held.defined() ? add(held, mine) : mine);
  }

  // The parameter a state entry "<parameter name>.<key>" belongs to (the longest name that
  // matches), or -1.
  int64_t owner(const std::string& entry) const {
    int64_t found = -1;
    size_t found_length = 0;
    for (size_t i = 0; i < names.size(); ++i) {
      const std::string& name = names[i];
      if (entry.size() > name.size() + 1 && entry.compare(0, name.size(), name) == 0 &&
          entry[name.size()] == '.' && name.size() >= found_length) {
        found = static_cast<int64_t>(i);
        found_length = name.size();
      }
    }
    return found;
  }
};

namespace {

optim::NamedTensors trainable_parameters(const std::shared_ptr<nn::Module>& module) {
  TESSEL_CHECK(module != nullptr, "ZeroOptimizer: module is null");
  optim::NamedTensors trainable;
  for (const auto& [name, parameter] : module->named_parameters())
    if (parameter.requires_grad()) trainable.emplace_back(name, parameter);
  TESSEL_CHECK(!trainable.empty(), "ZeroOptimizer: the module has no trainable parameters");
  return trainable;
}

}  // namespace

ZeroOptimizer::ZeroOptimizer(std::shared_ptr<nn::Module> module,
                             std::shared_ptr<Communicator> group,
                             const MakeShardOptimizer& make_optimizer, ZeroStage stage)
    : Optimizer(trainable_parameters(module), 0.0, {}, "ZeroOptimizer"),
      module_(std::move(module)),
      group_(std::move(group)),
      stage_(stage),
      parts_(std::make_shared<Parts>()) {
  TESSEL_CHECK(group_ != nullptr, "ZeroOptimizer: group is null");
  TESSEL_CHECK(make_optimizer != nullptr, "ZeroOptimizer: make_optimizer is empty");
  TESSEL_CHECK(stage == ZeroStage::kOptimizerState || stage == ZeroStage::kGradients,
               "ZeroOptimizer: unknown stage ", static_cast<int>(stage), " (1 or 2)");
  Parts& parts = *parts_;
  parts.group = group_;
  const Device device = group_->device();
  const int ranks = group_->size(), rank = group_->rank();
  for (const auto& [name, parameter] : trainable_parameters(module_)) {
    TESSEL_CHECK(parameter.device() == device, "ZeroOptimizer: parameter ", name, " is on ",
                 parameter.device().str(), " but communicator '", group_->name(),
                 "' moves tensors on ", device.str());
    TESSEL_CHECK(parameter.is_contiguous(), "ZeroOptimizer: parameter ", name,
                 " is not contiguous; its parts are ranges of its elements");
    const int64_t elements = parameter.numel();
    parts.names.push_back(name);
    parts.parameters.push_back(parameter);
    parts.begins.push_back(part_start(elements, ranks, rank));
    parts.counts.push_back(part_rows(elements, ranks, rank));
  }
  // Stage 1 leaves the parameters to DDP (which starts every rank from rank 0's); stage 2 has no
  // DDP, so it does that here. Either way a different module on some rank is an error everywhere.
  if (stage == ZeroStage::kGradients)
    start_from_rank0(*group_, *module_, "ZeroOptimizer");
  else
    check_same_module(*group_, *module_, "ZeroOptimizer");

  optim::NamedTensors named_parts;
  {
    NoGradGuard no_grad;
    for (size_t i = 0; i < parts.parameters.size(); ++i) {
      // A view of the parameter's own elements: updated in place, never a second copy.
      parts.parts.push_back(
          parts.parameters[i].detach().reshape({-1}).narrow(0, parts.begins[i], parts.counts[i]));
      named_parts.emplace_back(parts.names[i], parts.parts.back());
    }
  }
  optimizer_ = make_optimizer(named_parts);
  TESSEL_CHECK(optimizer_ != nullptr, "ZeroOptimizer: make_optimizer returned null");
  const std::vector<Tensor>& given = optimizer_->parameters();
  bool same = given.size() == parts.parts.size();
  for (size_t i = 0; same && i < given.size(); ++i) same = given[i].impl() == parts.parts[i].impl();
  TESSEL_CHECK(same, "ZeroOptimizer: make_optimizer must build the optimizer over exactly the ",
               parts.parts.size(), " part tensors it is given, in that order (got ", given.size(),
               " parameters)");
  Optimizer::set_lr(optimizer_->lr());

  if (stage == ZeroStage::kGradients) {
    std::weak_ptr<Parts> weak = parts_;
    for (size_t i = 0; i < parts.parameters.size(); ++i) {
      parts.parameters[i].register_post_accumulate_grad_hook([weak, i](const Tensor&) {
        if (auto alive = weak.lock()) alive->reduce_scatter_gradient(i);
      });
    }
  }
}

ZeroOptimizer::~ZeroOptimizer() = default;

void ZeroOptimizer::step() {
  Parts& parts = *parts_;
  NoGradGuard no_grad;
  if (stage_ == ZeroStage::kOptimizerState) {
    for (size_t i = 0; i < parts.parameters.size(); ++i) {
      Tensor grad = parts.parameters[i].grad();
      parts.parts[i].set_grad(grad.defined() ? grad.contiguous().reshape({-1}).narrow(
                                                   0, parts.begins[i], parts.counts[i])
                                             : Tensor());
    }
  }
  optimizer_->step();
  // Every rank updated the same parameters (gradients are defined alike on every rank: averaged
  // by DDP, or reduce-scattered by all): gather those. The part lies inside the gathered
  // tensor, so it is sent from a copy.
  for (size_t i = 0; i < parts.parameters.size(); ++i) {
    if (!parts.parts[i].grad().defined()) continue;
    group_->all_gather(parts.parts[i].clone(), parts.parameters[i].detach().reshape({-1}));
  }
  if (stage_ == ZeroStage::kOptimizerState)
    for (const Tensor& part : parts.parts) part.set_grad(Tensor());
}

double ZeroOptimizer::clip_grad_norm(double max_norm) {
  if (stage_ == ZeroStage::kOptimizerState) return optim::clip_grad_norm(parameters(), max_norm);
  TESSEL_CHECK(max_norm >= 0, "clip_grad_norm: max_norm must be >= 0, got ", max_norm);
  NoGradGuard no_grad;
  double squares = 0;
  for (const Tensor& part : parts_->parts) {
    const Tensor grad = part.grad();
    if (!grad.defined() || grad.numel() == 0) continue;
    const Tensor wide = to_dtype(grad, DType::kFloat64);
    squares += sum(mul(wide, wide)).item<double>();
  }
  Tensor total = to_device(from_vector<double>({squares}, {1}), group_->device());
  group_->all_reduce(total);
  const double norm = std::sqrt(total.item<double>());
  const double scale = max_norm / (norm + 1e-6);  // as optim::clip_grad_norm
  if (scale < 1.0 || std::isnan(scale))
    for (const Tensor& part : parts_->parts)
      if (part.grad().defined()) part.grad().mul_(scale);
  return norm;
}

void ZeroOptimizer::zero_grad() {
  optimizer_->zero_grad();
  for (const Tensor& parameter : parts_->parameters) parameter.set_grad(Tensor());
}

void ZeroOptimizer::set_lr(double lr) {
  optimizer_->set_lr(lr);
  Optimizer::set_lr(lr);
}

void ZeroOptimizer::update(const Tensor&, const Tensor&, ParameterState&) {
  TESSEL_FAIL("ZeroOptimizer: update() is not used; step() updates this rank's parts");
}

std::vector<Tensor> ZeroOptimizer::held_tensors() const {
  std::vector<Tensor> held = parameters();
  for (const Tensor& tensor : optimizer_->held_tensors()) held.push_back(tensor);
  return held;
}

int64_t ZeroOptimizer::part_begin(size_t parameter) const {
  TESSEL_CHECK(parameter < parts_->begins.size(), "ZeroOptimizer: no parameter ", parameter);
  return parts_->begins[parameter];
}

int64_t ZeroOptimizer::part_count(size_t parameter) const {
  TESSEL_CHECK(parameter < parts_->counts.size(), "ZeroOptimizer: no parameter ", parameter);
  return parts_->counts[parameter];
}

optim::NamedTensors ZeroOptimizer::state_tensors() const {
  const Parts& parts = *parts_;
  optim::NamedTensors whole;
  // The same entries on every rank, in the same order: every rank's optimizer stepped the same
  // parameters.
  for (const auto& [name, part] : optimizer_->state_tensors()) {
    const int64_t i = parts.owner(name);
    TESSEL_CHECK(i >= 0 && part.numel() == parts.counts[i], "ZeroOptimizer: the state '", name,
                 "' is not one value per element of its parameter; it cannot be gathered");
    const Tensor& parameter = parts.parameters[i];
    Tensor gathered = zeros({parameter.numel()}, TensorOptions(part.dtype()).device(part.device()));
    group_->all_gather(part.contiguous(), gathered);
    whole.emplace_back(name, gathered.reshape(parameter.sizes()));
  }
  return whole;
}

void ZeroOptimizer::load_state_tensors(const optim::NamedTensors& state) {
  const Parts& parts = *parts_;
  optim::NamedTensors mine;
  for (const auto& [name, tensor] : state) {
    const int64_t i = parts.owner(name);
    if (i < 0 || !tensor.defined()) {
      mine.emplace_back(name, tensor);  // the shard optimizer reports what is wrong with it
      continue;
    }
    TESSEL_CHECK(tensor.numel() == parts.parameters[i].numel(), "ZeroOptimizer: state '", name,
                 "' has shape ", shape_str(tensor.sizes()), " but its parameter has shape ",
                 shape_str(parts.parameters[i].sizes()));
    mine.emplace_back(
        name, tensor.contiguous().reshape({-1}).narrow(0, parts.begins[i], parts.counts[i]));
  }
  optimizer_->load_state_tensors(mine);
}

optim::NamedScalars ZeroOptimizer::state_scalars() const { return optimizer_->state_scalars(); }

void ZeroOptimizer::load_state_scalars(const optim::NamedScalars& scalars) {
  optimizer_->load_state_scalars(scalars);
  Optimizer::set_lr(optimizer_->lr());
}

}  // namespace tessel::parallel
