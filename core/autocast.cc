#include "core/autocast.h"

#include "core/op.h"

namespace tessel {

namespace {
thread_local std::optional<DType> current_autocast;
}  // namespace

std::optional<DType> autocast_dtype() { return current_autocast; }

AutocastGuard::AutocastGuard(DType dtype, bool enabled) : previous_(current_autocast) {
  TESSEL_CHECK(!enabled || dtype == DType::kBFloat16 || dtype == DType::kFloat16,
               "AutocastGuard: the autocast dtype must be bf16 or f16, got ", dtype_name(dtype));
  current_autocast = enabled ? std::optional<DType>(dtype) : std::nullopt;
}

AutocastGuard::~AutocastGuard() { current_autocast = previous_; }

AutocastPolicy autocast_policy(const OpDef& op) {
  TESSEL_CHECK(op.autocast != AutocastPolicy::kUnspecified, op.name,
               ": the op declares no autocast policy (set OpDef::autocast where it is registered)");
  return op.autocast;
}

}  // namespace tessel
