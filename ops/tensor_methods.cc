// The Tensor methods declared under "Ops as methods" in core/tensor.h: each forwards to the free
// function of ops/ops.h (so it goes through the dispatcher), or to an in-place dispatch with the
// tensor itself as the out= tensor.
#include "core/op.h"
#include "ops/ops.h"
#include "ops/registry_helpers.h"
#include "ops/transfer.h"

namespace tessel {

Tensor Tensor::view(const Shape& sizes) const { return tessel::view(*this, sizes); }
Tensor Tensor::reshape(const Shape& sizes) const { return tessel::reshape(*this, sizes); }
Tensor Tensor::transpose(int64_t dim0, int64_t dim1) const {
  return tessel::transpose(*this, dim0, dim1);
}

Tensor Tensor::t() const {
  TESSEL_CHECK(dim() == 2, "t: expected a 2-D tensor, got shape ", shape_str(sizes()),
               " (use transpose(dim0, dim1) or permute for other ranks)");
  return tessel::transpose(*this, 0, 1);
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  return tessel::permute(*this, dims);
}
Tensor Tensor::narrow(int64_t dim, int64_t start, int64_t length) const {
  return tessel::narrow(*this, dim, start, length);
}
Tensor Tensor::slice(int64_t dim, int64_t start, int64_t end, int64_t step) const {
  return tessel::slice(*this, dim, start, end, step);
}
Tensor Tensor::select(int64_t dim, int64_t index) const {
  return tessel::select(*this, dim, index);
}
Tensor Tensor::expand(const Shape& sizes) const { return tessel::expand(*this, sizes); }
Tensor Tensor::squeeze(int64_t dim) const { return tessel::squeeze(*this, dim); }
Tensor Tensor::unsqueeze(int64_t dim) const { return tessel::unsqueeze(*this, dim); }
Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  return tessel::flatten(*this, start_dim, end_dim);
}
Tensor Tensor::contiguous() const { return tessel::contiguous(*this); }
Tensor Tensor::clone() const { return tessel::clone(*this); }

Tensor Tensor::to(DType target) const {
  if (dtype() == target) return *this;
  return tessel::to_dtype(*this, target);
}

Tensor Tensor::to(Device target) const {
  if (device() == target) return *this;
  if (target.is_meta()) return empty(sizes(), TensorOptions(dtype()).device(target));
  TESSEL_CHECK(!device().is_meta(), "to(", target.str(), "): a meta tensor (shape ",
               shape_str(sizes()), ") has no data to move");
  return to_device(*this, target);  // ops/transfer.cc
}

Tensor Tensor::sum() const { return tessel::sum(*this); }
Tensor Tensor::sum(const std::vector<int64_t>& dims, bool keepdim) const {
  return tessel::sum(*this, dims, keepdim);
}
Tensor Tensor::mean() const { return tessel::mean(*this); }
Tensor Tensor::mean(const std::vector<int64_t>& dims, bool keepdim) const {
  return tessel::mean(*this, dims, keepdim);
}
Tensor Tensor::matmul(const Tensor& other) const { return tessel::matmul(*this, other); }

Tensor& Tensor::zero_() { return fill_(0.0); }

Tensor& Tensor::fill_(double value) {
  static const OpDef& op = ops::op("fill_");
  dispatch(op, {*this}, Attrs{{"value", value}}, {*this});
  return *this;
}

Tensor& Tensor::copy_(const Tensor& source) {
  static const OpDef& op = ops::op("copy_");
  dispatch(op, {*this, source}, {}, {*this});
  return *this;
}

Tensor& Tensor::add_(const Tensor& other, double alpha) {
  static const OpDef& op = ops::op("add");
  dispatch(op, {*this, other}, Attrs{{"alpha", alpha}}, {*this});
  return *this;
}

Tensor& Tensor::mul_(double value) {
  static const OpDef& op = ops::op("mul_scalar");
  dispatch(op, {*this}, Attrs{{"value", value}}, {*this});
  return *this;
}

}  // namespace tessel
