// Strided, broadcasting element-wise loops for CPU kernels: every operand is viewed with its
// own strides over one loop shape (stride 0 where broadcast), dims are coalesced, runs of
// contiguous elements get a vectorisable fast path, and chunks of the range run in parallel.
//   cpu::binary_loop<float, float, float>(out, a, b, [](float x, float y) { return x + y; });
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "core/dtype.h"
#include "core/op.h"
#include "core/tensor.h"
#include "core/threading.h"
#include "ops/math/convert.h"
#include "ops/math/loop_geometry.h"

namespace tessel::cpu {

// The dense loops below carry `#pragma omp simd`: -O2 alone does not vectorise loops of unknown
// length. Each element is read and written at the same index, so exact aliasing (in place)
// is safe.

// Elements per parallel chunk: below this a loop runs on the calling thread.
constexpr int64_t kElementwiseGrain = 32768;
// Side of the square tiles used when an operand is transposed relative to the others.
constexpr int64_t kTransposeTile = 32;

// Loop geometry in bytes: the coalesced loop (ops/math/loop_geometry.h) with each operand's
// strides scaled by its element size. Merging keeps row-major order, so a run's first element
// index is still the row-major index in the original shape.
template <size_t N>
struct LoopGeometry {
  Shape sizes;                          // at least one dim
  std::array<Shape, N> byte_strides{};  // per operand, per dim
  std::array<char*, N> data{};

  LoopGeometry(const Shape& loop_sizes, const std::array<char*, N>& operand_data,
               const std::array<Shape, N>& element_strides,
               const std::array<int64_t, N>& element_sizes)
      : data(operand_data) {
    CoalescedLoop<N> loop = coalesce_loop<N>(loop_sizes, element_strides);
    sizes = std::move(loop.sizes);
    for (size_t k = 0; k < N; ++k) {
      byte_strides[k] = std::move(loop.strides[k]);
      for (int64_t& stride : byte_strides[k]) stride *= element_sizes[k];
    }
  }
};

// Calls body(data, inner_byte_strides, count, first_index) on runs of elements along the last
// (coalesced) dim, over the whole loop shape, in parallel chunks of at least `grain` elements.
// `first_index` is the row-major index of the run's first element (random kernels use it).
template <size_t N, typename Body>
void for_each_run(const Shape& loop_sizes, const std::array<char*, N>& data,
                  const std::array<Shape, N>& element_strides,
                  const std::array<int64_t, N>& element_sizes, int64_t grain, Body&& body) {
  int64_t numel = shape_numel(loop_sizes);
  if (numel == 0) return;
  LoopGeometry<N> geometry(loop_sizes, data, element_strides, element_sizes);
  const Shape& sizes = geometry.sizes;
  const int64_t ndim = static_cast<int64_t>(sizes.size());
  std::array<int64_t, N> inner_strides;
  for (size_t k = 0; k < N; ++k) inner_strides[k] = geometry.byte_strides[k][ndim - 1];

  // Some operand runs along the second-last dim (a transposed view): walk the last two dims
  // in square tiles so that operand's cache lines are reused across rows.
  bool transposed = false;
  if (ndim >= 2 && sizes[ndim - 1] >= kTransposeTile && sizes[ndim - 2] >= kTransposeTile) {
    for (size_t k = 0; k < N; ++k)
      transposed |= geometry.byte_strides[k][ndim - 2] == element_sizes[k] &&
                    inner_strides[k] != element_sizes[k] && inner_strides[k] != 0;
  }
  if (transposed) {
    const int64_t rows = sizes[ndim - 2], cols = sizes[ndim - 1];
    const int64_t row_tiles = (rows + kTransposeTile - 1) / kTransposeTile;
    const int64_t tasks = (numel / (rows * cols)) * row_tiles;
    parallel_for(0, tasks, std::max<int64_t>(1, grain / (kTransposeTile * cols)),
                 [&](int64_t begin, int64_t end) {
                   for (int64_t task = begin; task < end; ++task) {
                     int64_t outer = task / row_tiles;
                     int64_t row_begin = (task % row_tiles) * kTransposeTile;
                     int64_t row_end = std::min(rows, row_begin + kTransposeTile);
                     std::array<char*, N> base = geometry.data;
                     int64_t rest = outer;
                     for (int64_t d = ndim - 3; d >= 0; --d) {
                       int64_t index = rest % sizes[d];
                       rest /= sizes[d];
                       for (size_t k = 0; k < N; ++k)
                         base[k] += index * geometry.byte_strides[k][d];
                     }
                     for (int64_t col = 0; col < cols; col += kTransposeTile) {
                       int64_t count = std::min(kTransposeTile, cols - col);
                       for (int64_t row = row_begin; row < row_end; ++row) {
                         std::array<char*, N> pointers;
                         for (size_t k = 0; k < N; ++k)
                           pointers[k] = base[k] + row * geometry.byte_strides[k][ndim - 2] +
                                         col * inner_strides[k];
                         body(pointers, inner_strides, count, (outer * rows + row) * cols + col);
                       }
                     }
                   }
                 });
    return;
  }

  parallel_for(0, numel, grain, [&](int64_t begin, int64_t end) {
    Shape index(ndim, 0);
    int64_t rest = begin;
    for (int64_t d = ndim - 1; d >= 0; --d) {
      index[d] = rest % sizes[d];
      rest /= sizes[d];
    }
    int64_t position = begin;
    while (position < end) {
      std::array<char*, N> pointers;
      for (size_t k = 0; k < N; ++k) {
        int64_t offset = 0;
        for (int64_t d = 0; d < ndim; ++d) offset += index[d] * geometry.byte_strides[k][d];
        pointers[k] = geometry.data[k] + offset;
      }
      int64_t count = std::min(sizes[ndim - 1] - index[ndim - 1], end - position);
      body(pointers, inner_strides, count, position);
      position += count;
      index[ndim - 1] += count;
      for (int64_t d = ndim - 1; d > 0 && index[d] == sizes[d]; --d) {
        index[d] = 0;
        ++index[d - 1];
      }
    }
  });
}

// Raw byte pointer of a tensor's first element (the storage must be pinned: inside a kernel).
inline char* byte_pointer(const Tensor& tensor) { return static_cast<char*>(tensor.raw_data()); }

// out[i] = fn(first_index + i) for every element of `out` (any strides), in row-major order.
template <typename Out, typename Fn>
void index_loop(const Tensor& out, Fn&& fn, int64_t grain = kElementwiseGrain) {
  for_each_run<1>(out.sizes(), {byte_pointer(out)}, {out.strides()},
                  {static_cast<int64_t>(sizeof(Out))}, grain,
                  [&](const std::array<char*, 1>& data, const std::array<int64_t, 1>& strides,
                      int64_t count, int64_t first_index) {
                    if (strides[0] == sizeof(Out)) {
                      Out* target = reinterpret_cast<Out*>(data[0]);
#pragma omp simd
                      for (int64_t i = 0; i < count; ++i) target[i] = fn(first_index + i);
                    } else {
                      for (int64_t i = 0; i < count; ++i)
                        *reinterpret_cast<Out*>(data[0] + i * strides[0]) = fn(first_index + i);
                    }
                  });
}

// out = fn(in), with `in` broadcast to out's shape.
template <typename Out, typename In, typename Fn>
void unary_loop(const Tensor& out, const Tensor& in, Fn&& fn, int64_t grain = kElementwiseGrain) {
  for_each_run<2>(out.sizes(), {byte_pointer(out), byte_pointer(in)},
                  {out.strides(), broadcast_strides(in, out.sizes())},
                  {static_cast<int64_t>(sizeof(Out)), static_cast<int64_t>(sizeof(In))}, grain,
                  [&](const std::array<char*, 2>& data, const std::array<int64_t, 2>& strides,
                      int64_t count, int64_t) {
                    Out* target = reinterpret_cast<Out*>(data[0]);
                    const In* source = reinterpret_cast<const In*>(data[1]);
                    if (strides[0] == sizeof(Out) && strides[1] == sizeof(In)) {
#pragma omp simd
                      for (int64_t i = 0; i < count; ++i) target[i] = fn(source[i]);
                    } else if (strides[0] == sizeof(Out) && strides[1] == 0) {
                      const Out value = fn(*source);
#pragma omp simd
                      for (int64_t i = 0; i < count; ++i) target[i] = value;
                    } else {
                      for (int64_t i = 0; i < count; ++i)
                        *reinterpret_cast<Out*>(data[0] + i * strides[0]) =
                            fn(*reinterpret_cast<const In*>(data[1] + i * strides[1]));
                    }
                  });
}

// out = fn(a, b), with a and b broadcast to out's shape.
template <typename Out, typename A, typename B, typename Fn>
void binary_loop(const Tensor& out, const Tensor& a, const Tensor& b, Fn&& fn,
                 int64_t grain = kElementwiseGrain) {
  for_each_run<3>(
      out.sizes(), {byte_pointer(out), byte_pointer(a), byte_pointer(b)},
      {out.strides(), broadcast_strides(a, out.sizes()), broadcast_strides(b, out.sizes())},
      {static_cast<int64_t>(sizeof(Out)), static_cast<int64_t>(sizeof(A)),
       static_cast<int64_t>(sizeof(B))},
      grain,
      [&](const std::array<char*, 3>& data, const std::array<int64_t, 3>& strides, int64_t count,
          int64_t) {
        Out* target = reinterpret_cast<Out*>(data[0]);
        const A* left = reinterpret_cast<const A*>(data[1]);
        const B* right = reinterpret_cast<const B*>(data[2]);
        const bool out_dense = strides[0] == sizeof(Out);
        if (out_dense && strides[1] == sizeof(A) && strides[2] == sizeof(B)) {
#pragma omp simd
          for (int64_t i = 0; i < count; ++i) target[i] = fn(left[i], right[i]);
        } else if (out_dense && strides[1] == sizeof(A) && strides[2] == 0) {
          const B scalar = *right;
#pragma omp simd
          for (int64_t i = 0; i < count; ++i) target[i] = fn(left[i], scalar);
        } else if (out_dense && strides[1] == 0 && strides[2] == sizeof(B)) {
          const A scalar = *left;
#pragma omp simd
          for (int64_t i = 0; i < count; ++i) target[i] = fn(scalar, right[i]);
        } else {
          for (int64_t i = 0; i < count; ++i)
            *reinterpret_cast<Out*>(data[0] + i * strides[0]) =
                fn(*reinterpret_cast<const A*>(data[1] + i * strides[1]),
                   *reinterpret_cast<const B*>(data[2] + i * strides[2]));
        }
      });
}

// out = fn(a, b, c), with a, b and c broadcast to out's shape.
template <typename Out, typename A, typename B, typename C, typename Fn>
void ternary_loop(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& c, Fn&& fn,
                  int64_t grain = kElementwiseGrain) {
  for_each_run<4>(out.sizes(),
                  {byte_pointer(out), byte_pointer(a), byte_pointer(b), byte_pointer(c)},
                  {out.strides(), broadcast_strides(a, out.sizes()),
                   broadcast_strides(b, out.sizes()), broadcast_strides(c, out.sizes())},
                  {static_cast<int64_t>(sizeof(Out)), static_cast<int64_t>(sizeof(A)),
                   static_cast<int64_t>(sizeof(B)), static_cast<int64_t>(sizeof(C))},
                  grain,
                  [&](const std::array<char*, 4>& data, const std::array<int64_t, 4>& strides,
                      int64_t count, int64_t) {
                    if (strides[0] == sizeof(Out) && strides[1] == sizeof(A) &&
                        strides[2] == sizeof(B) && strides[3] == sizeof(C)) {
                      Out* target = reinterpret_cast<Out*>(data[0]);
                      const A* first = reinterpret_cast<const A*>(data[1]);
                      const B* second = reinterpret_cast<const B*>(data[2]);
                      const C* third = reinterpret_cast<const C*>(data[3]);
#pragma omp simd
                      for (int64_t i = 0; i < count; ++i)
                        target[i] = fn(first[i], second[i], third[i]);
                    } else {
                      for (int64_t i = 0; i < count; ++i)
                        *reinterpret_cast<Out*>(data[0] + i * strides[0]) =
                            fn(*reinterpret_cast<const A*>(data[1] + i * strides[1]),
                               *reinterpret_cast<const B*>(data[2] + i * strides[2]),
                               *reinterpret_cast<const C*>(data[3] + i * strides[3]));
                    }
                  });
}

// out = in converted to out's dtype, with `in` broadcast to out's shape (any dtypes, strides).
inline void copy_convert(const Tensor& out, const Tensor& in) {
  visit_dtype(out.dtype(), [&](auto out_tag) {
    using Out = decltype(out_tag);
    visit_dtype(in.dtype(), [&](auto in_tag) {
      using In = decltype(in_tag);
      unary_loop<Out, In>(out, in, [](In value) { return convert_value<Out>(value); });
    });
  });
}

// `tensor` in `dtype`: itself when it already has it, else a converted copy in a workspace.
inline Tensor converted(KernelContext& context, const Tensor& tensor, DType dtype) {
  if (tensor.dtype() == dtype) return tensor;
  Tensor copy = context.workspace(tensor.sizes(), dtype);
  copy_convert(copy, tensor);
  return copy;
}

// `tensor` as a row-major tensor: itself when contiguous, else a copy in a workspace.
inline Tensor contiguous_input(KernelContext& context, const Tensor& tensor) {
  if (tensor.is_contiguous()) return tensor;
  Tensor copy = context.workspace(tensor.sizes(), tensor.dtype());
  copy_convert(copy, tensor);
  return copy;
}

}  // namespace tessel::cpu
