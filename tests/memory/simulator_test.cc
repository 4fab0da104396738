// The memory simulator: training steps on the meta device against a modelled device take the
// modelled time, run the memory layer's policies on virtual memory, give the same result every
// time, and take the same decisions as a real CPU run given the same costs.
#include "memory/sim/simulator.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "memory/memory.h"
#include "models/resnet.h"
#include "nn/nn.h"
#include "ops/ops.h"
#include "optim/sgd.h"
#include "parallel/planner/cost_model.h"
#include "tests/testing.h"

namespace tessel::memory::sim {
namespace {

using testing::throws_error;

constexpr size_t kMiB = 1024 * 1024;

// A small device: slow enough that the MLP below takes milliseconds, with a host link that makes
// swapping a 256 KiB activation cost about as much as recomputing it.
planner::DeviceProfile small_profile() {
  planner::DeviceProfile profile;
  profile.name = "test_device";
  profile.gemm_flops = 1e11;
  profile.conv_flops = 1e11;
  profile.elementwise_flops = 1e10;
  profile.memory_bandwidth = 1e10;
  profile.op_overhead_s = 5e-6;
  profile.host_link_bandwidth = 2e9;
  return profile;
}

SimulatedDevice small_device() { return planner::simulated_device(small_profile()); }

std::shared_ptr<nn::Module> make_mlp() {
  auto net = std::make_shared<nn::Sequential>();
  net->push_back(std::make_shared<nn::Linear>(64, 128));
  for (int layer = 0; layer < 8; ++layer) {
    net->push_back(std::make_shared<nn::ReLU>());
    net->push_back(std::make_shared<nn::Linear>(128, 128));
  }
  net->push_back(std::make_shared<nn::ReLU>());
  net->push_back(std::make_shared<nn::Linear>(128, 10));
  return net;
}

struct Decision {
  std::string kind;
  size_t bytes;
  bool operator==(const Decision& other) const {
    return kind == other.kind && bytes == other.bytes;
  }
};
void PrintTo(const Decision& decision, std::ostream* out) {
  *out << decision.kind << " " << decision.bytes;
}

struct TrainingRun {
  size_t peak = 0;
  size_t fixed = 0;
  PolicyCounters policy;
  std::vector<Decision> decisions;  // evictions, recomputes, swaps, splits in order
  std::vector<TimelineEvent> timeline;
};

// Three SGD steps of the MLP on `options.device()` under `options`; the model is made inside the
// scope (its parameters count against the budget), on the CPU and moved to meta when simulating.
TrainingRun train(const MemoryOptions& options) {
  TrainingRun run;
  MemoryScope scope(options);
  const Device device = options.device();
  manual_seed(7);
  auto model = make_mlp();
  if (device.is_meta()) model->to(device);
  optim::SGD sgd(model->parameters(), optim::SGDOptions(0.05).momentum(0.9));
  run.fixed = fixed_memory_bytes(model->parameters(), 1);
  for (int step = 0; step < 3; ++step) {
    manual_seed(100 + step);
    Tensor input = randn({512, 64}, TensorOptions().device(device));
    Tensor labels = randint(0, 10, {512}, TensorOptions(DType::kInt64).device(device));
    sgd.zero_grad();
    cross_entropy(model->forward(input), labels).backward();
    sgd.step();
  }
  run.peak = static_cast<size_t>(scope.allocator().memory_stats().base.peak_allocated_bytes);
  run.policy = scope.allocator().policy_counters();
  run.timeline = scope.allocator().timeline();
  for (const auto& event : run.timeline)
    if (event.kind == "evict" || event.kind == "recompute" || event.kind == "swap_out" ||
        event.kind == "swap_in" || event.kind == "split")
      run.decisions.push_back({event.kind, event.bytes});
  return run;
}

MemoryOptions on_meta(Policy policy, size_t budget) {
  return MemoryOptions().device(Device::meta()).policy(policy).budget(budget);
}

TEST(MemorySimulation, AStepTakesTheModelledTimeOfItsOps) {
  Simulation simulation(small_device());
  TrainingRun run = train(on_meta(Policy::kNone, 0));
  SimulationCounters counters = simulation.counters();
  EXPECT_GT(counters.ops, 50);
  EXPECT_GT(counters.compute_seconds, 1e-3);
  EXPECT_EQ(counters.stall_seconds, 0.0);
  // Nothing else moves the clock without a policy.
  EXPECT_DOUBLE_EQ(simulation.now(), counters.compute_seconds + counters.device_copy_seconds);
  EXPECT_GT(run.peak, 2 * kMiB);
  EXPECT_TRUE(run.decisions.empty());
}

TEST(MemorySimulation, PeakEqualsTheCpuRunOfTheSameProgram) {
  TrainingRun cpu = train(MemoryOptions().policy(Policy::kNone));
  Simulation simulation(small_device());
  TrainingRun meta = train(on_meta(Policy::kNone, 0));
  EXPECT_EQ(meta.peak, cpu.peak);
  EXPECT_EQ(meta.fixed, cpu.fixed);
}

TEST(MemorySimulation, TheSameProgramGivesTheSameResultEveryTime) {
  auto simulate = [](Policy policy) {
    Simulation simulation(small_device());
    TrainingRun unconstrained = train(on_meta(Policy::kNone, 0));
    const size_t budget = unconstrained.fixed + (unconstrained.peak - unconstrained.fixed) / 2;
    const double start = simulation.now();
    TrainingRun run = train(on_meta(policy, budget));
    return std::make_pair(simulation.now() - start, run);
  };
  for (Policy policy : {Policy::kDtr, Policy::kSwap, Policy::kAuto}) {
    SCOPED_TRACE(policy_name(policy));
    auto [seconds, run] = simulate(policy);
    auto [seconds_again, run_again] = simulate(policy);
    EXPECT_FALSE(run.decisions.empty());
    EXPECT_EQ(seconds, seconds_again);  // bit for bit
    EXPECT_EQ(run.decisions, run_again.decisions);
    ASSERT_EQ(run.timeline.size(), run_again.timeline.size());
    for (size_t i = 0; i < run.timeline.size(); ++i) {
      EXPECT_EQ(run.timeline[i].kind, run_again.timeline[i].kind) << "event " << i;
      EXPECT_EQ(run.timeline[i].bytes, run_again.timeline[i].bytes) << "event " << i;
      EXPECT_EQ(run.timeline[i].allocated_after, run_again.timeline[i].allocated_after);
    }
  }
}

TEST(MemorySimulation, SwapsOccupyTheHostLinkAndStallOnlyWhenTheyMust) {
  Simulation simulation(small_device());
  TrainingRun unconstrained = train(on_meta(Policy::kNone, 0));
  const double unconstrained_seconds = simulation.now();
  const size_t budget = unconstrained.fixed + (unconstrained.peak - unconstrained.fixed) / 2;
  simulation.reset_counters();
  const double start = simulation.now();
  TrainingRun run =
      train(on_meta(Policy::kSwap, budget).host_bandwidth(simulation.host_bandwidth()));
  const SimulationCounters counters = simulation.counters();
  ASSERT_GT(run.policy.swaps_out, 0);
  EXPECT_GT(run.policy.swaps_in, 0);
  EXPECT_LE(run.peak, budget);
  // The compute stream's time is its ops plus the waits for copies, nothing more.
  EXPECT_NEAR(simulation.now() - start,
              counters.compute_seconds + counters.stall_seconds + counters.device_copy_seconds,
              1e-12);
  EXPECT_EQ(counters.compute_seconds, unconstrained_seconds);  // swaps recompute nothing
  const double link_seconds =
      static_cast<double>(run.policy.swapped_out_bytes + run.policy.swapped_in_bytes) /
      simulation.host_bandwidth();
  // Copies overlap compute: the step is slower by less than the link's whole busy time.
  EXPECT_GT(counters.stall_seconds, 0.0);
  EXPECT_LT(counters.stall_seconds, link_seconds);
}

// The simulated seconds of each of `steps` SGD steps of the MLP under `options` on meta, and
// the residency manager's statistics after them.
std::vector<double> step_seconds(const Simulation& simulation, const MemoryOptions& options,
                                 int steps, ResidencyStats* stats) {
  MemoryScope scope(options);
  manual_seed(7);
  auto model = make_mlp();
  model->to(Device::meta());
  optim::SGD sgd(model->parameters(), optim::SGDOptions(0.05).momentum(0.9));
  std::vector<double> seconds;
  for (int step = 0; step < steps; ++step) {
    const double start = simulation.now();
    Tensor input = randn({512, 64}, TensorOptions().device(Device::meta()));
    Tensor labels = randint(0, 10, {512}, TensorOptions(DType::kInt64).device(Device::meta()));
    sgd.zero_grad();
    cross_entropy(model->forward(input), labels).backward();
    sgd.step();
    seconds.push_back(simulation.now() - start);
  }
  if (stats && scope.manager()) *stats = scope.manager()->stats();
  return seconds;
}

TEST(MemorySimulation, AutoKeepsTheFastestOfItsWays) {
  // A link so slow that every swap stalls the step, and one so fast that swaps cost nothing.
  for (double bandwidth : {2e7, 1e13}) {
    SCOPED_TRACE("host link " + std::to_string(bandwidth) + " B/s");
    planner::DeviceProfile profile = small_profile();
    profile.host_link_bandwidth = bandwidth;
    Simulation simulation(planner::simulated_device(profile));
    const TrainingRun unconstrained = train(on_meta(Policy::kNone, 0));
    const size_t budget = unconstrained.fixed + (unconstrained.peak - unconstrained.fixed) / 2;
    std::map<Policy, double> last_step;
    ResidencyStats auto_stats;
    for (Policy policy : {Policy::kDtr, Policy::kSwap, Policy::kAuto}) {
      SCOPED_TRACE(policy_name(policy));
      const std::vector<double> seconds =
          step_seconds(simulation, on_meta(policy, budget).host_bandwidth(bandwidth), 80,
                       policy == Policy::kAuto ? &auto_stats : nullptr);
      last_step[policy] = seconds.back();
    }
    EXPECT_FALSE(auto_stats.auto_tuning);
    if (bandwidth < 1e9) {  // whichever way it keeps (mixed too, settled), it recomputes
      EXPECT_GT(auto_stats.policy.recomputes, 0);
    } else {  // every tensor is cheaper to swap: both ways swap
      EXPECT_GT(auto_stats.policy.swaps_out, 0);
    }
    // Within 2% of the better single policy, after trying its five ways.
    EXPECT_LE(last_step[Policy::kAuto],
              1.02 * std::min(last_step[Policy::kDtr], last_step[Policy::kSwap]));
  }
}

TEST(MemorySimulation, AutoTrainsWhereDtrRunsOutOfMemory) {
  // ResNet-152 at batch 128 within 8% of its peak on the H200 profile: dtr runs out of memory
  // (recomputing a tensor deep in a residual stage pins the inputs it finds until their consumer
  // has run), and auto, whose third way recomputes as dtr does, swaps where nothing else frees
  // room: it trains through the trials of its five ways and stays within the budget. (At 22%
  // dtr trains since batch norm's input gradient is written over its input, at 18% since
  // outputs read only by backward, such as pooling's indices, are candidates, and at 16-10%
  // since a recompute remakes its inputs' larger chains first.)
  Simulation simulation(
      planner::simulated_device(planner::load_profile("parallel/profiles/h200_cluster.json")));
  auto run_steps = [](const MemoryOptions& options, int steps) {
    MemoryScope scope(options);
    manual_seed(1);
    auto model = models::make_resnet("resnet152", models::ResNetOptions().num_classes(1000));
    model->to(Device::meta());
    optim::SGD sgd(model->parameters(), optim::SGDOptions(0.1).momentum(0.9));
    const TensorOptions on_meta = TensorOptions().device(Device::meta());
    for (int step = 0; step < steps; ++step) {
      sgd.zero_grad();
      cross_entropy(model->forward(empty({128, 3, 224, 224}, on_meta)),
                    empty({128}, TensorOptions(on_meta).dtype(DType::kInt64)))
          .backward();
      sgd.step();
    }
    return static_cast<size_t>(scope.allocator().memory_stats().base.peak_allocated_bytes);
  };
  const size_t peak = run_steps(MemoryOptions().device(Device::meta()), 2);
  const size_t budget = peak * 8 / 100;
  EXPECT_THROW(run_steps(on_meta(Policy::kDtr, budget), 8), OutOfMemory);
  EXPECT_LE(run_steps(on_meta(Policy::kAuto, budget), 45), budget);
}

TEST(MemorySimulation, DtrDecidesAsACpuRunGivenTheSameCosts) {
  const SimulatedDevice device = small_device();
  TrainingRun unconstrained = train(MemoryOptions().policy(Policy::kNone));
  const size_t budget = unconstrained.fixed + (unconstrained.peak - unconstrained.fixed) / 2;
  MemoryOptions options = MemoryOptions().policy(Policy::kDtr).budget(budget);
  options.residency().cost_model(device.op_seconds);
  TrainingRun cpu = train(options);
  Simulation simulation(device, MemoryLayout::kArena);
  TrainingRun meta = train(MemoryOptions(options).device(Device::meta()));
  ASSERT_GT(cpu.policy.evictions, 0);
  EXPECT_EQ(meta.decisions, cpu.decisions);
  EXPECT_EQ(meta.peak, cpu.peak);
  EXPECT_EQ(meta.policy.recomputes, cpu.policy.recomputes);
}

TEST(MemorySimulation, BadSetupsAreClearErrors) {
  // A budget on meta needs the simulator.
  EXPECT_TRUE(throws_error([] { MemoryScope scope(on_meta(Policy::kDtr, 64 * kMiB)); },
                           "memory simulator"));
  SimulatedDevice no_bandwidth = small_device();
  no_bandwidth.memory_bandwidth = 0;
  EXPECT_TRUE(throws_error([&] { Simulation bad(no_bandwidth); }, "memory_bandwidth"));
  planner::DeviceProfile no_link = small_profile();
  no_link.host_link_bandwidth = 0;
  EXPECT_TRUE(throws_error([&] { planner::simulated_device(no_link); }, "host_link_bandwidth"));
  Simulation simulation(small_device());
  EXPECT_TRUE(throws_error([] { Simulation second(small_device()); }, "already active"));
}

TEST(MemorySimulation, MetaTensorsOutsideASimulationHoldNoBytes) {
  Tensor before = empty({1024, 1024}, TensorOptions().device(Device::meta()));
  EXPECT_EQ(before.storage()->allocator(), nullptr);
  Simulation simulation(small_device());
  Tensor during = empty({1024, 1024}, TensorOptions().device(Device::meta()));
  ASSERT_NE(during.storage()->allocator(), nullptr);
  EXPECT_NE(during.storage()->data_unchecked(), nullptr);
  // Tensors from before still take part (as inputs that hold no bytes).
  Tensor sum = add(before, during);
  EXPECT_EQ(sum.sizes(), (Shape{1024, 1024}));
  EXPECT_EQ(simulation.counters().ops, 1);
}

}  // namespace
}  // namespace tessel::memory::sim
