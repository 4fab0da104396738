// Joining and indexing: cat, stack, split, chunk, index_select, gather, embedding. The gradient
// of every gathering op is a deterministic scatter-add into zeros, registered as its own op
// ("index_select_backward", "gather_backward", "embedding_backward") so it runs, records and
// recomputes like any other. This file holds their definitions (shape rules, backward, cost,
// splits); the CPU kernels are in ops/cpu/index.cc.
#include "ops/index.h"

#include <algorithm>
#include <vector>

#include "ops/cpu/kernels.h"
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
  op.kernels[kCpu] = cpu::cat_kernel;
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
  op.kernels[kCpu] = cpu::index_select_kernel;
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
  op.kernels[kCpu] = cpu::index_select_backward_kernel;
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
  op.kernels[kCpu] = cpu::gather_kernel;
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
  op.kernels[kCpu] = cpu::gather_backward_kernel;
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
  op.kernels[kCpu] = cpu::embedding_kernel;
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
  op.kernels[kCpu] = cpu::embedding_backward_kernel;
  op.cost = [](const std::vector<Tensor>& in, const std::vector<Tensor>& out, const Attrs&) {
    return OpCost{static_cast<double>(in[0].numel()),
                  static_cast<double>(2 * in[0].nbytes() + out[0].nbytes())};
  };
  // The table sums over the indices: chunks of them add theirs in.
  op.splits = {{-1, {0, 0}}};
  op.chunk_passes = 1;
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
  return first_output(dispatch(ops::cat, tensors, Attrs{{"dim", dim}}));
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
  return first_output(dispatch(ops::index_select, {x, index}, Attrs{{"dim", dim}}));
}

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  return first_output(dispatch(ops::gather, {x, index}, Attrs{{"dim", dim}}));
}

Tensor embedding(const Tensor& weight, const Tensor& indices, int64_t padding_idx) {
  return first_output(
      dispatch(ops::embedding, {weight, indices}, Attrs{{"padding_idx", padding_idx}}));
}

}  // namespace tessel
