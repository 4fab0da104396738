// Learning-rate schedules against PyTorch (StepLR, and LambdaLR with the warmup formulas),
// their argument checks, and exact state capture for checkpoints.
#include <cmath>
#include <vector>

#include "ops/ops.h"
#include "optim/lr_scheduler.h"
#include "optim/optim.h"
#include "tests/testing.h"

namespace tessel::optim {
namespace {

using testing::throws_error;

// Learning rates the optimizer sees at steps 0, 1, ... (read before each scheduler step).
std::vector<double> learning_rates(Optimizer& optimizer, LRScheduler& schedule, int steps) {
  std::vector<double> rates;
  for (int i = 0; i < steps; ++i) {
    rates.push_back(optimizer.lr());
    schedule.step();
  }
  return rates;
}

void expect_rates(const std::vector<double>& actual, const std::vector<double>& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i)
    EXPECT_NEAR(actual[i], expected[i], 1e-15 + 1e-13 * std::abs(expected[i])) << "step " << i;
}

std::vector<Tensor> one_parameter() { return {zeros({2}).set_requires_grad(true)}; }

TEST(StepLR, MatchesPyTorch) {
  SGD sgd(one_parameter(), SGDOptions(0.5));
  StepLR schedule(sgd, /*step_size=*/3, /*gamma=*/0.1);
  // torch.optim.lr_scheduler.StepLR(SGD([p], lr=0.5), step_size=3, gamma=0.1), lr before each
  // step (tests/state values printed by /usr/bin/python3 with torch 1.13, %.17g).
  expect_rates(learning_rates(sgd, schedule, 12),
               {0.5, 0.5, 0.5, 0.050000000000000003, 0.050000000000000003, 0.050000000000000003,
                0.005000000000000001, 0.005000000000000001, 0.005000000000000001,
                0.00050000000000000012, 0.00050000000000000012, 0.00050000000000000012});
  EXPECT_EQ(schedule.step_count(), 12);
  EXPECT_EQ(schedule.base_lr(), 0.5);
}

TEST(CosineWithWarmup, MatchesLambdaLRFormula) {
  SGD sgd(one_parameter(), SGDOptions(0.2));
  CosineWithWarmup schedule(sgd, /*warmup_steps=*/4, /*total_steps=*/12, /*min_lr=*/0.01);
  // LambdaLR(SGD([p], lr=0.2), f) with f(s) = s / 4 for s < 4, else
  // (0.01 + 0.19 * 0.5 * (1 + cos(pi * min(1, (s - 4) / 8)))) / 0.2.
  expect_rates(
      learning_rates(sgd, schedule, 15),
      {0, 0.050000000000000003, 0.10000000000000001, 0.15000000000000002, 0.20000000000000001,
       0.19276855558857225, 0.17217514421272201, 0.14135492607468356, 0.10499999999999998,
       0.068645073925316477, 0.03782485578727799, 0.017231444411427758, 0.01, 0.01, 0.01});
}

TEST(CosineWithWarmup, WithoutWarmupStartsAtTheBaseRateAndEndsAtZero) {
  SGD sgd(one_parameter(), SGDOptions(1.0));
  CosineWithWarmup schedule(sgd, 0, 4);
  expect_rates(learning_rates(sgd, schedule, 6),
               {1.0, 0.85355339059327373, 0.5, 0.14644660940672627, 0, 0});
}

TEST(LinearWarmupDecay, MatchesLambdaLRFormula) {
  SGD sgd(one_parameter(), SGDOptions(0.1));
  LinearWarmupDecay schedule(sgd, /*warmup_steps=*/3, /*total_steps=*/10);
  // LambdaLR(SGD([p], lr=0.1), f) with f(s) = s / 3 for s < 3, else max(0, (10 - s) / 7).
  expect_rates(learning_rates(sgd, schedule, 13),
               {0, 0.033333333333333333, 0.066666666666666666, 0.10000000000000001,
                0.085714285714285715, 0.071428571428571438, 0.057142857142857141,
                0.042857142857142858, 0.028571428571428571, 0.014285714285714285, 0, 0, 0});
}

TEST(LRScheduler, OptimizerStepsWithTheScheduledRate) {
  Tensor parameter = zeros({1}).set_requires_grad(true);
  SGD sgd({parameter}, SGDOptions(1.0));
  StepLR schedule(sgd, 1, 0.5);
  for (int i = 0; i < 3; ++i) {
    parameter.set_grad(ones({1}));
    sgd.step();
    schedule.step();
  }
  // -(1 + 0.5 + 0.25)
  EXPECT_EQ(parameter.item<float>(), -1.75f);
  EXPECT_EQ(sgd.lr(), 0.125);
  EXPECT_EQ(schedule.last_lr(), 0.125);
}

TEST(LRScheduler, RestoredStateContinuesExactly) {
  SGD original_sgd(one_parameter(), SGDOptions(0.3));
  CosineWithWarmup original(original_sgd, 5, 40, 0.001);
  for (int i = 0; i < 17; ++i) original.step();
  const NamedScalars state = original.state_scalars();
  ASSERT_EQ(state.size(), 2u);
  EXPECT_EQ(state[0], (std::pair<std::string, double>{"step_count", 17}));
  EXPECT_EQ(state[1], (std::pair<std::string, double>{"base_lr", 0.3}));

  // A fresh optimizer with another rate: the schedule's base_lr comes from the state.
  SGD sgd(one_parameter(), SGDOptions(0.7));
  CosineWithWarmup restored(sgd, 5, 40, 0.001);
  restored.load_state_scalars(state);
  EXPECT_EQ(sgd.lr(), original_sgd.lr());
  for (int i = 0; i < 30; ++i) {
    original.step();
    restored.step();
    ASSERT_EQ(sgd.lr(), original_sgd.lr()) << "step " << original.step_count();
  }
}

TEST(LRScheduler, BadStateThrowsAndLoadsNothing) {
  SGD sgd(one_parameter(), SGDOptions(0.1));
  StepLR schedule(sgd, 2, 0.5);
  schedule.step();
  schedule.step();
  EXPECT_TRUE(throws_error(
      [&] {
        schedule.load_state_scalars({{"step_count", 3}});
      },
      "missing 'base_lr'"));
  EXPECT_TRUE(throws_error(
      [&] {
        schedule.load_state_scalars({{"step_count", -1}, {"base_lr", 0.1}});
      },
      "'step_count' must be a non-negative whole number"));
  EXPECT_TRUE(throws_error(
      [&] {
        schedule.load_state_scalars({{"step_count", 1.5}, {"base_lr", 0.1}});
      },
      "'step_count' must be a non-negative whole number"));
  EXPECT_TRUE(throws_error(
      [&] {
        schedule.load_state_scalars({{"step_count", 1}, {"base_lr", NAN}});
      },
      "'base_lr' must be finite"));
  EXPECT_TRUE(throws_error(
      [&] {
        schedule.load_state_scalars({{"step_count", 1}, {"base_lr", 0.1}, {"gamma", 2}});
      },
      "unexpected scalar 'gamma'"));
  EXPECT_EQ(schedule.step_count(), 2);
  EXPECT_EQ(sgd.lr(), 0.05);
}

TEST(StepLR, RejectsBadArguments) {
  SGD sgd(one_parameter(), SGDOptions(0.1));
  EXPECT_TRUE(throws_error([&] { StepLR(sgd, -1, 0.1); }, "StepLR: step_size must be > 0, got -1"));
  EXPECT_TRUE(throws_error([&] { StepLR(sgd, 0, 0.1); }, "StepLR: step_size must be > 0, got 0"));
  EXPECT_TRUE(throws_error([&] { StepLR(sgd, 3, -0.5); }, "StepLR: gamma must be finite and >= 0"));
  EXPECT_TRUE(throws_error([&] { StepLR(sgd, 3, INFINITY); }, "StepLR: gamma must be finite"));
  EXPECT_EQ(sgd.lr(), 0.1);
}

TEST(CosineWithWarmup, RejectsBadArguments) {
  SGD sgd(one_parameter(), SGDOptions(0.1));
  EXPECT_TRUE(throws_error([&] { CosineWithWarmup(sgd, 20, 10); },
                           "CosineWithWarmup: warmup_steps (20) must not exceed total_steps (10)"));
  EXPECT_TRUE(throws_error([&] { CosineWithWarmup(sgd, -1, 10); },
                           "CosineWithWarmup: warmup_steps must be >= 0, got -1"));
  EXPECT_TRUE(throws_error([&] { CosineWithWarmup(sgd, 0, 0); },
                           "CosineWithWarmup: total_steps must be > 0, got 0"));
  EXPECT_TRUE(throws_error([&] { CosineWithWarmup(sgd, 1, 10, 0.5); },
                           "CosineWithWarmup: min_lr must be in [0, base lr = 0.1], got 0.5"));
  EXPECT_TRUE(throws_error([&] { CosineWithWarmup(sgd, 1, 10, -0.01); }, "min_lr must be in"));
  EXPECT_EQ(sgd.lr(), 0.1);
}

TEST(LinearWarmupDecay, RejectsBadArguments) {
  SGD sgd(one_parameter(), SGDOptions(0.1));
  EXPECT_TRUE(
      throws_error([&] { LinearWarmupDecay(sgd, 11, 10); },
                   "LinearWarmupDecay: warmup_steps (11) must not exceed total_steps (10)"));
  EXPECT_TRUE(throws_error([&] { LinearWarmupDecay(sgd, -2, 10); },
                           "LinearWarmupDecay: warmup_steps must be >= 0"));
  EXPECT_TRUE(throws_error([&] { LinearWarmupDecay(sgd, 0, -5); },
                           "LinearWarmupDecay: total_steps must be > 0, got -5"));
}

}  // namespace
}  // namespace tessel::optim
