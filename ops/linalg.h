// Matrix products: the handle of every op registered in ops/linalg.cc.
//   Tensor y = dispatch(ops::matmul, inputs, attrs)[0];
#pragma once

#include "core/op.h"

namespace tessel::ops {

inline const OpHandle matmul{"matmul"};
inline const OpHandle bmm{"bmm"};
inline const OpHandle linear{"linear"};
inline const OpHandle addmm{"addmm"};

}  // namespace tessel::ops
