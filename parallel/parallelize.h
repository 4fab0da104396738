// A model of the zoo or of one's own, unchanged, trained as the planner priced one of its plans:
// every op runs on this rank's shards of its tensors with the split its plan chose (column, row,
// feature, class-split loss, replicated, the batch over dp), and between ops exactly the moves
// that the plan's layouts imply (all-gathers where a producer's split is not its consumer's,
// local slices the other way, an all-to-all where a split moves to another dim of the same
// group), with autograd through all of them.
//   planner::PlanFile plan = planner::read_plan("plan.json");  // or planned_ops(...) below
//   ProcessGrid grid(plan.mesh_dp, plan.mesh_tp);
//   ParallelModule parallel(model, plan.ops, grid, planner::ModuleTraceOptions({32, 3, 32, 32}));
//   optim::SGD sgd(parallel.parameters(), options);          // this rank's shards
//   Tensor loss = parallel.loss(local_images, local_labels); // the same scalar on every rank
//   loss.backward();  parallel.synchronize_gradients();  sgd.step();
//
// How: the model is traced on the meta device as the planner traced it, so its parameters and
// buffers become meta tensors of their whole shapes; each keeps a real local shard here. While
// loss() runs, a dispatch interceptor (core/op.h) takes every op call of the model: its inputs
// are those meta tensors (whole shapes, so the model's own shape checks and reshapes see what
// they expect), each standing for a local tensor and its layout; the i-th op called is the plan's
// op i. The interceptor moves the inputs' locals to the layouts the op's strategy needs, runs the
// op on them, and hands back meta tensors of the whole outputs' shapes.
//
// Plans with per-op degrees (--per_op_degrees) run over one group of N ranks for dp and tp: each
// op runs on the grid its strategy chose, N / t x t for a factor t of N (the batch over N, the
// model over N, or both over part of the ranks: 2 x 2 on four), or whole. Tensors move between
// grids by an all-to-all between the batch's line and the model's, and otherwise through the
// whole tensor (gathered over the first grid, cut for the second), as the planner prices it.
//
// ZeRO (parallel/zero.h) runs beside a plan on a dp x tp grid, cutting each rank's shards over
// its dp group: stage 1 reads synchronize_gradients' sums; stages 2 and 3 sum over dp themselves
// (ZeroOptimizer::take_gradient_shares with the shards of batch_split_parameters()). Beside
// per-op degrees ZeRO runs over the one group, whose ranks hold different shards of what the plan
// cuts (split_dims()): those cut over all of its ranks are the ZeroOptimizer's `own` tensors,
// each rank's to keep; those cut on a grid over part of them are `shared` with the ranks holding
// the same part (copies_of_cut(): that grid's dp group), ZeRO's over those (parallel::zero_cuts).
//
// A model whose step takes several inputs (BERT: ids, token types, mask, labels) is traced and run
// with the step form of ModuleTraceOptions (models::bert_pretraining_step) and loss(inputs).
// Attention splits by heads: the heads cut in (batch * heads, ...) after a reshape are a split
// with a period (each block of `heads` rows cut in tp parts). Embedding tables split by
// vocabulary rows (a partial sum, all-reduced) or by columns, and a table tied to a decoder is
// moved between the two users' cuts as the planner prices it.
//
// Views keep a split where it survives them (reshapes, transposes, permutes, slices, selects and
// expands, planner/views.h); one that cuts across a split (ShuffleNet's chunk of channel-split
// tensors) gathers the viewed value along the model, or whole where the view also cuts the batch,
// once for all its views, as the planner prices it.
//
// Not run yet: a parameter cut over part of the ranks that an op of another grid reads (the
// planner marks such plans).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "core/op.h"
#include "core/tensor.h"
#include "nn/module.h"
#include "parallel/planner/plan_io.h"
#include "parallel/planner/strategies.h"
#include "parallel/planner/trace_module.h"
#include "parallel/process_group.h"

namespace tessel::parallel {

// The ops of a plan as a plan file lists them: frontier point `point` of `result` for `graph`.
std::vector<planner::PlanFile::Op> planned_ops(const planner::Graph& graph,
                                               const planner::PlanResult& result, int point);

// One collective of a training step, forward or backward: "all_reduce" or "all_gather" over
// "dp" or "tp", with the bytes each rank sends or receives (all_gather: the gathered result).
struct StepCollective {
  std::string kind;
  std::string group;
  int64_t bytes = 0;
  bool operator<(const StepCollective& other) const {
    return std::tie(kind, group, bytes) < std::tie(other.kind, other.group, other.bytes);
  }
  bool operator==(const StepCollective& other) const {
    return kind == other.kind && group == other.group && bytes == other.bytes;
  }
};

class ParallelModule : private DispatchInterceptor {
 public:
  // `model` holds the whole parameters (the same on every rank); `ops` one entry per op of the
  // model's trace under `trace` (plan files made for this model and input shape), each with the
  // grid's degrees or 1. A collective call on every rank of `grid`. Errors name the first op
  // that does not match the trace, a degree the grid does not have, or a split not run yet.
  ParallelModule(std::shared_ptr<nn::Module> model, const std::vector<planner::PlanFile::Op>& ops,
                 const ProcessGrid& grid, const planner::ModuleTraceOptions& trace);
  // The same over the groups of a grid given directly: `dp_group` the ranks that hold the same
  // shards, `tp_group` those that split them (rank order = shard order). One communicator for
  // both runs a plan with per-op degrees (--per_op_degrees) over it: each op on its own grid.
  ParallelModule(std::shared_ptr<nn::Module> model, const std::vector<planner::PlanFile::Op>& ops,
                 std::shared_ptr<Communicator> dp_group, std::shared_ptr<Communicator> tp_group,
                 const planner::ModuleTraceOptions& trace);
  ~ParallelModule() override;
  // Batch norm in training over a batch split normalises each rank's rows by their own
  // statistics (DDP's way; a plan file's batch_norm "per_rank"), with no collective, instead of
  // by the whole batch's (the default, as one process does). Set before the first loss().
  void set_per_rank_batch_norm(bool per_rank) { per_rank_batch_norm_ = per_rank; }
  ParallelModule(const ParallelModule&) = delete;
  ParallelModule& operator=(const ParallelModule&) = delete;

  // The trace's loss (by default cross_entropy of the output against labels) on this rank's part
  // of the batch (rows [dp_index * B / dp, ...) of the global batch of B), through the plan: a
  // scalar with the same value on every rank, differentiable into parameters().
  Tensor loss(const Tensor& input, const Tensor& labels = Tensor());
  // The same for a step of several inputs (ModuleTraceOptions(inputs, step)): this rank's rows of
  // each, in the step's order.
  Tensor loss(const std::vector<Tensor>& inputs);

  // This rank's shard of every parameter, in named_parameters() order (the optimizer's).
  std::vector<Tensor> parameters() const;
  nn::NamedTensors named_parameters() const;
  // This rank's part of every buffer (running statistics), by name.
  const std::map<std::string, Tensor>& buffers() const { return buffers_; }
  // The parameters and buffers kept cut over the tensor-parallel group: name -> the dim cut in
  // equal parts in rank order.
  const std::map<std::string, int64_t>& split_dims() const { return split_dims_; }
  // Sums over the data-parallel group the gradients of the parameters whose ops split the batch
  // (each dp rank's part of the loss is already divided by dp); an op over the whole batch
  // leaves the whole gradient on every rank. One all-reduce over a flat bucket of them, kept
  // between steps as DDP's buckets are.
  void synchronize_gradients();
  // The parameters whose gradients synchronize_gradients sums over dp (read by an op that splits
  // the batch): each dp rank's gradient is its share of the sum. The others' are whole on every
  // rank. ZeRO's stages 2 and 3 reduce them in its stead (ZeroOptimizer::take_gradient_shares).
  const std::set<std::string>& batch_split_parameters() const { return batch_split_parameters_; }
  // Every parameter and buffer whole (gathered over tp), by name: checkpoints and tests.
  std::map<std::string, Tensor> full_state_dict() const;
  // Every parameter's gradient whole (gathered over tp; undefined ones left out), by name.
  std::map<std::string, Tensor> full_gradients() const;
  // Sets every parameter and buffer from whole tensors by name (full_state_dict() of a run under
  // any plan, or a state_dict() of the unsplit model): this rank's slice of each, in place. An
  // error names the first tensor missing or of another shape; nothing is changed then.
  void load_state_dict(const std::map<std::string, Tensor>& whole);

  const planner::Graph& graph() const { return graph_; }
  // What the planner prices for this plan's step (f32 tensors), sorted: each column split's input
  // gradient all-reduce (one per tensor as read, however many column splits read it), each row
  // split's and vocabulary-split table's output all-reduce, a class-split cross_entropy's three
  // all-reduces (row maxima, sums of exponentials, target logits) or nll_loss's one (target
  // values), the dp all-reduce of a
  // batch-split loss (its sum and count for a mean over counted rows), the gradient all-gather of
  // a broadcast operand cut along an element-wise split, a
  // batch-split batch norm's gather of per-channel statistics (and their gradient's all-reduce), a
  // tied parameter's moves to its other users' cuts, and an all-gather for every move between a
  // producer's layout and a consumer's, forward or, for its gradient, backward. Beyond the
  // planner's prices: the gather of the data's rows for an op over the whole batch. The
  // data-parallel gradient all-reduce (synchronize_gradients) is not in it.
  std::vector<StepCollective> planned_collectives() const;
  // Moves run by the interceptor beyond those the plan prices, over all steps so far: gathers for
  // views that cut across a split, where the planner's placing of the parts (planner::views.h)
  // misses the runtime's.
  int unplanned_moves() const { return unplanned_moves_; }

  // How a local tensor lies on the grid: dim 0 split over dp, `axis` split over tp: the whole dim
  // cut in tp equal parts, or with a period, a run of blocks of `period` elements each cut in tp
  // parts (heads inside a dim of batch * heads).
  //
  // Over one group with per-op degrees, each split is over the grid of the op that made it: a
  // factor t of the group's N ranks (its strategy's tp), the batch cut in N / t parts over the
  // ranks with the same r % t, the model in t parts over those with the same r / t.
  struct Layout {
    bool batch = false;
    bool model = false;
    int64_t axis = -1;
    int64_t period = 0;  // 0: the whole dim
    int factor = 0;      // one group: the grid's t (0 for a layout that splits nothing)
  };
  // The parts the cut tensor `name` is cut into and this rank's part (its grid's tp and tp index).
  std::pair<int, int> cut_parts(const std::string& name) const {
    const Grid& g = grid(split_factors_.at(name));
    return {g.tp, g.tp_index};
  }
  // `local`, cut as the tensor `name` is (its optimizer state too), whole (a collective over the
  // ranks that cut it).
  Tensor gather_cut(const std::string& name, const Tensor& local) const {
    return whole(name, local);
  }
  // How many ranks of the group hold the same part of the cut tensor `name` (those of a grid
  // over part of the ranks that share a part of the model; 1 otherwise).
  int shard_copies(const std::string& name) const {
    auto found = split_factors_.find(name);
    return one_group_ && found != split_factors_.end() ? grid(found->second).dp : 1;
  }
  // The ranks holding the same part of the cut tensor `name` as this one (its grid's dp group),
  // or null where no other rank does.
  std::shared_ptr<Communicator> copies_of_cut(const std::string& name) const {
    return shard_copies(name) > 1 ? grid(split_factors_.at(name)).dp_comm : nullptr;
  }

  // The groups of one grid: a dp x tp grid's own, or over one group of N ranks the grid of a
  // factor t of N (dp = N / t; its groups are SubgroupCommunicators where they are neither one
  // rank nor all).
  struct Grid {
    int dp = 1, tp = 1;
    int dp_index = 0, tp_index = 0;
    int64_t dp_group = -1, tp_group = -1;  // tensor-parallel op group ids
    std::shared_ptr<Communicator> dp_comm, tp_comm;
  };

 private:
  struct Local {
    std::weak_ptr<TensorImpl> proxy;  // the meta tensor standing for it (stale when expired)
    Tensor tensor;
    Layout layout;
    bool persistent = false;  // a parameter or buffer (kept across steps)
    // Its whole copy entering column splits: their input gradients summed by one all-reduce.
    std::map<int, Tensor> column_input;  // by the grid of the column splits
    // It gathered for views that cut across its parts: along the model (keeping the batch's
    // split, key true) or whole (false).
    std::map<bool, Tensor> gathered;
  };
  std::vector<Tensor> dispatch(const OpDef& op, const std::vector<Tensor>& inputs,
                               const Attrs& attrs, const std::vector<Tensor>& out) override;
  Tensor run_view(const OpDef& op, const Tensor& input, const Attrs& attrs);
  std::vector<Tensor> run_op(const OpDef& op, const std::vector<Tensor>& inputs, const Attrs& attrs,
                             const std::vector<Tensor>& out);
  Local& local_of(const Tensor& proxy);
  // How op reads its input `slot` under the plan: the gathers of views and the move the planner
  // prices (planner::input_read), from the rows of the data or its producer's layout; nullopt for
  // parameters, buffers and absent inputs.
  std::optional<planner::InputRead> input_read(const planner::TracedOp& op, size_t slot) const;
  Tensor proxy_for(const Tensor& whole_shape, Tensor local, Layout layout);
  Tensor move(const Tensor& local, const Layout& from, const Layout& to);
  // A parameter's local as an op's strategy cuts it (dim -1: whole), from its stored cut (its
  // first user's): the same tensor, or moved for a tied parameter that another op cuts otherwise.
  Tensor parameter_as_cut(const Local& parameter, int64_t dim, int factor);
  // A mean loss over rows of a batch split over dp (rows whose target is ignore_index do not
  // count): from this rank's sum over its rows, the mean over every rank's counted rows, one
  // all-reduce of (sum, count).
  Tensor mean_over_dp(const Tensor& local_sum, const Tensor& target, const Attrs& attrs,
                      const Grid& g);
  // Batch norm in training mode over a batch split over dp (unless per_rank_batch_norm_):
  // normalised by the whole batch's statistics (one all-gather of each rank's per-channel mean and
  // centred squares; backward an all-reduce of their gradient), so the plan trains what one process
  // trains. Updates the running statistics as batch_norm does. Returns the first output only.
  Tensor batch_norm_over_dp(const std::vector<Tensor>& inputs, const Attrs& attrs, const Grid& g);
  // `local` (of the parameter or buffer `name`) whole: gathered along its split dim.
  Tensor whole(const std::string& name, const Tensor& local) const;
  // The grid of factor t over one group (0: the group itself), else the dp x tp grid.
  const Grid& grid(int factor) const;
  // The grid an op's strategy runs on (its tp over one group), and how many parts a layout cuts
  // the batch and the model into.
  int factor_of(const planner::Strategy& s) const { return one_group_ ? s.tp : 0; }
  int batch_parts(const Layout& layout) const { return layout.batch ? grid(layout.factor).dp : 1; }
  int model_parts(const Layout& layout) const { return layout.model ? grid(layout.factor).tp : 1; }

  std::shared_ptr<nn::Module> model_;
  planner::ModuleTraceOptions trace_;
  planner::Graph graph_;
  std::vector<planner::Strategy> strategies_;  // the plan's, per op
  int dp_ = 1, tp_ = 1, dp_index_ = 0, tp_index_ = 0;
  bool one_group_ = false;     // the dp and tp groups are one (per-op degrees over a line)
  Grid main_grid_;             // the dp x tp grid (over one group: N x N, both the group)
  std::map<int, Grid> grids_;  // one group: the grid of each factor the plan's ops use
  bool per_rank_batch_norm_ = false;
  int64_t dp_group_ = -1, tp_group_ = -1;  // tensor-parallel op group ids
  std::shared_ptr<Communicator> dp_comm_, tp_comm_;
  nn::NamedTensors parameters_;  // local shards (leaves), named
  // Whole tensors' split dims (-1: whole), by name, for full_state_dict, and the grid (factor)
  // each is cut over.
  std::map<std::string, int64_t> split_dims_;
  std::map<std::string, int> split_factors_;
  std::map<std::string, Tensor> buffers_;         // local buffers, by name
  std::set<std::string> batch_split_parameters_;  // read by an op that splits the batch
  Tensor gradient_bucket_;  // their gradients, flat, for one all-reduce over dp (kept, as DDP's)
  std::unordered_map<const TensorImpl*, Local> locals_;
  size_t purge_at_ = 8;  // the size at which proxy_for drops locals of expired proxies
  Local scratch_;        // local_of's answer for a real tensor
  size_t next_op_ = 0;
  int view_gathers_ = 0;          // gathers for views in this forward
  int planned_view_gathers_ = 0;  // those the plan prices per forward (planner::input_read)
  int unplanned_moves_ = 0;
};

}  // namespace tessel::parallel
