// Shapes and strides, in elements. For a contiguous (row-major) tensor of sizes s,
// stride[i] = prod(s[i+1:]); element (i0, i1, ...) lives at offset + sum(i_k * stride[k]).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessel {

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& sizes);
Shape contiguous_strides(const Shape& sizes);
std::string shape_str(const Shape& sizes);  // "[2, 3]"
// Wraps a possibly negative dimension into [0, ndim); throws naming `what` when out of range.
int64_t wrap_dim(int64_t dim, int64_t ndim, const char* what = "dim");
// shape[dim], a negative dim counting from the end; throws as wrap_dim when out of range. Inline:
// every op reads sizes this way, often many times per call.
inline int64_t shape_entry(const Shape& shape, int64_t dim) {
  const auto ndim = static_cast<int64_t>(shape.size());
  const int64_t wrapped = dim < 0 ? dim + ndim : dim;
  return shape[wrapped >= 0 && wrapped < ndim ? wrapped : wrap_dim(dim, ndim)];
}
// NumPy broadcasting of two shapes; throws naming both when they are incompatible.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op = "broadcast");
// True when `from` can be broadcast to `to`.
bool broadcastable_to(const Shape& from, const Shape& to);

}  // namespace tessel
