// Training steps under memory budgets, for bench/memory_bench (results in bench/results/memory.md).
// Budget sweep: one unconstrained run measures the whole peak and the fixed memory (parameters,
// gradients, momentum), then every policy trains at activation budgets
// budget = fixed + f * (peak - fixed). Each point is --pairs (5) pairs of a budgeted and an
// unconstrained run (each a fresh model, --warmup steps, then --steps timed ones), the first of
// a pair alternating; it prints one JSON line: the median over the pairs of the ratio of the
// median steps, the range and every pair's ratio, host link busy and wait times, prefetches.
//   memory_sweep --model=resnet50 --batch=8 --fractions=1,0.5,0.3 --policies=dtr,auto
// BERT's MLM head scores its input in chunks of rows (linear_cross_entropy); --mlm_logits makes the
// whole logits instead, as the checkpoints' models do. --vocab sets BERT's vocabulary (8000).
// --no_prefetch / --no_swap_ahead turn off the residency manager's prefetch in backward and its
// swap-ahead in forward (to measure what they bring).
// --device=cuda (a --config=cuda build) sweeps the GPU's memory instead of the simulated device's;
// swaps then go to pinned host memory over the copy stream.
// Largest batch: the largest batch that trains (two steps) within --budget, per policy.
//   memory_sweep --model=shufflenet --largest_batch --budget=512MiB --policies=none,auto
// With --max_slowdown=X (simulated runs) a batch whose step takes more than X times the
// unconstrained step at that batch does not count as training: the search skips thrashing runs
// instead of simulating them to the end.
// --simulate=PROFILE runs the same on the memory simulator (memory/sim): models on the meta
// device, their memory virtual, step times the simulated device's (from the device profile),
// the same for every run and machine, so each point needs one run and no reference per point.
// --whole_peak_fractions=0.9,0.45 gives budgets as fractions of the whole peak (the DTR paper's
// measure) instead of the activation memory. --simulated_layout=arena lays the budget out as
// one arena, as on the CPU, instead of segments taken on demand as on a GPU.
// --memory_json=PATH: each budgeted point of a sweep writes there (the last one stays) its
// allocator's blocks after the last timed step and the timeline of that step, for
// tools/plot_memory.py:
//   memory_sweep --simulate=parallel/profiles/h200_cluster.json --model=resnet50 --batch=128
//       --policies=auto --fractions=0.2 --memory_json=step.json
//   tools/plot_memory.py step.json
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "core/run_main.h"
#include "core/threading.h"
#include "memory/memory.h"
#include "memory/memory_json.h"
#include "memory/sim/simulator.h"
#include "models/bert.h"
#include "models/cifar_resnet.h"
#include "models/resnet.h"
#include "models/shufflenet.h"
#include "ops/ops.h"
#include "optim/sgd.h"
#include "parallel/planner/cost_model.h"

namespace tessel::bench {
namespace {

using Clock = std::chrono::steady_clock;
using memory::MemoryOptions;
using memory::Policy;

constexpr double kLearningRate = 0.01;
constexpr double kMomentum = 0.9;

struct Settings {
  std::string model = "resnet50";
  Device device = Device::cpu();  // cuda: the budget is the GPU's (needs --config=cuda)
  int64_t batch = 8;
  int64_t image = 224;  // vision models
  int64_t seq = 128;    // BERT
  // BERT's vocabulary: 8000, the WordPiece vocabulary of the bert_mlm_fortunes recipe (--vocab).
  int64_t vocab = 8000;
  // --mlm_logits: BERT's MLM head makes the whole (batch, seq, vocab) logits, as the checkpoints'
  // models do, instead of scoring its input in chunks of rows (linear_cross_entropy). With 30522
  // words at batch 8 those logits and their log-probabilities are one working set of
  // 2 x 119 MiB, most of the activation memory in one op.
  bool mlm_logits = false;
  int warmup = 1;
  int steps = 2;
  // Sweep points on a real device: pairs of an unconstrained and a budgeted run (--pairs).
  int pairs = 5;
  std::vector<double> fractions = {1.0, 0.7, 0.5, 0.4, 0.3, 0.2};
  std::vector<std::string> policies = {"dtr", "swap", "split", "auto"};
  bool largest_batch = false;
  size_t budget = 0;
  int64_t max_batch = 1024;
  double max_slowdown = 0;  // largest batch: 0, or the slowdown beyond which a batch does not count
  double step_deadline = 0;  // simulated: seconds a step may take (0: no limit)
  double host_bandwidth = memory::HostLink::kDefaultBandwidth;
  memory::CostSource cost_source = memory::CostSource::kMeasured;
  bool prefetch = true;
  bool swap_ahead = true;
  bool whole_peak_fractions = false;  // fractions of the whole peak, not of the activations
  bool full_errors = false;           // print every failed point's whole report (--full_errors)
  // --memory_json: where the budgeted points write their allocator's memory JSON (blocks after the
  // last timed step, the timeline of that step only), for tools/plot_memory.py.
  std::string memory_json;
  // Set by --simulate: the device is meta and times are simulated.
  memory::sim::Simulation* simulation = nullptr;
};

// A model, its optimizer and a fixed batch of random data, made inside the current memory scope.
struct Trainer {
  std::shared_ptr<nn::Module> model;
  std::unique_ptr<optim::SGD> optimizer;
  std::function<Tensor()> loss;
  std::vector<Tensor> batch;
};

std::unique_ptr<Trainer> make_trainer(const Settings& settings, int64_t batch) {
  manual_seed(0);
  auto trainer = std::make_unique<Trainer>();
  Trainer* raw = trainer.get();
  if (settings.model.rfind("bert_", 0) == 0) {
    const models::BertConfig config =
        models::BertConfig::by_name(settings.model.substr(5)).vocab_size(settings.vocab);
    auto bert = std::make_shared<models::BertForPreTraining>(config);
    trainer->model = bert;
    const int64_t seq = settings.seq;
    Tensor input_ids = randint(0, config.vocab_size(), {batch, seq});
    Tensor token_types = randint(0, 2, {batch, seq});
    Tensor targets = randint(0, config.vocab_size(), {batch, seq});
    Tensor masked = lt(rand({batch, seq}), full({}, 0.15));
    Tensor mlm_labels = where(masked, targets, full({batch, seq}, -100, DType::kInt64));
    Tensor nsp_labels = randint(0, 2, {batch});
    trainer->batch = {input_ids, token_types, mlm_labels, nsp_labels};
    const models::MlmOutput mlm_output =
        settings.mlm_logits ? models::MlmOutput::kLogits : models::MlmOutput::kHeadInput;
    trainer->loss = [raw, bert, mlm_output]() {
      const auto& b = raw->batch;
      models::BertPreTrainingOutput output = bert->forward(b[0], b[1], Tensor(), mlm_output);
      return models::bert_pretraining_loss(output, b[2], b[3]).total;
    };
  } else {
    const auto& resnets = models::resnet_names();
    const auto& cifar_resnets = models::cifar_resnet_names();
    const auto& shufflenets = models::shufflenet_names();
    int64_t classes = 1000;
    if (std::count(cifar_resnets.begin(), cifar_resnets.end(), settings.model)) {
      classes = 10;
      trainer->model = models::make_cifar_resnet(settings.model);
    } else if (std::count(resnets.begin(), resnets.end(), settings.model)) {
      trainer->model =
          models::make_resnet(settings.model, models::ResNetOptions().num_classes(1000));
    } else if (settings.model == "shufflenet" ||
               std::count(shufflenets.begin(), shufflenets.end(), settings.model)) {
      trainer->model = models::make_shufflenet(
          settings.model == "shufflenet" ? "shufflenet_v2_x1_0" : settings.model,
          models::ShuffleNetV2Options().num_classes(1000));
    } else {
      TESSEL_FAIL("memory_sweep: unknown --model '", settings.model,
                  "' (resnet18..resnet152, cifar_resnet20..cifar_resnet1202, "
                  "shufflenet_v2_x0_5..x2_0, bert_tiny..bert_large)");
    }
    const Shape images{batch, 3, settings.image, settings.image};
    // On meta (simulating) the values do not matter: no CPU bytes for a batch of thousands.
    trainer->batch =
        settings.device.is_meta()
            ? std::vector<Tensor>{empty(images, TensorOptions().device(Device::meta())),
                                  empty({batch},
                                        TensorOptions(DType::kInt64).device(Device::meta()))}
            : std::vector<Tensor>{randn(images), randint(0, classes, {batch})};
    trainer->loss = [raw]() {
      return cross_entropy(raw->model->forward(raw->batch[0]), raw->batch[1]);
    };
  }
  if (!settings.device.is_cpu()) {
    trainer->model->to(settings.device);
    for (Tensor& tensor : trainer->batch)
      if (tensor.device() != settings.device) tensor = tensor.to(settings.device);
  }
  trainer->model->train();
  trainer->optimizer = std::make_unique<optim::SGD>(
      trainer->model->parameters(), optim::SGDOptions(kLearningRate).momentum(kMomentum));
  return trainer;
}

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t middle = values.size() / 2;
  return values.size() % 2 ? values[middle] : 0.5 * (values[middle - 1] + values[middle]);
}

double process_cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) { return t.tv_sec + 1e-6 * t.tv_usec; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

double train_step(Trainer& trainer) {
  Tensor loss = trainer.loss();
  trainer.optimizer->zero_grad();
  loss.backward();
  trainer.optimizer->step();
  return loss.device().is_meta() ? 0.0 : loss.item<double>();  // meta: no values
}

// Seconds of the step clock: the simulated device's when simulating, else wall time.
double step_clock(const Settings& settings) {
  if (settings.simulation) return settings.simulation->now();
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

struct Point {
  bool ok = true;
  std::string error;
  double step_seconds = 0;  // the median timed step
  std::vector<double> step_times;
  double cpu_seconds = 0;  // the median of the timed steps' process CPU time (user + system)
  size_t peak = 0;
  size_t fixed = 0;
  memory::PolicyCounters counters;  // per timed step (means)
  double link_busy_seconds = 0;     // per timed step: the copy thread copying
  double link_wait_seconds = 0;     // per timed step: compute blocked on the host link
  double prefetches = 0;            // per timed step: swap-ins started ahead of need
  double prefetch_hits = 0;         // per timed step: of them, read before being dropped
  std::string auto_way;             // auto: the way it kept (ResidencyStats::auto_mode)
  int64_t auto_ways_given_up = 0;   // auto: ways whose trial step thrashed
  // Per timed step, by op: {"count", "bytes", "seconds"} of the recomputes (replays).
  nlohmann::ordered_json replays_by_op = nlohmann::ordered_json::object();
  double loss = 0;
  size_t reserved = 0;          // held from the segment source at the end
  size_t reserved_at_peak = 0;  // held when the allocated bytes reached their peak
  // Simulated runs, per timed step: modelled op time (recomputes included) and waits for the
  // host link.
  double compute_seconds = 0;
  double stall_seconds = 0;
};

// Writes the memory JSON of `allocator` to `path`, its timeline cut to the events from
// `first_clock` on (one step).
void write_step_memory_json(const std::string& path, const memory::CachingAllocator& allocator,
                            int64_t first_clock) {
  nlohmann::json data = memory::memory_json(allocator);
  nlohmann::json step = nlohmann::json::array();
  int64_t earlier = data.value("timeline_dropped", int64_t{0});
  for (const auto& event : data["timeline"]) {
    if (event["clock"].get<int64_t>() >= first_clock) {
      step.push_back(event);
    } else {
      ++earlier;
    }
  }
  data["timeline"] = std::move(step);
  data["timeline_dropped"] = earlier;
  std::ofstream out(path);
  out << data.dump() << "\n";
  TESSEL_CHECK(out.good(), "memory_sweep: cannot write ", path);
}

// Warm-up steps beyond --warmup while auto still tries its ways (five ways of up to seven steps
// each, then those close to the best again: memory/way_chooser.h).
constexpr int kMostAutoTrialSteps = 80;

Point measure(const Settings& settings, int64_t batch, const MemoryOptions& options,
              bool write_memory_json = false) {
  Point point;
  memory::MemoryScope scope(options);
  try {
    auto trainer = make_trainer(settings, batch);
    point.fixed = memory::fixed_memory_bytes(trainer->model->parameters(), 1);
    auto limit_step = [&] {
      if (settings.simulation && settings.step_deadline > 0)
        settings.simulation->set_deadline(settings.simulation->now() + settings.step_deadline);
    };
    for (int i = 0; i < settings.warmup; ++i) {
      limit_step();
      train_step(*trainer);
    }
    memory::ResidencyManager* manager = scope.manager();
    // auto is timed once it has kept one of its ways, not while it still tries them.
    for (int extra = 0; manager && manager->auto_trying() && extra < kMostAutoTrialSteps; ++extra) {
      limit_step();
      train_step(*trainer);
    }
    memory::step_counters();
    const double busy_start = manager ? manager->host_link().busy_seconds() : 0;
    const double wait_start = manager ? manager->host_link().wait_seconds() : 0;
    const memory::ResidencyStats residency_start =
        manager ? manager->stats() : memory::ResidencyStats{};
    std::vector<double> cpu_times;
    if (settings.simulation) settings.simulation->reset_counters();
    int64_t last_step_clock = 0;
    for (int i = 0; i < settings.steps; ++i) {
      last_step_clock = scope.allocator().clock();
      const double cpu_start = process_cpu_seconds();
      const double start = step_clock(settings);
      limit_step();
      point.loss = train_step(*trainer);
      const double seconds = step_clock(settings) - start;
      point.step_times.push_back(seconds);
      cpu_times.push_back(process_cpu_seconds() - cpu_start);
    }
    // The median: simulated steps differ too, by what earlier steps left behind (and auto's
    // choice between its two ways).
    point.step_seconds = median(point.step_times);
    point.cpu_seconds = median(cpu_times);
    const memory::PolicyCounters total = memory::step_counters();
    if (write_memory_json)
      write_step_memory_json(settings.memory_json, scope.allocator(), last_step_clock);
    if (settings.simulation) {
      const memory::sim::SimulationCounters simulated = settings.simulation->counters();
      point.compute_seconds = simulated.compute_seconds / settings.steps;
      point.stall_seconds = simulated.stall_seconds / settings.steps;
    }
    if (manager) {
      point.link_busy_seconds = (manager->host_link().busy_seconds() - busy_start) / settings.steps;
      point.link_wait_seconds = (manager->host_link().wait_seconds() - wait_start) / settings.steps;
      const memory::ResidencyStats residency = manager->stats();
      point.auto_way = residency.auto_mode;
      point.auto_ways_given_up = residency.ways_given_up;
      point.prefetches =
          static_cast<double>(residency.prefetches - residency_start.prefetches) / settings.steps;
      point.prefetch_hits =
          static_cast<double>(residency.prefetch_hits - residency_start.prefetch_hits) /
          settings.steps;
      for (const auto& [op, replays] : residency.replays_by_op) {
        memory::ResidencyStats::Replays before;
        auto start = residency_start.replays_by_op.find(op);
        if (start != residency_start.replays_by_op.end()) before = start->second;
        if (replays.count == before.count) continue;
        point.replays_by_op[op] = {
            {"count", static_cast<double>(replays.count - before.count) / settings.steps},
            {"bytes", static_cast<double>(replays.bytes - before.bytes) / settings.steps},
            {"seconds", (replays.seconds - before.seconds) / settings.steps}};
      }
    }
    auto mean = [&](int64_t value) { return value / std::max(1, settings.steps); };
    point.counters.evictions = mean(total.evictions);
    point.counters.evicted_bytes = mean(total.evicted_bytes);
    point.counters.recomputes = mean(total.recomputes);
    point.counters.recomputed_bytes = mean(total.recomputed_bytes);
    point.counters.swaps_out = mean(total.swaps_out);
    point.counters.swapped_out_bytes = mean(total.swapped_out_bytes);
    point.counters.swaps_in = mean(total.swaps_in);
    point.counters.swapped_in_bytes = mean(total.swapped_in_bytes);
    point.counters.splits = mean(total.splits);
  } catch (const memory::sim::DeadlinePassed&) {
    point.ok = false;
    point.error = "a step took more than " + std::to_string(settings.step_deadline) + " s";
  } catch (const Error& error) {
    point.ok = false;
    const std::string& message = error.message();
    point.error = message.substr(0, message.find('\n'));
    if (settings.full_errors) std::cerr << message << std::endl;
  }
  if (settings.simulation)
    settings.simulation->set_deadline(std::numeric_limits<double>::infinity());
  const memory::MemoryStats stats = scope.allocator().memory_stats();
  point.peak = static_cast<size_t>(stats.base.peak_allocated_bytes);
  point.reserved = static_cast<size_t>(stats.base.reserved_bytes);
  point.reserved_at_peak = static_cast<size_t>(stats.reserved_at_peak);
  return point;
}

nlohmann::ordered_json counters_json(const memory::PolicyCounters& c) {
  return {{"evictions", c.evictions},   {"evicted_bytes", c.evicted_bytes},
          {"recomputes", c.recomputes}, {"recomputed_bytes", c.recomputed_bytes},
          {"swaps_out", c.swaps_out},   {"swapped_out_bytes", c.swapped_out_bytes},
          {"swaps_in", c.swaps_in},     {"swapped_in_bytes", c.swapped_in_bytes},
          {"splits", c.splits}};
}

nlohmann::ordered_json point_json(const Settings& settings, int64_t batch, const Point& point) {
  nlohmann::ordered_json out = {{"model", settings.model},
                                {"device", settings.device.str()},
                                {"batch", batch},
                                {"image", settings.image},
                                {"seq", settings.seq},
                                {"vocab", settings.vocab},
                                {"ok", point.ok},
                                {"step_s", point.step_seconds},
                                {"step_times_s", point.step_times},
                                {"cpu_s", point.cpu_seconds},
                                {"peak_bytes", point.peak},
                                {"reserved_bytes", point.reserved},
                                {"reserved_at_peak_bytes", point.reserved_at_peak},
                                {"fixed_bytes", point.fixed},
                                {"per_step", counters_json(point.counters)},
                                {"link_busy_s", point.link_busy_seconds},
                                {"link_wait_s", point.link_wait_seconds},
                                {"prefetches", point.prefetches},
                                {"prefetch_hits", point.prefetch_hits},
                                {"replays_by_op", point.replays_by_op}};
  if (settings.simulation) {
    out["simulated_profile"] = settings.simulation->device().name;
    out["compute_s"] = point.compute_seconds;
    out["stall_s"] = point.stall_seconds;
  }
  if (!point.auto_way.empty()) out["auto_ways_given_up"] = point.auto_ways_given_up;
  if (!point.ok) out["error"] = point.error;
  return out;
}

MemoryOptions options_for(const Settings& settings, size_t budget, Policy policy) {
  return MemoryOptions()
      .device(settings.device)
      .budget(budget)
      .policy(policy)
      .host_bandwidth(settings.simulation ? settings.simulation->host_bandwidth()
                                          : settings.host_bandwidth)
      .cost_source(settings.cost_source)
      .prefetch(settings.prefetch)
      .swap_ahead(settings.swap_ahead);
}

void sweep(const Settings& settings) {
  Point reference = measure(settings, settings.batch, MemoryOptions().device(settings.device));
  TESSEL_CHECK(reference.ok, "memory_sweep: the unconstrained run failed: ", reference.error);
  std::cerr << settings.model << " batch " << settings.batch << ": peak "
            << memory::format_bytes(static_cast<double>(reference.peak)) << ", fixed "
            << memory::format_bytes(static_cast<double>(reference.fixed)) << ", step "
            << reference.step_seconds << " s" << std::endl;
  std::vector<double> reference_seconds;
  for (const std::string& name : settings.policies) {
    const Policy policy = memory::parse_policy(name);
    for (double fraction : settings.fractions) {
      const size_t budget =
          settings.whole_peak_fractions
              ? static_cast<size_t>(fraction * static_cast<double>(reference.peak))
              : memory::activation_budget(reference.fixed, reference.peak, fraction);
      // Pairs of an unconstrained and a budgeted run, the first of each pair alternating: the
      // speed of a shared machine drifts over minutes, which would scale every later ratio of a
      // single reference. A simulation gives the same time every run: one budgeted run against
      // its reference.
      const int pairs = settings.simulation ? 1 : settings.pairs;
      std::vector<double> ratios, cpu_ratios, base_seconds, base_cpu_seconds, point_seconds;
      std::vector<std::string> auto_ways;  // the way auto kept in each pair's run
      Point point;
      for (int pair = 0; pair < pairs && point.ok; ++pair) {
        Point base = reference;
        auto run_base = [&] {
          if (settings.simulation) return;
          base = measure(settings, settings.batch, MemoryOptions().device(settings.device));
          TESSEL_CHECK(base.ok, "memory_sweep: the unconstrained run failed: ", base.error);
        };
        if (pair % 2 == 0) run_base();
        point = measure(settings, settings.batch, options_for(settings, budget, policy),
                        !settings.memory_json.empty());
        if (pair % 2 == 1) run_base();
        reference_seconds.push_back(base.step_seconds);
        base_seconds.push_back(base.step_seconds);
        base_cpu_seconds.push_back(base.cpu_seconds);
        if (!point.ok) break;
        if (!point.auto_way.empty()) auto_ways.push_back(point.auto_way);
        point_seconds.push_back(point.step_seconds);
        ratios.push_back(point.step_seconds / base.step_seconds);
        cpu_ratios.push_back(point.cpu_seconds / base.cpu_seconds);
      }
      if (point.ok) point.step_seconds = median(point_seconds);
      nlohmann::ordered_json line = point_json(settings, settings.batch, point);
      line["kind"] = "sweep";
      line["policy"] = name;
      line["fraction"] =
          settings.whole_peak_fractions
              ? (static_cast<double>(budget) - static_cast<double>(reference.fixed)) /
                    static_cast<double>(reference.peak - reference.fixed)
              : fraction;
      line["budget_bytes"] = budget;
      line["whole_peak_fraction"] =
          static_cast<double>(budget) / static_cast<double>(reference.peak);
      // The cell: medians over the pairs, with the range of the per-pair ratios.
      line["pairs"] = ratios.size();
      line["reference_step_s"] = median(base_seconds);
      line["reference_cpu_s"] = median(base_cpu_seconds);
      line["slowdown"] = point.ok ? median(ratios) : 0.0;
      line["cpu_slowdown"] = point.ok ? median(cpu_ratios) : 0.0;
      line["pair_slowdowns"] = ratios;
      line["pair_cpu_slowdowns"] = cpu_ratios;
      if (!auto_ways.empty()) line["auto_ways"] = auto_ways;
      if (point.ok) {
        line["slowdown_min"] = *std::min_element(ratios.begin(), ratios.end());
        line["slowdown_max"] = *std::max_element(ratios.begin(), ratios.end());
      }
      std::cout << line.dump() << std::endl;
      std::cerr << "  " << name << " f=" << fraction << ": "
                << (point.ok ? std::to_string(median(ratios)) + "x (" +
                                   std::to_string(ratios.size()) + " pairs)"
                             : "failed: " + point.error)
                << "; " << memory::format_counters(point.counters) << "; host link busy "
                << point.link_busy_seconds << " s, waited for " << point.link_wait_seconds << " s; "
                << point.prefetches << " prefetches, " << point.prefetch_hits << " read";
      for (size_t pair = 0; pair < auto_ways.size(); ++pair)
        std::cerr << (pair == 0 ? "; ways kept: " : ", ") << auto_ways[pair];
      std::cerr << std::endl;
    }
  }
  // The header's step time: the median of the unconstrained runs.
  nlohmann::ordered_json head = point_json(settings, settings.batch, reference);
  head["kind"] = "reference";
  head["step_s_runs"] = reference_seconds;
  if (!reference_seconds.empty()) head["step_s"] = median(reference_seconds);
  std::cout << head.dump() << std::endl;
}

// The largest batch in [1, max_batch] for which `fits` holds, assuming it holds for every batch
// below one that fits: doubling, then bisection.
void largest_batch(const Settings& settings) {
  TESSEL_CHECK(settings.budget > 0, "memory_sweep: --largest_batch needs --budget");
  for (const std::string& name : settings.policies) {
    const Policy policy = memory::parse_policy(name);
    Settings probe_settings = settings;
    probe_settings.warmup = 1;
    probe_settings.steps = 1;
    int64_t good = 0, bad = settings.max_batch + 1;
    Point good_point;
    std::string failure;  // why the first failing batch failed
    auto probe = [&](int64_t batch) {
      if (settings.max_slowdown > 0) {
        Settings unconstrained = probe_settings;
        unconstrained.warmup = 0;
        unconstrained.step_deadline = 0;  // the last probe's limit is not this batch's
        const Point reference =
            measure(unconstrained, batch, MemoryOptions().device(settings.device));
        TESSEL_CHECK(reference.ok, "memory_sweep: the unconstrained run at batch ", batch,
                     " failed: ", reference.error);
        probe_settings.step_deadline = settings.max_slowdown * reference.step_seconds;
      }
      const Point point =
          measure(probe_settings, batch, options_for(settings, settings.budget, policy));
      std::cerr << "  " << name << " batch " << batch << ": "
                << (point.ok ? "fits, " + std::to_string(point.step_seconds) + " s/step"
                             : "does not fit: " + point.error)
                << std::endl;
      if (point.ok) {
        good = batch;
        good_point = point;
      } else {
        bad = batch;
        failure = point.error;
      }
      return point.ok;
    };
    int64_t batch = std::max<int64_t>(1, settings.batch);
    while (batch < bad && batch <= settings.max_batch && probe(batch)) batch *= 2;
    while (bad - good > 1 && (bad - good) * 16 > good) probe(good + (bad - good) / 2);
    nlohmann::ordered_json line = point_json(settings, good, good_point);
    line["kind"] = "largest_batch";
    line["policy"] = name;
    line["budget_bytes"] = settings.budget;
    line["first_failing_batch"] = bad;
    if (bad <= settings.max_batch) line["first_failure"] = failure;
    if (settings.max_slowdown > 0) line["max_slowdown"] = settings.max_slowdown;
    line["max_batch"] = settings.max_batch;
    line["seconds_per_sample"] = good > 0 ? good_point.step_seconds / good : 0.0;
    std::cout << line.dump() << std::endl;
  }
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ','))
    if (!item.empty()) items.push_back(item);
  return items;
}

int run(int argc, char** argv) {
  Settings settings;
  int threads = 2;
  std::string profile_path;
  memory::sim::MemoryLayout layout = memory::sim::MemoryLayout::kSegments;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](const char* flag) -> const char* {
      const size_t length = std::strlen(flag);
      return arg.compare(0, length, flag) == 0 ? argv[i] + length : nullptr;
    };
    if (const char* v = value("--model=")) {
      settings.model = v;
    } else if (const char* v = value("--device=")) {
      settings.device = Device::parse(v);
    } else if (const char* v = value("--batch=")) {
      settings.batch = std::atoll(v);
    } else if (const char* v = value("--image=")) {
      settings.image = std::atoll(v);
    } else if (const char* v = value("--seq=")) {
      settings.seq = std::atoll(v);
    } else if (const char* v = value("--vocab=")) {
      settings.vocab = std::atoll(v);
    } else if (const char* v = value("--warmup=")) {
      settings.warmup = std::atoi(v);
    } else if (const char* v = value("--steps=")) {
      settings.steps = std::atoi(v);
    } else if (const char* v = value("--pairs=")) {
      settings.pairs = std::atoi(v);
    } else if (const char* v = value("--threads=")) {
      threads = std::atoi(v);
    } else if (const char* v = value("--fractions=")) {
      settings.fractions.clear();
      for (const auto& item : split_list(v)) settings.fractions.push_back(std::atof(item.c_str()));
    } else if (const char* v = value("--policies=")) {
      settings.policies = split_list(v);
    } else if (const char* v = value("--budget=")) {
      settings.budget = memory::parse_budget(v).bytes;
    } else if (const char* v = value("--max_batch=")) {
      settings.max_batch = std::atoll(v);
    } else if (const char* v = value("--max_slowdown=")) {
      settings.max_slowdown = std::atof(v);
    } else if (const char* v = value("--host_bandwidth=")) {
      settings.host_bandwidth = std::atof(v);
    } else if (arg == "--mlm_logits") {
      settings.mlm_logits = true;
    } else if (arg == "--no_prefetch") {
      settings.prefetch = false;
    } else if (arg == "--no_swap_ahead") {
      settings.swap_ahead = false;
    } else if (arg == "--estimated_costs") {
      settings.cost_source = memory::CostSource::kEstimated;  // from FLOPs and bytes, not timed
    } else if (arg == "--full_errors") {
      settings.full_errors = true;
    } else if (const char* v = value("--memory_json=")) {
      settings.memory_json = v;
    } else if (arg == "--largest_batch") {
      settings.largest_batch = true;
    } else if (const char* v = value("--whole_peak_fractions=")) {
      settings.whole_peak_fractions = true;
      settings.fractions.clear();
      for (const auto& item : split_list(v)) settings.fractions.push_back(std::atof(item.c_str()));
    } else if (const char* v = value("--simulate=")) {
      profile_path = v;
    } else if (const char* v = value("--simulated_layout=")) {
      TESSEL_CHECK(std::string(v) == "arena" || std::string(v) == "segments",
                   "memory_sweep: --simulated_layout is arena or segments, got '", v, "'");
      layout = std::string(v) == "arena" ? memory::sim::MemoryLayout::kArena
                                         : memory::sim::MemoryLayout::kSegments;
    } else {
      std::cerr << "memory_sweep: unknown argument '" << arg << "'\n";
      return 2;
    }
  }
  TESSEL_CHECK(settings.steps >= 1 && settings.warmup >= 0 && settings.pairs >= 1,
               "memory_sweep: --steps and --pairs must be at least 1, --warmup at least 0");
  set_num_threads(threads);
  std::unique_ptr<memory::sim::Simulation> simulation;
  if (!profile_path.empty()) {
    simulation = std::make_unique<memory::sim::Simulation>(
        planner::simulated_device(planner::load_profile(profile_path)), layout);
    settings.simulation = simulation.get();
    settings.device = Device::meta();
  }
  TESSEL_CHECK(settings.max_slowdown == 0 || (settings.simulation && settings.max_slowdown > 1),
               "memory_sweep: --max_slowdown needs --simulate and a value above 1, got ",
               settings.max_slowdown);
  if (settings.largest_batch) {
    largest_batch(settings);
  } else {
    sweep(settings);
  }
  return 0;
}

}  // namespace
}  // namespace tessel::bench

int main(int argc, char** argv) { return tessel::run_main(argc, argv, tessel::bench::run); }
