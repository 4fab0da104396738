#include "core/shape.h"

#include "core/error.h"

namespace tessel {

int64_t shape_numel(const Shape& sizes) {
  int64_t numel = 1;
  for (int64_t size : sizes) numel *= size;
  return numel;
}

Shape contiguous_strides(const Shape& sizes) {
  Shape strides(sizes.size());
  int64_t stride = 1;
  for (int64_t i = static_cast<int64_t>(sizes.size()) - 1; i >= 0; --i) {
    strides[i] = stride;
    stride *= std::max<int64_t>(sizes[i], 1);
  }
  return strides;
}

std::string shape_str(const Shape& sizes) { return detail::str_cat(sizes); }

int64_t wrap_dim(int64_t dim, int64_t ndim, const char* what) {
  int64_t limit = std::max<int64_t>(ndim, 1);  // a 0-d tensor accepts dim 0 and -1
  TESSEL_CHECK(dim >= -limit && dim < limit, what, " ", dim, " is out of range for a ", ndim,
               "-d tensor (expected in [", -limit, ", ", limit - 1, "])");
  return dim < 0 ? dim + limit : dim;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  size_t ndim = std::max(a.size(), b.size());
  Shape out(ndim);
  for (size_t i = 0; i < ndim; ++i) {
    int64_t size_a = i < ndim - a.size() ? 1 : a[i - (ndim - a.size())];
    int64_t size_b = i < ndim - b.size() ? 1 : b[i - (ndim - b.size())];
    TESSEL_CHECK(size_a == size_b || size_a == 1 || size_b == 1, op, ": shapes ", shape_str(a),
                 " and ", shape_str(b), " cannot be broadcast (dimension ", i, ": ", size_a, " vs ",
                 size_b, ")");
    out[i] = size_a == 1 ? size_b : size_a;
  }
  return out;
}

bool broadcastable_to(const Shape& from, const Shape& to) {
  if (from.size() > to.size()) return false;
  size_t lead = to.size() - from.size();
  for (size_t i = 0; i < from.size(); ++i)
    if (from[i] != 1 && from[i] != to[lead + i]) return false;
  return true;
}

}  // namespace tessel
