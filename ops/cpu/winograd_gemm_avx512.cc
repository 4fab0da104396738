// Built for x86-64-v4 (see ops/BUILD); conv.cc calls it only where avx512_kernels() says so.
#include <immintrin.h>

#include <algorithm>

#include "ops/cpu/winograd_gemm.h"

namespace tessel::cpu {

namespace {

// Columns of A (rows of V) per pass: a pass's strip of V (128 x 48 floats, 24 KiB) stays in L1
// while every block of rows of A goes over it.
constexpr int64_t kDepth = 128;

// 8 rows x 16 kVectors columns (kVectors = 3: 24 registers) of one depth pass: per column of
// A, kVectors loads of V and eight broadcasts feed 8 kVectors fused multiply-adds, onto what the
// pass before stored.
template <int kVectors>
inline void product_block(const float* a, int64_t live, const float* column, int64_t ldv,
                          int64_t depth_count, bool first_pass, float* out, int64_t ldm) {
  __m512 acc[kWinogradRows][kVectors];
#pragma GCC unroll 8
  for (int r = 0; r < kWinogradRows; ++r)
    for (int q = 0; q < kVectors; ++q)
      acc[r][q] =
          !first_pass && r < live ? _mm512_loadu_ps(out + r * ldm + 16 * q) : _mm512_setzero_ps();
  for (int64_t c = 0; c < depth_count; ++c, column += ldv, a += kWinogradRows) {
    __m512 values[kVectors];
    for (int q = 0; q < kVectors; ++q) values[q] = _mm512_loadu_ps(column + 16 * q);
#pragma GCC unroll 8
    for (int r = 0; r < kWinogradRows; ++r) {
      const __m512 weight = _mm512_set1_ps(a[r]);
      for (int q = 0; q < kVectors; ++q) acc[r][q] = _mm512_fmadd_ps(weight, values[q], acc[r][q]);
    }
  }
  for (int64_t r = 0; r < live; ++r)
    for (int q = 0; q < kVectors; ++q) _mm512_storeu_ps(out + r * ldm + 16 * q, acc[r][q]);
}

}  // namespace

// Passes over kDepth columns of A at a time; in each, strips of 48 columns of V, then one of 32
// or 16 for the rest, under every block of 8 rows of A.
void winograd_gemm_avx512(const float* packed, int64_t rows, int64_t cols, const float* v,
                          int64_t ldv, int64_t count, float* m, int64_t ldm) {
  for (int64_t depth = 0; depth < cols; depth += kDepth) {
    const int64_t depth_count = std::min(cols, depth + kDepth) - depth;
    for (int64_t j = 0; j < count; j += 48) {
      const int64_t width = std::min<int64_t>(48, count - j);
      for (int64_t block = 0; block * kWinogradRows < rows; ++block) {
        const int64_t first = block * kWinogradRows;
        const int64_t live = std::min(kWinogradRows, rows - first);
        const float* a = packed + (block * cols + depth) * kWinogradRows;
        const float* column = v + depth * ldv + j;
        float* out = m + first * ldm + j;
        if (width == 48) {
          product_block<3>(a, live, column, ldv, depth_count, depth == 0, out, ldm);
        } else if (width == 32) {
          product_block<2>(a, live, column, ldv, depth_count, depth == 0, out, ldm);
        } else {
          product_block<1>(a, live, column, ldv, depth_count, depth == 0, out, ldm);
        }
      }
    }
  }
}

}  // namespace tessel::cpu
