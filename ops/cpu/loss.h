// The CPU kernels of the losses and their gradients (ops/cpu/loss.cc), and what the losses'
// definitions (ops/loss.cc) share with them: the reduction attribute and the class layout.
#pragma once

#include <cstdint>
#include <string>

#include "core/op.h"

namespace tessel::cpu {

enum class Reduction { kNone, kMean, kSum };

// The `reduction` attribute ("none", "mean" or "sum"); `op` names the op in the error.
Reduction parse_reduction(const char* op, const std::string& reduction);
Reduction reduction_of(const char* op, const Attrs& attrs);

// Scores viewed as (outer, classes, inner): (C) is (1, C, 1), (N, C, d...) is (N, C, prod d).
struct ClassLayout {
  int64_t outer, classes, inner;
  int64_t positions() const { return outer * inner; }
};

ClassLayout class_layout(const Shape& sizes);

// f32 and f64; the inputs and outputs each op's definition lists.
void cross_entropy_kernel(KernelContext& context);
void cross_entropy_backward_kernel(KernelContext& context);
void nll_loss_kernel(KernelContext& context);
void nll_loss_backward_kernel(KernelContext& context);
void mse_loss_kernel(KernelContext& context);

}  // namespace tessel::cpu
