// Element-wise arithmetic, comparisons, activations, clamp, where and masked_fill: the handle of
// every op registered in ops/elementwise.cc.
//   Tensor y = dispatch(ops::sub, inputs, attrs)[0];
#pragma once

#include "core/builtin_ops.h"  // ops::add
#include "core/op.h"

namespace tessel::ops {

inline const OpHandle sub{"sub"};
inline const OpHandle mul{"mul"};
inline const OpHandle div{"div"};
inline const OpHandle pow{"pow"};
inline const OpHandle maximum{"maximum"};
inline const OpHandle minimum{"minimum"};
inline const OpHandle add_scalar{"add_scalar"};
inline const OpHandle mul_scalar{"mul_scalar"};
inline const OpHandle div_scalar{"div_scalar"};
inline const OpHandle pow_scalar{"pow_scalar"};
inline const OpHandle eq{"eq"};
inline const OpHandle ne{"ne"};
inline const OpHandle lt{"lt"};
inline const OpHandle le{"le"};
inline const OpHandle gt{"gt"};
inline const OpHandle ge{"ge"};
inline const OpHandle neg{"neg"};
inline const OpHandle abs{"abs"};
inline const OpHandle exp{"exp"};
inline const OpHandle log{"log"};
inline const OpHandle sqrt{"sqrt"};
inline const OpHandle rsqrt{"rsqrt"};
inline const OpHandle tanh{"tanh"};
inline const OpHandle sigmoid{"sigmoid"};
inline const OpHandle relu{"relu"};
inline const OpHandle gelu{"gelu"};
inline const OpHandle gelu_backward{"gelu_backward"};
inline const OpHandle relu_backward{"relu_backward"};
inline const OpHandle clamp{"clamp"};
inline const OpHandle where{"where"};
inline const OpHandle masked_fill{"masked_fill"};

}  // namespace tessel::ops
