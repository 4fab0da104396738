// Strided batched GEMM. Where the CPU has AVX-512, f32 products run Tessel's own kernel
// (sgemm_avx512.cc) and f64 ones Eigen's kernel built for x86-64-v4 (gemm_avx512.cc); elsewhere
// Eigen's kernel built here for the portable x86-64-v3 target. Set TESSEL_GEMM_ISA=avx2 to
// force the portable build. Threads each compute one slice of C (or whole matrices of a batch)
// with a single-threaded product.
#include "ops/cpu/gemm.h"

#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/threading.h"
#include "ops/cpu/sgemm_avx512.h"

#define TESSEL_GEMM_VARIANT portable
#include "ops/cpu/gemm_eigen.inc"

namespace tessel::cpu {

namespace avx512 {
// Eigen's f64 kernel built for AVX-512 (gemm_avx512.cc).
void gemm_f64(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
              const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c,
              int64_t ldc);
}  // namespace avx512

namespace {

// Decided once per process, so every GEMM (and every recomputation) runs the same kernel.
bool use_avx512() {
  static const bool chosen = [] {
    const char* forced = std::getenv("TESSEL_GEMM_ISA");
    if (forced && std::strcmp(forced, "avx2") == 0) return false;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
  }();
  return chosen;
}

// Every row of C (m x n) set to `row`: the start of a product onto a row for Eigen's kernel.
template <typename T>
void fill_rows(const T* row, int64_t m, int64_t n, T* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i) std::copy(row, row + n, c + i * ldc);
}

// One single-threaded GEMM on the kernel build this CPU runs; with a start row, onto that row
// (beta is then 1).
void gemm_serial(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                 const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                 int64_t ldc, const float* start_row = nullptr) {
  if (use_avx512()) {
    avx512::sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, start_row);
    return;
  }
  if (start_row) fill_rows(start_row, m, n, c, ldc), beta = 1.0f;
  portable::gemm<float>(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void gemm_serial(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
                 const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c,
                 int64_t ldc, const double* start_row = nullptr) {
  if (start_row) fill_rows(start_row, m, n, c, ldc), beta = 1.0;
  if (use_avx512()) {
    avx512::gemm_f64(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  } else {
    portable::gemm<double>(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
}

// Below this many multiply-adds a GEMM runs on one thread: waking sleeping threads (a passive
// OpenMP wait policy) costs about 50 us on the 2-core development machine, where one thread
// multiplies 128^3 in about 40 us and 256^3 in about 440 us.
constexpr double kThreadedGemmWork = 4.0 * 1024 * 1024;
// Slices of C start at multiples of this many rows or columns (whole SIMD registers).
constexpr int64_t kSliceAlign = 16;

// Splits C into one slice per thread along its longer side; each thread multiplies its rows of
// op(A) (or columns of op(B)) by the whole other operand.
template <typename T>
void gemm_threaded(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
                   int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc,
                   const T* start_row = nullptr) {
  if (m == 0 || n == 0) return;
  const int64_t threads = get_num_threads();
  const bool split_rows = m >= n;
  const int64_t extent = split_rows ? m : n;
  const int64_t slices = std::min<int64_t>(threads, extent / kSliceAlign);
  if (slices <= 1 || omp_in_parallel() ||
      static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) <
          kThreadedGemmWork) {
    gemm_serial(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, start_row);
    return;
  }
  auto boundary = [&](int64_t slice) {
    if (slice >= slices) return extent;
    return (extent * slice / slices) / kSliceAlign * kSliceAlign;
  };
  parallel_for(0, slices, 1, [&](int64_t begin, int64_t end) {
    for (int64_t slice = begin; slice < end; ++slice) {
      const int64_t lo = boundary(slice), hi = boundary(slice + 1);
      if (hi <= lo) continue;
      if (split_rows) {
        // Rows lo..hi of op(A): row i is at a + i * lda, or column i of a stored transpose.
        const T* a_slice = trans_a ? a + lo : a + lo * lda;
        gemm_serial(trans_a, trans_b, hi - lo, n, k, alpha, a_slice, lda, b, ldb, beta,
                    c + lo * ldc, ldc, start_row);
      } else {
        const T* b_slice = trans_b ? b + lo * ldb : b + lo;
        gemm_serial(trans_a, trans_b, m, hi - lo, k, alpha, a, lda, b_slice, ldb, beta, c + lo, ldc,
                    start_row ? start_row + lo : nullptr);
      }
    }
  });
}

template <typename T>
void gemm_batched_impl(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha,
                       const T* a, int64_t lda, int64_t batch_stride_a, const T* b, int64_t ldb,
                       int64_t batch_stride_b, T beta, T* c, int64_t ldc, int64_t batch_stride_c,
                       int64_t batch) {
  if (batch <= 0 || m == 0 || n == 0) return;
  if (batch == 1) {
    gemm_threaded(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  const int64_t threads = get_num_threads();
  // Whole matrices per thread when the batch keeps every thread about equally busy and is work
  // enough to wake them; otherwise one matrix at a time, each split across the threads (or not,
  // when small).
  const bool across_batch = threads > 1 && !omp_in_parallel() && batch >= threads &&
                            (batch % threads == 0 || batch >= 4 * threads) &&
                            static_cast<double>(batch) * static_cast<double>(m) *
                                    static_cast<double>(n) * static_cast<double>(k) >=
                                kThreadedGemmWork;
  if (!across_batch) {
    for (int64_t i = 0; i < batch; ++i)
      gemm_threaded(trans_a, trans_b, m, n, k, alpha, a + i * batch_stride_a, lda,
                    b + i * batch_stride_b, ldb, beta, c + i * batch_stride_c, ldc);
    return;
  }
  parallel_for(0, batch, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      gemm_serial(trans_a, trans_b, m, n, k, alpha, a + i * batch_stride_a, lda,
                  b + i * batch_stride_b, ldb, beta, c + i * batch_stride_c, ldc);
  });
}

}  // namespace

const char* gemm_isa() {
  return use_avx512() ? "avx512 (x86-64-v4; f32: Tessel's kernel)" : "avx2 (x86-64-v3)";
}

bool avx512_kernels() { return use_avx512(); }

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  gemm_threaded(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
          const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c,
          int64_t ldc) {
  gemm_threaded(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void gemm_onto_row(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                   const float* a, int64_t lda, const float* b, int64_t ldb, const float* row,
                   float* c, int64_t ldc) {
  gemm_threaded(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, 1.0f, c, ldc, row);
}

void gemm_onto_row(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
                   const double* a, int64_t lda, const double* b, int64_t ldb, const double* row,
                   double* c, int64_t ldc) {
  gemm_threaded(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, 1.0, c, ldc, row);
}

void gemm_batched(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                  const float* a, int64_t lda, int64_t batch_stride_a, const float* b, int64_t ldb,
                  int64_t batch_stride_b, float beta, float* c, int64_t ldc, int64_t batch_stride_c,
                  int64_t batch) {
  gemm_batched_impl(trans_a, trans_b, m, n, k, alpha, a, lda, batch_stride_a, b, ldb,
                    batch_stride_b, beta, c, ldc, batch_stride_c, batch);
}

void gemm_batched(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
                  const double* a, int64_t lda, int64_t batch_stride_a, const double* b,
                  int64_t ldb, int64_t batch_stride_b, double beta, double* c, int64_t ldc,
                  int64_t batch_stride_c, int64_t batch) {
  gemm_batched_impl(trans_a, trans_b, m, n, k, alpha, a, lda, batch_stride_a, b, ldb,
                    batch_stride_b, beta, c, ldc, batch_stride_c, batch);
}

}  // namespace tessel::cpu
