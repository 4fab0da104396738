// Gradient clipping by total norm, as torch.nn.utils.clip_grad_norm_: the norm of all gradients
// taken together; when it exceeds max_norm every gradient is scaled by max_norm / (norm + 1e-6).
//   double norm = clip_grad_norm(net->parameters(), 1.0);   // or norm_type = INFINITY
#pragma once

#include <vector>

#include "core/tensor.h"

namespace tessel::optim {

// Returns the total norm before clipping (0 when no parameter has a gradient). norm_type is a
// positive p or INFINITY (largest absolute value). With error_if_nonfinite, a NaN or infinite
// total norm throws instead of scaling.
double clip_grad_norm(const std::vector<Tensor>& parameters, double max_norm,
                      double norm_type = 2.0, bool error_if_nonfinite = false);

}  // namespace tessel::optim
