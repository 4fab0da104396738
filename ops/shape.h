// Views and the gradient of a slice: the handle of every op registered in ops/shape.cc.
//   Tensor y = dispatch(ops::view, inputs, attrs)[0];
#pragma once

#include "core/builtin_ops.h"  // ops::reshape
#include "core/op.h"

namespace tessel::ops {

inline const OpHandle view{"view"};
inline const OpHandle transpose{"transpose"};
inline const OpHandle permute{"permute"};
inline const OpHandle slice{"slice"};
inline const OpHandle slice_backward{"slice_backward"};
inline const OpHandle select{"select"};
inline const OpHandle expand{"expand"};
inline const OpHandle squeeze{"squeeze"};
inline const OpHandle unsqueeze{"unsqueeze"};

}  // namespace tessel::ops
