// Tensor: a value-semantics handle (like torch::Tensor) to a strided view of a storage, with
// autograd state. Copying a Tensor shares it; ops create new ones through the dispatcher.
//   Tensor w = tessel::randn({3, 4}).set_requires_grad(true);
//   Tensor loss = tessel::matmul(x, w).sum();  loss.backward();  w.grad();
#pragma once

#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/shape.h"
#include "core/small_object_pool.h"
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
  // Over a storage just made for this tensor, which no other tensor or thread holds yet.
  struct NewStorage {};
  TensorImpl(NewStorage, std::shared_ptr<StorageImpl> storage, Shape sizes, Shape strides,
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

// Marks, on this thread, a kernel the dispatcher runs with its operands unpinned (when no memory
// layer is installed nothing takes resident bytes away): Tensor::raw_data lets it reach them.
class UnpinnedKernelScope {
 public:
  explicit UnpinnedKernelScope(bool unpinned);
  ~UnpinnedKernelScope();
  UnpinnedKernelScope(const UnpinnedKernelScope&) = delete;
  UnpinnedKernelScope& operator=(const UnpinnedKernelScope&) = delete;

 private:
  bool unpinned_;
};

// A tensor header from this thread's pool of small blocks (core/small_object_pool.h).
template <typename... Args>
std::shared_ptr<TensorImpl> make_tensor_impl(Args&&... args) {
  return std::allocate_shared<TensorImpl>(PoolAllocator<TensorImpl>(), std::forward<Args>(args)...);
}

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
  int64_t size(int64_t dim) const { return shape_entry(sizes(), dim); }
  int64_t stride(int64_t dim) const { return shape_entry(strides(), dim); }
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
  Tensor& requires_grad_(bool value = true) { return set_requires_grad(value); }  // libtorch's name
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

  // Ops as methods, defined in ops/ (link //ops to use them). Each forwards to the free function
  // of ops/ops.h with the same name, so x.exp() is tessel::exp(x).
  // Views and copies.
  Tensor view(const Shape& sizes) const;
  Tensor reshape(const Shape& sizes) const;
  Tensor transpose(int64_t dim0, int64_t dim1) const;
  Tensor t() const;
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor select(int64_t dim, int64_t index) const;
  Tensor expand(const Shape& sizes) const;
  Tensor squeeze() const;  // every dimension of size 1
  Tensor squeeze(int64_t dim) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  std::vector<Tensor> split(int64_t split_size, int64_t dim = 0) const;
  std::vector<Tensor> chunk(int64_t chunks, int64_t dim = 0) const;
  Tensor index_select(int64_t dim, const Tensor& index) const;
  Tensor gather(int64_t dim, const Tensor& index) const;
  Tensor contiguous() const;
  Tensor clone() const;
  Tensor to(DType dtype) const;
  Tensor to(Device device) const;

  // Element-wise math (broadcasting and type promotion as the free functions).
  Tensor add(const Tensor& other, double alpha = 1.0) const;
  Tensor add(double other) const;
  Tensor sub(const Tensor& other, double alpha = 1.0) const;
  Tensor sub(double other) const;
  Tensor mul(const Tensor& other) const;
  Tensor mul(double other) const;
  Tensor div(const Tensor& other) const;
  Tensor div(double other) const;
  Tensor pow(const Tensor& exponent) const;
  Tensor pow(double exponent) const;
  Tensor maximum(const Tensor& other) const;
  Tensor minimum(const Tensor& other) const;
  Tensor neg() const;
  Tensor abs() const;
  Tensor exp() const;
  Tensor log() const;
  Tensor sqrt() const;
  Tensor rsqrt() const;
  Tensor tanh() const;
  Tensor sigmoid() const;
  Tensor relu() const;
  Tensor gelu(const std::string& approximate = "none") const;
  Tensor clamp(double min, double max) const;
  Tensor clamp_min(double min) const;
  Tensor clamp_max(double max) const;
  Tensor masked_fill(const Tensor& mask, double value) const;

  // Comparisons: bool tensors. A scalar compares in the tensor's dtype when that is floating
  // point (x.lt(0.1) on f32 compares with 0.1f), else in i64 or f64 as its value needs.
  Tensor eq(const Tensor& other) const;
  Tensor ne(const Tensor& other) const;
  Tensor lt(const Tensor& other) const;
  Tensor le(const Tensor& other) const;
  Tensor gt(const Tensor& other) const;
  Tensor ge(const Tensor& other) const;
  Tensor eq(double other) const;
  Tensor ne(double other) const;
  Tensor lt(double other) const;
  Tensor le(double other) const;
  Tensor gt(double other) const;
  Tensor ge(double other) const;

  // Reductions. sum(1) and sum({0, 1}) both work; sum({}) reduces every dimension.
  Tensor sum() const;
  Tensor sum(const std::vector<int64_t>& dims, bool keepdim = false) const;
  template <typename Int, typename = std::enable_if_t<std::is_integral_v<Int>>>
  Tensor sum(Int dim, bool keepdim = false) const {
    return sum(std::vector<int64_t>{static_cast<int64_t>(dim)}, keepdim);
  }
  Tensor mean() const;
  Tensor mean(const std::vector<int64_t>& dims, bool keepdim = false) const;
  template <typename Int, typename = std::enable_if_t<std::is_integral_v<Int>>>
  Tensor mean(Int dim, bool keepdim = false) const {
    return mean(std::vector<int64_t>{static_cast<int64_t>(dim)}, keepdim);
  }
  Tensor var(const std::vector<int64_t>& dims = {}, bool unbiased = true,
             bool keepdim = false) const;
  Tensor max() const;  // over all elements, 0-d
  Tensor min() const;
  // (values, indices) along `dim`, as libtorch: auto [values, indices] = x.max(1);
  std::tuple<Tensor, Tensor> max(int64_t dim, bool keepdim = false) const;
  std::tuple<Tensor, Tensor> min(int64_t dim, bool keepdim = false) const;
  Tensor argmax() const;  // the index into the flattened tensor, 0-d i64
  Tensor argmax(int64_t dim, bool keepdim = false) const;
  Tensor softmax(int64_t dim) const;
  Tensor log_softmax(int64_t dim) const;
  Tensor matmul(const Tensor& other) const;

  // In place, on this tensor's storage. On a leaf that requires grad they are an error while
  // gradients are recorded (use NoGradGuard, as optimizers do); autograd records no in-place op.
  Tensor& zero_();
  Tensor& fill_(double value);
  Tensor& copy_(const Tensor& source);
  Tensor& add_(const Tensor& other, double alpha = 1.0);
  Tensor& add_(double value);
  Tensor& sub_(const Tensor& other, double alpha = 1.0);
  Tensor& sub_(double value);
  Tensor& mul_(const Tensor& other);
  Tensor& mul_(double value);
  Tensor& div_(const Tensor& other);
  Tensor& div_(double value);
  Tensor& addmm_(const Tensor& a, const Tensor& b);  // this += a b (2-D), one GEMM, no temporary
  Tensor& operator+=(const Tensor& other) { return add_(other); }
  Tensor& operator+=(double value) { return add_(value); }
  Tensor& operator-=(const Tensor& other) { return sub_(other); }
  Tensor& operator-=(double value) { return sub_(value); }
  Tensor& operator*=(const Tensor& other) { return mul_(other); }
  Tensor& operator*=(double value) { return mul_(value); }
  Tensor& operator/=(const Tensor& other) { return div_(other); }
  Tensor& operator/=(double value) { return div_(value); }

 private:
  // Inline with its error out of line: every accessor goes through it.
  TensorImpl& checked() const {
    if (impl_ == nullptr) fail_undefined();
    return *impl_;
  }
  [[noreturn]] static void fail_undefined();
  std::shared_ptr<TensorImpl> impl_;
};

// Creation that needs no kernel.
Tensor empty(Shape sizes, TensorOptions options = {});
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

// Values (the first and last three along each dimension when there are more than 1000), then
// shape, dtype and device, as libtorch prints tensors. Defined in ops/ (link //ops).
std::ostream& operator<<(std::ostream& out, const Tensor& tensor);

// Elementwise strided conversion between any two dtypes (used by to_vector and the cast op).
void convert_elements(const void* source, DType source_dtype, void* destination,
                      DType destination_dtype, int64_t count);

}  // namespace tessel
