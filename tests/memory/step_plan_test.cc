// plan_step over small hand-made traces: what it swaps, drops and copies back, and when.
#include "memory/step_plan.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace tessel::memory {
namespace {

using Kind = PlannedAction::Kind;

// A chain of five forward ops (positions 0-4), op p making tensor p+1 (100 bytes) from tensor p,
// then five backward ops (5-9), op 5+i reading tensor 5-i: every tensor is held from its op to
// the backward op that reads it, 500 bytes at the turn (positions 4 and 5). Tensors 1 and 4 are
// dear to recompute (10 s), 2, 3 and 5 cheap (1 s); tensor 5 is read by backward right away.
StepTrace chain_trace() {
  StepTrace trace;
  const double costs[] = {10, 1, 1, 10, 1};
  for (int p = 0; p < 5; ++p) {
    trace.op(p, 1.0, /*in_backward=*/false);
    TracedTensor tensor;
    tensor.key = static_cast<uint64_t>(p + 1);
    tensor.bytes = 100;
    tensor.made_at = p;
    tensor.producer_seconds = costs[p];
    tensor.recomputable = true;
    tensor.input_keys = {static_cast<uint64_t>(p)};  // 0: the step's input, not made by an op
    trace.output(tensor);
    if (p > 0) trace.read(static_cast<uint64_t>(p), p);
  }
  for (int i = 0; i < 5; ++i) {
    trace.op(5 + i, 1.0, /*in_backward=*/true);
    trace.read(static_cast<uint64_t>(5 - i), 5 + i);
  }
  return trace;
}

std::vector<PlannedAction> actions_on(const StepPlan& plan, uint64_t key) {
  std::vector<PlannedAction> found;
  for (const auto& after : plan.after)
    for (const PlannedAction& action : after)
      if (action.key == key) found.push_back(action);
  return found;
}

int64_t position_of(const StepPlan& plan, uint64_t key, Kind kind) {
  for (int64_t p = 0; p < plan.length(); ++p)
    for (const PlannedAction& action : plan.after[p])
      if (action.key == key && action.kind == kind) return p;
  return -1;
}

TEST(StepPlan, WithoutALinkDropsTheCheapestPerByteUntilTheStepFits) {
  StepPlanSettings settings;
  settings.budget = 300;
  settings.headroom = 0;
  const StepPlan plan = plan_step(chain_trace(), settings);
  EXPECT_TRUE(plan.fits) << plan.summary();
  EXPECT_LE(plan.peak_bytes, 300u);
  EXPECT_EQ(plan.swapped_bytes, 0u);
  EXPECT_EQ(plan.evicted_bytes, 200u);
  // Position 4 holds tensors 1-5: of 1-3 (the ones not read there), the cheap 2 and 3 go, each
  // right after its last forward read. 3 is recomputed from 2, which then comes back with it.
  EXPECT_EQ(position_of(plan, 2, Kind::kEvict), 2);
  EXPECT_EQ(position_of(plan, 3, Kind::kEvict), 3);
  EXPECT_TRUE(actions_on(plan, 1).empty());
  EXPECT_TRUE(actions_on(plan, 4).empty());
  EXPECT_DOUBLE_EQ(plan.recompute_seconds, 2.0);
}

TEST(StepPlan, SwapsTheDearestWhereTheLinkHidesBothCopies) {
  StepPlanSettings settings;
  settings.budget = 300;
  settings.headroom = 0;
  settings.link_bytes_per_second = 1000;  // 0.1 s per copy, ops take 1 s
  const StepPlan plan = plan_step(chain_trace(), settings);
  EXPECT_TRUE(plan.fits) << plan.summary();
  EXPECT_LE(plan.peak_bytes, 300u);
  EXPECT_EQ(plan.evicted_bytes, 0u);
  // Tensor 1 (10 s to recompute): out after op 1 reads it, back after op 7 (its reader, op 9,
  // starts at 9 s; the copy takes 0.1 s and the op ending at 8 s is the last before it).
  EXPECT_EQ(position_of(plan, 1, Kind::kSwapOut), 1);
  EXPECT_EQ(position_of(plan, 1, Kind::kPrefetch), 7);
  // Tensor 4 is as dear, but idle for one op only: no copy out ends before its reader. Tensor 2
  // goes instead (back after op 6, the copy back of tensor 1 taking the link from 8.9 s).
  EXPECT_TRUE(actions_on(plan, 4).empty());
  EXPECT_EQ(position_of(plan, 2, Kind::kSwapOut), 2);
  EXPECT_EQ(position_of(plan, 2, Kind::kPrefetch), 6);
  EXPECT_EQ(plan.swapped_bytes, 200u);
}

TEST(StepPlan, ALinkTooSlowToHideTheCopiesLeavesRecomputing) {
  StepPlanSettings settings;
  settings.budget = 300;
  settings.headroom = 0;
  settings.link_bytes_per_second = 20;  // 5 s per copy: no copy out ends before backward
  const StepPlan plan = plan_step(chain_trace(), settings);
  EXPECT_EQ(plan.swapped_bytes, 0u);
  EXPECT_EQ(plan.evicted_bytes, 200u);
  EXPECT_TRUE(plan.fits);
}

TEST(StepPlan, ReportsWhereNothingBringsTheStepWithinTheBudget) {
  StepPlanSettings settings;
  settings.budget = 100;  // tensor 5 and the one backward reads next are held together
  settings.headroom = 0;
  const StepPlan plan = plan_step(chain_trace(), settings);
  EXPECT_FALSE(plan.fits);
  EXPECT_GT(plan.peak_bytes, 100u);
  EXPECT_NE(plan.summary().find("over the budget"), std::string::npos);
}

TEST(StepTrace, StopsRecordingPastItsLastPosition) {
  StepTrace trace;
  const int64_t last = StepTrace::kMaxPositions - 1;
  trace.op(last, 1.0, false);
  trace.op(last + 1, 1.0, false);
  TracedTensor late;
  late.key = 7;
  late.made_at = last + 1;
  trace.output(late);
  trace.read(7, last + 2);
  EXPECT_EQ(trace.length(), StepTrace::kMaxPositions);
  EXPECT_TRUE(trace.tensors().empty());
  EXPECT_TRUE(trace.reads(7).empty());
}

TEST(StepPlan, AnEmptyTracePlansNothing) {
  const StepPlan plan = plan_step(StepTrace(), StepPlanSettings{});
  EXPECT_EQ(plan.length(), 0);
  EXPECT_TRUE(plan.fits);
}

}  // namespace
}  // namespace tessel::memory
