// Input tensors the op tests share, with values that are exact in every float dtype, so expected
// values computed by PyTorch (or by a loop in double) compare exactly.
#pragma once

#include <cstdint>
#include <numeric>
#include <vector>

#include "core/tensor.h"

namespace tessel::testing {

// ((i * 37 + offset) % 17 - 8) / 8 over the row-major elements: the pattern the expected
// literals of the conv, pool and linalg tests were computed from (PyTorch 1.13, CPU, f64).
inline Tensor pattern(const Shape& sizes, int offset = 0, DType dtype = DType::kFloat64) {
  std::vector<double> values(static_cast<size_t>(shape_numel(sizes)));
  for (size_t i = 0; i < values.size(); ++i)
    values[i] = static_cast<double>((static_cast<int64_t>(i) * 37 + offset) % 17 - 8) / 8.0;
  return from_vector<double>(values, sizes, dtype);
}

// 0, 1, 2, ... in row-major order.
inline Tensor iota(const Shape& sizes, DType dtype = DType::kFloat64) {
  std::vector<double> values(static_cast<size_t>(shape_numel(sizes)));
  std::iota(values.begin(), values.end(), 0.0);
  return from_vector<double>(values, sizes, dtype);
}

// Expected values as a tensor (f64 unless told).
inline Tensor expected(const std::vector<double>& values, const Shape& sizes,
                       DType dtype = DType::kFloat64) {
  return from_vector<double>(values, sizes, dtype);
}

}  // namespace tessel::testing
