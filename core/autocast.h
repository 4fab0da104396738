// Autocast (mixed precision): inside an AutocastGuard the dispatcher runs matmul, bmm, linear and
// conv2d on 16-bit copies of their floating inputs (PyTorch's convention: 16-bit outputs, f32
// parameters), and widens 16-bit inputs of every other op back to f32. The casts are ops, so
// gradients flow to the f32 parameters.
//   { AutocastGuard autocast(DType::kBFloat16); loss = model.forward(x); }  loss.backward();
#pragma once

#include <optional>
#include <string>

#include "core/dtype.h"

namespace tessel {

struct OpDef;

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

// What autocast does to the floating inputs of `op`.
enum class AutocastPolicy {
  kKeep,            // views and casts: inputs pass through unchanged
  kLowerPrecision,  // matmul, bmm, linear, conv2d: f32/f64 inputs cast to the autocast dtype
  kWiden,           // everything else: 16-bit float inputs cast to f32
};
AutocastPolicy autocast_policy(const OpDef& op);

}  // namespace tessel
