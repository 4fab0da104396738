// Module: the base of every layer (libtorch's C++ frontend, without its template machinery).
// Register parameters, buffers and submodules in the constructor; they get dotted names that
// state_dict()/load_state_dict() use:   fc = register_module("fc", std::make_shared<Linear>(4, 2));
#pragma once

#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"

namespace tessel::nn {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

class Module {
 public:
  // `name` is the type name shown when printing ("Linear", "Sequential").
  explicit Module(std::string name = "Module");
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;
  // Moving keeps parameters, buffers and children together (they are shared handles), so a
  // layer built by value can be handed over: Sequential(Linear(2, 3), ReLU()).
  Module(Module&&) = default;

  const std::string& name() const { return name_; }

  // The one-tensor forward; modules with other signatures define their own and leave this one
  // throwing.
  virtual Tensor forward(const Tensor& input);
  Tensor operator()(const Tensor& input) { return forward(input); }

  // Registration. Names are unique within a module across parameters, buffers and submodules,
  // non-empty and without dots. An undefined parameter (a layer built without bias) is accepted
  // and left out of every listing, as PyTorch does with None.
  Tensor register_parameter(const std::string& name, Tensor tensor, bool requires_grad = true);
  Tensor register_buffer(const std::string& name, Tensor tensor);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    add_child(name, module);
    return module;
  }

  // Listings in registration order: a module's own entries first, then each child's,
  // depth-first, with dotted names. Tensors shared by several modules (tied weights) are listed
  // once, under their first name.
  std::vector<Tensor> parameters(bool recurse = true) const;
  NamedTensors named_parameters(bool recurse = true) const;
  std::vector<Tensor> buffers(bool recurse = true) const;
  NamedTensors named_buffers(bool recurse = true) const;
  std::vector<std::shared_ptr<Module>> children() const;
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& named_children() const {
    return children_;
  }
  // This module first, then every descendant depth-first (each once); "" names this module.
  std::vector<Module*> modules();
  std::vector<std::pair<std::string, Module*>> named_modules();

  // Training mode, recursively (dropout, batch norm statistics).
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // Moves every parameter and buffer (and gradient) in place, so tensors held elsewhere (an
  // optimizer, a layer's `weight` member) follow. To the meta device this makes shape-only
  // copies. to(dtype) converts floating-point tensors only (num_batches_tracked stays i64).
  void to(Device device);
  void to(DType dtype);

  // Sets every parameter's gradient to undefined.
  void zero_grad();

  // Parameters then buffers of each module, then its children, with dotted names (PyTorch's
  // order). The tensors share storage with the module and carry no autograd history.
  NamedTensors state_dict() const;
  // Checks everything first (missing and unexpected keys when strict, shape mismatches always)
  // and throws one tessel::Error listing every problem, leaving the module unchanged; then copies
  // the values in place, converting dtype and device.
  void load_state_dict(const std::map<std::string, Tensor>& state, bool strict = true);
  void load_state_dict(const NamedTensors& state, bool strict = true);

  // The module tree as PyTorch prints it.
  std::string str() const;
  // The part inside the parentheses of this module's line ("in_features=3, out_features=4").
  virtual std::string extra_repr() const { return ""; }

 private:
  void check_new_name(const std::string& name, const char* what) const;
  void add_child(const std::string& name, std::shared_ptr<Module> module);
  void collect_named(bool parameters, bool recurse, const std::string& prefix,
                     NamedTensors& out) const;
  void collect_state(const std::string& prefix, NamedTensors& out) const;

  std::string name_;
  bool training_ = true;
  NamedTensors parameters_;
  NamedTensors buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
};

std::ostream& operator<<(std::ostream& out, const Module& module);

namespace detail {
// Python-style rendering used by extra_repr: 1e-05, 0.1, True, (3, 3).
std::string format_double(double value);
std::string format_bool(bool value);
std::string format_tuple(const std::vector<int64_t>& values);
}  // namespace detail

}  // namespace tessel::nn
