// How matrix products read their operands and write their result in place, shared by the CPU
// GEMM kernels (ops/cpu/linalg.cc) and the cuBLAS ones (cuda/ops/linalg.cu): a (batched) matrix is
// read in place when it is row-major or column-major (a transpose is then free), and from a dense
// copy otherwise. Host code: sizes and strides only, no data.
//   MatrixLayout layout = operand_layout(rows, cols, row_stride, col_stride, batch, batch_stride);
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/host_device.h"
#include "core/tensor.h"

namespace tessel {

// Leading dimension of a rows x cols matrix with strides (row_stride, col_stride) read as
// row-major, or -1 when it is not one (size-1 dimensions may have any stride).
TESSEL_HOST_DEVICE inline int64_t row_major_ld(int64_t rows, int64_t cols, int64_t row_stride,
                                               int64_t col_stride) {
  const int64_t min_ld = cols > 1 ? cols : 1;
  if (cols > 1 && col_stride != 1) return -1;
  if (rows <= 1) return min_ld;
  return row_stride >= min_ld ? row_stride : -1;
}

// One (batched) matrix operand: in place with leading dimension `ld`, `transposed` when its
// memory holds it column by column; or, when !in_place, the layout of its dense row-major copy.
struct MatrixLayout {
  int64_t ld = 0;
  int64_t batch_stride = 0;
  bool transposed = false;
  bool in_place = true;
};

// The layout of a rows x cols matrix (batch of them `batch_stride` apart) as a GEMM reads it.
inline MatrixLayout operand_layout(int64_t rows, int64_t cols, int64_t row_stride,
                                   int64_t col_stride, int64_t batch, int64_t batch_stride) {
  MatrixLayout layout;
  layout.batch_stride = batch > 1 ? batch_stride : 0;
  if (const int64_t ld = row_major_ld(rows, cols, row_stride, col_stride); ld >= 0) {
    layout.ld = ld;
    return layout;
  }
  if (const int64_t ld = row_major_ld(cols, rows, col_stride, row_stride); ld >= 0) {
    layout.ld = ld;
    layout.transposed = true;
    return layout;
  }
  layout.in_place = false;
  layout.ld = std::max<int64_t>(cols, 1);
  layout.batch_stride = batch > 1 ? rows * cols : 0;
  return layout;
}

// Where a product may write its (batched) row-major rows x cols result in place: a row-major
// layout whose batch entries do not overlap, in storage no input shares (`aliases_input`
// false). !in_place: the layout of a dense workspace.
inline MatrixLayout result_layout(int64_t rows, int64_t cols, int64_t row_stride,
                                  int64_t col_stride, int64_t batch, int64_t batch_stride,
                                  bool aliases_input) {
  MatrixLayout layout;
  const int64_t ld = row_major_ld(rows, cols, row_stride, col_stride);
  const int64_t stride = batch > 1 ? batch_stride : 0;
  const bool batches_apart = batch <= 1 || stride >= (rows - 1) * ld + cols;
  if (ld >= 0 && batches_apart && !aliases_input) {
    layout.ld = ld;
    layout.batch_stride = stride;
    return layout;
  }
  layout.in_place = false;
  layout.ld = std::max<int64_t>(cols, 1);
  layout.batch_stride = rows * cols;
  return layout;
}

// addmm's result, out (rows x cols) = c + a b by a GEMM that adds onto what out holds: written in
// place when out is row-major and is c itself (the same view: nothing to copy first) or overlaps
// none of c, a and b (c is copied in first); otherwise into a dense scratch that takes c first
// and is copied back.
struct AccumulateLayout {
  MatrixLayout result;
  bool copy_c = true;  // the result must be given c's values before the GEMM
};

inline AccumulateLayout accumulate_layout(const Tensor& out, const Tensor& c, const Tensor& a,
                                          const Tensor& b) {
  const bool out_is_c = c.storage() == out.storage() &&
                        c.storage_offset() == out.storage_offset() && c.strides() == out.strides();
  const bool overlaps = out.storage() == a.storage() || out.storage() == b.storage() ||
                        (out.storage() == c.storage() && !out_is_c);
  AccumulateLayout layout;
  layout.result =
      result_layout(out.size(0), out.size(1), out.stride(0), out.stride(1), 1, 0, overlaps);
  layout.copy_c = !(layout.result.in_place && out_is_c);
  return layout;
}

// x (..., in) with `ndim` dims seen as rows x in with one row stride: that stride, or -1 when
// its leading dims do not collapse into one.
TESSEL_HOST_DEVICE inline int64_t collapsed_row_stride(const int64_t* sizes, const int64_t* strides,
                                                       int64_t ndim) {
  int64_t row_stride = -1;  // stride of the innermost leading dim of size > 1
  int64_t expected = -1;    // what the next outer dim's stride must be to collapse
  for (int64_t d = ndim - 2; d >= 0; --d) {
    if (sizes[d] == 1) continue;
    if (row_stride < 0) {
      row_stride = strides[d];
    } else if (strides[d] != expected) {
      return -1;
    }
    expected = strides[d] * sizes[d];
  }
  const int64_t in_features = sizes[ndim - 1] > 1 ? sizes[ndim - 1] : 1;
  if (row_stride < 0) return in_features;
  return row_stride >= in_features ? row_stride : -1;
}

}  // namespace tessel
