#include "parallel/tensor_parallel.h"

#include <cmath>
#include <mutex>
#include <vector>

#include "core/autograd.h"
#include "ops/cpu/strided_copy.h"
#include "ops/ops.h"
#include "ops/registry_helpers.h"

namespace tessel::parallel {

// ---- group registry ----

namespace {

struct GroupRegistry {
  std::mutex mutex;
  std::vector<std::shared_ptr<Communicator>> groups;  // id = index
};

GroupRegistry& group_registry() {
  static GroupRegistry registry;
  return registry;
}

}  // namespace

int64_t register_tp_group(std::shared_ptr<Communicator> group) {
  TESSEL_CHECK(group != nullptr, "register_tp_group: the communicator is null");
  GroupRegistry& registry = group_registry();
  std::lock_guard<std::mutex> lock(registry.mutex);
  for (size_t i = 0; i < registry.groups.size(); ++i)
    if (registry.groups[i] == group) return static_cast<int64_t>(i);
  registry.groups.push_back(std::move(group));
  return static_cast<int64_t>(registry.groups.size()) - 1;
}

const std::shared_ptr<Communicator>& tp_group(int64_t id) {
  GroupRegistry& registry = group_registry();
  std::lock_guard<std::mutex> lock(registry.mutex);
  TESSEL_CHECK(id >= 0 && id < static_cast<int64_t>(registry.groups.size()),
               "tensor parallel: unknown group id ", id, " (", registry.groups.size(),
               " registered; register the communicator with register_tp_group)");
  return registry.groups[static_cast<size_t>(id)];
}

ReduceOp tp_reduce_op(const Attrs& attrs) {
  return attrs.get_or<std::string>("reduce", "sum") == "max" ? ReduceOp::kMax : ReduceOp::kSum;
}

// ---- collective ops ----

namespace {

void check_tp_input(const char* op, const std::vector<Tensor>& inputs, const Attrs& attrs,
                    bool needs_last_dim) {
  TESSEL_CHECK(inputs.size() == 1 && inputs[0].defined(), op, ": expected one tensor input");
  TESSEL_CHECK(is_floating(inputs[0].dtype()), op, ": input must be floating point, got ",
               dtype_name(inputs[0].dtype()));
  TESSEL_CHECK(!needs_last_dim || inputs[0].dim() >= 1, op,
               ": input needs at least one dim (the split one is the last), got a scalar");
  tp_group(attrs.get<int64_t>("group"));  // fails early on an unknown id
}

const std::shared_ptr<Communicator>& group_of(const Attrs& attrs) {
  return tp_group(attrs.get<int64_t>("group"));
}

Attrs group_attrs(int64_t group) { return Attrs{{"group", group}}; }

Attrs group_attrs(int64_t group, int64_t dim) { return Attrs{{"group", group}, {"dim", dim}}; }

Attrs all_to_all_attrs(int64_t group, int64_t split_dim, int64_t concat_dim) {
  return Attrs{{"group", group}, {"split_dim", split_dim}, {"concat_dim", concat_dim}};
}

// A view of `t` with `sizes` and `strides` at `offset` elements past its own first element.
Tensor strided_view(const Tensor& t, Shape sizes, Shape strides, int64_t offset) {
  return Tensor(make_tensor_impl(t.storage(), std::move(sizes), std::move(strides),
                                 t.storage_offset() + offset, t.dtype()));
}

// The shape of this rank's part of the input along the op's dim (tp_scatter, tp_reduce_scatter).
std::vector<OutputSpec> part_shape(const char* op, const std::vector<Tensor>& in,
                                   const Attrs& attrs) {
  check_tp_input(op, in, attrs, true);
  const int tp = group_of(attrs)->size();
  Shape sizes = in[0].sizes();
  const auto dim = static_cast<size_t>(gather_geometry(in[0], 1, attrs).dim);
  TESSEL_CHECK(sizes[dim] % tp == 0, op, ": dim ", dim, " (", sizes[dim], ", input shape ",
               shape_str(sizes), ") is not divisible by the group size ", tp);
  sizes[dim] /= tp;
  return std::vector<OutputSpec>{{sizes, in[0].dtype()}};
}

OpCost copy_cost(const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                 const Attrs&) {
  return OpCost{0, static_cast<double>(inputs[0].nbytes() + outputs[0].nbytes())};
}

}  // namespace

TESSEL_REGISTER_OPS(tensor_parallel) {
  {
    OpDef& op = OpRegistry::get().define(ops::tp_copy);
    op.kind = OpKind::kCommunication;
    op.autocast = AutocastPolicy::kWiden;
    op.shape = [](const std::vector<Tensor>& in, const Attrs& attrs) {
      check_tp_input("copy_to_tp", in, attrs, false);
      return std::vector<OutputSpec>{{in[0].sizes(), in[0].dtype()}};
    };
    op.kernels[static_cast<int>(DeviceType::kCpu)] = [](KernelContext& ctx) {
      cpu::copy_strided(ctx.inputs[0], ctx.outputs[0]);
    };
    op.backward = [](const BackwardContext& ctx) -> std::vector<Tensor> {
      if (!ctx.grad_outputs[0].defined()) return {Tensor()};
      return {reduce_from_tp(ctx.grad_outputs[0], ctx.attrs.get<int64_t>("group"))};
    };
    op.cost = copy_cost;
    op.flags.pure = false;  // a collective backward: never recomputed from a recipe
  }
  {
    OpDef& op = OpRegistry::get().define(ops::tp_reduce);
    op.kind = OpKind::kCommunication;
    op.autocast = AutocastPolicy::kWiden;
    op.shape = [](const std::vector<Tensor>& in, const Attrs& attrs) {
      check_tp_input("reduce_from_tp", in, attrs, false);
      return std::vector<OutputSpec>{{in[0].sizes(), in[0].dtype()}};
    };
    op.kernels[static_cast<int>(DeviceType::kCpu)] = [](KernelContext& ctx) {
      // The reduction runs on a contiguous buffer of our own, so the communicator needs no copies.
      Tensor buffer = ctx.workspace(ctx.inputs[0].sizes(), ctx.inputs[0].dtype());
      cpu::copy_strided(ctx.inputs[0], buffer);
      group_of(ctx.attrs)->all_reduce(buffer, tp_reduce_op(ctx.attrs));
      cpu::copy_strided(buffer, ctx.outputs[0]);
    };
    op.backward = [](const BackwardContext& ctx) -> std::vector<Tensor> {
      TESSEL_CHECK(tp_reduce_op(ctx.attrs) == ReduceOp::kSum,
                   "max_from_tp: the all-reduced max has no gradient");
      if (!ctx.grad_outputs[0].defined()) return {Tensor()};
      return {copy_to_tp(ctx.grad_outputs[0], ctx.attrs.get<int64_t>("group"))};
    };
    op.cost = copy_cost;
    op.flags.pure = false;
  }
  {
    OpDef& op = OpRegistry::get().define(ops::tp_gather);
    op.kind = OpKind::kCommunication;
    op.autocast = AutocastPolicy::kWiden;
    op.shape = [](const std::vector<Tensor>& in, const Attrs& attrs) {
      check_tp_input("gather_from_tp", in, attrs, true);
      Shape sizes = in[0].sizes();
      sizes[static_cast<size_t>(gather_geometry(in[0], 1, attrs).dim)] *= group_of(attrs)->size();
      return std::vector<OutputSpec>{{sizes, in[0].dtype()}};
    };
    op.kernels[static_cast<int>(DeviceType::kCpu)] = [](KernelContext& ctx) {
      // all_gather concatenates flat buffers: every rank's dense input in rank order, each read
      // into its runs of the output.
      const Tensor& input = ctx.inputs[0];
      const auto& group = group_of(ctx.attrs);
      const GatherGeometry g = gather_geometry(input, group->size(), ctx.attrs);
      const int64_t numel = input.numel();
      const Shape dense_strides = contiguous_strides(input.sizes());
      Tensor send = strided_view(input, {numel}, {1}, 0);
      if (!input.is_contiguous()) {
        send = ctx.workspace({numel}, input.dtype());
        cpu::copy_strided(input, strided_view(send, input.sizes(), dense_strides, 0));
      }
      Tensor receive = ctx.workspace({numel * group->size()}, input.dtype());
      group->all_gather(send, receive);
      Tensor& output = ctx.outputs[0];
      Tensor dense =
          output.is_contiguous() ? output : ctx.workspace(output.sizes(), output.dtype());
      cpu::copy_strided(
          strided_view(receive, g.received_sizes, g.received_strides, 0),
          strided_view(dense, g.received_sizes, contiguous_strides(g.received_sizes), 0));
      if (!output.is_contiguous()) cpu::copy_strided(dense, output);
    };
    op.backward = [](const BackwardContext& ctx) -> std::vector<Tensor> {
      if (!ctx.grad_outputs[0].defined()) return {Tensor()};
      return {scatter_to_tp(ctx.grad_outputs[0], ctx.attrs.get<int64_t>("group"),
                            ctx.attrs.get_or<int64_t>("dim", -1))};
    };
    op.cost = copy_cost;
    op.flags.pure = false;
  }
  {
    OpDef& op = OpRegistry::get().define(ops::tp_scatter);
    op.kind = OpKind::kCommunication;
    op.autocast = AutocastPolicy::kWiden;
    op.shape = [](const std::vector<Tensor>& in, const Attrs& attrs) {
      return part_shape("scatter_to_tp", in, attrs);
    };
    op.kernels[static_cast<int>(DeviceType::kCpu)] = [](KernelContext& ctx) {
      const Tensor& input = ctx.inputs[0];
      const int64_t dim = gather_geometry(input, 1, ctx.attrs).dim;
      const int64_t start = ctx.outputs[0].size(dim) * group_of(ctx.attrs)->rank();
      cpu::copy_strided(
          strided_view(input, ctx.outputs[0].sizes(), input.strides(), start * input.stride(dim)),
          ctx.outputs[0]);
    };
    op.backward = [](const BackwardContext& ctx) -> std::vector<Tensor> {
      if (!ctx.grad_outputs[0].defined()) return {Tensor()};
      return {gather_from_tp(ctx.grad_outputs[0], ctx.attrs.get<int64_t>("group"),
                             ctx.attrs.get_or<int64_t>("dim", -1))};
    };
    op.cost = copy_cost;
  }
  {
    OpDef& op = OpRegistry::get().define(ops::tp_all_to_all);
    op.kind = OpKind::kCommunication;
    op.autocast = AutocastPolicy::kWiden;
    op.shape = [](const std::vector<Tensor>& in, const Attrs& attrs) {
      check_tp_input("all_to_all_tp", in, attrs, true);
      const Shape& sizes = in[0].sizes();
      const auto rank = static_cast<int64_t>(sizes.size());
      const int64_t split = attrs.get<int64_t>("split_dim");
      const int64_t concat = attrs.get<int64_t>("concat_dim");
      TESSEL_CHECK(split >= 0 && split < rank && concat >= 0 && concat < rank && split != concat,
                   "all_to_all_tp: split_dim ", split, " and concat_dim ", concat,
                   " must be two different dims of the input of shape ", shape_str(sizes));
      const int parts = group_of(attrs)->size();
      TESSEL_CHECK(sizes[split] % parts == 0, "all_to_all_tp: dim ", split, " (", sizes[split],
                   ", input shape ", shape_str(sizes), ") is not divisible by the group size ",
                   parts);
      Shape out = sizes;
      out[split] /= parts;
      out[concat] *= parts;
      return std::vector<OutputSpec>{{out, in[0].dtype()}};
    };
    op.kernels[static_cast<int>(DeviceType::kCpu)] = [](KernelContext& ctx) {
      const Tensor& input = ctx.inputs[0];
      Communicator& group = *group_of(ctx.attrs);
      const AllToAllGeometry g = all_to_all_geometry(input, group.size(), ctx.attrs);
      const Shape piece_strides = contiguous_strides(g.piece_sizes);
      const int64_t piece_numel = shape_numel(g.piece_sizes);
      Tensor received = ctx.workspace({group.size() * piece_numel}, input.dtype());
      Tensor piece = ctx.workspace(g.piece_sizes, input.dtype());
      for (const AllToAllStep& step : all_to_all_schedule(group.rank(), group.size())) {
        Tensor slot = strided_view(received, g.piece_sizes, piece_strides, step.peer * piece_numel);
        Tensor mine =
            strided_view(input, g.piece_sizes, input.strides(), step.peer * g.piece_offset);
        if (step.peer == group.rank()) {
          cpu::copy_strided(mine, slot);
          continue;
        }
        cpu::copy_strided(mine, piece);
        if (step.send_first) group.send(piece, step.peer);
        group.recv(slot, step.peer);
        if (!step.send_first) group.send(piece, step.peer);
      }
      cpu::copy_strided(
          strided_view(received, g.received_sizes, g.received_strides, 0),
          strided_view(ctx.outputs[0], g.received_sizes, contiguous_strides(g.received_sizes), 0));
    };
    op.backward = [](const BackwardContext& ctx) -> std::vector<Tensor> {
      if (!ctx.grad_outputs[0].defined()) return {Tensor()};
      return {all_to_all_tp(ctx.grad_outputs[0], ctx.attrs.get<int64_t>("concat_dim"),
                            ctx.attrs.get<int64_t>("split_dim"), ctx.attrs.get<int64_t>("group"))};
    };
    op.cost = copy_cost;
    op.flags.pure = false;
  }
  {
    OpDef& op = OpRegistry::get().define(ops::tp_reduce_scatter);
    op.kind = OpKind::kCommunication;
    op.autocast = AutocastPolicy::kWiden;
    op.shape = [](const std::vector<Tensor>& in, const Attrs& attrs) {
      return part_shape("reduce_scatter_to_tp", in, attrs);
    };
    op.kernels[static_cast<int>(DeviceType::kCpu)] = [](KernelContext& ctx) {
      const Tensor& input = ctx.inputs[0];
      Communicator& group = *group_of(ctx.attrs);
      const int64_t dim = gather_geometry(input, 1, ctx.attrs).dim;
      const ReduceScatterGeometry g = reduce_scatter_geometry(input, group.size(), dim);
      // Rank r's part of every rank's input as row r of a dense buffer; this rank's row of the
      // sum comes back dense, in the output's shape.
      const int64_t part_numel = ctx.outputs[0].numel();
      Tensor send = ctx.workspace({group.size(), part_numel}, input.dtype());
      cpu::copy_strided(strided_view(input, g.parts_sizes, g.parts_strides, 0),
                        strided_view(send, g.parts_sizes, contiguous_strides(g.parts_sizes), 0));
      Tensor received = ctx.workspace({1, part_numel}, input.dtype());
      group.reduce_scatter(send, received);
      const Shape& out_sizes = ctx.outputs[0].sizes();
      cpu::copy_strided(strided_view(received, out_sizes, contiguous_strides(out_sizes), 0),
                        ctx.outputs[0]);
    };
    op.backward = [](const BackwardContext& ctx) -> std::vector<Tensor> {
      if (!ctx.grad_outputs[0].defined()) return {Tensor()};
      return {gather_from_tp(ctx.grad_outputs[0], ctx.attrs.get<int64_t>("group"),
                             ctx.attrs.get<int64_t>("dim"))};
    };
    op.cost = copy_cost;
    op.flags.pure = false;
  }
}

ReduceScatterGeometry reduce_scatter_geometry(const Tensor& input, int parts, int64_t dim) {
  ReduceScatterGeometry g{input.sizes(), input.strides()};
  const auto d = static_cast<size_t>(dim);
  g.parts_sizes[d] /= parts;
  g.parts_sizes.insert(g.parts_sizes.begin(), parts);
  g.parts_strides.insert(g.parts_strides.begin(), g.parts_sizes[d + 1] * input.stride(dim));
  return g;
}

std::vector<AllToAllStep> all_to_all_schedule(int rank, int size) {
  std::vector<AllToAllStep> steps;
  for (int round = 0; round < size; ++round) {
    const int peer = ((round - rank) % size + size) % size;
    steps.push_back({peer, rank < peer});
  }
  return steps;
}

AllToAllGeometry all_to_all_geometry(const Tensor& input, int parts, const Attrs& attrs) {
  const int64_t split_dim = attrs.get<int64_t>("split_dim");
  const int64_t concat_dim = attrs.get<int64_t>("concat_dim");
  AllToAllGeometry g;
  g.piece_sizes = input.sizes();
  g.piece_sizes[split_dim] /= parts;
  g.piece_offset = g.piece_sizes[split_dim] * input.stride(split_dim);
  // The output read as (..., parts, rows, ...) at concat_dim from the dense buffer of every
  // received piece in rank order.
  const Shape dense = contiguous_strides(g.piece_sizes);
  for (int64_t d = 0; d < input.dim(); ++d) {
    if (d == concat_dim) {
      g.received_sizes.push_back(parts);
      g.received_strides.push_back(shape_numel(g.piece_sizes));
    }
    g.received_sizes.push_back(g.piece_sizes[d]);
    g.received_strides.push_back(dense[d]);
  }
  return g;
}

GatherGeometry gather_geometry(const Tensor& input, int parts, const Attrs& attrs) {
  GatherGeometry g;
  g.dim = wrap_dim(attrs.get_or<int64_t>("dim", -1), input.dim(), "tp_gather: dim");
  // The output (outer, parts, run) of each rank's (outer, run) in turn, where run is the
  // elements from `dim` on: rank r's input sits at r * numel in the buffer.
  int64_t outer = 1;
  for (int64_t d = 0; d < g.dim; ++d) outer *= input.size(d);
  const int64_t numel = input.numel();
  const int64_t run = outer > 0 ? numel / std::max<int64_t>(outer, 1) : 0;
  g.received_sizes = {outer, parts, run};
  g.received_strides = {run, numel, 1};
  return g;
}

Tensor copy_to_tp(const Tensor& x, int64_t group) {
  return dispatch(ops::tp_copy, {x}, group_attrs(group))[0];
}
Tensor reduce_from_tp(const Tensor& x, int64_t group) {
  return dispatch(ops::tp_reduce, {x}, group_attrs(group))[0];
}
Tensor gather_from_tp(const Tensor& x, int64_t group, int64_t dim) {
  return dispatch(ops::tp_gather, {x}, dim == -1 ? group_attrs(group) : group_attrs(group, dim))[0];
}
Tensor scatter_to_tp(const Tensor& x, int64_t group, int64_t dim) {
  return dispatch(ops::tp_scatter, {x},
                  dim == -1 ? group_attrs(group) : group_attrs(group, dim))[0];
}
Tensor all_to_all_tp(const Tensor& x, int64_t split_dim, int64_t concat_dim, int64_t group) {
  return dispatch(ops::tp_all_to_all, {x}, all_to_all_attrs(group, split_dim, concat_dim))[0];
}
Tensor reduce_scatter_to_tp(const Tensor& x, int64_t group, int64_t dim) {
  TESSEL_CHECK(x.defined(), "reduce_scatter_to_tp: the input is undefined");
  return dispatch(ops::tp_reduce_scatter, {x},
                  group_attrs(group, wrap_dim(dim, x.dim(), "reduce_scatter_to_tp: dim")))[0];
}
Tensor max_from_tp(const Tensor& x, int64_t group) {
  NoGradGuard no_grad;
  return dispatch(ops::tp_reduce, {x.detach()},
                  Attrs{{"group", group}, {"reduce", std::string("max")}})[0];
}

// ---- layers ----

int64_t split_size(const char* layer, const char* what, int64_t size, int64_t group) {
  const int tp = tp_group(group)->size();
  TESSEL_CHECK(size > 0 && size % tp == 0, layer, ": ", what, " (", size,
               ") must be a positive multiple of the tensor parallel size ", tp);
  return size / tp;
}

namespace {

// Copies `source` into the parameter `target` (shapes must agree), outside autograd.
void assign(const Tensor& target, const Tensor& source, const std::string& what) {
  TESSEL_CHECK(target.sizes() == source.sizes(), "tensor parallel load: ", what, " has shape ",
               shape_str(target.sizes()), " but the slice of the full model is ",
               shape_str(source.sizes()));
  NoGradGuard no_grad;
  Tensor copy = target;
  copy.copy_(source);
}

// A 0-dim tensor on `like`'s device (ops refuse inputs on different devices).
Tensor scalar_on(const Tensor& like, double value, DType dtype) {
  return full({}, value, TensorOptions(dtype).device(like.device()));
}

}  // namespace

ColumnParallelLinear::ColumnParallelLinear(int64_t in_features_in, int64_t out_features_in,
                                           int64_t group_in, bool bias_in, bool gather_output_in)
    : nn::Linear(
          "ColumnParallelLinear",
          nn::LinearOptions(in_features_in, split_size("ColumnParallelLinear", "out_features",
                                                       out_features_in, group_in))
              .bias(bias_in)),
      in_features(in_features_in),
      out_features(out_features_in),
      group(group_in),
      tp_size(tp_group(group_in)->size()),
      tp_rank(tp_group(group_in)->rank()),
      gather_output(gather_output_in) {}

Tensor ColumnParallelLinear::forward(const Tensor& input) {
  Tensor output = linear(copy_to_tp(input, group), weight, bias);
  return gather_output ? gather_from_tp(output, group) : output;
}

void ColumnParallelLinear::load_from(const nn::Linear& full) {
  const int64_t local = weight.size(0);
  assign(weight, narrow(full.weight, 0, tp_rank * local, local), "ColumnParallelLinear.weight");
  TESSEL_CHECK(bias.defined() == full.bias.defined(),
               "ColumnParallelLinear: bias presence differs from the full layer's");
  if (bias.defined())
    assign(bias, narrow(full.bias, 0, tp_rank * local, local), "ColumnParallelLinear.bias");
}

std::map<std::string, int64_t> ColumnParallelLinear::split_parameter_dims() const {
  if (bias.defined()) return {{"weight", 0}, {"bias", 0}};
  return {{"weight", 0}};
}

RowParallelLinear::RowParallelLinear(int64_t in_features_in, int64_t out_features_in,
                                     int64_t group_in, bool bias_in, bool input_is_parallel_in)
    : nn::Linear("RowParallelLinear",
                 nn::LinearOptions(
                     split_size("RowParallelLinear", "in_features", in_features_in, group_in),
                     out_features_in)
                     .bias(bias_in)),
      in_features(in_features_in),
      out_features(out_features_in),
      group(group_in),
      tp_size(tp_group(group_in)->size()),
      tp_rank(tp_group(group_in)->rank()),
      input_is_parallel(input_is_parallel_in) {}

Tensor RowParallelLinear::forward(const Tensor& input) {
  Tensor local_input = input_is_parallel ? input : scatter_to_tp(input, group);
  Tensor output = reduce_from_tp(linear(local_input, weight), group);
  // Added after the reduce, so once rather than once per rank.
  return bias.defined() ? add(output, bias) : output;
}

void RowParallelLinear::load_from(const nn::Linear& full) {
  const int64_t local = weight.size(1);
  assign(weight, narrow(full.weight, 1, tp_rank * local, local), "RowParallelLinear.weight");
  TESSEL_CHECK(bias.defined() == full.bias.defined(),
               "RowParallelLinear: bias presence differs from the full layer's");
  if (bias.defined()) assign(bias, full.bias, "RowParallelLinear.bias");
}

std::map<std::string, int64_t> RowParallelLinear::split_parameter_dims() const {
  return {{"weight", 1}};  // the bias is added after the reduce: replicated
}

std::shared_ptr<nn::Linear> make_linear(int64_t in_features, int64_t out_features, int64_t group,
                                        LinearSplit split) {
  if (group < 0) return std::make_shared<nn::Linear>(in_features, out_features);
  if (split == LinearSplit::kColumns)
    return std::make_shared<ColumnParallelLinear>(in_features, out_features, group);
  return std::make_shared<RowParallelLinear>(in_features, out_features, group);
}

VocabParallelEmbedding::VocabParallelEmbedding(int64_t num_embeddings_in, int64_t embedding_dim_in,
                                               int64_t group_in)
    : nn::Embedding("VocabParallelEmbedding",
                    nn::EmbeddingOptions(split_size("VocabParallelEmbedding", "num_embeddings",
                                                    num_embeddings_in, group_in),
                                         embedding_dim_in)),
      num_embeddings(num_embeddings_in),
      embedding_dim(embedding_dim_in),
      group(group_in),
      tp_size(tp_group(group_in)->size()),
      tp_rank(tp_group(group_in)->rank()) {
  vocab_start = tp_rank * weight.size(0);
  vocab_end = vocab_start + weight.size(0);
}

Tensor VocabParallelEmbedding::forward(const Tensor& indices) {
  return vocab_parallel_embedding(weight, indices, group);
}

Tensor vocab_parallel_embedding(const Tensor& local_table, const Tensor& indices, int64_t group,
                                int64_t padding_idx) {
  TESSEL_CHECK(indices.dtype() == DType::kInt64 || indices.dtype() == DType::kInt32,
               "VocabParallelEmbedding: indices must be integers, got ",
               dtype_name(indices.dtype()));
  TESSEL_CHECK(local_table.dim() == 2, "VocabParallelEmbedding: the table must be 2-D, got ",
               shape_str(local_table.sizes()));
  const int64_t vocab_start = local_table.size(0) * tp_group(group)->rank();
  const int64_t vocab_end = vocab_start + local_table.size(0);
  const DType dtype = local_table.dtype();
  Tensor ids = to_dtype(indices, DType::kInt64);
  Tensor in_range =
      mul(to_dtype(ge(ids, scalar_on(ids, static_cast<double>(vocab_start), DType::kInt64)), dtype),
          to_dtype(lt(ids, scalar_on(ids, static_cast<double>(vocab_end), DType::kInt64)), dtype));
  // Ids of other ranks look up row 0, then are zeroed (so is their gradient).
  Tensor local_ids = where(gt(in_range, scalar_on(in_range, 0.5, dtype)),
                           sub(ids, static_cast<double>(vocab_start)), zeros_like(ids));
  const bool padding_here = padding_idx >= vocab_start && padding_idx < vocab_end;
  Tensor rows =
      mul(embedding(local_table, local_ids, padding_here ? padding_idx - vocab_start : -1),
          unsqueeze(in_range, -1));
  return reduce_from_tp(rows, group);
}

void VocabParallelEmbedding::load_from(const nn::Embedding& full) {
  assign(weight, narrow(full.weight, 0, vocab_start, vocab_end - vocab_start),
         "VocabParallelEmbedding.weight");
}

namespace {

// Checks a class-split loss's operands: (rows, classes / tp) values, (rows) i64 targets.
void check_class_split(const char* what, const Tensor& values, const Tensor& target) {
  TESSEL_CHECK(values.defined() && values.dim() == 2 && is_floating(values.dtype()), what,
               ": the scores must be floating point (rows, classes / tp), got ",
               values.defined() ? shape_str(values.sizes()) : std::string("none"));
  TESSEL_CHECK(target.defined() && target.dim() == 1 && target.size(0) == values.size(0) &&
                   target.dtype() == DType::kInt64,
               what, ": target must be i64 of shape [", values.size(0), "], got ",
               target.defined() ? shape_str(target.sizes()) : std::string("none"));
}

// Each row's value at its target class, summed over the group: this rank's columns [start,
// start + width) hold it or give 0 (one all-reduce). `first_class` -1: start = width * rank.
Tensor target_values(const Tensor& values, const Tensor& target, int64_t group,
                     int64_t first_class = -1) {
  const int64_t width = values.size(1);
  const int64_t start = first_class >= 0 ? first_class : width * tp_group(group)->rank();
  const DType dtype = values.dtype();
  Tensor in_range =
      mul(to_dtype(ge(target, scalar_on(target, static_cast<double>(start), DType::kInt64)), dtype),
          to_dtype(lt(target, scalar_on(target, static_cast<double>(start + width), DType::kInt64)),
                   dtype));
  Tensor local_target = where(gt(in_range, scalar_on(in_range, 0.5, dtype)),
                              sub(target, static_cast<double>(start)), zeros_like(target));
  return reduce_from_tp(mul(squeeze(gather(values, 1, unsqueeze(local_target, 1)), 1), in_range),
                        group);
}

// Over the rows whose target is not ignore_index: the sum of `losses`, or their mean.
Tensor reduce_counted(const Tensor& losses, const Tensor& target, int64_t ignore_index,
                      bool sum_rows) {
  Tensor valid =
      to_dtype(ne(target, scalar_on(target, static_cast<double>(ignore_index), DType::kInt64)),
               losses.dtype());
  Tensor total = sum(mul(losses, valid));
  return sum_rows ? total : div(total, sum(valid));
}

}  // namespace

Tensor vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& target, int64_t group,
                                    int64_t ignore_index, bool sum_rows, int64_t first_class) {
  check_class_split("vocab_parallel_cross_entropy", logits, target);
  // Subtracting the global max keeps exp finite; it cancels out of the loss and its gradient.
  Tensor global_max = max_from_tp(max(logits.detach(), 1), group);
  Tensor shifted = sub(logits, unsqueeze(global_max, 1));
  Tensor sum_exp = reduce_from_tp(sum(exp(shifted), {1}), group);
  Tensor losses = sub(log(sum_exp), target_values(shifted, target, group, first_class));
  return reduce_counted(losses, target, ignore_index, sum_rows);
}

Tensor vocab_parallel_nll_loss(const Tensor& log_probs, const Tensor& target, int64_t group,
                               int64_t ignore_index, bool sum_rows) {
  check_class_split("vocab_parallel_nll_loss", log_probs, target);
  return reduce_counted(neg(target_values(log_probs, target, group)), target, ignore_index,
                        sum_rows);
}

// ---- whole models ----

std::map<std::string, int64_t> tensor_parallel_split_dims(nn::Module& root) {
  std::map<std::string, int64_t> dims;
  for (const auto& [prefix, module] : root.named_modules()) {
    const auto* split = dynamic_cast<const SplitParameters*>(module);
    if (!split) continue;
    for (const auto& [parameter, dim] : split->split_parameter_dims())
      dims[prefix.empty() ? parameter : prefix + "." + parameter] = dim;
  }
  return dims;
}

void load_shards(nn::Module& shard, const nn::Module& full, int64_t group) {
  const int rank = tp_group(group)->rank();
  const auto split_dims = tensor_parallel_split_dims(shard);
  std::map<std::string, Tensor> whole;
  for (const auto& [name, tensor] : full.state_dict()) whole.emplace(name, tensor);
  // Every source is found and checked before anything is copied: an error leaves `shard` as it
  // was.
  std::vector<std::pair<Tensor, Tensor>> copies;  // (target, source)
  for (const auto& [name, tensor] : shard.state_dict()) {
    auto source = whole.find(name);
    TESSEL_CHECK(source != whole.end(), "load_shards: the full model has no tensor '", name, "'");
    Tensor slice = source->second;
    auto dim = split_dims.find(name);
    if (dim != split_dims.end()) {
      const int64_t local = tensor.size(dim->second);
      TESSEL_CHECK(
          slice.dim() == tensor.dim() && slice.size(dim->second) == local * tp_group(group)->size(),
          "load_shards: ", name, " has shape ", shape_str(tensor.sizes()), " (split along dim ",
          dim->second, ") but the full model's is ", shape_str(slice.sizes()));
      slice = narrow(slice, dim->second, rank * local, local);
    }
    TESSEL_CHECK(slice.sizes() == tensor.sizes(), "load_shards: ", name, " has shape ",
                 shape_str(tensor.sizes()), " but the full model's",
                 dim == split_dims.end() ? " is " : " slice is ", shape_str(slice.sizes()));
    copies.emplace_back(tensor, slice);
  }
  NoGradGuard no_grad;
  for (auto& [target, source] : copies) target.copy_(source);
}

Tensor gather_shards(const Tensor& shard, int64_t dim, Communicator& group) {
  NoGradGuard no_grad;
  TESSEL_CHECK(dim >= 0 && dim < shard.dim(), "gather_shards: dim ", dim,
               " out of range for shape ", shape_str(shard.sizes()));
  // On the group's device (NCCL moves GPU tensors only), returned on the shard's.
  Tensor moved = contiguous(transpose(shard.detach().to(group.device()), 0, dim));
  Shape sizes = moved.sizes();
  sizes[0] *= group.size();
  Tensor gathered = empty(sizes, TensorOptions(shard.dtype()).device(group.device()));
  group.all_gather(moved, gathered);
  return contiguous(transpose(gathered, 0, dim)).to(shard.device());
}

}  // namespace tessel::parallel
