// The helpers loops.cuh declares for every kernel file: copy_convert (the strided, broadcasting
// cast), converted, dense_input, zero_fill, the chunk state's read_doubles and write_doubles,
// and rng_attrs.
#include "core/rng.h"
#include "cuda/ops/loops.cuh"

namespace tessel::cuda {

namespace {

template <typename Out, typename In>
struct ConvertFunctor {
  __device__ Out operator()(In value) const { return convert_value<Out>(value); }
};

}  // namespace

void copy_convert(const Tensor& out, const Tensor& in) {
  if (out.numel() == 0) return;
  if (out.dtype() == in.dtype() && out.sizes() == in.sizes() && out.is_contiguous() &&
      in.is_contiguous()) {
    KernelDevice device(out);
    TESSEL_CUDA_CHECK(cudaMemcpyAsync(out.raw_data(), in.raw_data(), out.nbytes(),
                                      cudaMemcpyDeviceToDevice, device.stream()));
    return;
  }
  visit_dtype(out.dtype(), [&](auto out_tag) {
    using Out = decltype(out_tag);
    visit_dtype(in.dtype(), [&](auto in_tag) {
      using In = decltype(in_tag);
      launch_unary<Out, In>(out, in, ConvertFunctor<Out, In>{});
    });
  });
}

Tensor converted(KernelContext& context, const Tensor& tensor, DType dtype) {
  if (tensor.dtype() == dtype) return tensor;
  Tensor copy = context.workspace(tensor.sizes(), dtype);
  copy_convert(copy, tensor);
  return copy;
}

Tensor dense_input(KernelContext& context, const Tensor& tensor) {
  if (tensor.is_contiguous()) return tensor;
  Tensor copy = context.workspace(tensor.sizes(), tensor.dtype());
  copy_convert(copy, tensor);
  return copy;
}

void zero_fill(const Tensor& tensor) {
  TESSEL_CHECK(tensor.is_contiguous(), "zero_fill: expected a contiguous tensor");
  if (tensor.numel() == 0) return;
  KernelDevice device(tensor);
  TESSEL_CUDA_CHECK(cudaMemsetAsync(tensor.raw_data(), 0, tensor.nbytes(), device.stream()));
}

std::vector<double> read_doubles(const Tensor& values) {
  TESSEL_CHECK(values.is_contiguous() && values.dtype() == DType::kFloat64,
               "read_doubles: expected dense doubles");
  std::vector<double> host(static_cast<size_t>(values.numel()));
  if (host.empty()) return host;
  KernelDevice device(values);
  TESSEL_CUDA_CHECK(cudaMemcpyAsync(host.data(), values.raw_data(), values.nbytes(),
                                    cudaMemcpyDeviceToHost, device.stream()));
  TESSEL_CUDA_CHECK(cudaStreamSynchronize(device.stream()));
  return host;
}

void write_doubles(const Tensor& into, const std::vector<double>& values) {
  TESSEL_CHECK(into.is_contiguous() && into.dtype() == DType::kFloat64 &&
                   into.numel() >= static_cast<int64_t>(values.size()),
               "write_doubles: expected at least ", values.size(), " dense doubles");
  if (values.empty()) return;
  KernelDevice device(into);
  TESSEL_CUDA_CHECK(cudaMemcpyAsync(into.raw_data(), values.data(), values.size() * sizeof(double),
                                    cudaMemcpyHostToDevice, device.stream()));
  // `values` may go before the copy would have read it.
  TESSEL_CUDA_CHECK(cudaStreamSynchronize(device.stream()));
}

RngState rng_attrs(const Attrs& attrs) {
  return RngState{static_cast<uint64_t>(attrs.get<int64_t>("rng_seed")),
                  static_cast<uint64_t>(attrs.get<int64_t>("rng_offset"))};
}

}  // namespace tessel::cuda
