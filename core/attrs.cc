#include "core/attrs.h"

#include <algorithm>
#include <functional>
#include <sstream>

namespace tessel {

Attrs::Attrs(std::initializer_list<std::pair<std::string, AttrValue>> values) {
  for (const auto& [name, value] : values) set(name, value);
}

Attrs& Attrs::set(const std::string& name, AttrValue value) {
  auto it =
      std::lower_bound(values_.begin(), values_.end(), name,
                       [](const auto& item, const std::string& key) { return item.first < key; });
  if (it != values_.end() && it->first == name) {
    it->second = std::move(value);
  } else {
    values_.insert(it, {name, std::move(value)});
  }
  return *this;
}

const AttrValue* Attrs::find(const std::string& name) const {
  auto it =
      std::lower_bound(values_.begin(), values_.end(), name,
                       [](const auto& item, const std::string& key) { return item.first < key; });
  return it != values_.end() && it->first == name ? &it->second : nullptr;
}

namespace {
void print_value(std::ostringstream& out, const AttrValue& value) {
  std::visit(
      [&](const auto& v) {
        using V = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<V, std::vector<int64_t>> ||
                      std::is_same_v<V, std::vector<double>>) {
          detail::stream_one(out, v);
        } else if constexpr (std::is_same_v<V, bool>) {
          out << (v ? "true" : "false");
        } else {
          out << v;
        }
      },
      value);
}
}  // namespace

std::string Attrs::str() const {
  std::ostringstream out;
  out << '{';
  for (size_t i = 0; i < values_.size(); ++i) {
    out << (i ? ", " : "") << values_[i].first << '=';
    print_value(out, values_[i].second);
  }
  out << '}';
  return out.str();
}

size_t Attrs::hash() const { return std::hash<std::string>{}(str()); }

}  // namespace tessel
