#include "optim/optimizer.h"

#include <cmath>
#include <map>
#include <set>
#include <unordered_set>

#include "core/autograd.h"
#include "ops/ops.h"

namespace tessel::optim {

namespace {
std::string join(const std::vector<std::string>& parts, const char* separator = ", ") {
  std::string result;
  for (size_t i = 0; i < parts.size(); ++i) result += (i ? separator : "") + parts[i];
  return result;
}
}  // namespace

void check_learning_rate(const char* optimizer_name, double lr) {
  TESSEL_CHECK(std::isfinite(lr) && lr >= 0, optimizer_name, ": invalid learning rate ", lr,
               " (expected a finite value >= 0)");
}

Optimizer::Optimizer(const std::vector<Tensor>& parameters, double lr,
                     std::vector<std::string> state_keys, const char* optimizer_name)
    : parameters_(parameters), state_keys_(std::move(state_keys)), lr_(lr) {
  for (size_t i = 0; i < parameters_.size(); ++i) names_.push_back(std::to_string(i));
  check_parameters(optimizer_name);
  state_.resize(parameters_.size());
}

Optimizer::Optimizer(const NamedTensors& named_parameters, double lr,
                     std::vector<std::string> state_keys, const char* optimizer_name)
    : state_keys_(std::move(state_keys)), lr_(lr) {
  for (const auto& [name, parameter] : named_parameters) {
    names_.push_back(name);
    parameters_.push_back(parameter);
  }
  check_parameters(optimizer_name);
  state_.resize(parameters_.size());
}

void Optimizer::check_parameters(const char* optimizer_name) const {
  check_learning_rate(optimizer_name, lr_);
  TESSEL_CHECK(!parameters_.empty(), optimizer_name, ": got an empty parameter list");
  std::unordered_set<const TensorImpl*> seen;
  std::set<std::string> seen_names;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const Tensor& parameter = parameters_[i];
    TESSEL_CHECK(parameter.defined(), optimizer_name, ": parameter '", names_[i], "' is undefined");
    TESSEL_CHECK(is_floating(parameter.dtype()), optimizer_name, ": parameter '", names_[i],
                 "' has dtype ", dtype_name(parameter.dtype()),
                 "; only floating-point tensors can be optimized");
    TESSEL_CHECK(parameter.is_leaf(), optimizer_name, ": can't optimize parameter '", names_[i],
                 "': it is not a leaf tensor (the result of an op)");
    TESSEL_CHECK(seen.insert(parameter.impl()).second, optimizer_name, ": parameter '", names_[i],
                 "' appears more than once in the parameter list");
    TESSEL_CHECK(seen_names.insert(names_[i]).second, optimizer_name,
                 ": two parameters are named '", names_[i], "'");
  }
}

void Optimizer::set_lr(double lr) {
  check_learning_rate(name().c_str(), lr);
  lr_ = lr;
}

void Optimizer::step() {
  NoGradGuard no_grad;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    Tensor grad = parameters_[i].grad();
    if (!grad.defined()) continue;
    ParameterState& state = state_[i];
    state.tensors.resize(state_keys_.size());
    ++state.step;
    update(parameters_[i], grad, state);
  }
}

void Optimizer::zero_grad() {
  for (const Tensor& parameter : parameters_) parameter.set_grad(Tensor());
}

NamedTensors Optimizer::state_tensors() const {
  NamedTensors result;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const auto& tensors = state_[i].tensors;
    for (size_t k = 0; k < tensors.size(); ++k)
      if (tensors[k].defined()) result.emplace_back(names_[i] + "." + state_keys_[k], tensors[k]);
  }
  return result;
}

std::vector<Tensor> Optimizer::held_tensors() const {
  std::vector<Tensor> held = parameters_;
  for (const ParameterState& state : state_)
    for (const Tensor& tensor : state.tensors)
      if (tensor.defined()) held.push_back(tensor);
  return held;
}

void Optimizer::load_state_tensors(const NamedTensors& state) {
  std::map<std::string, std::pair<size_t, size_t>> slots;  // "name.key" -> (parameter, key)
  for (size_t i = 0; i < parameters_.size(); ++i)
    for (size_t k = 0; k < state_keys_.size(); ++k)
      slots[names_[i] + "." + state_keys_[k]] = {i, k};

  std::vector<std::string> problems;
  std::set<std::string> given;
  for (const auto& [name, tensor] : state) {
    auto slot = slots.find(name);
    if (!given.insert(name).second) {
      problems.push_back("'" + name + "' appears twice");
    } else if (slot == slots.end()) {
      problems.push_back("unexpected state '" + name + "'");
    } else if (!tensor.defined()) {
      problems.push_back("'" + name + "' is an undefined tensor");
    } else {
      const Tensor& parameter = parameters_[slot->second.first];
      if (tensor.sizes() != parameter.sizes()) {
        problems.push_back("size mismatch for '" + name + "': the given tensor has shape " +
                           shape_str(tensor.sizes()) + ", the parameter has shape " +
                           shape_str(parameter.sizes()));
      }
    }
  }
  TESSEL_CHECK(problems.empty(), name(),
               ": load_state_tensors failed, nothing was loaded (state "
               "keys for this optimizer: ",
               state_keys_.empty() ? "none" : join(state_keys_), "):\n  ", join(problems, "\n  "));

  NoGradGuard no_grad;
  std::vector<ParameterState> loaded(parameters_.size());
  for (size_t i = 0; i < parameters_.size(); ++i) {
    loaded[i].tensors.resize(state_keys_.size());
    loaded[i].step = state_[i].step;
  }
  for (const auto& [name, tensor] : state) {
    auto [i, k] = slots.at(name);
    const Tensor& parameter = parameters_[i];
    Tensor copy = tensor.device() == parameter.device() ? tensor : tensor.to(parameter.device());
    copy = copy.dtype() == parameter.dtype() ? clone(copy) : to_dtype(copy, parameter.dtype());
    loaded[i].tensors[k] = copy.is_contiguous() ? copy : contiguous(copy);
  }
  state_ = std::move(loaded);
}

NamedScalars Optimizer::state_scalars() const {
  NamedScalars result{{"lr", lr_}};
  for (size_t i = 0; i < parameters_.size(); ++i)
    result.emplace_back(names_[i] + ".step", static_cast<double>(state_[i].step));
  return result;
}

void Optimizer::load_state_scalars(const NamedScalars& scalars) {
  std::map<std::string, size_t> step_slots;
  for (size_t i = 0; i < parameters_.size(); ++i) step_slots[names_[i] + ".step"] = i;
  std::vector<std::string> problems;
  std::set<std::string> given;
  double lr = lr_;
  std::vector<int64_t> steps(parameters_.size(), 0);
  for (const auto& [name, value] : scalars) {
    if (!given.insert(name).second) {
      problems.push_back("'" + name + "' appears twice");
    } else if (name == "lr") {
      if (std::isfinite(value) && value >= 0) {
        lr = value;
      } else {
        problems.push_back("invalid learning rate " + std::to_string(value));
      }
    } else if (auto slot = step_slots.find(name); slot != step_slots.end()) {
      if (value >= 0 && value == std::floor(value) && value < 9.007199254740992e15) {
        steps[slot->second] = static_cast<int64_t>(value);
      } else {
        problems.push_back("'" + name + "' must be a non-negative whole number, got " +
                           std::to_string(value));
      }
    } else {
      problems.push_back("unexpected scalar '" + name + "'");
    }
  }
  TESSEL_CHECK(problems.empty(), name(), ": load_state_scalars failed, nothing was loaded:\n  ",
               join(problems, "\n  "));
  lr_ = lr;
  for (size_t i = 0; i < parameters_.size(); ++i) state_[i].step = steps[i];
}

}  // namespace tessel::optim
