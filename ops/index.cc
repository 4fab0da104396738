// Joining and indexing: cat, stack, split, chunk, index_select, gather, embedding. The gradient
// of every gathering op is a deterministic scatter-add into zeros, registered as its own op
// ("index_select_backward", "gather_backward", "embedding_backward") so it runs, records and
// recomputes like any other.
#include "ops/index.h"

#include <algorithm>
#include <cstring>

#include "ops/cpu/strided_copy.h"
#include "ops/math/indexing.h"
#include "ops/ops.h"
#include "ops/registry_helpers.h"

namespace tessel {

namespace {

constexpr int kCpu = static_cast<int>(DeviceType::kCpu);

void check_index_dtype(const char* op_name, const char* argument, const Tensor& index) {
  TESSEL_CHECK(index.dtype() == DType::kInt64 || index.dtype() == DType::kInt32, op_name, ": ",
               argument, " must be i64 or i32, got ", dtype_name(index.dtype()), " (shape ",
               shape_str(index.sizes()), ")");
}

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
                      int64_t skip_row, const Tensor& out) {
  std::memset(out.raw_data(), 0, out.nbytes());
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

Shape embedding_output_shape(const Tensor& weight, const Tensor& indices) {
  Shape sizes = indices.sizes();
  sizes.push_back(weight.sizes()[1]);
  return sizes;
}

void register_cat() {
  OpDef& op = OpRegistry::get().define(ops::cat);
  op.kind = OpKind::kDataMovement;
  op.autocast = AutocastPolicy::kWiden;
  op.planner = {ParallelSplit::kConcat, "concat"};
  op.shape = [](const std::vector<Tensor>& in, const Attrs& attrs) {
    TESSEL_CHECK(!in.empty(), "cat: expected at least one tensor");
    const Tensor& first = in[0];
    TESSEL_CHECK(first.defined(), "cat: tensor 0 is undefined");
    TESSEL_CHECK(first.dim() > 0,
                 "cat: cannot concatenate 0-d tensors (unsqueeze them or use "
                 "stack)");
    const int64_t dim = wrap_dim(attrs.get<int64_t>("dim"), first.dim(), "cat: dim");
    Shape sizes = first.sizes();
    sizes[dim] = 0;
    for (size_t i = 0; i < in.size(); ++i) {
      const Tensor& t = in[i];
      TESSEL_CHECK(t.defined(), "cat: tensor ", i, " is undefined");
      TESSEL_CHECK(t.dtype() == first.dtype(), "cat: tensor ", i, " has dtype ",
                   dtype_name(t.dtype()), " but tensor 0 has dtype ", dtype_name(first.dtype()),
                   " (convert with .to(dtype) first)");
      bool match = t.dim() == first.dim();
      for (int64_t d = 0; match && d < t.dim(); ++d)
        match = d == dim || t.sizes()[d] == first.sizes()[d];
      TESSEL_CHECK(match, "cat: tensor ", i, " has shape ", shape_str(t.sizes()),
                   " but tensor 0 has shape ", shape_str(first.sizes()),
                   "; sizes must match except in dimension ", dim);
      sizes[dim] += t.sizes()[dim];
    }
    return std::vector<OutputSpec>{{sizes, first.dtype()}};
  };
  op.kernels[kCpu] = [](KernelContext& ctx) {
    const Tensor& out = ctx.outputs[0];
    const int64_t dim = wrap_dim(ctx.attrs.get<int64_t>("dim"), out.dim());
    int64_t position = 0;
    for (const Tensor& input : ctx.inputs) {
      Tensor part = make_view(out, input.sizes(), out.strides(),
                              out.storage_offset() + position * out.strides()[dim]);
      cpu::copy_strided(input, part);
      position += input.sizes()[dim];
    }
  };
  op.backward = [](const BackwardContext& ctx) -> std::vector<Tensor> {
    const Tensor& grad = ctx.grad_outputs[0];
    const int64_t dim = wrap_dim(ctx.attrs.get<int64_t>("dim"), grad.dim());
    std::vector<Tensor> grads(ctx.input_specs.size());
    int64_t position = 0;
    for (size_t i = 0; i < grads.size(); ++i) {
      int64_t size = ctx.input_specs[i].sizes[dim];
      if (ctx.needs_input_grad[i]) grads[i] = slice(grad, dim, position, position + size);
      position += size;
    }
    return grads;
  };
  op.cost = [](const std::vector<Tensor>&, const std::vector<Tensor>& out, const Attrs&) {
    return OpCost{0, 2.0 * static_cast<double>(out[0].nbytes())};
  };
}

void register_index_select() {
  OpDef& op = OpRegistry::get().define(ops::index_select);
  op.kind = OpKind::kIndexing;
  op.autocast = AutocastPolicy::kWiden;
  op.shape = [](const std::vector<Tensor>& in, const Attrs& attrs) {
    const Tensor& x = in.at(0);
    const Tensor& index = in.at(1);
    TESSEL_CHECK(x.dim() > 0, "index_select: cannot index a 0-d tensor");
    const int64_t dim = wrap_dim(attrs.get<int64_t>("dim"), x.dim(), "index_select: dim");
    check_index_dtype("index_select", "index", index);
    TESSEL_CHECK(index.dim() <= 1, "index_select: index must be 1-D, got shape ",
                 shape_str(index.sizes()));
    Shape sizes = x.sizes();
    sizes[dim] = index.numel();
    return std::vector<OutputSpec>{{sizes, x.dtype()}};
  };
  op.kernels[kCpu] = [](KernelContext& ctx) {
    const Tensor& x = ctx.inputs[0];
    const int64_t dim = wrap_dim(ctx.attrs.get<int64_t>("dim"), x.dim());
    std::vector<int64_t> indices = read_indices(ctx, ctx.inputs[1], x.sizes()[dim], "index_select",
                                                detail::str_cat("dimension ", dim).c_str());
    Tensor out = dense_output(ctx, ctx.outputs[0]);
    gather_rows(cpu::dense_input(ctx, x), around(x.sizes(), dim), indices, out);
    finish_output(out, ctx.outputs[0]);
  };
  op.save_inputs = {1};
  op.backward = [](const BackwardContext& ctx) -> std::vector<Tensor> {
    return {dispatch(ops::index_select_backward, {ctx.grad_outputs[0], ctx.saved_inputs[1]},
                     Attrs{{"dim", ctx.attrs.get<int64_t>("dim")},
                           {"input_sizes", ctx.input_specs[0].sizes}})[0],
            Tensor()};
  };
  op.cost = [](const std::vector<Tensor>& in, const std::vector<Tensor>& out, const Attrs&) {
    return OpCost{0, static_cast<double>(2 * out[0].nbytes() + in[1].nbytes())};
  };
}

void register_index_select_backward() {
  // grad (..., count, ...) summed into zeros of input_sizes at rows `index` along dim.
  OpDef& op = OpRegistry::get().define(ops::index_select_backward);
  op.kind = OpKind::kIndexing;
  op.autocast = AutocastPolicy::kWiden;
  op.shape = [](const std::vector<Tensor>& in, const Attrs& attrs) {
    const Shape& input_sizes = attrs.get<Shape>("input_sizes");
    const int64_t dim =
        wrap_dim(attrs.get<int64_t>("dim"), static_cast<int64_t>(input_sizes.size()),
                 "index_select_backward: dim");
    check_index_dtype("index_select_backward", "index", in.at(1));
    Shape expected = input_sizes;
    expected[dim] = in[1].numel();
    TESSEL_CHECK(in[0].sizes() == expected, "index_select_backward: gradient has shape ",
                 shape_str(in[0].sizes()), ", expected ", shape_str(expected));
    return std::vector<OutputSpec>{{input_sizes, in[0].dtype()}};
  };
  op.kernels[kCpu] = [](KernelContext& ctx) {
    const Tensor& grad = ctx.inputs[0];
    const Shape& input_sizes = ctx.attrs.get<Shape>("input_sizes");
    const int64_t dim =
        wrap_dim(ctx.attrs.get<int64_t>("dim"), static_cast<int64_t>(input_sizes.size()));
    std::vector<int64_t> indices =
        read_indices(ctx, ctx.inputs[1], input_sizes[dim], "index_select_backward",
                     detail::str_cat("dimension ", dim).c_str());
    Tensor out = dense_output(ctx, ctx.outputs[0]);
    scatter_add_rows(cpu::dense_input(ctx, grad), around(input_sizes, dim), indices, -1, out);
    finish_output(out, ctx.outputs[0]);
  };
  op.save_inputs = {1};
  op.backward = [](const BackwardContext& ctx) -> std::vector<Tensor> {
    return {index_select(ctx.grad_outputs[0], ctx.attrs.get<int64_t>("dim"), ctx.saved_inputs[1]),
            Tensor()};
  };
  op.cost = [](const std::vector<Tensor>& in, const std::vector<Tensor>& out, const Attrs&) {
    return OpCost{static_cast<double>(in[0].numel()),
                  static_cast<double>(2 * in[0].nbytes() + out[0].nbytes())};
  };
}

void register_gather() {
  OpDef& op = OpRegistry::get().define(ops::gather);
  op.kind = OpKind::kIndexing;
  op.autocast = AutocastPolicy::kWiden;
  op.shape = [](const std::vector<Tensor>& in, const Attrs& attrs) {
    const Tensor& x = in.at(0);
    const Tensor& index = in.at(1);
    const int64_t dim = wrap_dim(attrs.get<int64_t>("dim"), x.dim(), "gather: dim");
    check_index_dtype("gather", "index", index);
    TESSEL_CHECK(index.dim() == x.dim(), "gather: index has ", index.dim(), " dimensions (shape ",
                 shape_str(index.sizes()), ") but input has ", x.dim(), " (shape ",
                 shape_str(x.sizes()), ")");
    for (int64_t d = 0; d < x.dim(); ++d) {
      TESSEL_CHECK(d == dim || index.sizes()[d] <= x.sizes()[d], "gather: index shape ",
                   shape_str(index.sizes()), " exceeds input shape ", shape_str(x.sizes()),
                   " in dimension ", d, " (only dimension ", dim, " may be larger)");
    }
    return std::vector<OutputSpec>{{index.sizes(), x.dtype()}};
  };
  op.kernels[kCpu] = [](KernelContext& ctx) {
    const Tensor& x = ctx.inputs[0];
    const int64_t dim = wrap_dim(ctx.attrs.get<int64_t>("dim"), x.dim());
    const int64_t size = x.dim() == 0 ? 1 : x.sizes()[dim];
    std::vector<int64_t> indices = read_indices(ctx, ctx.inputs[1], size, "gather",
                                                detail::str_cat("dimension ", dim).c_str());
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
  };
  op.save_inputs = {1};
  op.backward = [](const BackwardContext& ctx) -> std::vector<Tensor> {
    return {dispatch(ops::gather_backward, {ctx.grad_outputs[0], ctx.saved_inputs[1]},
                     Attrs{{"dim", ctx.attrs.get<int64_t>("dim")},
                           {"input_sizes", ctx.input_specs[0].sizes}})[0],
            Tensor()};
  };
  op.cost = [](const std::vector<Tensor>& in, const std::vector<Tensor>& out, const Attrs&) {
    return OpCost{0, static_cast<double>(2 * out[0].nbytes() + in[1].nbytes())};
  };
}

void register_gather_backward() {
  // Scatter-add of grad (index's shape) into zeros of input_sizes along dim.
  OpDef& op = OpRegistry::get().define(ops::gather_backward);
  op.kind = OpKind::kIndexing;
  op.autocast = AutocastPolicy::kWiden;
  op.shape = [](const std::vector<Tensor>& in, const Attrs& attrs) {
    const Shape& input_sizes = attrs.get<Shape>("input_sizes");
    check_index_dtype("gather_backward", "index", in.at(1));
    TESSEL_CHECK(in[0].sizes() == in[1].sizes(), "gather_backward: gradient shape ",
                 shape_str(in[0].sizes()), " differs from index shape ", shape_str(in[1].sizes()));
    TESSEL_CHECK(in[1].dim() == static_cast<int64_t>(input_sizes.size()),
                 "gather_backward: index shape ", shape_str(in[1].sizes()),
                 " does not match input shape ", shape_str(input_sizes));
    wrap_dim(attrs.get<int64_t>("dim"), static_cast<int64_t>(input_sizes.size()),
             "gather_backward: dim");
    return std::vector<OutputSpec>{{input_sizes, in[0].dtype()}};
  };
  op.kernels[kCpu] = [](KernelContext& ctx) {
    const Shape& input_sizes = ctx.attrs.get<Shape>("input_sizes");
    const int64_t ndim = static_cast<int64_t>(input_sizes.size());
    const int64_t dim = wrap_dim(ctx.attrs.get<int64_t>("dim"), ndim);
    const int64_t size = ndim == 0 ? 1 : input_sizes[dim];
    std::vector<int64_t> indices = read_indices(ctx, ctx.inputs[1], size, "gather_backward",
                                                detail::str_cat("dimension ", dim).c_str());
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
  };
  op.save_inputs = {1};
  op.backward = [](const BackwardContext& ctx) -> std::vector<Tensor> {
    return {gather(ctx.grad_outputs[0], ctx.attrs.get<int64_t>("dim"), ctx.saved_inputs[1]),
            Tensor()};
  };
  op.cost = [](const std::vector<Tensor>& in, const std::vector<Tensor>& out, const Attrs&) {
    return OpCost{static_cast<double>(in[0].numel()),
                  static_cast<double>(2 * in[0].nbytes() + out[0].nbytes())};
  };
}

void register_embedding() {
  // weight (num, dim), indices any shape -> indices.shape + [dim].
  OpDef& op = OpRegistry::get().define(ops::embedding);
  op.kind = OpKind::kIndexing;
  op.autocast = AutocastPolicy::kWiden;
  op.planner = {ParallelSplit::kEmbeddingTable, "embedding"};
  op.shape = [](const std::vector<Tensor>& in, const Attrs& attrs) {
    const Tensor& weight = in.at(0);
    const Tensor& indices = in.at(1);
    TESSEL_CHECK(weight.dim() == 2,
                 "embedding: weight must be 2-D (num_embeddings, embedding_dim), got shape ",
                 shape_str(weight.sizes()));
    check_index_dtype("embedding", "indices", indices);
    int64_t padding_idx = attrs.get_or<int64_t>("padding_idx", -1);
    TESSEL_CHECK(padding_idx < weight.sizes()[0], "embedding: padding_idx ", padding_idx,
                 " is out of range for a table of ", weight.sizes()[0], " rows");
    return std::vector<OutputSpec>{{embedding_output_shape(weight, indices), weight.dtype()}};
  };
  op.kernels[kCpu] = [](KernelContext& ctx) {
    const Tensor& weight = ctx.inputs[0];
    std::vector<int64_t> indices =
        read_indices(ctx, ctx.inputs[1], weight.sizes()[0], "embedding", "an embedding table");
    Tensor out = dense_output(ctx, ctx.outputs[0]);
    gather_rows(cpu::dense_input(ctx, weight), around(weight.sizes(), 0), indices, out);
    finish_output(out, ctx.outputs[0]);
  };
  op.save_inputs = {1};
  op.backward = [](const BackwardContext& ctx) -> std::vector<Tensor> {
    if (!ctx.needs_input_grad[0]) return {Tensor(), Tensor()};
    return {dispatch(ops::embedding_backward, {ctx.grad_outputs[0], ctx.saved_inputs[1]},
                     Attrs{{"num_weights", ctx.input_specs[0].sizes[0]},
                           {"padding_idx", ctx.attrs.get_or<int64_t>("padding_idx", -1)}})[0],
            Tensor()};
  };
  op.cost = [](const std::vector<Tensor>& in, const std::vector<Tensor>& out, const Attrs&) {
    return OpCost{0, static_cast<double>(2 * out[0].nbytes() + in[1].nbytes())};
  };
  // Splittable along the indices' first dimension; each chunk reads the whole table.
  op.splits = {{0, {-1, 0}}};
}

void register_embedding_backward() {
  // grad (indices.shape + [dim]) summed into rows of a (num_weights, dim) zero table; the
  // padding row gets nothing.
  OpDef& op = OpRegistry::get().define(ops::embedding_backward);
  op.kind = OpKind::kIndexing;
  op.autocast = AutocastPolicy::kWiden;
  op.shape = [](const std::vector<Tensor>& in, const Attrs& attrs) {
    const Tensor& grad = in.at(0);
    const Tensor& indices = in.at(1);
    check_index_dtype("embedding_backward", "indices", indices);
    TESSEL_CHECK(
        grad.dim() == indices.dim() + 1 &&
            std::equal(indices.sizes().begin(), indices.sizes().end(), grad.sizes().begin()),
        "embedding_backward: gradient shape ", shape_str(grad.sizes()),
        " does not extend indices shape ", shape_str(indices.sizes()));
    return std::vector<OutputSpec>{
        {{attrs.get<int64_t>("num_weights"), grad.sizes().back()}, grad.dtype()}};
  };
  op.kernels[kCpu] = [](KernelContext& ctx) {
    const Tensor& grad = ctx.inputs[0];
    const int64_t num_weights = ctx.attrs.get<int64_t>("num_weights");
    std::vector<int64_t> indices =
        read_indices(ctx, ctx.inputs[1], num_weights, "embedding_backward", "an embedding table");
    int64_t padding_idx = ctx.attrs.get_or<int64_t>("padding_idx", -1);
    Tensor out = dense_output(ctx, ctx.outputs[0]);
    scatter_add_rows(cpu::dense_input(ctx, grad), around(out.sizes(), 0), indices,
                     padding_idx < 0 ? -1 : padding_idx, out);
    finish_output(out, ctx.outputs[0]);
  };
  op.cost = [](const std::vector<Tensor>& in, const std::vector<Tensor>& out, const Attrs&) {
    return OpCost{static_cast<double>(in[0].numel()),
                  static_cast<double>(2 * in[0].nbytes() + out[0].nbytes())};
  };
}

}  // namespace

TESSEL_REGISTER_OPS(index) {
  register_cat();
  register_index_select();
  register_index_select_backward();
  register_gather();
  register_gather_backward();
  register_embedding();
  register_embedding_backward();
}

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  return dispatch(ops::cat, tensors, Attrs{{"dim", dim}})[0];
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  TESSEL_CHECK(!tensors.empty(), "stack: expected at least one tensor");
  for (size_t i = 0; i < tensors.size(); ++i) {
    TESSEL_CHECK(tensors[i].defined(), "stack: tensor ", i, " is undefined");
    TESSEL_CHECK(tensors[i].sizes() == tensors[0].sizes(), "stack: tensor ", i, " has shape ",
                 shape_str(tensors[i].sizes()), " but tensor 0 has shape ",
                 shape_str(tensors[0].sizes()), "; all shapes must be equal");
  }
  const int64_t wrapped = wrap_dim(dim, tensors[0].dim() + 1, "stack: dim");
  std::vector<Tensor> unsqueezed;
  unsqueezed.reserve(tensors.size());
  for (const Tensor& t : tensors) unsqueezed.push_back(unsqueeze(t, wrapped));
  return cat(unsqueezed, wrapped);
}

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  TESSEL_CHECK(x.dim() > 0, "split: cannot split a 0-d tensor");
  const int64_t wrapped = wrap_dim(dim, x.dim(), "split: dim");
  const int64_t size = x.sizes()[wrapped];
  TESSEL_CHECK(split_size > 0, "split: split_size must be positive, got ", split_size);
  std::vector<Tensor> parts;
  if (size == 0) parts.push_back(slice(x, wrapped, 0, 0));
  for (int64_t start = 0; start < size; start += split_size)
    parts.push_back(slice(x, wrapped, start, std::min(size, start + split_size)));
  return parts;
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  TESSEL_CHECK(chunks > 0, "chunk: chunks must be positive, got ", chunks);
  TESSEL_CHECK(x.dim() > 0, "chunk: cannot chunk a 0-d tensor");
  const int64_t size = x.sizes()[wrap_dim(dim, x.dim(), "chunk: dim")];
  // Like PyTorch: equal chunks of ceil(size / chunks); the last may be smaller, and there may be
  // fewer than `chunks` of them.
  const int64_t chunk_size = std::max<int64_t>(1, (size + chunks - 1) / chunks);
  return split(x, chunk_size, dim);
}

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  return dispatch(ops::index_select, {x, index}, Attrs{{"dim", dim}})[0];
}

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  return dispatch(ops::gather, {x, index}, Attrs{{"dim", dim}})[0];
}

Tensor embedding(const Tensor& weight, const Tensor& indices, int64_t padding_idx) {
  return dispatch(ops::embedding, {weight, indices}, Attrs{{"padding_idx", padding_idx}})[0];
}

}  // namespace tessel
