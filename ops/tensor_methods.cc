// The Tensor methods declared under "Ops as methods" in core/tensor.h: each forwards to the free
// function of ops/ops.h (so it goes through the dispatcher), or to an in-place dispatch with the
// tensor itself as the out= tensor. Also the comparison operators and operator<< for tensors.
#include <cmath>
#include <iomanip>
#include <limits>
#include <ostream>
#include <sstream>

#include "core/autograd.h"
#include "core/op.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/linalg.h"
#include "ops/ops.h"
#include "ops/reduce.h"
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
Tensor Tensor::squeeze() const {
  Shape kept;
  for (int64_t size : sizes())
    if (size != 1) kept.push_back(size);
  return tessel::view(*this, kept);
}
Tensor Tensor::squeeze(int64_t dim) const { return tessel::squeeze(*this, dim); }
Tensor Tensor::unsqueeze(int64_t dim) const { return tessel::unsqueeze(*this, dim); }
Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  return tessel::flatten(*this, start_dim, end_dim);
}
std::vector<Tensor> Tensor::split(int64_t split_size, int64_t dim) const {
  return tessel::split(*this, split_size, dim);
}
std::vector<Tensor> Tensor::chunk(int64_t chunks, int64_t dim) const {
  return tessel::chunk(*this, chunks, dim);
}
Tensor Tensor::index_select(int64_t dim, const Tensor& index) const {
  return tessel::index_select(*this, dim, index);
}
Tensor Tensor::gather(int64_t dim, const Tensor& index) const {
  return tessel::gather(*this, dim, index);
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

// ---- element-wise math ----

Tensor Tensor::add(const Tensor& other, double alpha) const {
  return tessel::add(*this, other, alpha);
}
Tensor Tensor::add(double other) const { return tessel::add(*this, other); }
Tensor Tensor::sub(const Tensor& other, double alpha) const {
  return tessel::sub(*this, other, alpha);
}
Tensor Tensor::sub(double other) const { return tessel::sub(*this, other); }
Tensor Tensor::mul(const Tensor& other) const { return tessel::mul(*this, other); }
Tensor Tensor::mul(double other) const { return tessel::mul(*this, other); }
Tensor Tensor::div(const Tensor& other) const { return tessel::div(*this, other); }
Tensor Tensor::div(double other) const { return tessel::div(*this, other); }
Tensor Tensor::pow(const Tensor& exponent) const { return tessel::pow(*this, exponent); }
Tensor Tensor::pow(double exponent) const { return tessel::pow(*this, exponent); }
Tensor Tensor::maximum(const Tensor& other) const { return tessel::maximum(*this, other); }
Tensor Tensor::minimum(const Tensor& other) const { return tessel::minimum(*this, other); }
Tensor Tensor::neg() const { return tessel::neg(*this); }
Tensor Tensor::abs() const { return tessel::abs(*this); }
Tensor Tensor::exp() const { return tessel::exp(*this); }
Tensor Tensor::log() const { return tessel::log(*this); }
Tensor Tensor::sqrt() const { return tessel::sqrt(*this); }
Tensor Tensor::rsqrt() const { return tessel::rsqrt(*this); }
Tensor Tensor::tanh() const { return tessel::tanh(*this); }
Tensor Tensor::sigmoid() const { return tessel::sigmoid(*this); }
Tensor Tensor::relu() const { return tessel::relu(*this); }
Tensor Tensor::gelu(const std::string& approximate) const {
  return tessel::gelu(*this, approximate);
}
Tensor Tensor::clamp(double min, double max) const { return tessel::clamp(*this, min, max); }
Tensor Tensor::clamp_min(double min) const {
  return tessel::clamp(*this, min, std::numeric_limits<double>::infinity());
}
Tensor Tensor::clamp_max(double max) const {
  return tessel::clamp(*this, -std::numeric_limits<double>::infinity(), max);
}
Tensor Tensor::masked_fill(const Tensor& mask, double value) const {
  return tessel::masked_fill(*this, mask, value);
}

// ---- comparisons ----

Tensor Tensor::eq(const Tensor& other) const { return tessel::eq(*this, other); }
Tensor Tensor::ne(const Tensor& other) const { return tessel::ne(*this, other); }
Tensor Tensor::lt(const Tensor& other) const { return tessel::lt(*this, other); }
Tensor Tensor::le(const Tensor& other) const { return tessel::le(*this, other); }
Tensor Tensor::gt(const Tensor& other) const { return tessel::gt(*this, other); }
Tensor Tensor::ge(const Tensor& other) const { return tessel::ge(*this, other); }
Tensor Tensor::eq(double other) const { return tessel::eq(*this, other); }
Tensor Tensor::ne(double other) const { return tessel::ne(*this, other); }
Tensor Tensor::lt(double other) const { return tessel::lt(*this, other); }
Tensor Tensor::le(double other) const { return tessel::le(*this, other); }
Tensor Tensor::gt(double other) const { return tessel::gt(*this, other); }
Tensor Tensor::ge(double other) const { return tessel::ge(*this, other); }

namespace {

// The 0-d tensor a scalar comparison broadcasts: x's dtype when that is floating point (as
// libtorch, a Python-style scalar does not promote a float tensor), else i64 for a whole number
// and f64 for any other, so that an integer tensor compared with 2.5 is not compared with 2.
Tensor comparison_scalar(const Tensor& x, double value) {
  DType dtype = x.dtype();
  if (!is_floating(dtype)) {
    const bool whole =
        std::isfinite(value) && std::trunc(value) == value && std::abs(value) < 9.2e18;  // fits i64
    dtype = whole ? DType::kInt64 : DType::kFloat64;
  }
  return full({}, value, TensorOptions(dtype).device(x.device()));
}

}  // namespace

Tensor eq(const Tensor& a, double b) { return eq(a, comparison_scalar(a, b)); }
Tensor ne(const Tensor& a, double b) { return ne(a, comparison_scalar(a, b)); }
Tensor lt(const Tensor& a, double b) { return lt(a, comparison_scalar(a, b)); }
Tensor le(const Tensor& a, double b) { return le(a, comparison_scalar(a, b)); }
Tensor gt(const Tensor& a, double b) { return gt(a, comparison_scalar(a, b)); }
Tensor ge(const Tensor& a, double b) { return ge(a, comparison_scalar(a, b)); }

Tensor operator==(const Tensor& a, const Tensor& b) { return eq(a, b); }
Tensor operator!=(const Tensor& a, const Tensor& b) { return ne(a, b); }
Tensor operator<(const Tensor& a, const Tensor& b) { return lt(a, b); }
Tensor operator<=(const Tensor& a, const Tensor& b) { return le(a, b); }
Tensor operator>(const Tensor& a, const Tensor& b) { return gt(a, b); }
Tensor operator>=(const Tensor& a, const Tensor& b) { return ge(a, b); }
Tensor operator==(const Tensor& a, double b) { return eq(a, b); }
Tensor operator!=(const Tensor& a, double b) { return ne(a, b); }
Tensor operator<(const Tensor& a, double b) { return lt(a, b); }
Tensor operator<=(const Tensor& a, double b) { return le(a, b); }
Tensor operator>(const Tensor& a, double b) { return gt(a, b); }
Tensor operator>=(const Tensor& a, double b) { return ge(a, b); }
// A scalar on the left: 2 < x is x > 2.
Tensor operator==(double a, const Tensor& b) { return eq(b, a); }
Tensor operator!=(double a, const Tensor& b) { return ne(b, a); }
Tensor operator<(double a, const Tensor& b) { return gt(b, a); }
Tensor operator<=(double a, const Tensor& b) { return ge(b, a); }
Tensor operator>(double a, const Tensor& b) { return lt(b, a); }
Tensor operator>=(double a, const Tensor& b) { return le(b, a); }

// ---- reductions ----

Tensor Tensor::sum() const { return tessel::sum(*this); }
Tensor Tensor::sum(const std::vector<int64_t>& dims, bool keepdim) const {
  return tessel::sum(*this, dims, keepdim);
}
Tensor Tensor::mean() const { return tessel::mean(*this); }
Tensor Tensor::mean(const std::vector<int64_t>& dims, bool keepdim) const {
  return tessel::mean(*this, dims, keepdim);
}
Tensor Tensor::var(const std::vector<int64_t>& dims, bool unbiased, bool keepdim) const {
  return tessel::var(*this, dims, unbiased, keepdim);
}
Tensor Tensor::max() const { return tessel::max(*this); }
Tensor Tensor::min() const { return tessel::min(*this); }

// The "max" and "min" ops produce values and indices; the free functions return the values.
std::tuple<Tensor, Tensor> Tensor::max(int64_t dim, bool keepdim) const {
  auto outputs = dispatch(ops::max, {*this}, Attrs{{"dim", dim}, {"keepdim", keepdim}});
  return {outputs.at(0), outputs.at(1)};
}
std::tuple<Tensor, Tensor> Tensor::min(int64_t dim, bool keepdim) const {
  auto outputs = dispatch(ops::min, {*this}, Attrs{{"dim", dim}, {"keepdim", keepdim}});
  return {outputs.at(0), outputs.at(1)};
}

Tensor Tensor::argmax() const { return tessel::argmax(tessel::reshape(*this, {-1}), 0); }
Tensor Tensor::argmax(int64_t dim, bool keepdim) const {
  return tessel::argmax(*this, dim, keepdim);
}
Tensor Tensor::softmax(int64_t dim) const { return tessel::softmax(*this, dim); }
Tensor Tensor::log_softmax(int64_t dim) const { return tessel::log_softmax(*this, dim); }
Tensor Tensor::matmul(const Tensor& other) const { return tessel::matmul(*this, other); }

// ---- in place ----

namespace {

// libtorch refuses in-place ops on leaves that require grad: their gradient would describe
// values that no longer exist. Checked before the dispatcher's more general rule (no in-place
// write is recorded) so the message names the usual fix.
void check_in_place(const Tensor& self, const char* what) {
  TESSEL_CHECK(!(GradMode::is_enabled() && self.requires_grad() && self.is_leaf()), what,
               ": a leaf tensor that requires grad (shape ", shape_str(self.sizes()),
               ") cannot be modified in place while gradients are recorded; wrap the update in "
               "NoGradGuard (as optimizers do), or use the out-of-place form (x = x + y)");
}

// Runs `op` with `self` as its out= tensor and returns `self`.
Tensor& dispatch_in_place(Tensor& self, const char* what, const OpHandle& op,
                          const std::vector<Tensor>& inputs, Attrs attrs = {}) {
  check_in_place(self, what);
  dispatch(op, inputs, std::move(attrs), {self});
  return self;
}

}  // namespace

Tensor& Tensor::zero_() { return fill_(0.0); }

Tensor& Tensor::fill_(double value) {
  return dispatch_in_place(*this, "fill_", ops::fill_, {*this}, Attrs{{"value", value}});
}

Tensor& Tensor::copy_(const Tensor& source) {
  return dispatch_in_place(*this, "copy_", ops::copy_, {*this, source});
}

Tensor& Tensor::add_(const Tensor& other, double alpha) {
  return dispatch_in_place(*this, "add_", ops::add, {*this, other}, Attrs{{"alpha", alpha}});
}

Tensor& Tensor::add_(double value) {
  return dispatch_in_place(*this, "add_", ops::add_scalar, {*this}, Attrs{{"value", value}});
}

Tensor& Tensor::sub_(const Tensor& other, double alpha) {
  return dispatch_in_place(*this, "sub_", ops::sub, {*this, other}, Attrs{{"alpha", alpha}});
}

Tensor& Tensor::sub_(double value) {
  return dispatch_in_place(*this, "sub_", ops::add_scalar, {*this}, Attrs{{"value", -value}});
}

Tensor& Tensor::mul_(const Tensor& other) {
  return dispatch_in_place(*this, "mul_", ops::mul, {*this, other});
}

Tensor& Tensor::mul_(double value) {
  return dispatch_in_place(*this, "mul_", ops::mul_scalar, {*this}, Attrs{{"value", value}});
}

Tensor& Tensor::div_(const Tensor& other) {
  return dispatch_in_place(*this, "div_", ops::div, {*this, other});
}

Tensor& Tensor::div_(double value) {
  return dispatch_in_place(*this, "div_", ops::div_scalar, {*this}, Attrs{{"value", value}});
}

Tensor& Tensor::addmm_(const Tensor& a, const Tensor& b) {
  return dispatch_in_place(*this, "addmm_", ops::addmm, {*this, a, b});
}

// ---- printing ----

namespace {

constexpr int64_t kSummarizeAbove = 1000;  // elements; PyTorch's print threshold
constexpr int64_t kEdgeItems = 3;          // kept at each end of a summarized dimension

// Values as text, all of one width, in the style PyTorch uses for the whole tensor: fixed with
// four decimals, or scientific when the magnitudes are very large or very small.
std::vector<std::string> format_values(const Tensor& values) {
  std::vector<std::string> text;
  if (is_floating(values.dtype())) {
    const auto numbers = values.to_vector<double>();
    double largest = 0, smallest = std::numeric_limits<double>::infinity();
    for (double value : numbers) {
      if (!std::isfinite(value) || value == 0) continue;
      largest = std::max(largest, std::abs(value));
      smallest = std::min(smallest, std::abs(value));
    }
    const bool scientific = largest >= 1e8 || smallest < 1e-4;
    for (double value : numbers) {
      std::ostringstream out;
      if (std::isnan(value)) {
        out << "nan";
      } else if (std::isinf(value)) {
        out << (value < 0 ? "-inf" : "inf");
      } else {
        out << (scientific ? std::scientific : std::fixed) << std::setprecision(4) << value;
      }
      text.push_back(out.str());
    }
  } else {
    const auto numbers = values.to_vector<int64_t>();
    for (int64_t value : numbers) {
      if (values.dtype() == DType::kBool) {
        text.push_back(value ? "true" : "false");
      } else {
        text.push_back(std::to_string(value));
      }
    }
  }
  size_t width = 0;
  for (const auto& item : text) width = std::max(width, item.size());
  for (auto& item : text) item.insert(0, width - item.size(), ' ');
  return text;
}

// Writes dimension `dim` of the row-major values starting at `*next`, with "..." where
// `summarized[dim]` marks that only the edge items were kept.
void write_nested(std::ostream& out, const std::vector<std::string>& text, const Shape& sizes,
                  const std::vector<bool>& summarized, size_t dim, size_t* next, size_t indent) {
  if (dim == sizes.size()) {
    out << text[(*next)++];
    return;
  }
  const size_t rank = sizes.size();
  const bool innermost = dim + 1 == rank;
  // Between rows: a comma, a newline per remaining dimension (a blank line between matrices),
  // then the indentation of this bracket's contents.
  const std::string separator =
      innermost ? ", " : "," + std::string(rank - dim - 1, '\n') + std::string(indent + 1, ' ');
  out << '[';
  for (int64_t i = 0; i < sizes[dim]; ++i) {
    if (i > 0) out << separator;
    if (summarized[dim] && i == kEdgeItems) out << "..." << separator;
    write_nested(out, text, sizes, summarized, dim + 1, next, indent + 1);
  }
  out << ']';
}

}  // namespace

std::ostream& operator<<(std::ostream& out, const Tensor& tensor) {
  if (!tensor.defined()) return out << "tensor(undefined)";
  const std::string prefix = "tensor(";
  out << prefix;
  if (tensor.device().is_meta()) {
    out << "...";  // a meta tensor has a shape but no values
  } else {
    NoGradGuard no_grad;  // the slicing below is not part of any computation
    Tensor shown = tensor;
    std::vector<bool> summarized(static_cast<size_t>(tensor.dim()), false);
    if (tensor.numel() > kSummarizeAbove) {
      for (int64_t d = 0; d < tensor.dim(); ++d) {
        const int64_t size = shown.size(d);
        if (size <= 2 * kEdgeItems) continue;
        shown = cat(
            {shown.narrow(d, 0, kEdgeItems), shown.narrow(d, size - kEdgeItems, kEdgeItems)}, d);
        summarized[static_cast<size_t>(d)] = true;
      }
    }
    const std::vector<std::string> text = format_values(shown);
    size_t next = 0;
    write_nested(out, text, shown.sizes(), summarized, 0, &next, prefix.size());
  }
  out << ", shape=" << shape_str(tensor.sizes()) << ", dtype=" << dtype_name(tensor.dtype())
      << ", device=" << tensor.device();
  if (tensor.requires_grad()) out << ", requires_grad";
  return out << ')';
}

}  // namespace tessel
