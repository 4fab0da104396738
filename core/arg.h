// TESSEL_ARG declares one named option of an options class: a chained setter, a getter and the
// member, as libtorch's TORCH_ARG does, so option classes list fields instead of writing each
// setter out.
//   class LinearOptions { ... TESSEL_ARG(bool, bias) = true; };
//   LinearOptions(2, 3).bias(false);  options.bias();  // false
// The type must not contain a comma (use an alias). The declaration ends in private: access.
// The setter's type is spelled decltype(*this), not deduced, so setters may call each other in
// any order within the class.
#pragma once

#define TESSEL_ARG(T, name)                          \
 public:                                             \
  auto name(const T& new_##name)->decltype(*this) {  \
    name##_ = new_##name;                            \
    return *this;                                    \
  }                                                  \
  const T& name() const noexcept { return name##_; } \
                                                     \
 private:                                            \
  T name##_
