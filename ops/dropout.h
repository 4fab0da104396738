// Dropout: the handle of every op registered in ops/dropout.cc.
//   Tensor y = dispatch(ops::dropout, inputs, attrs)[0];
#pragma once

#include "core/op.h"

namespace tessel::ops {

inline const OpHandle dropout{"dropout"};

}  // namespace tessel::ops
