// The CPU GEMM (ops/cpu/gemm.h) against each element's sum written out. On AVX-512 CPUs the f32
// kernel promises each element's bits (beta * C, then its products in order of k by fused
// multiply-adds), so slices, threads, batches and passes over k change nothing; elsewhere (and
// in gemm_test_avx2, on Eigen's kernel) the values are checked within rounding.
#include "ops/cpu/gemm.h"

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/threading.h"
#include "gtest/gtest.h"

namespace tessel {
namespace {

struct Product {
  bool trans_a, trans_b;
  int64_t m, n, k, lda, ldb, ldc;
  std::vector<float> a, b, c;
};

// Random operands; C is NaN where beta is 0 (it must be ignored), and every leading dimension
// is `pad` wider than its rows.
Product random_product(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, int64_t pad,
                       bool c_is_nan, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  Product p{trans_a, trans_b, m,  n, k, (trans_a ? m : k) + pad, (trans_b ? k : n) + pad,
            n + pad, {},      {}, {}};
  p.a.resize(static_cast<size_t>((trans_a ? k : m) * p.lda));
  p.b.resize(static_cast<size_t>((trans_b ? n : k) * p.ldb));
  p.c.resize(static_cast<size_t>(m * p.ldc));
  for (float& x : p.a) x = value(rng);
  for (float& x : p.b) x = value(rng);
  for (float& x : p.c) x = c_is_nan ? std::numeric_limits<float>::quiet_NaN() : value(rng);
  return p;
}

// C as the kernel's promise says, element by element; the padding after each row untouched.
std::vector<float> written_out(const Product& p, float alpha, float beta) {
  std::vector<float> c = p.c;
  for (int64_t i = 0; i < p.m; ++i) {
    for (int64_t j = 0; j < p.n; ++j) {
      float sum = beta == 0.0f ? 0.0f : p.c[i * p.ldc + j] * beta;
      for (int64_t q = 0; q < p.k; ++q) {
        const float a = p.trans_a ? p.a[q * p.lda + i] : p.a[i * p.lda + q];
        const float b = p.trans_b ? p.b[j * p.ldb + q] : p.b[q * p.ldb + j];
        sum = std::fma(alpha * a, b, sum);
      }
      c[i * p.ldc + j] = sum;
    }
  }
  return c;
}

// Elements that differ: in bits on AVX-512 CPUs, else by more than rounding.
int64_t mismatches(const std::vector<float>& actual, const std::vector<float>& expected,
                   int64_t k) {
  int64_t count = 0;
  const bool exact = cpu::avx512_kernels();
  for (size_t i = 0; i < actual.size(); ++i) {
    const float x = actual[i], y = expected[i];
    if (std::isnan(x) || std::isnan(y)) {
      count += std::isnan(x) != std::isnan(y);
    } else if (exact) {
      count += std::memcmp(&x, &y, sizeof(float)) != 0;
    } else {
      count += std::fabs(x - y) > 1e-6f * static_cast<float>(k + 1) * (1.0f + std::fabs(y));
    }
  }
  return count;
}

TEST(CpuGemm, EachElementIsBetaCPlusItsProductsInOrder) {
  // Edges of the kernel's tiles (6 rows, 16-64 columns) and of its blocks of k (256), with both
  // transposes, padded leading dimensions and each kind of beta; alpha 2 on a few.
  const int64_t sizes[] = {1, 5, 6, 7, 17, 64, 65, 130, 200};
  unsigned seed = 1;
  for (bool trans_a : {false, true}) {
    for (bool trans_b : {false, true}) {
      for (int64_t m : sizes) {
        for (int64_t n : sizes) {
          for (int64_t k : {1, 31, 257, 600}) {
            const float beta = seed % 3 == 0 ? 0.0f : seed % 3 == 1 ? 1.0f : 0.5f;
            const float alpha = seed % 7 == 0 ? 2.0f : 1.0f;
            Product p =
                random_product(trans_a, trans_b, m, n, k, seed % 2 ? 3 : 0, beta == 0.0f, seed);
            ++seed;
            const std::vector<float> expected = written_out(p, alpha, beta);
            cpu::gemm(trans_a, trans_b, m, n, k, alpha, p.a.data(), p.lda, p.b.data(), p.ldb, beta,
                      p.c.data(), p.ldc);
            ASSERT_EQ(mismatches(p.c, expected, k), 0)
                << "trans_a " << trans_a << " trans_b " << trans_b << " m " << m << " n " << n
                << " k " << k << " alpha " << alpha << " beta " << beta;
          }
        }
      }
    }
  }
}

TEST(CpuGemm, WideProductsAndEmptySums) {
  // Many packed blocks of B (512 columns each); then k = 0 and alpha = 0 leave beta * C.
  for (bool trans_b : {false, true}) {
    Product p = random_product(false, trans_b, 13, 4200, 40, 1, false, 7);
    const std::vector<float> expected = written_out(p, 1.0f, 0.5f);
    cpu::gemm(false, trans_b, p.m, p.n, p.k, 1.0f, p.a.data(), p.lda, p.b.data(), p.ldb, 0.5f,
              p.c.data(), p.ldc);
    EXPECT_EQ(mismatches(p.c, expected, p.k), 0) << "trans_b " << trans_b;
  }
  for (float alpha : {1.0f, 0.0f}) {
    const int64_t k = alpha == 0.0f ? 9 : 0;
    Product p = random_product(true, false, 9, 11, k, 0, false, 8);
    std::vector<float> expected = p.c;
    for (float& x : expected) x *= 0.5f;
    cpu::gemm(true, false, p.m, p.n, k, alpha, p.a.data(), p.lda, p.b.data(), p.ldb, 0.5f,
              p.c.data(), p.ldc);
    EXPECT_EQ(mismatches(p.c, expected, 1), 0) << "alpha " << alpha;
  }
}

TEST(CpuGemm, ProductsOntoARowAreBetaOneOntoThatRowRepeated) {
  // Tile edges, one thread and both thread splits (rows when m >= n, columns otherwise), k = 0
  // and alpha = 0: C's old contents (NaN) are never read.
  const int threads = get_num_threads();
  unsigned seed = 40;
  for (int thread_count : {1, 2}) {
    set_num_threads(thread_count);
    for (bool trans_b : {false, true}) {
      for (auto [m, n, k] : {std::array<int64_t, 3>{7, 65, 31},
                             {64, 64, 64},
                             {300, 70, 257},
                             {40, 700, 300},
                             {5, 9, 0}}) {
        for (float alpha : {1.0f, 0.0f}) {
          Product p = random_product(false, trans_b, m, n, k, 2, true, ++seed);
          std::vector<float> row(static_cast<size_t>(n));
          for (int64_t j = 0; j < n; ++j) row[j] = static_cast<float>(j % 11) * 0.25f - 1.0f;
          Product filled = p;
          for (int64_t i = 0; i < m; ++i)
            std::copy(row.begin(), row.end(), filled.c.begin() + i * p.ldc);
          const std::vector<float> expected = written_out(filled, alpha, 1.0f);
          cpu::gemm_onto_row(false, trans_b, m, n, k, alpha, p.a.data(), p.lda, p.b.data(), p.ldb,
                             row.data(), p.c.data(), p.ldc);
          // The padding after each row stays NaN, as in `expected`.
          EXPECT_EQ(mismatches(p.c, expected, k), 0)
              << thread_count << " threads, trans_b " << trans_b << " m " << m << " n " << n
              << " k " << k << " alpha " << alpha;
        }
      }
    }
  }
  set_num_threads(threads);
}

TEST(CpuGemm, SlicesThreadsBatchesAndPassesGiveTheWholeProductsBits) {
  if (!cpu::avx512_kernels()) GTEST_SKIP() << "bits are promised by the AVX-512 kernel only";
  const int64_t m = 300, n = 500, k = 700;
  Product p = random_product(false, true, m, n, k, 0, true, 11);
  const int threads = get_num_threads();
  auto whole = [&](int thread_count) {
    set_num_threads(thread_count);
    std::vector<float> c(static_cast<size_t>(m * n));
    cpu::gemm(false, true, m, n, k, 1.0f, p.a.data(), p.lda, p.b.data(), p.ldb, 0.0f, c.data(), n);
    return c;
  };
  const std::vector<float> two_threads = whole(2);
  EXPECT_EQ(mismatches(whole(1), two_threads, k), 0) << "one thread";
  set_num_threads(threads);

  // Rows 100..183 alone, and k in passes of 250 with beta = 1.
  std::vector<float> rows(static_cast<size_t>(84 * n));
  cpu::gemm(false, true, 84, n, k, 1.0f, p.a.data() + 100 * p.lda, p.lda, p.b.data(), p.ldb, 0.0f,
            rows.data(), n);
  EXPECT_EQ(
      mismatches(rows,
                 std::vector<float>(two_threads.begin() + 100 * n, two_threads.begin() + 184 * n),
                 k),
      0)
      << "a slice of rows";
  std::vector<float> passes(static_cast<size_t>(m * n));
  for (int64_t q = 0; q < k; q += 250) {
    cpu::gemm(false, true, m, n, std::min<int64_t>(250, k - q), 1.0f, p.a.data() + q, p.lda,
              p.b.data() + q, p.ldb, q == 0 ? 0.0f : 1.0f, passes.data(), n);
  }
  EXPECT_EQ(mismatches(passes, two_threads, k), 0) << "passes over k";

  // The same product three times as one batch (the batch split across threads).
  std::vector<float> batch(static_cast<size_t>(3 * m * n));
  cpu::gemm_batched(false, true, m, n, k, 1.0f, p.a.data(), p.lda, 0, p.b.data(), p.ldb, 0, 0.0f,
                    batch.data(), n, m * n, 3);
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(
        mismatches(std::vector<float>(batch.begin() + i * m * n, batch.begin() + (i + 1) * m * n),
                   two_threads, k),
        0)
        << "batch entry " << i;
  }
}

}  // namespace
}  // namespace tessel
