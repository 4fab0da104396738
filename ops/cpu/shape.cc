// The CPU kernel of slice_backward, and the slice geometry of ops/cpu/kernels.h.
#include <algorithm>
#include <cstring>

#include "ops/cpu/kernels.h"
#include "ops/cpu/strided_copy.h"
#include "ops/ops.h"
#include "ops/registry_helpers.h"

namespace tessel::cpu {

SliceRange normalize_slice(int64_t size, int64_t start, int64_t end, int64_t step) {
  TESSEL_CHECK(step > 0, "slice: step must be positive, got ", step);
  if (start < 0) start += size;
  if (end < 0) end += size;
  start = std::clamp<int64_t>(start, 0, size);
  end = std::clamp<int64_t>(end, start, size);
  return {start, (end - start + step - 1) / step};
}

Tensor slice_geometry(const Tensor& x, const Attrs& attrs) {
  TESSEL_CHECK(x.dim() > 0, "slice: cannot slice a 0-d tensor");
  const int64_t dim = wrap_dim(attrs.get<int64_t>("dim"), x.dim(), "slice: dim");
  const int64_t step = attrs.get_or<int64_t>("step", 1);
  SliceRange range =
      normalize_slice(x.sizes()[dim], attrs.get<int64_t>("start"), attrs.get<int64_t>("end"), step);
  Shape sizes = x.sizes();
  Shape strides = x.strides();
  sizes[dim] = range.length;
  strides[dim] *= step;
  return make_view(x, sizes, strides, x.storage_offset() + range.start * x.strides()[dim]);
}

void slice_backward_kernel(KernelContext& ctx) {
  Tensor& out = ctx.outputs[0];
  Tensor dense = out.is_contiguous() ? out : ctx.workspace(out.sizes(), out.dtype());
  std::memset(dense.raw_data(), 0, dense.nbytes());
  cpu::copy_strided(ctx.inputs[0], slice_geometry(dense, ctx.attrs));
  if (!dense.is_same(out)) cpu::copy_strided(dense, out);
}

}  // namespace tessel::cpu
