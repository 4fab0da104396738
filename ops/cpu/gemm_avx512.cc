// The f64 GEMM built for AVX-512 (x86-64-v4; see ops/BUILD), called by gemm.cc only on CPUs that
// have it. Eigen's namespace is renamed here so none of its templates, compiled with AVX-512
// instructions, can stand in for the portable build's copies at link time.
#define Eigen tessel_eigen_avx512
#define TESSEL_GEMM_VARIANT avx512
#include "ops/cpu/gemm_eigen.inc"

namespace tessel::cpu::avx512 {

void gemm_f64(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
              const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c,
              int64_t ldc) {
  gemm<double>(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace tessel::cpu::avx512
