#include "core/tensor.h"

#include <omp.h>

#include <cstring>
#include <sstream>

#include "core/autograd.h"
#include "core/builtin_ops.h"
#include "core/op.h"

namespace tessel {

TensorImpl::TensorImpl(std::shared_ptr<StorageImpl> storage_in, Shape sizes_in, Shape strides_in,
                       int64_t offset_in, DType dtype_in)
    : storage(std::move(storage_in)),
      sizes(std::move(sizes_in)),
      strides(std::move(strides_in)),
      offset(offset_in),
      dtype(dtype_in) {
  storage->add_user_ref();
}

TensorImpl::TensorImpl(NewStorage, std::shared_ptr<StorageImpl> storage_in, Shape sizes_in,
                       Shape strides_in, DType dtype_in)
    : storage(std::move(storage_in)),
      sizes(std::move(sizes_in)),
      strides(std::move(strides_in)),
      offset(0),
      dtype(dtype_in) {
  storage->set_first_user_ref();
}

TensorImpl::~TensorImpl() {
  // A storage dropped with its last tensor, no memory layer installed, has no reader of its user
  // count left (the memory layer's and the op records' weak references exist only under one):
  // the locked decrement is skipped.
  if (storage.use_count() == 1 && residency_hooks() == nullptr) return;
  storage->release_user_ref();
}

void Tensor::fail_undefined() { TESSEL_FAIL("use of an undefined tensor"); }

bool Tensor::is_contiguous() const {
  if (numel() == 0) return true;  // no element to place: any strides will do
  int64_t expected = 1;
  for (int64_t i = dim() - 1; i >= 0; --i) {
    if (sizes()[i] == 1) continue;
    if (strides()[i] != expected) return false;
    expected *= sizes()[i];
  }
  return true;
}

bool Tensor::has_internal_overlap() const {
  for (int64_t i = 0; i < dim(); ++i)
    if (sizes()[i] > 1 && strides()[i] == 0) return true;
  return false;
}

namespace {
// Kernels this thread runs with their operands unpinned (see UnpinnedKernelScope).
thread_local int unpinned_kernels = 0;

// An unpinned resident storage is reachable inside such a kernel, and, while no memory layer is
// installed, from the threads of a parallel region (a kernel's workers).
bool reachable_unpinned(const StorageImpl& storage) {
  return !storage.sharded &&
         (unpinned_kernels > 0 || (omp_in_parallel() && residency_hooks() == nullptr));
}

[[noreturn]] void fail_raw_data(const TensorImpl& self) {
  const StorageImpl& storage = *self.storage;
  TESSEL_CHECK(!storage.device().is_meta(), "a meta tensor has no data (shape ",
               shape_str(self.sizes), ")");
  TESSEL_CHECK(
      storage.pins() > 0 ||
          (storage.state() == Residency::kResident && reachable_unpinned(storage)),
      "raw bytes reached outside an access scope: read values with to_vector()/item(), or hold a "
      "StorageAccess on the storage");
  TESSEL_FAIL("raw bytes of a storage that is ", residency_name(storage.state()));
}
}  // namespace

UnpinnedKernelScope::UnpinnedKernelScope(bool unpinned) : unpinned_(unpinned) {
  if (unpinned_) ++unpinned_kernels;
}

UnpinnedKernelScope::~UnpinnedKernelScope() {
  if (unpinned_) --unpinned_kernels;
}

void* Tensor::raw_data() const {
  const TensorImpl& self = checked();
  const StorageImpl& storage = *self.storage;
  if (storage.state() != Residency::kResident || storage.device().is_meta() ||
      (storage.pins() == 0 && !reachable_unpinned(storage)))
    fail_raw_data(self);
  return static_cast<char*>(storage.data_unchecked()) +
         self.offset * static_cast<int64_t>(tessel::element_size(self.dtype));
}

void convert_elements(const void* source, DType source_dtype, void* destination,
                      DType destination_dtype, int64_t count) {
  if (count == 0) return;  // empty tensors may have null buffers
  if (source_dtype == destination_dtype) {
    std::memcpy(destination, source,
                static_cast<size_t>(count) * tessel::element_size(source_dtype));
    return;
  }
  visit_dtype(source_dtype, [&](auto source_tag) {
    using From = decltype(source_tag);
    visit_dtype(destination_dtype, [&](auto destination_tag) {
      using To = decltype(destination_tag);
      const From* in = static_cast<const From*>(source);
      To* out = static_cast<To*>(destination);
      for (int64_t i = 0; i < count; ++i) {
        if constexpr (std::is_same_v<To, bool>) {
          out[i] = static_cast<double>(static_cast<float>(in[i])) != 0.0;
        } else if constexpr (std::is_same_v<To, BFloat16> || std::is_same_v<To, Float16>) {
          out[i] = To(static_cast<float>(in[i]));
        } else if constexpr (std::is_same_v<From, BFloat16> || std::is_same_v<From, Float16>) {
          out[i] = static_cast<To>(static_cast<float>(in[i]));
        } else {
          out[i] = static_cast<To>(in[i]);
        }
      }
    });
  });
}

namespace {
// Copies the elements of any strided tensor into a dense row-major buffer of the same dtype.
void gather_row_major(const Tensor& tensor, char* destination) {
  if (tensor.numel() == 0) return;
  StorageAccess access(*tensor.storage());
  const size_t item = tensor.element_size();
  const char* base = static_cast<const char*>(tensor.raw_data());
  int64_t numel = tensor.numel();
  if (tensor.is_contiguous()) {
    std::memcpy(destination, base, static_cast<size_t>(numel) * item);
    return;
  }
  Shape index(tensor.dim(), 0);
  for (int64_t linear = 0; linear < numel; ++linear) {
    int64_t offset = 0;
    for (int64_t d = 0; d < tensor.dim(); ++d) offset += index[d] * tensor.strides()[d];
    std::memcpy(destination + linear * item, base + offset * static_cast<int64_t>(item), item);
    for (int64_t d = tensor.dim() - 1; d >= 0; --d) {
      if (++index[d] < tensor.sizes()[d]) break;
      index[d] = 0;
    }
  }
}
}  // namespace

template <typename T>
std::vector<T> Tensor::to_vector() const {
  TESSEL_CHECK(!device().is_meta(), "to_vector: a meta tensor has no values");
  Tensor source = device().is_cpu() ? *this : to(Device::cpu());
  std::vector<char> dense(source.nbytes());
  gather_row_major(source, dense.data());
  // std::vector<bool> has no data(); convert through bytes.
  using Element = std::conditional_t<std::is_same_v<T, bool>, uint8_t, T>;
  std::vector<Element> values(static_cast<size_t>(numel()));
  convert_elements(dense.data(), dtype(), values.data(), DTypeOf<T>::value, numel());
  return std::vector<T>(values.begin(), values.end());
}

template <typename T>
T Tensor::item() const {
  TESSEL_CHECK(numel() == 1, "item: expected a one-element tensor, got shape ", shape_str(sizes()));
  return to_vector<T>()[0];
}

#define TESSEL_INSTANTIATE_READERS(T)                   \
  template std::vector<T> Tensor::to_vector<T>() const; \
  template T Tensor::item<T>() const;
TESSEL_INSTANTIATE_READERS(float)
TESSEL_INSTANTIATE_READERS(double)
TESSEL_INSTANTIATE_READERS(int32_t)
TESSEL_INSTANTIATE_READERS(int64_t)
TESSEL_INSTANTIATE_READERS(uint8_t)
TESSEL_INSTANTIATE_READERS(bool)
TESSEL_INSTANTIATE_READERS(BFloat16)
TESSEL_INSTANTIATE_READERS(Float16)
#undef TESSEL_INSTANTIATE_READERS

std::string Tensor::str() const {
  if (!defined()) return "Tensor(undefined)";
  std::ostringstream out;
  out << "Tensor(shape=" << shape_str(sizes()) << ", dtype=" << dtype_name(dtype())
      << ", device=" << device();
  if (!device().is_meta() && numel() <= 16) {
    auto values = to_vector<double>();
    out << ", values=";
    detail::stream_one(out, values);
  }
  if (requires_grad()) out << ", requires_grad";
  out << ")";
  return out.str();
}

Tensor& Tensor::set_requires_grad(bool value) {
  TensorImpl& self = checked();
  TESSEL_CHECK(self.grad_fn == nullptr || value,
               "set_requires_grad(false) on a non-leaf tensor: use detach() instead");
  TESSEL_CHECK(!value || is_floating(self.dtype),
               "only floating-point tensors can require grad, got ", dtype_name(self.dtype));
  self.requires_grad = value;
  return *this;
}

Tensor Tensor::grad() const {
  const TensorImpl& self = checked();
  return self.grad ? Tensor(self.grad) : Tensor();
}

void Tensor::set_grad(const Tensor& grad) const {
  TensorImpl& self = checked();
  if (grad.defined()) {
    TESSEL_CHECK(grad.sizes() == self.sizes, "set_grad: gradient shape ", shape_str(grad.sizes()),
                 " does not match tensor shape ", shape_str(self.sizes));
  }
  self.grad = grad.impl_ptr();
}

void Tensor::backward(const Tensor& grad, bool retain_graph) const {
  run_backward({*this}, {grad}, retain_graph);
}

Tensor Tensor::detach() const {
  const TensorImpl& self = checked();
  return Tensor(make_tensor_impl(self.storage, self.sizes, self.strides, self.offset, self.dtype));
}

void Tensor::register_hook(GradHook hook) const {
  TensorImpl& self = checked();
  TESSEL_CHECK(self.requires_grad, "register_hook on a tensor that does not require grad");
  if (self.grad_fn) {
    self.grad_fn->pre_hooks[self.output_nr].push_back(std::move(hook));
  } else {
    self.leaf_hooks.push_back(std::move(hook));
  }
}

void Tensor::register_post_accumulate_grad_hook(PostAccumulateHook hook) const {
  TensorImpl& self = checked();
  TESSEL_CHECK(self.grad_fn == nullptr && self.requires_grad,
               "post-accumulate hooks are for leaf tensors that require grad");
  self.post_accumulate_hooks.push_back(std::move(hook));
}

void Tensor::retain_grad() const {
  TensorImpl& self = checked();
  TESSEL_CHECK(self.requires_grad, "retain_grad on a tensor that does not require grad");
  if (!self.grad_fn || self.retains_grad) return;
  self.retains_grad = true;
  std::weak_ptr<TensorImpl> weak = impl_;
  self.grad_fn->pre_hooks[self.output_nr].push_back([weak](const Tensor& grad) {
    if (auto impl = weak.lock()) {
      Tensor accumulated =
          impl->grad ? dispatch(ops::add, {Tensor(impl->grad), grad})[0] : grad.detach();
      impl->grad = accumulated.impl_ptr();
    }
    return Tensor();
  });
}

Tensor empty(Shape sizes, TensorOptions options) {
  for (int64_t size : sizes)
    TESSEL_CHECK(size >= 0, "empty: negative size in shape ", shape_str(sizes));
  size_t nbytes = static_cast<size_t>(shape_numel(sizes)) * element_size(options.dtype_);
  auto storage =
      std::allocate_shared<StorageImpl>(PoolAllocator<StorageImpl>(), nbytes, options.device_);
  Shape strides = contiguous_strides(sizes);
  Tensor result(make_tensor_impl(TensorImpl::NewStorage{}, std::move(storage), std::move(sizes),
                                 std::move(strides), options.dtype_));
  if (options.requires_grad_) result.set_requires_grad(true);
  return result;
}

Tensor make_view(const Tensor& base, const Shape& sizes, const Shape& strides, int64_t offset) {
  return Tensor(make_tensor_impl(base.storage(), sizes, strides, offset, base.dtype()));
}

template <typename T>
Tensor from_vector(const std::vector<T>& values, const Shape& sizes, TensorOptions options) {
  TESSEL_CHECK(static_cast<int64_t>(values.size()) == shape_numel(sizes),
               "from_vector: ", values.size(), " values do not fill shape ", shape_str(sizes), " (",
               shape_numel(sizes), " elements)");
  Tensor cpu = empty(sizes, options.device(Device::cpu()).requires_grad(false));
  {
    using Element = std::conditional_t<std::is_same_v<T, bool>, uint8_t, T>;
    std::vector<Element> elements(values.begin(), values.end());
    StorageAccess access(*cpu.storage());
    convert_elements(elements.data(), DTypeOf<T>::value, cpu.raw_data(), options.dtype_,
                     static_cast<int64_t>(elements.size()));
  }
  Tensor result = options.device_.is_cpu() ? cpu : cpu.to(options.device_);
  if (options.requires_grad_) result.set_requires_grad(true);
  return result;
}

template Tensor from_vector<float>(const std::vector<float>&, const Shape&, TensorOptions);
template Tensor from_vector<double>(const std::vector<double>&, const Shape&, TensorOptions);
template Tensor from_vector<int32_t>(const std::vector<int32_t>&, const Shape&, TensorOptions);
template Tensor from_vector<int64_t>(const std::vector<int64_t>&, const Shape&, TensorOptions);
template Tensor from_vector<uint8_t>(const std::vector<uint8_t>&, const Shape&, TensorOptions);
template Tensor from_vector<bool>(const std::vector<bool>&, const Shape&, TensorOptions);

}  // namespace tessel
