// The CPU kernel of dropout: element i's mask depends only on the recorded state (word i % 4 of
// Philox counter offset + i / 4, ops/math/dropout.h, as the CUDA kernel), not on threads. f32
// with AVX2 draws 8 counters (32 elements) at once; the rest one counter at a time.
#include "ops/math/dropout.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/rng.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/strided_copy.h"
#include "ops/ops.h"
#include "ops/registry_helpers.h"

namespace tessel::cpu {

double keep_scale(double p) { return p < 1.0 ? 1.0 / (1.0 - p) : 0.0; }

namespace {

#if defined(__AVX2__)
// The high and low 32 bits of each lane's 32 x 32-bit product (mul_epu32 multiplies the even
// lanes; the odd ones are shifted down to be multiplied too).
inline void multiply_wide(__m256i a, __m256i b, __m256i& high, __m256i& low) {
  const __m256i even = _mm256_mul_epu32(a, b);
  const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), b);
  high = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
  low = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
}

// Dropout of the 32 elements of counters first_counter .. first_counter + 7 (philox4x32_words,
// eight at once): y and the mask as dropout_counter writes them.
inline void dropout_32_f32(const float* x, float* y, bool* mask, uint64_t seed,
                           uint64_t first_counter, uint32_t threshold, float scale) {
  alignas(32) uint32_t low[8], high[8];
  for (int lane = 0; lane < 8; ++lane) {
    const uint64_t counter = first_counter + static_cast<uint64_t>(lane);
    low[lane] = static_cast<uint32_t>(counter);
    high[lane] = static_cast<uint32_t>(counter >> 32);
  }
  __m256i c0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(low));
  __m256i c1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(high));
  __m256i c2 = _mm256_setzero_si256(), c3 = _mm256_setzero_si256();
  const __m256i mul0 = _mm256_set1_epi32(static_cast<int>(kPhiloxMul0));
  const __m256i mul1 = _mm256_set1_epi32(static_cast<int>(kPhiloxMul1));
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    __m256i high0, low0, high1, low1;
    multiply_wide(c0, mul0, high0, low0);
    multiply_wide(c2, mul1, high1, low1);
    c0 = _mm256_xor_si256(_mm256_xor_si256(high1, c1), _mm256_set1_epi32(static_cast<int>(k0)));
    c2 = _mm256_xor_si256(_mm256_xor_si256(high0, c3), _mm256_set1_epi32(static_cast<int>(k1)));
    c1 = low1;
    c3 = low0;
    k0 += kPhiloxWeyl0;
    k1 += kPhiloxWeyl1;
  }
  // Lane l of c_w is word w of counter l; element 4 l + w takes it: a 4 x 8 transpose.
  const __m256i t0 = _mm256_unpacklo_epi32(c0, c1), t1 = _mm256_unpackhi_epi32(c0, c1);
  const __m256i t2 = _mm256_unpacklo_epi32(c2, c3), t3 = _mm256_unpackhi_epi32(c2, c3);
  const __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
  const __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
  const __m256i bits[4] = {
      _mm256_permute2x128_si256(u0, u1, 0x20), _mm256_permute2x128_si256(u2, u3, 0x20),
      _mm256_permute2x128_si256(u0, u1, 0x31), _mm256_permute2x128_si256(u2, u3, 0x31)};
  // Kept iff (bits >> 8) >= threshold; both below 2^24 + 1, so a signed comparison serves.
  const __m256i below = _mm256_set1_epi32(static_cast<int>(threshold) - 1);
  const __m256 scales = _mm256_set1_ps(scale);
  __m256i keep[4];
  for (int part = 0; part < 4; ++part) {
    keep[part] = _mm256_cmpgt_epi32(_mm256_srli_epi32(bits[part], 8), below);
    const __m256 scaled = _mm256_mul_ps(_mm256_loadu_ps(x + 8 * part), scales);
    _mm256_storeu_ps(y + 8 * part, _mm256_and_ps(scaled, _mm256_castsi256_ps(keep[part])));
  }
  // The 32 masks (all ones or zero) as bytes 1 or 0, in element order.
  const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(keep[0], keep[1]),
                                           _mm256_packs_epi32(keep[2], keep[3]));
  const __m256i ordered =
      _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(mask),
                      _mm256_and_si256(ordered, _mm256_set1_epi8(1)));
}
#endif

}  // namespace

// inputs (x); outputs (y, mask): y = x * mask / (1 - p), mask bool (true: kept).
void dropout_kernel(KernelContext& context) {
  const double p = context.attrs.get<double>("p");
  const RngState state{static_cast<uint64_t>(context.attrs.get<int64_t>("rng_seed")),
                       static_cast<uint64_t>(context.attrs.get<int64_t>("rng_offset"))};
  visit_float_dtype(context.inputs[0].dtype(), "dropout", [&](auto tag) {
    using T = decltype(tag);
    const Tensor x = cpu::dense_input(context, context.inputs[0]);
    const Tensor& y_out = context.outputs[0];
    const Tensor& mask_out = context.outputs[1];
    const Tensor y =
        y_out.is_contiguous() ? y_out : context.workspace(y_out.sizes(), y_out.dtype());
    const Tensor mask =
        mask_out.is_contiguous() ? mask_out : context.workspace(mask_out.sizes(), DType::kBool);
    const T* x_data = x.data_ptr<T>();
    T* y_data = y.data_ptr<T>();
    bool* mask_data = mask.data_ptr<bool>();
    const int64_t numel = x.numel();
    const T scale = static_cast<T>(keep_scale(p));
    // One Philox call gives the four numbers of a counter (uniform_at's numbers).
    const int64_t counters = (numel + 3) / 4;
    int64_t first_single = 0;  // counters before it were drawn eight at once
#if defined(__AVX2__)
    if constexpr (std::is_same_v<T, float>) {
      // uniform_from_bits(bits) = (bits >> 8) / 2^24 >= p iff (bits >> 8) >= ceil(p 2^24).
      const auto threshold = static_cast<uint32_t>(std::ceil(p * 16777216.0));
      const int64_t blocks = numel / 32;
      parallel_for(0, blocks, 32, [&](int64_t begin, int64_t end) {
        for (int64_t block = begin; block < end; ++block)
          dropout_32_f32(x_data + 32 * block, y_data + 32 * block, mask_data + 32 * block,
                         state.seed, state.offset + static_cast<uint64_t>(8 * block), threshold,
                         scale);
      });
      first_single = 8 * blocks;
    }
#endif
    parallel_for(first_single, counters, 1024, [&](int64_t begin, int64_t end) {
      for (int64_t counter = begin; counter < end; ++counter)
        dropout_counter(x_data, y_data, mask_data, numel, state.seed, state.offset, counter, p,
                        scale);
    });
    if (!y.is_same(y_out)) cpu::copy_strided(y, y_out);
    if (!mask.is_same(mask_out)) cpu::copy_strided(mask, mask_out);
  });
}

}  // namespace tessel::cpu
