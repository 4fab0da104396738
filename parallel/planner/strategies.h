// Split strategies per traced op and their costs on D devices: replicate, split the batch (data
// parallel), split output features or channels (column parallel), split input features with a
// partial sum (row parallel), split attention heads, vocabulary-parallel embedding and loss.
//   PlannerConfig config;  config.devices = 8;  config.profile = load_profile(path);
//   auto strategies = enumerate_strategies(graph, config);
//   CostGraph costs = build_cost_graph(graph, strategies, config, /*remat_fraction=*/1.0);
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "parallel/planner/cost_model.h"
#include "parallel/planner/frontier.h"
#include "parallel/planner/graph.h"

namespace tessel::planner {

// How one tensor lies on the devices: dim 0 (the batch) cut into `batch` parts and the op's model
// axis (features, channels, heads, vocabulary) cut into `model` parts; every device holds
// 1 / (batch * model) of it and the rest of the devices hold copies. Model splits of producer and
// consumer are taken to be along the same axis when their degrees match (the chains of the model
// zoo: column -> element-wise -> row, heads through views, channels through flatten).
struct Layout {
  int batch = 1;
  int model = 1;
  bool operator==(const Layout& other) const {
    return batch == other.batch && model == other.model;
  }
};

enum class SplitKind {
  kReplicate,  // no model split: the tp group computes the same thing (the batch may be split)
  kColumn,     // output features / channels split; input gradient all-reduced in backward
  kRow,        // input features split; output is a partial sum, all-reduced in forward
  kHeads,      // batched matmul split along its batch of heads
  kVocab,      // embedding rows or loss classes split (vocabulary parallel)
  kFeature,    // an element-wise, normalisation or pooling op split along the model axis
};
const char* split_kind_name(SplitKind kind);  // "replicate", "column", ...
SplitKind parse_split_kind(const std::string& name);

// A parameter as a strategy shards it: `parts` pieces along `dim` (-1: a whole copy on every
// device).
struct ParameterSplit {
  int tensor = -1;  // Graph::tensors index
  int dim = -1;
  int parts = 1;
  bool owned = false;  // this op is the parameter's first user, which carries its memory
};

struct Strategy {
  int dp = 1;  // batch split degree (1 for ops without a batch)
  int tp = 1;  // size of the tensor-parallel group: model split degree, or copies (kReplicate)
  SplitKind kind = SplitKind::kReplicate;
  std::vector<Layout> input_layouts;       // per input slot, what the op needs
  std::vector<Layout> output_layouts;      // per output
  std::vector<ParameterSplit> parameters;  // every parameter input, as this strategy cuts it
  // Seconds per device per iteration.
  double forward_compute = 0;
  double backward_compute = 0;
  double forward_comm = 0;   // collectives of the strategy itself (row: all-reduce of the output)
  double backward_comm = 0;  // (column: all-reduce of the input gradient)
  double gradient_sync = 0;  // data-parallel all-reduce of the owned parameters' gradients and
                             // their copies to and from its bucket (ZeRO: reduce-scatter and
                             // all-gathers of the parameters)
  double optimizer_compute = 0;  // the optimizer's update of the owned parameters (its shard)
  // The parts of forward_comm and backward_comm that wait for the ranks to arrive, priced after
  // the op's own compute (DeviceProfile::sync_wait); a whole plan's price puts the work since the
  // previous collective in its place (sequenced_waits).
  double forward_wait = 0;
  double backward_wait = 0;
  // Bytes per device.
  double parameter_bytes = 0;   // owned parameters, their gradients and optimizer state
  double activation_bytes = 0;  // tensors kept for backward (charged to their producer)
  // The gradients alive at once in this op's backward, beside what is kept for it: its first
  // output's and those of its inputs that need one (the largest over a plan's ops adds to a
  // plan's peak).
  double backward_working_bytes = 0;

  // "dp=4 tp=2 column"; "replicate" when every device runs the whole op.
  std::string label() const;
  bool fully_replicated() const { return dp == 1 && tp == 1; }
  double forward_time() const { return forward_compute + forward_comm; }
  // Memory and time of this strategy when the memory layer keeps `remat_fraction` of the
  // activations and recomputes the rest: activations scale by f, time grows by
  // (1 - f) * forward_time * remat_k.
  Cost cost(double remat_fraction, double remat_k) const;
};

struct PlannerConfig {
  int devices = 1;
  // Largest tensor-parallel group; 0: the profile's devices_per_node (tensor parallelism inside
  // a node, data parallelism across nodes, as Megatron-LM does).
  int max_tp = 0;
  // Smallest tensor-parallel group searched (1: every degree; a larger one keeps the frontier to
  // plans whose grids split the model at least that much).
  int min_tp = 1;
  // Optimizer state tensors per parameter: Adam 2, SGD with momentum 1, plain SGD 0.
  int optimizer_states = 2;
  // ZeRO over each op's data-parallel group (parallel::ZeroOptimizer): 0 none; 1 the optimizer
  // state in dp parts, the updated parts all-gathered after the step; 2 the gradients too,
  // reduce-scattered instead of all-reduced; 3 the parameters too, all-gathered for each op that
  // uses them (forward, and backward when it reads them) instead of after the step.
  int zero_stage = 0;
  // Batch norm in training over a batch split: true, by the whole batch's statistics (each rank's
  // gathered over dp, as one process normalises); false, by each rank's own rows (DDP's way).
  bool whole_batch_norm = true;
  // Data-parallel gradients are all-reduced in buckets of this size (DDP's 25 MiB): a tensor
  // pays the bandwidth for its bytes and its share (bytes / bucket) of one bucket's latency.
  double gradient_bucket_bytes = 25.0 * 1024 * 1024;
  DeviceProfile profile;
};

// Batch norm in training over a batch split (PlannerConfig::whole_batch_norm) runs as
// element-wise ops, reductions, views and collectives (ParallelModule's batch_norm_over_dp): this
// many op calls beyond one batch_norm forward and its backward (parallelize_test counts them), and
// about this many more passes over a tensor of the input's size (reads and writes, counted from
// its ops, less the fused op's); the rest of its calls are per channel.
constexpr int kBatchNormOverDpForwardCalls = 37;
constexpr int kBatchNormOverDpBackwardCalls = 60;
constexpr int kBatchNormOverDpForwardPasses = 11;
constexpr int kBatchNormOverDpBackwardPasses = 28;

// The profile's rate (DeviceProfile::op_kinds) for cross_entropy over vocabulary-split logits,
// which runs as its decomposition (parallel::vocab_parallel_cross_entropy) instead of the fused
// op: per byte of the fused op's work on the local shard. Profiles without it price the split at
// the fused op's "loss" rate.
inline constexpr const char* kVocabLossKind = "vocab_loss";

// The kind of op the profile prices `op` as (DeviceProfile::op_kinds): the rate its OpDef
// declares (planner.rate: "batch_norm", "layer_norm", "softmax", "pool", "concat", "dropout",
// "loss", "embedding"), else by its OpKind: "gemm", "conv", "conv_grouped" (groups > 1, depthwise),
// "activation" (gelu, tanh, exp, ...) or "elementwise".
std::string op_kind(const TracedOp& op);

// Whether strategy `s` of an element-wise op split along the model axis reads input `slot` as a
// broadcast operand with a gradient (a bias, a position table): each device reads its part along
// the split, and the parts of the gradient are all-gathered in backward.
bool cuts_broadcast_operand(const Graph& graph, const TracedOp& op, const Strategy& s, size_t slot);

// The call one device makes for an op under a strategy: what calibrate --shapes_of measures and
// DeviceProfile::op_shapes prices.
struct ShardCall {
  const OpDef* def = nullptr;
  std::vector<std::optional<Shape>> input_shapes;  // each device's part; nullopt: absent input
  std::vector<bool> needs_gradient;
  Attrs attrs;
  std::string key() const;  // op_shape_key
};

// The call of `op` on one device at batch degree `dp` and model split `kind` over `tp` devices,
// for the matrix ops whose parts it knows (conv2d, linear: the bulk of a step's compute, whose
// rate varies with the shapes); nothing for the others.
std::optional<ShardCall> shard_call(const Graph& graph, const TracedOp& op, int dp, int tp,
                                    SplitKind kind);

// The tensor-parallel degrees tried: divisors of `devices` from min_tp up to the max_tp limit.
std::vector<int> tensor_parallel_degrees(const PlannerConfig& config);

// Every applicable strategy of every op, with costs. Ops without a batch dimension never split
// it; degrees must divide the dimension they cut.
std::vector<std::vector<Strategy>> enumerate_strategies(const Graph& graph,
                                                        const PlannerConfig& config);

// The ranks' waits before the collectives of a whole plan (`choice`: a strategy per op): each
// collective (an op's own, or a move of a tensor or of its gradient between layouts) waits
// sync_wait(work since the previous collective), forward in call order and backward in reverse.
// Strategies alone price each wait after the op's own work (Strategy::forward_wait) and each move
// after its producer's (redistribution_time), which misses the work of the ops between.
struct SequencedWaits {
  double forward = 0;
  double backward = 0;
};
SequencedWaits sequenced_waits(const Graph& graph,
                               const std::vector<std::vector<Strategy>>& strategies,
                               const std::vector<int>& choice, const PlannerConfig& config);

// Bytes of a tensor's gradient alive while backward moves it from its consumer's layout `to`
// back to its producer's `from` (the part each device holds in `from`, beside the one it has);
// zero when each device already holds its part of `from`.
double redistribution_gradient_bytes(const Layout& from, const Layout& to, double bytes);

// One collective of a move between layouts: an all-gather over `group` devices of `bytes` (the
// gathered result), or an all-to-all between the batch's line and the model's over all `group`
// devices (`bytes`: the part each holds, of which it sends a group's size-th to every other).
struct MoveStep {
  enum class Kind { kAllGather, kAllToAll };
  Kind kind;
  int group;
  double bytes;
};

// The collectives that move a tensor of `bytes` from layout `from` to layout `to` on `devices`
// devices, as the runtime (parallel::ParallelModule) runs them: none where each device holds
// what it needs (it cuts its part locally); within one grid, an all-gather of the model's parts,
// then one of the batch's; between grids of per-op degrees (dp x tp = devices, other tp), an
// all-to-all between the batch's line and the model's, a local cut from a grid whose rows hold
// the batch line's, and otherwise the gathers of `from` to the whole tensor.
std::vector<MoveStep> redistribution_steps(const Layout& from, const Layout& to, double bytes,
                                           int devices);

// Seconds of the collectives that move a tensor of `bytes` from layout `from` to layout `to`
// (redistribution_steps), the all-to-all's copies of its part included, without any wait for the
// ranks.
double move_collectives_time(const Layout& from, const Layout& to, double bytes,
                             const DeviceProfile& profile, int devices);

// Seconds to move a tensor of `bytes` from layout `from` to layout `to` (redistribution_steps),
// plus the way back for its gradient when `gradient`. Zero when every device already holds what
// it needs. Each move waits for the ranks to arrive (DeviceProfile::sync_wait) after the work
// since the last collective: `forward_interval` before the move (the producer's forward),
// `backward_interval` before the gradient's (the consumer's backward).
double redistribution_time(const Layout& from, const Layout& to, double bytes, bool gradient,
                           const DeviceProfile& profile, int devices, double forward_interval = 0,
                           double backward_interval = 0);

// How `op` reads its input `slot` (made by an op, in layout `have`): read through views that cut
// across its parts, the viewed value is gathered first (views.h, read_through_views; the first
// reader of a value runs its gathers, the others find them made), then moved from what the reader
// finds to the layout it needs; its gradient moves back.
struct ViewGather {
  Layout from, to;
  double bytes = 0;    // the viewed value, whole
  bool first = false;  // the first reader's (ViewStep::first): the one that runs it
};
struct InputRead {
  std::vector<ViewGather> gathers;  // those this reader runs
  Layout found;                     // `have`, or what the gathers left
  double bytes = 0;                 // the view it reads, whole
  bool gradient = false;            // its gradient moves back to the producer
};
InputRead input_read(const Graph& graph, const TracedOp& op, size_t slot, const Layout& have);
// Seconds of a read (input_read from `producer`'s layout) into the layout `need`: the gathers
// and the move, each waiting for the ranks after the producer's forward (the move's gradient
// after the consumer's backward, `consumer_backward` seconds).
double read_time(const InputRead& read, const Strategy& producer, const Layout& need,
                 double consumer_backward, const PlannerConfig& config);

// A parameter read by more than one op (a tied weight): its first user owns it (memory, and the
// data-parallel all-reduce of its gradient when that user splits the batch); each later user is
// tied to the owner by the cost of the pair.
struct SharedParameter {
  int tensor = -1;
  int owner = -1;  // op ids
  int user = -1;
};
std::vector<SharedParameter> shared_parameters(const Graph& graph);
// What a later user adds: the gradient all-reduce when it splits the batch and the owner does
// not (with both split, the contributions are summed locally and all-reduced once), plus
// gathering the parameter (and its gradient) when the two cut it differently.
double shared_parameter_time(const Graph& graph, const SharedParameter& shared,
                             const Strategy& owner, const Strategy& user,
                             const PlannerConfig& config);
// The user's own copy of the parameter as it cuts it, when the owner cuts it otherwise: the user
// keeps it for backward (a product needs its weight), bytes per device.
double shared_parameter_bytes(const Graph& graph, const SharedParameter& shared,
                              const Strategy& owner, const Strategy& user);

// Nodes are the graph's ops (same indices), strategy costs at `remat_fraction`; edges carry the
// re-distribution time between a producer's output layout and each consumer's input layout, and
// the costs of shared parameters between their users.
CostGraph build_cost_graph(const Graph& graph, const std::vector<std::vector<Strategy>>& strategies,
                           const PlannerConfig& config, double remat_fraction);

}  // namespace tessel::planner
