// Op attributes: a small sorted map from name to value that can be stored in op records,
// compared, hashed and printed.
//   Attrs attrs{{"stride", std::vector<int64_t>{1, 1}}, {"groups", int64_t{1}}};
//   int64_t groups = attrs.get<int64_t>("groups");
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "core/error.h"

namespace tessel {

using AttrValue =
    std::variant<bool, int64_t, double, std::string, std::vector<int64_t>, std::vector<double>>;

class Attrs {
 public:
  Attrs() = default;
  Attrs(std::initializer_list<std::pair<std::string, AttrValue>> values);

  Attrs& set(const std::string& name, AttrValue value);
  bool has(const std::string& name) const { return find(name) != nullptr; }
  template <typename T>
  const T& get(const std::string& name) const {
    const AttrValue* value = find(name);
    TESSEL_CHECK(value != nullptr, "missing attribute '", name, "'");
    const T* typed = std::get_if<T>(value);
    TESSEL_CHECK(typed != nullptr, "attribute '", name, "' has another type");
    return *typed;
  }
  template <typename T>
  T get_or(const std::string& name, T fallback) const {
    const AttrValue* value = find(name);
    if (!value) return fallback;
    const T* typed = std::get_if<T>(value);
    return typed ? *typed : fallback;
  }
  const std::vector<std::pair<std::string, AttrValue>>& items() const { return values_; }
  bool operator==(const Attrs& other) const { return values_ == other.values_; }
  bool operator!=(const Attrs& other) const { return !(*this == other); }
  size_t hash() const;
  std::string str() const;  // {groups=1, stride=[1, 1]}

 private:
  const AttrValue* find(const std::string& name) const;
  std::vector<std::pair<std::string, AttrValue>> values_;  // sorted by name
};

}  // namespace tessel
