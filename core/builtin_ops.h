// Handles of the ops the core itself runs: autograd accumulates and reduces gradients with them,
// autocast casts with to_dtype. They are registered in ops/ (the op's family header includes
// this one); a binary that runs them links //ops.
#pragma once

#include "core/op.h"

namespace tessel::ops {

inline const OpHandle add{"add"};
inline const OpHandle sum{"sum"};
inline const OpHandle full{"full"};
inline const OpHandle reshape{"reshape"};
inline const OpHandle to_dtype{"to_dtype"};
inline const OpHandle clone{"clone"};

}  // namespace tessel::ops
