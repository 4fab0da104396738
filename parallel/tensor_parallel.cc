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

// A view of `t` (same storage) with its dims in the order `perm`; for kernels, which may not
// dispatch view ops.
Tensor permuted_view(const Tensor& t, const std::vector<int64_t>& perm) {
  Shape sizes, strides;
  for (int64_t d : perm) {
    sizes.push_back(t.size(d));
    strides.push_back(t.stride(d));
  }
  return Tensor(
      std::make_shared<TensorImpl>(t.storage(), sizes, strides, t.storage_offset(), t.dtype()));
}

// Last dim first: (..., n) -> (n, ...).
std::vector<int64_t> last_dim_first(int64_t ndim) {
  std::vector<int64_t> perm{ndim - 1};
  for (int64_t d = 0; d + 1 < ndim; ++d) perm.push_back(d);
  return perm;
}

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
      sizes.back() *= group_of(attrs)->size();
      return std::vector<OutputSpec>{{sizes, in[0].dtype()}};
    };
    op.kernels[static_cast<int>(DeviceType::kCpu)] = [](KernelContext& ctx) {
      // all_gather concatenates along dim 0: move the last dim to the front and back.
      const Tensor& input = ctx.inputs[0];
      const auto perm = last_dim_first(input.dim());
      Tensor moved_input = permuted_view(input, perm);
      Tensor moved_output = permuted_view(ctx.outputs[0], perm);
      Tensor send = ctx.workspace(moved_input.sizes(), input.dtype());
      Tensor receive = ctx.workspace(moved_output.sizes(), input.dtype());
      cpu::copy_strided(moved_input, send);
      group_of(ctx.attrs)->all_gather(send, receive);
      cpu::copy_strided(receive, moved_output);
    };
    op.backward = [](const BackwardContext& ctx) -> std::vector<Tensor> {
      if (!ctx.grad_outputs[0].defined()) return {Tensor()};
      return {scatter_to_tp(ctx.grad_outputs[0], ctx.attrs.get<int64_t>("group"))};
    };
    op.cost = copy_cost;
    op.flags.pure = false;
  }
  {
    OpDef& op = OpRegistry::get().define(ops::tp_scatter);
    op.kind = OpKind::kCommunication;
    op.autocast = AutocastPolicy::kWiden;
    op.shape = [](const std::vector<Tensor>& in, const Attrs& attrs) {
      check_tp_input("scatter_to_tp", in, attrs, true);
      const int tp = group_of(attrs)->size();
      Shape sizes = in[0].sizes();
      TESSEL_CHECK(sizes.back() % tp == 0, "scatter_to_tp: the last dim (", sizes.back(),
                   ", input shape ", shape_str(sizes), ") is not divisible by the group size ", tp);
      sizes.back() /= tp;
      return std::vector<OutputSpec>{{sizes, in[0].dtype()}};
    };
    op.kernels[static_cast<int>(DeviceType::kCpu)] = [](KernelContext& ctx) {
      const Tensor& input = ctx.inputs[0];
      const int64_t last = input.dim() - 1;
      const int64_t width = ctx.outputs[0].size(last);
      const int64_t start = width * group_of(ctx.attrs)->rank();
      Tensor part(std::make_shared<TensorImpl>(
          input.storage(), ctx.outputs[0].sizes(), input.strides(),
          input.storage_offset() + start * input.stride(last), input.dtype()));
      cpu::copy_strided(part, ctx.outputs[0]);
    };
    op.backward = [](const BackwardContext& ctx) -> std::vector<Tensor> {
      if (!ctx.grad_outputs[0].defined()) return {Tensor()};
      return {gather_from_tp(ctx.grad_outputs[0], ctx.attrs.get<int64_t>("group"))};
    };
    op.cost = copy_cost;
  }
}

Tensor copy_to_tp(const Tensor& x, int64_t group) {
  return dispatch(ops::tp_copy, {x}, group_attrs(group))[0];
}
Tensor reduce_from_tp(const Tensor& x, int64_t group) {
  return dispatch(ops::tp_reduce, {x}, group_attrs(group))[0];
}
Tensor gather_from_tp(const Tensor& x, int64_t group) {
  return dispatch(ops::tp_gather, {x}, group_attrs(group))[0];
}
Tensor scatter_to_tp(const Tensor& x, int64_t group) {
  return dispatch(ops::tp_scatter, {x}, group_attrs(group))[0];
}
Tensor max_from_tp(const Tensor& x, int64_t group) {
  NoGradGuard no_grad;
  return dispatch(ops::tp_reduce, {x.detach()},
                  Attrs{{"group", group}, {"reduce", std::string("max")}})[0];
}

// ---- layers ----

namespace {

int64_t split_size(const char* layer, const char* what, int64_t size, int tp) {
  TESSEL_CHECK(size > 0 && size % tp == 0, layer, ": ", what, " (", size,
               ") must be a positive multiple of the tensor parallel size ", tp);
  return size / tp;
}

// Copies `source` into the parameter `target` (shapes must agree), outside autograd.
void assign(const Tensor& target, const Tensor& source, const char* what) {
  TESSEL_CHECK(target.sizes() == source.sizes(), "tensor parallel load: ", what, " has shape ",
               shape_str(target.sizes()), " but the slice of the full model is ",
               shape_str(source.sizes()));
  NoGradGuard no_grad;
  Tensor copy = target;
  copy.copy_(source);
}

Tensor activation(const Tensor& x, const std::string& name) {
  if (name == "gelu") return gelu(x, "none");
  if (name == "gelu_new") return gelu(x, "tanh");
  return relu(x);
}

std::shared_ptr<nn::LayerNorm> make_layer_norm(const models::BertConfig& config) {
  return std::make_shared<nn::LayerNorm>(
      nn::LayerNormOptions({config.hidden_size()}).eps(config.layer_norm_eps()));
}

void copy_module(nn::Module& target, const nn::Module& source) {
  target.load_state_dict(source.state_dict());
}

// A 0-dim tensor on `like`'s device (ops refuse inputs on different devices).
Tensor scalar_on(const Tensor& like, double value, DType dtype) {
  return full({}, value, TensorOptions(dtype).device(like.device()));
}

}  // namespace

ColumnParallelLinear::ColumnParallelLinear(int64_t in_features_in, int64_t out_features_in,
                                           int64_t group_in, bool bias_in, bool gather_output_in)
    : nn::Module("ColumnParallelLinear"),
      in_features(in_features_in),
      out_features(out_features_in),
      group(group_in),
      gather_output(gather_output_in) {
  const auto& comm = tp_group(group);
  tp_size = comm->size();
  tp_rank = comm->rank();
  const int64_t local = split_size("ColumnParallelLinear", "out_features", out_features, tp_size);
  TESSEL_CHECK(in_features > 0, "ColumnParallelLinear: in_features must be positive, got ",
               in_features);
  weight = register_parameter("weight", zeros({local, in_features}));
  if (bias_in) bias = register_parameter("bias", zeros({local}));
}

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

RowParallelLinear::RowParallelLinear(int64_t in_features_in, int64_t out_features_in,
                                     int64_t group_in, bool bias_in, bool input_is_parallel_in)
    : nn::Module("RowParallelLinear"),
      in_features(in_features_in),
      out_features(out_features_in),
      group(group_in),
      input_is_parallel(input_is_parallel_in) {
  const auto& comm = tp_group(group);
  tp_size = comm->size();
  tp_rank = comm->rank();
  const int64_t local = split_size("RowParallelLinear", "in_features", in_features, tp_size);
  TESSEL_CHECK(out_features > 0, "RowParallelLinear: out_features must be positive, got ",
               out_features);
  weight = register_parameter("weight", zeros({out_features, local}));
  if (bias_in) bias = register_parameter("bias", zeros({out_features}));
}

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

VocabParallelEmbedding::VocabParallelEmbedding(int64_t num_embeddings_in, int64_t embedding_dim_in,
                                               int64_t group_in)
    : nn::Module("VocabParallelEmbedding"),
      num_embeddings(num_embeddings_in),
      embedding_dim(embedding_dim_in),
      group(group_in) {
  const auto& comm = tp_group(group);
  tp_size = comm->size();
  tp_rank = comm->rank();
  const int64_t local =
      split_size("VocabParallelEmbedding", "num_embeddings", num_embeddings, tp_size);
  vocab_start = tp_rank * local;
  vocab_end = vocab_start + local;
  weight = register_parameter("weight", zeros({local, embedding_dim}));
}

Tensor VocabParallelEmbedding::forward(const Tensor& indices) {
  TESSEL_CHECK(indices.dtype() == DType::kInt64 || indices.dtype() == DType::kInt32,
               "VocabParallelEmbedding: indices must be integers, got ",
               dtype_name(indices.dtype()));
  Tensor ids = to_dtype(indices, DType::kInt64);
  Tensor in_range =
      mul(to_dtype(ge(ids, scalar_on(ids, static_cast<double>(vocab_start), DType::kInt64)),
                   weight.dtype()),
          to_dtype(lt(ids, scalar_on(ids, static_cast<double>(vocab_end), DType::kInt64)),
                   weight.dtype()));
  // Ids of other ranks look up row 0, then are zeroed.
  Tensor local_ids = where(gt(in_range, scalar_on(in_range, 0.5, weight.dtype())),
                           sub(ids, static_cast<double>(vocab_start)), zeros_like(ids));
  Tensor rows = mul(embedding(weight, local_ids), unsqueeze(in_range, -1));
  return reduce_from_tp(rows, group);
}

void VocabParallelEmbedding::load_from(const nn::Embedding& full) {
  assign(weight, narrow(full.weight, 0, vocab_start, vocab_end - vocab_start),
         "VocabParallelEmbedding.weight");
}

Tensor vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& target, int64_t group,
                                    int64_t ignore_index) {
  TESSEL_CHECK(
      logits.defined() && logits.dim() == 2 && is_floating(logits.dtype()),
      "vocab_parallel_cross_entropy: logits must be floating point (rows, vocab / tp), got ",
      logits.defined() ? shape_str(logits.sizes()) : std::string("none"));
  TESSEL_CHECK(target.defined() && target.dim() == 1 && target.size(0) == logits.size(0) &&
                   target.dtype() == DType::kInt64,
               "vocab_parallel_cross_entropy: target must be i64 of shape [", logits.size(0),
               "], got ", target.defined() ? shape_str(target.sizes()) : std::string("none"));
  const auto& comm = tp_group(group);
  const int64_t width = logits.size(1);
  const int64_t start = width * comm->rank();
  const DType dtype = logits.dtype();

  // Subtracting the global max keeps exp finite; it cancels out of the loss and its gradient.
  Tensor global_max = max_from_tp(max(logits.detach(), 1), group);
  Tensor shifted = sub(logits, unsqueeze(global_max, 1));
  Tensor sum_exp = reduce_from_tp(sum(exp(shifted), {1}), group);

  Tensor in_range =
      mul(to_dtype(ge(target, scalar_on(target, static_cast<double>(start), DType::kInt64)), dtype),
          to_dtype(lt(target, scalar_on(target, static_cast<double>(start + width), DType::kInt64)),
                   dtype));
  Tensor local_target = where(gt(in_range, scalar_on(in_range, 0.5, dtype)),
                              sub(target, static_cast<double>(start)), zeros_like(target));
  Tensor picked = mul(squeeze(gather(shifted, 1, unsqueeze(local_target, 1)), 1), in_range);
  Tensor target_logit = reduce_from_tp(picked, group);

  Tensor losses = sub(log(sum_exp), target_logit);
  Tensor valid = to_dtype(
      ne(target, scalar_on(target, static_cast<double>(ignore_index), DType::kInt64)), dtype);
  return div(sum(mul(losses, valid)), sum(valid));
}

// ---- BERT ----

TensorParallelBertLayer::TensorParallelBertLayer(const models::BertConfig& config_in,
                                                 int64_t group_in)
    : nn::Module("TensorParallelBertLayer"), config(config_in), group(group_in) {
  config.validate();
  const int tp = tp_group(group)->size();
  local_heads = split_size("TensorParallelBertLayer", "num_attention_heads",
                           config.num_attention_heads(), tp);
  const int64_t hidden = config.hidden_size();
  auto column = [&](int64_t in, int64_t out) {
    return std::make_shared<ColumnParallelLinear>(in, out, group);
  };
  auto row = [&](int64_t in, int64_t out) {
    return std::make_shared<RowParallelLinear>(in, out, group);
  };
  auto attention = register_module("attention", std::make_shared<nn::Module>("BertAttention"));
  auto self = attention->register_module("self", std::make_shared<nn::Module>("BertSelfAttention"));
  query = self->register_module("query", column(hidden, hidden));
  key = self->register_module("key", column(hidden, hidden));
  value = self->register_module("value", column(hidden, hidden));
  auto self_output =
      attention->register_module("output", std::make_shared<nn::Module>("BertSelfOutput"));
  attention_dense = self_output->register_module("dense", row(hidden, hidden));
  attention_norm = self_output->register_module("LayerNorm", make_layer_norm(config));
  auto intermediate =
      register_module("intermediate", std::make_shared<nn::Module>("BertIntermediate"));
  intermediate_dense =
      intermediate->register_module("dense", column(hidden, config.intermediate_size()));
  auto output = register_module("output", std::make_shared<nn::Module>("BertOutput"));
  output_dense = output->register_module("dense", row(config.intermediate_size(), hidden));
  output_norm = output->register_module("LayerNorm", make_layer_norm(config));
}

Tensor TensorParallelBertLayer::forward(const Tensor& hidden, const Tensor& attention_bias) {
  const int64_t batch = hidden.size(0), seq_len = hidden.size(1);
  const int64_t head_size = config.head_size();
  const double p = config.hidden_dropout_prob();
  const bool training = is_training();

  // One copy_to_tp for q, k and v together: one all-reduce of their summed input gradient.
  Tensor shared = copy_to_tp(hidden, group);
  auto split_heads = [&](const Tensor& x) {
    return x.view({batch, seq_len, local_heads, head_size}).permute({0, 2, 1, 3});
  };
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_size));
  Tensor q = mul(split_heads(linear(shared, query->weight, query->bias)), scale)
                 .view({batch * local_heads, seq_len, head_size});
  Tensor k = split_heads(linear(shared, key->weight, key->bias))
                 .contiguous()
                 .view({batch * local_heads, seq_len, head_size});
  Tensor v = split_heads(linear(shared, value->weight, value->bias))
                 .contiguous()
                 .view({batch * local_heads, seq_len, head_size});
  Tensor scores = bmm(q, k.transpose(1, 2));
  if (attention_bias.defined())
    scores = add(scores.view({batch, local_heads, seq_len, seq_len}), attention_bias);
  Tensor probs = dropout(softmax(scores, -1), config.attention_probs_dropout_prob(), training);
  Tensor context = bmm(probs.view({batch * local_heads, seq_len, seq_len}), v)
                       .view({batch, local_heads, seq_len, head_size})
                       .permute({0, 2, 1, 3})
                       .reshape({batch, seq_len, local_heads * head_size});

  Tensor attended = attention_dense->forward(context);
  Tensor attention_output = attention_norm->forward(add(dropout(attended, p, training), hidden));
  Tensor intermediate =
      activation(intermediate_dense->forward(attention_output), config.hidden_act());
  Tensor output = output_dense->forward(intermediate);
  return output_norm->forward(add(dropout(output, p, training), attention_output));
}

void TensorParallelBertLayer::load_from(const models::BertLayer& full) {
  query->load_from(*full.query);
  key->load_from(*full.key);
  value->load_from(*full.value);
  attention_dense->load_from(*full.attention_dense);
  copy_module(*attention_norm, *full.attention_norm);
  intermediate_dense->load_from(*full.intermediate_dense);
  output_dense->load_from(*full.output_dense);
  copy_module(*output_norm, *full.output_norm);
}

TensorParallelBertForPreTraining::TensorParallelBertForPreTraining(
    const models::BertConfig& config_in, int64_t group_in)
    : nn::Module("TensorParallelBertForPreTraining"), config(config_in), group(group_in) {
  config.validate();
  const int tp = tp_group(group)->size();
  const int64_t hidden = config.hidden_size();
  const int64_t local_vocab =
      split_size("TensorParallelBertForPreTraining", "vocab_size", config.vocab_size(), tp);

  auto bert = register_module("bert", std::make_shared<nn::Module>("BertModel"));
  auto embeddings =
      bert->register_module("embeddings", std::make_shared<nn::Module>("BertEmbeddings"));
  word_embeddings = embeddings->register_module(
      "word_embeddings",
      std::make_shared<VocabParallelEmbedding>(config.vocab_size(), hidden, group));
  position_embeddings = embeddings->register_module(
      "position_embeddings", std::make_shared<nn::Embedding>(
                                 nn::EmbeddingOptions(config.max_position_embeddings(), hidden)));
  token_type_embeddings = embeddings->register_module(
      "token_type_embeddings",
      std::make_shared<nn::Embedding>(nn::EmbeddingOptions(config.type_vocab_size(), hidden)));
  embeddings_norm = embeddings->register_module("LayerNorm", make_layer_norm(config));

  auto encoder = bert->register_module("encoder", std::make_shared<nn::Module>("BertEncoder"));
  auto layer_list = encoder->register_module("layer", std::make_shared<nn::ModuleList>());
  for (int64_t i = 0; i < config.num_hidden_layers(); ++i) {
    layers.push_back(std::make_shared<TensorParallelBertLayer>(config, group));
    layer_list->push_back(layers.back());
  }
  auto pooler = bert->register_module("pooler", std::make_shared<nn::Module>("BertPooler"));
  pooler_dense = pooler->register_module("dense", std::make_shared<nn::Linear>(hidden, hidden));

  auto heads = register_module("cls", std::make_shared<nn::Module>("BertPreTrainingHeads"));
  auto predictions =
      heads->register_module("predictions", std::make_shared<nn::Module>("BertLMPredictionHead"));
  decoder_bias = predictions->register_parameter("bias", zeros({local_vocab}));
  auto transform = predictions->register_module(
      "transform", std::make_shared<nn::Module>("BertPredictionHeadTransform"));
  transform_dense =
      transform->register_module("dense", std::make_shared<nn::Linear>(hidden, hidden));
  transform_norm = transform->register_module("LayerNorm", make_layer_norm(config));
  seq_relationship =
      heads->register_module("seq_relationship", std::make_shared<nn::Linear>(hidden, 2));
}

TensorParallelBertOutput TensorParallelBertForPreTraining::forward(const Tensor& input_ids,
                                                                   const Tensor& token_type_ids,
                                                                   const Tensor& attention_mask) {
  TESSEL_CHECK(input_ids.defined() && input_ids.dim() == 2,
               "TensorParallelBertForPreTraining: input_ids must be 2-D (batch, seq_len)");
  const int64_t batch = input_ids.size(0), seq_len = input_ids.size(1);
  TESSEL_CHECK(seq_len <= config.max_position_embeddings(),
               "TensorParallelBertForPreTraining: sequence length ", seq_len,
               " exceeds max_position_embeddings=", config.max_position_embeddings());
  const bool training = is_training();

  Tensor words = word_embeddings->forward(input_ids);
  Tensor types = token_type_ids.defined() ? token_type_embeddings->forward(token_type_ids)
                                          : narrow(token_type_embeddings->weight, 0, 0, 1);
  Tensor positions = narrow(position_embeddings->weight, 0, 0, seq_len);
  Tensor hidden = dropout(embeddings_norm->forward(add(add(words, types), positions)),
                          config.hidden_dropout_prob(), training);

  Tensor attention_bias;
  if (attention_mask.defined()) {
    Tensor mask = to_dtype(attention_mask, hidden.dtype());
    attention_bias = add(mul(mask, 10000.0), -10000.0).reshape({batch, 1, 1, seq_len});
  }
  for (const auto& layer : layers) hidden = layer->forward(hidden, attention_bias);

  Tensor pooled = tanh(pooler_dense->forward(select(hidden, 1, 0)));
  Tensor transformed = activation(transform_dense->forward(hidden), config.hidden_act());
  transformed = transform_norm->forward(transformed);
  // The tied decoder: this rank's vocabulary rows give this rank's logit columns.
  Tensor mlm_logits = linear(copy_to_tp(transformed, group), word_embeddings->weight, decoder_bias);
  return {mlm_logits, seq_relationship->forward(pooled)};
}

void TensorParallelBertForPreTraining::load_from(const models::BertForPreTraining& full) {
  TESSEL_CHECK(full.config.vocab_size() == config.vocab_size() &&
                   full.config.hidden_size() == config.hidden_size() &&
                   full.config.num_hidden_layers() == config.num_hidden_layers() &&
                   full.config.num_attention_heads() == config.num_attention_heads() &&
                   full.config.intermediate_size() == config.intermediate_size(),
               "TensorParallelBertForPreTraining: the full model's configuration differs");
  const models::BertEmbeddings& embeddings = *full.bert->embeddings;
  word_embeddings->load_from(*embeddings.word_embeddings);
  copy_module(*position_embeddings, *embeddings.position_embeddings);
  copy_module(*token_type_embeddings, *embeddings.token_type_embeddings);
  copy_module(*embeddings_norm, *embeddings.norm);
  for (size_t i = 0; i < layers.size(); ++i)
    layers[i]->load_from(*full.bert->layers->at<models::BertLayer>(static_cast<int64_t>(i)));
  copy_module(*pooler_dense, *full.bert->pooler_dense);
  const int64_t local_vocab = decoder_bias.size(0);
  assign(decoder_bias, narrow(full.decoder_bias, 0, word_embeddings->vocab_start, local_vocab),
         "cls.predictions.bias");
  copy_module(*transform_dense, *full.transform_dense);
  copy_module(*transform_norm, *full.transform_norm);
  copy_module(*seq_relationship, *full.seq_relationship);
}

std::shared_ptr<TensorParallelBertForPreTraining> shard_bert(const models::BertForPreTraining& full,
                                                             int64_t group) {
  auto model = std::make_shared<TensorParallelBertForPreTraining>(full.config, group);
  model->to(full.decoder_bias.device());  // the shards live where the full model does (a GPU)
  model->load_from(full);
  model->train(full.is_training());
  return model;
}

models::BertPreTrainingLoss tensor_parallel_bert_loss(const TensorParallelBertOutput& output,
                                                      const Tensor& mlm_labels,
                                                      const Tensor& nsp_labels, int64_t group) {
  const Tensor& logits = output.mlm_logits;
  TESSEL_CHECK(logits.defined() && logits.dim() == 3,
               "tensor_parallel_bert_loss: mlm_logits must be (batch, seq_len, vocab_size / tp)");
  TESSEL_CHECK(mlm_labels.defined() && mlm_labels.dim() == 2 &&
                   mlm_labels.size(0) == logits.size(0) && mlm_labels.size(1) == logits.size(1),
               "tensor_parallel_bert_loss: mlm_labels must have shape (batch, seq_len) = (",
               logits.size(0), ", ", logits.size(1), ")");
  models::BertPreTrainingLoss loss;
  loss.mlm = vocab_parallel_cross_entropy(logits.reshape({-1, logits.size(2)}),
                                          mlm_labels.reshape({-1}), group, -100);
  loss.total = loss.mlm;
  if (nsp_labels.defined()) {
    loss.nsp = cross_entropy(output.nsp_logits, nsp_labels);
    loss.total = add(loss.mlm, loss.nsp);
  }
  return loss;
}

std::map<std::string, int64_t> tensor_parallel_split_dims(nn::Module& root) {
  std::map<std::string, int64_t> dims;
  for (const auto& entry : root.named_modules()) {
    // Not a structured binding: the lambda below captures the prefix (clang rejects bindings).
    const std::string& prefix = entry.first;
    nn::Module* module = entry.second;
    auto name = [&](const char* parameter) {
      return prefix.empty() ? std::string(parameter) : prefix + "." + parameter;
    };
    if (auto* column = dynamic_cast<ColumnParallelLinear*>(module)) {
      dims[name("weight")] = 0;
      if (column->bias.defined()) dims[name("bias")] = 0;
    } else if (dynamic_cast<RowParallelLinear*>(module)) {
      dims[name("weight")] = 1;
    } else if (dynamic_cast<VocabParallelEmbedding*>(module)) {
      dims[name("weight")] = 0;
    } else if (dynamic_cast<TensorParallelBertForPreTraining*>(module)) {
      dims[name("cls.predictions.bias")] = 0;
    }
  }
  return dims;
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
