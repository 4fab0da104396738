// Joining, gathers and embedding lookups, with their scatter-add gradients: the handle of every op
// registered in ops/index.cc.
//   Tensor y = dispatch(ops::cat, inputs, attrs)[0];
#pragma once

#include "core/op.h"

namespace tessel::ops {

inline const OpHandle cat{"cat"};
inline const OpHandle index_select{"index_select"};
inline const OpHandle index_select_backward{"index_select_backward"};
inline const OpHandle gather{"gather"};
inline const OpHandle gather_backward{"gather_backward"};
inline const OpHandle embedding{"embedding"};
inline const OpHandle embedding_backward{"embedding_backward"};

}  // namespace tessel::ops
