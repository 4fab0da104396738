// Measures a device profile on this machine and writes it as JSON for the planner:
//   bazel run //parallel/planner:calibrate -- --out=/tmp/this_machine.json
//   mpirun -np 2 bazel-bin/parallel/planner/calibrate --out=/tmp/two_ranks.json  (collectives)
// GEMM and convolution throughput and element-wise bandwidth come from Tessel's own CPU kernels.
// Collective alpha-beta costs are measured with the MPI communicator when started with more than
// one rank; otherwise they are copied from --base and the file says so in "sources".
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/op.h"
#include "core/parallel.h"
#include "ops/ops.h"
#include "parallel/launch.h"
#include "parallel/mpi_communicator.h"
#include "parallel/planner/cost_model.h"
#include "parallel/planner/plan_cli.h"

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
void into(const char* name, const std::vector<Tensor>& inputs, const Attrs& attrs,
          const Tensor& out) {
  dispatch(OpRegistry::get().find(name), inputs, attrs, {out});
}

struct CollectiveFit {
  AlphaBeta cost;
  double small_s = 0, large_s = 0;
};

// alpha from a tiny message, bandwidth from a large one: t = steps * alpha + moved / bandwidth.
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

int calibrate(int argc, char** argv) {
  CLI::App app("Measures a device profile for the planner on this machine and writes it as JSON.",
               "calibrate");
  std::string out_path, name = "calibrated", base = "cpu_2core_example";
  int threads = 0;
  bool quick = false;
  app.add_option("--out", out_path, "write the profile here")->required();
  app.add_option("--name", name, "profile name")->capture_default_str();
  app.add_option("--base", base,
                 "profile whose numbers are kept for what cannot be measured here (collectives "
                 "with one rank, remat_overhead_k)")
      ->capture_default_str();
  app.add_option("--threads", threads, "intra-op threads; 0: every core")->capture_default_str();
  app.add_flag("--quick", quick, "smaller sizes and shorter runs (for tests)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error);
  }
  const int rank = parallel::world_rank(), ranks = parallel::world_size();
  if (threads > 0) set_num_threads(threads);
  const double budget = quick ? 0.05 : 0.5;
  DeviceProfile profile = load_profile(find_profile(base));
  nlohmann::json sources = nlohmann::json::object();

  char host[256] = "unknown";
  ::gethostname(host, sizeof host - 1);
  std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  sources["measured"] = std::string("calibrate on ") + host + ", " + date + ", " +
                        std::to_string(get_num_threads()) + " threads per rank, " +
                        std::to_string(ranks) + " rank(s); best of repeated runs";

  // GEMM: (n x n) @ (n x n), 2 n^3 FLOPs.
  const int64_t n = quick ? 256 : 1024;
  {
    Tensor a = randn({n, n}), b = randn({n, n}), c = empty({n, n});
    const double seconds = best_time([&] { into("matmul", {a, b}, {}, c); }, budget);
    profile.gemm_flops = 2.0 * n * n * n / seconds;
    sources["gemm"] = "matmul " + std::to_string(n) +
                      "^3 f32 on Tessel's CPU kernels, into a preallocated output";
  }
  // Convolution: ResNet's 3x3, 64 -> 64 channels at 56x56 (smaller with --quick).
  {
    const int64_t batch = quick ? 1 : 4, channels = 64, size = quick ? 28 : 56;
    Tensor x = randn({batch, channels, size, size}), w = randn({channels, channels, 3, 3});
    Tensor y = empty({batch, channels, size, size});
    const Attrs attrs{{"stride", std::vector<int64_t>{1, 1}},
                      {"padding", std::vector<int64_t>{1, 1}},
                      {"dilation", std::vector<int64_t>{1, 1}},
                      {"groups", int64_t{1}}};
    const double seconds = best_time([&] { into("conv2d", {x, w, Tensor()}, attrs, y); }, budget);
    profile.conv_flops = 2.0 * batch * channels * size * size * channels * 9 / seconds;
    sources["conv"] = "conv2d 3x3, 64 -> 64 channels, " + std::to_string(size) + "x" +
                      std::to_string(size) + ", batch " + std::to_string(batch) + ", f32";
  }
  // Element-wise: a + b over 16M floats reads 8 and writes 4 bytes per element.
  {
    const int64_t elements = quick ? (1 << 20) : (1 << 24);
    Tensor a = randn({elements}), b = randn({elements}), c = empty({elements});
    const double seconds = best_time([&] { into("add", {a, b}, {}, c); }, budget);
    profile.memory_bandwidth = 12.0 * elements / seconds;
    profile.elementwise_flops = elements / seconds;
    sources["memory_bandwidth"] =
        "add of two " + std::to_string(elements) + "-element f32 tensors (12 bytes per element)";
    Tensor one = randn({1});
    profile.op_overhead_s = best_time([&] { add(one, one); }, budget / 5);  // with allocation
    sources["op_overhead_s"] = "add of two one-element tensors (dispatch cost)";
  }
  const long pages = ::sysconf(_SC_PHYS_PAGES), page_size = ::sysconf(_SC_PAGE_SIZE);
  profile.memory_per_device =
      static_cast<double>(pages) * static_cast<double>(page_size) / std::max(1, ranks);
  sources["memory_per_device"] = "physical memory of this machine divided by the ranks";

  if (ranks > 1) {
    auto world = parallel::MpiCommunicator::world(parallel::CommOptions().name("calibrate"));
    const int local = parallel::local_rank_count();
    profile.devices_per_node = local;
    const LinkLevel level = local == ranks ? LinkLevel::kIntraNode : LinkLevel::kInterNode;
    const int64_t large = quick ? (1 << 18) : (1 << 22);
    std::string text;
    for (Collective collective :
         {Collective::kAllReduce, Collective::kAllGather, Collective::kReduceScatter}) {
      CollectiveFit fit = fit_collective(*world, collective, large);
      profile.collectives[static_cast<int>(level)][static_cast<int>(collective)] = fit.cost;
      if (local == ranks)  // one node: no inter-node link to measure; the same numbers stand in
        profile.collectives[1][static_cast<int>(collective)] = fit.cost;
      text += std::string(collective_name(collective)) + " small " + format_seconds(fit.small_s) +
              ", " + std::to_string(large * 4 >> 20) + " MiB " + format_seconds(fit.large_s) + "; ";
    }
    sources["collectives"] = "MpiCommunicator over " + std::to_string(ranks) + " ranks (" +
                             std::to_string(local) + " on this node): " + text +
                             (local == ranks ? "inter_node copies intra_node (one node)" : "");
  } else {
    profile.devices_per_node = 1;
    sources["collectives"] = "not measured (one rank): copied from profile '" + profile.name +
                             "'; run under mpirun -np N to measure them";
  }
  sources["remat_overhead_k"] = "not measured: copied from profile '" + profile.name + "'";
  const std::string base_name = profile.name;
  profile.name = name;
  profile.description = "measured on " + std::string(host) + " by //parallel/planner:calibrate";
  sources["base_profile"] = base_name;
  profile.sources_json = sources.dump();

  if (rank == 0) {
    save_profile(profile, user_path(out_path));
    std::printf(
        "gemm %.1f GFLOP/s, conv %.1f GFLOP/s, memory bandwidth %.1f GB/s, op overhead %s\n",
        profile.gemm_flops / 1e9, profile.conv_flops / 1e9, profile.memory_bandwidth / 1e9,
        format_seconds(profile.op_overhead_s).c_str());
    if (ranks > 1) {
      const LinkLevel level = profile.level_for(ranks);
      for (Collective collective :
           {Collective::kAllReduce, Collective::kAllGather, Collective::kReduceScatter}) {
        const AlphaBeta& cost = profile.link(collective, level);
        std::printf("%s (%s): alpha %s, bus bandwidth %.2f GB/s\n", collective_name(collective),
                    link_level_name(level), format_seconds(cost.alpha_s).c_str(),
                    cost.bus_bandwidth / 1e9);
      }
    } else {
      std::printf("collectives: one rank, copied from %s (run under mpirun -np N to measure)\n",
                  base_name.c_str());
    }
    std::printf("wrote %s\n", out_path.c_str());
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
