// Block layout shared by the CUDA reductions: data seen as a row-major [outer, reduce, inner]
// block; one CUDA block per (outer, tile of up to 32 inner columns), its threads (x: column,
// y: a slice of the reduced axis) combining partial results through shared memory in a fixed
// order, so results are deterministic.
//   ReduceLaunch launch(layout);  my_kernel<<<launch.grid, launch.block,
//   launch.shared(sizeof(Acc)), stream>>>(...)
#pragma once

#include <cstdint>

#include "cuda/ops/loops.cuh"
#include "ops/math/reduce_layout.h"

namespace tessel::cuda {

struct ReduceLaunch {
  dim3 block, grid;
  int64_t tiles = 1;
  explicit ReduceLaunch(const ReduceLayout& layout) {
    int bx = 1;
    while (bx < 32 && bx < layout.inner) bx *= 2;
    int by = kThreads / bx;
    while (by > 1 && by > layout.reduce) by /= 2;  // short rows (attention): smaller blocks
    tiles = (layout.inner + bx - 1) / bx;
    block = dim3(bx, by);
    TESSEL_CHECK(layout.outer * tiles <= int64_t{0x7fffffff}, "reduction over ", layout.outer,
                 " rows of ", layout.inner, " columns: too many blocks for one launch");
    grid = dim3(static_cast<unsigned>(layout.outer * tiles));
  }
  size_t shared(size_t element_bytes) const { return element_bytes * block.x * block.y; }
  bool empty(const ReduceLayout& layout) const { return layout.outer * layout.inner == 0; }
};

// Where a thread of a ReduceLaunch block works: its outer index, its column (valid only when
// `active`) and the first reduced row it visits (it then steps by blockDim.y).
struct ReduceThread {
  int64_t outer, column;
  bool active;
  __device__ ReduceThread(const ReduceLayout& layout, int64_t tiles) {
    outer = blockIdx.x / tiles;
    column = (blockIdx.x % tiles) * blockDim.x + threadIdx.x;
    active = column < layout.inner;
  }
  // Element offset of reduced row r of this thread's column.
  __device__ int64_t at(const ReduceLayout& layout, int64_t r) const {
    return layout.offset(outer, r, column);
  }
  __device__ int64_t output_index(const ReduceLayout& layout) const {
    return outer * layout.inner + column;
  }
};

// Combines `value` over the y threads of each column (a tree of fixed shape); every thread gets
// its column's result. `shared` holds blockDim.x * blockDim.y values (dynamic shared memory).
template <typename Acc, typename Combine>
__device__ Acc combine_over_rows(Acc value, Acc* shared, Combine combine) {
  const int tx = threadIdx.x, ty = threadIdx.y, bx = blockDim.x;
  shared[ty * bx + tx] = value;
  __syncthreads();
  for (int stride = blockDim.y / 2; stride > 0; stride >>= 1) {
    if (ty < stride)
      shared[ty * bx + tx] = combine(shared[ty * bx + tx], shared[(ty + stride) * bx + tx]);
    __syncthreads();
  }
  Acc result = shared[tx];
  __syncthreads();
  return result;
}

template <typename Acc>
__device__ Acc* shared_buffer() {
  extern __shared__ __align__(16) unsigned char reduce_shared_bytes[];
  return reinterpret_cast<Acc*>(reduce_shared_bytes);
}

// `x` as a row-major [outer, reduce, inner] block: x itself when it is contiguous and the
// reduced dims are adjacent, else a copy (kept dims first, reduced dims last, when they are
// not adjacent) in a workspace.
Tensor reduction_block(KernelContext& context, const Tensor& x, const std::vector<bool>& reduced,
                       ReduceLayout* layout);

// out (a 0-d f64 tensor, contiguous) = the sum of the dense f64 tensor `values` (partial sums
// of long inputs in workspaces of `context`).
void sum_doubles(KernelContext& context, const Tensor& values, const Tensor& out);

}  // namespace tessel::cuda
