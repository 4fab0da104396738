// The CUDA kernels of the tensor-parallel collectives (tp_copy, tp_reduce, tp_gather, tp_scatter,
// tp_all_to_all, tp_reduce_scatter; defined with their CPU kernels in tensor_parallel.cc). The same
// steps as on the CPU: strided copies into dense buffers, the group's collective (NCCL on a GPU), a
// strided copy back. NCCL queues on the device's compute stream like the copies, so the host never
// waits in between.
#include <cuda_runtime.h>

#include "core/op.h"
#include "cuda/copy.h"
#include "cuda/runtime.h"
#include "ops/registry_helpers.h"
#include "parallel/tensor_parallel.h"

namespace tessel::parallel {
namespace {

const std::shared_ptr<Communicator>& device_group_of(const char* op, const KernelContext& ctx) {
  const auto& group = tp_group(ctx.attrs.get<int64_t>("group"));
  const Device device = ctx.inputs[0].device();
  TESSEL_CHECK(group->device() == device, op, ": the tensor-parallel group '", group->name(),
               "' moves tensors on ", group->device().str(), " but the input is on ", device.str(),
               " (register the group for the training device: "
               "register_tp_group(grid.tensor_parallel_on_device()))");
  return group;
}

// Writes the strided view (sizes, strides in elements) starting at `source` densely to `dense`.
void gather_into(const Tensor& dense, const void* source, const Shape& sizes, const Shape& strides,
                 cudaStream_t stream) {
  TESSEL_CHECK(dense.is_contiguous(), "tensor parallel (cuda): the destination must be dense");
  cuda::gather_contiguous(source, sizes, strides, dense.element_size(), dense.raw_data(), stream);
}

void gather_into(const Tensor& dense, const Tensor& source, cudaStream_t stream) {
  gather_into(dense, source.raw_data(), source.sizes(), source.strides(), stream);
}

void tp_copy_kernel(KernelContext& ctx) {
  const int device = ctx.inputs[0].device().index;
  cuda::DeviceGuard guard(device);
  gather_into(ctx.outputs[0], ctx.inputs[0], cuda::compute_stream(device));
}

void tp_reduce_kernel(KernelContext& ctx) {
  const auto& group = device_group_of("reduce_from_tp", ctx);
  const int device = ctx.inputs[0].device().index;
  cuda::DeviceGuard guard(device);
  cudaStream_t stream = cuda::compute_stream(device);
  const ReduceOp op = tp_reduce_op(ctx.attrs);
  // A dense output is reduced in place; the reduction needs no buffer of its own on the GPU.
  Tensor& output = ctx.outputs[0];
  gather_into(output, ctx.inputs[0], stream);
  group->all_reduce(output, op);
}

void tp_gather_kernel(KernelContext& ctx) {
  const auto& group = device_group_of("gather_from_tp", ctx);
  const Tensor& input = ctx.inputs[0];
  const int device = input.device().index;
  cuda::DeviceGuard guard(device);
  cudaStream_t stream = cuda::compute_stream(device);
  // all_gather concatenates flat buffers: send is the input dense, receive every rank's send in
  // rank order, read into the (dense) output in runs of each rank's part (gather_geometry).
  const GatherGeometry g = gather_geometry(input, group->size(), ctx.attrs);
  const int64_t numel = input.numel();
  Tensor send = ctx.workspace({numel}, input.dtype());
  gather_into(send, input, stream);
  Tensor receive = ctx.workspace({numel * group->size()}, input.dtype());
  group->all_gather(send, receive);
  gather_into(ctx.outputs[0], receive.raw_data(), g.received_sizes, g.received_strides, stream);
}

void tp_scatter_kernel(KernelContext& ctx) {
  const auto& group = device_group_of("scatter_to_tp", ctx);
  const Tensor& input = ctx.inputs[0];
  Tensor& output = ctx.outputs[0];
  const int device = input.device().index;
  cuda::DeviceGuard guard(device);
  // This rank's part of the cut dim: a view of the input at its first element.
  const int64_t dim = gather_geometry(input, 1, ctx.attrs).dim;
  const int64_t start = output.size(dim) * group->rank();
  const char* first = static_cast<const char*>(input.raw_data()) +
                      start * input.stride(dim) * static_cast<int64_t>(input.element_size());
  gather_into(output, first, output.sizes(), input.strides(), cuda::compute_stream(device));
}

void tp_all_to_all_kernel(KernelContext& ctx) {
  const auto& group = device_group_of("all_to_all_tp", ctx);
  const Tensor& input = ctx.inputs[0];
  const int device = input.device().index;
  cuda::DeviceGuard guard(device);
  cudaStream_t stream = cuda::compute_stream(device);
  const AllToAllGeometry g = all_to_all_geometry(input, group->size(), ctx.attrs);
  const int64_t piece_numel = shape_numel(g.piece_sizes);
  const auto element = static_cast<int64_t>(input.element_size());
  // Every piece, sent or kept, goes densely into its slot of one buffer; received ones replace
  // the sent ones in their slots (this rank's stays).
  Shape buffer_sizes = g.piece_sizes;
  buffer_sizes.insert(buffer_sizes.begin(), group->size());
  Tensor buffer = ctx.workspace(buffer_sizes, input.dtype());
  const Shape piece_strides = contiguous_strides(g.piece_sizes);
  auto slot_of = [&](int q) {
    return Tensor(make_tensor_impl(buffer.storage(), g.piece_sizes, piece_strides,
                                   buffer.storage_offset() + q * piece_numel, buffer.dtype()));
  };
  for (int q = 0; q < group->size(); ++q)
    gather_into(slot_of(q),
                static_cast<const char*>(input.raw_data()) + q * g.piece_offset * element,
                g.piece_sizes, input.strides(), stream);
  Tensor piece = ctx.workspace(g.piece_sizes, input.dtype());
  for (const AllToAllStep& step : all_to_all_schedule(group->rank(), group->size())) {
    if (step.peer == group->rank()) continue;
    Tensor slot = slot_of(step.peer);
    gather_into(piece, slot, stream);
    if (step.send_first) group->send(piece, step.peer);
    group->recv(slot, step.peer);
    if (!step.send_first) group->send(piece, step.peer);
  }
  TESSEL_CHECK(ctx.outputs[0].is_contiguous(), "all_to_all_tp (cuda): the output must be dense");
  gather_into(ctx.outputs[0], buffer.raw_data(), g.received_sizes, g.received_strides, stream);
}

void tp_reduce_scatter_kernel(KernelContext& ctx) {
  const auto& group = device_group_of("reduce_scatter_to_tp", ctx);
  const Tensor& input = ctx.inputs[0];
  const int device = input.device().index;
  cuda::DeviceGuard guard(device);
  cudaStream_t stream = cuda::compute_stream(device);
  const int64_t dim = gather_geometry(input, 1, ctx.attrs).dim;
  const ReduceScatterGeometry g = reduce_scatter_geometry(input, group->size(), dim);
  // Rank r's part of every rank's input as row r of a dense buffer, as on the CPU.
  const int64_t part_numel = ctx.outputs[0].numel();
  Tensor send = ctx.workspace({group->size(), part_numel}, input.dtype());
  gather_into(send, input.raw_data(), g.parts_sizes, g.parts_strides, stream);
  Tensor received = ctx.workspace({1, part_numel}, input.dtype());
  group->reduce_scatter(send, received);
  TESSEL_CHECK(ctx.outputs[0].is_contiguous(),
               "reduce_scatter_to_tp (cuda): the output must be dense");
  gather_into(ctx.outputs[0], received, stream);
}

}  // namespace

TESSEL_REGISTER_OPS(tensor_parallel_cuda) {
  ops::tp_copy.set_kernel(DeviceType::kCuda, tp_copy_kernel);
  ops::tp_reduce.set_kernel(DeviceType::kCuda, tp_reduce_kernel);
  ops::tp_gather.set_kernel(DeviceType::kCuda, tp_gather_kernel);
  ops::tp_scatter.set_kernel(DeviceType::kCuda, tp_scatter_kernel);
  ops::tp_all_to_all.set_kernel(DeviceType::kCuda, tp_all_to_all_kernel);
  ops::tp_reduce_scatter.set_kernel(DeviceType::kCuda, tp_reduce_scatter_kernel);
}

}  // namespace tessel::parallel
