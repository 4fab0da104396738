// Losses and their gradients: the handle of every op registered in ops/loss.cc.
//   Tensor y = dispatch(ops::cross_entropy, inputs, attrs)[0];
#pragma once

#include "core/op.h"

namespace tessel::ops {

inline const OpHandle cross_entropy{"cross_entropy"};
inline const OpHandle cross_entropy_backward{"cross_entropy_backward"};
inline const OpHandle nll_loss{"nll_loss"};
inline const OpHandle nll_loss_backward{"nll_loss_backward"};
inline const OpHandle mse_loss{"mse_loss"};

}  // namespace tessel::ops
