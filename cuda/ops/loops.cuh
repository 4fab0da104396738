// Strided, broadcasting element-wise loops and small helpers for Tessel's own CUDA kernels.
// The per-element math, element types and conversions, and the loop geometry (broadcast
// strides, coalesced dims, per-element offsets) are the CPU's own (ops/math, core/half.h); this
// file holds the launches: a contiguous kernel (plain linear index) when every operand is dense
// in the loop's order, else a strided one with 32-bit index math when the loop fits in 31 bits,
// 64-bit otherwise.
//   cuda::launch_binary<float, float, float>(out, a, b, math::BinaryFunctor<float>{kind});
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "core/dtype.h"
#include "core/op.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "cuda/runtime.h"
#include "ops/math/convert.h"
#include "ops/math/loop_geometry.h"
#include "ops/math/strided_offsets.h"

namespace tessel::cuda {

constexpr int kMaxDims = kMaxLoopDims;
constexpr int kThreads = 256;

// The device pointer of a tensor's first element (inside a kernel: the storage is pinned).
template <typename T>
T* device_data(const Tensor& tensor) {
  return static_cast<T*>(tensor.raw_data());
}

// ---- launch configuration ----

// The device of a kernel (its first output, else its first defined input), made current for
// the guard's lifetime, and its compute stream.
class KernelDevice {
 public:
  explicit KernelDevice(const KernelContext& context)
      : KernelDevice(context.outputs.empty() ? first_input(context) : context.outputs[0]) {}
  explicit KernelDevice(const Tensor& tensor)
      : index_(tensor.device().index), guard_(index_), stream_(compute_stream(index_)) {}
  cudaStream_t stream() const { return stream_; }
  int index() const { return index_; }

 private:
  static const Tensor& first_input(const KernelContext& context) {
    for (const auto& input : context.inputs)
      if (input.defined()) return input;
    TESSEL_FAIL(context.op.name, ": no tensor to take the device from");
  }
  int index_;
  DeviceGuard guard_;
  cudaStream_t stream_;
};

inline unsigned grid_for(int64_t count, int threads = kThreads) {
  int64_t blocks = (count + threads - 1) / threads;
  if (blocks < 1) blocks = 1;
  // Grid-stride loops cover the rest.
  if (blocks > (int64_t{1} << 20)) blocks = int64_t{1} << 20;
  return static_cast<unsigned>(blocks);
}

inline void check_launch() { TESSEL_CUDA_CHECK(cudaGetLastError()); }

// ---- element-wise kernels ----

// Every element-wise kernel runs a Body: body(linear, offsets) handles the element of row-major
// index `linear`, whose operands sit at offsets[k] (in elements) from their first elements.

// All operands dense in the loop's order: offset == index, no divide.
template <int N, typename Body>
__global__ void contiguous_kernel(int64_t numel, Body body) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < numel;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t offsets[N];
#pragma unroll
    for (int k = 0; k < N; ++k) offsets[k] = i;
    body(i, offsets);
  }
}

// Any strides: offsets from the row-major index, one divide per coalesced dim in Index
// arithmetic (uint32_t where the loop fits, else int64_t).
template <int N, typename Index, typename Body>
__global__ void strided_kernel(int64_t numel, OffsetCalculator<N, Index> calculator, Body body) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < numel;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    Index offsets[N];
    calculator.offsets(static_cast<Index>(i), offsets);
    body(i, offsets);
  }
}

// Runs `body` over every element of a loop of N operands on out's device and compute stream.
template <size_t N, typename Body>
void launch_elementwise(const Tensor& out, const CoalescedLoop<N>& loop, const Body& body) {
  const int64_t numel = loop.numel();
  if (numel == 0) return;
  KernelDevice device(out);
  const unsigned grid = grid_for(numel);
  constexpr int kOperands = static_cast<int>(N);
  if (loop.contiguous()) {
    contiguous_kernel<kOperands><<<grid, kThreads, 0, device.stream()>>>(numel, body);
  } else if (loop.fits_32bit()) {
    strided_kernel<<<grid, kThreads, 0, device.stream()>>>(
        numel, offset_calculator<N, uint32_t>(loop), body);
  } else {
    strided_kernel<<<grid, kThreads, 0, device.stream()>>>(
        numel, offset_calculator<N, int64_t>(loop), body);
  }
  check_launch();
}

template <typename Out, typename Fn>
struct IndexBody {
  Out* out;
  Fn fn;
  template <typename Index>
  __device__ void operator()(int64_t linear, const Index (&offsets)[1]) const {
    out[offsets[0]] = fn(linear);
  }
};

template <typename Out, typename In, typename Fn>
struct UnaryBody {
  Out* out;
  const In* in;
  Fn fn;
  template <typename Index>
  __device__ void operator()(int64_t, const Index (&offsets)[2]) const {
    out[offsets[0]] = fn(in[offsets[1]]);
  }
};

template <typename Out, typename A, typename B, typename Fn>
struct BinaryBody {
  Out* out;
  const A* a;
  const B* b;
  Fn fn;
  template <typename Index>
  __device__ void operator()(int64_t, const Index (&offsets)[3]) const {
    out[offsets[0]] = fn(a[offsets[1]], b[offsets[2]]);
  }
};

template <typename Out, typename A, typename B, typename C, typename Fn>
struct TernaryBody {
  Out* out;
  const A* a;
  const B* b;
  const C* c;
  Fn fn;
  template <typename Index>
  __device__ void operator()(int64_t, const Index (&offsets)[4]) const {
    out[offsets[0]] = fn(a[offsets[1]], b[offsets[2]], c[offsets[3]]);
  }
};

// out[i] = fn(i) for every element of `out` (any strides), i the row-major index.
template <typename Out, typename Fn>
void launch_index(const Tensor& out, Fn fn) {
  // fn sees the row-major index of out's shape: coalescing dims keeps that order.
  launch_elementwise(out, coalesce_loop<1>(out.sizes(), {out.strides()}),
                     IndexBody<Out, Fn>{device_data<Out>(out), fn});
}

// out = fn(in), `in` broadcast to out's shape.
template <typename Out, typename In, typename Fn>
void launch_unary(const Tensor& out, const Tensor& in, Fn fn) {
  launch_elementwise(
      out, coalesce_loop<2>(out.sizes(), {out.strides(), broadcast_strides(in, out.sizes())}),
      UnaryBody<Out, In, Fn>{device_data<Out>(out), device_data<const In>(in), fn});
}

// out = fn(a, b), a and b broadcast to out's shape.
template <typename Out, typename A, typename B, typename Fn>
void launch_binary(const Tensor& out, const Tensor& a, const Tensor& b, Fn fn) {
  launch_elementwise(
      out,
      coalesce_loop<3>(out.sizes(), {out.strides(), broadcast_strides(a, out.sizes()),
                                     broadcast_strides(b, out.sizes())}),
      BinaryBody<Out, A, B, Fn>{device_data<Out>(out), device_data<const A>(a),
                                device_data<const B>(b), fn});
}

// out = fn(a, b, c), all broadcast to out's shape.
template <typename Out, typename A, typename B, typename C, typename Fn>
void launch_ternary(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& c, Fn fn) {
  launch_elementwise(
      out,
      coalesce_loop<4>(out.sizes(),
                       {out.strides(), broadcast_strides(a, out.sizes()),
                        broadcast_strides(b, out.sizes()), broadcast_strides(c, out.sizes())}),
      TernaryBody<Out, A, B, C, Fn>{device_data<Out>(out), device_data<const A>(a),
                                    device_data<const B>(b), device_data<const C>(c), fn});
}

// ---- helpers shared by the kernel files (defined in loops.cu) ----

// out = in converted to out's dtype, `in` broadcast to out's shape (any dtypes and strides).
void copy_convert(const Tensor& out, const Tensor& in);
// `tensor` in `dtype`: itself when it already has it, else a converted copy in a workspace.
Tensor converted(KernelContext& context, const Tensor& tensor, DType dtype);
// `tensor` as a row-major tensor: itself when contiguous, else a copy in a workspace.
Tensor dense_input(KernelContext& context, const Tensor& tensor);
// Sets every byte of a (contiguous) tensor to zero on its compute stream.
void zero_fill(const Tensor& tensor);
// The Philox state a random op was dispatched with (its rng_seed and rng_offset attributes).
RngState rng_attrs(const Attrs& attrs);

// An op run over chunks in passes (KernelContext::chunk) keeps its running sums on host, in the
// chunk state: a kernel's partial sums (dense doubles on the device) come back when its stream is
// done with them, and sums go to the first values.size() doubles of a dense device tensor. Both
// wait for the stream: chunk passes run only under memory pressure, where a chunk's work dwarfs
// the wait.
std::vector<double> read_doubles(const Tensor& values);
void write_doubles(const Tensor& into, const std::vector<double>& values);

// A row-major buffer for one output: the output itself when contiguous, else a workspace that
// finish() copies back.
struct DenseOutput {
  Tensor target, dense;
  DenseOutput(KernelContext& context, const Tensor& output) : target(output) {
    dense = output.is_contiguous() ? output : context.workspace(output.sizes(), output.dtype());
  }
  template <typename T>
  T* data() const {
    return device_data<T>(dense);
  }
  void finish() const {
    if (!dense.is_same(target)) copy_convert(target, dense);
  }
};

}  // namespace tessel::cuda
