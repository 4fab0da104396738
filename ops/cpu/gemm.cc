// The only translation unit that includes Eigen: every matrix product in ops/ comes here.
#include "ops/cpu/gemm.h"

#include <omp.h>

#include <Eigen/Core>
#include <algorithm>

#include "core/parallel.h"

namespace tessel::cpu {

namespace {

template <typename T, int Order>
using MatrixMap = Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Order>, 0,
                             Eigen::OuterStride<>>;
template <typename T>
using OutputMap = Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>, 0,
                             Eigen::OuterStride<>>;

// A transposed row-major operand is the same bytes read as a column-major one, so every
// transpose is only a storage order for Eigen's packing routines: no copy is made.
template <typename T, int OrderA, int OrderB>
void gemm_one(int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
              int64_t ldb, T beta, T* c, int64_t ldc) {
  OutputMap<T> out(c, m, n, Eigen::OuterStride<>(ldc));
  if (k == 0 || alpha == T(0)) {
    if (beta == T(0)) {
      out.setZero();
    } else if (beta != T(1)) {
      out *= beta;
    }
    return;
  }
  MatrixMap<T, OrderA> lhs(a, m, k, Eigen::OuterStride<>(lda));
  MatrixMap<T, OrderB> rhs(b, k, n, Eigen::OuterStride<>(ldb));
  if (beta == T(0)) {
    if (alpha == T(1)) {
      out.noalias() = lhs * rhs;
    } else {
      out.noalias() = alpha * lhs * rhs;
    }
    return;
  }
  if (beta != T(1)) out *= beta;
  if (alpha == T(1)) {
    out.noalias() += lhs * rhs;
  } else {
    out.noalias() += alpha * lhs * rhs;
  }
}

template <typename T>
void gemm_dispatch(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
                   int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  constexpr int kRow = Eigen::RowMajor;
  constexpr int kCol = Eigen::ColMajor;
  if (!trans_a && !trans_b) {
    gemm_one<T, kRow, kRow>(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  } else if (!trans_a && trans_b) {
    gemm_one<T, kRow, kCol>(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  } else if (trans_a && !trans_b) {
    gemm_one<T, kCol, kRow>(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  } else {
    gemm_one<T, kCol, kCol>(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
}

// Eigen reads its thread count from a global; keep it equal to Tessel's. Inside an OpenMP
// parallel region Eigen runs single-threaded by itself.
void sync_eigen_threads() {
  if (omp_in_parallel()) return;
  int threads = get_num_threads();
  if (Eigen::nbThreads() != threads) Eigen::setNbThreads(threads);
}

// Below this many multiply-adds per matrix, Eigen's own threading costs more than it gains.
constexpr double kSmallGemmWork = 128.0 * 128.0 * 128.0;

template <typename T>
void gemm_batched_impl(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha,
                       const T* a, int64_t lda, int64_t batch_stride_a, const T* b, int64_t ldb,
                       int64_t batch_stride_b, T beta, T* c, int64_t ldc, int64_t batch_stride_c,
                       int64_t batch) {
  if (batch <= 0 || m == 0 || n == 0) return;
  sync_eigen_threads();
  auto run = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      gemm_dispatch(trans_a, trans_b, m, n, k, alpha, a + i * batch_stride_a, lda,
                    b + i * batch_stride_b, ldb, beta, c + i * batch_stride_c, ldc);
    }
  };
  const int64_t threads = get_num_threads();
  const double work = static_cast<double>(m) * n * k;
  // Whole matrices per thread avoid Eigen's per-panel synchronisation, when the batch
  // divides evenly enough to keep every thread busy.
  bool across_batch = threads > 1 && batch >= threads &&
                      (work < kSmallGemmWork || batch % threads == 0 || batch >= 4 * threads);
  if (across_batch && !omp_in_parallel()) {
    parallel_for(0, batch, 1, run);
  } else {
    run(0, batch);
  }
}

}  // namespace

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  sync_eigen_threads();
  gemm_dispatch(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
          const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c,
          int64_t ldc) {
  sync_eigen_threads();
  gemm_dispatch(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
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
