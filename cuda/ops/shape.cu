// The CUDA kernel of slice_backward (ops/shape.cc): the gradient copied into a strided window of
// zeros. The other shape ops are views and need no kernel.
#include <algorithm>

#include "cuda/ops/loops.cuh"
#include "ops/registry_helpers.h"
#include "ops/shape.h"

namespace tessel::cuda {

namespace {

constexpr DeviceType kCuda = DeviceType::kCuda;

}  // namespace

TESSEL_REGISTER_OPS(cuda_shape) {
  ops::slice_backward.set_kernel(kCuda, [](KernelContext& context) {
    const Tensor& out = context.outputs[0];
    DenseOutput dense(context, out);
    zero_fill(dense.dense);
    const Attrs& attrs = context.attrs;
    const int64_t dim = wrap_dim(attrs.get<int64_t>("dim"), out.dim());
    const int64_t step = attrs.get_or<int64_t>("step", 1);
    const int64_t size = out.sizes()[dim];
    int64_t start = attrs.get<int64_t>("start"), end = attrs.get<int64_t>("end");
    // As normalize_slice in ops/shape.cc (the shape rule already checked step > 0).
    if (start < 0) start += size;
    if (end < 0) end += size;
    start = std::min(std::max<int64_t>(start, 0), size);
    end = std::min(std::max(end, start), size);
    Shape sizes = dense.dense.sizes(), strides = dense.dense.strides();
    sizes[dim] = (end - start + step - 1) / step;
    strides[dim] *= step;
    Tensor window = make_view(dense.dense, sizes, strides,
                              dense.dense.storage_offset() + start * dense.dense.strides()[dim]);
    copy_convert(window, context.inputs[0]);
    dense.finish();
  });
}

}  // namespace tessel::cuda
