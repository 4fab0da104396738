// WayChooser (auto's choice among its ways by step times): the order of its trials, the second
// try of close ways, settling steps not counted, keeping the fastest way when step times are
// noisy, and giving up a way whose trial step thrashes.
#include "memory/way_chooser.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

#include "tests/testing.h"

namespace tessel::memory {
namespace {

using testing::throws_error;

// Runs `steps` steps whose times are `seconds[way]`; returns the way each step ran.
std::vector<int> run(WayChooser& chooser, const std::vector<double>& seconds, int steps) {
  std::vector<int> ways;
  for (int step = 0; step < steps; ++step) {
    ways.push_back(chooser.way());
    chooser.on_step(seconds[chooser.way()]);
  }
  return ways;
}

TEST(WayChooser, TriesEachWayInTurnThenKeepsTheFastest) {
  WayChooserOptions options;
  options.trial_steps = 3;
  WayChooser chooser(5, options);
  EXPECT_TRUE(chooser.trying());
  const std::vector<double> seconds = {3, 2, 5, 1.5, 4};
  const std::vector<int> ways = run(chooser, seconds, 60);
  // Three counted steps each, after a settling step for every way but the first; no way is
  // within 10% of the fastest, so none is tried again.
  EXPECT_EQ(std::vector<int>(ways.begin(), ways.begin() + 19),
            (std::vector<int>{0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4}));
  EXPECT_FALSE(chooser.trying());
  for (size_t step = 19; step < ways.size(); ++step) EXPECT_EQ(ways[step], 3) << step;
  for (int way = 0; way < 5; ++way) EXPECT_DOUBLE_EQ(chooser.estimate(way), seconds[way]);
  EXPECT_EQ(chooser.counted_steps(1), 3);
}

TEST(WayChooser, TriesTheWaysCloseToTheBestAgain) {
  WayChooserOptions options;
  options.trial_steps = 2;
  WayChooser chooser(4, options);
  const std::vector<int> ways = run(chooser, {1.0, 1.05, 2.0, 1.08}, 19);
  // 1 and 3 are within 10% of 0: tried again, the closest first, then 0 is kept.
  EXPECT_EQ(ways, (std::vector<int>{0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 1, 1, 1, 3, 3, 3, 0, 0}));
  EXPECT_FALSE(chooser.trying());
  EXPECT_EQ(chooser.counted_steps(1), 4);
  EXPECT_EQ(chooser.counted_steps(2), 2);
}

// The first step after a change pays for what the way before left behind (here twice the way's
// time): it is not held against the way, whose later steps are its own.
TEST(WayChooser, DoesNotCountTheStepAfterAChange) {
  WayChooser chooser(2);  // six counted steps a trial
  const std::vector<double> seconds = {1.0, 0.9};
  int previous = chooser.way();
  for (int step = 0; step < 30; ++step) {
    const int way = chooser.way();
    chooser.on_step(way != previous ? 2 * seconds[way] : seconds[way]);
    previous = way;
  }
  EXPECT_EQ(chooser.way(), 1);
  EXPECT_DOUBLE_EQ(chooser.estimate(1), 0.9);
}

// The kept way follows its steps: once it is slower than another way was, that way runs.
TEST(WayChooser, GivesWayWhenTheKeptWayBecomesSlower) {
  WayChooser chooser(2);
  run(chooser, {1.0, 1.5}, 30);
  EXPECT_EQ(chooser.way(), 0);
  const std::vector<int> ways = run(chooser, {2.0, 1.5}, 30);
  EXPECT_EQ(ways.back(), 1);
}

// Step times with 5% noise either way, one step in twenty half again as long, and 20% more on the
// first step after a change; true times: way 3 fastest by 6%. Over many runs the way kept when
// the trials end is nearly always the fastest, and the steps after run nearly all on it.
TEST(WayChooser, KeepsTheFastestWayWhenStepTimesAreNoisy) {
  const std::vector<double> truth = {1.00, 1.06, 1.25, 0.94, 1.00};
  constexpr int kRuns = 200;
  constexpr int kSteps = 300;
  int kept_fastest = 0;
  double steady_excess = 0;  // of the steps after the trials, in true time, over the fastest
  for (int run = 0; run < kRuns; ++run) {
    std::mt19937 random(static_cast<unsigned>(run));
    std::uniform_real_distribution<double> uniform(0, 1);
    WayChooser chooser(5);
    int previous = chooser.way();
    bool was_trying = true;
    double steady_seconds = 0;
    int steady_steps = 0;
    for (int step = 0; step < kSteps; ++step) {
      const int way = chooser.way();
      double seconds = truth[way] * (0.95 + 0.1 * uniform(random));
      if (uniform(random) < 0.05) seconds *= 1.5;
      if (way != previous) seconds *= 1.2;
      previous = way;
      if (!chooser.trying()) {
        if (was_trying && way == 3) ++kept_fastest;
        was_trying = false;
        steady_seconds += truth[way];
        ++steady_steps;
      }
      chooser.on_step(seconds);
    }
    steady_excess += steady_seconds / steady_steps / truth[3] - 1;
  }
  steady_excess /= kRuns;
  std::printf("kept the fastest in %d of %d runs; steady steps %.4f over the fastest\n",
              kept_fastest, kRuns, steady_excess);
  EXPECT_GE(kept_fastest, kRuns * 9 / 10);
  EXPECT_LE(steady_excess, 0.01);
}

// A step on trial that runs past give_up_factor times the best estimate is given up: the rest of
// it runs the fastest way counted so far, it is not counted, and its way never runs again (here
// way 1, which would otherwise be kept).
TEST(WayChooser, GivesUpAWayWhoseTrialStepThrashes) {
  WayChooserOptions options;
  options.trial_steps = 2;
  WayChooser chooser(3, options);
  EXPECT_EQ(chooser.give_up_after(), 0);  // nothing counted yet
  chooser.on_step(1.0);
  EXPECT_DOUBLE_EQ(chooser.give_up_after(), 3.0);
  chooser.on_step(1.0);
  ASSERT_EQ(chooser.way(), 1);
  chooser.on_step(1.2);  // settling
  chooser.on_step(0.5);
  EXPECT_DOUBLE_EQ(chooser.give_up_after(), 1.5);  // 3 x way 1's own 0.5
  EXPECT_EQ(chooser.give_up(), 0);
  EXPECT_TRUE(chooser.given_up(1));
  EXPECT_EQ(chooser.way(), 2);            // the trial goes on
  EXPECT_EQ(chooser.give_up_after(), 0);  // no second bound in the step given up
  chooser.on_step(40.0);                  // that step: not counted
  EXPECT_EQ(chooser.counted_steps(1), 1);
  EXPECT_DOUBLE_EQ(chooser.estimate(1), 0.5);
  const std::vector<int> ways = run(chooser, {1.0, 0.5, 2.0}, 40);
  EXPECT_EQ(std::count(ways.begin(), ways.end(), 1), 0);
  EXPECT_FALSE(chooser.trying());
  EXPECT_EQ(ways.back(), 0);
}

// The last way left, and the kept way in the steady phase, are never given up.
TEST(WayChooser, NeverGivesUpTheLastWayOrTheKeptOne) {
  WayChooser chooser(2);
  chooser.on_step(1.0);
  EXPECT_EQ(chooser.give_up(), 1);  // nothing else counted: the rest runs the next way
  EXPECT_EQ(chooser.way(), 1);
  EXPECT_EQ(chooser.give_up_after(), 0);
  run(chooser, {1.0, 2.0}, 20);
  EXPECT_EQ(chooser.way(), 1);
  EXPECT_FALSE(chooser.trying());
  EXPECT_EQ(chooser.give_up_after(), 0);
  EXPECT_TRUE(throws_error([&] { chooser.give_up(); }, "no step to give up"));

  WayChooser steady(2);
  run(steady, {1.0, 2.0}, 20);
  EXPECT_FALSE(steady.trying());
  EXPECT_EQ(steady.give_up_after(), 0);
}

TEST(WayChooser, RejectsBadSettings) {
  EXPECT_TRUE(throws_error([] { WayChooser chooser(0); }, "at least one way"));
  WayChooserOptions options;
  options.trial_steps = 0;
  EXPECT_TRUE(throws_error([&] { WayChooser chooser(2, options); }, "trial_steps"));
  options = WayChooserOptions();
  options.give_up_factor = 1;
  EXPECT_TRUE(throws_error([&] { WayChooser chooser(2, options); }, "give_up_factor"));
}

}  // namespace
}  // namespace tessel::memory
