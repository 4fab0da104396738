// Tensor: a value-semantics handle (like torch::Tensor) to a strided view of a storage, with
// autograd state. Copying a Tensor shares it; ops create new ones through the dispatcher.
//   Tensor w = tessel::randn({3, 4}).set_requires_grad(true);
//   Tensor loss = tessel::matmul(x, w).sum();  loss.backward();  w.grad();
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/shape.h"
#include "core/storage.h"

namespace tessel {

class Tensor;
class Node;

// Options for tensor factories, with fluent setters: TensorOptions().dtype(DType::kFloat64).
struct TensorOptions {
  DType dtype_ = DType::kFloat32;
  Device device_ = Device::cpu();
  bool requires_grad_ = false;

  TensorOptions() = default;
  TensorOptions(DType dtype) : dtype_(dtype) {}      // NOLINT: implicit, as in libtorch
  TensorOptions(Device device) : device_(device) {}  // NOLINT
  TensorOptions dtype(DType dtype) const {
    auto copy = *this;
    copy.dtype_ = dtype;
    return copy;
  }
  TensorOptions device(Device device) const {
    auto copy = *this;
    copy.device_ = device;
    return copy;
  }
  TensorOptions requires_grad(bool value) const {
    auto copy = *this;
    copy.requires_grad_ = value;
    return copy;
  }
};

using GradHook =
    std::function<Tensor(const Tensor&)>;  // returns the replacement grad, or undefined
using PostAccumulateHook = std::function<void(const Tensor&)>;  // receives the leaf

class TensorImpl {
 public:
  TensorImpl(std::shared_ptr<StorageImpl> storage, Shape sizes, Shape strides, int64_t offset,
             DType dtype);
  ~TensorImpl();
  TensorImpl(const TensorImpl&) = delete;
  TensorImpl& operator=(const TensorImpl&) = delete;

  std::shared_ptr<StorageImpl> storage;
  Shape sizes;
  Shape strides;
  int64_t offset;  // in elements
  DType dtype;

  // Autograd state.
  bool requires_grad = false;
  std::shared_ptr<TensorImpl> grad;
  std::shared_ptr<Node> grad_fn;  // null for leaves
  int output_nr = 0;
  bool retains_grad = false;
  std::vector<GradHook> leaf_hooks;
  std::vector<PostAccumulateHook> post_accumulate_hooks;
  std::weak_ptr<Node> grad_accumulator;
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }

  // Metadata.
  const Shape& sizes() const { return checked().sizes; }
  const Shape& strides() const { return checked().strides; }
  int64_t size(int64_t dim) const;
  int64_t stride(int64_t dim) const;
  int64_t dim() const { return static_cast<int64_t>(sizes().size()); }
  int64_t numel() const { return shape_numel(sizes()); }
  DType dtype() const { return checked().dtype; }
  Device device() const { return checked().storage->device(); }
  int64_t storage_offset() const { return checked().offset; }
  size_t element_size() const { return tessel::element_size(dtype()); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * element_size(); }
  bool is_contiguous() const;
  // True when some dimension of size > 1 has stride 0 (an expanded view).
  bool has_internal_overlap() const;
  const std::shared_ptr<StorageImpl>& storage() const { return checked().storage; }
  uint64_t version() const { return storage()->version(); }
  std::string str() const;  // shape, dtype, device and (for small tensors) values

  // Raw bytes. The storage must be pinned (inside a kernel, or a StorageAccess in scope):
  // call data_ptr only from kernels, read values with item() / to_vector() elsewhere.
  void* raw_data() const;
  template <typename T>
  T* data_ptr() const {
    TESSEL_CHECK(DTypeOf<T>::value == dtype(), "data_ptr: tensor has dtype ", dtype_name(dtype()),
                 ", asked for ", dtype_name(DTypeOf<T>::value));
    return static_cast<T*>(raw_data());
  }
  // Copies the values out in row-major order (any strides), converted to T.
  template <typename T>
  std::vector<T> to_vector() const;
  template <typename T>
  T item() const;

  // Autograd.
  bool requires_grad() const { return checked().requires_grad; }
  // For leaves only; returns *this so factories chain: randn({2}).set_requires_grad(true).
  Tensor& set_requires_grad(bool value);
  Tensor grad() const;
  void set_grad(const Tensor& grad) const;
  bool is_leaf() const { return checked().grad_fn == nullptr; }
  const std::shared_ptr<Node>& grad_fn() const { return checked().grad_fn; }
  int output_nr() const { return checked().output_nr; }
  // Runs backward from this tensor; `grad` defaults to ones for a one-element tensor.
  void backward(const Tensor& grad = Tensor(), bool retain_graph = false) const;
  // Shares storage, no autograd history, requires_grad false.
  Tensor detach() const;
  // Called with the gradient flowing into this tensor; may return a replacement.
  void register_hook(GradHook hook) const;
  // Leaves only: called once per backward after all contributions are summed into .grad.
  void register_post_accumulate_grad_hook(PostAccumulateHook hook) const;
  void retain_grad() const;

  // Ops as methods, defined in ops/ (link //ops to use them).
  Tensor view(const Shape& sizes) const;
  Tensor reshape(const Shape& sizes) const;
  Tensor transpose(int64_t dim0, int64_t dim1) const;
  Tensor t() const;
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor select(int64_t dim, int64_t index) const;
  Tensor expand(const Shape& sizes) const;
  Tensor squeeze(int64_t dim) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor contiguous() const;
  Tensor clone() const;
  Tensor to(DType dtype) const;
  Tensor to(Device device) const;
  Tensor sum() const;
  Tensor sum(const std::vector<int64_t>& dims, bool keepdim = false) const;
  Tensor mean() const;
  Tensor mean(const std::vector<int64_t>& dims, bool keepdim = false) const;
  Tensor matmul(const Tensor& other) const;
  Tensor& zero_();
  Tensor& fill_(double value);
  Tensor& copy_(const Tensor& source);
  Tensor& add_(const Tensor& other, double alpha = 1.0);
  Tensor& mul_(double value);

 private:
  TensorImpl& checked() const {
    TESSEL_CHECK(impl_ != nullptr, "use of an undefined tensor");
    return *impl_;
  }
  std::shared_ptr<TensorImpl> impl_;
};

// Creation that needs no kernel.
Tensor empty(const Shape& sizes, TensorOptions options = {});
// A new tensor sharing `base`'s storage with the given geometry (for view ops).
Tensor make_view(const Tensor& base, const Shape& sizes, const Shape& strides, int64_t offset);
// A row-major tensor holding `values` (converted to options.dtype).
template <typename T>
Tensor from_vector(const std::vector<T>& values, const Shape& sizes,
                   TensorOptions options = DTypeOf<T>::value);
inline Tensor tensor(const std::vector<float>& values, const Shape& sizes,
                     TensorOptions options = {}) {
  return from_vector<float>(values, sizes, options);
}
inline Tensor scalar_tensor(double value, TensorOptions options = {}) {
  return from_vector<double>({value}, {}, options);
}

// Elementwise strided conversion between any two dtypes (used by to_vector and the cast op).
void convert_elements(const void* source, DType source_dtype, void* destination,
                      DType destination_dtype, int64_t count);

}  // namespace tessel
