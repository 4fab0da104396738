// Factories, random numbers, copies and casts: the handle of every op registered in ops/factory.cc.
//   Tensor y = dispatch(ops::arange, inputs, attrs)[0];
#pragma once

#include "core/builtin_ops.h"  // ops::full, ops::clone, ops::to_dtype
#include "core/op.h"

namespace tessel::ops {

inline const OpHandle arange{"arange"};
inline const OpHandle rand{"rand"};
inline const OpHandle randn{"randn"};
inline const OpHandle randint{"randint"};
inline const OpHandle contiguous{"contiguous"};
inline const OpHandle fill_{"fill_"};
inline const OpHandle copy_{"copy_"};

}  // namespace tessel::ops
