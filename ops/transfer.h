// Moving tensors between devices: the `to_device` op behind Tensor::to(Device). Defined in every
// build (shape rule, backward = the transfer back); the CUDA backend adds the copies. Without it,
// a transfer to or from CUDA is a clear error.
//   Tensor batch = to_device(cpu_batch, Device::cuda(), /*non_blocking=*/true);
#pragma once

#include "core/op.h"
#include "core/tensor.h"

namespace tessel {

namespace ops {
inline const OpHandle to_device{"to_device"};  // registered in ops/transfer.cc
}  // namespace ops

// A copy of `x` on `device`, same dtype and shape, contiguous; differentiable (the gradient is
// moved back). A CPU-to-CUDA copy never waits for the device: it goes through pinned staging
// memory on the copy stream and later CUDA work waits for it. A copy to the CPU blocks (the host
// reads the bytes next). `non_blocking` is accepted as in libtorch; a copy between GPUs still
// waits without it. Returns `x` itself when it already is on `device`.
Tensor to_device(const Tensor& x, Device device, bool non_blocking = false);

// Whether this binary has a CUDA transfer (built with --config=cuda).
bool cuda_transfers_built();

}  // namespace tessel
