// Containers: Sequential chains its modules' forward and names them "0", "1", ... (or the names
// given); ModuleList only holds modules, so their parameters are registered and named.
//   Sequential mlp(std::make_shared<Linear>(784, 128), std::make_shared<ReLU>(), ...);
//   Sequential small(Linear(4, 2), ReLU());  // modules by value are moved into shared_ptrs
#pragma once

#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "nn/module.h"

namespace tessel::nn {

namespace detail {
template <typename T>
struct is_module_pointer : std::false_type {};
template <typename M>
struct is_module_pointer<std::shared_ptr<M>> : std::is_base_of<Module, M> {};

// What the variadic container constructors take: a shared_ptr to a module, or a module object
// given as an rvalue (an lvalue would have to be copied, and modules are not copyable).
template <typename Arg>
constexpr bool is_module_argument_v = is_module_pointer<std::decay_t<Arg>>::value ||
                                      (std::is_base_of_v<Module, std::decay_t<Arg>> &&
                                       !std::is_lvalue_reference_v<Arg>);

template <typename... Args>
using enable_if_modules_t =
    std::enable_if_t<(sizeof...(Args) > 0) && (is_module_argument_v<Args> && ...)>;
}  // namespace detail

// Shared by Sequential and ModuleList: an ordered list of submodules with indexing.
class ModuleSequence : public Module {
 public:
  using value_type = std::shared_ptr<Module>;

  // Appends with the next index as its name ("0", "1", ...).
  void push_back(std::shared_ptr<Module> module);
  void push_back(const std::string& name, std::shared_ptr<Module> module);
  // Negative indices count from the end.
  const std::shared_ptr<Module>& operator[](int64_t index) const;
  // The module at `index` as its concrete type; an error when it is another type.
  template <typename M>
  std::shared_ptr<M> at(int64_t index) const {
    auto typed = std::dynamic_pointer_cast<M>((*this)[index]);
    TESSEL_CHECK(typed != nullptr, name(), ": module ", index, " is a ", (*this)[index]->name(),
                 ", not the type asked for");
    return typed;
  }
  size_t size() const { return modules_.size(); }
  bool empty() const { return modules_.empty(); }
  std::vector<std::shared_ptr<Module>>::const_iterator begin() const { return modules_.begin(); }
  std::vector<std::shared_ptr<Module>>::const_iterator end() const { return modules_.end(); }

 protected:
  explicit ModuleSequence(std::string name) : Module(std::move(name)) {}

  template <typename Arg>
  static std::shared_ptr<Module> to_module_pointer(Arg&& module) {
    if constexpr (detail::is_module_pointer<std::decay_t<Arg>>::value) {
      return std::forward<Arg>(module);
    } else {
      return std::make_shared<std::decay_t<Arg>>(std::move(module));
    }
  }

 private:
  std::vector<std::shared_ptr<Module>> modules_;
};

class Sequential : public ModuleSequence {
 public:
  Sequential() : ModuleSequence("Sequential") {}
  Sequential(std::initializer_list<std::shared_ptr<Module>> modules);
  // Sequential(std::make_shared<Linear>(2, 3), std::make_shared<ReLU>()) or, by value,
  // Sequential(Linear(2, 3), ReLU()); the two forms mix.
  template <typename... Modules, typename = detail::enable_if_modules_t<Modules...>>
  explicit Sequential(Modules&&... modules) : ModuleSequence("Sequential") {
    (push_back(to_module_pointer(std::forward<Modules>(modules))), ...);
  }
  explicit Sequential(const std::vector<std::shared_ptr<Module>>& modules);
  // Named entries, like PyTorch's Sequential(OrderedDict(...)).
  explicit Sequential(const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& modules);
  // Each module's forward(const Tensor&) in turn.
  Tensor forward(const Tensor& input) override;
};

class ModuleList : public ModuleSequence {
 public:
  ModuleList() : ModuleSequence("ModuleList") {}
  ModuleList(std::initializer_list<std::shared_ptr<Module>> modules);
  template <typename... Modules, typename = detail::enable_if_modules_t<Modules...>>
  explicit ModuleList(Modules&&... modules) : ModuleSequence("ModuleList") {
    (push_back(to_module_pointer(std::forward<Modules>(modules))), ...);
  }
  explicit ModuleList(const std::vector<std::shared_ptr<Module>>& modules);
};

}  // namespace tessel::nn
