// The residency manager under budgets on the simulated CPU device: DTR eviction and recompute,
// swap over the throttled host link, the auto policy's choice, op splitting, the user surface
// (budgets, scopes, counters) and out-of-memory reports. Small tensors, with the minimum
// candidate size lowered so they count.
#include "memory/residency_manager.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/autograd.h"
#include "core/rng.h"
#include "core/threading.h"
#include "gtest/gtest.h"
#include "memory/host_link.h"
#include "memory/memory.h"
#include "nn/nn.h"
#include "ops/dropout.h"
#include "ops/ops.h"
#include "optim/sgd.h"
#include "tests/testing.h"

namespace tessel::memory {
namespace {

using testing::all_close;
using testing::bitwise_equal;
using testing::throws_error;

constexpr size_t kKiB = 1024;
constexpr size_t kMiB = 1024 * 1024;

// ---- a tiny training harness: the same model, data and steps under any memory setup ----

struct ModelCase {
  std::function<std::shared_ptr<nn::Module>()> make_model;
  std::function<std::pair<Tensor, Tensor>(int step)> batch;  // (input, labels)
};

struct RunResult {
  std::vector<float> losses;
  std::vector<Tensor> state;  // parameters, then buffers (batch-norm running statistics)
  size_t peak = 0;
  size_t fixed = 0;  // parameters + gradients + momentum
  PolicyCounters counters;
  PolicyCounters summed_step_counters;
  ResidencyStats residency;  // of the manager, where a policy installed one
};

RunResult train(const ModelCase& model_case, const MemoryOptions& options, int steps = 3) {
  RunResult result;
  MemoryScope scope(options);
  manual_seed(1234);
  auto model = model_case.make_model();
  optim::SGD sgd(model->parameters(), optim::SGDOptions(0.05).momentum(0.9));
  result.fixed = fixed_memory_bytes(model->parameters(), 1);
  step_counters();
  for (int step = 0; step < steps; ++step) {
    auto [input, labels] = model_case.batch(step);
    sgd.zero_grad();
    Tensor loss = cross_entropy(model->forward(input), labels);
    loss.backward();
    sgd.step();
    result.losses.push_back(loss.item<float>());
    PolicyCounters step_count = step_counters();
    result.summed_step_counters.evictions += step_count.evictions;
    result.summed_step_counters.recomputes += step_count.recomputes;
    result.summed_step_counters.swaps_out += step_count.swaps_out;
    result.summed_step_counters.splits += step_count.splits;
  }
  result.peak = static_cast<size_t>(scope.allocator().memory_stats().base.peak_allocated_bytes);
  result.counters = scope.allocator().policy_counters();
  if (scope.manager()) result.residency = scope.manager()->stats();
  for (const auto& parameter : model->parameters()) result.state.push_back(parameter);
  for (const auto& buffer : model->buffers()) result.state.push_back(buffer);
  return result;
}

void expect_bitwise_same_training(const RunResult& actual, const RunResult& expected) {
  ASSERT_EQ(actual.losses.size(), expected.losses.size());
  for (size_t i = 0; i < actual.losses.size(); ++i)
    EXPECT_EQ(std::memcmp(&actual.losses[i], &expected.losses[i], sizeof(float)), 0)
        << "loss of step " << i << ": " << actual.losses[i] << " vs " << expected.losses[i];
  ASSERT_EQ(actual.state.size(), expected.state.size());
  for (size_t i = 0; i < actual.state.size(); ++i)
    EXPECT_TRUE(bitwise_equal(actual.state[i], expected.state[i])) << "state tensor " << i;
}

// Activations dominate both models (as in the policy benchmarks), and both are deep enough that
// one op's working set is a small part of the budget: the arena's holes must still fit it when
// the op's pinned inputs sit in the middle.
ModelCase mlp_case() {
  ModelCase result;
  result.make_model = [] {
    auto net = std::make_shared<nn::Sequential>();
    net->push_back(std::make_shared<nn::Linear>(64, 128));
    for (int layer = 0; layer < 8; ++layer) {
      if (layer % 2) {
        net->push_back(std::make_shared<nn::Tanh>());
      } else {
        net->push_back(std::make_shared<nn::ReLU>());
      }
      net->push_back(std::make_shared<nn::Linear>(128, 128));
    }
    net->push_back(std::make_shared<nn::ReLU>());
    net->push_back(std::make_shared<nn::Linear>(128, 10));
    return net;
  };
  result.batch = [](int step) {
    manual_seed(100 + step);
    Tensor input = randn({512, 64});
    Tensor labels = randint(0, 10, {512});
    return std::make_pair(input, labels);
  };
  return result;
}

ModelCase conv_case() {
  ModelCase result;
  result.make_model = [] {
    auto net = std::make_shared<nn::Sequential>();
    for (int block = 0; block < 16; ++block) {
      net->push_back(
          std::make_shared<nn::Conv2d>(nn::Conv2dOptions(block ? 8 : 3, 8, 3).padding(1)));
      net->push_back(std::make_shared<nn::BatchNorm2d>(8));
      net->push_back(std::make_shared<nn::ReLU>());
    }
    net->push_back(std::make_shared<nn::AdaptiveAvgPool2d>(1));
    net->push_back(std::make_shared<nn::Flatten>());
    net->push_back(std::make_shared<nn::Linear>(8, 10));
    return net;
  };
  result.batch = [](int step) {
    manual_seed(200 + step);
    Tensor input = randn({16, 3, 16, 16});
    Tensor labels = randint(0, 10, {16});
    return std::make_pair(input, labels);
  };
  return result;
}

MemoryOptions budgeted(const RunResult& reference, double fraction, Policy policy) {
  return MemoryOptions()
      .budget(activation_budget(reference.fixed, reference.peak, fraction))
      .policy(policy)
      .min_candidate_bytes(16 * kKiB)
      .cost_source(CostSource::kEstimated)  // decisions independent of timing: reproducible
      .fixed_bytes(reference.fixed);
}

// ---- training under a budget ----

TEST(Dtr, MlpUnderABudgetTrainsBitwiseLikeWithoutOne) {
  ModelCase model = mlp_case();
  RunResult reference = train(model, MemoryOptions());
  RunResult dtr = train(model, budgeted(reference, 0.5, Policy::kDtr));
  expect_bitwise_same_training(dtr, reference);
  EXPECT_GT(dtr.counters.evictions, 0);
  EXPECT_GT(dtr.counters.recomputes, 0);
  EXPECT_LE(dtr.peak, activation_budget(reference.fixed, reference.peak, 0.5));
}

TEST(Dtr, SampledCandidatesStillTrainBitwiseLikeWithoutABudget) {
  ModelCase model = mlp_case();
  RunResult reference = train(model, MemoryOptions());
  MemoryOptions options = budgeted(reference, 0.5, Policy::kDtr);
  options.sample_candidates(true, /*seed=*/42);
  RunResult sampled = train(model, options);
  expect_bitwise_same_training(sampled, reference);
  EXPECT_GT(sampled.counters.evictions, 0);
}

TEST(Dtr, ConvNetWithBatchNormTrainsBitwiseLikeWithoutOne) {
  ModelCase model = conv_case();
  RunResult reference = train(model, MemoryOptions());
  RunResult dtr = train(model, budgeted(reference, 0.5, Policy::kDtr));
  // The state includes the running statistics: they changed exactly once per step.
  expect_bitwise_same_training(dtr, reference);
  EXPECT_GT(dtr.counters.evictions, 0);
  EXPECT_GT(dtr.counters.recomputes, 0);
}

TEST(Swap, MlpAndConvNetUnderABudgetTrainBitwiseLikeWithoutOne) {
  for (const ModelCase& model : {mlp_case(), conv_case()}) {
    RunResult reference = train(model, MemoryOptions());
    RunResult swap = train(model, budgeted(reference, 0.5, Policy::kSwap));
    expect_bitwise_same_training(swap, reference);
    EXPECT_GT(swap.counters.swaps_out, 0);
    EXPECT_GT(swap.counters.swaps_in, 0);
    EXPECT_EQ(swap.counters.recomputes, 0);
  }
}

TEST(Auto, ConvNetUnderABudgetMatchesWithoutOne) {
  ModelCase model = conv_case();
  RunResult reference = train(model, MemoryOptions());
  RunResult automatic = train(model, budgeted(reference, 0.5, Policy::kAuto));
  ASSERT_EQ(automatic.state.size(), reference.state.size());
  for (size_t i = 0; i < reference.state.size(); ++i)
    EXPECT_TRUE(all_close(automatic.state[i], reference.state[i], 1e-4, 1e-6));
  EXPECT_GT(automatic.counters.evictions + automatic.counters.swaps_out, 0);
}

// auto tries its five ways (mixed, recompute first, recompute only, planned with two headrooms)
// for a few steps each once memory has been short, then keeps one: what a benchmark of its steady
// state waits for (memory_sweep).
TEST(Auto, TriesItsWaysForAFewStepsThenKeepsOne) {
  ModelCase model = conv_case();
  RunResult reference = train(model, MemoryOptions());
  std::vector<bool> trying;
  {
    MemoryScope scope(budgeted(reference, 0.5, Policy::kAuto));
    manual_seed(1234);
    auto network = model.make_model();
    optim::SGD sgd(network->parameters(), optim::SGDOptions(0.05).momentum(0.9));
    for (int step = 0; step < 80; ++step) {
      auto [input, labels] = model.batch(step);
      sgd.zero_grad();
      cross_entropy(network->forward(input), labels).backward();
      sgd.step();
      trying.push_back(scope.manager()->auto_trying());
    }
  }
  EXPECT_TRUE(std::find(trying.begin(), trying.end(), true) != trying.end());
  EXPECT_FALSE(trying.back());
  MemoryScope dtr(budgeted(reference, 0.5, Policy::kDtr));
  EXPECT_FALSE(dtr.manager()->auto_trying());
}

// The planned way (a plan made from the previous step: swaps and drops right after a tensor's
// last forward read, copies back ahead of backward) moves tensors as the other ways do: the same
// values bit for bit.
TEST(Auto, PlannedStepsTrainTheSameAsWithoutABudget) {
  ModelCase model = conv_case();
  constexpr int kSteps = 50;  // past the trial of every way
  RunResult reference = train(model, MemoryOptions(), kSteps);
  MemoryOptions options = budgeted(reference, 0.5, Policy::kAuto);
  // No trial is given up however long a step takes: on a busy machine a stalled step would
  // otherwise end a planned way's trial early and the count below would depend on the load.
  options.residency().auto_give_up_factor(1e9);
  RunResult automatic = train(model, options, kSteps);
  expect_bitwise_same_training(automatic, reference);
  const ResidencyStats& stats = automatic.residency;
  EXPECT_GE(stats.planned_steps, 14);  // seven steps at each of two headrooms
  EXPECT_NE(stats.plan.find("plan: swap"), std::string::npos) << stats.plan;
}

// A trial step that runs past auto_give_up_factor times the best estimate of auto's ways is given
// up where it stands: the rest of it runs another way, and the way is not tried again. With a
// factor just above 1 most of the trial's steps are given up part way (step times vary more than
// that); the values are those of the run without a budget, bit for bit.
TEST(Auto, StepsGivenUpPartWayTrainTheSameAsWithoutABudget) {
  ModelCase model = conv_case();
  constexpr int kSteps = 40;
  RunResult reference = train(model, MemoryOptions(), kSteps);
  MemoryOptions options = budgeted(reference, 0.5, Policy::kAuto);
  options.residency().auto_give_up_factor(1.0001);
  RunResult automatic = train(model, options, kSteps);
  expect_bitwise_same_training(automatic, reference);
  EXPECT_GE(automatic.residency.ways_given_up, 1);
  EXPECT_LE(automatic.residency.ways_given_up, 4);  // never the last way left
  EXPECT_FALSE(automatic.residency.auto_tuning);

  options.residency().auto_give_up_factor(1);
  EXPECT_TRUE(throws_error([&] { MemoryScope scope(options); }, "auto_give_up_factor"));
  EXPECT_FALSE(status().active);  // nothing was installed
}

TEST(Counters, StepCountersAddUpToTheTotalsAndFormatIntoAStatusLine) {
  ModelCase model = mlp_case();
  RunResult reference = train(model, MemoryOptions());
  RunResult dtr = train(model, budgeted(reference, 0.5, Policy::kDtr));
  EXPECT_EQ(dtr.summed_step_counters.evictions, dtr.counters.evictions);
  EXPECT_EQ(dtr.summed_step_counters.recomputes, dtr.counters.recomputes);

  MemoryScope scope(MemoryOptions().budget(4 * kMiB).policy(Policy::kDtr));
  MemoryStatus now = status();
  EXPECT_TRUE(now.active);
  EXPECT_EQ(now.policy, Policy::kDtr);
  EXPECT_EQ(now.budget, 4 * kMiB);
  std::string line = status_line(now);
  EXPECT_NE(line.find("policy dtr"), std::string::npos) << line;
  EXPECT_NE(line.find("evictions"), std::string::npos) << line;
  EXPECT_NE(line.find("splits"), std::string::npos) << line;
}

// ---- recompute mechanics ----

TEST(Dtr, BatchNormRecomputeLeavesRunningStatisticsAlone) {
  MemoryScope scope(MemoryOptions().policy(Policy::kDtr).min_candidate_bytes(0));
  manual_seed(4);
  Tensor x = randn({8, 4, 6, 6});
  Tensor weight = randn({4}), bias = randn({4});
  Tensor running_mean = zeros({4}), running_var = ones({4});
  Tensor y = batch_norm(x, weight, bias, running_mean, running_var, /*training=*/true);
  Tensor expected = clone(y);
  Tensor mean_after_forward = clone(running_mean), var_after_forward = clone(running_var);
  scope.manager()->evict(*y.storage());
  EXPECT_EQ(y.storage()->state(), Residency::kEvicted);
  EXPECT_TRUE(bitwise_equal(y, expected));
  EXPECT_EQ(scope.manager()->stats().policy.recomputes, 1);
  EXPECT_TRUE(bitwise_equal(running_mean, mean_after_forward));
  EXPECT_TRUE(bitwise_equal(running_var, var_after_forward));
  // The running statistics were written in place: they have no op record, only swap moves them.
  EXPECT_EQ(scope.manager()->planned_action(*running_mean.storage()), ResidencyAction::kNone);
}

TEST(Dtr, DropoutReplaysItsMask) {
  MemoryScope scope(MemoryOptions().policy(Policy::kDtr).min_candidate_bytes(0));
  manual_seed(9);
  Tensor x = randn({64, 64});
  Tensor y = dropout(x, 0.5, /*training=*/true);
  Tensor expected = clone(y);
  randn({1000});  // the generator moves on
  scope.manager()->evict(*y.storage());
  EXPECT_TRUE(bitwise_equal(y, expected));
  EXPECT_EQ(scope.manager()->stats().policy.recomputes, 1);
}

// An output only backward reads (dropout's mask) waits for it as long as the saved activations
// do: once its op's result has been read it is a candidate like them, and comes back as it was.
TEST(Dtr, AnOutputOnlyBackwardReadsIsACandidateOnceItsOpsResultIsRead) {
  MemoryScope scope(MemoryOptions().policy(Policy::kDtr).min_candidate_bytes(0));
  ResidencyManager& manager = *scope.manager();
  manual_seed(9);
  Tensor x = randn({64, 64});
  const std::vector<Tensor> outputs = dispatch(ops::dropout, {x}, Attrs{{"p", 0.5}});
  const Tensor& mask = outputs[1];
  // Nothing has read the result yet: it and the mask are about to be read.
  EXPECT_EQ(manager.planned_action(*mask.storage()), ResidencyAction::kNone);
  Tensor next = neg(outputs[0]);
  EXPECT_EQ(manager.planned_action(*mask.storage()), ResidencyAction::kRecompute);
  const std::vector<bool> expected = mask.to_vector<bool>();
  randn({1000});  // the generator moves on
  manager.evict(*mask.storage());
  EXPECT_EQ(mask.storage()->state(), Residency::kEvicted);
  EXPECT_EQ(mask.to_vector<bool>(), expected);
}

// Runs `body` on a thread with a small stack: recursion 2000 deep would not fit in it.
void run_with_small_stack(const std::function<void()>& body) {
  struct Call {
    const std::function<void()>* body;
    std::exception_ptr error;
  } call{&body, nullptr};
  pthread_attr_t attributes;
  pthread_attr_init(&attributes);
  pthread_attr_setstacksize(&attributes, 256 * kKiB);
  pthread_t thread;
  auto entry = [](void* argument) -> void* {
    auto* call = static_cast<Call*>(argument);
    try {
      (*call->body)();
    } catch (...) {
      call->error = std::current_exception();
    }
    return nullptr;
  };
  ASSERT_EQ(pthread_create(&thread, &attributes, entry, &call), 0);
  pthread_join(thread, nullptr);
  pthread_attr_destroy(&attributes);
  if (call.error) std::rethrow_exception(call.error);
}

TEST(Dtr, RematerialisesA2000LongChainOfEvictedTensorsWithAnExplicitStack) {
  MemoryScope scope(MemoryOptions().policy(Policy::kDtr).min_candidate_bytes(0));
  manual_seed(11);
  const Tensor start = randn({256});
  Tensor last = start;
  for (int i = 0; i < 2000; ++i) last = tanh(add(mul(last, 0.5), 0.25));
  Tensor expected = clone(last);
  // Every intermediate was dropped while an op record still needed it: an evicted placeholder.
  EXPECT_GE(scope.manager()->stats().placeholders, 3999);
  scope.manager()->evict(*last.storage());
  Tensor copy;
  run_with_small_stack([&] { copy = clone(last); });
  EXPECT_TRUE(bitwise_equal(copy, expected));
  EXPECT_EQ(scope.manager()->stats().policy.recomputes, 6000);
}

TEST(Dtr, WritingAnInputInPlaceKeepsItsOldBytesForHeldEvictedTensors) {
  MemoryScope scope(MemoryOptions().policy(Policy::kDtr).min_candidate_bytes(0));
  ResidencyManager& manager = *scope.manager();
  manual_seed(12);
  Tensor x = randn({1000});
  Tensor y = exp(x);
  Tensor expected = clone(y);
  manager.evict(*y.storage());
  {
    NoGradGuard no_grad;
    x.mul_(2.0);
  }
  // y's op record now reads a copy of the old x (copy-on-write).
  EXPECT_EQ(y.storage()->state(), Residency::kEvicted);
  EXPECT_EQ(manager.stats().snapshots, 1);
  EXPECT_TRUE(bitwise_equal(y, expected));
  EXPECT_EQ(manager.planned_action(*y.storage()), ResidencyAction::kRecompute);
}

TEST(Dtr, WritingAnInputInPlaceRetiresRecordsNothingHeldNeeds) {
  MemoryScope scope(MemoryOptions().policy(Policy::kDtr).min_candidate_bytes(0));
  ResidencyManager& manager = *scope.manager();
  manual_seed(12);
  Tensor x = randn({1000});
  Tensor y = tanh(exp(x));  // exp's output is dropped: an evicted placeholder
  Tensor expected = clone(y);
  {
    NoGradGuard no_grad;
    x.mul_(2.0);
  }
  EXPECT_EQ(manager.stats().snapshots, 0);
  // y stays resident and keeps its bytes, but can no longer be evicted for recompute.
  EXPECT_EQ(manager.planned_action(*y.storage()), ResidencyAction::kNone);
  EXPECT_TRUE(throws_error([&] { manager.evict(*y.storage()); }, "no valid op record"));
  EXPECT_TRUE(bitwise_equal(y, expected));
}

TEST(Dtr, ScoreRisesWithFreshnessAndTheEvictedNeighbourhood) {
  MemoryScope scope(MemoryOptions().policy(Policy::kDtr).min_candidate_bytes(0));
  ResidencyManager& manager = *scope.manager();
  manual_seed(13);
  Tensor input = randn({64, 64});
  Tensor middle = exp(input);
  Tensor spacer = randn({64, 64});  // keeps middle's block away from output's
  Tensor output = tanh(middle);
  Tensor consumer = neg(output);  // a tensor nothing has read yet is about to be read: kept
  for (int i = 0; i < 10; ++i) input.to_vector<float>();  // time passes for the others
  // Touching a tensor makes it fresher, so a worse victim.
  const double stale = manager.score(*output.storage());
  output.to_vector<float>();
  const double fresh = manager.score(*output.storage());
  EXPECT_GT(fresh, stale);
  // Evicting its input adds the input's cost to what evicting it would cost.
  manager.evict(*middle.storage());
  EXPECT_GT(manager.score(*output.storage()), fresh);
  // Pinned tensors are no candidates.
  {
    StorageAccess pinned(*output.storage());
    EXPECT_EQ(manager.planned_action(*output.storage()), ResidencyAction::kNone);
  }
  EXPECT_EQ(manager.planned_action(*output.storage()), ResidencyAction::kRecompute);
  EXPECT_TRUE(manager.evict_one());
}

// An op's resident inputs stay on the device while the room for its outputs, and for its inputs
// that must come back, is made: the stalest candidate here is the op's own input, and moving it
// off would only bring it straight back (DTR locks an op's inputs so).
struct FourTensors {
  Tensor x, a, b, c;  // 4 MiB each, in a 17 MiB arena with the small ones
};

// Time passes for every other tensor: these are read again and again.
void touch(const std::vector<Tensor>& tensors) {
  for (int i = 0; i < 20; ++i)
    for (const Tensor& tensor : tensors) tensor.to_vector<float>();
}

// Each read once: candidates (the tests then make a the stalest).
FourTensors four_candidates() {
  constexpr int64_t kFloats = int64_t{1} << 20;
  FourTensors t;
  t.x = randn({kFloats});
  t.a = exp(t.x);
  sum(t.a);
  t.b = exp(t.x);
  t.c = neg(t.x);
  sum(t.b);
  sum(t.c);
  return t;
}

MemoryOptions seventeen_mib_under_dtr() {
  return MemoryOptions().budget(17 * kMiB).policy(Policy::kDtr).min_candidate_bytes(0);
}

TEST(Dtr, AnOpsResidentInputStaysWhileItsOutputIsAllocated) {
  MemoryScope scope(seventeen_mib_under_dtr());
  ResidencyManager& manager = *scope.manager();
  manual_seed(21);
  FourTensors t = four_candidates();
  const std::vector<float> a_values = t.a.to_vector<float>();
  touch({t.x, t.b, t.c});
  ASSERT_EQ(manager.stats().policy.evictions, 0);
  Tensor y = tanh(t.a);  // its output needs a 4 MiB tensor moved off: not a
  EXPECT_EQ(manager.stats().policy.evictions, 1);
  EXPECT_EQ(manager.stats().policy.recomputes, 0);
  EXPECT_EQ(t.a.storage()->state(), Residency::kResident);
  std::vector<float> expected = a_values;
  for (float& value : expected) value = std::tanh(value);
  EXPECT_EQ(y.to_vector<float>(), expected);
}

TEST(Dtr, AnOpsResidentInputStaysWhileAnotherOfItsInputsIsRecomputed) {
  MemoryScope scope(seventeen_mib_under_dtr());
  ResidencyManager& manager = *scope.manager();
  manual_seed(22);
  FourTensors t = four_candidates();
  const std::vector<float> a_values = t.a.to_vector<float>(), b_values = t.b.to_vector<float>();
  touch({t.x, t.c});
  ASSERT_EQ(manager.stats().policy.evictions, 0);
  manager.evict(*t.b.storage());
  // The output takes b's room; bringing b back then needs a 4 MiB tensor moved off: c (x is
  // what b is recomputed from), not a.
  Tensor y = add(t.b, t.a);
  EXPECT_EQ(manager.stats().policy.recomputes, 1);
  EXPECT_EQ(t.a.storage()->state(), Residency::kResident);
  EXPECT_NE(t.c.storage()->state(), Residency::kResident);
  std::vector<float> expected(a_values.size());
  for (size_t i = 0; i < expected.size(); ++i) expected[i] = b_values[i] + a_values[i];
  EXPECT_EQ(y.to_vector<float>(), expected);
}

// A recompute whose op has two evicted inputs remakes the one with the larger chain first: its
// result then waits alone while the smaller chain runs. Here the other way round needs room for
// four 4 MiB tensors at once (the small result pinned beside add's two inputs and its output)
// where nothing else can go; this way needs three.
TEST(Dtr, ARecomputeRemakesItsInputWithTheLargerChainFirst) {
  constexpr int64_t kFloats = int64_t{1} << 20;
  manual_seed(23);
  const Tensor x = randn({kFloats});  // made outside the scope: no candidate, not counted
  MemoryScope scope(MemoryOptions().budget(14 * kMiB).policy(Policy::kDtr).min_candidate_bytes(0));
  ResidencyManager& manager = *scope.manager();
  Tensor large = add(exp(x), neg(x));  // exp's and neg's outputs: evicted placeholders
  Tensor small = tanh(x);
  Tensor y = add(small, large);
  const std::vector<float> expected = y.to_vector<float>();
  for (Tensor* evicted : {&y, &small, &large}) manager.evict(*evicted->storage());
  const int64_t recomputes = manager.stats().policy.recomputes;
  EXPECT_EQ(y.to_vector<float>(), expected);
  // exp, neg and the inner add, then tanh, then y's add: each once.
  EXPECT_EQ(manager.stats().policy.recomputes - recomputes, 5);
}

// Under the swapping ways a recompute waiting for another input holds its resident inputs
// without pinning them. Such an input is read again as soon as the chain under it ends, so room
// for that chain comes from any other tensor first: here a 4 MiB state tensor fresher than it.
TEST(Auto, ARecomputeHoldsItsWaitingInputWhileAnotherTensorCanGo) {
  constexpr int64_t kFloats = int64_t{1} << 20;
  manual_seed(24);
  const Tensor x = randn({kFloats});  // made outside the scope: no candidate, not counted
  MemoryScope scope(MemoryOptions().budget(18 * kMiB).policy(Policy::kAuto).min_candidate_bytes(0));
  ResidencyManager& manager = *scope.manager();
  Tensor state = tensor(std::vector<float>(kFloats, 1.0f), {kFloats});  // no op record
  Tensor large = add(exp(x), neg(state));  // exp's and neg's outputs: evicted placeholders
  Tensor small = tanh(x);
  Tensor y = add(small, large);
  const std::vector<float> expected = y.to_vector<float>();
  for (Tensor* evicted : {&y, &large}) manager.evict(*evicted->storage());
  const int64_t swaps_in = manager.stats().policy.swaps_in;
  // y's add holds small while large's chain runs; neg then reads the state tensor, and the
  // chain's last add needs room for 4 MiB: the state tensor goes, not the held (staler) input.
  EXPECT_EQ(y.to_vector<float>(), expected);
  EXPECT_EQ(manager.stats().policy.swaps_in - swaps_in, 0);
  EXPECT_EQ(small.storage()->state(), Residency::kResident);
  EXPECT_EQ(state.storage()->state(), Residency::kOnHost);
}

// The minimum candidate size follows the model: 1% of the mean size of the resident tensors (the
// DTR paper's rule), with min_candidate_bytes as a floor.
TEST(Dtr, CandidatesAreTensorsOfAtLeastOnePercentOfTheMeanSize) {
  {
    // A small model: 64 KiB tensors, far below a fixed 1 MiB, are candidates.
    MemoryScope scope(MemoryOptions().policy(Policy::kDtr));
    ResidencyManager& manager = *scope.manager();
    manual_seed(5);
    Tensor input = randn({128, 128});  // 64 KiB
    Tensor hidden = exp(input);
    Tensor output = tanh(hidden);
    Tensor consumer = neg(output);
    EXPECT_LT(manager.candidate_threshold(), 64 * kKiB);
    EXPECT_EQ(manager.planned_action(*hidden.storage()), ResidencyAction::kRecompute);
  }
  {
    // Many 1 MiB tensors and a 4 KiB one: the mean is near 1 MiB, so the 4 KiB tensor (0.4% of it)
    // is left alone while the large ones are candidates.
    MemoryScope scope(MemoryOptions().policy(Policy::kDtr));
    ResidencyManager& manager = *scope.manager();
    manual_seed(6);
    Tensor large_input = randn({256 * 1024});  // 1 MiB
    std::vector<Tensor> large = {exp(large_input)};
    for (int i = 0; i < 6; ++i) large.push_back(tanh(large.back()));
    Tensor small = exp(randn({1024}));  // 4 KiB
    Tensor small_consumer = neg(small);
    const size_t threshold = manager.candidate_threshold();
    EXPECT_GT(threshold, 4 * kKiB);
    EXPECT_LT(threshold, 16 * kKiB);
    EXPECT_EQ(manager.planned_action(*small.storage()), ResidencyAction::kNone);
    EXPECT_EQ(manager.planned_action(*large[2].storage()), ResidencyAction::kRecompute);
  }
  {
    // A floor in bytes raises the threshold above the share.
    MemoryScope scope(MemoryOptions().policy(Policy::kDtr).min_candidate_bytes(kMiB));
    manual_seed(7);
    Tensor input = randn({128, 128});
    Tensor hidden = exp(input);
    Tensor consumer = tanh(hidden);
    EXPECT_EQ(scope.manager()->candidate_threshold(), kMiB);
    EXPECT_EQ(scope.manager()->planned_action(*hidden.storage()), ResidencyAction::kNone);
  }
}

// ---- auto: swap or recompute ----

TEST(Auto, SwapsWhatIsCheapToCopyAndRecomputesWhatIsCheapToRecompute) {
  // Estimated costs: 64x1024 @ 1024x64 takes ~0.2 ms, relu of 64x64 ~2 us; the 16 KiB copy
  // takes 16 us at 1 GB/s.
  MemoryScope scope(MemoryOptions()
                        .policy(Policy::kAuto)
                        .min_candidate_bytes(0)
                        .cost_source(CostSource::kEstimated)
                        .host_bandwidth(1e9));
  ResidencyManager& manager = *scope.manager();
  manual_seed(14);
  Tensor a = randn({64, 1024}), b = randn({1024, 64});
  Tensor expensive = matmul(a, b);
  Tensor cheap_input = randn({64, 64});
  Tensor cheap = relu(cheap_input);
  Tensor consumer = add(expensive, cheap);  // both have been read: both are candidates
  Tensor no_record = randn({64, 64});
  {
    NoGradGuard no_grad;
    no_record.mul_(1.0);  // written in place: its op record is gone
  }
  EXPECT_EQ(manager.planned_action(*expensive.storage()), ResidencyAction::kSwap);
  EXPECT_EQ(manager.planned_action(*cheap.storage()), ResidencyAction::kRecompute);
  EXPECT_EQ(manager.planned_action(*no_record.storage()), ResidencyAction::kSwap);

  // A link too slow for anything: recompute whatever has an op record.
  manager.set_host_bandwidth(1e3);
  EXPECT_EQ(manager.planned_action(*expensive.storage()), ResidencyAction::kRecompute);
  EXPECT_EQ(manager.planned_action(*no_record.storage()), ResidencyAction::kSwap);
  // A link faster than any op: swap everything.
  manager.set_host_bandwidth(1e15);
  EXPECT_EQ(manager.planned_action(*cheap.storage()), ResidencyAction::kSwap);

  // Both actions bring back the same bytes.
  Tensor expected_expensive = clone(expensive), expected_cheap = clone(cheap);
  manager.set_host_bandwidth(1e9);
  manager.swap_out(*expensive.storage());
  manager.evict(*cheap.storage());
  EXPECT_EQ(expensive.storage()->state(), Residency::kOnHost);
  EXPECT_EQ(cheap.storage()->state(), Residency::kEvicted);
  EXPECT_TRUE(bitwise_equal(expensive, expected_expensive));
  EXPECT_TRUE(bitwise_equal(cheap, expected_cheap));
  EXPECT_EQ(manager.stats().policy.swaps_in, 1);
  EXPECT_EQ(manager.stats().policy.recomputes, 1);
}

TEST(AccessPattern, TheNextReadComesFromThePreviousStepAtTheSamePlace) {
  AccessPattern pattern;
  EXPECT_FALSE(pattern.known());
  // Before the first step: building the model, whose ops shift every position after them.
  pattern.read(pattern.output_key(0));
  pattern.next_op();
  pattern.begin_step();
  EXPECT_FALSE(pattern.known());
  // Step one: op 0 makes a tensor (output 0) and reads a parameter; op 1 reads nothing; op 2
  // reads the tensor; op 3 makes another that nobody reads.
  const uint64_t parameter = AccessPattern::state_key(7);
  const uint64_t activation = pattern.output_key(0);
  pattern.read(activation);
  pattern.read(parameter);
  pattern.next_op();
  pattern.next_op();
  pattern.read(activation);
  pattern.next_op();
  const uint64_t unread = pattern.output_key(0);
  EXPECT_NE(unread, activation);
  EXPECT_NE(pattern.output_key(1), unread);
  pattern.read(unread);
  pattern.next_op();
  pattern.begin_step();
  ASSERT_TRUE(pattern.known());
  // Step two, at op 0: the activation is read again two ops on; the parameter next step, four
  // ops on; a tensor the previous step never read counts the ops since its last read.
  EXPECT_EQ(pattern.distance_to_next_read(activation, 0), 2);
  EXPECT_EQ(pattern.distance_to_next_read(parameter, 0), 4);
  pattern.next_op();
  EXPECT_EQ(pattern.distance_to_next_read(activation, 0), 1);
  EXPECT_EQ(pattern.distance_to_next_read(AccessPattern::state_key(8), 0), 2);
  pattern.next_op();
  pattern.next_op();
  // Past its last read: an activation waits two steps, the parameter until the next step's read.
  EXPECT_EQ(pattern.distance_to_next_read(activation, 2), 8);
  EXPECT_EQ(pattern.distance_to_next_read(parameter, 0), 1);
  EXPECT_EQ(pattern.distance_to_next_read(unread, 3), 8);
}

TEST(Swap, AccessDuringAnUnfinishedSwapOutKeepsTheBytes) {
  // 1 MiB takes about 20 ms over this link: the read comes while the copy still runs.
  MemoryScope scope(
      MemoryOptions().policy(Policy::kSwap).min_candidate_bytes(0).host_bandwidth(50e6));
  ResidencyManager& manager = *scope.manager();
  manual_seed(15);
  Tensor x = randn({256 * 1024});
  const std::vector<float> expected = x.to_vector<float>();
  // Asked for far more than the copy frees, the manager starts it and does not wait.
  EXPECT_TRUE(manager.relieve(size_t{1} << 40, 0));
  EXPECT_EQ(x.storage()->state(), Residency::kOnHost);
  EXPECT_EQ(manager.stats().in_flight_swaps, 1);
  EXPECT_EQ(x.to_vector<float>(), expected);
  EXPECT_EQ(x.storage()->state(), Residency::kResident);
  EXPECT_EQ(manager.stats().in_flight_swaps, 0);
  EXPECT_EQ(manager.stats().policy.swaps_in, 0);  // the device bytes never left
  // A finished swap-out releases the device bytes; the next read copies them back.
  manager.swap_out(*x.storage());
  EXPECT_EQ(x.storage()->data_unchecked(), nullptr);
  EXPECT_EQ(x.to_vector<float>(), expected);
  EXPECT_EQ(manager.stats().policy.swaps_in, 1);
}

TEST(Swap, BackwardPrefetchesTheNextSwappedTensorsAndPressureDropsThemFirst) {
  MemoryScope scope(MemoryOptions().budget(64 * kMiB).policy(Policy::kSwap).min_candidate_bytes(0));
  ResidencyManager& manager = *scope.manager();
  manual_seed(17);
  std::vector<Tensor> chain;  // last used in this order, as forward leaves saved tensors
  std::vector<std::vector<float>> expected;
  for (int i = 0; i < 4; ++i) {
    chain.push_back(randn({256 * 1024}));
    expected.push_back(chain.back().to_vector<float>());
  }
  for (auto& tensor : chain) manager.swap_out(*tensor.storage());
  // With gradients recorded (forward), a swap-in fetches only what is read.
  EXPECT_EQ(chain[3].to_vector<float>(), expected[3]);
  EXPECT_EQ(manager.stats().prefetches, 0);
  manager.swap_out(*chain[3].storage());

  NoGradGuard no_grad;  // as in backward
  EXPECT_EQ(chain[3].to_vector<float>(), expected[3]);
  // The next two backward will read (last used just before) are on their way back.
  EXPECT_EQ(manager.stats().prefetches, 2);
  for (int i : {1, 2}) {
    EXPECT_EQ(chain[i].storage()->state(), Residency::kOnHost);
    EXPECT_NE(chain[i].storage()->data_unchecked(), nullptr);
  }
  EXPECT_EQ(chain[0].storage()->data_unchecked(), nullptr);
  EXPECT_EQ(chain[2].to_vector<float>(), expected[2]);
  EXPECT_EQ(manager.stats().prefetch_hits, 1);
  EXPECT_EQ(manager.stats().prefetches, 3);  // and chain[0] follows
  // Pressure gives back prefetched bytes before it moves anything: the one needed last first.
  EXPECT_TRUE(manager.relieve(size_t{1} << 40, 0));
  EXPECT_EQ(chain[0].storage()->state(), Residency::kOnHost);
  EXPECT_EQ(chain[0].storage()->data_unchecked(), nullptr);
  EXPECT_NE(chain[1].storage()->data_unchecked(), nullptr);
  EXPECT_EQ(chain[1].to_vector<float>(), expected[1]);
  EXPECT_EQ(manager.stats().prefetches, 4);  // chain[0] again, now that there is room
  EXPECT_EQ(chain[0].to_vector<float>(), expected[0]);
  EXPECT_EQ(manager.stats().prefetch_hits, 3);
  EXPECT_EQ(manager.stats().policy.swaps_in, 5);
  EXPECT_EQ(manager.stats().policy.swaps_out, 5);
}

TEST(Swap, ForwardSparesTensorsItHadToReadBackUnlessNothingElseIsLeft) {
  MemoryScope scope(MemoryOptions().budget(64 * kMiB).policy(Policy::kSwap).min_candidate_bytes(0));
  ResidencyManager& manager = *scope.manager();
  manual_seed(18);
  Tensor weight = randn({256 * 1024});  // read by every forward, like a parameter
  Tensor activation = randn({256 * 1024});
  manager.swap_out(*weight.storage());
  const std::vector<float> expected = weight.to_vector<float>();  // read back in forward
  (void)activation.to_vector<float>();                            // the weight is now the stalest
  // In forward the activation goes although the weight scores lower.
  EXPECT_LT(manager.score(*weight.storage()), manager.score(*activation.storage()));
  ASSERT_TRUE(manager.evict_one());
  EXPECT_EQ(weight.storage()->state(), Residency::kResident);
  EXPECT_EQ(activation.storage()->state(), Residency::kOnHost);
  // With nothing else left, the weight goes too.
  ASSERT_TRUE(manager.evict_one());
  EXPECT_EQ(weight.storage()->state(), Residency::kOnHost);
  EXPECT_EQ(weight.to_vector<float>(), expected);
  (void)activation.to_vector<float>();
  // Backward (no gradients recorded) treats it like any other tensor again.
  NoGradGuard no_grad;
  ASSERT_TRUE(manager.evict_one());
  EXPECT_EQ(weight.storage()->state(), Residency::kOnHost);
  EXPECT_EQ(activation.storage()->state(), Residency::kResident);
}

TEST(Swap, ForwardUnderPressureStartsSwapOutsBeforeAnAllocationWaits) {
  // 1 MiB takes about 10 ms over this link, so swap-outs started ahead are still in flight.
  MemoryScope scope(MemoryOptions()
                        .budget(6 * kMiB)
                        .policy(Policy::kSwap)
                        .min_candidate_bytes(0)
                        .host_bandwidth(100e6));
  ResidencyManager& manager = *scope.manager();
  manual_seed(19);
  std::vector<Tensor> outputs = {randn({256 * 1024})};
  std::vector<std::vector<float>> expected = {outputs[0].to_vector<float>()};
  // A chain of 1 MiB outputs, twice what fits: the first that does not fit makes room itself.
  for (int i = 1; i < 12; ++i) {
    outputs.push_back(add(outputs.back(), 1.0));
    expected.push_back(outputs.back().to_vector<float>());
    if (i == 4) {
      EXPECT_EQ(manager.stats().policy.swaps_out, 0);
    }
  }
  // From then on each op leaves room for the next output, free or on its way out.
  const ResidencyStats stats = manager.stats();
  EXPECT_GE(stats.policy.swaps_out, 6);
  EXPECT_GE(scope.allocator().largest_free_block() + stats.in_flight_swaps * kMiB, kMiB);
  for (size_t i = 0; i < outputs.size(); ++i) EXPECT_EQ(outputs[i].to_vector<float>(), expected[i]);
}

TEST(Swap, ScopeEndBringsSwappedTensorsBack) {
  Tensor x;
  std::vector<float> expected;
  {
    MemoryScope scope(MemoryOptions().policy(Policy::kSwap).min_candidate_bytes(0));
    manual_seed(16);
    x = randn({4096});
    expected = x.to_vector<float>();
    scope.manager()->swap_out(*x.storage());
    EXPECT_EQ(x.storage()->state(), Residency::kOnHost);
  }
  EXPECT_EQ(residency_hooks(), nullptr);
  EXPECT_EQ(x.storage()->state(), Residency::kResident);
  EXPECT_EQ(x.to_vector<float>(), expected);
}

TEST(HostLink, CopiesEveryByteInOrder) {
  HostLink link(2e9);
  std::vector<char> source(3 * kMiB + 17), first(source.size()), second(source.size());
  for (size_t i = 0; i < source.size(); ++i) source[i] = static_cast<char>(i * 7 + 3);
  auto a = link.copy_async(first.data(), source.data(), source.size());
  auto b = link.copy_async(second.data(), first.data(), source.size());
  link.wait(b);
  EXPECT_TRUE(a->done());
  EXPECT_EQ(first, source);
  EXPECT_EQ(second, source);
  EXPECT_EQ(link.bytes_copied(), static_cast<int64_t>(2 * source.size()));
  EXPECT_DOUBLE_EQ(link.seconds_for(2000), 1e-6);
  link.set_bandwidth(0);
  EXPECT_EQ(link.seconds_for(2000), 0.0);
}

TEST(HostLink, StreamsAlignedCopiesWithTheirTails) {
  HostLink link(0);  // unthrottled
  for (size_t bytes : {size_t{4096}, size_t{kMiB + 96}, size_t{2 * kMiB + 33}}) {
    auto* source = static_cast<char*>(std::aligned_alloc(4096, 3 * kMiB));
    auto* destination = static_cast<char*>(std::aligned_alloc(4096, 3 * kMiB));
    for (size_t i = 0; i < 3 * kMiB; ++i) {
      source[i] = static_cast<char>(i * 13 + 1);
      destination[i] = 0;
    }
    link.wait(link.copy_async(destination, source, bytes));
    EXPECT_EQ(std::memcmp(destination, source, bytes), 0) << bytes << " bytes";
    EXPECT_EQ(destination[bytes], 0) << "wrote past " << bytes << " bytes";
    std::free(source);
    std::free(destination);
  }
}

// Sleeps in every copy, so whoever waits for one blocks.
class SlowEngine : public CopyEngine {
 public:
  std::shared_ptr<void> prepare(void*, const void*, size_t) override { return nullptr; }
  void copy(void* destination, const void* source, size_t bytes,
            const std::shared_ptr<void>&) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::memcpy(destination, source, bytes);
  }
};

TEST(HostLink, CountsTimeSpentCopyingAndTimeCallersWaited) {
  HostLink link(2e9, std::make_shared<SlowEngine>());
  std::vector<char> source(kMiB, 'y'), destination(kMiB);
  EXPECT_EQ(link.wait_seconds(), 0.0);
  link.wait(link.copy_async(destination.data(), source.data(), source.size()));
  EXPECT_EQ(destination, source);
  EXPECT_GE(link.busy_seconds(), 0.09);
  EXPECT_GT(link.wait_seconds(), 0.0);
}

// Records what a backend's engine is asked to do (the CUDA backend's runs on its copy stream).
class RecordingEngine : public CopyEngine {
 public:
  std::shared_ptr<void> prepare(void*, const void*, size_t bytes) override {
    prepared.fetch_add(1);
    return std::make_shared<size_t>(bytes);
  }
  void copy(void* destination, const void* source, size_t bytes,
            const std::shared_ptr<void>& token) override {
    if (bytes == 13) throw Error("engine refused", __FILE__, __LINE__);
    EXPECT_EQ(*static_cast<size_t*>(token.get()), bytes);
    std::memcpy(destination, source, bytes);
    copied.fetch_add(1);
  }
  std::atomic<int> prepared{0}, copied{0};
};

TEST(HostLink, ACopyEngineMovesTheBytesAndItsErrorsReachTheWaiter) {
  auto engine = std::make_shared<RecordingEngine>();
  HostLink link(2e9, engine);
  std::vector<char> source(kMiB + 5, 'x'), destination(source.size());
  link.wait(link.copy_async(destination.data(), source.data(), source.size()));
  EXPECT_EQ(destination, source);
  EXPECT_EQ(engine->prepared.load(), 1);
  EXPECT_EQ(engine->copied.load(), 1);
  EXPECT_DOUBLE_EQ(link.seconds_for(2000), 1e-6);  // still the estimate
  EXPECT_TRUE(
      throws_error([&] { link.wait(link.copy_async(destination.data(), source.data(), 13)); },
                   "engine refused"));
  EXPECT_EQ(copy_engine_for(DeviceType::kMeta), nullptr);
  set_copy_engine(DeviceType::kMeta, engine);
  EXPECT_EQ(copy_engine_for(DeviceType::kMeta), engine);
  set_copy_engine(DeviceType::kMeta, nullptr);
}

// Stands in for the CUDA engine's swap-ins: a copy issued for the device lands at once (as the
// device would see it, in stream order), while the link's thread, which waits for its end, is
// held until the test lets the "device" finish. Counts what it is asked.
class DeviceOrderingEngine : public CopyEngine {
 public:
  std::shared_ptr<void> prepare(void*, const void*, size_t) override { return nullptr; }
  void copy(void* destination, const void* source, size_t bytes,
            const std::shared_ptr<void>& issued) override {
    if (!issued) {
      std::memcpy(destination, source, bytes);
      return;
    }
    std::unique_lock<std::mutex> lock(mutex_);
    finished_.wait(lock, [&] { return device_done_; });
  }
  std::shared_ptr<void> issue_for_device(void* destination, const void* source,
                                         size_t bytes) override {
    std::memcpy(destination, source, bytes);
    issued.fetch_add(1);
    return std::make_shared<int>(0);
  }
  void order_device_after(const std::shared_ptr<void>& token) override {
    EXPECT_NE(token, nullptr);
    ordered.fetch_add(1);
  }
  void finish_device_copies() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      device_done_ = true;
    }
    finished_.notify_all();
  }
  std::atomic<int> issued{0}, ordered{0};

 private:
  std::mutex mutex_;
  std::condition_variable finished_;
  bool device_done_ = false;
};

TEST(HostLink, ACopyIssuedForTheDeviceIsWaitedForThereWhileTheHostGoesOn) {
  auto engine = std::make_shared<DeviceOrderingEngine>();
  HostLink link(2e9, engine);
  std::vector<char> source(kMiB, 'd'), destination(kMiB);
  auto transfer = link.copy_to_device(destination.data(), source.data(), source.size());
  EXPECT_TRUE(transfer->issued());
  EXPECT_EQ(engine->issued.load(), 1);
  link.order_device_after(transfer);  // returns at once: the device waits, not the host
  EXPECT_EQ(engine->ordered.load(), 1);
  EXPECT_FALSE(transfer->done());  // the source is still being read
  engine->finish_device_copies();
  link.wait(transfer);
  EXPECT_TRUE(transfer->done());
  EXPECT_EQ(destination, source);
  EXPECT_EQ(link.bytes_copied(), static_cast<int64_t>(kMiB));
}

TEST(HostLink, WithoutDeviceOrderingACopyToTheDeviceIsWaitedForOnTheHost) {
  auto engine = std::make_shared<RecordingEngine>();
  HostLink link(2e9, engine);
  std::vector<char> source(kMiB, 'h'), destination(kMiB);
  auto transfer = link.copy_to_device(destination.data(), source.data(), source.size());
  EXPECT_FALSE(transfer->issued());
  link.order_device_after(transfer);
  EXPECT_TRUE(transfer->done());
  EXPECT_EQ(destination, source);
  EXPECT_EQ(engine->copied.load(), 1);
  HostLink plain(0);  // no engine: the simulated device's memcpy, waited for alike
  std::fill(destination.begin(), destination.end(), 0);
  auto copied = plain.copy_to_device(destination.data(), source.data(), source.size());
  plain.order_device_after(copied);
  EXPECT_TRUE(copied->done());
  EXPECT_EQ(destination, source);
}

// A swap-in on a device whose engine orders copies there: the reader gets the bytes without the
// host waiting, and the host copy stays allocated until the copy that reads it is done.
TEST(Swap, ASwapInOrderedOnTheDeviceFreesTheHostCopyOnlyOnceTheCopyIsDone) {
  auto engine = std::make_shared<DeviceOrderingEngine>();
  set_copy_engine(DeviceType::kCpu, engine);  // the manager takes its engine when made
  const int64_t host_bytes_before = host_allocator()->stats().allocated_bytes;
  {
    MemoryScope scope(MemoryOptions().policy(Policy::kSwap).min_candidate_bytes(0));
    ResidencyManager& manager = *scope.manager();
    manual_seed(18);
    Tensor x = randn({64 * 1024});
    Tensor y = randn({64 * 1024});
    const std::vector<float> expected_x = x.to_vector<float>();
    const std::vector<float> expected_y = y.to_vector<float>();
    manager.swap_out(*x.storage());
    manager.swap_out(*y.storage());
    const int64_t host_bytes = host_allocator()->stats().allocated_bytes;
    EXPECT_GE(host_bytes - host_bytes_before, static_cast<int64_t>(2 * x.nbytes()));

    EXPECT_EQ(x.to_vector<float>(), expected_x);  // swapped in: issued, ordered on the device
    EXPECT_EQ(engine->issued.load(), 1);
    EXPECT_EQ(engine->ordered.load(), 1);
    EXPECT_EQ(x.storage()->state(), Residency::kResident);
    EXPECT_EQ(manager.stats().policy.swaps_in, 1);
    // The copy still reads x's host copy: its block is not given back yet.
    EXPECT_EQ(host_allocator()->stats().allocated_bytes, host_bytes);

    engine->finish_device_copies();
    manager.host_link().wait_all();
    EXPECT_EQ(y.to_vector<float>(), expected_y);  // the next swap-in frees what is done
    EXPECT_EQ(engine->ordered.load(), 2);
    manager.host_link().wait_all();
  }
  // The scope's end frees the rest.
  EXPECT_EQ(host_allocator()->stats().allocated_bytes, host_bytes_before);
  set_copy_engine(DeviceType::kCpu, nullptr);
}

// Copies within one device's memory (snapshots, the training state moving into a budget) go
// through that device type's engine; the CPU's are plain memcpy.
TEST(CopyDeviceBytes, UsesTheDeviceTypesEngineAndMemcpyOnTheCpu) {
  auto engine = std::make_shared<RecordingEngine>();
  ASSERT_EQ(copy_engine_for(DeviceType::kCuda), nullptr);  // no CUDA backend in this binary
  set_copy_engine(DeviceType::kCuda, engine);
  std::vector<char> source(4097, 'y'), destination(source.size(), 0);
  copy_device_bytes(Device::cuda(1), destination.data(), source.data(), source.size());
  EXPECT_EQ(destination, source);
  EXPECT_EQ(engine->prepared.load(), 1);
  EXPECT_EQ(engine->copied.load(), 1);
  std::fill(destination.begin(), destination.end(), 0);
  copy_device_bytes(Device::cpu(), destination.data(), source.data(), source.size());
  EXPECT_EQ(destination, source);
  EXPECT_EQ(engine->copied.load(), 1);  // the CPU never asks an engine
  EXPECT_TRUE(throws_error(
      [&] { copy_device_bytes(Device::cuda(0), destination.data(), source.data(), 13); },
      "engine refused"));
  set_copy_engine(DeviceType::kCuda, nullptr);
}

// A budget for a GPU goes to that device alone, made by its backend's maker (here host memory
// standing in for CUDA's, which this binary does not link), with costs estimated from FLOPs and
// bytes; the scope's end takes it away again.
std::shared_ptr<CachingAllocator> host_backed_gpu_allocator(
    Device device, const CachingAllocatorOptions& options) {
  return std::make_shared<CachingAllocator>(device, options, host_segment_source());
}

TEST(MemoryScope, ABudgetForAGpuIsInstalledForThatDeviceAlone) {
  set_caching_allocator_maker(DeviceType::kCuda, &host_backed_gpu_allocator);
  const auto cpu_allocator = allocator_for(Device::cpu());
  {
    MemoryScope scope(
        MemoryOptions().device(Device::cuda(1)).budget(8 * kMiB).policy(Policy::kDtr));
    EXPECT_EQ(allocator_for(Device::cuda(1)).get(), &scope.allocator());
    EXPECT_EQ(scope.allocator().device(), Device::cuda(1));
    EXPECT_EQ(scope.allocator().budget(), 8 * kMiB);
    EXPECT_EQ(allocator_for(Device::cpu()), cpu_allocator);
    EXPECT_TRUE(throws_error([] { allocator_for(Device::cuda(0)); }, "no allocator for device"));
    ASSERT_NE(scope.manager(), nullptr);
    EXPECT_EQ(scope.manager()->options().cost_source(), CostSource::kEstimated);
    EXPECT_GT(scope.manager()->options().estimated_flops_per_second(), 1e12);
  }
  EXPECT_TRUE(throws_error([] { allocator_for(Device::cuda(1)); }, "no allocator for device"));
  set_caching_allocator_maker(DeviceType::kCuda, nullptr);
  EXPECT_TRUE(throws_error([] { MemoryScope scope(MemoryOptions().device(Device::cuda(0))); },
                           "the CUDA backend is not built"));
}

// ---- split ----

// Sets the intra-op thread count for a scope: conv2d's workspace holds one image per thread.
class ThreadCount {
 public:
  explicit ThreadCount(int threads) : previous_(get_num_threads()) { set_num_threads(threads); }
  ~ThreadCount() { set_num_threads(previous_); }

 private:
  int previous_;
};

TEST(Split, AConvWhoseOutputPlusWorkspaceExceedTheBudgetRunsInChunks) {
  ThreadCount threads(4);
  manual_seed(17);
  const Tensor x_values = randn({8, 16, 32, 32});                                // 512 KiB
  const Tensor w_values = randn({32, 16, 3, 3});                                 // 18 KiB
  const Tensor expected = conv2d(x_values, w_values, Tensor(), {1, 1}, {1, 1});  // 1 MiB
  // Inputs and output take 1.55 MiB; the im2col workspace 576 KiB per image, 4 images at once.
  const size_t budget = 2400 * kKiB;
  {
    MemoryScope scope(budget, Policy::kNone);
    Tensor x = clone(x_values), w = clone(w_values);
    EXPECT_TRUE(throws_error([&] { conv2d(x, w, Tensor(), {1, 1}, {1, 1}); }, "out of memory"));
  }
  // auto splits too once nothing is left to evict or swap (the inputs are pinned).
  for (Policy policy : {Policy::kSplit, Policy::kAuto}) {
    MemoryScope scope(budget, policy);
    Tensor x = clone(x_values), w = clone(w_values);
    Tensor y = conv2d(x, w, Tensor(), {1, 1}, {1, 1});
    EXPECT_TRUE(all_close(y, expected)) << policy_name(policy);
    EXPECT_EQ(scope.manager()->stats().policy.splits, 1) << policy_name(policy);
    EXPECT_EQ(status().stats.policy.splits, 1) << policy_name(policy);
  }
}

// ---- out of memory ----

TEST(OutOfMemory, ReportNamesTopHoldersAndTheOpsThatMadeThemAndTheProcessGoesOn) {
  MemoryScope scope(MemoryOptions()
                        .budget(2 * kMiB)
                        .policy(Policy::kDtr)
                        .min_candidate_bytes(64 * kMiB));  // nothing is big enough to evict
  manual_seed(19);
  Tensor held = exp(randn({192 * 1024}));  // 768 KiB
  Tensor more = tanh(held);                // 768 KiB
  try {
    Tensor too_much = exp(more);
    FAIL() << "expected an out-of-memory error";
  } catch (const tessel::OutOfMemory& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("out of memory"), std::string::npos) << message;
    EXPECT_NE(message.find("memory policy: dtr"), std::string::npos) << message;
    EXPECT_NE(message.find("top holders"), std::string::npos) << message;
    EXPECT_NE(message.find("exp output"), std::string::npos) << message;
    EXPECT_NE(message.find("tanh output"), std::string::npos) << message;
    // A policy is at work: the report does not suggest one, and gives the least budget: the two
    // held tensors dtr cannot move plus the 768 KiB request, 2.25 MiB.
    EXPECT_EQ(message.find("options: a memory policy"), std::string::npos) << message;
    EXPECT_NE(message.find("least budget for this op under dtr: 2.25 MiB"), std::string::npos)
        << message;
  }
  // Usable afterwards: a smaller op fits and computes the right values.
  Tensor small = mul(randn({1024}), 2.0);
  EXPECT_EQ(small.numel(), 1024);
  EXPECT_TRUE(all_close(tanh(held.narrow(0, 0, 1024)), more.narrow(0, 0, 1024)));
}

// Memory asked for outside an op (a data loader thread filling a batch with empty(), say) gets the
// policy's part of the report too.
TEST(OutOfMemory, AnAllocationOutsideAnOpIsExplainedByThePolicy) {
  MemoryScope scope(MemoryOptions().budget(2 * kMiB).policy(Policy::kDtr));
  Tensor held = empty({256 * 1024});  // 1 MiB without an op record: dtr cannot move it
  try {
    Tensor too_much = empty({384 * 1024});  // 1.5 MiB
    FAIL() << "expected an out-of-memory error";
  } catch (const tessel::OutOfMemory& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("memory policy: dtr"), std::string::npos) << message;
    EXPECT_NE(message.find("least budget for this op under dtr: 2.50 MiB"), std::string::npos)
        << message;
  }
}

TEST(Defragment, PinnedTensorsSlideDownSoThatAFragmentedRequestFits) {
  MemoryScope scope(MemoryOptions().budget(16 * kMiB).policy(Policy::kDtr));
  ResidencyManager& manager = *scope.manager();
  manual_seed(16);
  Tensor gap_below = empty({512 * 1024});  // 2 MiB
  Tensor x = randn({1024 * 1024});         // 4 MiB
  Tensor gap_between = empty({1024 * 1024});
  Tensor y = randn({1024 * 1024});
  const std::vector<float> x_values = x.to_vector<float>(), y_values = y.to_vector<float>();
  gap_below = Tensor();
  gap_between = Tensor();
  // x and y held as an op waiting for its other inputs holds them: no policy may take them off,
  // and the 8 MiB free lie in three holes of at most 4 MiB.
  StorageAccess hold_x(*x.storage()), hold_y(*y.storage());
  ASSERT_LT(scope.allocator().memory_stats().largest_free_block, 7 * kMiB);
  const void* x_before = x.storage()->data_unchecked();
  Tensor seven_mib = empty({7 * 256 * 1024});
  EXPECT_TRUE(std::less<const void*>()(x.storage()->data_unchecked(), x_before));  // slid down
  EXPECT_EQ(manager.stats().defragment_moves, 2);
  EXPECT_EQ(manager.stats().policy.evictions, 0);
  EXPECT_EQ(x.to_vector<float>(), x_values);
  EXPECT_EQ(y.to_vector<float>(), y_values);
}

// ---- the user surface: budgets, policies, bad input ----

TEST(ParseBudget, ReadsBytesWithUnitsAndFractions) {
  EXPECT_EQ(parse_budget("1.5GiB").bytes, size_t{3} << 29);
  EXPECT_EQ(parse_budget("512MiB").bytes, 512 * kMiB);
  EXPECT_EQ(parse_budget(" 64 kib ").bytes, 64 * kKiB);
  EXPECT_EQ(parse_budget("2GB").bytes, size_t{2000000000});
  EXPECT_EQ(parse_budget("4096").bytes, size_t{4096});
  Budget fraction = parse_budget("0.4");
  EXPECT_TRUE(fraction.is_fraction());
  EXPECT_DOUBLE_EQ(fraction.fraction, 0.4);
  EXPECT_EQ(fraction.resolve(1000, 2000), size_t{1400});
  EXPECT_EQ(parse_budget("1.0").fraction, 1.0);
  EXPECT_EQ(activation_budget(100, 300, 0.5), size_t{200});
}

TEST(ParseBudget, RejectsZeroNegativeUnparsableAndOutOfRangeText) {
  EXPECT_TRUE(throws_error([] { parse_budget("0"); }, "is zero"));
  EXPECT_TRUE(throws_error([] { parse_budget("0GiB"); }, "is zero"));
  EXPECT_TRUE(throws_error([] { parse_budget("-1GiB"); }, "negative"));
  EXPECT_TRUE(throws_error([] { parse_budget("-0.5"); }, "negative"));
  EXPECT_TRUE(throws_error([] { parse_budget("lots"); }, "cannot read"));
  EXPECT_TRUE(throws_error([] { parse_budget(""); }, "empty"));
  EXPECT_TRUE(throws_error([] { parse_budget("1.5"); }, "(0, 1]"));
  EXPECT_TRUE(throws_error([] { parse_budget("3XB"); }, "unknown unit"));
  EXPECT_TRUE(throws_error([] { parse_budget("100"); }, "at least 512"));
  // Whole numbers of bytes past the size_t range, with a unit or without.
  EXPECT_TRUE(throws_error([] { parse_budget("11111111111111111111111111011111"); }, "too large"));
  EXPECT_TRUE(throws_error([] { parse_budget("1e30TiB"); }, "too large"));
  EXPECT_TRUE(throws_error([] { parse_policy("fast"); }, "none, dtr, swap, split, auto"));
  EXPECT_TRUE(throws_error([] { set_budget(0); }, "must be positive"));
}

TEST(Budget, BelowTheFixedMemoryIsAClearOutOfMemoryError) {
  manual_seed(20);
  nn::Linear layer(512, 512);  // 1 MiB of weights: 3 MiB with gradients and momentum
  const size_t fixed = fixed_memory_bytes(layer.parameters(), 1);
  EXPECT_GE(fixed, 3 * kMiB);
  try {
    MemoryScope scope(MemoryOptions().budget(2 * kMiB).policy(Policy::kDtr).fixed_bytes(fixed));
    FAIL() << "expected an error";
  } catch (const tessel::OutOfMemory& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("below the fixed memory"), std::string::npos) << message;
    EXPECT_NE(message.find("parameters, their gradients and the optimizer state"),
              std::string::npos)
        << message;
  }
  EXPECT_EQ(residency_hooks(), nullptr);  // nothing was installed
}

TEST(Scope, RestoresThePreviousAllocatorAndHooksAndNests) {
  auto before = allocator_for(Device::cpu());
  {
    MemoryScope outer(MemoryOptions().budget(8 * kMiB).policy(Policy::kDtr));
    EXPECT_EQ(allocator_for(Device::cpu()).get(), &outer.allocator());
    EXPECT_EQ(residency_hooks(), outer.manager());
    {
      MemoryScope inner(MemoryOptions().policy(Policy::kSwap));
      EXPECT_EQ(residency_hooks(), inner.manager());
      EXPECT_EQ(status().policy, Policy::kSwap);
    }
    EXPECT_EQ(residency_hooks(), outer.manager());
    EXPECT_EQ(status().policy, Policy::kDtr);
  }
  EXPECT_EQ(allocator_for(Device::cpu()), before);
  EXPECT_EQ(residency_hooks(), nullptr);
  EXPECT_FALSE(status().active);
}

TEST(Scope, ProcessWideSettingsChangeBudgetAndPolicy) {
  set_policy("dtr");
  EXPECT_EQ(status().policy, Policy::kDtr);
  EXPECT_NE(residency_hooks(), nullptr);
  set_policy(Policy::kNone);
  EXPECT_EQ(residency_hooks(), nullptr);
  EXPECT_TRUE(status().active);
  reset();
  set_budget(16 * kMiB);
  EXPECT_EQ(status().budget, 16 * kMiB);
  EXPECT_EQ(status().policy, Policy::kNone);
  reset();
  EXPECT_FALSE(status().active);
}

// A scope given a fraction measures the first step without a limit, then trains under
// held + fraction * (peak - held) with its policy, bitwise like a run without a budget.
TEST(Scope, AFractionIsMeasuredOnTheFirstStepThenTrainsUnderItsBudget) {
  ModelCase model_case = mlp_case();
  RunResult reference = train(model_case, MemoryOptions());
  MemoryOptions policy_options = budgeted(reference, 1.0, Policy::kDtr);
  MemoryScope scope(parse_budget("0.5"), policy_options);
  manual_seed(1234);
  auto model = model_case.make_model();
  optim::SGD sgd(model->parameters(), optim::SGDOptions(0.05).momentum(0.9));
  std::vector<float> losses;
  size_t budget = 0, first_peak = 0, held = 0;
  for (int step = 0; step < 3; ++step) {
    auto [input, labels] = model_case.batch(step);
    sgd.zero_grad();
    Tensor loss = cross_entropy(model->forward(input), labels);
    loss.backward();
    sgd.step();
    losses.push_back(loss.item<float>());
    if (step == 0) {
      EXPECT_TRUE(scope.measuring());
      EXPECT_EQ(status().budget, 0u);
      EXPECT_EQ(status().policy, Policy::kNone);
      first_peak = static_cast<size_t>(scope.allocator().stats().peak_allocated_bytes);
      held = held_bytes(sgd.held_tensors());
    }
    budget = scope.end_step(sgd.held_tensors());
  }
  EXPECT_FALSE(scope.measuring());
  EXPECT_EQ(held, reference.fixed);  // parameters, gradients, momentum
  EXPECT_EQ(budget, activation_budget(held, first_peak, 0.5));
  EXPECT_EQ(status().budget, budget);
  EXPECT_EQ(status().policy, Policy::kDtr);
  EXPECT_GT(scope.allocator().policy_counters().evictions, 0);
  EXPECT_LE(static_cast<size_t>(scope.allocator().stats().peak_allocated_bytes), budget);
  ASSERT_EQ(losses.size(), reference.losses.size());
  for (size_t i = 0; i < losses.size(); ++i)
    EXPECT_EQ(std::memcmp(&losses[i], &reference.losses[i], sizeof(float)), 0) << "step " << i;
  const std::vector<Tensor> parameters = model->parameters();
  for (size_t i = 0; i < parameters.size(); ++i)
    EXPECT_TRUE(bitwise_equal(parameters[i], reference.state[i])) << "parameter " << i;
}

TEST(Scope, ABudgetInBytesIsInstalledAtOnceAndEndStepChangesNothing) {
  MemoryScope scope(parse_budget("8MiB"), Policy::kDtr);
  EXPECT_FALSE(scope.measuring());
  EXPECT_EQ(status().budget, 8 * kMiB);
  EXPECT_EQ(status().policy, Policy::kDtr);
  Tensor weight = ones({16, 16});
  EXPECT_EQ(scope.end_step({weight}), 8 * kMiB);
  EXPECT_EQ(allocator_for(Device::cpu()).get(), &scope.allocator());
}

TEST(Scope, AFractionAboveOneOrAnInnerScopeAtEndStepIsAClearError) {
  Budget too_large;
  too_large.fraction = 1.5;
  auto before = allocator_for(Device::cpu());
  EXPECT_TRUE(throws_error([&] { MemoryScope scope(too_large, Policy::kAuto); }, "(0, 1]"));
  EXPECT_EQ(allocator_for(Device::cpu()), before);  // nothing left installed
  EXPECT_FALSE(status().active);

  MemoryScope outer(parse_budget("0.5"), Policy::kDtr);
  Tensor weight = ones({16, 16});
  zeros({64, 64});  // a step's passing peak, 16 KiB above what is held
  {
    MemoryScope inner(MemoryOptions().policy(Policy::kSwap));
    EXPECT_TRUE(throws_error([&] { outer.end_step({weight}); }, "innermost"));
    EXPECT_EQ(status().policy, Policy::kSwap);
  }
  EXPECT_TRUE(outer.measuring());  // still waiting, and resolvable once innermost
  EXPECT_GT(outer.end_step({weight}), 0u);
  EXPECT_FLOAT_EQ(weight.sum().item<float>(), 256.0f);  // moved, bytes intact
}

TEST(HeldBytes, CountsSharedStorageOnceAndGradientsToo) {
  Tensor weight = ones({32, 32});  // 4 KiB, rounded by the allocator
  Tensor view = weight.narrow(0, 0, 4);
  const size_t one = CachingAllocator::round_size(weight.nbytes());
  EXPECT_EQ(held_bytes({weight, view}), one);
  weight.set_requires_grad(true);
  (weight * 2.0).sum().backward();
  EXPECT_EQ(held_bytes({weight}), 2 * one);
}

}  // namespace
}  // namespace tessel::memory
