// The op contract: every registered op (the ops of //ops, the tensor-parallel collectives and the
// fused optimizer updates) declares its kind and its autocast policy on its OpDef, and the
// planner prices and splits every kind.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "core/op.h"
#include "ops/ops.h"
#include "parallel/planner/strategies.h"
#include "tests/planner/round_number_profile.h"

namespace tessel::planner {
namespace {

TEST(OpContract, EveryRegisteredOpDeclaresItsKindAndAutocastPolicy) {
  const std::vector<std::string> names = OpRegistry::get().names();
  // The families whose ops live outside //ops are linked too.
  for (const char* expected : {"conv2d", "tp_reduce", "adam_update"})
    EXPECT_NE(std::find(names.begin(), names.end(), expected), names.end()) << expected;
  for (const std::string& name : names) {
    const OpDef& op = OpRegistry::get().find(name);
    EXPECT_NE(op.kind, OpKind::kUnspecified) << name << " declares no OpKind";
    EXPECT_NE(op.autocast, AutocastPolicy::kUnspecified) << name << " declares no autocast policy";
    // Views pass their inputs through: a cast would make a copy, not a view.
    if (op.flags.view) {
      EXPECT_EQ(op.autocast, AutocastPolicy::kKeep) << name;
    }
  }
}

TEST(OpContract, ThePlannerPricesEveryKind) {
  const DeviceProfile profile = round_number_profile();
  for (OpKind kind : kAllOpKinds) {
    OpDef def;
    def.name = op_kind_name(kind);
    def.kind = kind;
    TracedOp traced;
    traced.name = def.name;
    traced.def = &def;
    const std::string rate = op_kind(traced);
    EXPECT_FALSE(rate.empty()) << def.name;
    EXPECT_GT(profile.op_time(rate, 1e6, 1e6, false), 0) << def.name;
  }
}

TEST(OpContract, DeclaredRatesAreKindsTheProfilesMeasure) {
  const std::set<std::string> measured = {
      "gemm",    "conv", "conv_grouped", "elementwise", "activation", "batch_norm", "layer_norm",
      "softmax", "pool", "concat",       "dropout",     "loss",       "embedding"};
  for (const std::string& name : OpRegistry::get().names()) {
    const OpDef& op = OpRegistry::get().find(name);
    if (op.planner.rate) {
      EXPECT_EQ(measured.count(op.planner.rate), 1u) << name;
    }
  }
}

}  // namespace
}  // namespace tessel::planner
