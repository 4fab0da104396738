// Pooling and its gradients: the handle of every op registered in ops/pool.cc.
//   Tensor y = dispatch(ops::max_pool2d, inputs, attrs)[0];
#pragma once

#include "core/op.h"

namespace tessel::ops {

inline const OpHandle max_pool2d{"max_pool2d"};
inline const OpHandle max_pool2d_backward{"max_pool2d_backward"};
inline const OpHandle avg_pool2d{"avg_pool2d"};
inline const OpHandle avg_pool2d_backward{"avg_pool2d_backward"};
inline const OpHandle adaptive_avg_pool2d{"adaptive_avg_pool2d"};
inline const OpHandle adaptive_avg_pool2d_backward{"adaptive_avg_pool2d_backward"};

}  // namespace tessel::ops
