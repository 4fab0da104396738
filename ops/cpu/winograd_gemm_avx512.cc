// Built for x86-64-v4 (see ops/BUILD); conv.cc calls it only where avx512_kernels() says so.
#include <immintrin.h>

#include <algorithm>

#include "ops/cpu/winograd_gemm.h"

namespace tessel::cpu {

namespace {

// Columns of A (rows of V) per pass: a pass's strip of V (128 x 48 floats, 24 KiB) stays in L1
// while every block of rows of A goes over it.
constexpr int64_t kDepth = 128;

// The 8 x 8 block at `in` (rows `in_stride` apart) transposed into 8 contiguous rows of 8.
inline void transpose8x8(const float* in, int64_t in_stride, float* out) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(in + i * in_stride);
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_ps(out + i * 8, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
    _mm256_storeu_ps(out + (i + 4) * 8, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
  }
}

}  // namespace

void pack_rows(const float* a, int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride,
               float* packed) {
  for (int64_t block = 0; block * kWinogradRows < rows; ++block) {
    const int64_t first = block * kWinogradRows;
    const int64_t live = std::min(kWinogradRows, rows - first);
    const float* in = a + first * row_stride;
    float* out = packed + block * cols * kWinogradRows;
    int64_t c = 0;
    if (live == kWinogradRows && row_stride == 1) {  // a column's 8 values side by side
      for (; c < cols; ++c) _mm256_storeu_ps(out + c * 8, _mm256_loadu_ps(in + c * col_stride));
    } else if (live == kWinogradRows && col_stride == 1) {  // rows dense: 8 x 8 transposes
      for (; c + 8 <= cols; c += 8) transpose8x8(in + c, row_stride, out + c * 8);
    }
    for (; c < cols; ++c) {
      for (int64_t r = 0; r < live; ++r)
        out[c * kWinogradRows + r] = in[r * row_stride + c * col_stride];
      for (int64_t r = live; r < kWinogradRows; ++r) out[c * kWinogradRows + r] = 0.0f;
    }
  }
}

// 8 rows x 48 columns in 24 registers: per column of A, three loads of V and eight broadcasts
// feed 24 fused multiply-adds. Passes over kDepth columns of A at a time, each adding onto what
// the pass before stored.
void winograd_gemm_avx512(const float* packed, int64_t rows, int64_t cols, const float* v,
                          int64_t ldv, int64_t count, float* m, int64_t ldm) {
  for (int64_t depth = 0; depth < cols; depth += kDepth) {
    const int64_t depth_end = std::min(cols, depth + kDepth);
    for (int64_t j = 0; j < count; j += kWinogradColumns) {
      for (int64_t block = 0; block * kWinogradRows < rows; ++block) {
        const int64_t first = block * kWinogradRows;
        const int64_t live = std::min(kWinogradRows, rows - first);
        __m512 acc[kWinogradRows][3];
#pragma GCC unroll 8
        for (int r = 0; r < kWinogradRows; ++r) {
          if (depth > 0 && r < live) {
            const float* out = m + (first + r) * ldm + j;
            acc[r][0] = _mm512_loadu_ps(out);
            acc[r][1] = _mm512_loadu_ps(out + 16);
            acc[r][2] = _mm512_loadu_ps(out + 32);
          } else {
            acc[r][0] = acc[r][1] = acc[r][2] = _mm512_setzero_ps();
          }
        }
        const float* a = packed + (block * cols + depth) * kWinogradRows;
        const float* column = v + depth * ldv + j;
        for (int64_t c = depth; c < depth_end; ++c, column += ldv, a += kWinogradRows) {
          const __m512 v0 = _mm512_loadu_ps(column);
          const __m512 v1 = _mm512_loadu_ps(column + 16);
          const __m512 v2 = _mm512_loadu_ps(column + 32);
#pragma GCC unroll 8
          for (int r = 0; r < kWinogradRows; ++r) {
            const __m512 weight = _mm512_set1_ps(a[r]);
            acc[r][0] = _mm512_fmadd_ps(weight, v0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(weight, v1, acc[r][1]);
            acc[r][2] = _mm512_fmadd_ps(weight, v2, acc[r][2]);
          }
        }
        for (int64_t r = 0; r < live; ++r) {
          float* out = m + (first + r) * ldm + j;
          _mm512_storeu_ps(out, acc[r][0]);
          _mm512_storeu_ps(out + 16, acc[r][1]);
          _mm512_storeu_ps(out + 32, acc[r][2]);
        }
      }
    }
  }
}

}  // namespace tessel::cpu
