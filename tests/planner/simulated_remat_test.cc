// The planner's recomputation prices from the memory simulator: a zoo model's step simulated
// under activation budgets gives a factor per fraction, the planner prices those fractions with
// it, and the plan command does so with --simulate_remat.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "models/simulate.h"
#include "models/trace.h"
#include "parallel/planner/planner.h"
#include "tools/plan/plan_cli.h"

namespace tessel::planner {
namespace {

ModelSpec small_resnet() {
  ModelSpec spec;
  spec.name = "resnet18";
  spec.batch = 16;
  spec.image_size = 64;
  spec.num_classes = 10;
  return spec;
}

TEST(SimulatedRemat, EachFractionGetsAFactorThatReproducesItsSlowdown) {
  const DeviceProfile profile = load_profile(find_profile("h200_cluster"));
  const models::RematOverhead overhead =
      models::simulate_remat_overhead(small_resnet(), profile, {1.0, 0.5, 0.25});
  EXPECT_GT(overhead.step_seconds, overhead.forward_seconds);
  EXPECT_GT(overhead.forward_seconds, 0);
  EXPECT_LT(overhead.fixed_bytes, overhead.peak_bytes);
  ASSERT_EQ(overhead.k.count(1.0), 0u);  // nothing to recompute
  ASSERT_EQ(overhead.k.count(0.5), 1u) << overhead.failed.begin()->second;
  ASSERT_EQ(overhead.k.count(0.25), 1u) << overhead.failed.begin()->second;
  // Recomputation costs time at both (not necessarily more at the tighter one: DTR's choices
  // are not monotonic in the budget).
  EXPECT_GT(overhead.slowdown.at(0.5), 1.0);
  EXPECT_GT(overhead.slowdown.at(0.25), 1.0);
  for (double f : {0.5, 0.25}) {
    const double extra = (1 - f) * overhead.forward_seconds * overhead.k.at(f);
    EXPECT_NEAR(overhead.step_seconds + extra, overhead.slowdown.at(f) * overhead.step_seconds,
                1e-12);
  }
  // Deterministic: the same figures again.
  const models::RematOverhead again =
      models::simulate_remat_overhead(small_resnet(), profile, {0.5});
  EXPECT_EQ(again.k.at(0.5), overhead.k.at(0.5));
}

TEST(SimulatedRemat, ThePlannerPricesAFractionWithItsFactor) {
  const ModelSpec spec = small_resnet();
  const Graph graph = models::trace_model(spec);
  PlanOptions options;
  options.config.devices = 1;
  options.config.profile = load_profile(find_profile("h200_cluster"));
  options.remat_fractions = {0.5};
  options.memory_per_device = 1e12;
  const PlanResult constant = plan_graph(graph, options);
  options.remat_overhead_k[0.5] = 3 * options.config.profile.remat_overhead_k;
  const PlanResult measured = plan_graph(graph, options);
  ASSERT_GE(constant.chosen, 0);
  ASSERT_GE(measured.chosen, 0);
  const PlanBreakdown& a = constant.frontier[constant.chosen].breakdown;
  const PlanBreakdown& b = measured.frontier[measured.chosen].breakdown;
  EXPECT_GT(a.recompute_s, 0);
  EXPECT_NEAR(b.recompute_s, 3 * a.recompute_s, 1e-9 * b.recompute_s);
}

TEST(SimulatedRemat, ThePlanCommandSimulatesWhenAsked) {
  const char* argv[] = {"plan",          "--model=resnet18", "--devices=1",
                        "--batch=16",    "--image_size=64",  "--num_classes=10",
                        "--remat=1,0.5", "--simulate_remat", "--profile=h200_cluster"};
  std::ostringstream out, err;
  EXPECT_EQ(run_plan_cli(9, argv, out, err), 0) << err.str();
  EXPECT_NE(out.str().find("remat_overhead_k"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("  0.5: step "), std::string::npos) << out.str();
}

}  // namespace
}  // namespace tessel::planner
