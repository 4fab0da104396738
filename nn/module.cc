#include "nn/module.h"

#include <cstdio>
#include <cstdlib>
#include <set>
#include <sstream>
#include <unordered_set>

#include "core/autograd.h"
#include "ops/ops.h"

namespace tessel::nn {

namespace {

// Points `target`'s TensorImpl at `source`'s bytes and geometry, keeping its identity and
// autograd flags: whoever holds `target` (an optimizer, a layer member) sees the new data.
void set_data(const Tensor& target, const Tensor& source) {
  TensorImpl* impl = target.impl();
  if (impl->storage != source.storage()) {
    source.storage()->add_user_ref();
    std::shared_ptr<StorageImpl> previous = std::move(impl->storage);
    impl->storage = source.storage();
    previous->release_user_ref();
  }
  impl->sizes = source.sizes();
  impl->strides = source.strides();
  impl->offset = source.storage_offset();
  impl->dtype = source.dtype();
}

Tensor moved_to(const Tensor& tensor, Device device, const std::string& what) {
  if (tensor.device() == device) return tensor;
  if (device.is_meta()) return empty(tensor.sizes(), TensorOptions(tensor.dtype()).device(device));
  TESSEL_CHECK(!tensor.device().is_meta(), "Module::to(", device.str(), "): ", what,
               " is on the meta device and has no values to move; build the module on ",
               device.str(), " (or load a state_dict into it) instead");
  return tensor.to(device);
}

Tensor converted_to(const Tensor& tensor, DType dtype) {
  if (tensor.dtype() == dtype || !is_floating(tensor.dtype())) return tensor;
  if (tensor.device().is_meta())
    return empty(tensor.sizes(), TensorOptions(dtype).device(tensor.device()));
  return to_dtype(tensor, dtype);
}

// Applies `convert` to every parameter, gradient and buffer of `root`'s tree, in place.
template <typename Convert>
void convert_all(Module& root, Convert convert) {
  NoGradGuard no_grad;
  for (auto& [prefix, module] : root.named_modules()) {
    for (auto& [name, tensor] : module->named_parameters(/*recurse=*/false)) {
      std::string full = prefix.empty() ? name : prefix + "." + name;
      set_data(tensor, convert(tensor, full));
      Tensor grad = tensor.grad();
      if (grad.defined()) tensor.impl()->grad = convert(grad, full + ".grad").impl_ptr();
    }
    for (auto& [name, tensor] : module->named_buffers(/*recurse=*/false)) {
      set_data(tensor, convert(tensor, prefix.empty() ? name : prefix + "." + name));
    }
  }
}

std::string join(const std::vector<std::string>& parts, const std::string& separator) {
  std::string result;
  for (size_t i = 0; i < parts.size(); ++i) result += (i ? separator : "") + parts[i];
  return result;
}

}  // namespace

Module::Module(std::string name) : name_(std::move(name)) {}

Tensor Module::forward(const Tensor&) {
  TESSEL_FAIL(name_,
              " has no forward(const Tensor&): call the forward it defines, or call its "
              "submodules directly");
}

void Module::check_new_name(const std::string& name, const char* what) const {
  TESSEL_CHECK(!name.empty(), name_, ": a ", what, " name must not be empty");
  TESSEL_CHECK(name.find('.') == std::string::npos, name_, ": ", what, " name '", name,
               "' must not contain '.' (dots separate submodule names)");
  auto taken = [&](const auto& entries) {
    for (const auto& entry : entries)
      if (entry.first == name) return true;
    return false;
  };
  TESSEL_CHECK(!taken(parameters_) && !taken(buffers_) && !taken(children_), name_,
               ": cannot register ", what, " '", name,
               "': the name is already taken by a parameter, buffer or submodule");
}

Tensor Module::register_parameter(const std::string& name, Tensor tensor, bool requires_grad) {
  check_new_name(name, "parameter");
  if (!tensor.defined()) return tensor;
  TESSEL_CHECK(!requires_grad || is_floating(tensor.dtype()), name_, ": parameter '", name,
               "' has dtype ", dtype_name(tensor.dtype()),
               "; only floating-point parameters can require grad");
  TESSEL_CHECK(tensor.is_leaf(), name_, ": parameter '", name,
               "' is the result of an op; register a leaf (detach() it, or create it under "
               "NoGradGuard)");
  tensor.set_requires_grad(requires_grad);
  parameters_.emplace_back(name, tensor);
  return tensor;
}

Tensor Module::register_buffer(const std::string& name, Tensor tensor) {
  check_new_name(name, "buffer");
  if (!tensor.defined()) return tensor;
  buffers_.emplace_back(name, tensor);
  return tensor;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> module) {
  check_new_name(name, "submodule");
  TESSEL_CHECK(module != nullptr, name_, ": submodule '", name, "' is null");
  TESSEL_CHECK(module.get() != this, name_, ": a module cannot be its own submodule");
  children_.emplace_back(name, std::move(module));
}

void Module::collect_named(bool parameters, bool recurse, const std::string& prefix,
                           NamedTensors& out) const {
  for (const auto& [name, tensor] : parameters ? parameters_ : buffers_)
    out.emplace_back(prefix + name, tensor);
  if (!recurse) return;
  for (const auto& [name, child] : children_)
    child->collect_named(parameters, true, prefix + name + ".", out);
}

namespace {
NamedTensors without_duplicates(NamedTensors named) {
  std::unordered_set<const TensorImpl*> seen;
  NamedTensors unique;
  for (auto& entry : named)
    if (seen.insert(entry.second.impl()).second) unique.push_back(std::move(entry));
  return unique;
}
std::vector<Tensor> values_of(const NamedTensors& named) {
  std::vector<Tensor> values;
  values.reserve(named.size());
  for (const auto& entry : named) values.push_back(entry.second);
  return values;
}
}  // namespace

NamedTensors Module::named_parameters(bool recurse) const {
  NamedTensors named;
  collect_named(true, recurse, "", named);
  return without_duplicates(std::move(named));
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  return values_of(named_parameters(recurse));
}

NamedTensors Module::named_buffers(bool recurse) const {
  NamedTensors named;
  collect_named(false, recurse, "", named);
  return without_duplicates(std::move(named));
}

std::vector<Tensor> Module::buffers(bool recurse) const {
  return values_of(named_buffers(recurse));
}

std::vector<std::shared_ptr<Module>> Module::children() const {
  std::vector<std::shared_ptr<Module>> result;
  for (const auto& entry : children_) result.push_back(entry.second);
  return result;
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() {
  std::vector<std::pair<std::string, Module*>> result;
  std::unordered_set<const Module*> seen;
  // Explicit stack, children pushed in reverse so the walk is depth-first in registration order.
  std::vector<std::pair<std::string, Module*>> stack{{"", this}};
  while (!stack.empty()) {
    auto [prefix, module] = stack.back();
    stack.pop_back();
    if (!seen.insert(module).second) continue;
    result.emplace_back(prefix, module);
    for (auto it = module->children_.rbegin(); it != module->children_.rend(); ++it)
      stack.emplace_back(prefix.empty() ? it->first : prefix + "." + it->first, it->second.get());
  }
  return result;
}

std::vector<Module*> Module::modules() {
  std::vector<Module*> result;
  for (const auto& entry : named_modules()) result.push_back(entry.second);
  return result;
}

void Module::train(bool on) {
  for (Module* module : modules()) module->training_ = on;
}

void Module::to(Device device) {
  convert_all(*this, [&](const Tensor& tensor, const std::string& what) {
    return moved_to(tensor, device, what);
  });
}

void Module::to(DType dtype) {
  convert_all(
      *this, [&](const Tensor& tensor, const std::string&) { return converted_to(tensor, dtype); });
}

void Module::zero_grad() {
  for (const Tensor& parameter : parameters()) parameter.set_grad(Tensor());
}

void Module::collect_state(const std::string& prefix, NamedTensors& out) const {
  for (const auto& [name, tensor] : parameters_) out.emplace_back(prefix + name, tensor.detach());
  for (const auto& [name, tensor] : buffers_) out.emplace_back(prefix + name, tensor.detach());
  for (const auto& [name, child] : children_) child->collect_state(prefix + name + ".", out);
}

NamedTensors Module::state_dict() const {
  NamedTensors state;
  collect_state("", state);
  return state;
}

void Module::load_state_dict(const NamedTensors& state, bool strict) {
  std::map<std::string, Tensor> by_name;
  for (const auto& [name, tensor] : state) {
    TESSEL_CHECK(by_name.emplace(name, tensor).second, "load_state_dict: key '", name,
                 "' appears twice in the given state");
  }
  load_state_dict(by_name, strict);
}

void Module::load_state_dict(const std::map<std::string, Tensor>& state, bool strict) {
  NamedTensors targets = state_dict();
  std::vector<std::string> missing, unexpected, problems;
  std::set<std::string> known;
  std::vector<std::pair<Tensor, Tensor>> copies;  // (target, source)
  for (const auto& [name, target] : targets) {
    known.insert(name);
    auto found = state.find(name);
    if (found == state.end()) {
      if (strict) missing.push_back(name);
      continue;
    }
    const Tensor& source = found->second;
    if (!source.defined()) {
      problems.push_back("'" + name + "' is an undefined tensor");
    } else if (source.sizes() != target.sizes()) {
      problems.push_back("size mismatch for '" + name + "': the given tensor has shape " +
                         shape_str(source.sizes()) + ", the module's has shape " +
                         shape_str(target.sizes()));
    } else {
      copies.emplace_back(target, source);
    }
  }
  if (strict) {
    for (const auto& entry : state)
      if (!known.count(entry.first)) unexpected.push_back(entry.first);
  }
  if (!missing.empty()) problems.push_back("missing keys: " + join(missing, ", "));
  if (!unexpected.empty()) problems.push_back("unexpected keys: " + join(unexpected, ", "));
  TESSEL_CHECK(problems.empty(), "load_state_dict into ", name_, " failed, nothing was loaded:\n  ",
               join(problems, "\n  "));

  NoGradGuard no_grad;
  // Convert every source before writing anything, so a failed conversion leaves no partial state.
  std::vector<Tensor> sources;
  for (auto& [target, source] : copies) {
    if (target.device().is_meta()) {
      sources.emplace_back();
      continue;
    }
    Tensor converted = source.device() == target.device() ? source : source.to(target.device());
    if (converted.dtype() != target.dtype()) converted = to_dtype(converted, target.dtype());
    sources.push_back(converted);
  }
  for (size_t i = 0; i < copies.size(); ++i)
    if (sources[i].defined()) copies[i].first.copy_(sources[i]);
}

std::string Module::str() const {
  std::vector<std::string> lines;
  std::string extra = extra_repr();
  size_t extra_lines = 0;
  if (!extra.empty()) {
    std::istringstream stream(extra);
    for (std::string line; std::getline(stream, line);) lines.push_back(line), ++extra_lines;
  }
  for (const auto& [name, child] : children_) {
    std::string child_text = child->str();
    std::string indented;
    for (char c : child_text) indented += c == '\n' ? std::string("\n  ") : std::string(1, c);
    lines.push_back("(" + name + "): " + indented);
  }
  std::string text = name_ + "(";
  if (!lines.empty()) {
    if (extra_lines == 1 && children_.empty()) {
      text += lines[0];
    } else {
      text += "\n  " + join(lines, "\n  ") + "\n";
    }
  }
  return text + ")";
}

std::ostream& operator<<(std::ostream& out, const Module& module) { return out << module.str(); }

namespace detail {

std::string format_double(double value) {
  // Shortest form that reads back the same, like Python's repr (0.1, 1e-05, 0.5).
  char buffer[32];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buffer, sizeof(buffer), "%.*g", precision, value);
    if (std::strtod(buffer, nullptr) == value) break;
  }
  std::string text = buffer;
  if (text.find_first_of(".einn") == std::string::npos) text += ".0";
  return text;
}

std::string format_bool(bool value) { return value ? "True" : "False"; }

std::string format_tuple(const std::vector<int64_t>& values) {
  std::string text = "(";
  for (size_t i = 0; i < values.size(); ++i) text += (i ? ", " : "") + std::to_string(values[i]);
  if (values.size() == 1) text += ",";
  return text + ")";
}

}  // namespace detail

}  // namespace tessel::nn
