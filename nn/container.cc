#include "nn/container.h"

#include <iterator>
#include <typeinfo>

#include "nn/activation.h"
#include "nn/normalization.h"

namespace tessel::nn {

void ModuleSequence::push_back(std::shared_ptr<Module> module) {
  push_back(std::to_string(modules_.size()), std::move(module));
}

void ModuleSequence::push_back(const std::string& entry_name, std::shared_ptr<Module> module) {
  modules_.push_back(register_module(entry_name, std::move(module)));
}

const std::shared_ptr<Module>& ModuleSequence::operator[](int64_t index) const {
  const int64_t count = static_cast<int64_t>(modules_.size());
  TESSEL_CHECK(index >= -count && index < count, name(), ": index ", index, " is out of range for ",
               count, " modules");
  return modules_[index < 0 ? index + count : index];
}

Sequential::Sequential(std::initializer_list<std::shared_ptr<Module>> modules)
    : ModuleSequence("Sequential") {
  for (const auto& module : modules) push_back(module);
}

Sequential::Sequential(const std::vector<std::shared_ptr<Module>>& modules)
    : ModuleSequence("Sequential") {
  for (const auto& module : modules) push_back(module);
}

Sequential::Sequential(const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& modules)
    : ModuleSequence("Sequential") {
  for (const auto& [entry_name, module] : modules) push_back(entry_name, module);
}

Tensor Sequential::forward(const Tensor& input) {
  Tensor value = input;
  for (auto module = begin(); module != end(); ++module) {
    // A BatchNorm2d followed by a ReLU (both exactly those classes, nothing overriding their
    // forward) runs as one pass where it can: half the memory traffic of evaluation's two.
    if (std::next(module) != end() && typeid(**module) == typeid(BatchNorm2d) &&
        typeid(**std::next(module)) == typeid(ReLU)) {
      value = static_cast<BatchNorm2d&>(**module).forward_relu(value);
      ++module;
      continue;
    }
    value = (*module)->forward(value);
  }
  return value;
}

ModuleList::ModuleList(std::initializer_list<std::shared_ptr<Module>> modules)
    : ModuleSequence("ModuleList") {
  for (const auto& module : modules) push_back(module);
}

ModuleList::ModuleList(const std::vector<std::shared_ptr<Module>>& modules)
    : ModuleSequence("ModuleList") {
  for (const auto& module : modules) push_back(module);
}

}  // namespace tessel::nn
