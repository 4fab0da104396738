// Autocast (mixed precision): inside an AutocastGuard the dispatcher runs the ops whose policy is
// kLowerPrecision (products and convolutions: matmul, bmm, linear, conv2d) on 16-bit copies of
// their floating inputs (PyTorch's convention: 16-bit outputs, f32 parameters), and widens 16-bit
// inputs of kWiden ops back to f32. Each op declares its policy (OpDef::autocast, core/op.h). The
// casts are ops, so gradients flow to the f32 parameters.
//   { AutocastGuard autocast(DType::kBFloat16); loss = model.forward(x); }  loss.backward();
#pragma once

#include <optional>
#include <string>

#include "core/dtype.h"
#include "core/op.h"

namespace tessel {

// The dtype the lower-precision ops run in on this thread; empty when autocast is off.
std::optional<DType> autocast_dtype();

// Turns autocast on (or, with enabled=false, off) on this thread for its lifetime; nests.
class AutocastGuard {
 public:
  explicit AutocastGuard(DType dtype, bool enabled = true);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  std::optional<DType> previous_;
};

// What autocast does to the floating inputs of `op` (its declared OpDef::autocast).
AutocastPolicy autocast_policy(const OpDef& op);

}  // namespace tessel
