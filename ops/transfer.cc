// The `to_device` op. Only host-to-host copies are done here; the CUDA backend (cuda/copy.cc)
// registers the transfer kernel for both device types, since the kernel that runs is chosen by
// the output's device (a CUDA-to-CPU copy runs the kCpu kernel).
#include "ops/transfer.h"

#include <cstring>

#include "ops/ops.h"
#include "ops/registry_helpers.h"

namespace tessel {
namespace {

// Copies a strided tensor of `element` bytes per value into dense `out`, row-major.
void gather_host(const char* base, const Shape& sizes, const Shape& strides, size_t element,
                 char* out) {
  const int64_t dims = static_cast<int64_t>(sizes.size());
  int64_t total = 1;
  for (int64_t s : sizes) total *= s;
  if (total == 0) return;
  std::vector<int64_t> index(dims, 0);
  for (int64_t n = 0; n < total; ++n) {
    int64_t offset = 0;
    for (int64_t d = 0; d < dims; ++d) offset += index[d] * strides[d];
    std::memcpy(out + n * element, base + offset * static_cast<int64_t>(element), element);
    for (int64_t d = dims - 1; d >= 0; --d) {
      if (++index[d] < sizes[d]) break;
      index[d] = 0;
    }
  }
}

void host_transfer_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  Tensor& out = ctx.outputs[0];
  TESSEL_CHECK(x.device().is_cpu() && out.device().is_cpu(), "to_device: cannot move a tensor ",
               "from ", x.device().str(), " to ", out.device().str(),
               ": Tessel was built without CUDA (rebuild with --config=cuda)");
  const char* source = static_cast<const char*>(x.raw_data());
  char* destination = static_cast<char*>(out.raw_data());
  if (x.is_contiguous() && out.is_contiguous()) {
    std::memcpy(destination, source, x.nbytes());
    return;
  }
  TESSEL_CHECK(out.is_contiguous(), "to_device: the output must be contiguous");
  gather_host(source, x.sizes(), x.strides(), x.element_size(), destination);
}

}  // namespace

bool cuda_transfers_built() {
  return ops::to_device->kernels[static_cast<int>(DeviceType::kCuda)] != nullptr;
}

TESSEL_REGISTER_OPS(transfer) {
  OpDef& op = OpRegistry::get().define(ops::to_device);
  op.kind = OpKind::kDataMovement;
  op.autocast = AutocastPolicy::kWiden;
  op.flags.device_transfer = true;
  op.shape = [](const std::vector<Tensor>& in, const Attrs& attrs) {
    TESSEL_CHECK(in.size() == 1 && in[0].defined(), "to_device: expected one defined tensor");
    const Device target = Device::parse(attrs.get<std::string>("device"));
    const Device source = in[0].device();
    TESSEL_CHECK(!source.is_meta() && !target.is_meta(), "to_device: cannot move ", source.str(),
                 " to ", target.str(), " (a meta tensor has no bytes; use empty() on",
                 " the meta device)");
    TESSEL_CHECK(!(source.is_cuda() || target.is_cuda()) || cuda_transfers_built(), "to(",
                 target.str(), "): Tessel was built without CUDA (rebuild with ",
                 "--config=cuda to use ", target.is_cuda() ? target.str() : source.str(), ")");
    return std::vector<OutputSpec>{{in[0].sizes(), in[0].dtype()}};
  };
  if (!op.kernels[static_cast<int>(DeviceType::kCpu)])  // the CUDA backend may have set it first
    op.kernels[static_cast<int>(DeviceType::kCpu)] = host_transfer_kernel;
  // The gradient goes back to where the input was.
  op.backward = [](const BackwardContext& ctx) -> std::vector<Tensor> {
    if (!ctx.grad_outputs[0].defined()) return {Tensor()};
    const Device source = Device::parse(ctx.attrs.get<std::string>("source_device"));
    return {to_device(ctx.grad_outputs[0], source)};
  };
  op.cost = [](const std::vector<Tensor>& in, const std::vector<Tensor>&, const Attrs&) {
    return OpCost{0, 2.0 * static_cast<double>(in[0].nbytes())};
  };
  // Not replayable from an op record: its output lives on another device than its input.
  op.flags.pure = false;
}

Tensor to_device(const Tensor& x, Device device, bool non_blocking) {
  TESSEL_CHECK(x.defined(), "to_device: undefined tensor");
  if (x.device() == device) return x;
  return dispatch(ops::to_device, {x},
                  Attrs{{"device", device.str()},
                        {"source_device", x.device().str()},
                        {"non_blocking", non_blocking}})[0];
}

}  // namespace tessel
