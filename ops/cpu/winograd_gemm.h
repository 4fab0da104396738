// The products of a Winograd convolution on AVX-512: M = A V for one of its transformed
// matrices, with A packed (blocks of 8 rows, the 8 values of a column side by side; ops/cpu/conv.cc
// writes the transformed kernels so) and V read where the input transform wrote it. Replaces a
// general GEMM there, which packed both operands again for every block of tiles and zeroed M
// before adding the product into it.
//   winograd_gemm_avx512(packed, rows, cols, v, ldv, count, m, ldm);
#pragma once

#include <cstdint>

namespace tessel::cpu {

// Rows of A per packed block.
constexpr int64_t kWinogradRows = 8;
// Tiles (columns of V and M) per kernel step: `count` must be a multiple of it.
constexpr int64_t kWinogradColumns = 16;

// Floats the packed form of a rows x cols matrix takes: rows rounded up to whole blocks. Element
// (i, j) lies at (i / kWinogradRows * cols + j) * kWinogradRows + i % kWinogradRows, zero past the
// last row.
inline int64_t packed_rows_size(int64_t rows, int64_t cols) {
  return (rows + kWinogradRows - 1) / kWinogradRows * kWinogradRows * cols;
}

// m[i][j] = sum over c of A[i][c] v[c][j] for i < rows, j < count (a multiple of
// kWinogradColumns), row-major with leading dimensions ldv and ldm; each entry summed over c in
// order with fused multiply-adds, so it does not depend on the other columns. Needs AVX-512
// (avx512_kernels() in ops/cpu/gemm.h).
void winograd_gemm_avx512(const float* packed, int64_t rows, int64_t cols, const float* v,
                          int64_t ldv, int64_t count, float* m, int64_t ldm);

}  // namespace tessel::cpu
