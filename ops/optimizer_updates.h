// The fused optimizer updates, registered in optim/optim_ops.cc. Their handles live here so
// that the CUDA backend attaches its kernels (cuda/ops/optimizer_updates.cu) without depending on
// the optimizers.
#pragma once

#include "core/op.h"

namespace tessel::ops {

inline const OpHandle sgd_update{"sgd_update"};
inline const OpHandle adam_update{"adam_update"};

}  // namespace tessel::ops
