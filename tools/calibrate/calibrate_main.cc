// Measures a device profile on this machine and writes it as JSON for the planner:
//   bazel run //tools/calibrate -- --out=/tmp/this_machine.json
//   mpirun -np 2 bazel-bin/parallel/planner/calibrate --out=/tmp/two_ranks.json  (collectives)
// GEMM and convolution throughput and element-wise bandwidth come from Tessel's own CPU kernels;
// so do the per-kind rates (op_kinds: dense, grouped and depthwise convolutions, small GEMMs,
// element-wise, normalisation, pooling, concatenation, loss and optimizer updates, forward and
// backward, at shapes like the model zoo's). Under mpirun every rank measures at the same time,
// so the numbers describe per-rank throughput with that many ranks sharing the node's cores
// (calibrated_layout in the file).
// Collective alpha-beta costs are measured with the MPI communicator when started with more than
// one rank; otherwise they are copied from --base and the file says so in "sources".
#include <time.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "core/op.h"
#include "core/threading.h"
#include "models/trace.h"
#include "ops/conv.h"
#include "ops/elementwise.h"
#include "ops/linalg.h"
#include "ops/ops.h"
#include "ops/optimizer_updates.h"
#include "optim/adam.h"
#include "optim/sgd.h"
#include "parallel/launch.h"
#include "parallel/mpi_communicator.h"
#include "parallel/planner/cost_model.h"
#include "parallel/planner/graph.h"
#include "parallel/planner/strategies.h"
#include "parallel/tensor_parallel.h"
#include "tools/plan/plan_cli.h"

namespace tessel::planner {
namespace {

using Clock = std::chrono::steady_clock;

// Best time of `body` over repetitions that together take at least `budget_s` (at least 3).
double best_time(const std::function<void()>& body, double budget_s) {
  body();  // warm up: first-touch pages, thread pool start
  double best = 1e30, spent = 0;
  for (int rep = 0; rep < 3 || spent < budget_s; ++rep) {
    const auto start = Clock::now();
    body();
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    best = std::min(best, seconds);
    spent += seconds;
    if (rep > 1000) break;
  }
  return best;
}

// Runs an op into a preallocated output: kernel throughput, without allocation or first-touch
// page faults (training reuses cached blocks).
void into(const OpHandle& op, const std::vector<Tensor>& inputs, const Attrs& attrs,
          const Tensor& out) {
  dispatch(op, inputs, attrs, {out});
}

struct PassTimes {
  double forward = 0, backward = 0;
};

// CPU time of this process (every thread), seconds.
double process_cpu_seconds() {
  timespec now{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
}

// The work the planner counts for the ops `forward` runs (traced as the planner traces models):
// FLOPs and bytes summed over the ops priced as `kind`.
std::pair<double, double> planner_work(const std::function<Tensor()>& forward,
                                       const std::string& kind) {
  const Graph graph = trace_graph([&] { forward(); }, {}, {}, 1);
  double flops = 0, bytes = 0;
  for (const TracedOp& op : graph.ops)
    if (op_kind(op) == kind) {
      flops += op.flops;
      bytes += op.bytes;
    }
  TESSEL_CHECK(flops > 0 || bytes > 0, "calibrate: no op of kind ", kind, " was traced");
  return {flops, bytes};
}

// One shape of an op kind: its forward (the output's backward runs from ones), the leaves whose
// gradients are cleared, and the backward work the planner counts in units of the forward's
// (matrix products: one product per operand that needs a gradient; other ops 1).
struct KindCase {
  std::function<Tensor()> forward;
  std::vector<Tensor> leaves;
  double backward_factor = 1;
  // The planner's (FLOPs, bytes) for the case, when not those of the forward's own ops of its
  // kind (a decomposition priced by the bytes of the op it stands for).
  std::function<std::pair<double, double>()> work;
};

// Several copies of one case, used in turn, so that together they overflow the last-level cache
// as a training step's activations do (a lone small tensor would be measured in cache).
KindCase pooled(
    const std::function<std::pair<std::function<Tensor()>, std::vector<Tensor>>()>& make,
    double backward_factor) {
  constexpr double kPoolBytes = 36.0 * 1024 * 1024;
  std::vector<std::function<Tensor()>> forwards;
  KindCase result;
  result.backward_factor = backward_factor;
  double bytes = 0;
  while (forwards.size() < 64 && (forwards.empty() || bytes < kPoolBytes)) {
    auto [forward, leaves] = make();
    forwards.push_back(forward);
    for (const Tensor& leaf : leaves) {
      bytes += static_cast<double>(leaf.nbytes());
      result.leaves.push_back(leaf);
    }
  }
  auto next = std::make_shared<size_t>(0);
  result.forward = [forwards, next] { return forwards[(*next)++ % forwards.size()](); };
  return result;
}

// Fit of time = call + work / rate over the cases: least squares in relative error (each case
// weighted by 1 / time^2, so small shapes count as much as large ones) for the fixed cost per
// call, kept within [0, 0.8 x the smallest case's time] so that noise cannot make it dominate;
// then the rate that makes the total of the cases' times right.
std::pair<double, double> fit_call_and_rate(const std::vector<double>& work,
                                            const std::vector<double>& seconds) {
  double sw = 0, sx = 0, st = 0, sxx = 0, sxt = 0, total_work = 0, total_time = 0;
  double smallest = seconds.empty() ? 0 : seconds[0];
  for (size_t i = 0; i < work.size(); ++i) {
    const double weight = 1.0 / (seconds[i] * seconds[i]);
    sw += weight;
    sx += weight * work[i];
    st += weight * seconds[i];
    sxx += weight * work[i] * work[i];
    sxt += weight * work[i] * seconds[i];
    total_work += work[i];
    total_time += seconds[i];
    smallest = std::min(smallest, seconds[i]);
  }
  double call = 0;
  const double denominator = sw * sxx - sx * sx;
  if (work.size() >= 2 && denominator > 0) {
    const double slope = (sw * sxt - sx * st) / denominator;
    if (slope > 0) call = std::clamp((st - slope * sx) / sw, 0.0, 0.8 * smallest);
  }
  const double cases = static_cast<double>(work.size());
  return {call, total_work / (total_time - cases * call)};
}

// The most bytes evict_caches writes: twice the last-level cache (at least 64 MiB).
size_t largest_eviction() {
  const long last_level = std::max(::sysconf(_SC_LEVEL3_CACHE_SIZE), 0L);
  return std::max<size_t>(64u << 20, 2 * static_cast<size_t>(last_level));
}

// Writes one value per cache line of `bytes` (at most largest_eviction()) of a buffer, pushing
// that much of what the caches held out. In a training step the rest of the step runs between
// two calls of one layer, so what the layer reads comes from as far as the step's other data
// pushed it: from memory in a large model (on a 2-core Xeon a 64-channel 3x3 convolution at
// 16x16, batch 4, took 0.69 ms back to back, 1.11 ms after evicting every cache and 1.15 ms
// inside ResNet-18's step), from the last-level cache in a small one.
void evict_caches(size_t bytes) {
  static std::vector<char> buffer(largest_eviction());
  static char value = 0;
  ++value;
  bytes = std::min(bytes, buffer.size());
  for (size_t i = 0; i < bytes; i += 64) buffer[i] += value;
}

// Forward and backward times of every case, measured in rounds (each round runs every case once,
// forward then backward from a gradient of ones) until `budget_s` has passed (at least 5
// rounds): a load that comes and goes on a shared machine then weighs on every case alike.
// Each case's time is its trimmed mean CPU time over rounds scaled by the share of the cores the
// process got over all rounds (shared_core_times: short ops lose that share as long ones do);
// with `comm`, every rank runs the same rounds at the same time and each case counts at the
// ranks' mean.
// `skew`: with `comm`, how much longer a round takes from one synchronisation to the next than
// the average rank's own work in it (the wait for the slowest rank, as every training step has),
// as a fraction; 0 without, and 0 with `evictions`.
// `evictions`: bytes per case evicted from the caches before its forward and its backward
// (evict_caches; with `comm`, every rank's before any rank goes on), outside the time taken.
std::vector<PassTimes> time_in_rounds(const std::vector<KindCase>& cases, double budget_s,
                                      parallel::Communicator* comm, double* skew,
                                      double* wall_per_cpu = nullptr,
                                      const std::vector<size_t>* evictions = nullptr) {
  auto clear = [](const KindCase& c) {
    for (const Tensor& leaf : c.leaves) leaf.set_grad(Tensor());
  };
  std::vector<Tensor> seeds;
  for (const KindCase& c : cases) {  // warm up, and the backward seed of each case
    Tensor out = c.forward();
    seeds.push_back(out.numel() == 1 ? Tensor() : ones(out.sizes()));
    out.backward(seeds.back());
    clear(c);
  }
  // Per case, the process's CPU time (trimmed over rounds: robust to noise); and the wall and
  // CPU time of all cases over all rounds, whose ratio is the share of the cores this process got.
  std::vector<std::vector<double>> forwards(cases.size()), backwards(cases.size());
  std::vector<double> walls, busy;
  double busy_wall = 0, busy_cpu = 0;
  // Every rank evicts before any times: one rank's eviction would slow another's op.
  auto evict = [&](size_t i) {
    if (!evictions) return;
    evict_caches((*evictions)[i]);
    if (comm) comm->barrier();
  };
  const auto start = Clock::now();
  auto round_start = start;
  for (int round = 0; round < 10000; ++round) {
    int more = round < 5 || std::chrono::duration<double>(Clock::now() - start).count() < budget_s;
    if (comm) {
      Tensor flag = tensor({static_cast<float>(more)}, {1});
      comm->all_reduce(flag, parallel::ReduceOp::kMax);  // every rank stops together
      more = flag.item<float>() > 0;
    }
    const auto now = Clock::now();
    if (round > 0) walls.push_back(std::chrono::duration<double>(now - round_start).count());
    round_start = now;
    if (!more) break;
    busy.push_back(0);
    for (size_t i = 0; i < cases.size(); ++i) {
      evict(i);
      const auto begin = Clock::now();
      const double cpu_begin = process_cpu_seconds();
      Tensor out = cases[i].forward();
      const double cpu_middle = process_cpu_seconds();
      const auto middle = Clock::now();
      evict(i);
      const auto backward_begin = Clock::now();
      const double cpu_backward_begin = process_cpu_seconds();
      out.backward(seeds[i]);
      const double cpu_end = process_cpu_seconds();
      const auto end = Clock::now();
      out = Tensor();
      clear(cases[i]);
      forwards[i].push_back(cpu_middle - cpu_begin);
      backwards[i].push_back(cpu_end - cpu_backward_begin);
      const double wall = std::chrono::duration<double>(middle - begin).count() +
                          std::chrono::duration<double>(end - backward_begin).count();
      busy.back() += wall;
      busy_wall += wall;
      busy_cpu += (cpu_middle - cpu_begin) + (cpu_end - cpu_backward_begin);
    }
  }
  const std::vector<double> forward_s = shared_core_times(forwards, busy_wall, busy_cpu);
  const std::vector<double> backward_s = shared_core_times(backwards, busy_wall, busy_cpu);
  if (wall_per_cpu) *wall_per_cpu = busy_cpu > 0 ? busy_wall / busy_cpu : 1.0;
  *skew = 0;
  std::vector<float> means;
  for (size_t i = 0; i < cases.size(); ++i) {
    means.push_back(static_cast<float>(forward_s[i]));
    means.push_back(static_cast<float>(backward_s[i]));
  }
  if (comm) {
    // The average rank's times; the wait for the slowest one is the skew.
    means.push_back(static_cast<float>(trimmed_mean(busy)));
    Tensor average = tensor(means, {static_cast<int64_t>(means.size())});
    comm->all_reduce(average, parallel::ReduceOp::kSum);
    means = average.to_vector<float>();
    for (float& value : means) value /= static_cast<float>(comm->size());
    if (!evictions) *skew = std::max(0.0, trimmed_mean(walls) / means.back() - 1);
    means.pop_back();
  }
  std::vector<PassTimes> times;
  for (size_t i = 0; i < cases.size(); ++i) times.push_back({means[2 * i], means[2 * i + 1]});
  return times;
}

struct CollectiveFit {
  AlphaBeta cost;
  double small_s = 0, large_s = 0;
};

// alpha from a tiny message, bandwidth from a large one: t = steps * alpha + moved / bandwidth.
// How far apart ranks reach a collective after working on their own: the mean time a rank waits
// in a one-element all_reduce right after T seconds of its own compute, over the ranks, for T of
// about 0.3, 1.3 and 5 ms; fitted as sync_jitter * sqrt(T) (least squares). Ranks' times vary
// like a random walk (the OS, caches, cores shared with other ranks), so the wait grows with the
// square root of the work between collectives: every blocking collective inside a step pays it,
// far above the latency of a tight loop of collectives. `text` gets the points.
// The ranks' wait at a collective after T seconds of their own work, fitted as
// sync_jitter * T^sync_exponent (least squares in logarithms) over works from tens of
// microseconds to milliseconds: the mean time in a one-element all_reduce after each. Works and
// waits are counted as the op rates count compute: the work's CPU time times `wall_per_cpu` (the
// share of the cores a rank gets, as measured over the op-kind rounds), and the wait is what
// the wall time of work and collective exceeds that by. Ranks sharing a core take turns: the
// partner's turn is in the rate already, and not counted again as a wait.
std::pair<double, double> synchronisation_waits(parallel::Communicator& comm, double wall_per_cpu,
                                                bool quick, std::string* text) {
  Tensor one = ones({1});
  std::vector<double> log_work, log_wait;
  // (matrix size, matmuls per work, repetitions per round): about 20 ms of work each per round;
  // the sizes take turns over 20 rounds, so that the machine's slower and faster spells (seconds
  // long) weigh on every size alike.
  const std::tuple<int64_t, int, int> works[] = {
      {64, 4, 800}, {64, 16, 200}, {256, 1, 80}, {256, 4, 20}, {256, 16, 5}};
  constexpr size_t kSizes = sizeof works / sizeof works[0];
  std::vector<std::array<Tensor, 3>> operands;
  for (const auto& [size, matmuls, repetitions] : works)
    operands.push_back({randn({size, size}), randn({size, size}), empty({size, size})});
  std::vector<double> wall(kSizes, 0), work(kSizes, 0);
  std::vector<int> count(kSizes, 0);
  comm.barrier();
  for (int round = 0; round < (quick ? 2 : 20); ++round)
    for (size_t i = 0; i < kSizes; ++i) {
      const auto& [size, matmuls, repetitions] = works[i];
      const auto& [a, b, c] = operands[i];
      const int reps = quick ? std::max(1, repetitions / 20) : repetitions;
      for (int rep = 0; rep < reps; ++rep) {
        const auto start = Clock::now();
        const double cpu_start = process_cpu_seconds();
        for (int k = 0; k < matmuls; ++k) into(ops::matmul, {a, b}, {}, c);
        work[i] += (process_cpu_seconds() - cpu_start) * wall_per_cpu;
        comm.all_reduce(one);
        wall[i] += std::chrono::duration<double>(Clock::now() - start).count();
        ++count[i];
      }
    }
  for (size_t i = 0; i < kSizes; ++i) {
    const double wait = std::max(0.0, wall[i] - work[i]);
    Tensor means =
        tensor({static_cast<float>(wait / count[i]), static_cast<float>(work[i] / count[i])}, {2});
    comm.all_reduce(means, parallel::ReduceOp::kSum);
    const std::vector<float> mean = means.to_vector<float>();
    const double mean_wait = mean[0] / comm.size(), mean_work = mean[1] / comm.size();
    if (mean_wait > 0 && mean_work > 0) {
      log_work.push_back(std::log(mean_work));
      log_wait.push_back(std::log(mean_wait));
    }
    *text += format_seconds(mean_wait) + " after " + format_seconds(mean_work) + ", ";
  }
  const double n = static_cast<double>(log_work.size());
  if (n < 2) return {0.0, 0.5};
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (size_t i = 0; i < log_work.size(); ++i) {
    sx += log_work[i];
    sy += log_wait[i];
    sxx += log_work[i] * log_work[i];
    sxy += log_work[i] * log_wait[i];
  }
  const double exponent = std::clamp((n * sxy - sx * sy) / (n * sxx - sx * sx), 0.0, 1.0);
  return {std::exp((sy - exponent * sx) / n), exponent};
}

CollectiveFit fit_collective(parallel::Communicator& comm, Collective collective, int64_t large) {
  const int p = comm.size();
  const double steps = collective == Collective::kAllReduce ? 2.0 * (p - 1) : p - 1.0;
  const double share = collective == Collective::kAllReduce ? 2.0 * (p - 1) / p : (p - 1.0) / p;
  auto run = [&](int64_t elements) {
    // Buffers of `elements` floats per rank (the full buffer for all_reduce and reduce_scatter,
    // the gathered result for all_gather).
    const int64_t rows = std::max<int64_t>(p, elements / p * p);
    Tensor full = ones({rows});
    Tensor part = ones({rows / p});
    std::function<void()> body;
    if (collective == Collective::kAllReduce)
      body = [&] { comm.all_reduce(full); };
    else if (collective == Collective::kAllGather)
      body = [&] { comm.all_gather(part, full); };
    else
      body = [&] { comm.reduce_scatter(full, part); };
    comm.barrier();
    // Every rank must run the same number of repetitions: a fixed count, the slowest rank's time.
    body();
    double best = 1e30;
    for (int rep = 0; rep < 20; ++rep) {
      comm.barrier();
      const auto start = Clock::now();
      body();
      Tensor seconds = tensor(
          {static_cast<float>(std::chrono::duration<double>(Clock::now() - start).count())}, {1});
      comm.all_reduce(seconds, parallel::ReduceOp::kMax);
      best = std::min(best, static_cast<double>(seconds.item<float>()));
    }
    return std::make_pair(best, static_cast<double>(rows) * 4);
  };
  CollectiveFit fit;
  const auto [small_s, small_bytes] = run(p);
  const auto [large_s, large_bytes] = run(large);
  fit.small_s = small_s;
  fit.large_s = large_s;
  (void)small_bytes;
  fit.cost.alpha_s = small_s / steps;
  const double transfer = std::max(large_s - steps * fit.cost.alpha_s, large_s * 0.05);
  fit.cost.bus_bandwidth = share * large_bytes / transfer;
  return fit;
}

// What a collective costs inside a step beyond its back-to-back price (fit_collective's tight
// loop, which takes the best of its repetitions): after work, with caches holding the work's data
// and ranks that share cores taking turns at each ring step. Each collective is timed alone,
// right after the same work (two 256 x 256 matmuls): all_reduces and all_gathers of 32768 and
// 131072 floats, and a one-element all_reduce as the reference, which carries the ranks' wait for
// each other, priced apart as sync_wait (a one-element all_reduce after work is what sync_jitter
// is fitted to). The cases take turns repetition by repetition, so the machine's spells fall on
// all alike. What each case's median took beyond the reference's, less what `profile` already
// prices beyond it, over its ring steps: the mean over the ranks, fitted as one latency per step
// (least squares). `text` gets the points.
double collective_turns(parallel::Communicator& comm, const DeviceProfile& profile, bool quick,
                        std::string* text) {
  const int p = comm.size();
  struct Case {
    Collective collective;
    Tensor full, part;
    std::vector<double> seconds;
  };
  std::vector<Case> cases;
  for (auto [collective, elements] : {std::pair{Collective::kAllReduce, int64_t{1}},
                                      {Collective::kAllReduce, int64_t{32768}},
                                      {Collective::kAllReduce, int64_t{131072}},
                                      {Collective::kAllGather, int64_t{32768}},
                                      {Collective::kAllGather, int64_t{131072}}}) {
    const int64_t rows = collective == Collective::kAllGather ? elements / p * p : elements;
    cases.push_back({collective, ones({rows}), ones({rows / p}), {}});
  }
  const Tensor a = randn({256, 256}), b = randn({256, 256}), product = empty({256, 256});
  comm.barrier();
  for (int rep = 0; rep < (quick ? 4 : 200); ++rep)
    for (Case& c : cases) {
      for (int k = 0; k < 2; ++k) into(ops::matmul, {a, b}, {}, product);
      const auto start = Clock::now();
      if (c.collective == Collective::kAllReduce)
        comm.all_reduce(c.full);
      else
        comm.all_gather(c.part, c.full);
      c.seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    }
  auto priced = [&](const Case& c) {
    return profile.collective_time(c.collective, p, static_cast<double>(c.full.numel()) * 4);
  };
  auto median = [](std::vector<double> values) {
    std::nth_element(values.begin(), values.begin() + values.size() / 2, values.end());
    return values[values.size() / 2];
  };
  const double reference = median(cases[0].seconds);
  std::vector<float> beyond;
  for (const Case& c : cases)
    beyond.push_back(
        static_cast<float>(median(c.seconds) - reference - (priced(c) - priced(cases[0]))));
  Tensor means = tensor(beyond, {static_cast<int64_t>(beyond.size())});
  comm.all_reduce(means, parallel::ReduceOp::kSum);
  const std::vector<float> sums = means.to_vector<float>();
  double weighted = 0, squares = 0;
  for (size_t i = 1; i < cases.size(); ++i) {
    const double steps = cases[i].collective == Collective::kAllReduce ? 2.0 * (p - 1) : p - 1.0;
    const double mean = sums[i] / p;
    weighted += steps * mean;
    squares += steps * steps;
    *text += std::string(collective_name(cases[i].collective)) + " of " +
             std::to_string(cases[i].full.numel()) + " floats " + format_seconds(mean) + ", ";
  }
  return std::max(0.0, weighted / squares);
}

struct CalibrateOptions {
  std::string out_path, name = "calibrated", base = "cpu_2core_example";
  int threads = 0;
  bool quick = false;
  // --shapes_of: zoo models whose matrix ops are measured at every local shape the planner
  // prices them at, on `devices` devices (0: the ranks), at these sizes.
  std::vector<std::string> shape_models;
  int devices = 0;
  ModelSpec spec;
};

// Parses the command line into `options`; returns the exit code when the program should stop
// (--help, or a bad argument), nothing when it should go on.
std::optional<int> parse_options(int argc, char** argv, CalibrateOptions& options) {
  CLI::App app("Measures a device profile for the planner on this machine and writes it as JSON.",
               "calibrate");
  app.add_option("--out", options.out_path, "write the profile here")->required();
  app.add_option("--name", options.name, "profile name")->capture_default_str();
  app.add_option("--base", options.base,
                 "profile whose numbers are kept for what cannot be measured here (collectives "
                 "with one rank, remat_overhead_k)")
      ->capture_default_str();
  app.add_option("--threads", options.threads, "intra-op threads; 0: every core")
      ->capture_default_str();
  app.add_flag("--quick", options.quick, "smaller sizes and shorter runs (for tests)");
  app.add_option("--shapes_of", options.shape_models,
                 "also measure these zoo models' convolutions and linear layers at every local "
                 "shape the planner prices on --devices devices (op_shapes; comma-separated)")
      ->delimiter(',');
  app.add_option("--devices", options.devices,
                 "devices the --shapes_of models are planned on (0: the ranks)")
      ->capture_default_str();
  app.add_option("--batch", options.spec.batch, "--shapes_of: global batch")->capture_default_str();
  app.add_option("--image_size", options.spec.image_size, "--shapes_of: image size (vision)")
      ->capture_default_str();
  app.add_option("--num_classes", options.spec.num_classes, "--shapes_of: classes (vision)")
      ->capture_default_str();
  app.add_option("--seq", options.spec.seq, "--shapes_of: sequence length (BERT)")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error);
  }
  return std::nullopt;
}

std::string host_name() {
  char host[256] = "unknown";
  ::gethostname(host, sizeof host - 1);
  return host;
}

// The "measured" source: where, when and with how many threads and ranks.
std::string measured_text(const std::string& host, int ranks) {
  std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  return "calibrate on " + host + ", " + date + ", " + std::to_string(get_num_threads()) +
         " threads per rank, " + std::to_string(ranks) + " rank(s); best of repeated runs";
}

// GEMM: (n x n) @ (n x n), 2 n^3 FLOPs.
void measure_gemm(DeviceProfile& profile, nlohmann::json& sources, double budget, bool quick) {
  const int64_t n = quick ? 256 : 1024;
  Tensor a = randn({n, n}), b = randn({n, n}), c = empty({n, n});
  const double seconds = best_time([&] { into(ops::matmul, {a, b}, {}, c); }, budget);
  profile.gemm_flops = 2.0 * n * n * n / seconds;
  sources["gemm"] =
      "matmul " + std::to_string(n) + "^3 f32 on Tessel's CPU kernels, into a preallocated output";
}

// Convolution: ResNet's 3x3, 64 -> 64 channels at 56x56 (smaller with --quick).
void measure_conv(DeviceProfile& profile, nlohmann::json& sources, double budget, bool quick) {
  const int64_t batch = quick ? 1 : 4, channels = 64, size = quick ? 28 : 56;
  Tensor x = randn({batch, channels, size, size}), w = randn({channels, channels, 3, 3});
  Tensor y = empty({batch, channels, size, size});
  const Attrs attrs{{"stride", std::vector<int64_t>{1, 1}},
                    {"padding", std::vector<int64_t>{1, 1}},
                    {"dilation", std::vector<int64_t>{1, 1}},
                    {"groups", int64_t{1}}};
  const double seconds = best_time([&] { into(ops::conv2d, {x, w, Tensor()}, attrs, y); }, budget);
  profile.conv_flops = 2.0 * batch * channels * size * size * channels * 9 / seconds;
  sources["conv"] = "conv2d 3x3, 64 -> 64 channels, " + std::to_string(size) + "x" +
                    std::to_string(size) + ", batch " + std::to_string(batch) + ", f32";
}

// Element-wise: a + b over 16M floats reads 8 and writes 4 bytes per element. Then the first
// estimate of op_overhead_s, which measure_network_overhead may raise.
void measure_elementwise_and_overhead(DeviceProfile& profile, nlohmann::json& sources,
                                      double budget, bool quick) {
  const int64_t elements = quick ? (1 << 20) : (1 << 24);
  Tensor a = randn({elements}), b = randn({elements}), c = empty({elements});
  const double seconds = best_time([&] { into(ops::add, {a, b}, {}, c); }, budget);
  profile.memory_bandwidth = 12.0 * elements / seconds;
  profile.elementwise_flops = elements / seconds;
  sources["memory_bandwidth"] =
      "add of two " + std::to_string(elements) + "-element f32 tensors (12 bytes per element)";
  // A training step's cost per op call beyond its work: dispatch, allocation, autograd's
  // records and the backward engine, for a chain of ops on one element, per op and pass.
  Tensor one = randn({1}).set_requires_grad(true);
  constexpr int kChain = 64;
  const double chain_s = best_time(
      [&] {
        Tensor y = one;
        for (int i = 0; i < kChain; ++i) y = relu(y);
        y.backward();
        one.set_grad(Tensor());
      },
      budget / 5);
  profile.op_overhead_s = chain_s / (2 * kChain);
  sources["op_overhead_s"] =
      "a chain of 64 relu calls on one element, forward and backward, per call and pass "
      "(dispatch, allocation, autograd)";
}

// One op kind to fit: its name, the unit its rate is in ("flops" or "bytes"), the "sources" text
// and its shapes.
struct KindEntry {
  std::string kind, per, what;
  std::vector<KindCase> cases;
};

// Every kind's cases end with a tiny call, nearly all fixed cost: the fit's weights (1 / time^2)
// then pin the fixed cost per call to it. Without it two or three large cases set that cost by
// their noise alone (up to 100 us for cat in one calibration, 10 us in the next).
void add_kind(std::vector<KindEntry>& entries, const std::string& kind, const std::string& per,
              std::vector<KindCase> cases, const std::string& what) {
  entries.push_back(
      {kind, per, what + ", and a tiny call for the fixed cost per call", std::move(cases)});
}

KindCase conv_case(int64_t batch, int64_t in, int64_t out, int64_t size, int64_t kernel,
                   int64_t stride, int64_t groups, bool input_grad) {
  return pooled(
      [=] {
        Tensor x = randn({batch, in, size, size}).set_requires_grad(input_grad);
        Tensor w = randn({out, in / groups, kernel, kernel}).set_requires_grad(true);
        const int64_t pad = kernel / 2;
        std::function<Tensor()> forward = [=] {
          return conv2d(x, w, Tensor(), {stride, stride}, {pad, pad}, {1, 1}, groups);
        };
        return std::make_pair(forward, std::vector<Tensor>{x, w});
      },
      input_grad ? 2 : 1);
}

// ShuffleNet's 1x1 convolutions read one half of the channels of a block's input (a strided
// view, whose gradient is scattered back into the whole).
KindCase shuffle_case(int64_t batch, int64_t channels, int64_t size) {
  return pooled(
      [=] {
        Tensor x = randn({batch, 2 * channels, size, size}).set_requires_grad(true);
        Tensor w = randn({channels, channels, 1, 1}).set_requires_grad(true);
        std::function<Tensor()> forward = [=] { return conv2d(chunk(x, 2, 1)[1], w); };
        return std::make_pair(forward, std::vector<Tensor>{x, w});
      },
      2);
}

KindCase linear_case(int64_t tokens, int64_t in, int64_t out) {
  return pooled(
      [=] {
        Tensor x = randn({tokens, in}).set_requires_grad(true);
        Tensor w = (randn({out, in}) * 0.02).set_requires_grad(true);
        Tensor b = zeros({out}).set_requires_grad(true);
        std::function<Tensor()> forward = [=] { return linear(x, w, b); };
        return std::make_pair(forward, std::vector<Tensor>{x, w, b});
      },
      2);
}

// Activations at the scale of a freshly initialised network (std 0.3); gelu's cost depends on
// the values.
KindCase unary_case(const Shape& shape, std::function<Tensor(const Tensor&)> op) {
  return pooled(
      [=] {
        Tensor x = (randn(shape) * 0.3).set_requires_grad(true);
        std::function<Tensor()> forward = [=] { return op(x); };
        return std::make_pair(forward, std::vector<Tensor>{x});
      },
      1);
}

KindCase loss_case(int64_t rows, int64_t classes) {
  return pooled(
      [=] {
        Tensor logits = randn({rows, classes}).set_requires_grad(true);
        Tensor target = randint(0, classes, {rows});
        std::function<Tensor()> forward = [=] { return cross_entropy(logits, target); };
        return std::make_pair(forward, std::vector<Tensor>{logits});
      },
      1);
}

// cross_entropy over a vocabulary split as it runs (parallel::vocab_parallel_cross_entropy's
// element-wise ops and reductions), over a group of this rank alone so that only its own work is
// timed: priced by the bytes of the fused cross_entropy on the same logits, as the planner does.
KindCase vocab_loss_case(int64_t rows, int64_t classes, int64_t own_group) {
  KindCase result = pooled(
      [=] {
        Tensor logits = randn({rows, classes}).set_requires_grad(true);
        Tensor target = randint(0, classes, {rows});
        std::function<Tensor()> forward = [=] {
          return parallel::vocab_parallel_cross_entropy(logits, target, own_group);
        };
        return std::make_pair(forward, std::vector<Tensor>{logits});
      },
      1);
  result.work = [=] {
    Tensor logits = empty({rows, classes}, TensorOptions().device(Device::meta()));
    Tensor target = empty({rows}, TensorOptions(DType::kInt64).device(Device::meta()));
    return planner_work([=] { return cross_entropy(logits, target); }, "loss");
  };
  return result;
}

// Kinds priced by FLOPs: matrix products and convolutions.
void add_matrix_kinds(std::vector<KindEntry>& entries, bool quick, int64_t scale) {
  {
    const int64_t tokens = 1024 / scale;
    add_kind(entries, "gemm", "flops",
             {linear_case(tokens, 256, 256), linear_case(tokens, 256, 1024),
              linear_case(tokens, 1024, 256), linear_case(tokens, 256, 8192),
              linear_case(tokens / 8, 256, 256), linear_case(8, 16, 16)},
             "linear with bias, " + std::to_string(tokens) +
                 " tokens: 256 -> 256, 256 -> 1024, 1024 -> 256, 256 -> 8192, and 256 -> 256 "
                 "at 1/8 of the tokens");
  }
  {
    const int64_t batch = 4 / (quick ? 2 : 1), small = 8 / scale;
    add_kind(
        entries, "conv", "flops",
        {conv_case(batch, 3, 64, 128, 7, 2, 1, false), conv_case(batch, 64, 64, 32, 3, 1, 1, true),
         conv_case(batch, 256, 64, 32, 1, 1, 1, true), conv_case(batch, 256, 256, 8, 3, 1, 1, true),
         conv_case(batch, 1024, 256, 8, 1, 1, 1, true),
         conv_case(batch, 512, 512, 4, 3, 1, 1, true), shuffle_case(small, 58, 16),
         shuffle_case(small, 232, 4), shuffle_case(std::max<int64_t>(1, small / 2), 24, 8),
         conv_case(1, 8, 8, 4, 3, 1, 1, true)},
        "conv2d of ResNet-50 at 128x128 (7x7 stem; 3x3 and 1x1 at 32x32, 8x8, 4x4), "
        "batch " +
            std::to_string(batch) +
            ", and ShuffleNet's 1x1 58 -> 58 at 16x16 and 232 -> 232 at 4x4 on one half of a "
            "block's channels, batch " +
            std::to_string(small) + ", and x0.5's 24 -> 24 at 8x8, batch " +
            std::to_string(std::max<int64_t>(1, small / 2)));
  }
  {
    const int64_t batch = 8 / scale;
    add_kind(entries, "conv_grouped", "flops",
             {conv_case(batch, 24, 24, 32, 3, 2, 24, true),
              conv_case(batch, 116, 116, 16, 3, 1, 116, true),
              conv_case(batch, 232, 232, 8, 3, 1, 232, true),
              conv_case(batch, 464, 464, 4, 3, 1, 464, true),
              conv_case(std::max<int64_t>(1, batch / 2), 48, 48, 8, 3, 1, 48, true),
              conv_case(std::max<int64_t>(1, batch / 2), 192, 192, 2, 3, 1, 192, true),
              conv_case(1, 8, 8, 4, 3, 1, 8, true)},
             "depthwise conv2d 3x3 of ShuffleNet v2 at 128x128 (24 channels stride 2 at "
             "32x32, 116 at 16x16, 232 at 8x8, 464 at 4x4), batch " +
                 std::to_string(batch) +
                 ", and of ShuffleNet v2 x0.5 at 64x64 (48 at 8x8, 192 at 2x2), batch " +
                 std::to_string(std::max<int64_t>(1, batch / 2)));
  }
}

// Element-wise, normalisation, pooling, concatenation and loss ops are priced by bytes.
void add_bandwidth_kinds(std::vector<KindEntry>& entries, bool quick, int64_t scale) {
  const int64_t batch = 4 / (quick ? 2 : 1);
  auto relu_op = [](const Tensor& x) { return relu(x); };
  add_kind(entries, "elementwise", "bytes",
           {unary_case({batch, 256, 32, 32}, relu_op), unary_case({batch, 64, 64, 64}, relu_op),
            unary_case({batch, 512, 8, 8}, relu_op), unary_case({8, 58, 16, 16}, relu_op),
            unary_case({4, 24, 8, 8}, relu_op), unary_case({64}, relu_op)},
           "relu of ResNet-50 and ShuffleNet activations (x0.5's smallest too), priced by bytes");
  auto gelu_op = [](const Tensor& x) { return gelu(x); };
  add_kind(entries, "activation", "bytes",
           {unary_case({1024 / scale, 1024}, gelu_op), unary_case({128, 1024}, gelu_op),
            unary_case({64}, gelu_op)},
           "gelu of (1024, 1024) and (128, 1024), priced by bytes");
  auto batch_norm_op = [](const Tensor& x) {
    const int64_t channels = x.size(1);
    Tensor weight = ones({channels}), bias = zeros({channels});
    return batch_norm(x, weight, bias, zeros({channels}), ones({channels}), true);
  };
  add_kind(entries, "batch_norm", "bytes",
           {unary_case({batch, 256, 32, 32}, batch_norm_op),
            unary_case({batch, 64, 64, 64}, batch_norm_op),
            unary_case({batch, 512, 8, 8}, batch_norm_op),
            unary_case({8, 58, 16, 16}, batch_norm_op), unary_case({8, 232, 4, 4}, batch_norm_op),
            unary_case({4, 24, 8, 8}, batch_norm_op), unary_case({2, 8, 2, 2}, batch_norm_op)},
           "batch_norm (training) of ResNet-50 and ShuffleNet activations (x0.5's smallest too), "
           "priced by bytes");
  auto layer_norm_op = [](const Tensor& x) {
    return layer_norm(x, {256}, ones({256}), zeros({256}));
  };
  auto softmax_op = [](const Tensor& x) { return softmax(x, -1); };
  add_kind(entries, "layer_norm", "bytes",
           {unary_case({1024 / scale, 256}, layer_norm_op), unary_case({128, 256}, layer_norm_op),
            unary_case({1, 256}, layer_norm_op)},
           "layer_norm of (1024, 256) and (128, 256), priced by bytes");
  add_kind(entries, "softmax", "bytes",
           {unary_case({32 / scale, 128, 128}, softmax_op), unary_case({4, 128, 128}, softmax_op),
            unary_case({1, 8, 8}, softmax_op)},
           "softmax of (32, 128, 128) and (4, 128, 128), priced by bytes");
  auto pool_op = [](const Tensor& x) { return max_pool2d(x, {3, 3}, {2, 2}, {1, 1}); };
  add_kind(entries, "pool", "bytes",
           {unary_case({batch, 64, 64, 64}, pool_op), unary_case({8, 24, 64, 64}, pool_op),
            unary_case({1, 8, 4, 4}, pool_op)},
           "max_pool2d 3x3 stride 2 of (" + std::to_string(batch) +
               ", 64, 64, 64) and (8, 24, 64, 64), priced by bytes");
  auto concat_op = [](const Tensor& x) { return cat({x, x}, 1); };
  add_kind(entries, "concat", "bytes",
           {unary_case({8, 58, 16, 16}, concat_op), unary_case({8, 232, 4, 4}, concat_op),
            unary_case({1, 8, 2, 2}, concat_op)},
           "cat of (8, 58, 16, 16) and (8, 232, 4, 4) pairs along channels, priced by bytes");
  auto dropout_op = [](const Tensor& x) { return dropout(x, 0.1, true); };
  add_kind(entries, "dropout", "bytes",
           {unary_case({1024 / scale, 256}, dropout_op),
            unary_case({32 / scale, 64, 64}, dropout_op), unary_case({64}, dropout_op)},
           "dropout (p 0.1, training) of (" + std::to_string(1024 / scale) + ", 256) and (" +
               std::to_string(32 / scale) +
               ", 64, 64), priced by bytes: its random numbers cost more than an element-wise op's "
               "bytes");
  add_kind(entries, "loss", "bytes",
           {loss_case(512 / scale, 30522), loss_case(8, 1000), loss_case(2, 10)},
           "cross_entropy of (" + std::to_string(512 / scale) +
               ", 30522) and (8, 1000), priced by bytes");
  const int64_t own_group = parallel::register_tp_group(parallel::make_device_communicator(
      MPI_COMM_SELF, Device::cpu(), parallel::CommOptions().name("calibrate_own_rank")));
  add_kind(entries, planner::kVocabLossKind, "bytes",
           {vocab_loss_case(512 / scale, 15261, own_group), vocab_loss_case(8, 500, own_group),
            vocab_loss_case(2, 10, own_group)},
           "vocab_parallel_cross_entropy's ops (max, sub, exp, sum, log, the target's gather and "
           "their backward) over (" +
               std::to_string(512 / scale) +
               ", 15261) and (8, 500) logits (one rank's half of BERT's vocabulary), priced by the "
               "bytes of cross_entropy on them");
}

// Per-kind rates, forward and backward, over shapes of the model zoo's layers (ResNet-50 and
// ShuffleNet v2 at 128x128 images, BERT mini: 1024 tokens of 256 features), small and large:
// each kind's time is fitted as a fixed cost per call plus its work over a rate.
std::vector<KindEntry> op_kind_cases(bool quick, int64_t scale) {
  std::vector<KindEntry> entries;
  add_matrix_kinds(entries, quick, scale);
  add_bandwidth_kinds(entries, quick, scale);
  return entries;
}

// What fit_op_kind_rates found, for the printed summary and the "calibrated_layout" source.
struct OpKindTexts {
  std::string kinds, share;
  double wall_per_cpu = 1;  // rank 0's wall time over its CPU time in those rounds
  PassTimes network_unit;   // the network unit's times in the same rounds
};

// Fits one kind's rates from its cases' times (from `times[next]` on; `next` is advanced).
OpKindRate fit_kind(const KindEntry& entry, const std::vector<PassTimes>& times, size_t& next) {
  std::vector<double> work, backward_work, forward_s, backward_s;
  for (const KindCase& c : entry.cases) {
    const auto [flops, bytes] = c.work ? c.work() : planner_work(c.forward, entry.kind);
    const double units = entry.per == "bytes" ? bytes : flops;
    work.push_back(units);
    backward_work.push_back(c.backward_factor * units);
    forward_s.push_back(times[next].forward);
    backward_s.push_back(times[next].backward);
    ++next;
  }
  OpKindRate rate;
  rate.per = entry.per;
  std::tie(rate.forward_call_s, rate.forward) = fit_call_and_rate(work, forward_s);
  std::tie(rate.backward_call_s, rate.backward) = fit_call_and_rate(backward_work, backward_s);
  return rate;
}

// Times every case of every kind in shared rounds and fits each kind's rates into
// profile.op_kinds, and the ranks' skew into profile.rank_skew. `entries` is taken by value so
// that the cases' tensors are freed on return, before the next measurement.
// `network_unit` (measure_network_overhead's) is timed in the same rounds, last: the machine's
// pace, which moves from minute to minute on a shared one, is then the same for it and its ops.
OpKindTexts fit_op_kind_rates(std::vector<KindEntry> entries, const KindCase& network_unit,
                              DeviceProfile& profile, nlohmann::json& sources,
                              parallel::Communicator* world, double budget, bool quick, int ranks) {
  OpKindTexts texts;
  std::vector<KindCase> all;
  for (const KindEntry& entry : entries)
    for (const KindCase& c : entry.cases) all.push_back(c);
  all.push_back(network_unit);
  double wall_per_cpu = 1;
  const std::vector<PassTimes> times =
      time_in_rounds(all, quick ? 0.5 : 24 * budget, world, &profile.rank_skew, &wall_per_cpu);
  texts.network_unit = times.back();
  char share[160];
  std::snprintf(share, sizeof share,
                "; rank 0's wall time was %.2f x its CPU time over these rounds (the share of "
                "the cores it got), which every case's CPU time is scaled by",
                wall_per_cpu);
  texts.share = share;
  texts.wall_per_cpu = wall_per_cpu;
  sources["rank_skew"] =
      ranks > 1 ? "rounds of every op-kind case (step-sized work between two synchronisations) "
                  "took this much longer, synchronisation to synchronisation, than the average "
                  "rank's own work in them"
                : "one rank: no wait for other ranks";
  size_t next = 0;
  for (const KindEntry& entry : entries) {
    const OpKindRate rate = fit_kind(entry, times, next);
    profile.op_kinds[entry.kind] = rate;
    sources["op_kinds"][entry.kind] = entry.what;
    char line[200];
    std::snprintf(line, sizeof line, "%s %.3g/%.3g %s/s + %s/%s per call; ", entry.kind.c_str(),
                  rate.forward, rate.backward, entry.per == "bytes" ? "B" : "FLOP",
                  format_seconds(rate.forward_call_s).c_str(),
                  format_seconds(rate.backward_call_s).c_str());
    texts.kinds += line;
  }
  return texts;
}

// One op call at its local shapes, on random inputs (those needing a gradient are leaves).
KindCase shard_case(const ShardCall& call) {
  return pooled(
      [call] {
        std::vector<Tensor> inputs, leaves;
        for (size_t slot = 0; slot < call.input_shapes.size(); ++slot) {
          if (!call.input_shapes[slot]) {
            inputs.emplace_back();
            continue;
          }
          Tensor input = randn(*call.input_shapes[slot]) * 0.1;
          if (call.needs_gradient[slot]) input.set_requires_grad(true);
          inputs.push_back(input);
          leaves.push_back(input);  // (pooled counts their bytes)
        }
        const OpDef* def = call.def;
        const Attrs attrs = call.attrs;
        std::function<Tensor()> forward = [def, inputs, attrs] {
          return dispatch(*def, inputs, attrs)[0];
        };
        return std::make_pair(forward, leaves);
      },
      1);
}

// Every distinct local call of the --shapes_of models' convolutions and linear layers under the
// strategies the planner lists on `devices` devices, measured in shared rounds into
// profile.op_shapes (the planner prices those calls by them instead of their kind's rate).
void measure_op_shapes(DeviceProfile& profile, nlohmann::json& sources,
                       const CalibrateOptions& options, parallel::Communicator* world,
                       double budget, int ranks) {
  if (options.shape_models.empty()) return;
  PlannerConfig config;
  config.devices = options.devices > 0 ? options.devices : ranks;
  config.max_tp = config.devices;
  config.profile = profile;
  std::map<std::string, ShardCall> calls;   // by key: every rank lists them in the same order
  std::map<std::string, size_t> evictions;  // by key: the largest step bytes of its models
  for (const std::string& model : options.shape_models) {
    ModelSpec spec = options.spec;
    spec.name = model;
    const Graph graph = models::trace_model(spec);
    // What a device's step touches between two calls of one layer, about: every parameter with
    // its gradient and optimizer state, every activation with its gradient, over the devices.
    double step_bytes = 0;
    for (const TracedTensor& tensor : graph.tensors)
      step_bytes += static_cast<double>(tensor.bytes) * (tensor.is_parameter() ? 3 : 2);
    const auto eviction = static_cast<size_t>(step_bytes / config.devices);
    const auto strategies = enumerate_strategies(graph, config);
    for (size_t op = 0; op < graph.ops.size(); ++op)
      for (const Strategy& s : strategies[op])
        if (const auto call = shard_call(graph, graph.ops[op], s.dp, s.tp, s.kind)) {
          calls.emplace(call->key(), *call);
          size_t& bytes = evictions[call->key()];
          bytes = std::max(bytes, eviction);
        }
  }
  // In groups, whose pools of inputs are freed before the next group's are made.
  constexpr size_t kGroup = 12;
  std::vector<const ShardCall*> pending;
  auto measure = [&] {
    std::vector<KindCase> cases;
    std::vector<size_t> case_evictions;
    for (const ShardCall* call : pending) {
      cases.push_back(shard_case(*call));
      case_evictions.push_back(evictions.at(call->key()));
    }
    double unused_skew = 0;
    const std::vector<PassTimes> times = time_in_rounds(
        cases, options.quick ? 0.2 : 0.25 * budget * static_cast<double>(cases.size()), world,
        &unused_skew, nullptr, &case_evictions);
    for (size_t i = 0; i < pending.size(); ++i)
      profile.op_shapes[pending[i]->key()] = {times[i].forward, times[i].backward};
    pending.clear();
  };
  for (const auto& [key, call] : calls) {
    pending.push_back(&call);
    if (pending.size() == kGroup) measure();
  }
  if (!pending.empty()) measure();
  std::string models;
  for (const std::string& model : options.shape_models)
    models += (models.empty() ? "" : ", ") + model;
  sources["op_shapes"] =
      std::to_string(calls.size()) + " local calls of the convolutions and linear layers of " +
      models + " (global batch " + std::to_string(options.spec.batch) +
      ") under every strategy the planner lists on " + std::to_string(config.devices) +
      " devices, timed in shared rounds like op_kinds, each pass after writing as many bytes as "
      "a device's step touches (parameters with gradients and optimizer state, activations with "
      "gradients), as the rest of a step does between two calls of one layer";
  if (parallel::world_rank() == 0)
    std::printf("op shapes: %zu local calls of %s measured\n", calls.size(), models.c_str());
}

// A ShuffleNet v2 unit: many small ops with strided views and a channel shuffle.
KindCase shuffle_unit_case(int64_t batch, int64_t c, int64_t size) {
  return pooled(
      [=] {
        Tensor x = randn({batch, 2 * c, size, size}).set_requires_grad(true);
        std::vector<Tensor> leaves = {x};
        auto leaf = [&](Tensor t) {
          t.set_requires_grad(true);
          leaves.push_back(t);
          return t;
        };
        Tensor w1 = leaf(randn({c, c, 1, 1}) * 0.1), wd = leaf(randn({c, 1, 3, 3}) * 0.3);
        Tensor w2 = leaf(randn({c, c, 1, 1}) * 0.1);
        std::vector<Tensor> gamma, beta, mean, var;
        for (int i = 0; i < 3; ++i) {
          gamma.push_back(leaf(ones({c})));
          beta.push_back(leaf(zeros({c})));
          mean.push_back(zeros({c}));
          var.push_back(ones({c}));
        }
        std::function<Tensor()> forward = [=] {
          const std::vector<Tensor> halves = chunk(x, 2, 1);
          Tensor y =
              relu(batch_norm(conv2d(halves[1], w1), gamma[0], beta[0], mean[0], var[0], true));
          y = batch_norm(conv2d(y, wd, Tensor(), {1, 1}, {1, 1}, {1, 1}, c), gamma[1], beta[1],
                         mean[1], var[1], true);
          y = relu(batch_norm(conv2d(y, w2), gamma[2], beta[2], mean[2], var[2], true));
          Tensor both = cat({halves[0], y}, 1);
          return reshape(transpose(reshape(both, {batch, 2, c, size, size}), 1, 2),
                         {batch, 2 * c, size, size});
        };
        return std::make_pair(forward, leaves);
      },
      1);
}

// What ops cost inside a network beyond their kinds' rates (dispatch, autograd's records and
// engine, allocation, gradients scattered into views): a ShuffleNet v2 unit, forward and backward
// against its ops priced with the op_kinds rates (`measured` in the same rounds as the op-kind
// cases); the rest, per op and pass, is op_overhead_s (if above the bare dispatch cost).
void measure_network_overhead(DeviceProfile& profile, nlohmann::json& sources, const KindCase& unit,
                              const PassTimes& measured, int64_t batch) {
  const Graph graph = trace_graph([&] { unit.forward(); }, {}, {}, 1);
  double priced = 0;
  int passes = 0;
  for (const TracedOp& op : graph.ops) {
    const std::string kind = op_kind(op);
    const bool matrix = kind == "gemm" || kind == "conv" || kind == "conv_grouped";
    priced += profile.op_time(kind, op.flops, op.bytes, false);
    ++passes;
    if (op.differentiable) {
      priced += profile.op_time(kind, op.flops, op.bytes, true, matrix ? 2.0 : 1.0);
      ++passes;
    }
  }
  const double extra = (measured.forward + measured.backward - priced) / std::max(1, passes);
  char line[200];
  std::snprintf(line, sizeof line,
                "; a ShuffleNet v2 unit (24 + 24 channels at 8x8, batch %lld) took %s "
                "forward and backward against %s priced by op_kinds over %d op passes",
                static_cast<long long>(batch),
                format_seconds(measured.forward + measured.backward).c_str(),
                format_seconds(priced).c_str(), passes);
  if (extra > profile.op_overhead_s) {
    profile.op_overhead_s = extra;
    sources["op_overhead_s"] = sources["op_overhead_s"].get<std::string>() + line +
                               ": op_overhead_s is the difference per op pass";
  } else {
    sources["op_overhead_s"] =
        sources["op_overhead_s"].get<std::string>() + line + ": nothing left over";
  }
}

// Median time of one optimizer step, over steps taken until twice `budget` has passed (at least
// 20, at most 200: a slow spell of the machine a few steps long would otherwise set the median);
// with `world`, the slowest rank's.
double optimizer_step_seconds(optim::Optimizer& optimizer, parallel::Communicator* world,
                              double budget) {
  optimizer.step();
  std::vector<double> times;
  double spent = 0;
  for (int rep = 0; rep < 200; ++rep) {
    // Every rank runs the same number of steps (each rank's own time would differ): the
    // ranks agree whether to go on, which also starts them together.
    int more = rep < 20 || spent < 2 * budget;
    if (world) {
      Tensor flag = tensor({static_cast<float>(more)}, {1});
      world->all_reduce(flag, parallel::ReduceOp::kMax);
      more = flag.item<float>() > 0;
    }
    if (!more) break;
    const auto start = Clock::now();
    optimizer.step();
    times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    spent += times.back();
  }
  std::sort(times.begin(), times.end());
  double seconds = times[times.size() / 2];
  if (world) {
    Tensor slowest = tensor({static_cast<float>(seconds)}, {1});
    world->all_reduce(slowest, parallel::ReduceOp::kMax);
    seconds = slowest.item<float>();
  }
  return seconds;
}

// Optimizer updates, in parameters per second: one step over 12 weights of 1M elements (more
// than the last-level cache, as a model's parameters are).
void measure_optimizer_updates(DeviceProfile& profile, nlohmann::json& sources,
                               parallel::Communicator* world, double budget, int64_t scale) {
  for (const OpHandle* update : {&ops::sgd_update, &ops::adam_update}) {
    const char* kind = update->name();
    std::vector<Tensor> weights;
    int64_t elements = 0;
    for (int i = 0; i < 12; ++i) {
      Tensor weight = randn({1024, 1024 / scale}).set_requires_grad(true);
      weight.set_grad(randn({1024, 1024 / scale}));
      elements += weight.numel();
      weights.push_back(weight);
    }
    std::unique_ptr<optim::Optimizer> optimizer;
    if (update == &ops::sgd_update)
      optimizer = std::make_unique<optim::SGD>(weights, optim::SGDOptions(0.01).momentum(0.9));
    else
      optimizer = std::make_unique<optim::AdamW>(weights, optim::AdamWOptions(1e-4));
    const double seconds = optimizer_step_seconds(*optimizer, world, budget);
    OpKindRate rate;
    rate.per = "parameters";
    rate.forward = rate.backward = static_cast<double>(elements) / seconds;
    profile.op_kinds[kind] = rate;
    sources["op_kinds"][kind] =
        std::string(update == &ops::sgd_update ? "SGD with momentum" : "AdamW") +
        " step over 12 parameters, " + std::to_string(elements) +
        " elements in all, in parameters per second";
  }
}

// The layout the rates were measured under, and the memory each rank may use.
void describe_layout_and_memory(DeviceProfile& profile, nlohmann::json& sources, int ranks,
                                const std::string& share_text) {
  profile.calibrated_ranks = ranks > 1 ? parallel::local_rank_count() : 1;
  profile.calibrated_threads = get_num_threads();
  sources["calibrated_layout"] =
      std::to_string(profile.calibrated_ranks) + " rank(s) on this node measuring at once, " +
      std::to_string(get_num_threads()) +
      " thread(s) each: the op_kinds rates are per-rank throughput under that layout (the "
      "ranks' mean of the middle half of interleaved rounds, in CPU time scaled by the share of "
      "the cores the rank got)" +
      share_text;

  const long pages = ::sysconf(_SC_PHYS_PAGES), page_size = ::sysconf(_SC_PAGE_SIZE);
  profile.memory_per_device =
      static_cast<double>(pages) * static_cast<double>(page_size) / std::max(1, ranks);
  sources["memory_per_device"] = "physical memory of this machine divided by the ranks";
}

// Collective alpha-beta costs over `world` when there is more than one rank; otherwise the base
// profile's are kept, and "sources" says so.
void measure_collectives(DeviceProfile& profile, nlohmann::json& sources,
                         parallel::Communicator* world, int ranks, double wall_per_cpu,
                         bool quick) {
  if (ranks <= 1) {
    profile.devices_per_node = 1;
    sources["collectives"] = "not measured (one rank): copied from profile '" + profile.name +
                             "'; run under mpirun -np N to measure them";
    return;
  }
  const int local = parallel::local_rank_count();
  profile.devices_per_node = local;
  const LinkLevel level = local == ranks ? LinkLevel::kIntraNode : LinkLevel::kInterNode;
  const int64_t large = quick ? (1 << 18) : (1 << 22);
  std::string text, waits;
  std::tie(profile.sync_jitter, profile.sync_exponent) =
      synchronisation_waits(*world, wall_per_cpu, quick, &waits);
  for (Collective collective :
       {Collective::kAllReduce, Collective::kAllGather, Collective::kReduceScatter}) {
    const CollectiveFit fit = fit_collective(*world, collective, large);
    profile.collectives[static_cast<int>(level)][static_cast<int>(collective)] = fit.cost;
    if (local == ranks)  // one node: no inter-node link to measure; the same numbers stand in
      profile.collectives[1][static_cast<int>(collective)] = fit.cost;
    text += std::string(collective_name(collective)) + " small " + format_seconds(fit.small_s) +
            ", " + std::to_string(large * 4 >> 20) + " MiB " + format_seconds(fit.large_s) + "; ";
  }
  std::string turns;
  profile.collective_turn_s = collective_turns(*world, profile, quick, &turns);
  sources["collective_turn_s"] =
      "beyond a one-element all_reduce after the same work (two 256 x 256 matmuls), what "
      "collectives took (medians of 200) over what their alpha and bandwidth price (" +
      turns + "the mean over the ranks), per ring step (least squares)";
  sources["sync_jitter"] =
      "the mean wait in a one-element all_reduce beyond a rank's own compute, both as the op rates "
      "count time: CPU time times the rank's share of the cores (" +
      waits + "over the ranks), fitted as sync_jitter * compute^sync_exponent";
  sources["collectives"] = "MpiCommunicator over " + std::to_string(ranks) + " ranks (" +
                           std::to_string(local) + " on this node): " + text +
                           (local == ranks ? "inter_node copies intra_node (one node)" : "");
}

// Renames the profile to `name` and stores `sources` in it; returns the base profile's name.
std::string describe_sources(DeviceProfile& profile, nlohmann::json& sources,
                             const std::string& name, const std::string& host) {
  sources["remat_overhead_k"] = "not measured: copied from profile '" + profile.name + "'";
  const std::string base_name = profile.name;
  profile.name = name;
  profile.description = "measured on " + host + " by //tools/calibrate";
  sources["base_profile"] = base_name;
  profile.sources_json = sources.dump();
  return base_name;
}

void print_summary(const DeviceProfile& profile, int ranks, const std::string& base_name,
                   const std::string& kinds_text, const std::string& out_path) {
  std::printf("gemm %.1f GFLOP/s, conv %.1f GFLOP/s, memory bandwidth %.1f GB/s, op overhead %s\n",
              profile.gemm_flops / 1e9, profile.conv_flops / 1e9, profile.memory_bandwidth / 1e9,
              format_seconds(profile.op_overhead_s).c_str());
  std::printf("op kinds (forward/backward, %s): %s\n", profile.layout_description().c_str(),
              kinds_text.c_str());
  if (ranks > 1) {
    const LinkLevel level = profile.level_for(ranks);
    for (Collective collective :
         {Collective::kAllReduce, Collective::kAllGather, Collective::kReduceScatter}) {
      const AlphaBeta& cost = profile.link(collective, level);
      std::printf("%s (%s): alpha %s, bus bandwidth %.2f GB/s\n", collective_name(collective),
                  link_level_name(level), format_seconds(cost.alpha_s).c_str(),
                  cost.bus_bandwidth / 1e9);
    }
    std::printf("collectives after work: %s more per ring step\n",
                format_seconds(profile.collective_turn_s).c_str());
  } else {
    std::printf("collectives: one rank, copied from %s (run under mpirun -np N to measure)\n",
                base_name.c_str());
  }
  std::printf("wrote %s\n", out_path.c_str());
}

// The measurements run in a fixed order: under mpirun the ranks synchronise inside several of
// them, so every rank must reach each in the same sequence.
int calibrate(int argc, char** argv) {
  CalibrateOptions options;
  if (const std::optional<int> exit_code = parse_options(argc, argv, options)) return *exit_code;
  const int rank = parallel::world_rank(), ranks = parallel::world_size();
  if (options.threads > 0) set_num_threads(options.threads);
  const bool quick = options.quick;
  const double budget = quick ? 0.05 : 0.5;
  DeviceProfile profile = load_profile(find_profile(options.base));
  nlohmann::json sources = nlohmann::json::object();
  const std::string host = host_name();
  sources["measured"] = measured_text(host, ranks);

  measure_gemm(profile, sources, budget, quick);
  measure_conv(profile, sources, budget, quick);
  measure_elementwise_and_overhead(profile, sources, budget, quick);
  std::shared_ptr<parallel::Communicator> world;
  if (ranks > 1) {
    world = parallel::MpiCommunicator::world(parallel::CommOptions().name("calibrate"));
    world->barrier();
  }
  const int64_t scale = quick ? 4 : 1;  // --quick: smaller batches
  // The unit at ShuffleNet v2 x0.5's size, batch 8 over two devices: the overhead per op pass
  // matters where ops are small, and a larger unit's residual grows with its work instead.
  const int64_t unit_batch = std::max<int64_t>(1, 4 / scale);
  const KindCase unit = shuffle_unit_case(unit_batch, 24, 8);
  const OpKindTexts texts = fit_op_kind_rates(op_kind_cases(quick, scale), unit, profile, sources,
                                              world.get(), budget, quick, ranks);
  measure_op_shapes(profile, sources, options, world.get(), budget, ranks);
  measure_network_overhead(profile, sources, unit, texts.network_unit, unit_batch);
  measure_optimizer_updates(profile, sources, world.get(), budget, scale);
  describe_layout_and_memory(profile, sources, ranks, texts.share);
  measure_collectives(profile, sources, world.get(), ranks, texts.wall_per_cpu, quick);
  const std::string base_name = describe_sources(profile, sources, options.name, host);

  if (rank == 0) {
    save_profile(profile, user_path(options.out_path));
    print_summary(profile, ranks, base_name, texts.kinds, options.out_path);
  }
  return 0;
}

}  // namespace
}  // namespace tessel::planner

int main(int argc, char** argv) {
  return tessel::parallel::run_ranks(argc, argv, [](int count, char** values) {
    return tessel::planner::calibrate(count, values);
  });
}
