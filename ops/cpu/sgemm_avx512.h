// Tessel's own f32 GEMM for CPUs with AVX-512 (sgemm_avx512.cc, built for x86-64-v4): call it
// only where cpu::avx512_kernels() says so. Conventions as cpu::gemm (gemm.h); every element of
// C is beta * C (nothing when beta is 0) plus its k products in order of k by fused
// multiply-adds, so its bits depend on its row of op(A), its column of op(B) and k only.
#pragma once

#include <cstdint>

namespace tessel::cpu::avx512 {

// One product on the calling thread. With a start row (n values), every row of C starts as
// that row instead of beta * C (C is only written): the bits of beta = 1 onto C filled with it.
void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc,
           const float* start_row = nullptr);

}  // namespace tessel::cpu::avx512
