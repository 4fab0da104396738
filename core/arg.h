// TESSEL_ARG declares one named option of an options class: a chained setter, a getter and the
// member, as libtorch's TORCH_ARG does, so option classes list fields instead of writing each
// setter out.
//   class LinearOptions { ... TESSEL_ARG(bool, bias) = true; };
//   LinearOptions(2, 3).bias(false);  options.bias();  // false
// The type must not contain a comma (use an alias). The declaration ends in private: access.
// The setter's type is spelled decltype(*this), not deduced, so setters may call each other in
// any order within the class; it takes its value by copy, so a lambda may pass a constant it does
// not capture, as with a hand-written setter.
#pragma once

#include <utility>

#define TESSEL_ARG(T, name)                          \
 public:                                             \
  auto name(T new_##name)->decltype(*this) {         \
    name##_ = std::move(new_##name);                 \
    return *this;                                    \
  }                                                  \
  const T& name() const noexcept { return name##_; } \
                                                     \
 private:                                            \
  T name##_
