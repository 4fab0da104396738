// Tessel's own f32 GEMM for AVX-512 (built for x86-64-v4; see ops/BUILD). gemm.cc calls it
// only on CPUs that have AVX-512, one call per thread's slice of C.
//
// Blocking: B is packed in blocks of up to kDepth rows by up to kWidth columns (L2), as panels of
// 64 columns (the micro-kernel's width: four registers). Six rows of A at a time, read where they
// lie, go across every panel of the block, L1 holding them.
//
// Every element of C is beta * C (nothing when beta is 0) plus its k products added in order
// of k by fused multiply-adds: the bits of an element depend on its row of op(A), its column
// of op(B) and k only, so slices of C, chunks of a batch and passes over k (beta = 1) give
// the bits of the whole product.
#include "ops/cpu/sgemm_avx512.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

namespace tessel::cpu::avx512 {

namespace {

// Rows of C per micro-kernel call (broadcasts of A) and its widest column count (registers of
// B: 6 x 4 = 24 accumulators).
constexpr int kRows = 6;
constexpr int kMaxVectors = 4;
constexpr int64_t kPanel = 16 * kMaxVectors;
// Rows of op(B) (columns of op(A)) per block, and columns of op(B) per packed block: the block
// (512 KiB) stays in L2 while six rows of A at a time go across it.
constexpr int64_t kDepth = 256;
constexpr int64_t kWidth = 512;

// A thread's packing buffer, 64-byte aligned, grown on demand and kept.
class Scratch {
 public:
  ~Scratch() { std::free(data_); }
  float* get(int64_t floats) {
    if (floats > size_) {
      std::free(data_);
      const size_t bytes = (static_cast<size_t>(floats) * sizeof(float) + 63) / 64 * 64;
      data_ = static_cast<float*>(std::aligned_alloc(64, bytes));
      if (data_ == nullptr) throw std::bad_alloc();
      size_ = floats;
    }
    return data_;
  }

 private:
  float* data_ = nullptr;
  int64_t size_ = 0;
};

// Where the kernel finds A's value for row r (of its six) and column p of the block.
struct ALayout {
  const float* data;
  int64_t row_stride;     // rows of A: lda; a stored transpose or a packed panel: 1
  int64_t column_stride;  // rows of A: 1; a stored transpose: lda; a packed panel: kRows
};

// C[r][c] for r < kTileRows, c < 16 * kVectors (the last register's columns those of
// last_mask): the value at from[r * from_ld + c] (load; C itself, or a start row with
// from_ld 0) or zero, plus the products over `depth` columns of A and rows of the packed panel
// of B. Partial tiles (the last rows, the last columns) run their own instance and masks, so
// nothing is written outside C and no tile goes through a copy.
template <int kTileRows, int kVectors>
void micro_kernel(ALayout a, const float* panel, int64_t depth, const float* from, int64_t from_ld,
                  float* c, int64_t ldc, bool load, __mmask16 last_mask) {
  // Every loop over the tile unrolled whole (-O2 would not), so the accumulators stay in
  // registers.
  __m512 acc[kTileRows][kVectors];
#pragma GCC unroll 8
  for (int r = 0; r < kTileRows; ++r) {
#pragma GCC unroll 4
    for (int q = 0; q < kVectors; ++q) {
      const __mmask16 mask = q == kVectors - 1 ? last_mask : __mmask16(0xFFFF);
      acc[r][q] =
          load ? _mm512_maskz_loadu_ps(mask, from + r * from_ld + 16 * q) : _mm512_setzero_ps();
    }
  }
  const float* rows[kTileRows];
#pragma GCC unroll 8
  for (int r = 0; r < kTileRows; ++r) rows[r] = a.data + r * a.row_stride;
  for (int64_t p = 0; p < depth; ++p) {
    __m512 b[kVectors];
#pragma GCC unroll 4
    for (int q = 0; q < kVectors; ++q) b[q] = _mm512_load_ps(panel + p * (16 * kVectors) + 16 * q);
    const int64_t offset = p * a.column_stride;
#pragma GCC unroll 8
    for (int r = 0; r < kTileRows; ++r) {
      const __m512 value = _mm512_set1_ps(rows[r][offset]);
#pragma GCC unroll 4
      for (int q = 0; q < kVectors; ++q) acc[r][q] = _mm512_fmadd_ps(value, b[q], acc[r][q]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < kTileRows; ++r) {
#pragma GCC unroll 4
    for (int q = 0; q < kVectors; ++q) {
      const __mmask16 mask = q == kVectors - 1 ? last_mask : __mmask16(0xFFFF);
      _mm512_mask_storeu_ps(c + r * ldc + 16 * q, mask, acc[r][q]);
    }
  }
}

using MicroKernel = void (*)(ALayout, const float*, int64_t, const float*, int64_t, float*, int64_t,
                             bool, __mmask16);

template <int kTileRows>
constexpr std::array<MicroKernel, kMaxVectors> kernels_of_rows() {
  return {&micro_kernel<kTileRows, 1>, &micro_kernel<kTileRows, 2>, &micro_kernel<kTileRows, 3>,
          &micro_kernel<kTileRows, 4>};
}

// kMicroKernels[rows - 1][registers - 1]: the instance for a tile of that many rows of C and
// registers across.
constexpr std::array<std::array<MicroKernel, kMaxVectors>, kRows> kMicroKernels = {
    kernels_of_rows<1>(), kernels_of_rows<2>(), kernels_of_rows<3>(),
    kernels_of_rows<4>(), kernels_of_rows<5>(), kernels_of_rows<6>()};

// Packs rows [0, live_rows) of op(A) over `depth` columns into a panel (column p's kRows values
// side by side, zero past live_rows), scaled by alpha.
void pack_a_panel(bool trans_a, const float* a, int64_t lda, int64_t live_rows, int64_t depth,
                  float alpha, float* panel) {
  for (int64_t p = 0; p < depth; ++p) {
    for (int64_t r = 0; r < kRows; ++r) {
      const float value = r >= live_rows ? 0.0f : trans_a ? a[p * lda + r] : a[r * lda + p];
      panel[p * kRows + r] = alpha * value;
    }
  }
}

// Transposes the 16 x 16 floats of v (v[i] its row i) in place.
inline void transpose16(__m512 (&v)[16]) {
  __m512 t[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(v[i], v[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(v[i], v[i + 1]);
  }
  // Within each 128-bit lane: rows 4g..4g+3 of each group of four, column by column.
#pragma GCC unroll 16
  for (int i = 0; i < 16; i += 4) {
    v[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
    v[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);
    v[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    v[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  // Then the 128-bit lanes across groups.
#pragma GCC unroll 16
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_f32x4(v[i], v[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_f32x4(v[i], v[i + 4], 0xDD);
    t[i + 8] = _mm512_shuffle_f32x4(v[i + 8], v[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_f32x4(v[i + 8], v[i + 12], 0xDD);
  }
#pragma GCC unroll 16
  for (int i = 0; i < 8; ++i) {
    v[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    v[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xDD);
  }
}

// Packs rows [0, depth) and columns [0, width) of op(B) as panels of kPanel columns (the last
// one as wide as its columns rounded up to whole registers, zero past `width`).
void pack_b(bool trans_b, const float* b, int64_t ldb, int64_t depth, int64_t width,
            float* packed) {
  for (int64_t j = 0; j < width; j += kPanel) {
    const int64_t live = std::min(kPanel, width - j);
    const int64_t vectors = (live + 15) / 16;
    const int64_t panel_width = 16 * vectors;
    float* panel = packed + j * depth;
    for (int64_t q = 0; q < vectors; ++q) {
      const int64_t lanes = std::min<int64_t>(16, live - 16 * q);
      const __mmask16 mask = static_cast<__mmask16>((1u << lanes) - 1u);
      const int64_t column = j + 16 * q;
      if (!trans_b) {
        for (int64_t p = 0; p < depth; ++p)
          _mm512_store_ps(panel + p * panel_width + 16 * q,
                          _mm512_maskz_loadu_ps(mask, b + p * ldb + column));
      } else {
        // Column `column + l` of op(B) is row `column + l` of the stored B: 16 such rows by 16
        // of their values at a time, transposed in registers.
        for (int64_t p = 0; p < depth; p += 16) {
          const int64_t count = std::min<int64_t>(16, depth - p);
          const __mmask16 values = static_cast<__mmask16>((1u << count) - 1u);
          __m512 block[16];
#pragma GCC unroll 16
          for (int64_t l = 0; l < 16; ++l) {
            block[l] = l < lanes ? _mm512_maskz_loadu_ps(values, b + (column + l) * ldb + p)
                                 : _mm512_setzero_ps();
          }
          transpose16(block);
          // Unrolled whole, so the block stays in registers.
#pragma GCC unroll 16
          for (int64_t t = 0; t < 16; ++t) {
            if (t < count) _mm512_store_ps(panel + (p + t) * panel_width + 16 * q, block[t]);
          }
        }
      }
    }
  }
}

// One product, as gemm.h states it.
struct Product {
  bool trans_a, trans_b;
  int64_t m, n, k;
  float alpha;
  const float* a;
  int64_t lda;
  const float* b;
  int64_t ldb;
  float beta;
  float* c;
  int64_t ldc;
  const float* start_row;
};

// C before the products: scaled by beta, or zero where there are no products and beta is 0
// (beta = 0 ignores what C holds, NaN included); the start row where one is given and there are
// no products (the first block reads it otherwise). Returns whether the products' first block
// adds onto a value (else it starts from zero).
bool prepare_c(const Product& p) {
  const bool no_products = p.k == 0 || p.alpha == 0.0f;
  if (p.start_row) {
    if (no_products) {
      for (int64_t i = 0; i < p.m; ++i)
        std::memcpy(p.c + i * p.ldc, p.start_row, p.n * sizeof(float));
    }
    return true;
  }
  if (no_products || (p.beta != 0.0f && p.beta != 1.0f)) {
    for (int64_t i = 0; i < p.m; ++i) {
      float* row = p.c + i * p.ldc;
      for (int64_t j = 0; j < p.n; ++j) row[j] = p.beta == 0.0f ? 0.0f : row[j] * p.beta;
    }
  }
  return p.beta != 0.0f;
}

// C times one packed block of B (columns j0.., rows p0.. of op(B)): six rows of A at a time,
// read where they lie (L1 holds them while the kernel goes across the block's panels) or, for
// a scale alpha, packed first.
void multiply_block(const Product& p, int64_t j0, int64_t width, int64_t p0, int64_t depth,
                    const float* packed_b, bool load, float* packed_a) {
  for (int64_t i = 0; i < p.m; i += kRows) {
    const int64_t live_rows = std::min<int64_t>(kRows, p.m - i);
    const float* a_rows = p.trans_a ? p.a + p0 * p.lda + i : p.a + i * p.lda + p0;
    ALayout a;
    if (p.alpha != 1.0f) {
      pack_a_panel(p.trans_a, a_rows, p.lda, live_rows, depth, p.alpha, packed_a);
      a = {packed_a, 1, kRows};
    } else if (p.trans_a) {
      a = {a_rows, 1, p.lda};
    } else {
      a = {a_rows, p.lda, 1};
    }
    const auto& row_kernels = kMicroKernels[live_rows - 1];
    float* c_rows = p.c + i * p.ldc + j0;
    // The first block adds onto the start row (every row reads it), later ones onto C.
    const bool from_start_row = p0 == 0 && p.start_row;
    const float* from = from_start_row ? p.start_row + j0 : c_rows;
    const int64_t from_ld = from_start_row ? 0 : p.ldc;
    for (int64_t j = 0; j < width; j += kPanel) {
      const int64_t live = std::min(kPanel, width - j);
      const float* panel = packed_b + j * depth;
      const int64_t vectors = (live + 15) / 16;
      const int tail = static_cast<int>(live - 16 * (vectors - 1));
      const auto last_mask = static_cast<__mmask16>((1u << tail) - 1u);
      row_kernels[vectors - 1](a, panel, depth, from + j, from_ld, c_rows + j, p.ldc, load,
                               last_mask);
    }
  }
}

float* packed_b_buffer(const Product& p) {
  static thread_local Scratch scratch;
  return scratch.get(std::min(kWidth, (p.n + 15) / 16 * 16) * kDepth);
}

float* packed_a_buffer() {
  static thread_local Scratch scratch;
  return scratch.get(kRows * kDepth);
}

}  // namespace

void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc,
           const float* start_row) {
  const Product p{trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, start_row};
  if (m == 0 || n == 0) return;
  const bool load_first = prepare_c(p);
  if (k == 0 || alpha == 0.0f) return;
  float* packed_b = packed_b_buffer(p);
  float* packed_a = packed_a_buffer();
  // Blocks of k as even as whole vectors allow (288 as 2 x 144, not 256 + 32: a thin last block
  // loads and stores C for few products).
  const int64_t depth_blocks = (k + kDepth - 1) / kDepth;
  const int64_t depth_step = ((k + depth_blocks - 1) / depth_blocks + 15) / 16 * 16;
  for (int64_t j0 = 0; j0 < n; j0 += kWidth) {
    const int64_t width = std::min(kWidth, n - j0);
    for (int64_t p0 = 0; p0 < k; p0 += depth_step) {
      const int64_t depth = std::min(depth_step, k - p0);
      pack_b(trans_b, trans_b ? b + j0 * ldb + p0 : b + p0 * ldb + j0, ldb, depth, width, packed_b);
      multiply_block(p, j0, width, p0, depth, packed_b, p0 > 0 || load_first, packed_a);
    }
  }
}

}  // namespace tessel::cpu::avx512
