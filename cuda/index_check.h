// The index check of embedding, index_select, gather and the class losses on a GPU: queued on the
// compute stream before the op's kernel, with no wait for the device. A bad index is recorded in
// the device's error record (the first one in stream order, at its lowest position) and raised
// by the next synchronisation point (cuda/runtime.h); the op's kernel skips it meanwhile.
//   check_indices(context, indices, {IndexOp::kEmbedding, 0, weight.size(0)});
#pragma once

#include "core/op.h"
#include "core/tensor.h"
#include "cuda/index_error.h"

namespace tessel::cuda {

// Checks every value of the dense i64/i32 `index` against `check` (op, dim, size, ignore_index).
void check_indices(KernelContext& context, const Tensor& index, const IndexError& check);

}  // namespace tessel::cuda
