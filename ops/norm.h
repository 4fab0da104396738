// Batch and layer normalisation: the handle of every op registered in ops/norm.cc.
//   Tensor y = dispatch(ops::batch_norm, inputs, attrs)[0];
#pragma once

#include "core/op.h"

namespace tessel::ops {

inline const OpHandle batch_norm{"batch_norm"};
inline const OpHandle batch_norm_eval{"batch_norm_eval"};
inline const OpHandle batch_norm_backward{"batch_norm_backward"};
inline const OpHandle layer_norm{"layer_norm"};
inline const OpHandle layer_norm_backward{"layer_norm_backward"};

}  // namespace tessel::ops
