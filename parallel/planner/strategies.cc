#include "parallel/planner/strategies.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "parallel/planner/views.h"

namespace tessel::planner {

const char* split_kind_name(SplitKind kind) {
  switch (kind) {
    case SplitKind::kReplicate:
      return "replicate";
    case SplitKind::kColumn:
      return "column";
    case SplitKind::kRow:
      return "row";
    case SplitKind::kHeads:
      return "heads";
    case SplitKind::kVocab:
      return "vocab";
    case SplitKind::kFeature:
      return "feature";
  }
  return "?";
}

SplitKind parse_split_kind(const std::string& name) {
  for (SplitKind kind : {SplitKind::kReplicate, SplitKind::kColumn, SplitKind::kRow,
                         SplitKind::kHeads, SplitKind::kVocab, SplitKind::kFeature})
    if (name == split_kind_name(kind)) return kind;
  TESSEL_FAIL("unknown split kind '", name,
              "' (expected replicate, column, row, heads, vocab or feature)");
}

std::string Strategy::label() const {
  if (fully_replicated()) return "replicate";
  std::string text;
  if (dp > 1) text = "dp=" + std::to_string(dp);
  if (tp > 1) {
    if (!text.empty()) text += " ";
    text += "tp=" + std::to_string(tp) + " " + split_kind_name(kind);
  }
  return text;
}

Cost Strategy::cost(double remat_fraction, double remat_k) const {
  Cost total;
  total.memory = parameter_bytes + remat_fraction * activation_bytes;
  total.time = forward_compute + forward_comm + backward_compute + backward_comm + gradient_sync +
               optimizer_compute + (1 - remat_fraction) * remat_k * forward_time();
  return total;
}

std::vector<int> tensor_parallel_degrees(const PlannerConfig& config) {
  TESSEL_CHECK(config.devices >= 1, "planner: devices must be at least 1, got ", config.devices);
  const int limit = config.max_tp > 0 ? config.max_tp : config.profile.devices_per_node;
  std::vector<int> degrees;
  for (int tp = 1; tp <= config.devices; ++tp)
    if (config.devices % tp == 0 && (tp == 1 || tp <= limit) && tp >= config.min_tp)
      degrees.push_back(tp);
  return degrees;
}

namespace {

// Ops without inputs (constants, random numbers) are created where they are used: never split.
bool is_factory(const TracedOp& op) {
  for (int input : op.inputs)
    if (input >= 0) return false;
  return true;
}

// The profile's op kind (DeviceProfile::op_kinds) an op is priced with: the rate it declares
// (OpDef::planner), else its kind's.
std::string op_kind_of(const TracedOp& op) { return op_rate_kind(*op.def, op.attrs); }

bool is_loss_split(ParallelSplit split) {
  return split == ParallelSplit::kLossClasses || split == ParallelSplit::kSoftmaxLossClasses;
}

// What every strategy of one op shares.
struct OpContext {
  const Graph& graph;
  const TracedOp& op;
  const PlannerConfig& config;
  ParallelSplit split;               // how the op may be cut (OpDef::planner)
  bool batch_ok = false;             // some input has the batch in dim 0
  double backward_factor = 0;        // backward work in units of the forward's
  double column_share = 1;           // this op's share of the input-gradient all-reduce (column)
  std::vector<int> parameter_slots;  // input slots holding parameters
  std::vector<bool> owns;            // per parameter slot: this op is its first user
  std::vector<bool> saved_output;    // per output: kept for backward by anyone
  std::vector<int> charged_inputs;   // data-input slots whose saved bytes this op carries
  // Buffers (batch norm's running statistics: sources that are neither parameters nor data)
  // this op is the first reader of: data parallelism broadcasts them from rank 0 before every
  // forward, one collective for all of them, whose latency the first buffer reader carries.
  double broadcast_bytes = 0;
  bool first_buffer_reader = false;

  const TracedTensor* input(int slot) const {
    const int id = op.inputs.at(slot);
    return id >= 0 ? &graph.tensors[id] : nullptr;
  }
  bool is_parameter(int slot) const {
    const TracedTensor* tensor = slot < static_cast<int>(op.inputs.size()) ? input(slot) : nullptr;
    return tensor && tensor->is_parameter();
  }
  double input_bytes(int slot) const {
    const TracedTensor* tensor = input(slot);
    return tensor ? static_cast<double>(shape_numel(op.input_shapes[slot])) *
                        element_size(tensor->dtype)
                  : 0.0;
  }
  double output_bytes(int slot) const {
    return static_cast<double>(graph.tensors[op.outputs.at(slot)].bytes);
  }
};

int64_t dim_or(const Shape& shape, int64_t dim, int64_t fallback = 0) {
  if (dim < 0) dim += static_cast<int64_t>(shape.size());
  return dim >= 0 && dim < static_cast<int64_t>(shape.size()) ? shape[dim] : fallback;
}

bool divides(int64_t size, int parts) { return size > 0 && size % parts == 0; }

// The data-parallel all-reduce of `bytes` of gradients, in buckets (see PlannerConfig).
double gradient_all_reduce(const Strategy& s, double bytes, const PlannerConfig& config) {
  const DeviceProfile& profile = config.profile;
  const LinkLevel level = profile.level_for(static_cast<int64_t>(s.dp) * s.tp);
  const AlphaBeta& link = profile.link(Collective::kAllReduce, level);
  const double p = s.dp;
  return 2 * (p - 1) * link.alpha_s * (bytes / config.gradient_bucket_bytes) +
         2 * (p - 1) / p * bytes / link.bus_bandwidth;
}

// The model splits an op supports at tensor-parallel degree tp (> 1).
std::vector<SplitKind> model_kinds(const OpContext& c, int tp) {
  const TracedOp& op = c.op;
  const Shape& out = op.output_shapes.at(0);
  std::vector<SplitKind> kinds;
  switch (c.split) {
    case ParallelSplit::kLinearWeight: {
      if (!c.is_parameter(1)) break;
      const Shape& weight = op.input_shapes[1];  // (out, in)
      if (divides(weight[0], tp)) kinds.push_back(SplitKind::kColumn);
      if (divides(weight[1], tp)) kinds.push_back(SplitKind::kRow);
      break;
    }
    case ParallelSplit::kBatchedHeads: {
      // (batch * heads, n, k): the heads are what is left of dim 0 after the batch.
      if (!op.input_has_batch[0] || !op.input_has_batch[1]) break;
      const int64_t heads = op.input_shapes[0][0] / c.graph.batch_size;
      if (divides(heads, tp)) kinds.push_back(SplitKind::kHeads);
      break;
    }
    case ParallelSplit::kConvChannels: {
      if (!c.is_parameter(1)) break;
      const Shape& weight = op.input_shapes[1];  // (O, C / groups, kh, kw)
      const int64_t groups = op.attrs.get_or<int64_t>("groups", 1);
      if (groups == 1) {
        if (divides(weight[0], tp)) kinds.push_back(SplitKind::kColumn);
        if (divides(weight[1], tp)) kinds.push_back(SplitKind::kRow);
      } else if (divides(groups, tp)) {
        kinds.push_back(SplitKind::kFeature);  // grouped / depthwise: whole groups per device
      }
      break;
    }
    case ParallelSplit::kEmbeddingTable: {
      if (!c.is_parameter(0)) break;
      const Shape& table = op.input_shapes[0];  // (vocab, hidden)
      if (divides(table[0], tp)) kinds.push_back(SplitKind::kVocab);
      if (divides(table[1], tp)) kinds.push_back(SplitKind::kColumn);
      break;
    }
    case ParallelSplit::kLossClasses:
    case ParallelSplit::kSoftmaxLossClasses: {
      const Shape& logits = op.input_shapes[0];
      if (logits.size() == 2 && divides(logits[1], tp)) kinds.push_back(SplitKind::kVocab);
      break;
    }
    case ParallelSplit::kSoftmaxHeads: {
      // Along the heads of attention scores (batch, heads, n, n) or (batch * heads, n, n);
      // never along the normalised dimension.
      const int64_t dim = op.attrs.get_or<int64_t>("dim", -1);
      const int64_t rank = static_cast<int64_t>(out.size());
      const bool last = dim == -1 || dim == rank - 1;
      if (rank < 3 || !last) break;
      const bool heads_in_dim0 = op.input_has_batch[0] && rank == 3 &&
                                 divides(out[0] / c.graph.batch_size, tp) &&
                                 out[0] > c.graph.batch_size;
      if ((rank >= 4 && divides(out[1], tp)) || heads_in_dim0) kinds.push_back(SplitKind::kFeature);
      break;
    }
    case ParallelSplit::kChannels:
      if (out.size() >= 2 && divides(out[1], tp)) kinds.push_back(SplitKind::kFeature);
      break;
    case ParallelSplit::kSpatialReduction: {
      // Spatial means keep the channels: (N, C, H, W) -> (N, C).
      const auto dims = op.attrs.get_or<std::vector<int64_t>>("dims", {});
      const int64_t rank = static_cast<int64_t>(op.input_shapes[0].size());
      bool spatial = rank >= 3 && !dims.empty();
      for (int64_t d : dims) spatial = spatial && (d < 0 ? d + rank : d) >= 2;
      if (spatial && divides(dim_or(op.input_shapes[0], 1), tp))
        kinds.push_back(SplitKind::kFeature);
      break;
    }
    case ParallelSplit::kConcat: {
      bool ok = out.size() >= 2;
      for (size_t i = 0; i < op.inputs.size(); ++i)
        ok = ok && op.inputs[i] >= 0 && divides(dim_or(op.input_shapes[i], 1), tp);
      if (ok) kinds.push_back(SplitKind::kFeature);
      break;
    }
    case ParallelSplit::kPointwise: {
      bool ok = false;
      for (size_t d = 1; d < out.size(); ++d) ok = ok || divides(out[d], tp);
      if (ok) kinds.push_back(SplitKind::kFeature);
      break;
    }
    case ParallelSplit::kNone:  // layer norm normalises over the features: kept whole (Megatron-LM)
      break;
  }
  return kinds;
}

// Whether input `slot` is cut along the model axis under `kind`.
bool input_model_split(const OpContext& c, SplitKind kind, int slot) {
  const TracedTensor* tensor = c.input(slot);
  if (!tensor || tensor->is_parameter()) return false;
  switch (kind) {
    case SplitKind::kReplicate:
    case SplitKind::kColumn:
      return false;
    case SplitKind::kRow:
      return slot == 0;
    case SplitKind::kHeads:
      return slot <= 1;
    case SplitKind::kVocab:
      return is_loss_split(c.split) && slot == 0;
    case SplitKind::kFeature:
      if (c.split == ParallelSplit::kConvChannels || c.split == ParallelSplit::kChannels ||
          c.split == ParallelSplit::kSpatialReduction || c.split == ParallelSplit::kSoftmaxHeads)
        return slot == 0;
      if (c.split == ParallelSplit::kConcat) return true;
      // Element-wise: full-size operands are split, broadcast ones (a bias, a mask) are not.
      return shape_numel(c.op.input_shapes[slot]) == shape_numel(c.op.output_shapes[0]);
  }
  return false;
}

// The dimension of a parameter input a strategy cuts (-1: whole on every device).
int parameter_split_dim(const OpContext& c, SplitKind kind, int slot) {
  switch (c.split) {
    case ParallelSplit::kLinearWeight:
    case ParallelSplit::kConvChannels:
      if (kind == SplitKind::kColumn || kind == SplitKind::kFeature) return 0;  // weight, bias
      if (kind == SplitKind::kRow && slot == 1) return 1;
      return -1;
    case ParallelSplit::kEmbeddingTable:
      if (slot != 0) return -1;
      return kind == SplitKind::kVocab ? 0 : kind == SplitKind::kColumn ? 1 : -1;
    case ParallelSplit::kChannels:
      return kind == SplitKind::kFeature ? 0 : -1;
    default:
      return -1;
  }
}

// Forward and backward seconds of one call of the op on one device: measured at its exact shapes
// where the profile has them, else its kind's rate over its share of the work.
std::pair<double, double> compute_seconds(const OpContext& c, int dp, int tp, SplitKind kind) {
  const TracedOp& op = c.op;
  const DeviceProfile& profile = c.config.profile;
  if (!profile.op_shapes.empty()) {
    if (const std::optional<ShardCall> call = shard_call(c.graph, op, dp, tp, kind)) {
      auto measured = profile.op_shapes.find(call->key());
      if (measured != profile.op_shapes.end())
        return {measured->second.forward_s, measured->second.backward_s};
    }
  }
  const int model_parts = kind == SplitKind::kReplicate ? 1 : tp;
  const double fraction = 1.0 / (static_cast<double>(dp) * model_parts);
  // A vocabulary-split cross entropy runs as a dozen element-wise ops and reductions
  // (parallel::vocab_parallel_cross_entropy), not as the fused op: priced at their own rate when
  // the profile measured it, by the fused op's bytes.
  const bool vocab_loss = tp > 1 && kind == SplitKind::kVocab &&
                          c.split == ParallelSplit::kSoftmaxLossClasses &&
                          profile.op_kinds.count(kVocabLossKind) > 0;
  const std::string kind_name = vocab_loss ? kVocabLossKind : op_kind_of(op);
  const double forward =
      profile.op_time(kind_name, op.flops * fraction, op.bytes * fraction, false);
  const double backward = c.backward_factor > 0
                              ? profile.op_time(kind_name, op.flops * fraction, op.bytes * fraction,
                                                true, c.backward_factor)
                              : 0.0;
  return {forward, backward};
}

Strategy make_strategy(const OpContext& c, int dp, int tp, SplitKind kind) {
  const TracedOp& op = c.op;
  const DeviceProfile& profile = c.config.profile;
  Strategy s;
  s.dp = c.batch_ok ? dp : 1;
  s.tp = tp;
  s.kind = kind;
  // Every rank of a multi-device plan waits for the slowest at each step.
  const double skew = c.config.devices > 1 ? 1 + profile.rank_skew : 1.0;
  const auto [forward_s, backward_s] = compute_seconds(c, s.dp, tp, kind);
  s.forward_compute = skew * (forward_s + profile.op_overhead_s);
  if (c.backward_factor > 0) s.backward_compute = skew * (backward_s + profile.op_overhead_s);

  // An input read through a view with fewer elements than its tensor (a chunk, a slice): the
  // view's backward scatters the gradient into zeros of the whole tensor, a memory-bound op of
  // its own that the traced graph (views folded away) does not have.
  for (size_t slot = 0; c.backward_factor > 0 && slot < op.inputs.size(); ++slot) {
    const TracedTensor* whole = c.input(static_cast<int>(slot));
    if (!whole || !whole->requires_grad) continue;
    const double view_bytes = c.input_bytes(static_cast<int>(slot));
    if (view_bytes <= 0 || view_bytes >= static_cast<double>(whole->bytes)) continue;
    const double share = op.input_has_batch[slot] ? 1.0 / s.dp : 1.0;
    s.backward_compute +=
        skew *
        (profile.op_time("elementwise", 0,
                         share * (static_cast<double>(whole->bytes) + 2 * view_bytes), false) +
         profile.op_overhead_s);
  }

  for (size_t slot = 0; slot < op.inputs.size(); ++slot) {
    Layout layout;
    layout.batch = op.input_has_batch[slot] ? s.dp : 1;
    layout.model = input_model_split(c, kind, static_cast<int>(slot)) ? tp : 1;
    s.input_layouts.push_back(layout);
  }
  Layout first;
  for (size_t slot = 0; slot < op.outputs.size(); ++slot) {
    const TracedTensor& tensor = c.graph.tensors[op.outputs[slot]];
    Layout layout;
    layout.batch = tensor.has_batch ? s.dp : 1;
    if (slot == 0) {
      const bool split =
          kind == SplitKind::kColumn || kind == SplitKind::kHeads || kind == SplitKind::kFeature;
      layout.model = split ? tp : 1;
      first = layout;
    } else {
      layout.model = shape_numel(tensor.sizes) % first.model == 0 ? first.model : 1;
    }
    s.output_layouts.push_back(layout);
  }

  // Collectives the split itself needs.
  const int64_t tp_group = tp;
  for (size_t slot = 0; slot < op.inputs.size(); ++slot)
    if (cuts_broadcast_operand(c.graph, op, s, slot))
      s.backward_comm += profile.collective_time(Collective::kAllGather, tp_group,
                                                 c.input_bytes(static_cast<int>(slot)));
  if (kind == SplitKind::kColumn && c.split != ParallelSplit::kEmbeddingTable) {
    const TracedTensor* x = c.input(0);
    if (x && x->requires_grad)
      s.backward_comm += c.column_share * profile.collective_time(Collective::kAllReduce, tp_group,
                                                                  c.input_bytes(0) / s.dp);
  }
  if (kind == SplitKind::kRow ||
      (kind == SplitKind::kVocab && c.split == ParallelSplit::kEmbeddingTable))
    s.forward_comm +=
        profile.collective_time(Collective::kAllReduce, tp_group, c.output_bytes(0) / s.dp);
  if (kind == SplitKind::kVocab && is_loss_split(c.split)) {
    // Vocabulary-parallel cross entropy: all-reduce the row maxima, the sums of exponentials
    // and the target logits (Megatron-LM); nll_loss only the target values.
    const double rows = static_cast<double>(op.input_shapes[0][0]) / s.dp;
    const int collectives = c.split == ParallelSplit::kSoftmaxLossClasses ? 3 : 1;
    s.forward_comm +=
        collectives * profile.collective_time(Collective::kAllReduce, tp_group, rows * 4);
  }
  // A batch split whose output lost the batch (a loss, a sum): the partial results are summed.
  if (c.batch_ok && s.dp > 1 && !op.outputs.empty() && !c.graph.tensors[op.outputs[0]].has_batch)
    s.forward_comm += profile.collective_time(Collective::kAllReduce, s.dp, c.output_bytes(0),
                                              profile.level_for(static_cast<int64_t>(s.dp) * tp));

  // Batch norm in training mode over a batch split normalises by the whole batch's statistics:
  // each rank's per-channel mean and centred squares all-gathered, their gradient all-reduced
  // (parallel::ParallelModule), through some forty op calls each way instead of one: each pays
  // the per-op overhead (most work on per-channel vectors or are views), and their passes over
  // the input its bytes at the element-wise rate.
  if (c.batch_ok && s.dp > 1 && op.name == "batch_norm" && c.config.whole_batch_norm) {
    const double parts = 2.0 * static_cast<double>(op.input_shapes[0][1]) /
                         s.input_layouts[0].model * s.dp *
                         element_size(c.graph.tensors[op.outputs[0]].dtype);
    const LinkLevel level = profile.level_for(static_cast<int64_t>(s.dp) * tp);
    s.forward_comm += profile.collective_time(Collective::kAllGather, s.dp, parts, level);
    s.backward_comm += profile.collective_time(Collective::kAllReduce, s.dp, parts, level);
    const double local_bytes = c.input_bytes(0) / (s.dp * s.input_layouts[0].model);
    auto decomposition = [&](int calls, int passes, bool backward) {
      return skew * (calls * profile.op_overhead_s +
                     profile.op_time("elementwise", 0, passes * local_bytes, backward) -
                     profile.op_time("elementwise", 0, 0, backward));
    };
    s.forward_compute +=
        decomposition(kBatchNormOverDpForwardCalls, kBatchNormOverDpForwardPasses, false);
    s.backward_compute +=
        decomposition(kBatchNormOverDpBackwardCalls, kBatchNormOverDpBackwardPasses, true);
  }

  // DDP's broadcast of the buffers before each forward: every byte reaches every rank, and the
  // one collective waits for the slowest rank like any other (the all_gather latency, p - 1 steps).
  if (c.batch_ok && s.dp > 1 && (c.broadcast_bytes > 0 || c.first_buffer_reader)) {
    const AlphaBeta& link =
        profile.link(Collective::kAllGather, profile.level_for(static_cast<int64_t>(s.dp) * tp));
    s.forward_comm += c.broadcast_bytes / link.bus_bandwidth;
    if (c.first_buffer_reader) s.forward_comm += (s.dp - 1) * link.alpha_s;
  }

  // The op's collectives wait for the ranks to arrive, apart by the jitter of the op's own work
  // (the one before them since the last collective).
  if (s.forward_comm > 0) s.forward_wait = profile.sync_wait(s.forward_compute);
  if (s.backward_comm > 0) s.backward_wait = profile.sync_wait(s.backward_compute);
  s.forward_comm += s.forward_wait;
  s.backward_comm += s.backward_wait;

  // Owned parameters: values, gradients and optimizer state, sharded by the split; gradients
  // all-reduced over the data-parallel group. Under ZeRO the state (stage 1), the gradients
  // (stage 2) and the values (stage 3) are held in dp parts: each parameter's gradient is
  // reduce-scattered (stages 2, 3) and the updated parts all-gathered, one collective per
  // parameter (parallel/zero.h); stage 3 instead gathers a parameter for its op in forward, and
  // again in backward when the op reads it to make its input's gradient, holding it and its
  // whole gradient at that moment.
  const bool data_parallel = c.batch_ok && s.dp > 1;
  const int zero = data_parallel ? c.config.zero_stage : 0;
  const double zero_parts = zero > 0 ? s.dp : 1;
  const double per_parameter_copies = (zero >= 3 ? 1.0 / zero_parts : 1.0) +
                                      (zero >= 2 ? 1.0 / zero_parts : 1.0) +
                                      c.config.optimizer_states / zero_parts;
  // Stage 3: whether the op's backward reads its parameters (saved, and an input needs a
  // gradient), so gathers them again.
  bool input_gradient = false;
  for (size_t slot = 0; slot < op.inputs.size(); ++slot) {
    const TracedTensor* input = c.input(static_cast<int>(slot));
    input_gradient = input_gradient || (input && input->requires_grad && !input->is_parameter());
  }
  const LinkLevel dp_level = profile.level_for(static_cast<int64_t>(s.dp) * tp);
  for (size_t i = 0; i < c.parameter_slots.size(); ++i) {
    const int slot = c.parameter_slots[i];
    ParameterSplit split;
    split.tensor = op.inputs[slot];
    split.dim = parameter_split_dim(c, kind, slot);
    split.parts = split.dim >= 0 ? tp : 1;
    split.owned = c.owns[i];
    s.parameters.push_back(split);
    if (!split.owned) continue;
    const double bytes = static_cast<double>(c.graph.tensors[split.tensor].bytes) / split.parts;
    s.parameter_bytes += bytes * per_parameter_copies;
    s.optimizer_compute +=
        skew * profile.optimizer_time(
                   static_cast<double>(shape_numel(c.graph.tensors[split.tensor].sizes)) /
                       (split.parts * zero_parts),
                   c.config.optimizer_states);
    if (zero >= 2) {
      s.gradient_sync += profile.collective_time(Collective::kReduceScatter, s.dp, bytes, dp_level);
    } else if (data_parallel) {
      // DDP reduces gradients in flat bucket buffers that live beside .grad: one more copy in
      // memory (measured: bench/results/parallel.md), and in time the gradient's copy into the
      // bucket and the sum's copy back, each a copy op priced as concatenation's bytes.
      s.gradient_sync += gradient_all_reduce(s, bytes, c.config) +
                         2 * skew * profile.op_time("concat", 0, 2 * bytes, false);
      s.parameter_bytes += bytes;
    }
    const double gather = profile.collective_time(Collective::kAllGather, s.dp, bytes, dp_level);
    if (zero >= 3) {
      const bool saved =
          std::find(op.saved_inputs.begin(), op.saved_inputs.end(), slot) != op.saved_inputs.end();
      s.gradient_sync += gather * (saved && input_gradient ? 2 : 1);
      s.backward_working_bytes += 2 * bytes;
    } else if (zero >= 1) {
      s.gradient_sync += gather;
    }
  }

  // Activations kept for backward, at this strategy's share.
  for (size_t slot = 0; slot < op.outputs.size(); ++slot)
    if (c.saved_output[slot]) {
      const Layout& layout = s.output_layouts[slot];
      s.activation_bytes += c.output_bytes(static_cast<int>(slot)) / (layout.batch * layout.model);
    }
  for (int slot : c.charged_inputs) {
    const Layout& layout = s.input_layouts[slot];
    s.activation_bytes +=
        static_cast<double>(c.graph.tensors[op.inputs[slot]].bytes) / (layout.batch * layout.model);
  }
  if (c.backward_factor > 0) {
    // The first output's gradient (further outputs, saved statistics or log-probabilities, get
    // none), and those of the inputs.
    if (!op.outputs.empty())
      s.backward_working_bytes +=
          c.output_bytes(0) / (s.output_layouts[0].batch * s.output_layouts[0].model);
    for (size_t slot = 0; slot < op.inputs.size(); ++slot) {
      const TracedTensor* input = c.input(static_cast<int>(slot));
      if (!input || !input->requires_grad || input->is_parameter()) continue;
      const Layout& layout = s.input_layouts[slot];
      s.backward_working_bytes +=
          c.input_bytes(static_cast<int>(slot)) / (layout.batch * layout.model);
    }
  }
  return s;
}

}  // namespace

std::string op_kind(const TracedOp& op) { return op_kind_of(op); }

std::string ShardCall::key() const {
  return op_shape_key(def->name, input_shapes, needs_gradient, attrs);
}

std::optional<ShardCall> shard_call(const Graph& graph, const TracedOp& op, int dp, int tp,
                                    SplitKind kind) {
  const ParallelSplit split = op.def->planner.split;
  const bool conv = split == ParallelSplit::kConvChannels;
  if (!conv && split != ParallelSplit::kLinearWeight) return std::nullopt;
  ShardCall call;
  call.def = op.def;
  call.attrs = op.attrs;
  for (size_t slot = 0; slot < op.inputs.size(); ++slot) {
    const int id = op.inputs[slot];
    std::optional<Shape> shape;
    if (id >= 0) {
      shape = op.input_shapes[slot];
      if (op.input_has_batch[slot] && !shape->empty()) (*shape)[0] /= dp;
    }
    call.input_shapes.push_back(shape);
    call.needs_gradient.push_back(id >= 0 && graph.tensors[id].requires_grad);
  }
  // Cuts `dim` of input `slot` (negative: from the end) into tp parts, when the input is there.
  auto cut = [&](size_t slot, int64_t dim) {
    if (slot >= call.input_shapes.size() || !call.input_shapes[slot]) return;
    Shape& shape = *call.input_shapes[slot];
    if (dim < 0) dim += static_cast<int64_t>(shape.size());
    if (dim >= 0 && dim < static_cast<int64_t>(shape.size())) shape[dim] /= tp;
  };
  switch (tp > 1 ? kind : SplitKind::kReplicate) {
    case SplitKind::kReplicate:
      break;
    case SplitKind::kColumn:  // output features / channels: weight rows and bias
      cut(1, 0);
      cut(2, 0);
      break;
    case SplitKind::kRow:  // input features / channels: the input and the weight's columns
      cut(0, conv ? 1 : -1);
      cut(1, 1);
      break;
    case SplitKind::kFeature:  // whole groups of a grouped convolution
      if (!conv) return std::nullopt;
      cut(0, 1);
      cut(1, 0);
      cut(2, 0);
      call.attrs.set("groups", op.attrs.get_or<int64_t>("groups", 1) / tp);
      break;
    default:
      return std::nullopt;
  }
  return call;
}

bool cuts_broadcast_operand(const Graph& graph, const TracedOp& op, const Strategy& s,
                            size_t slot) {
  if (s.tp < 2 || s.kind != SplitKind::kFeature ||
      op.def->planner.split != ParallelSplit::kPointwise || slot >= op.inputs.size() ||
      op.inputs[slot] < 0 || s.input_layouts.at(slot).model > 1)
    return false;
  return graph.tensors[op.inputs[slot]].requires_grad && shape_numel(op.input_shapes[slot]) > 1;
}

std::vector<std::vector<Strategy>> enumerate_strategies(const Graph& graph,
                                                        const PlannerConfig& config) {
  const std::vector<int> degrees = tensor_parallel_degrees(config);
  const auto consumers = graph.consumers();
  // Which tensors something keeps for backward, and who first owns each parameter and carries
  // each saved data input.
  std::vector<bool> saved(graph.tensors.size(), false);
  for (const TracedOp& op : graph.ops) {
    for (int slot : op.saved_inputs)
      if (slot < static_cast<int>(op.inputs.size()) && op.inputs[slot] >= 0)
        saved[op.inputs[slot]] = true;
    for (int slot : op.saved_outputs)
      if (slot < static_cast<int>(op.outputs.size())) saved[op.outputs[slot]] = true;
  }
  std::vector<bool> claimed(graph.tensors.size(), false);
  bool buffer_seen = false;

  std::vector<std::vector<Strategy>> result;
  result.reserve(graph.ops.size());
  for (const TracedOp& op : graph.ops) {
    OpContext c{graph, op, config, op.def->planner.split};
    bool any_grad = false;
    int matrix_grads = 0;
    for (size_t slot = 0; slot < op.inputs.size(); ++slot) {
      const int id = op.inputs[slot];
      if (id < 0) continue;
      const TracedTensor& tensor = graph.tensors[id];
      c.batch_ok = c.batch_ok || op.input_has_batch[slot];
      any_grad = any_grad || tensor.requires_grad;
      if (slot <= 1 && tensor.requires_grad) ++matrix_grads;
      if (tensor.is_parameter()) {
        c.parameter_slots.push_back(static_cast<int>(slot));
        c.owns.push_back(!claimed[id]);
        claimed[id] = true;
      }
      if (tensor.is_input() && saved[id] && !claimed[id]) {
        claimed[id] = true;
        c.charged_inputs.push_back(static_cast<int>(slot));
      }
    }
    // Buffers are priced with the first batch-split op that reads them (a step counter updated
    // on its own has no data-parallel strategy to carry them).
    for (size_t slot = 0; c.batch_ok && slot < op.inputs.size(); ++slot) {
      const int id = op.inputs[slot];
      if (id < 0 || claimed[id]) continue;
      const TracedTensor& tensor = graph.tensors[id];
      if (tensor.producer >= 0 || tensor.is_parameter() || tensor.is_input() ||
          tensor.requires_grad)
        continue;
      claimed[id] = true;
      c.broadcast_bytes += static_cast<double>(tensor.bytes);
      if (!buffer_seen) c.first_buffer_reader = true;
      buffer_seen = true;
    }
    // Backward of a matrix product computes one product per operand that needs a gradient;
    // other ops redo about the forward's work once.
    const bool matrix = c.split == ParallelSplit::kLinearWeight ||
                        c.split == ParallelSplit::kBatchedHeads ||
                        c.split == ParallelSplit::kConvChannels;
    if (op.differentiable && any_grad) c.backward_factor = matrix ? matrix_grads : 1.0;
    if (!op.inputs.empty() && op.inputs[0] >= 0) {
      // Products reading the same tensor as it is (views of other shapes are other tensors to
      // the runtime) share one all-reduce of their input gradients.
      int matrix_consumers = 0;
      for (const auto& [consumer, slot] : consumers[op.inputs[0]]) {
        const ParallelSplit split = graph.ops[consumer].def->planner.split;
        if (slot == 0 && graph.ops[consumer].input_shapes[0] == op.input_shapes[0] &&
            (split == ParallelSplit::kLinearWeight || split == ParallelSplit::kConvChannels))
          ++matrix_consumers;
      }
      c.column_share = 1.0 / std::max(1, matrix_consumers);
    }
    for (int id : op.outputs) c.saved_output.push_back(saved[id]);

    std::vector<Strategy> strategies;
    strategies.push_back(make_strategy(c, 1, 1, SplitKind::kReplicate));
    if (!is_factory(op)) {
      for (int tp : degrees) {
        const int dp = config.devices / tp;
        if (c.batch_ok && graph.batch_size % dp != 0) continue;
        if (c.batch_ok && !(dp == 1 && tp == 1))
          strategies.push_back(make_strategy(c, dp, tp, SplitKind::kReplicate));
        if (tp > 1)
          for (SplitKind kind : model_kinds(c, tp))
            strategies.push_back(make_strategy(c, dp, tp, kind));
      }
    }
    result.push_back(std::move(strategies));
  }
  return result;
}

namespace {

// The share of a tensor a device holds in layout `need`, and how many pieces of it come from
// others holding `have` (1: none, it is there already).
std::pair<double, int64_t> moved_share(const Layout& have, const Layout& need) {
  const double needed = 1.0 / (static_cast<double>(need.batch) * need.model);
  const double overlap =
      std::min(1.0 / have.batch, 1.0 / need.batch) * std::min(1.0 / have.model, 1.0 / need.model);
  if (overlap >= needed * (1 - 1e-9)) return {needed, 1};
  return {needed, std::llround(needed / overlap)};
}

}  // namespace

double redistribution_gradient_bytes(const Layout& from, const Layout& to, double bytes) {
  const auto [share, pieces] = moved_share(to, from);
  return pieces > 1 ? share * bytes : 0.0;
}

std::vector<MoveStep> redistribution_steps(const Layout& from, const Layout& to, double bytes,
                                           int devices) {
  using Kind = MoveStep::Kind;
  // The grid a layout lives on (its tp; 0 for the whole tensor).
  auto factor = [devices](const Layout& layout) {
    if (layout.model > 1) return layout.model;
    return layout.batch > 1 && devices > 0 ? devices / layout.batch : 0;
  };
  auto gathers = [&](const Layout& have, const Layout& need) {
    std::vector<MoveStep> steps;
    if (have.model > 1 && need.model <= 1)
      steps.push_back({Kind::kAllGather, have.model, bytes / have.batch});
    if (have.batch > 1 && need.batch <= 1) {
      const int model_parts_left = have.model > 1 && need.model > 1 ? have.model : 1;
      steps.push_back({Kind::kAllGather, have.batch, bytes / model_parts_left});
    }
    return steps;
  };
  const int from_grid = factor(from), to_grid = factor(to);
  if (from_grid > 0 && to_grid > 0 && from_grid != to_grid) {
    const bool batch_line = from.batch == devices && from.model == 1;
    const bool model_line = from.model == devices && from.batch == 1;
    if ((batch_line && to.model == devices && to.batch == 1) ||
        (model_line && to.batch == devices && to.model == 1))
      return {{Kind::kAllToAll, devices, bytes / devices}};
    // Between the batch's line and another grid's batch split (each of whose parts is a run of
    // the line's): cut locally from it, gathered over that grid's tp group into it.
    if (from.model == 1 && to.model == 1 && to.batch == devices) return {};
    if (from.model == 1 && to.model == 1 && from.batch == devices)
      return {{Kind::kAllGather, to_grid, bytes / to.batch}};
    return gathers(from, Layout{});
  }
  if (moved_share(from, to).second <= 1) return {};
  return gathers(from, to);
}

double move_collectives_time(const Layout& from, const Layout& to, double bytes,
                             const DeviceProfile& profile, int devices) {
  double seconds = 0;
  for (const MoveStep& step : redistribution_steps(from, to, bytes, devices)) {
    seconds += profile.collective_time(Collective::kAllGather, step.group, step.bytes);
    // The all-to-all copies its part into the pieces it sends and keeps, and the pieces it
    // received into its output: two copies, each reading and writing the part, at the rate of
    // concatenation (a copy), within the one call.
    if (step.kind == MoveStep::Kind::kAllToAll)
      seconds += profile.op_time("concat", 0, 4 * step.bytes, false) -
                 profile.op_time("concat", 0, 0, false);
  }
  return seconds;
}

double redistribution_time(const Layout& from, const Layout& to, double bytes, bool gradient,
                           const DeviceProfile& profile, int devices, double forward_interval,
                           double backward_interval) {
  auto move = [&](const Layout& have, const Layout& need, double interval) {
    const double seconds = move_collectives_time(have, need, bytes, profile, devices);
    return seconds > 0 ? seconds + profile.sync_wait(interval) : 0.0;
  };
  return move(from, to, forward_interval) + (gradient ? move(to, from, backward_interval) : 0.0);
}

SequencedWaits sequenced_waits(const Graph& graph,
                               const std::vector<std::vector<Strategy>>& strategies,
                               const std::vector<int>& choice, const PlannerConfig& config) {
  const DeviceProfile& profile = config.profile;
  SequencedWaits waits;
  if (profile.sync_jitter <= 0) return waits;
  auto chosen = [&](int op) -> const Strategy& { return strategies[op][choice[op]]; };
  // How many collectives reading a tensor at `slot` of `op` makes: forward (the gathers of the
  // views it reads through and its move between layouts) or backward (its gradient's move from
  // the op's layout back to what it found).
  auto moves = [&](const TracedOp& op, size_t slot, bool backward) {
    const int id = op.inputs[slot];
    if (id < 0 || graph.tensors[id].producer < 0) return 0;
    const TracedTensor& tensor = graph.tensors[id];
    const InputRead read =
        input_read(graph, op, slot, chosen(tensor.producer).output_layouts[tensor.producer_slot]);
    const Layout& need = chosen(op.id).input_layouts[slot];
    auto moved = [&](const Layout& have, const Layout& to, double bytes) {
      return move_collectives_time(have, to, bytes, profile, config.devices) > 0 ? 1 : 0;
    };
    if (backward) return read.gradient ? moved(need, read.found, read.bytes) : 0;
    int count = moved(read.found, need, read.bytes);
    for (const ViewGather& gather : read.gathers)
      count += moved(gather.from, gather.to, gather.bytes);
    return count;
  };
  double since = 0;  // work since the previous collective
  auto collective = [&](double& total) {
    total += profile.sync_wait(since);
    since = 0;
  };
  for (const TracedOp& op : graph.ops) {
    for (size_t slot = 0; slot < op.inputs.size(); ++slot)
      for (int k = moves(op, slot, false); k > 0; --k) collective(waits.forward);
    const Strategy& s = chosen(op.id);
    since += s.forward_compute;
    if (s.forward_comm > s.forward_wait) collective(waits.forward);
  }
  since = 0;
  for (auto op = graph.ops.rbegin(); op != graph.ops.rend(); ++op) {
    const Strategy& s = chosen(op->id);
    since += s.backward_compute;
    if (s.backward_comm > s.backward_wait) collective(waits.backward);
    for (size_t slot = 0; slot < op->inputs.size(); ++slot)
      for (int k = moves(*op, slot, true); k > 0; --k) collective(waits.backward);
  }
  return waits;
}

InputRead input_read(const Graph& graph, const TracedOp& op, size_t slot, const Layout& have) {
  const TracedTensor& tensor = graph.tensors[static_cast<size_t>(op.inputs[slot])];
  InputRead read;
  read.found = have;
  read.bytes = static_cast<double>(shape_numel(op.input_shapes[slot])) * element_size(tensor.dtype);
  read.gradient = tensor.requires_grad && op.differentiable;
  if (op.input_views[slot].empty()) return read;
  ViewRead views = read_through_views(tensor, op.input_views[slot], have);
  read.found = views.layout;
  for (const ViewGather& gather : views.gathers)
    if (gather.first) read.gathers.push_back(gather);
  return read;
}

double read_time(const InputRead& read, const Strategy& producer, const Layout& need,
                 double consumer_backward, const PlannerConfig& config) {
  double time = 0;
  for (const ViewGather& gather : read.gathers)
    time += redistribution_time(gather.from, gather.to, gather.bytes, /*gradient=*/false,
                                config.profile, config.devices, producer.forward_compute);
  return time + redistribution_time(read.found, need, read.bytes, read.gradient, config.profile,
                                    config.devices, producer.forward_compute, consumer_backward);
}

std::vector<SharedParameter> shared_parameters(const Graph& graph) {
  std::vector<int> owner(graph.tensors.size(), -1);
  std::vector<SharedParameter> shared;
  for (const TracedOp& op : graph.ops) {
    std::vector<int> seen;  // an op reading one parameter twice is one user
    for (int id : op.inputs) {
      if (id < 0 || !graph.tensors[id].is_parameter()) continue;
      if (std::find(seen.begin(), seen.end(), id) != seen.end()) continue;
      seen.push_back(id);
      if (owner[id] < 0)
        owner[id] = op.id;
      else if (owner[id] != op.id)
        shared.push_back({id, owner[id], op.id});
    }
  }
  return shared;
}

namespace {
ParameterSplit split_of(const Strategy& s, int tensor) {
  for (const ParameterSplit& split : s.parameters)
    if (split.tensor == tensor) return split;
  return ParameterSplit{tensor, -1, 1, false};
}
}  // namespace

double shared_parameter_bytes(const Graph& graph, const SharedParameter& shared,
                              const Strategy& owner, const Strategy& user) {
  const ParameterSplit owned = split_of(owner, shared.tensor), used = split_of(user, shared.tensor);
  if (owned.dim == used.dim && owned.parts == used.parts) return 0;
  return static_cast<double>(graph.tensors[shared.tensor].bytes) / used.parts;
}

double shared_parameter_time(const Graph& graph, const SharedParameter& shared,
                             const Strategy& owner, const Strategy& user,
                             const PlannerConfig& config) {
  const ParameterSplit owned = split_of(owner, shared.tensor), used = split_of(user, shared.tensor);
  const double bytes = static_cast<double>(graph.tensors[shared.tensor].bytes);
  double time = 0;
  if (user.dp > 1 && owner.dp == 1) time += gradient_all_reduce(user, bytes / used.parts, config);
  if (owned.dim != used.dim || owned.parts != used.parts) {
    const bool same_axis = owned.dim == used.dim || owned.dim < 0 || used.dim < 0;
    const Layout to{1, same_axis ? used.parts : 1};
    time += redistribution_time({1, owned.parts}, to, bytes, /*gradient=*/true, config.profile,
                                config.devices);
  }
  return time;
}

CostGraph build_cost_graph(const Graph& graph, const std::vector<std::vector<Strategy>>& strategies,
                           const PlannerConfig& config, double remat_fraction) {
  TESSEL_CHECK(strategies.size() == graph.ops.size(), "build_cost_graph: ", strategies.size(),
               " strategy lists for ", graph.ops.size(), " ops");
  TESSEL_CHECK(remat_fraction > 0 && remat_fraction <= 1,
               "build_cost_graph: remat fraction must be in (0, 1], got ", remat_fraction);
  const double k = config.profile.remat_overhead_k;
  CostGraph costs;
  for (const auto& list : strategies) {
    std::vector<Cost> node;
    node.reserve(list.size());
    for (const Strategy& s : list) node.push_back(s.cost(remat_fraction, k));
    costs.add_node(std::move(node));
  }
  for (const TracedOp& op : graph.ops) {
    for (size_t slot = 0; slot < op.inputs.size(); ++slot) {
      const int id = op.inputs[slot];
      if (id < 0) continue;
      const TracedTensor& tensor = graph.tensors[id];
      if (tensor.producer < 0) continue;  // parameters and data arrive in any layout
      const auto& from = strategies[tensor.producer];
      const auto& to = strategies[op.id];
      std::vector<Cost> table(from.size() * to.size());
      bool any = false;
      for (size_t a = 0; a < from.size(); ++a) {
        const InputRead read =
            input_read(graph, op, slot, from[a].output_layouts[tensor.producer_slot]);
        for (size_t b = 0; b < to.size(); ++b) {
          const double time =
              read_time(read, from[a], to[b].input_layouts[slot], to[b].backward_compute, config);
          table[a * to.size() + b].time = time;
          any = any || time > 0;
        }
      }
      // Edges that never cost anything need not tie the two ops together.
      if (any) costs.add_edge(tensor.producer, op.id, std::move(table));
    }
  }
  for (const SharedParameter& shared : shared_parameters(graph)) {
    const auto& from = strategies[shared.owner];
    const auto& to = strategies[shared.user];
    std::vector<Cost> table(from.size() * to.size());
    bool any = false;
    for (size_t a = 0; a < from.size(); ++a)
      for (size_t b = 0; b < to.size(); ++b) {
        Cost& cost = table[a * to.size() + b];
        cost.time = shared_parameter_time(graph, shared, from[a], to[b], config);
        cost.memory = shared_parameter_bytes(graph, shared, from[a], to[b]);
        any = any || cost.time > 0 || cost.memory > 0;
      }
    if (any) costs.add_edge(shared.owner, shared.user, std::move(table));
  }
  return costs;
}

}  // namespace tessel::planner
