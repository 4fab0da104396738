// Reductions and softmax: the handle of every op registered in ops/reduce.cc.
//   Tensor y = dispatch(ops::mean, inputs, attrs)[0];
#pragma once

#include "core/builtin_ops.h"  // ops::sum
#include "core/op.h"

namespace tessel::ops {

inline const OpHandle mean{"mean"};
inline const OpHandle max{"max"};
inline const OpHandle min{"min"};
inline const OpHandle max_all{"max_all"};
inline const OpHandle min_all{"min_all"};
inline const OpHandle argmax{"argmax"};
inline const OpHandle var{"var"};
inline const OpHandle softmax{"softmax"};
inline const OpHandle log_softmax{"log_softmax"};

}  // namespace tessel::ops
