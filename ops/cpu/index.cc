// The CPU kernels of cat, index_select, gather and embedding, and of their gradients: a
// deterministic scatter-add into zeros (threads own disjoint targets and add in index order).
#include <algorithm>
#include <cstring>
#include <vector>

#include "ops/cpu/kernels.h"
#include "ops/cpu/strided_copy.h"
#include "ops/math/indexing.h"
#include "ops/ops.h"
#include "ops/registry_helpers.h"

namespace tessel::cpu {

namespace {

// The values of a pinned index tensor (any strides) as i64, each checked against [0, size).
std::vector<int64_t> read_indices(KernelContext& ctx, const Tensor& index, int64_t size,
                                  const char* op_name, const char* what) {
  Tensor dense = cpu::dense_input(ctx, index);
  std::vector<int64_t> values(static_cast<size_t>(dense.numel()));
  if (dense.dtype() == DType::kInt64) {
    const int64_t* data = dense.data_ptr<int64_t>();
    std::copy(data, data + dense.numel(), values.begin());
  } else {
    const int32_t* data = dense.data_ptr<int32_t>();
    std::copy(data, data + dense.numel(), values.begin());
  }
  for (int64_t value : values)
    TESSEL_CHECK(value >= 0 && value < size, op_name, ": index ", value, " is out of range for ",
                 what, " of size ", size);
  return values;
}

// The output itself when contiguous, else a dense workspace that finish_output copies back.
Tensor dense_output(KernelContext& ctx, const Tensor& out) {
  return out.is_contiguous() ? out : ctx.workspace(out.sizes(), out.dtype());
}
void finish_output(const Tensor& dense, const Tensor& out) {
  if (!dense.is_same(out)) cpu::copy_strided(dense, out);
}

// out (outer, count, inner) = source (outer, rows, inner) at rows `indices` (count of them).
void gather_rows(const Tensor& source, const Around& shape, const std::vector<int64_t>& indices,
                 const Tensor& out) {
  const int64_t count = static_cast<int64_t>(indices.size());
  const size_t row_bytes = static_cast<size_t>(shape.inner) * source.element_size();
  if (row_bytes == 0 || count == 0) return;
  const char* from = static_cast<const char*>(source.raw_data());
  char* to = static_cast<char*>(out.raw_data());
  const int64_t grain = std::max<int64_t>(1, 65536 / static_cast<int64_t>(row_bytes));
  parallel_for(0, shape.outer * count, grain, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      int64_t o = item / count, j = item % count;
      std::memcpy(to + item * row_bytes,
                  from + shape.offset(o, indices[j], 0) * source.element_size(), row_bytes);
    }
  });
}

// out (outer, rows, inner) = zeros, then out[o, indices[j], :] += grad[o, j, :], skipping rows
// equal to `skip_row`. Threads own disjoint (o, column block) pairs and visit j in order, so the
// sums are deterministic.
void scatter_add_rows(const Tensor& grad, const Around& shape, const std::vector<int64_t>& indices,
                      int64_t skip_row, const Tensor& out, bool zero_first = true) {
  if (zero_first) std::memset(out.raw_data(), 0, out.nbytes());
  const int64_t count = static_cast<int64_t>(indices.size());
  if (count == 0 || shape.inner == 0) return;
  constexpr int64_t kBlock = 256;
  const int64_t blocks = (shape.inner + kBlock - 1) / kBlock;
  visit_float_dtype(out.dtype(), "scatter_add_rows", [&](auto tag) {
    using T = decltype(tag);
    const T* g = grad.data_ptr<T>();
    T* o_data = out.data_ptr<T>();
    parallel_for(0, shape.outer * blocks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t task = begin; task < end; ++task) {
        int64_t o = task / blocks;
        int64_t first = (task % blocks) * kBlock;
        int64_t last = std::min(shape.inner, first + kBlock);
        for (int64_t j = 0; j < count; ++j) {
          if (indices[j] == skip_row) continue;
          const T* from = g + Around{shape.outer, count, shape.inner}.offset(o, j, 0);
          T* to = o_data + shape.offset(o, indices[j], 0);
          for (int64_t i = first; i < last; ++i) to[i] += from[i];
        }
      }
    });
  });
}

// Iterates the "rows" of an index tensor along `dim`: every position with the coordinate along
// `dim` left out. fn(row_offsets...) gets, for each listed geometry, the element offset of the
// row's first element; rows are disjoint so they may run in parallel.
template <typename Fn>
void for_each_row(const Shape& sizes, int64_t dim, const std::vector<const Shape*>& strides,
                  Fn&& fn) {
  const int64_t ndim = static_cast<int64_t>(sizes.size());
  int64_t rows = 1;
  for (int64_t d = 0; d < ndim; ++d)
    if (d != dim) rows *= sizes[d];
  if (rows == 0 || (ndim > 0 && sizes[dim] == 0)) return;
  parallel_for(0, rows, 256, [&](int64_t begin, int64_t end) {
    std::vector<int64_t> offsets(strides.size());
    for (int64_t row = begin; row < end; ++row) {
      std::fill(offsets.begin(), offsets.end(), 0);
      int64_t remainder = row;
      for (int64_t d = ndim - 1; d >= 0; --d) {
        if (d == dim) continue;
        int64_t coordinate = remainder % sizes[d];
        remainder /= sizes[d];
        for (size_t k = 0; k < strides.size(); ++k) offsets[k] += coordinate * (*strides[k])[d];
      }
      fn(offsets);
    }
  });
}

}  // namespace

void cat_kernel(KernelContext& ctx) {
  const Tensor& out = ctx.outputs[0];
  const int64_t dim = wrap_dim(ctx.attrs.get<int64_t>("dim"), out.dim());
  int64_t position = 0;
  for (const Tensor& input : ctx.inputs) {
    Tensor part = make_view(out, input.sizes(), out.strides(),
                            out.storage_offset() + position * out.strides()[dim]);
    cpu::copy_strided(input, part);
    position += input.sizes()[dim];
  }
}

void index_select_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  const int64_t dim = wrap_dim(ctx.attrs.get<int64_t>("dim"), x.dim());
  std::vector<int64_t> indices = read_indices(ctx, ctx.inputs[1], x.sizes()[dim], "index_select",
                                              tessel::detail::str_cat("dimension ", dim).c_str());
  Tensor out = dense_output(ctx, ctx.outputs[0]);
  gather_rows(cpu::dense_input(ctx, x), around(x.sizes(), dim), indices, out);
  finish_output(out, ctx.outputs[0]);
}

void index_select_backward_kernel(KernelContext& ctx) {
  const Tensor& grad = ctx.inputs[0];
  const Shape& input_sizes = ctx.attrs.get<Shape>("input_sizes");
  const int64_t dim =
      wrap_dim(ctx.attrs.get<int64_t>("dim"), static_cast<int64_t>(input_sizes.size()));
  std::vector<int64_t> indices =
      read_indices(ctx, ctx.inputs[1], input_sizes[dim], "index_select_backward",
                   tessel::detail::str_cat("dimension ", dim).c_str());
  Tensor out = dense_output(ctx, ctx.outputs[0]);
  scatter_add_rows(cpu::dense_input(ctx, grad), around(input_sizes, dim), indices, -1, out);
  finish_output(out, ctx.outputs[0]);
}

void gather_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  const int64_t dim = wrap_dim(ctx.attrs.get<int64_t>("dim"), x.dim());
  const int64_t size = x.dim() == 0 ? 1 : x.sizes()[dim];
  std::vector<int64_t> indices = read_indices(ctx, ctx.inputs[1], size, "gather",
                                              tessel::detail::str_cat("dimension ", dim).c_str());
  Tensor out = dense_output(ctx, ctx.outputs[0]);
  const Shape& index_sizes = out.sizes();
  if (x.dim() == 0) {
    if (out.numel() == 1) std::memcpy(out.raw_data(), x.raw_data(), x.element_size());
    finish_output(out, ctx.outputs[0]);
    return;
  }
  const Shape dense_strides = contiguous_strides(index_sizes);
  const Shape& x_strides = x.strides();
  const int64_t count = index_sizes[dim];
  visit_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* from = x.data_ptr<T>();
    T* to = out.data_ptr<T>();
    for_each_row(index_sizes, dim, {&dense_strides, &x_strides},
                 [&](const std::vector<int64_t>& offsets) {
                   for (int64_t k = 0; k < count; ++k) {
                     int64_t position = offsets[0] + k * dense_strides[dim];
                     to[position] = from[offsets[1] + indices[position] * x_strides[dim]];
                   }
                 });
  });
  finish_output(out, ctx.outputs[0]);
}

void gather_backward_kernel(KernelContext& ctx) {
  const Shape& input_sizes = ctx.attrs.get<Shape>("input_sizes");
  const int64_t ndim = static_cast<int64_t>(input_sizes.size());
  const int64_t dim = wrap_dim(ctx.attrs.get<int64_t>("dim"), ndim);
  const int64_t size = ndim == 0 ? 1 : input_sizes[dim];
  std::vector<int64_t> indices = read_indices(ctx, ctx.inputs[1], size, "gather_backward",
                                              tessel::detail::str_cat("dimension ", dim).c_str());
  Tensor grad = cpu::dense_input(ctx, ctx.inputs[0]);
  Tensor out = dense_output(ctx, ctx.outputs[0]);
  std::memset(out.raw_data(), 0, out.nbytes());
  const Shape& index_sizes = grad.sizes();
  visit_float_dtype(out.dtype(), "gather_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* from = grad.data_ptr<T>();
    T* to = out.data_ptr<T>();
    if (ndim == 0) {
      if (grad.numel() == 1) to[0] += from[0];
      return;
    }
    const Shape index_strides = contiguous_strides(index_sizes);
    const Shape out_strides = contiguous_strides(input_sizes);
    const int64_t count = index_sizes[dim];
    // Rows own disjoint targets (they differ outside `dim`): deterministic in parallel.
    for_each_row(index_sizes, dim, {&index_strides, &out_strides},
                 [&](const std::vector<int64_t>& offsets) {
                   for (int64_t k = 0; k < count; ++k) {
                     int64_t position = offsets[0] + k * index_strides[dim];
                     to[offsets[1] + indices[position] * out_strides[dim]] += from[position];
                   }
                 });
  });
  finish_output(out, ctx.outputs[0]);
}

void embedding_kernel(KernelContext& ctx) {
  const Tensor& weight = ctx.inputs[0];
  std::vector<int64_t> indices =
      read_indices(ctx, ctx.inputs[1], weight.sizes()[0], "embedding", "an embedding table");
  Tensor out = dense_output(ctx, ctx.outputs[0]);
  gather_rows(cpu::dense_input(ctx, weight), around(weight.sizes(), 0), indices, out);
  finish_output(out, ctx.outputs[0]);
}

void embedding_backward_kernel(KernelContext& ctx) {
  const Tensor& grad = ctx.inputs[0];
  const int64_t num_weights = ctx.attrs.get<int64_t>("num_weights");
  std::vector<int64_t> indices =
      read_indices(ctx, ctx.inputs[1], num_weights, "embedding_backward", "an embedding table");
  int64_t padding_idx = ctx.attrs.get_or<int64_t>("padding_idx", -1);
  // Over chunks of the indices (KernelContext::chunk) each chunk adds its rows to the table the
  // earlier ones left, every entry in the order of one call.
  const bool first_chunk = !ctx.chunk || ctx.chunk->begin == 0;
  TESSEL_CHECK(first_chunk || ctx.outputs[0].is_contiguous(),
               "embedding_backward: a sum over chunks needs a contiguous output");
  Tensor out = dense_output(ctx, ctx.outputs[0]);
  scatter_add_rows(cpu::dense_input(ctx, grad), around(out.sizes(), 0), indices,
                   padding_idx < 0 ? -1 : padding_idx, out, first_chunk);
  finish_output(out, ctx.outputs[0]);
}

}  // namespace tessel::cpu
