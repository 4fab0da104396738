// Small value types shared by layer options: IntPair is one number used for both spatial
// dimensions or an explicit {height, width}, as PyTorch accepts for kernel sizes and strides.
//   Conv2dOptions(3, 8, 3).stride({2, 1});   // kernel (3, 3), stride (2, 1)
#pragma once

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "core/error.h"

namespace tessel::nn {

struct IntPair {
  int64_t first = 0;
  int64_t second = 0;

  IntPair(int64_t both) : first(both), second(both) {}  // NOLINT: implicit, as in libtorch
  IntPair(int64_t first_value, int64_t second_value) : first(first_value), second(second_value) {}
  IntPair(std::initializer_list<int64_t> values) {  // NOLINT
    TESSEL_CHECK(values.size() == 1 || values.size() == 2,
                 "expected one number or two ({height, width}), got ", values.size());
    first = *values.begin();
    second = *(values.end() - 1);
  }
  std::vector<int64_t> vec() const { return {first, second}; }
  bool both(int64_t value) const { return first == value && second == value; }
  bool operator==(const IntPair& other) const {
    return first == other.first && second == other.second;
  }
};

}  // namespace tessel::nn
