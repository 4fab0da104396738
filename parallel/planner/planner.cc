#include "parallel/planner/planner.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <sstream>

#include "core/error.h"
#include "ops/ops.h"

namespace tessel::planner {

namespace {
constexpr const char* kBertPrefix = "bert_";
}  // namespace

bool is_bert(const std::string& model) { return model.rfind(kBertPrefix, 0) == 0; }

namespace {

// Why the recipes (or, for a module of one's own, parallel::ParallelModule) would not run
// `choice` as priced; empty when they do. The recipes and a module of one's own run plans
// through ParallelModule: a dp x tp grid (beside ZeRO over each dp group), or per-op degrees
// over one group of all `devices`, each op on the grid of its own tp (beside ZeRO over that
// group). Not run yet: a parameter cut on a grid over part of the devices (1 < tp < devices) that
// an op of another grid also reads.
std::string not_run_reason(const Graph& graph, const std::vector<std::vector<Strategy>>& strategies,
                           const std::vector<int>& choice, int devices) {
  std::set<int> grids;
  for (const TracedOp& op : graph.ops) {
    const Strategy& s = strategies[op.id][choice[op.id]];
    if (!s.fully_replicated()) grids.insert(s.tp);
  }
  const auto part_of_the_devices = [devices](int tp) { return tp > 1 && tp < devices; };
  if (grids.size() < 2 || std::none_of(grids.begin(), grids.end(), part_of_the_devices)) return "";
  for (const SharedParameter& shared : shared_parameters(graph)) {
    const Strategy& owner = strategies[shared.owner][choice[shared.owner]];
    const Strategy& user = strategies[shared.user][choice[shared.user]];
    const bool cut = std::any_of(owner.parameters.begin(), owner.parameters.end(),
                                 [&](const ParameterSplit& split) {
                                   return split.tensor == shared.tensor && split.dim >= 0;
                                 });
    const int owner_grid = owner.tp, user_grid = user.fully_replicated() ? 0 : user.tp;
    if (cut && owner_grid != user_grid &&
        (part_of_the_devices(owner_grid) || part_of_the_devices(user_grid)))
      return "parallel::ParallelModule does not run yet a parameter cut over part of the devices "
             "that an op of another grid also reads (" +
             graph.tensors[shared.tensor].parameter + ")";
  }
  return "";
}

// The most gradient bytes alive at once in backward: an op's own (its first output's and its
// inputs'), and where a gradient moves back to its producer's layout, that op's with the moved
// part beside them.
double backward_working_bytes(const Graph& graph,
                              const std::vector<std::vector<Strategy>>& strategies,
                              const std::vector<int>& choice) {
  double most = 0;
  for (const TracedOp& op : graph.ops) {
    const Strategy& s = strategies[op.id][choice[op.id]];
    double moved = 0;
    for (size_t slot = 0; slot < op.inputs.size(); ++slot) {
      const int id = op.inputs[slot];
      if (id < 0 || graph.tensors[id].producer < 0 || !graph.tensors[id].requires_grad ||
          !op.differentiable)
        continue;
      const TracedTensor& tensor = graph.tensors[id];
      const Strategy& from = strategies[tensor.producer][choice[tensor.producer]];
      const InputRead read = input_read(graph, op, slot, from.output_layouts[tensor.producer_slot]);
      moved = std::max(
          moved, redistribution_gradient_bytes(read.found, s.input_layouts[slot], read.bytes));
    }
    most = std::max(most, s.backward_working_bytes + moved);
  }
  return most;
}

// Where a plan's memory and time go; every collective's wait for the ranks is priced after the
// work since the previous collective (sequenced_waits) instead of after its own op's.
PlanBreakdown plan_breakdown(const Graph& graph,
                             const std::vector<std::vector<Strategy>>& strategies,
                             const PlannerConfig& config, const std::vector<int>& choice,
                             double remat_fraction) {
  PlanBreakdown b;
  const double k = config.profile.remat_overhead_k;
  for (const TracedOp& op : graph.ops) {
    const Strategy& s = strategies[op.id].at(choice.at(op.id));
    b.parameter_bytes += s.parameter_bytes;
    b.activation_bytes += s.activation_bytes;
    b.compute_s += s.forward_compute + s.backward_compute + s.optimizer_compute;
    b.comm_s += s.forward_comm - s.forward_wait + s.backward_comm - s.backward_wait;
    b.gradient_sync_s += s.gradient_sync;
    b.recompute_s += (1 - remat_fraction) * k * s.forward_time();
    for (size_t slot = 0; slot < op.inputs.size(); ++slot) {
      const int id = op.inputs[slot];
      if (id < 0 || graph.tensors[id].producer < 0) continue;
      const TracedTensor& tensor = graph.tensors[id];
      const InputRead read = input_read(graph, op, slot,
                                        strategies[tensor.producer][choice[tensor.producer]]
                                            .output_layouts[tensor.producer_slot]);
      const Layout& need = s.input_layouts[slot];
      for (const ViewGather& gather : read.gathers)
        b.redistribution_s += move_collectives_time(gather.from, gather.to, gather.bytes,
                                                    config.profile, config.devices);
      b.redistribution_s +=
          move_collectives_time(read.found, need, read.bytes, config.profile, config.devices);
      if (read.gradient)
        b.redistribution_s +=
            move_collectives_time(need, read.found, read.bytes, config.profile, config.devices);
    }
  }
  const SequencedWaits waits = sequenced_waits(graph, strategies, choice, config);
  b.sync_wait_s = waits.forward + waits.backward;
  for (const SharedParameter& shared : shared_parameters(graph)) {
    const Strategy& owner = strategies[shared.owner][choice[shared.owner]];
    const Strategy& user = strategies[shared.user][choice[shared.user]];
    b.gradient_sync_s += shared_parameter_time(graph, shared, owner, user, config);
    b.parameter_bytes += shared_parameter_bytes(graph, shared, owner, user);
  }
  b.backward_working_bytes = backward_working_bytes(graph, strategies, choice);
  return b;
}

double plan_time(const PlanBreakdown& b) {
  return b.compute_s + b.comm_s + b.gradient_sync_s + b.redistribution_s + b.sync_wait_s +
         b.recompute_s;
}

}  // namespace

PlannedPoint describe_choice(const Graph& graph,
                             const std::vector<std::vector<Strategy>>& strategies,
                             const PlannerConfig& config, const std::vector<int>& choice,
                             double remat_fraction) {
  PlannedPoint point;
  point.remat_fraction = remat_fraction;
  point.choice = choice;
  point.breakdown = plan_breakdown(graph, strategies, config, choice, remat_fraction);
  const PlanBreakdown& b = point.breakdown;
  std::map<std::pair<int, int>, double> work_at;  // (dp, tp) -> forward FLOPs
  int replicated = 0;
  // How each way of cutting ops (OpDef::planner) was used: split -> kind -> count.
  std::map<ParallelSplit, std::map<SplitKind, int>> kinds;
  for (const TracedOp& op : graph.ops) {
    const Strategy& s = strategies[op.id].at(choice.at(op.id));
    if (s.fully_replicated()) {
      if (strategies[op.id].size() > 1) ++replicated;
    } else {
      work_at[{s.dp, s.tp}] += std::max(op.flops, 1.0);
    }
    ++kinds[op.def->planner.split][s.kind];
  }
  point.not_executable_reason = not_run_reason(graph, strategies, choice, config.devices);
  point.executable = point.not_executable_reason.empty();
  point.cost.memory =
      b.parameter_bytes + remat_fraction * b.activation_bytes + b.backward_working_bytes;
  point.cost.time = plan_time(b);

  std::vector<std::string> parts;
  if (work_at.empty()) {
    parts.push_back("replicated on every device");
  } else {
    auto dominant =
        std::max_element(work_at.begin(), work_at.end(),
                         [](const auto& a, const auto& c) { return a.second < c.second; });
    point.dp = dominant->first.first;
    point.tp = dominant->first.second;
    std::string degrees;
    if (point.dp > 1) degrees = "dp=" + std::to_string(point.dp);
    if (point.tp > 1)
      degrees += (degrees.empty() ? "" : " ") + std::string("tp=") + std::to_string(point.tp);
    parts.push_back(degrees.empty() ? "dp=1" : degrees);
    int elsewhere = 0;
    for (const TracedOp& op : graph.ops) {
      const Strategy& s = strategies[op.id][choice[op.id]];
      if (!s.fully_replicated() && (s.dp != point.dp || s.tp != point.tp)) ++elsewhere;
    }
    auto count = [&](ParallelSplit split, SplitKind kind) {
      auto found = kinds.find(split);
      if (found == kinds.end()) return 0;
      auto entry = found->second.find(kind);
      return entry == found->second.end() ? 0 : entry->second;
    };
    const int column = count(ParallelSplit::kLinearWeight, SplitKind::kColumn),
              row = count(ParallelSplit::kLinearWeight, SplitKind::kRow);
    if (column && row)
      parts.push_back("column/row-parallel linears");
    else if (column)
      parts.push_back("column-parallel linears");
    else if (row)
      parts.push_back("row-parallel linears");
    if (count(ParallelSplit::kBatchedHeads, SplitKind::kHeads))
      parts.push_back("heads split in attention");
    if (count(ParallelSplit::kEmbeddingTable, SplitKind::kVocab))
      parts.push_back("vocab-parallel embedding");
    if (count(ParallelSplit::kEmbeddingTable, SplitKind::kColumn))
      parts.push_back("hidden-split embedding");
    const auto is_class_loss = [](ParallelSplit split) {
      return split == ParallelSplit::kSoftmaxLossClasses || split == ParallelSplit::kLossClasses;
    };
    if (count(ParallelSplit::kSoftmaxLossClasses, SplitKind::kVocab) ||
        count(ParallelSplit::kLossClasses, SplitKind::kVocab)) {
      int64_t classes = 0;
      for (const TracedOp& op : graph.ops)
        if (is_class_loss(op.def->planner.split))
          classes = std::max(classes, op.input_shapes[0].back());
      parts.push_back(classes >= 8192 ? "vocab-parallel loss" : "class-split loss");
    }
    const int convs = count(ParallelSplit::kConvChannels, SplitKind::kColumn) +
                      count(ParallelSplit::kConvChannels, SplitKind::kRow) +
                      count(ParallelSplit::kConvChannels, SplitKind::kFeature);
    if (convs) parts.push_back(std::to_string(convs) + " channel-split convs");
    if (elsewhere) parts.push_back(std::to_string(elsewhere) + " ops at other degrees");
  }
  // Ops that could be split but run whole on every device of their group.
  if (replicated)
    parts.push_back(std::to_string(replicated) + " splittable ops kept whole on every device");
  point.zero_stage = config.zero_stage;
  if (config.zero_stage > 0 && point.dp > 1) {
    parts.push_back(config.zero_stage == 1   ? "ZeRO-1 (optimizer state in dp parts)"
                    : config.zero_stage == 2 ? "ZeRO-2 (optimizer state and gradients in dp parts)"
                                             : "ZeRO-3 (optimizer state, gradients and parameters "
                                               "in dp parts, parameters gathered on use)");
  }
  if (remat_fraction < 1) {
    std::ostringstream text;
    text << "memory budget " << format_bytes(point.cost.memory) << " under auto (keeps "
         << static_cast<int>(remat_fraction * 100 + 0.5) << "% of activations)";
    parts.push_back(text.str());
  }
  for (size_t i = 0; i < parts.size(); ++i) point.summary += (i ? ", " : "") + parts[i];
  return point;
}

PlanResult plan_graph(const Graph& graph, const PlanOptions& options) {
  TESSEL_CHECK(options.config.devices >= 1, "devices must be at least 1, got ",
               options.config.devices);
  TESSEL_CHECK(!options.remat_fractions.empty(), "at least one remat fraction is needed (1: none)");
  TESSEL_CHECK(!options.zero_stages.empty(), "at least one ZeRO stage is needed (0: none)");
  for (int stage : options.zero_stages)
    TESSEL_CHECK(stage >= 0 && stage <= 3, "ZeRO stages are 0, 1, 2 and 3, got ", stage);
  for (double f : options.remat_fractions)
    TESSEL_CHECK(f > 0 && f <= 1, "remat fractions must be in (0, 1], got ", f);
  const auto start = std::chrono::steady_clock::now();
  PlanResult result;
  result.memory_per_device = options.memory_per_device > 0
                                 ? options.memory_per_device
                                 : options.config.profile.memory_per_device;
  // The strategies are the same at every ZeRO stage (the same list in the same order), only
  // their parameters' memory and communication differ.
  std::map<int, std::vector<std::vector<Strategy>>> strategies_at;
  for (int stage : options.zero_stages) {
    PlannerConfig config = options.config;
    config.zero_stage = stage;
    strategies_at[stage] = enumerate_strategies(graph, config);
  }
  result.strategies = strategies_at.at(options.zero_stages.front());

  struct Candidate {
    Cost cost;
    double fraction;
    int zero_stage;
    std::vector<int> choice;
    bool executable = true;
  };
  std::vector<Candidate> candidates;
  // The strategy lists searched together: all of them, or one dp x tp grid at a time (each keeps
  // the strategies of its tp, and running an op whole on every device).
  std::vector<std::vector<std::vector<int>>> searches;
  auto all = [&](auto keep) {
    std::vector<std::vector<int>> subset(result.strategies.size());
    for (size_t op = 0; op < result.strategies.size(); ++op)
      for (size_t s = 0; s < result.strategies[op].size(); ++s)
        if (keep(result.strategies[op][s])) subset[op].push_back(static_cast<int>(s));
    return subset;
  };
  if (options.per_op_degrees) {
    searches.push_back(all([](const Strategy&) { return true; }));
  } else {
    for (int tp : tensor_parallel_degrees(options.config))
      searches.push_back(
          all([tp](const Strategy& s) { return s.fully_replicated() || s.tp == tp; }));
  }
  // The config a fraction and stage are priced with: the fraction's measured recompute factor,
  // where there is one.
  auto config_for = [&options](double fraction, int zero_stage) {
    PlannerConfig config = options.config;
    config.zero_stage = zero_stage;
    auto measured = options.remat_overhead_k.find(fraction);
    if (measured != options.remat_overhead_k.end())
      config.profile.remat_overhead_k = measured->second;
    return config;
  };
  for (int stage : options.zero_stages)
    for (const auto& subset : searches) {
      std::vector<std::vector<Strategy>> lists(subset.size());
      for (size_t op = 0; op < subset.size(); ++op)
        for (int s : subset[op]) lists[op].push_back(strategies_at[stage][op][s]);
      for (double fraction : options.remat_fractions) {
        CostGraph costs = build_cost_graph(graph, lists, config_for(fraction, stage), fraction);
        FrontierStats stats;
        for (auto& point : track_frontier(costs, options.frontier, &stats)) {
          for (size_t op = 0; op < subset.size(); ++op)
            point.choice[op] = subset[op][point.choice[op]];
          const bool runs =
              not_run_reason(graph, strategies_at[stage], point.choice, options.config.devices)
                  .empty();
          // The frontier adds up what each op keeps; the peak also holds the most gradients
          // alive at once in backward. Its time prices each collective's wait after the op's
          // own work; the plan's is priced after the work since the previous collective.
          const PlanBreakdown priced = plan_breakdown(
              graph, strategies_at[stage], config_for(fraction, stage), point.choice, fraction);
          point.cost.memory += priced.backward_working_bytes;
          point.cost.time = plan_time(priced);
          candidates.push_back({point.cost, fraction, stage, std::move(point.choice), runs});
        }
        result.stats.leaf_eliminations += stats.leaf_eliminations;
        result.stats.series_eliminations += stats.series_eliminations;
        result.stats.parallel_merges += stats.parallel_merges;
        result.stats.conditioned_nodes += stats.conditioned_nodes;
        result.stats.thinned += stats.thinned;
        result.stats.largest_frontier =
            std::max(result.stats.largest_frontier, stats.largest_frontier);
      }
    }
  // One frontier over all fractions; of equal points the one recomputing least is kept.
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const Candidate& a, const Candidate& b) {
                     if (a.cost.memory != b.cost.memory) return a.cost.memory < b.cost.memory;
                     if (a.cost.time != b.cost.time) return a.cost.time < b.cost.time;
                     if (a.fraction != b.fraction) return a.fraction > b.fraction;
                     return a.zero_stage < b.zero_stage;
                   });
  // The frontier of every candidate; with executable_only, also that of the executable ones (a
  // point dominated only by plans the runtime would not run as priced is kept).
  double best_time = 0, best_executable_time = 0;
  bool any = false, any_executable = false;
  for (const Candidate& candidate : candidates) {
    const bool on_frontier = !any || candidate.cost.time < best_time;
    const bool on_executable_frontier =
        options.executable_only && candidate.executable &&
        (!any_executable || candidate.cost.time < best_executable_time);
    if (on_frontier) {
      best_time = candidate.cost.time;
      any = true;
    }
    if (on_executable_frontier) {
      best_executable_time = candidate.cost.time;
      any_executable = true;
    }
    if (!on_frontier && !on_executable_frontier) continue;
    PlannedPoint point = describe_choice(graph, strategies_at.at(candidate.zero_stage),
                                         config_for(candidate.fraction, candidate.zero_stage),
                                         candidate.choice, candidate.fraction);
    point.cost = candidate.cost;
    result.frontier.push_back(std::move(point));
  }
  for (size_t i = 0; i < result.frontier.size(); ++i) {
    const PlannedPoint& point = result.frontier[i];
    if (point.cost.memory > result.memory_per_device) continue;
    if (options.executable_only && !point.executable) continue;
    if (result.chosen < 0 || point.cost.time < result.frontier[result.chosen].cost.time)
      result.chosen = static_cast<int>(i);
  }
  result.search_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace tessel::planner
