// Convolution and its two gradients: the handle of every op registered in ops/conv.cc.
//   Tensor y = dispatch(ops::conv2d, inputs, attrs)[0];
#pragma once

#include "core/op.h"

namespace tessel::ops {

inline const OpHandle conv2d{"conv2d"};
inline const OpHandle conv2d_backward_input{"conv2d_backward_input"};
inline const OpHandle conv2d_backward_weight{"conv2d_backward_weight"};

}  // namespace tessel::ops
