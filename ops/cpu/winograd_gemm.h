// The products of a Winograd convolution on AVX-512: M = A V for one of its 16 transformed
// matrices, with A packed once per call (blocks of 8 rows, the 8 values of a column side by side)
// and V read where the input transform wrote it. Replaces a general GEMM there, which packed both
// operands again for every block of tiles and zeroed M before adding the product into it.
//   pack_rows(a, rows, cols, row_stride, col_stride, packed);
//   winograd_gemm_avx512(packed, rows, cols, v, ldv, count, m, ldm);
#pragma once

#include <cstdint>

namespace tessel::cpu {

// Rows of A per packed block.
constexpr int64_t kWinogradRows = 8;
// Tiles (columns of V and M) per kernel step: `count` must be a multiple of it.
constexpr int64_t kWinogradColumns = 48;

// Floats the packed form of a rows x cols matrix takes: rows rounded up to whole blocks.
inline int64_t packed_rows_size(int64_t rows, int64_t cols) {
  return (rows + kWinogradRows - 1) / kWinogradRows * kWinogradRows * cols;
}

// packed[block][col][r] = A[block * 8 + r][col] (A[i][j] at a[i * row_stride + j * col_stride]),
// zero past the last row.
void pack_rows(const float* a, int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride,
               float* packed);

// m[i][j] = sum over c of A[i][c] v[c][j] for i < rows, j < count (a multiple of
// kWinogradColumns), row-major with leading dimensions ldv and ldm; each entry summed over c in
// order with fused multiply-adds, so it does not depend on the other columns. Needs AVX-512
// (avx512_kernels() in ops/cpu/gemm.h).
void winograd_gemm_avx512(const float* packed, int64_t rows, int64_t cols, const float* v,
                          int64_t ldv, int64_t count, float* m, int64_t ldm);

}  // namespace tessel::cpu
