// A model of one's own (not the zoo's) under a memory budget: a small CNN like a user's first
// model, three 3x3 conv-bn-relu blocks of 32 and 64 channels on 28x28 images at batch 128. Its
// first block's activations (12.25 MiB each) are a fifth of its peak and several ops need two of
// them at once, so under a tight budget the policies run out of candidates and of room together.
// Over a grid of activation fractions (budget = fixed + f * (peak - fixed)):
// - `auto` trains at every fraction where `swap` or `dtr` alone does;
// - `swap` trains at 45% of the activations (relu's and batch norm's backward write into the
//   incoming gradient; an op whose inputs do not fit beside its outputs runs again with one hole
//   made for them), `dtr` at 60% (tensors held for a recompute slide together when the free bytes
//   would fit but lie in holes); `auto` and `split` at 40%: an op whose two 12.25 MiB operands
//   do not fit beside each other (the first block's batch norm and relu, forward and backward)
//   runs over chunks of the batch with one of them kept on host, a weight's gradient sums over
//   chunks, an op's inputs that must be recomputed come back before its resident ones are
//   pinned, and a tensor whose recompute would need more than the budget is swapped instead;
// - every run that trains gives the unbudgeted run's losses (bitwise for dtr and swap, which run
//   the same kernels; the closeness rule for split and auto);
// - a budget too small fails with an out-of-memory report that names the op and a least budget
//   between the budget that failed and the smallest that trained.
// TESSEL_POLICY_PROBE=1 prints every run (=full: each failure's whole report).
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "core/rng.h"
#include "gtest/gtest.h"
#include "memory/memory.h"
#include "nn/nn.h"
#include "ops/ops.h"
#include "optim/sgd.h"

namespace tessel::memory {
namespace {

constexpr int kSteps = 2;
constexpr int64_t kBatch = 128;
constexpr double kFirstLossRtol = 1e-4;  // the closeness rule for whole f32 models
constexpr double kLaterLossRtol = 1e-3;  // later steps start from parameters split sums rounded

std::shared_ptr<nn::Module> make_user_cnn() {
  auto block = [](int64_t in, int64_t out, int64_t stride) {
    return std::make_shared<nn::Sequential>(
        nn::Conv2d(nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false)),
        nn::BatchNorm2d(out), nn::ReLU());
  };
  return std::make_shared<nn::Sequential>(block(1, 32, 1), block(32, 64, 2), block(64, 64, 1),
                                          nn::AdaptiveAvgPool2d(nn::IntPair(1, 1)), nn::Flatten(),
                                          nn::Linear(64, 10));
}

struct Outcome {
  bool trained = false;
  std::vector<float> losses;
  size_t peak = 0;
  size_t fixed = 0;
  std::string error;
  PolicyCounters counters;
};

// kSteps SGD steps under `options` (without a budget: the reference run).
Outcome train(const MemoryOptions& options) {
  Outcome outcome;
  try {
    MemoryScope scope(options);
    manual_seed(11);
    auto model = make_user_cnn();
    model->train();
    optim::SGD sgd(model->parameters(), optim::SGDOptions(1e-2).momentum(0.9));
    outcome.fixed = fixed_memory_bytes(model->parameters(), 1);
    for (int step = 0; step < kSteps; ++step) {
      manual_seed(500 + step);
      Tensor images = randn({kBatch, 1, 28, 28});
      Tensor labels = randint(0, 10, {kBatch});
      sgd.zero_grad();
      Tensor loss = cross_entropy(model->forward(images), labels);
      loss.backward();
      sgd.step();
      outcome.losses.push_back(loss.item<float>());
    }
    outcome.peak = static_cast<size_t>(scope.allocator().memory_stats().base.peak_allocated_bytes);
    outcome.counters = scope.allocator().policy_counters();
    outcome.trained = true;
  } catch (const OutOfMemory& error) {
    outcome.error = error.what();
  }
  return outcome;
}

const Outcome& reference() {
  static const Outcome run = train(MemoryOptions());
  return run;
}

Outcome train_within(Policy policy, size_t budget) {
  return train(MemoryOptions()
                   .budget(budget)
                   .policy(policy)
                   .cost_source(CostSource::kEstimated)
                   .fixed_bytes(reference().fixed));
}

size_t budget_at(double fraction) {
  return activation_budget(reference().fixed, reference().peak, fraction);
}

bool probing() { return std::getenv("TESSEL_POLICY_PROBE") != nullptr; }
bool probing_full() {
  const char* probe = std::getenv("TESSEL_POLICY_PROBE");
  return probe && std::strcmp(probe, "full") == 0;
}

void expect_reference_losses(const Outcome& run, Policy policy) {
  const bool bitwise = policy == Policy::kDtr || policy == Policy::kSwap;
  ASSERT_EQ(run.losses.size(), reference().losses.size());
  for (size_t i = 0; i < run.losses.size(); ++i) {
    const float actual = run.losses[i], expected = reference().losses[i];
    if (bitwise) {
      EXPECT_EQ(std::memcmp(&actual, &expected, sizeof(float)), 0)
          << "loss of step " << i << ": " << actual << " vs " << expected;
    } else {
      const double rtol = i == 0 ? kFirstLossRtol : kLaterLossRtol;
      EXPECT_LE(std::fabs(actual - expected), 1e-6 + rtol * std::fabs(expected))
          << "loss of step " << i << ": " << actual << " vs " << expected;
    }
  }
}

// Each policy from the whole activation memory down in steps of 5%, until its first failure.
struct Sweep {
  std::map<Policy, double> least;  // the smallest fraction each policy trained at
  std::map<Policy, Outcome> first_failure;
};

const Sweep& sweep() {
  static const Sweep result = [] {
    Sweep sweep;
    for (Policy policy : {Policy::kDtr, Policy::kSwap, Policy::kSplit, Policy::kAuto}) {
      sweep.least[policy] = 2.0;  // none
      for (int percent = 100; percent >= 5; percent -= 5) {
        const double fraction = percent / 100.0;
        SCOPED_TRACE(std::string(policy_name(policy)) + " at f = " + std::to_string(fraction));
        Outcome run = train_within(policy, budget_at(fraction));
        if (probing()) {
          std::cout << policy_name(policy) << " f=" << fraction << " ("
                    << format_bytes(budget_at(fraction)) << "): "
                    << (run.trained      ? "trains, " + format_counters(run.counters)
                        : probing_full() ? run.error
                                         : run.error.substr(0, run.error.find('\n', 120)))
                    << "\n";
        }
        if (!run.trained) {
          sweep.first_failure[policy] = std::move(run);
          break;
        }
        EXPECT_LE(run.peak, budget_at(fraction));
        expect_reference_losses(run, policy);
        sweep.least[policy] = fraction;
      }
    }
    return sweep;
  }();
  return result;
}

TEST(UserModelBudget, AutoTrainsWhereverSwapOrDtrDoesAndBelowBoth) {
  ASSERT_TRUE(reference().trained);
  const Sweep& result = sweep();
  std::cout << "unbudgeted peak " << format_bytes(reference().peak) << " (fixed "
            << format_bytes(reference().fixed) << "); least activation fraction trained: dtr "
            << result.least.at(Policy::kDtr) << ", swap " << result.least.at(Policy::kSwap)
            << ", split " << result.least.at(Policy::kSplit) << ", auto "
            << result.least.at(Policy::kAuto) << "\n";
  EXPECT_LT(result.least.at(Policy::kAuto), result.least.at(Policy::kSwap));
  EXPECT_LT(result.least.at(Policy::kAuto), result.least.at(Policy::kDtr));
  EXPECT_LE(result.least.at(Policy::kSwap), 0.45);
  EXPECT_LE(result.least.at(Policy::kAuto), 0.40);
  EXPECT_LE(result.least.at(Policy::kDtr), 0.60);
  EXPECT_LE(result.least.at(Policy::kSplit), 0.40);
}

// Its first block's batch norm and relu need two 12.25 MiB tensors at once, more than 40% of the
// peak leaves for activations: they run over chunks of the batch with one of the two on host.
TEST(UserModelBudget, AutoAndSplitTrainAtFortyPercentOfThePeak) {
  const size_t budget = static_cast<size_t>(0.4 * static_cast<double>(reference().peak));
  for (Policy policy : {Policy::kAuto, Policy::kSplit}) {
    SCOPED_TRACE(policy_name(policy));
    const Outcome run = train_within(policy, budget);
    ASSERT_TRUE(run.trained) << run.error;
    EXPECT_LE(run.peak, budget);
    EXPECT_GT(run.counters.splits, 0);
    expect_reference_losses(run, policy);
  }
}

TEST(UserModelBudget, TheReportNamesTheOpAndABoundOnTheBudget) {
  const Sweep& result = sweep();
  ASSERT_TRUE(result.first_failure.count(Policy::kAuto));
  const std::string& report = result.first_failure.at(Policy::kAuto).error;
  EXPECT_NE(report.find("while running: "), std::string::npos) << report;
  std::smatch match;
  ASSERT_TRUE(std::regex_search(
      report, match, std::regex(R"(least budget for this op under auto: [^(]*\((\d+) bytes\))")))
      << report;
  // A lower bound on the budget the step needs: above the budget that failed, and no more than
  // the smallest budget that trained.
  const size_t least = std::stoull(match[1].str());
  const double trained_at = result.least.at(Policy::kAuto);
  EXPECT_GT(least, budget_at(trained_at - 0.05)) << report;
  EXPECT_LE(least, budget_at(trained_at)) << report;
}

}  // namespace
}  // namespace tessel::memory
