// Strided batched GEMM on CPU (f32, f64): C = alpha * op(A) * op(B) + beta * C per batch entry,
// row-major with leading dimensions, threaded with OpenMP. Eigen stays inside gemm.cc (and its
// AVX-512 build, gemm_avx512.cc). On AVX-512 CPUs f32 products run Tessel's own kernel
// (sgemm_avx512.cc), whose every element of C is beta * C plus its products in order of k by
// fused multiply-adds: the same bits however C is sliced, a batch chunked or k cut into passes.
//   cpu::gemm(false, true, m, n, k, 1.0f, a, k, w, k, 0.0f, y, n);  // y = a * w^T
#pragma once

#include <cstdint>

namespace tessel::cpu {

// One GEMM. Row-major: op(A) is m x k, op(B) is k x n, C is m x n. Without a transpose A is
// stored m x k with row stride lda; with trans_a it is stored k x m (row stride lda) and read
// transposed; likewise B. beta == 0 ignores whatever C holds (NaN included).
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
          const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c,
          int64_t ldc);
// C = row + alpha * op(A) * op(B), `row` (n dense values) added to every row of C (linear's
// bias): the bits of beta = 1 onto C filled with the row, without writing C twice.
void gemm_onto_row(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                   const float* a, int64_t lda, const float* b, int64_t ldb, const float* row,
                   float* c, int64_t ldc);
void gemm_onto_row(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
                   const double* a, int64_t lda, const double* b, int64_t ldb, const double* row,
                   double* c, int64_t ldc);

// `batch` GEMMs; entry i reads A at a + i * batch_stride_a (a stride of 0 reuses one matrix),
// B likewise, and writes C at c + i * batch_stride_c (entries of C must not overlap). Threads
// go across the batch when the matrices are small, inside each GEMM when they are large.
void gemm_batched(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                  const float* a, int64_t lda, int64_t batch_stride_a, const float* b, int64_t ldb,
                  int64_t batch_stride_b, float beta, float* c, int64_t ldc, int64_t batch_stride_c,
                  int64_t batch);
void gemm_batched(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
                  const double* a, int64_t lda, int64_t batch_stride_a, const double* b,
                  int64_t ldb, int64_t batch_stride_b, double beta, double* c, int64_t ldc,
                  int64_t batch_stride_c, int64_t batch);

// Which build of the kernel this CPU runs: "avx512 (x86-64-v4; f32: Tessel's kernel)" or
// "avx2 (x86-64-v3)" (TESSEL_GEMM_ISA=avx2 forces the portable one).
const char* gemm_isa();
// Whether this process runs the AVX-512 kernels (the GEMM's build and the Winograd products).
bool avx512_kernels();

}  // namespace tessel::cpu
