// Plan files (the planner's JSON): plan_from_json must return a plan whose fields pass its own
// checks or throw tessel::Error; a plan it returns is written with plan_to_json and read back
// unchanged.
#include <string>

#include "fuzz/harness.h"
#include "parallel/planner/plan_io.h"

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
  fuzz::check_reads_back(
      plan, [](const std::string& text) { return planner::plan_from_json(text, "written plan"); },
      [](const planner::PlanFile& value) { return planner::plan_to_json(value); });
  return 0;
}
