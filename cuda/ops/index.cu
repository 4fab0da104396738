// CUDA kernels for the ops of ops/index.cc: cat copies each input into its slice of the output;
// embedding, index_select and gather read rows (or elements) at indices; their backward ops
// scatter-add into zeros with atomics (summation order may differ from the CPU's, within
// rounding).
// The forward ops check their indices on the device without waiting for it (a bad one is raised
// with the CPU kernels' message at the next synchronisation point, and skipped by the kernels
// meanwhile); backward ops reuse those indices and skip the check.
#include "cuda/index_check.h"
#include "cuda/ops/loops.cuh"
#include "ops/index.h"
#include "ops/math/indexing.h"
#include "ops/registry_helpers.h"

namespace tessel::cuda {

namespace {

constexpr DeviceType kCuda = DeviceType::kCuda;

// Calls fn(Word{}) with an unsigned type of the element size (gathers copy bits).
template <typename Fn>
void visit_word(size_t element_size, Fn&& fn) {
  switch (element_size) {
    case 1:
      return fn(uint8_t{});
    case 2:
      return fn(uint16_t{});
    case 4:
      return fn(uint32_t{});
    case 8:
      return fn(uint64_t{});
    default:
      TESSEL_FAIL("cuda index kernels: unsupported element size ", element_size);
  }
}

template <typename Fn>
void visit_index(DType dtype, Fn&& fn) {
  if (dtype == DType::kInt64) return fn(int64_t{});
  TESSEL_CHECK(dtype == DType::kInt32, "cuda index kernels: expected an i64 or i32 index, got ",
               dtype_name(dtype));
  return fn(int32_t{});
}

// out (outer, count, inner) = source (outer, size, inner) at rows `index`.
template <typename Word, typename I>
__global__ void gather_rows_kernel(const Word* source, const I* index, Around shape, int64_t count,
                                   Word* out) {
  const int64_t numel = shape.outer * count * shape.inner;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < numel;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const RowPosition at = row_position(i, count, shape.inner);
    const int64_t row = static_cast<int64_t>(index[at.j]);
    // A bad row was recorded by the check (raised at the next synchronisation): never read it.
    out[i] = row >= 0 && row < shape.size ? source[shape.offset(at.o, row, at.k)] : Word{};
  }
}

// out (outer, size, inner) += grad (outer, count, inner) at rows `index`, skipping `skip_row`.
template <typename T, typename I>
__global__ void scatter_add_rows_kernel(const T* grad, const I* index, Around shape, int64_t count,
                                        int64_t skip_row, T* out) {
  const int64_t numel = shape.outer * count * shape.inner;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < numel;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const RowPosition at = row_position(i, count, shape.inner);
    const int64_t row = static_cast<int64_t>(index[at.j]);
    if (row == skip_row || row < 0 || row >= shape.size) continue;  // checked by the forward op
    atomicAdd(&out[shape.offset(at.o, row, at.k)], grad[i]);
  }
}

// Positions of a dense tensor of `sizes` mapped to offsets in a tensor of `strides`, with the
// coordinate along `dim` replaced by an index value.
struct IndexedGeometry {
  int ndim = 0, dim = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};
  __device__ int64_t offset(int64_t position, int64_t index_value) const {
    int64_t result = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      const int64_t coordinate = position % sizes[d];
      position /= sizes[d];
      result += (d == dim ? index_value : coordinate) * strides[d];
    }
    return result;
  }
};

IndexedGeometry indexed_geometry(const Shape& sizes, const Shape& strides, int64_t dim) {
  TESSEL_CHECK(sizes.size() <= static_cast<size_t>(kMaxDims), "gather: at most ", kMaxDims,
               " dims are supported on CUDA, got shape ", shape_str(sizes));
  IndexedGeometry geometry;
  geometry.ndim = static_cast<int>(sizes.size());
  geometry.dim = static_cast<int>(dim);
  for (size_t d = 0; d < sizes.size(); ++d) {
    geometry.sizes[d] = sizes[d];
    geometry.strides[d] = strides[d];
  }
  return geometry;
}

template <typename Word, typename I>
__global__ void gather_kernel(const Word* x, const I* index, IndexedGeometry geometry,
                              int64_t numel, int64_t size, Word* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < numel;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t value = static_cast<int64_t>(index[i]);
    // A bad index was recorded by the check (raised at the next synchronisation): never read it.
    out[i] = value >= 0 && value < size ? x[geometry.offset(i, value)] : Word{};
  }
}

template <typename T, typename I>
__global__ void gather_backward_kernel(const T* grad, const I* index, IndexedGeometry geometry,
                                       int64_t numel, int64_t size, T* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < numel;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t value = static_cast<int64_t>(index[i]);
    if (value < 0 || value >= size) continue;  // checked by the forward op
    atomicAdd(&out[geometry.offset(i, value)], grad[i]);
  }
}

void gather_rows(const Tensor& source, const Around& shape, const Tensor& index,
                 const Tensor& out) {
  const int64_t count = index.numel();
  const int64_t numel = shape.outer * count * shape.inner;
  if (numel == 0) return;
  KernelDevice device(out);
  visit_word(source.element_size(), [&](auto word_tag) {
    using Word = decltype(word_tag);
    visit_index(index.dtype(), [&](auto index_tag) {
      using I = decltype(index_tag);
      gather_rows_kernel<Word, I><<<grid_for(numel), kThreads, 0, device.stream()>>>(
          device_data<const Word>(source), device_data<const I>(index), shape, count,
          device_data<Word>(out));
      check_launch();
    });
  });
}

// out (contiguous) = zeros unless `add_to_out`, then rows of grad added at `index` (skip_row -1:
// none skipped).
void scatter_add_rows(const Tensor& grad, const Around& shape, const Tensor& index,
                      int64_t skip_row, const Tensor& out, const char* op,
                      bool add_to_out = false) {
  if (!add_to_out) zero_fill(out);
  const int64_t count = index.numel();
  const int64_t numel = shape.outer * count * shape.inner;
  if (numel == 0) return;
  KernelDevice device(out);
  visit_float_dtype(out.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    visit_index(index.dtype(), [&](auto index_tag) {
      using I = decltype(index_tag);
      scatter_add_rows_kernel<T, I><<<grid_for(numel), kThreads, 0, device.stream()>>>(
          device_data<const T>(grad), device_data<const I>(index), shape, count, skip_row,
          device_data<T>(out));
      check_launch();
    });
  });
}

}  // namespace

TESSEL_REGISTER_OPS(cuda_index) {
  ops::cat.set_kernel(kCuda, [](KernelContext& context) {
    const Tensor& out = context.outputs[0];
    const int64_t dim = wrap_dim(context.attrs.get<int64_t>("dim"), out.dim());
    int64_t position = 0;
    for (const Tensor& input : context.inputs) {
      Tensor part = make_view(out, input.sizes(), out.strides(),
                              out.storage_offset() + position * out.strides()[dim]);
      copy_convert(part, input);
      position += input.sizes()[dim];
    }
  });
  ops::embedding.set_kernel(kCuda, [](KernelContext& context) {
    const Tensor& weight = context.inputs[0];
    const Tensor indices = dense_input(context, context.inputs[1]);
    check_indices(context, indices, {IndexOp::kEmbedding, 0, weight.sizes()[0]});
    DenseOutput out(context, context.outputs[0]);
    gather_rows(dense_input(context, weight), around(weight.sizes(), 0), indices, out.dense);
    out.finish();
  });
  ops::embedding_backward.set_kernel(kCuda, [](KernelContext& context) {
    // The indices were checked by the forward op; rows out of range are skipped by the kernel.
    const Tensor indices = dense_input(context, context.inputs[1]);
    const int64_t padding_idx = context.attrs.get_or<int64_t>("padding_idx", -1);
    // Over chunks of the indices (KernelContext::chunk) each chunk adds its rows to the table the
    // chunks before it wrote.
    const bool first_chunk = !context.chunk || context.chunk->begin == 0;
    TESSEL_CHECK(first_chunk || context.outputs[0].is_contiguous(),
                 "embedding_backward: a sum over chunks needs a contiguous output");
    DenseOutput out(context, context.outputs[0]);
    scatter_add_rows(dense_input(context, context.inputs[0]), around(out.dense.sizes(), 0), indices,
                     padding_idx < 0 ? -1 : padding_idx, out.dense, ops::embedding_backward.name(),
                     !first_chunk);
    out.finish();
  });
  ops::index_select.set_kernel(kCuda, [](KernelContext& context) {
    const Tensor& x = context.inputs[0];
    const int64_t dim = wrap_dim(context.attrs.get<int64_t>("dim"), x.dim());
    const Tensor index = dense_input(context, context.inputs[1]);
    check_indices(context, index,
                  {IndexOp::kIndexSelect, static_cast<int32_t>(dim), x.sizes()[dim]});
    DenseOutput out(context, context.outputs[0]);
    gather_rows(dense_input(context, x), around(x.sizes(), dim), index, out.dense);
    out.finish();
  });
  ops::index_select_backward.set_kernel(kCuda, [](KernelContext& context) {
    const Shape& input_sizes = context.attrs.get<Shape>("input_sizes");
    const int64_t dim =
        wrap_dim(context.attrs.get<int64_t>("dim"), static_cast<int64_t>(input_sizes.size()));
    const Tensor index = dense_input(context, context.inputs[1]);  // checked by the forward op
    DenseOutput out(context, context.outputs[0]);
    scatter_add_rows(dense_input(context, context.inputs[0]), around(input_sizes, dim), index, -1,
                     out.dense, ops::index_select_backward.name());
    out.finish();
  });
  ops::gather.set_kernel(kCuda, [](KernelContext& context) {
    const Tensor& x = context.inputs[0];
    const int64_t dim = x.dim() == 0 ? 0 : wrap_dim(context.attrs.get<int64_t>("dim"), x.dim());
    const int64_t size = x.dim() == 0 ? 1 : x.sizes()[dim];
    const Tensor index = dense_input(context, context.inputs[1]);
    check_indices(context, index, {IndexOp::kGather, static_cast<int32_t>(dim), size});
    DenseOutput out(context, context.outputs[0]);
    const int64_t numel = out.dense.numel();
    if (numel > 0) {
      KernelDevice device(context);
      // A 0-d input is a 1-element row: every index is 0.
      const IndexedGeometry geometry = x.dim() == 0
                                           ? indexed_geometry({1}, {0}, 0)
                                           : indexed_geometry(index.sizes(), x.strides(), dim);
      visit_word(x.element_size(), [&](auto word_tag) {
        using Word = decltype(word_tag);
        visit_index(index.dtype(), [&](auto index_tag) {
          using I = decltype(index_tag);
          gather_kernel<Word, I><<<grid_for(numel), kThreads, 0, device.stream()>>>(
              device_data<const Word>(x), device_data<const I>(index), geometry, numel, size,
              device_data<Word>(out.dense));
          check_launch();
        });
      });
    }
    out.finish();
  });
  ops::gather_backward.set_kernel(kCuda, [](KernelContext& context) {
    const Shape& input_sizes = context.attrs.get<Shape>("input_sizes");
    const int64_t ndim = static_cast<int64_t>(input_sizes.size());
    const int64_t dim = ndim == 0 ? 0 : wrap_dim(context.attrs.get<int64_t>("dim"), ndim);
    const int64_t size = ndim == 0 ? 1 : input_sizes[dim];
    const Tensor index = dense_input(context, context.inputs[1]);  // checked by the forward op
    const Tensor grad = dense_input(context, context.inputs[0]);
    DenseOutput out(context, context.outputs[0]);
    zero_fill(out.dense);
    const int64_t numel = grad.numel();
    if (numel > 0) {
      KernelDevice device(context);
      const IndexedGeometry geometry =
          ndim == 0 ? indexed_geometry({1}, {0}, 0)
                    : indexed_geometry(grad.sizes(), contiguous_strides(input_sizes), dim);
      visit_float_dtype(grad.dtype(), ops::gather_backward.name(), [&](auto tag) {
        using T = decltype(tag);
        visit_index(index.dtype(), [&](auto index_tag) {
          using I = decltype(index_tag);
          gather_backward_kernel<T, I><<<grid_for(numel), kThreads, 0, device.stream()>>>(
              device_data<const T>(grad), device_data<const I>(index), geometry, numel, size,
              device_data<T>(out.dense));
          check_launch();
        });
      });
    }
    out.finish();
  });
}

}  // namespace tessel::cuda
