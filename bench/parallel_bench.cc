// Training steps of the model zoo over MPI ranks (mpirun -np N): data parallel (DDP) or tensor
// parallel (the recipes' schemes) on a fixed random batch, with the bytes each collective carries
// counted. Rank 0 prints one JSON line: the median step time (slowest rank), the per-rank peak
// memory (largest over ranks), bytes per step by group, and a plan's predictions with --plan.
//   mpirun -np 2 bazel-bin/bench/parallel_bench --model=resnet50 --batch_per_rank=4
//   --image_size=128 mpirun -np 2 bazel-bin/bench/parallel_bench --model=bert_mini --plan=plan.json
//   --batch=16
// With --planned --breakdown=PROFILE (the profile the plan was made with) rank 0 also prints where
// its step goes against the planner's prices for the same ops: forward, backward and optimizer
// apart, and per forward op name (its time against the priced compute and collectives of its
// strategy), with the planned moves between ops beside them.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/random_batch.h"
#include "core/allocator.h"
#include "core/autograd.h"
#include "core/rng.h"
#include "core/threading.h"
#include "models/bert.h"
#include "models/resnet.h"
#include "models/shufflenet.h"
#include "models/trace.h"
#include "models/vision_parallel.h"
#include "ops/ops.h"
#include "optim/adam.h"
#include "optim/sgd.h"
#include "parallel/counting_communicator.h"
#include "parallel/ddp.h"
#include "parallel/launch.h"
#include "parallel/parallelize.h"
#include "parallel/planner/plan_io.h"
#include "parallel/process_group.h"
#include "parallel/tensor_parallel.h"
#include "parallel/zero.h"
#include "tools/plan/plan_cli.h"

namespace tessel::bench {
namespace {

using Clock = std::chrono::steady_clock;
using parallel::CountingCommunicator;

std::vector<std::vector<double>> per_rank(const std::vector<double>& flat, int steps) {
  std::vector<std::vector<double>> ranks;
  for (size_t begin = 0; begin < flat.size(); begin += static_cast<size_t>(steps))
    ranks.emplace_back(flat.begin() + static_cast<long>(begin),
                       flat.begin() + static_cast<long>(begin) + steps);
  return ranks;
}

double max_over_world(double value) {
  double result = value;
  MPI_Allreduce(&value, &result, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return result;
}

struct Totals {
  int calls = 0;
  double seconds = 0;
};

// The planner's prices of a plan file's strategies under `profile_name`'s profile: per pass, per
// op name (forward, without the waits for the ranks, which are priced over the whole sequence).
struct PlanPrices {
  planner::PlannerConfig config;
  std::map<std::string, Totals> forward_ops;
  double forward = 0, backward = 0, optimizer = 0, sync = 0, moves = 0;
  double forward_comm = 0, backward_comm = 0;  // the splits' collectives, in forward and backward
  planner::SequencedWaits waits;
  double step() const {
    return forward + backward + optimizer + sync + moves + waits.forward + waits.backward;
  }
};

PlanPrices price_plan(const planner::ModelSpec& spec, const planner::PlanFile& plan,
                      const std::string& profile_name, int world) {
  const planner::Graph graph = models::trace_model(spec);
  PlanPrices prices;
  planner::PlannerConfig& config = prices.config;
  config.devices = world;
  config.max_tp = world;
  config.optimizer_states = planner::is_bert(spec.name) ? 2 : 1;  // AdamW, SGD with momentum
  config.profile = planner::load_profile(planner::find_profile(profile_name));
  const auto strategies = planner::enumerate_strategies(graph, config);
  TESSEL_CHECK(plan.ops.size() == graph.ops.size(), "pricing the plan: it has ", plan.ops.size(),
               " ops, the model's trace ", graph.ops.size());
  std::vector<const planner::Strategy*> chosen;
  std::vector<int> choice;
  for (const auto& op : plan.ops) {
    const auto& list = strategies.at(static_cast<size_t>(op.index));
    auto found = std::find_if(list.begin(), list.end(), [&](const planner::Strategy& s) {
      return s.dp == op.dp && s.tp == op.tp && planner::split_kind_name(s.kind) == op.strategy;
    });
    TESSEL_CHECK(found != list.end(), "pricing the plan: no strategy ", op.strategy, " at dp ",
                 op.dp, " x tp ", op.tp, " for op ", op.index);
    chosen.push_back(&*found);
    choice.push_back(static_cast<int>(found - list.begin()));
  }
  for (const planner::TracedOp& op : graph.ops) {
    const planner::Strategy& s = *chosen[static_cast<size_t>(op.id)];
    prices.forward_ops[op.name].calls++;
    prices.forward_ops[op.name].seconds += s.forward_time() - s.forward_wait;
    prices.forward += s.forward_time() - s.forward_wait;
    prices.backward += s.backward_compute + s.backward_comm - s.backward_wait;
    prices.forward_comm += s.forward_comm - s.forward_wait;
    prices.backward_comm += s.backward_comm - s.backward_wait;
    prices.optimizer += s.optimizer_compute;
    prices.sync += s.gradient_sync;
  }
  // The moves between ops' layouts, as the plan's breakdown prices them.
  prices.moves =
      planner::describe_choice(graph, strategies, config, choice, 1.0).breakdown.redistribution_s;
  prices.waits = planner::sequenced_waits(graph, strategies, choice, config);
  return prices;
}

// Rank 0's time per op name over `steps` steps, forward, backward and optimizer apart (the time
// from one op's end to the next's, so collectives inside an op count as that op's), beside the
// planner's prices of the plan's strategies for the same ops.
void print_breakdown(const planner::ModelSpec& spec, const planner::PlanFile& plan,
                     const std::string& profile_name, int world, int steps,
                     const std::function<void(int*)>& step) {
  const PlanPrices prices = price_plan(spec, plan, profile_name, world);
  const std::map<std::string, Totals>& priced = prices.forward_ops;

  std::map<std::string, Totals> measured[3];      // forward, backward, optimizer
  std::map<std::string, Totals> measured_shapes;  // forward calls of ops priced by their shapes
  int phase = 0;
  auto last = Clock::now();
  TraceHook previous = set_trace_hook([&](const OpDef& op, const std::vector<Tensor>& inputs,
                                          const std::vector<Tensor>&, const Attrs& attrs) {
    const auto now = Clock::now();
    if (phase >= 0) {
      const double seconds = std::chrono::duration<double>(now - last).count();
      Totals& totals = measured[phase][op.name];
      totals.calls++;
      totals.seconds += seconds;
      if (phase == 0 && (op.name == "conv2d" || op.name == "linear")) {
        std::vector<std::optional<Shape>> shapes;
        std::vector<bool> needs_gradient;
        for (const Tensor& input : inputs) {
          shapes.push_back(input.defined() ? std::optional<Shape>(input.sizes()) : std::nullopt);
          needs_gradient.push_back(input.defined() && input.requires_grad());
        }
        Totals& call =
            measured_shapes[planner::op_shape_key(op.name, shapes, needs_gradient, attrs)];
        call.calls++;
        call.seconds += seconds;
      }
    }
    last = now;
  });
  double phase_seconds[3] = {0, 0, 0};
  for (int i = 0; i < steps; ++i) {
    MPI_Barrier(MPI_COMM_WORLD);
    phase = 0;
    last = Clock::now();
    const auto begin = last;
    step(&phase);
    const auto end = Clock::now();
    phase_seconds[2] += std::chrono::duration<double>(end - begin).count();
  }
  set_trace_hook(previous);
  phase = -1;
  if (!parallel::is_main_rank()) return;
  double collectives[2] = {0, 0};  // the runtime's tp_* ops: the splits' collectives and waits
  for (int p = 0; p < 2; ++p)
    for (const auto& [name, totals] : measured[p]) {
      phase_seconds[p] += totals.seconds;
      if (name.rfind("tp_", 0) == 0) collectives[p] += totals.seconds;
    }
  phase_seconds[2] -= phase_seconds[0] + phase_seconds[1];  // the rest: the optimizer and between
  std::printf("rank 0's step against the prices of %s (seconds per step)\n",
              prices.config.profile.name.c_str());
  std::printf("%-22s %10s %10s\n", "", "measured", "priced");
  std::printf("%-22s %10.4f %10.4f\n", "forward ops", phase_seconds[0] / steps, prices.forward);
  std::printf("%-22s %10.4f %10.4f\n", "backward ops", phase_seconds[1] / steps, prices.backward);
  std::printf("%-22s %10.4f %10.4f\n", "optimizer, sync, rest", phase_seconds[2] / steps,
              prices.optimizer + prices.sync);
  std::printf("%-22s %10.4f %10.4f forward, %.4f %.4f backward\n", "splits' collectives",
              collectives[0] / steps, prices.forward_comm, collectives[1] / steps,
              prices.backward_comm);
  std::printf("%-22s %10s %10.4f\n", "moves between ops", "(in ops)", prices.moves);
  std::printf("%-22s %10s %10.4f forward, %.4f backward\n", "waits for the ranks", "(in ops)",
              prices.waits.forward, prices.waits.backward);
  std::printf("%-22s %10.4f %10.4f (the plan's %.4f)\n", "step",
              (phase_seconds[0] + phase_seconds[1] + phase_seconds[2]) / steps, prices.step(),
              plan.predicted_time);
  std::printf("\n%-24s %6s %10s %10s\n", "forward op", "calls", "measured", "priced");
  for (const auto& [name, totals] : priced)
    std::printf("%-24s %6d %10.4f %10.4f\n", name.c_str(), totals.calls,
                measured[0][name].seconds / steps, totals.seconds);
  for (const auto& [name, totals] : measured[0])  // the plan's collectives and moves
    if (!priced.count(name))
      std::printf("%-24s %6d %10.4f %10s\n", name.c_str(), totals.calls / steps,
                  totals.seconds / steps, "-");
  // The calls priced by their own measured shapes (calibrate --shapes_of), one by one.
  bool header = false;
  for (const auto& [key, totals] : measured_shapes) {
    const auto found = prices.config.profile.op_shapes.find(key);
    if (found == prices.config.profile.op_shapes.end()) continue;
    if (!header)
      std::printf("\n%-10s %10s %10s  %s\n", "calls/step", "measured", "priced", "forward call");
    header = true;
    std::printf("%-10d %10.5f %10.5f  %s\n", totals.calls / steps, totals.seconds / totals.calls,
                found->second.forward_s, key.c_str());
  }
  for (int p = 1; p < 3; ++p) {
    std::printf("\n%-24s %6s %10s\n", p == 1 ? "backward op" : "op after backward", "calls",
                "measured");
    for (const auto& [name, totals] : measured[p])
      std::printf("%-24s %6d %10.4f\n", name.c_str(), totals.calls / steps, totals.seconds / steps);
  }
  std::printf("priced: optimizer %.4f, gradient synchronization %.4f\n", prices.optimizer,
              prices.sync);
}

int run(int argc, char** argv) {
  CLI::App app("Distributed training steps of a model-zoo network", "parallel_bench");
  std::string model_name = "resnet50", plan_path, label;
  int64_t batch = 0, batch_per_rank = 4, image_size = 128, seq = 128, classes = 1000;
  int dp = 0, tp = 1, zero = 0, steps = 3, warmup = 1, threads = 0;
  bool planned = false;
  app.add_option("--model", model_name, "resnet18..152, shufflenet_v2_x*, bert_tiny..large");
  app.add_option("--batch", batch, "global batch (0: batch_per_rank x dp)");
  app.add_option("--batch_per_rank", batch_per_rank, "per data-parallel rank when --batch is 0");
  app.add_option("--image_size", image_size);
  app.add_option("--num_classes", classes);
  app.add_option("--seq", seq, "BERT sequence length");
  app.add_option("--dp", dp, "0: ranks / tp");
  app.add_option("--tp", tp);
  app.add_option("--plan", plan_path, "take dp and tp from a plan; report its predictions");
  app.add_flag(
      "--planned", planned,
      "run the --plan file's ops as priced (parallel::ParallelModule; ResNet, ShuffleNet, BERT)");
  app.add_option("--zero", zero, "ZeRO stage over the dp group (parallel/zero.h): 0, 1, 2 or 3");
  app.add_option("--steps", steps, "timed steps");
  app.add_option("--warmup", warmup, "untimed steps first");
  app.add_option("--threads", threads, "(read by run_ranks)");
  app.add_option("--label", label, "copied into the JSON line");
  std::string breakdown_profile, price_with;
  app.add_option("--price_with", price_with,
                 "with --planned: also price the plan's ops under this profile (repriced_step_s "
                 "in the JSON line; a profile measured just before this run)");
  app.add_option("--breakdown", breakdown_profile,
                 "with --planned: also print rank 0's step op by op against the prices of this "
                 "profile (the plan's)");
  CLI11_PARSE(app, argc, argv);

  const int world = parallel::world_size();
  std::optional<planner::PlanFile> plan;
  // A plan whose ops run on a grid of fewer ranks than it was made for (every op whole on every
  // rank) runs as plans with per-op degrees do: over one line of every rank.
  bool under_world = false;
  if (!plan_path.empty()) {
    plan = planner::read_plan(plan_path);
    dp = plan->mesh_dp;
    tp = plan->mesh_tp;
    under_world = planned && dp * tp < world;
    if (under_world) {
      dp = world;
      tp = 1;
    }
  }
  if (dp == 0) dp = world / tp;
  TESSEL_CHECK(dp * tp == world, "dp ", dp, " x tp ", tp, " != ", world, " ranks");
  if (batch == 0) batch = batch_per_rank * dp;
  parallel::ProcessGrid grid(dp, tp);
  auto dp_comm = std::make_shared<CountingCommunicator>(grid.data_parallel());
  auto tp_comm = std::make_shared<CountingCommunicator>(grid.tensor_parallel());
  const int64_t group = tp > 1 ? parallel::register_tp_group(tp_comm) : -1;
  // A plan with per-op degrees (ops at other degrees than its mesh's) runs over one group of every
  // rank for both dp and tp: the data then arrive as this rank's rows of the world.
  bool per_op = under_world;
  if (planned && plan)
    for (const auto& op : plan->ops)
      per_op = per_op || (op.dp != 1 && op.dp != dp) || (op.tp != 1 && op.tp != tp);
  const int data_parts = per_op ? world : dp;
  const int data_index = per_op ? parallel::world_rank() : grid.dp_index();
  const int64_t rows = parallel::part_rows(batch, data_parts, data_index);
  const bool bert = model_name.rfind("bert_", 0) == 0;

  manual_seed(0);
  std::shared_ptr<nn::Module> trained;
  std::shared_ptr<models::BertForPreTraining> bert_model;  // the whole model, or this rank's shard
  std::shared_ptr<models::TensorParallelClassifier> tp_vision;
  std::shared_ptr<parallel::ParallelModule> planned_model;  // --planned
  models::BertConfig bert_config;
  // Every rank, for a plan with per-op degrees (its mesh may be a dp x tp grid).
  auto line =
      dp == 1 ? tp_comm
      : tp == 1
          ? dp_comm
          : std::make_shared<CountingCommunicator>(parallel::ProcessGrid(world, 1).data_parallel());
  auto run_as_planned = [&](std::shared_ptr<nn::Module> full,
                            const planner::ModuleTraceOptions& trace) {
    planned_model = std::make_shared<parallel::ParallelModule>(
        full, plan->ops, per_op ? line : dp_comm, per_op ? line : tp_comm, trace);
    planned_model->set_per_rank_batch_norm(plan->batch_norm == "per_rank");
    trained = full;  // now meta: its shards live in planned_model
  };
  if (bert) {
    // As planned, dropout stays: the plan's trace has its ops.
    bert_config = models::BertConfig::by_name(model_name.substr(5));
    if (!planned) bert_config.dropout(0.0);
    bert_model = std::make_shared<models::BertForPreTraining>(bert_config);
    if (planned) {
      TESSEL_CHECK(plan && plan->batch == batch && plan->seq == seq,
                   "--planned needs --plan with this --batch and --seq (the plan's: ",
                   plan ? plan->batch : 0, ", ", plan ? plan->seq : 0, ")");
      run_as_planned(bert_model, models::bert_pretraining_step(batch, seq));
    } else {
      // The shard replaces the whole model: only the shards stay in memory.
      if (tp > 1) bert_model = models::shard_bert(*bert_model, group);
      trained = bert_model;
    }
  } else {
    std::shared_ptr<nn::Module> full =
        model_name.rfind("resnet", 0) == 0
            ? std::shared_ptr<nn::Module>(
                  models::make_resnet(model_name, models::ResNetOptions().num_classes(classes)))
            : std::shared_ptr<nn::Module>(models::make_shufflenet(
                  model_name, models::ShuffleNetV2Options().num_classes(classes)));
    if (planned) {
      TESSEL_CHECK(plan && plan->batch == batch && plan->image_size == image_size,
                   "--planned needs --plan with this --batch and --image_size (the plan's: ",
                   plan ? plan->batch : 0, ", ", plan ? plan->image_size : 0, ")");
      run_as_planned(full, planner::ModuleTraceOptions({batch, 3, image_size, image_size}));
    } else if (tp > 1) {
      // As the recipes: ShuffleNet's conv5 split by channels, ResNet's classifier by classes.
      const bool shufflenet = model_name.rfind("shufflenet", 0) == 0;
      tp_vision = std::make_shared<models::TensorParallelClassifier>(full, group, shufflenet);
      trained = tp_vision;
    } else {
      trained = full;
    }
  }
  trained->train();
  TESSEL_CHECK(zero >= 0 && zero <= 3 && (zero == 0 || (dp > 1 && tp == 1)),
               "--zero must be 0, 1, 2 or 3, and above 0 only with dp > 1 and tp = 1");
  auto make_optimizer = [bert](const optim::NamedTensors& parameters) {
    return bert ? std::unique_ptr<optim::Optimizer>(
                      std::make_unique<optim::AdamW>(parameters, optim::AdamWOptions(1e-4)))
                : std::make_unique<optim::SGD>(parameters, optim::SGDOptions(0.01).momentum(0.9));
  };
  std::unique_ptr<optim::Optimizer> optimizer =
      planned_model ? make_optimizer(planned_model->named_parameters())
      : zero == 0   ? make_optimizer(trained->named_parameters())
                    : std::make_unique<parallel::ZeroOptimizer>(
                        trained, dp_comm, make_optimizer, static_cast<parallel::ZeroStage>(zero));
  std::unique_ptr<parallel::DistributedDataParallel> ddp;
  if (dp > 1 && zero < 2 && !planned_model)
    ddp = std::make_unique<parallel::DistributedDataParallel>(trained, dp_comm);
  int64_t parameter_bytes = 0;
  for (const Tensor& p : planned_model ? planned_model->parameters() : trained->parameters())
    parameter_bytes += static_cast<int64_t>(p.nbytes());

  // This data-parallel rank's rows of a fixed random batch.
  manual_seed(100 + data_index);
  const RandomBatch data =
      random_batch(bert ? &bert_config : nullptr, rows, seq, image_size, classes);

  // `phase` (when given) is set to 1 when backward starts and 2 when the optimizer does.
  auto step = [&](int* phase = nullptr) {
    if (ddp) ddp->prepare_forward();
    Tensor loss;
    if (bert && planned_model) {
      loss =
          planned_model->loss({data.ids, data.types, data.mask, data.mlm_labels, data.nsp_labels});
    } else if (bert) {
      loss = models::bert_pretraining_loss(bert_model->forward(data.ids, data.types, data.mask),
                                           data.mlm_labels, data.nsp_labels)
                 .total;
    } else if (planned_model) {
      loss = planned_model->loss(data.images, data.labels);
    } else if (tp_vision) {
      loss = tp_vision->loss(tp_vision->forward(data.images), data.labels);
    } else {
      loss = cross_entropy(trained->forward(data.images), data.labels);
    }
    optimizer->zero_grad();
    if (phase) *phase = 1;
    loss.backward();
    if (phase) *phase = 2;
    if (ddp) ddp->finalize();
    if (tp_vision) tp_vision->reduce_trunk_gradients();
    if (planned_model) planned_model->synchronize_gradients();
    optimizer->step();
  };

  auto allocator = memory::allocator_for(Device::cpu());
  for (int i = 0; i < warmup; ++i) step();
  dp_comm->reset();
  line->reset();
  tp_comm->reset();
  allocator->reset_peak();
  const int unplanned_before = planned_model ? planned_model->unplanned_moves() : 0;
  std::vector<double> times, own_times;
  for (int i = 0; i < steps; ++i) {
    MPI_Barrier(MPI_COMM_WORLD);
    const auto start = Clock::now();
    step();
    own_times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    times.push_back(max_over_world(own_times.back()));
  }
  // Every rank's own step times, to tell a slow rank from a slow step.
  std::vector<double> rank_times(static_cast<size_t>(steps) * static_cast<size_t>(world));
  MPI_Gather(own_times.data(), steps, MPI_DOUBLE, rank_times.data(), steps, MPI_DOUBLE, 0,
             MPI_COMM_WORLD);
  planner::ModelSpec spec;  // as the planner traces the model
  spec.name = model_name;
  spec.batch = batch;
  spec.seq = seq;
  spec.image_size = image_size;
  spec.num_classes = classes;
  const std::vector<double> in_order = times;
  std::sort(times.begin(), times.end());
  const double median = times[times.size() / 2];
  const double peak = max_over_world(static_cast<double>(allocator->stats().peak_allocated_bytes));
  const double dp_bytes = max_over_world(static_cast<double>(dp_comm->all_reduce_bytes) / steps);
  const double dp_other = max_over_world(static_cast<double>(dp_comm->other_bytes) / steps);
  const double line_bytes = line == tp_comm || line == dp_comm
                                ? 0.0
                                : static_cast<double>(line->all_reduce_bytes + line->other_bytes);
  const double tp_bytes = max_over_world(
      (static_cast<double>(tp_comm->all_reduce_bytes + tp_comm->other_bytes) + line_bytes) / steps);
  // Gathers the runtime made beyond the plan (views that cut across a split), per step.
  const double unplanned_moves =
      planned_model
          ? static_cast<double>(planned_model->unplanned_moves() - unplanned_before) / steps
          : 0.0;
  if (parallel::is_main_rank()) {
    nlohmann::ordered_json out = {{"model", model_name},
                                  {"ranks", world},
                                  {"dp", dp},
                                  {"tp", tp},
                                  {"zero", zero},
                                  {"threads_per_rank", get_num_threads()},
                                  {"global_batch", batch},
                                  {"image_size", bert ? 0 : image_size},
                                  {"seq", bert ? seq : 0},
                                  {"step_s", median},
                                  {"step_times_s", in_order},
                                  {"rank_step_times_s", per_rank(rank_times, steps)},
                                  {"samples_per_s", static_cast<double>(batch) / median},
                                  {"peak_bytes", peak},
                                  {"parameter_bytes_per_rank", parameter_bytes},
                                  {"dp_all_reduce_bytes_per_step", dp_bytes},
                                  {"dp_other_bytes_per_step", dp_other},
                                  {"tp_bytes_per_step", tp_bytes}};
    if (!label.empty()) out["label"] = label;
    if (planned_model) out["planned"] = per_op ? "per-op degrees" : "grid";
    if (!price_with.empty()) {
      TESSEL_CHECK(planned_model, "--price_with needs --planned");
      out["repriced_step_s"] = price_plan(spec, *plan, price_with, world).step();
      out["repriced_profile"] = price_with;
    }
    if (plan) {
      out["plan"] = plan_path;
      out["plan_profile"] = plan->profile;
      out["plan_summary"] = plan->summary;
      out["predicted_memory_bytes"] = plan->predicted_memory;
      out["predicted_step_s"] = plan->predicted_time;
      out["unplanned_moves_per_step"] = unplanned_moves;
    }
    std::cout << out.dump() << std::endl;
  }
  if (!breakdown_profile.empty()) {
    TESSEL_CHECK(planned_model, "--breakdown needs --planned");
    print_breakdown(spec, *plan, breakdown_profile, world, steps, step);
  }
  return 0;
}

}  // namespace
}  // namespace tessel::bench

int main(int argc, char** argv) {
  return tessel::parallel::run_ranks(argc, argv, tessel::bench::run);
}
