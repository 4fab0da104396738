#include "parallel/parallelize.h"

#include <algorithm>
#include <optional>
#include <set>
#include <utility>

#include "core/autograd.h"
#include "core/error.h"
#include "ops/factory.h"
#include "ops/ops.h"
#include "parallel/dtensor.h"
#include "parallel/planner/views.h"
#include "parallel/subgroup_communicator.h"
#include "parallel/tensor_parallel.h"

namespace tessel::parallel {
namespace {

using planner::SplitKind;

bool is_conv(const planner::TracedOp& op) {
  return op.def->planner.split == ParallelSplit::kConvChannels;
}

// `x` with dim `axis` seen as (blocks, block): the dim after `axis` then holds one block.
Tensor blocks_of(const Tensor& x, int64_t axis, int64_t block) {
  Shape sizes = x.sizes();
  sizes[static_cast<size_t>(axis)] /= block;
  sizes.insert(sizes.begin() + axis + 1, block);
  return reshape(x, sizes);
}

// The inverse of blocks_of: dims `axis` and `axis` + 1 merged.
Tensor merge_blocks(const Tensor& x, int64_t axis) {
  Shape sizes = x.sizes();
  sizes[static_cast<size_t>(axis)] *= sizes[static_cast<size_t>(axis) + 1];
  sizes.erase(sizes.begin() + axis + 1);
  return reshape(x, sizes);
}

// A loss whose mean is over the rows its targets count (cross_entropy and nll_loss skip
// ignore_index): under a batch split, the ranks' sums and counts give the whole batch's mean.
bool counted_mean_loss(const OpDef& op, const Attrs& attrs) {
  return (op.name == "cross_entropy" || op.name == "nll_loss") &&
         attrs.get_or<std::string>("reduction", "mean") == "mean";
}

// Restores the thread's previous interceptor when the forward ends, even by an exception.
class InterceptorScope {
 public:
  explicit InterceptorScope(DispatchInterceptor* interceptor)
      : previous_(set_dispatch_interceptor(interceptor)) {}
  ~InterceptorScope() { set_dispatch_interceptor(previous_); }
  InterceptorScope(const InterceptorScope&) = delete;
  InterceptorScope& operator=(const InterceptorScope&) = delete;

 private:
  DispatchInterceptor* previous_;
};

}  // namespace

std::vector<planner::PlanFile::Op> planned_ops(const planner::Graph& graph,
                                               const planner::PlanResult& result, int point) {
  TESSEL_CHECK(point >= 0 && point < static_cast<int>(result.frontier.size()),
               "planned_ops: point ", point, " is not on the frontier (", result.frontier.size(),
               " points)");
  const std::vector<int>& choice = result.frontier[point].choice;
  std::vector<planner::PlanFile::Op> ops;
  for (const planner::TracedOp& op : graph.ops) {
    const planner::Strategy& s = result.strategies[op.id][choice[op.id]];
    planner::PlanFile::Op entry;
    entry.index = op.id;
    entry.op = op.name;
    entry.strategy = planner::split_kind_name(s.kind);
    entry.dp = s.dp;
    entry.tp = s.tp;
    for (const planner::ParameterSplit& split : s.parameters)
      entry.parameters.push_back(graph.tensors[split.tensor].parameter);
    ops.push_back(std::move(entry));
  }
  return ops;
}

ParallelModule::ParallelModule(std::shared_ptr<nn::Module> model,
                               const std::vector<planner::PlanFile::Op>& ops,
                               const ProcessGrid& grid, const planner::ModuleTraceOptions& trace)
    : ParallelModule(std::move(model), ops, grid.data_parallel_on_device(),
                     grid.tensor_parallel_on_device(), trace) {}

ParallelModule::ParallelModule(std::shared_ptr<nn::Module> model,
                               const std::vector<planner::PlanFile::Op>& ops,
                               std::shared_ptr<Communicator> dp_group,
                               std::shared_ptr<Communicator> tp_group,
                               const planner::ModuleTraceOptions& trace)
    : model_(std::move(model)), trace_(trace) {
  TESSEL_CHECK(model_ != nullptr, "parallelize: no model");
  TESSEL_CHECK(dp_group && tp_group, "parallelize: no dp or tp group");
  dp_comm_ = std::move(dp_group);
  tp_comm_ = std::move(tp_group);
  dp_ = dp_comm_->size();
  tp_ = tp_comm_->size();
  dp_index_ = dp_comm_->rank();
  tp_index_ = tp_comm_->rank();
  dp_group_ = register_tp_group(dp_comm_);
  tp_group_ = register_tp_group(tp_comm_);
  main_grid_ = Grid{dp_, tp_, dp_index_, tp_index_, dp_group_, tp_group_, dp_comm_, tp_comm_};

  // The whole values, before the trace turns the model's tensors into meta ones.
  std::map<std::string, Tensor> whole;
  {
    NoGradGuard no_grad;
    for (const auto& [name, tensor] : model_->named_parameters()) whole[name] = tensor.clone();
    for (const auto& [name, tensor] : model_->named_buffers()) whole[name] = tensor.clone();
  }
  graph_ = planner::trace_module(*model_, trace);
  TESSEL_CHECK(ops.size() == graph_.ops.size(), "parallelize: the plan has ", ops.size(),
               " ops but ", trace.name(), " on input ", shape_str(trace.input_shape()), " runs ",
               graph_.ops.size(), ": the plan was made for another model or input shape");

  planner::PlannerConfig config;
  // One group for both (per-op degrees on a line of ranks): ops split the batch or the model
  // over all of it.
  one_group_ = dp_comm_ == tp_comm_;
  config.devices = one_group_ ? dp_ : dp_ * tp_;
  config.max_tp = tp_;
  config.profile.devices_per_node = config.devices;
  const auto all = planner::enumerate_strategies(graph_, config);
  for (size_t i = 0; i < ops.size(); ++i) {
    const planner::PlanFile::Op& planned = ops[i];
    const planner::TracedOp& traced = graph_.ops[i];
    TESSEL_CHECK(planned.op == traced.name, "parallelize: op ", i, " of the plan is ", planned.op,
                 " but ", trace.name(), " runs ", traced.name,
                 " there: the plan was made for another model");
    if (one_group_) {
      TESSEL_CHECK((planned.dp == 1 && planned.tp == 1) || planned.dp * planned.tp == dp_,
                   "parallelize: op ", i, " (", traced.name, ") runs at dp=", planned.dp,
                   " tp=", planned.tp, " but per-op degrees over one group of ", dp_,
                   " ranks need dp x tp = ", dp_);
    } else {
      TESSEL_CHECK(
          (planned.dp == 1 || planned.dp == dp_) && (planned.tp == 1 || planned.tp == tp_),
          "parallelize: op ", i, " (", traced.name, ") runs at dp=", planned.dp, " tp=", planned.tp,
          " but the grid is dp=", dp_, " x tp=", tp_,
          "; plans with per-op degrees run over one group (the same communicator for dp and tp)");
    }
    auto found = std::find_if(all[i].begin(), all[i].end(), [&](const planner::Strategy& s) {
      return s.dp == planned.dp && s.tp == planned.tp &&
             planner::split_kind_name(s.kind) == planned.strategy;
    });
    TESSEL_CHECK(found != all[i].end(), "parallelize: op ", i, " (", traced.name,
                 ") has no strategy '", planned.strategy, "' at dp=", planned.dp,
                 " tp=", planned.tp);
    strategies_.push_back(*found);
    for (const planner::ParameterSplit& split : found->parameters) {
      const std::string& name = graph_.tensors[split.tensor].parameter;
      // An op over the whole batch gives every dp rank the whole gradient already.
      if (found->dp > 1) batch_split_parameters_.insert(name);
      // Kept as its first user cuts it (the planner's owner); a tied parameter's other users
      // move it to their cut (parameter_as_cut).
      if (split.owned && split.dim >= 0) {
        split_dims_[name] = split.dim;
        split_factors_[name] = factor_of(*found);
      }
    }
  }
  for (const planner::TracedOp& op : graph_.ops)
    for (size_t slot = 0; slot < op.inputs.size(); ++slot)
      if (auto read = input_read(op, slot)) planned_view_gathers_ += read->gathers.size();
  if (one_group_) {
    // The grids of the factors the plan's ops use: 1 (the batch over the group) and N (the model
    // over it) are the group itself; the others are made of groups over part of the ranks.
    const int ranks = dp_, rank = dp_comm_->rank();
    auto single = [&](const char* name) {
      auto comm = std::make_shared<SubgroupCommunicator>(dp_comm_, std::vector<int>{rank}, name);
      return std::make_pair(std::shared_ptr<Communicator>(comm), register_tp_group(comm));
    };
    std::set<int> factors{1, ranks};
    for (const planner::Strategy& s : strategies_)
      if (!s.fully_replicated()) factors.insert(s.tp);
    for (int t : factors) {
      Grid g;
      g.dp = ranks / t;
      g.tp = t;
      g.dp_index = rank / t;
      g.tp_index = rank % t;
      if (t == 1) {
        std::tie(g.tp_comm, g.tp_group) = single("tp1");
        g.dp_comm = dp_comm_;
        g.dp_group = dp_group_;
      } else if (t == ranks) {
        std::tie(g.dp_comm, g.dp_group) = single("dp1");
        g.tp_comm = tp_comm_;
        g.tp_group = tp_group_;
      } else {
        std::vector<int> model_ranks, batch_ranks;
        for (int k = 0; k < t; ++k) model_ranks.push_back(g.dp_index * t + k);
        for (int k = 0; k < g.dp; ++k) batch_ranks.push_back(g.tp_index + k * t);
        const std::string suffix = std::to_string(g.dp) + "x" + std::to_string(t);
        g.tp_comm = std::make_shared<SubgroupCommunicator>(dp_comm_, model_ranks, "tp" + suffix);
        g.dp_comm = std::make_shared<SubgroupCommunicator>(dp_comm_, batch_ranks, "dp" + suffix);
        g.tp_group = register_tp_group(g.tp_comm);
        g.dp_group = register_tp_group(g.dp_comm);
      }
      grids_[t] = g;
    }
    // A parameter cut over part of the ranks is read on its own grid only (its gradient is
    // summed over that grid's dp group), and read on such a grid only where it lives there.
    for (size_t i = 0; i < strategies_.size(); ++i)
      for (const planner::ParameterSplit& split : strategies_[i].parameters) {
        const std::string& name = graph_.tensors[split.tensor].parameter;
        auto cut = split_factors_.find(name);
        if (cut == split_factors_.end()) continue;
        const int reader = strategies_[i].fully_replicated() ? 0 : factor_of(strategies_[i]);
        const auto part_of_the_ranks = [&](int t) { return t > 1 && t < ranks; };
        TESSEL_CHECK(
            reader == cut->second || !(part_of_the_ranks(reader) || part_of_the_ranks(cut->second)),
            "parallelize: op ", i, " (", graph_.ops[i].name, ") reads ", name,
            " on another grid than the one it is cut over (over part of the ranks), "
            "which is not run yet");
      }
  }
  // Over one group, a parameter cut over the ranks sums its batch-split users' gradients as they
  // read it (run_op), not in synchronize_gradients.
  if (one_group_)
    for (const auto& [name, dim] : split_dims_) batch_split_parameters_.erase(name);

  auto shard_of = [&](const Tensor& full, int64_t dim, int factor) {
    if (dim < 0) return full;
    const Grid& g = grid(factor);
    const int64_t length = full.size(dim) / g.tp;
    // A copy of its own: a narrow view (contiguous along dim 0) would keep the whole alive.
    return narrow(full, dim, length * g.tp_index, length).clone();
  };
  auto factor_of_tensor = [&](const std::string& name) {
    auto found = split_factors_.find(name);
    return found == split_factors_.end() ? 0 : found->second;
  };
  for (const auto& [name, proxy] : model_->named_parameters()) {
    auto split = split_dims_.find(name);
    const int64_t dim = split == split_dims_.end() ? -1 : split->second;
    const int factor = factor_of_tensor(name);
    Tensor local = shard_of(whole.at(name), dim, factor).detach().set_requires_grad(true);
    parameters_.emplace_back(name, local);
    locals_[proxy.impl()] =
        Local{proxy.impl_ptr(), local, Layout{false, dim >= 0, dim, 0, factor}, true};
  }
  // Per-channel buffers (batch norm's running statistics) are cut as their module's weight.
  for (const auto& [name, proxy] : model_->named_buffers()) {
    const size_t dot = name.rfind('.');
    const std::string weight = (dot == std::string::npos ? "" : name.substr(0, dot + 1)) + "weight";
    auto split = split_dims_.find(weight);
    const Tensor& full = whole.at(name);
    const bool per_channel = split != split_dims_.end() && split->second == 0 && full.dim() == 1 &&
                             full.size(0) == whole.at(weight).size(0);
    const int factor = per_channel ? factor_of_tensor(weight) : 0;
    if (per_channel) {
      split_dims_[name] = 0;
      split_factors_[name] = factor;
    }
    Tensor local = shard_of(full, per_channel ? 0 : -1, factor);
    buffers_[name] = local;
    locals_[proxy.impl()] = Local{
        proxy.impl_ptr(), local, Layout{false, per_channel, per_channel ? 0 : -1, 0, factor}, true};
  }
}

const ParallelModule::Grid& ParallelModule::grid(int factor) const {
  if (!one_group_ || factor == 0) return main_grid_;
  auto found = grids_.find(factor);
  TESSEL_CHECK(found != grids_.end(), "parallelize: no grid of factor ", factor);
  return found->second;
}

ParallelModule::~ParallelModule() = default;

std::vector<Tensor> ParallelModule::parameters() const {
  std::vector<Tensor> result;
  for (const auto& entry : parameters_) result.push_back(entry.second);
  return result;
}

nn::NamedTensors ParallelModule::named_parameters() const { return parameters_; }

void ParallelModule::synchronize_gradients() {
  if (dp_ == 1) return;
  // Parameters cut over part of the ranks: their grid's ranks of one part summed the gradients
  // of different rows.
  std::map<int, std::vector<Tensor>> by_grid;
  for (const auto& [name, parameter] : parameters_) {
    const Tensor grad = parameter.grad();
    if (grad.defined() && shard_copies(name) > 1) by_grid[split_factors_.at(name)].push_back(grad);
  }
  for (const auto& [factor, grads] : by_grid) {
    NoGradGuard no_grad;
    std::vector<Tensor> flat;
    for (const Tensor& grad : grads) flat.push_back(reshape(grad, {grad.numel()}));
    Tensor bucket = cat(flat);
    grid(factor).dp_comm->all_reduce(bucket, ReduceOp::kSum);
    int64_t offset = 0;
    for (const Tensor& grad : grads) {
      Tensor target = grad;
      target.copy_(narrow(bucket, 0, offset, grad.numel()).reshape(grad.sizes()));
      offset += grad.numel();
    }
  }
  std::vector<Tensor> grads;
  int64_t numel = 0;
  for (const auto& [name, parameter] : parameters_) {
    const Tensor grad = parameter.grad();
    if (!grad.defined() || !batch_split_parameters_.count(name)) continue;
    if (!grads.empty() && grad.dtype() != grads[0].dtype()) {
      dp_comm_->all_reduce(grad, ReduceOp::kSum);  // another dtype than the bucket's
      continue;
    }
    grads.push_back(grad);
    numel += grad.numel();
  }
  if (grads.empty()) return;
  // One all-reduce over a flat bucket, as DDP does (the planner prices the bucket's memory).
  NoGradGuard no_grad;
  if (!gradient_bucket_.defined() || gradient_bucket_.numel() != numel ||
      gradient_bucket_.dtype() != grads[0].dtype())
    gradient_bucket_ = empty({numel}, TensorOptions(grads[0].dtype()).device(grads[0].device()));
  int64_t offset = 0;
  for (const Tensor& grad : grads) {
    narrow(gradient_bucket_, 0, offset, grad.numel()).copy_(grad.reshape({grad.numel()}));
    offset += grad.numel();
  }
  dp_comm_->all_reduce(gradient_bucket_, ReduceOp::kSum);
  offset = 0;
  for (const Tensor& grad : grads) {
    Tensor target = grad;
    target.copy_(narrow(gradient_bucket_, 0, offset, grad.numel()).reshape(grad.sizes()));
    offset += grad.numel();
  }
}

Tensor ParallelModule::whole(const std::string& name, const Tensor& local) const {
  auto split = split_dims_.find(name);
  if (split == split_dims_.end()) return local.detach().clone();
  return gather_shards(local.detach(), split->second, *grid(split_factors_.at(name)).tp_comm);
}

std::map<std::string, Tensor> ParallelModule::full_state_dict() const {
  std::map<std::string, Tensor> result;
  for (const auto& [name, local] : parameters_) result[name] = whole(name, local);
  for (const auto& [name, local] : buffers_) result[name] = whole(name, local);
  return result;
}

std::map<std::string, Tensor> ParallelModule::full_gradients() const {
  std::map<std::string, Tensor> result;
  for (const auto& [name, local] : parameters_)
    if (local.grad().defined()) result[name] = whole(name, local.grad());
  return result;
}

Tensor ParallelModule::loss(const Tensor& input, const Tensor& labels) {
  TESSEL_CHECK(trace_.step_inputs().size() <= 2,
               "ParallelModule::loss: the step takes several inputs: give them as a list");
  TESSEL_CHECK(trace_.loss() || labels.defined(),
               "ParallelModule::loss: the model's loss is cross_entropy: give the labels");
  return labels.defined() ? loss(std::vector<Tensor>{input, labels})
                          : loss(std::vector<Tensor>{input});
}

Tensor ParallelModule::loss(const std::vector<Tensor>& inputs) {
  const std::vector<planner::StepInput> specs = trace_.step_inputs();
  TESSEL_CHECK(inputs.size() == specs.size(), "ParallelModule::loss: the step takes ", specs.size(),
               " inputs, got ", inputs.size());
  const Layout rows{dp_ > 1, false, -1, 0, one_group_ ? 1 : 0};
  next_op_ = 0;
  view_gathers_ = 0;
  struct Clear {
    ParallelModule& self;
    ~Clear() {
      for (auto it = self.locals_.begin(); it != self.locals_.end();)
        it = it->second.persistent ? std::next(it) : self.locals_.erase(it);
    }
  } clear{*this};
  std::vector<Tensor> proxies;
  for (size_t i = 0; i < inputs.size(); ++i) {
    TESSEL_CHECK(inputs[i].defined() && inputs[i].dim() >= 1, "ParallelModule::loss: input ",
                 specs[i].name, " is missing or has no batch dim");
    Shape whole = inputs[i].sizes();
    whole[0] *= dp_;
    TESSEL_CHECK(whole == specs[i].shape, "ParallelModule::loss: this rank's ", specs[i].name, " ",
                 shape_str(inputs[i].sizes()), " is not 1/", dp_,
                 " of the batch the plan was made for, ", shape_str(specs[i].shape));
    proxies.push_back(proxy_for(
        empty(whole, TensorOptions(inputs[i].dtype()).device(Device::meta())), inputs[i], rows));
  }
  Tensor loss_proxy;
  {
    InterceptorScope scope(this);
    loss_proxy = trace_.step()(*model_, proxies);
  }
  TESSEL_CHECK(next_op_ == graph_.ops.size(), "parallelize: ", trace_.name(), " ran ", next_op_,
               " ops but its trace has ", graph_.ops.size(),
               ": the model runs other ops than when it was traced");
  unplanned_moves_ += std::max(0, view_gathers_ - planned_view_gathers_);
  const Local& result = local_of(loss_proxy);
  TESSEL_CHECK(!result.layout.batch && !result.layout.model,
               "parallelize: the loss is left split over the grid");
  return result.tensor;
}

std::optional<planner::InputRead> ParallelModule::input_read(const planner::TracedOp& op,
                                                             size_t slot) const {
  if (op.inputs[slot] < 0) return std::nullopt;
  const planner::TracedTensor& tensor = graph_.tensors[op.inputs[slot]];
  // The data arrive as this rank's rows (loss()); an op over the whole batch gathers them
  // (labels as they are, 64-bit ids).
  if (tensor.is_input() && tensor.has_batch)
    return planner::input_read(graph_, op, slot, planner::Layout{dp_, 1});
  if (tensor.producer < 0) return std::nullopt;
  return planner::input_read(graph_, op, slot,
                             strategies_[tensor.producer].output_layouts[tensor.producer_slot]);
}

std::vector<StepCollective> ParallelModule::planned_collectives() const {
  std::vector<StepCollective> planned;
  auto label = [&](const char* group) { return std::string(one_group_ ? "world" : group); };

  // A collective over `size` ranks of the group labelled `group`. Over one group, those over part
  // of its ranks (SubgroupCommunicator) are point-to-point: an all-gather g - 1 sends of a g-th
  // of its result, an all-reduce g - 1 sends of the whole tensor.
  auto collective = [&](const char* kind, const std::string& group, int size, int64_t bytes) {
    if (size <= 1) return;
    if (one_group_ && size < dp_) {
      const bool gather = std::string(kind) == "all_gather";
      for (int peer = 1; peer < size; ++peer)
        planned.push_back({"send", "world", gather ? bytes / size : bytes});
      return;
    }
    planned.push_back({kind, group, bytes});
  };
  // The planner's move (redistribution_steps): all-gathers, or over one group an all-to-all
  // between the batch's line and the model's (a send of a size-th of its part to every other
  // rank).
  const int devices = one_group_ ? dp_ : dp_ * tp_;
  auto gather = [&](const planner::Layout& have, const planner::Layout& need, int64_t bytes) {
    for (const planner::MoveStep& step :
         planner::redistribution_steps(have, need, static_cast<double>(bytes), devices)) {
      const auto step_bytes = static_cast<int64_t>(std::llround(step.bytes));
      if (step.kind == planner::MoveStep::Kind::kAllToAll) {
        for (int peer = 1; peer < step.group; ++peer)
          planned.push_back({"send", "world", step_bytes / step.group});
        continue;
      }
      // A gather of the model's parts over tp, of the batch's over dp (over one group, a batch
      // line's parts gathered into another grid's: over that grid's tp group).
      const bool model_gather = have.model > 1 && step.group == have.model;
      collective("all_gather", one_group_ ? "world" : (model_gather ? "tp" : "dp"), step.group,
                 step_bytes);
    }
  };
  const auto bytes_of = [](const Shape& sizes) {
    return shape_numel(sizes) * static_cast<int64_t>(sizeof(float));
  };
  // Tensors (read as one shape) whose gradient one all-reduce sums.
  std::set<std::tuple<int, Shape, int>> column_inputs;  // and the grid reading them
  for (const planner::TracedOp& op : graph_.ops) {
    const planner::Strategy& s = strategies_[op.id];
    const bool table = op.def->planner.split == ParallelSplit::kEmbeddingTable;
    if (s.tp > 1 && s.kind == SplitKind::kColumn && !table && op.inputs[0] >= 0 &&
        graph_.tensors[op.inputs[0]].requires_grad &&
        column_inputs.insert({op.inputs[0], op.input_shapes[0], s.tp}).second)
      collective("all_reduce", label("tp"), s.tp, bytes_of(op.input_shapes[0]) / s.dp);
    if (s.tp > 1 && (s.kind == SplitKind::kRow || (s.kind == SplitKind::kVocab && table)))
      collective("all_reduce", label("tp"), s.tp, bytes_of(op.output_shapes[0]) / s.dp);
    if (s.tp > 1 && s.kind == SplitKind::kVocab && !table) {
      // cross_entropy: row maxima, sums of exponentials, target logits; nll_loss: target values.
      const int64_t rows = op.input_shapes[0][0] / s.dp;
      const int reduces = op.def->planner.split == ParallelSplit::kLossClasses ? 1 : 3;
      for (int k = 0; k < reduces; ++k) collective("all_reduce", label("tp"), s.tp, rows * 4);
    }
    if (s.dp > 1 && !op.outputs.empty() && !graph_.tensors[op.outputs[0]].has_batch) {
      // A mean over counted rows: their sum and count (mean_over_dp).
      const int64_t values = counted_mean_loss(*op.def, op.attrs) ? 2 : 1;
      collective("all_reduce", label("dp"), s.dp, values * bytes_of(op.output_shapes[0]));
    }
    // Batch norm over a batch split: each rank's per-channel mean and centred squares gathered,
    // their gradient summed (batch_norm_over_dp).
    if (s.dp > 1 && op.name == "batch_norm" && !per_rank_batch_norm_) {
      const int64_t parts = 2 * op.input_shapes[0][1] / s.input_layouts[0].model * s.dp * 4;
      collective("all_gather", label("dp"), s.dp, parts);
      if (std::any_of(op.inputs.begin(), op.inputs.end(),
                      [&](int id) { return id >= 0 && graph_.tensors[id].requires_grad; }))
        collective("all_reduce", label("dp"), s.dp, parts);
    }
    // A broadcast operand of an element-wise split, cut to this rank's part: its gradient's
    // parts gathered.
    for (size_t slot = 0; slot < op.inputs.size(); ++slot)
      if (planner::cuts_broadcast_operand(graph_, op, s, slot))
        collective("all_gather", label("tp"), s.tp, bytes_of(op.input_shapes[slot]));
    // A tied parameter's user that cuts it otherwise than its owner (parameter_as_cut): the
    // planner's shared-parameter move, forward and for the gradient.
    for (const planner::ParameterSplit& cut : s.parameters) {
      auto stored = split_dims_.find(graph_.tensors[cut.tensor].parameter);
      const int64_t owner_dim = stored == split_dims_.end() ? -1 : stored->second;
      if (cut.owned || owner_dim == cut.dim) continue;
      const int64_t bytes = graph_.tensors[cut.tensor].bytes;
      // The ranks that cut it: the owner's grid's tp group, or the reader's where it is whole.
      const std::string& name = graph_.tensors[cut.tensor].parameter;
      const int parts = owner_dim >= 0 ? grid(split_factors_.at(name)).tp : s.tp;
      // Summed at read (run_op) where the owner cuts it over the model's line.
      if (one_group_ && s.dp > 1 && owner_dim >= 0 && cut.dim < 0 && parts == dp_)
        collective("all_reduce", label("dp"), parts, bytes);
      if (owner_dim >= 0 && cut.dim >= 0) {
        for (int pass = 0; pass < 2; ++pass)
          for (int peer = 1; peer < parts; ++peer)
            planned.push_back({"send", label("tp"), bytes / parts / parts});
      } else {
        collective("all_gather", label("tp"), parts, bytes);
      }
    }
    for (size_t slot = 0; slot < op.inputs.size(); ++slot) {
      const auto found = input_read(op, slot);
      if (!found) continue;
      const planner::InputRead& read = *found;
      const bool data = graph_.tensors[op.inputs[slot]].producer < 0;  // no gradient moves back
      for (const planner::ViewGather& step : read.gathers)
        gather(step.from, step.to, static_cast<int64_t>(std::llround(step.bytes)));
      const planner::Layout& to = s.input_layouts[slot];
      const auto bytes = static_cast<int64_t>(std::llround(read.bytes));
      gather(read.found, to, bytes);
      if (read.gradient && !data) gather(to, read.found, bytes);
    }
  }
  std::sort(planned.begin(), planned.end());
  return planned;
}

void ParallelModule::load_state_dict(const std::map<std::string, Tensor>& whole) {
  std::vector<std::pair<Tensor, Tensor>> copies;  // (local, its slice of the whole tensor)
  auto plan_copy = [&](const std::string& name, const Tensor& local) {
    auto found = whole.find(name);
    TESSEL_CHECK(found != whole.end(), "ParallelModule::load_state_dict: no tensor named ", name);
    auto split = split_dims_.find(name);
    Shape expected = local.sizes();
    const Grid& g = grid(split == split_dims_.end() ? 0 : split_factors_.at(name));
    if (split != split_dims_.end()) expected[static_cast<size_t>(split->second)] *= g.tp;
    TESSEL_CHECK(found->second.sizes() == expected, "ParallelModule::load_state_dict: ", name,
                 " has shape ", shape_str(found->second.sizes()), " but the model's is ",
                 shape_str(expected));
    Tensor source = found->second;
    if (split != split_dims_.end()) {
      const int64_t length = local.size(split->second);
      source = narrow(source, split->second, length * g.tp_index, length);
    }
    copies.emplace_back(local, source);
  };
  for (const auto& [name, local] : parameters_) plan_copy(name, local);
  for (const auto& [name, local] : buffers_) plan_copy(name, local);
  NoGradGuard no_grad;
  for (auto& [local, source] : copies) local.copy_(source);
}

Tensor ParallelModule::proxy_for(const Tensor& whole_shape, Tensor local, Layout layout) {
  Shape expected = whole_shape.sizes();
  if (layout.batch) expected.at(0) /= batch_parts(layout);
  if (layout.model) expected.at(static_cast<size_t>(layout.axis)) /= model_parts(layout);
  TESSEL_CHECK(local.sizes() == expected, "parallelize: a local result of shape ",
               shape_str(local.sizes()), " does not match the whole ",
               shape_str(whole_shape.sizes()), " cut ", layout.batch ? "by rows " : "",
               layout.model ? "along dim " : "",
               layout.model ? std::to_string(layout.axis) : std::string(), " (op ", next_op_, ")");
  if (locals_.size() >= purge_at_) {
    // Locals whose meta tensors the model no longer holds are gone for it: let their tensors go
    // (autograd keeps what backward needs), so a step holds no more than the unsplit model would.
    // Every few new locals: few dead ones wait at once (a step's peak would hold them), for a
    // pass over the live ones per kPurgeEvery ops.
    constexpr size_t kPurgeEvery = 8;
    for (auto it = locals_.begin(); it != locals_.end();)
      it = !it->second.persistent && it->second.proxy.expired() ? locals_.erase(it) : std::next(it);
    purge_at_ = locals_.size() + kPurgeEvery;
  }
  locals_[whole_shape.impl()] = Local{whole_shape.impl_ptr(), std::move(local), layout, false};
  return whole_shape;
}

ParallelModule::Local& ParallelModule::local_of(const Tensor& proxy) {
  auto found = locals_.find(proxy.impl());
  if (found != locals_.end() && found->second.proxy.lock() == proxy.impl_ptr())
    return found->second;
  TESSEL_CHECK(!proxy.device().is_meta(), "parallelize: a meta tensor of shape ",
               shape_str(proxy.sizes()), " reached op ", next_op_,
               " that no op of the plan made (made outside the model's forward?)");
  // A real tensor made outside the plan (a constant of the model): the same on every rank.
  scratch_ = Local{proxy.impl_ptr(), proxy, Layout{}, false};
  return scratch_;
}

Tensor ParallelModule::move(const Tensor& local, const Layout& from, const Layout& to) {
  const bool from_split = from.batch || from.model, to_split = to.batch || to.model;
  const bool plain = is_floating(local.dtype()) && from.period == 0 && to.period == 0;
  if (one_group_ && from_split && to_split && from.factor != to.factor) {
    // Between the batch's line and the model's: each rank sends the others their parts of what
    // it holds (an all-to-all), a group's size-th of gathering the whole tensor.
    const bool batch_line = from.factor == 1 && from.batch && !from.model;
    const bool model_line = from.factor == dp_ && from.model && !from.batch;
    if (plain && batch_line && to.factor == dp_ && to.model && !to.batch)
      return all_to_all_tp(local, to.axis, 0, tp_group_);
    if (plain && model_line && to.factor == 1 && to.batch && !to.model)
      return all_to_all_tp(local, 0, from.axis, tp_group_);
    // Between the batch's line and another grid's batch split: each of that grid's parts is a run
    // of the line's parts, held by its tp group (rank order = row order).
    if (!from.model && !to.model && to.factor == 1)
      return shard_along(local, 0, grid(from.factor).tp_group);
    if (batch_line && !to.model) return gather_along(local, 0, grid(to.factor).tp_group);
    // Between other grids: gathered whole over the first, cut for the second.
    return move(move(local, from, Layout{}), Layout{}, to);
  }
  const Grid& g = grid(from_split ? from.factor : to.factor);
  Tensor x = local;
  const bool other_axis =
      from.model && to.model && (from.axis != to.axis || from.period != to.period);
  // A split that moves to another dim of the same group: an all-to-all.
  if (plain && other_axis && from.batch == to.batch)
    return all_to_all_tp(x, to.axis, from.axis, g.tp_group);
  if (from.model && (!to.model || other_axis)) {
    // A period: each block's parts gathered (a dim of (blocks, part)).
    x = from.period > 0 ? merge_blocks(gather_along(blocks_of(x, from.axis, from.period / g.tp),
                                                    from.axis + 1, g.tp_group),
                                       from.axis)
                        : gather_along(x, from.axis, g.tp_group);
  }
  if (from.batch && !to.batch) x = gather_along(x, 0, g.dp_group);
  if (!from.batch && to.batch) x = shard_along(x, 0, g.dp_group);
  if (to.model && (!from.model || other_axis)) {
    x = to.period > 0
            ? merge_blocks(shard_along(blocks_of(x, to.axis, to.period), to.axis + 1, g.tp_group),
                           to.axis)
            : shard_along(x, to.axis, g.tp_group);
  }
  return x;
}

Tensor ParallelModule::parameter_as_cut(const Local& parameter, int64_t dim, int factor) {
  const Layout& have = parameter.layout;
  if (have.model == (dim >= 0) && (dim < 0 || have.axis == dim)) return parameter.tensor;
  return move(parameter.tensor, have, Layout{false, dim >= 0, dim, 0, factor});
}

Tensor ParallelModule::mean_over_dp(const Tensor& local_sum, const Tensor& target,
                                    const Attrs& attrs, const Grid& g) {
  const DType dtype = local_sum.dtype();
  // Class probabilities as targets count every row; class ids all but ignore_index.
  Tensor count =
      is_floating(target.dtype())
          ? full({}, static_cast<double>(target.size(0)),
                 TensorOptions(dtype).device(local_sum.device()))
          : sum(to_dtype(
                ne(target, static_cast<double>(attrs.get_or<int64_t>("ignore_index", -100))),
                dtype));
  Tensor both = reduce_from_tp(stack({local_sum, count}), g.dp_group);
  return div(select(both, 0, 0), select(both, 0, 1));
}

Tensor ParallelModule::batch_norm_over_dp(const std::vector<Tensor>& in, const Attrs& attrs,
                                          const Grid& g) {
  auto input = [&](size_t i) { return in.size() > i ? in[i] : Tensor(); };
  return batch_norm_across(in.at(0), input(1), input(2), input(3), input(4),
                           attrs.get<double>("momentum"), attrs.get<double>("eps"), {g.dp_group});
}

std::vector<Tensor> ParallelModule::dispatch(const OpDef& op, const std::vector<Tensor>& inputs,
                                             const Attrs& attrs, const std::vector<Tensor>& out) {
  if (op.flags.view && op.name == "reshape") {
    // A reshape that no view of its input gives (permuted dims merged) copies it first: an op of
    // the trace (contiguous), run as the plan says, before the view.
    const Tensor whole_out = tessel::dispatch(op, inputs, attrs)[0];
    if (whole_out.storage() != inputs.at(0).storage())
      return {run_view(op, run_op(ops::contiguous.def(), {inputs[0]}, Attrs{}, {})[0], attrs)};
  }
  if (op.flags.view) return {run_view(op, inputs.at(0), attrs)};
  return run_op(op, inputs, attrs, out);
}

Tensor ParallelModule::run_view(const OpDef& op, const Tensor& input, const Attrs& attrs) {
  Local& source = local_of(input);
  const Tensor whole_out = tessel::dispatch(op, {input}, attrs)[0];
  const planner::ViewStep step{op.name, attrs, input.sizes(), whole_out.sizes()};
  auto place_of = [](const Layout& layout) {
    return planner::SplitPlace{layout.batch, layout.model ? layout.axis : -1, layout.period};
  };
  Layout layout = source.layout;
  std::optional<planner::SplitPlace> seen =
      planner::place_through_view(step, place_of(layout), batch_parts(layout), model_parts(layout));
  Tensor local = source.tensor;
  if (!seen) {
    // The view cuts across the parts: the value gathered along the model where that is enough,
    // else whole, once for all its views (planner::read_through_views prices it so).
    const planner::GatheredView view =
        planner::gather_for_view(step, place_of(layout), batch_parts(layout));
    const Layout to{view.batch, false, -1, 0, view.batch ? layout.factor : 0};
    seen = view.seen;
    Tensor& gathered = source.gathered[to.batch];
    if (!gathered.defined()) {
      gathered = move(source.tensor, layout, to);
      ++view_gathers_;
    }
    local = gathered;
    layout = to;
  }
  const int64_t axis_before = layout.axis;
  layout.axis = seen->axis;
  layout.period = seen->period;
  Tensor local_out;
  if (op.name == "view" || op.name == "reshape" || op.name == "squeeze" || op.name == "unsqueeze") {
    Shape local_sizes = whole_out.sizes();
    if (layout.batch) local_sizes[0] /= batch_parts(layout);
    if (layout.model) local_sizes[static_cast<size_t>(layout.axis)] /= model_parts(layout);
    local_out = reshape(local, local_sizes);
  } else if (op.name == "expand") {
    Shape local_sizes = attrs.get<Shape>("shape");
    const size_t lead = local_sizes.size() - static_cast<size_t>(input.dim());
    if (layout.batch) local_sizes[lead] = local.size(0);
    if (layout.model) local_sizes[static_cast<size_t>(layout.axis)] = local.size(axis_before);
    Attrs local_attrs = attrs;
    local_attrs.set("shape", local_sizes);
    local_out = tessel::dispatch(op, {local}, local_attrs)[0];
  } else {
    local_out = tessel::dispatch(op, {local}, attrs)[0];
  }
  return proxy_for(whole_out, local_out, layout);
}

std::vector<Tensor> ParallelModule::run_op(const OpDef& op, const std::vector<Tensor>& inputs,
                                           const Attrs& attrs, const std::vector<Tensor>& out) {
  TESSEL_CHECK(next_op_ < graph_.ops.size(), "parallelize: ", trace_.name(),
               " calls more ops than its trace has (", graph_.ops.size(), "; then ", op.name, ")");
  const planner::TracedOp& traced = graph_.ops[next_op_];
  TESSEL_CHECK(traced.name == op.name, "parallelize: op ", next_op_, " of ", trace_.name(), " is ",
               op.name, " but was ", traced.name,
               " when traced: the model runs other ops than it did then");
  const planner::Strategy& s = strategies_[next_op_];
  const int factor = factor_of(s);
  const Grid& g = grid(factor);
  const SplitKind kind = s.kind;
  const bool split_model = s.tp > 1 && kind != SplitKind::kReplicate;

  // The axis the op splits over tp: that of an input already split (with its period: heads
  // inside batch * heads) unless the op's kind forces its own (planner::forced_model_axis).
  const ParallelSplit split = traced.def->planner.split;
  const bool embedding_table = split == ParallelSplit::kEmbeddingTable;
  int64_t axis = -1, period = 0, axis_size = 0;
  if (split_model) {
    for (size_t k = 0; k < inputs.size() && axis < 0; ++k) {
      if (!inputs[k].defined()) continue;
      const Local& input = local_of(inputs[k]);
      if (input.layout.model && !graph_.tensors[traced.inputs[k]].is_parameter() &&
          s.input_layouts[k].model > 1) {
        axis = input.layout.axis;
        period = input.layout.period;
        axis_size = inputs[k].size(axis);
      }
    }
    const int64_t forced = planner::forced_model_axis(
        split, kind, attrs, static_cast<int64_t>(traced.input_shapes.at(0).size()),
        static_cast<int64_t>(traced.output_shapes.at(0).size()), axis);
    if (forced >= 0) {
      axis = forced;
      period = 0;
    }
  }
  // An input or output cut along the op's axis: with its period where it is as long there as the
  // tensor that gave the axis.
  auto cut_of = [&](const Tensor& whole, bool batch, bool model) {
    Layout layout{batch, model, model ? axis : -1, 0, batch || model ? factor : 0};
    if (model && whole.size(axis) == axis_size) layout.period = period;
    return layout;
  };

  std::vector<Tensor> local_in(inputs.size());
  for (size_t k = 0; k < inputs.size(); ++k) {
    if (!inputs[k].defined()) continue;
    const Local input = local_of(inputs[k]);
    const bool parameter = traced.inputs[k] >= 0 && graph_.tensors[traced.inputs[k]].is_parameter();
    if (parameter) {
      int64_t dim = -1;  // as this op's strategy cuts it
      for (const planner::ParameterSplit& cut : s.parameters)
        if (cut.tensor == traced.inputs[k]) dim = cut.dim;
      Local read = input;
      // The ranks that compute the same part of this op's gradient: those of a dp rank (dp x tp),
      // those of the same rows over one group.
      const int same_part = one_group_ ? dp_ / s.dp : (s.dp == 1 ? dp_ : 1);
      if (same_part > 1 &&
          batch_split_parameters_.count(graph_.tensors[traced.inputs[k]].parameter)) {
        // Another user splits the batch, so the gradient is summed over dp: this op's part, the
        // same on `same_part` ranks, enters the sum as 1/same_part from each.
        read.tensor = mul(input.tensor, 1.0);
        read.tensor.register_hook(
            [same_part](const Tensor& grad) { return mul(grad, 1.0 / same_part); });
      }
      local_in[k] = parameter_as_cut(read, dim, factor);
      // Over one group, an op splitting the batch reads whole a parameter that another op cuts
      // over all the ranks: its gradient, this rank's rows' part, is summed here (not in
      // synchronize_gradients, which cannot sum cut parameters over the group that cuts them).
      if (one_group_ && s.dp > 1 && input.layout.model && dim < 0 && input.layout.factor == dp_)
        local_in[k] = copy_to_tp(local_in[k], tp_group_);
      continue;
    }
    if (input.persistent) {
      local_in[k] = input.tensor;  // a buffer, cut as its module's weight once for all
      continue;
    }
    local_in[k] =
        move(input.tensor, input.layout,
             cut_of(inputs[k], s.input_layouts[k].batch > 1, s.input_layouts[k].model > 1));
  }
  // An element-wise split reads a broadcast operand that spans the split dim (a position table
  // added to split features) in this rank's part; its gradient's parts are all-gathered.
  if (split_model && split == ParallelSplit::kPointwise) {
    const int64_t rank = static_cast<int64_t>(traced.output_shapes.at(0).size());
    for (size_t k = 0; k < inputs.size(); ++k) {
      if (!inputs[k].defined() || s.input_layouts[k].model > 1) continue;
      const int64_t dim = axis - (rank - inputs[k].dim());
      if (dim < 0 || inputs[k].size(dim) == 1) continue;
      const bool batch = s.input_layouts[k].batch > 1;
      const Layout whole{batch, false, -1, 0, batch ? factor : 0};
      Layout part = whole;
      part.model = true;
      part.factor = factor;
      part.axis = dim;
      part.period = inputs[k].size(dim) == axis_size ? period : 0;
      local_in[k] = move(local_in[k], whole, part);
    }
  }
  std::vector<Tensor> local_out;
  for (const Tensor& target : out) local_out.push_back(local_of(target).tensor);

  Attrs local_attrs = attrs;
  // A factory (ones_like of a meta tensor) makes its result where the shards live.
  if (attrs.has("device") && Device::parse(attrs.get<std::string>("device")).is_meta())
    local_attrs.set("device", tp_comm_->device().str());
  const bool factory = std::none_of(inputs.begin(), inputs.end(),
                                    [](const Tensor& input) { return input.defined(); });
  // A mean loss over a batch split: each rank sums its rows, then sums and counts are combined.
  const bool counted_over_dp = s.dp > 1 && counted_mean_loss(op, attrs);
  if (counted_over_dp) local_attrs.set("reduction", std::string("sum"));
  std::vector<Tensor> results;
  if (kind == SplitKind::kColumn && s.tp > 1 && !embedding_table && local_in[0].requires_grad()) {
    // Each rank uses the whole input: its gradient is the sum of every rank's part, one
    // all-reduce for every column split reading it.
    Local& source = local_of(inputs[0]);
    Tensor& copy = source.column_input[factor];
    if (!copy.defined()) copy = copy_to_tp(local_in[0], g.tp_group);
    local_in[0] = copy;
    results = tessel::dispatch(op, local_in, local_attrs, local_out);
  } else if (kind == SplitKind::kRow && s.tp > 1) {
    // Partial products over the input features, summed, then the bias once.
    Tensor bias = local_in.size() > 2 ? local_in[2] : Tensor();
    if (bias.defined()) local_in[2] = Tensor();
    Tensor y = reduce_from_tp(tessel::dispatch(op, local_in, local_attrs)[0], g.tp_group);
    if (bias.defined()) {
      Shape sizes(static_cast<size_t>(y.dim()), 1);
      sizes[is_conv(traced) ? 1 : sizes.size() - 1] = bias.size(0);
      y = add(y, reshape(bias, sizes));
    }
    results = {y};
  } else if (kind == SplitKind::kVocab && s.tp > 1 && embedding_table) {
    // This rank's rows of the table look up its ids, the others' are summed in.
    results = {vocab_parallel_embedding(local_in[0], local_in[1], g.tp_group,
                                        attrs.get_or<int64_t>("padding_idx", -1))};
  } else if (kind == SplitKind::kVocab && s.tp > 1) {
    TESSEL_CHECK(attrs.get_or<std::string>("reduction", "mean") == "mean" &&
                     attrs.get_or<double>("label_smoothing", 0.0) == 0.0,
                 "parallelize: a class-split ", op.name,
                 " runs with the mean reduction and no label smoothing only");
    const int64_t ignore_index = attrs.get_or<int64_t>("ignore_index", -100);
    results = {op.name == "nll_loss"
                   ? vocab_parallel_nll_loss(local_in[0], local_in[1], g.tp_group, ignore_index,
                                             /*sum_rows=*/counted_over_dp)
                   : vocab_parallel_cross_entropy(local_in[0], local_in[1], g.tp_group,
                                                  ignore_index,
                                                  /*sum_rows=*/counted_over_dp)};
  } else if (op.name == "batch_norm" && s.dp > 1 && !per_rank_batch_norm_) {
    results = {batch_norm_over_dp(local_in, attrs, g)};
  } else {
    if (kind == SplitKind::kFeature && is_conv(traced) && s.tp > 1)
      local_attrs.set("groups", attrs.get<int64_t>("groups") / s.tp);  // whole groups per rank
    results = tessel::dispatch(op, local_in, local_attrs, local_out);
  }
  // A batch split whose result lost the batch (a loss): combine the rows' parts.
  if (s.dp > 1 && !results.empty() && !graph_.tensors[traced.outputs[0]].has_batch) {
    if (counted_over_dp) {
      results[0] = mean_over_dp(results[0], local_in.at(1), attrs, g);
    } else {
      results[0] = reduce_from_tp(results[0], g.dp_group);
      if (op.kind == OpKind::kLoss || op.name == "mean") results[0] = mul(results[0], 1.0 / s.dp);
    }
  }

  std::vector<Tensor> proxies;
  if (!out.empty()) {
    proxies = out;
  } else {
    for (const OutputSpec& spec : op.shape(inputs, attrs))
      proxies.push_back(empty(spec.sizes, TensorOptions(spec.dtype).device(Device::meta())));
  }
  // A split op run by its parallel form gives its first output only (cross_entropy's saved
  // log-probabilities are its backward's business).
  for (size_t k = 0; k < proxies.size() && k < results.size(); ++k) {
    const planner::Layout& planned = s.output_layouts.at(k);
    Layout layout{planned.batch > 1, planned.model > 1 && split_model, -1, 0, 0};
    if (layout.batch || layout.model) layout.factor = factor;
    if (layout.model) {
      // Further outputs of fewer dims (batch norm's per-channel statistics) are cut along the
      // dim as long as the first output's split one.
      const Shape& first = proxies[0].sizes();
      const Shape& sizes = proxies[k].sizes();
      if (sizes.size() == first.size()) {
        layout = cut_of(proxies[k], layout.batch, true);
      } else {
        auto same = std::find(sizes.begin(), sizes.end(), first[static_cast<size_t>(axis)]);
        layout.axis = same - sizes.begin();
        layout.model = same != sizes.end();
      }
    }
    if (k > 0 && proxies[k].dim() != proxies[0].dim() && proxies[k].dim() > 0) {
      // Further outputs of other dims (batch norm's statistics, cross_entropy's
      // log-probabilities): rows of the batch where the local tensor has fewer than the whole
      // and they are not the split channels, whatever the trace guessed from their sizes.
      layout.batch =
          results.at(k).size(0) != proxies[k].size(0) && !(layout.model && layout.axis == 0);
    }
    if (out.empty())
      proxy_for(proxies[k], factory ? move(results.at(k), Layout{}, layout) : results.at(k),
                layout);
  }
  ++next_op_;
  return proxies;
}

}  // namespace tessel::parallel
