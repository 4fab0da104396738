// Plan files (the planner's JSON): plan_from_json must return a plan whose fields pass its own
// checks or throw tessel::Error; a plan it returns is written with plan_to_json and read back
// unchanged.
#include <string>

#include "fuzz/harness.h"
#include "parallel/planner/plan_io.h"

namespace tessel::fuzz {
namespace {

bool same_plan(const planner::PlanFile& a, const planner::PlanFile& b) {
  return a.model == b.model && a.devices == b.devices && a.batch == b.batch && a.seq == b.seq &&
         a.image_size == b.image_size && a.profile == b.profile &&
         a.profile_layout == b.profile_layout && a.memory_per_device == b.memory_per_device &&
         a.mesh_dp == b.mesh_dp && a.mesh_tp == b.mesh_tp && a.memory_policy == b.memory_policy &&
         a.memory_budget == b.memory_budget && a.remat_fraction == b.remat_fraction &&
         a.predicted_memory == b.predicted_memory && a.predicted_time == b.predicted_time &&
         a.summary == b.summary && a.parameters == b.parameters && a.ops == b.ops;
}

}  // namespace
}  // namespace tessel::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessel;
  planner::PlanFile plan;
  if (!fuzz::expect_only_tessel_errors(
          [&] { plan = planner::plan_from_json(fuzz::as_string(data, size), "fuzz input"); }))
    return 0;
  TESSEL_FUZZ_CHECK(plan.devices >= 1 && plan.mesh_dp >= 1 && plan.mesh_tp >= 1, "devices ",
                    plan.devices, ", mesh dp ", plan.mesh_dp, " tp ", plan.mesh_tp);
  TESSEL_FUZZ_CHECK(static_cast<int64_t>(plan.mesh_dp) * plan.mesh_tp <= plan.devices,
                    "the mesh needs more than the devices");
  for (const auto& parameter : plan.parameters)
    TESSEL_FUZZ_CHECK(parameter.parts >= 1, "parameter '", parameter.name, "' in ", parameter.parts,
                      " parts");
  for (const auto& op : plan.ops)
    TESSEL_FUZZ_CHECK(op.dp >= 1 && op.tp >= 1 && int64_t{op.dp} * op.tp <= plan.devices, "op '",
                      op.op, "' at dp ", op.dp, " tp ", op.tp);
  planner::PlanFile reread;
  const bool reread_ok = fuzz::expect_only_tessel_errors(
      [&] { reread = planner::plan_from_json(planner::plan_to_json(plan), "written plan"); });
  TESSEL_FUZZ_CHECK(reread_ok, "a plan that was read does not read back once written");
  TESSEL_FUZZ_CHECK(fuzz::same_plan(plan, reread), "the plan changed when written and read back");
  return 0;
}
