// The per-element math and index code that CPU loops and CUDA kernels share (ops/math): loop
// offsets in 32-bit and 64-bit arithmetic against a naive walk of the original strides, the
// contiguous and 32-bit path conditions, reduction plans, matrix layouts, gather index maps,
// pooling windows against brute force, and the run-time-kind functors the CUDA kernels use
// against the compile-time-kind ones the CPU loops use.
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "ops/math/channel_layout.h"
#include "ops/math/elementwise.h"
#include "ops/math/indexing.h"
#include "ops/math/loop_geometry.h"
#include "ops/math/matrix_layout.h"
#include "ops/math/pooling.h"
#include "ops/math/reduce_layout.h"
#include "tests/testing.h"

namespace tessel {
namespace {

// Offset of row-major element `linear` of `sizes` under `strides`, walking every dim.
int64_t naive_offset(const Shape& sizes, const Shape& strides, int64_t linear) {
  int64_t offset = 0;
  for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= 0; --d) {
    offset += (linear % sizes[d]) * strides[d];
    linear /= sizes[d];
  }
  return offset;
}

// Checks both device offset paths of a 3-operand loop over `sizes` against naive offsets.
void expect_offsets_match(const Shape& sizes, const std::array<Shape, 3>& strides) {
  const CoalescedLoop<3> loop = coalesce_loop<3>(sizes, strides);
  ASSERT_EQ(loop.numel(), shape_numel(sizes));
  const auto wide = offset_calculator<3, int64_t>(loop);
  const bool narrow_ok = loop.fits_32bit();
  const auto narrow = offset_calculator<3, uint32_t>(loop);
  for (int64_t i = 0; i < shape_numel(sizes); ++i) {
    int64_t wide_offsets[3];
    wide.offsets(i, wide_offsets);
    uint32_t narrow_offsets[3];
    if (narrow_ok) narrow.offsets(static_cast<uint32_t>(i), narrow_offsets);
    for (int k = 0; k < 3; ++k) {
      const int64_t expected = naive_offset(sizes, strides[k], i);
      ASSERT_EQ(wide_offsets[k], expected) << "operand " << k << " element " << i;
      if (narrow_ok) {
        ASSERT_EQ(static_cast<int64_t>(narrow_offsets[k]), expected);
      }
      if (loop.contiguous()) {
        ASSERT_EQ(expected, i);
      }
    }
  }
}

TEST(SharedLoopGeometry, BroadcastStridedOffsetsMatchANaiveWalk) {
  // out (2, 3, 4, 5) transposed in its last two dims; a (3, 1, 5) broadcast; b a step-2 slice.
  const Shape sizes{2, 3, 4, 5};
  const Shape out_strides{60, 20, 1, 4};
  const Shape a_strides = broadcast_strides({3, 1, 5}, {5, 5, 1}, sizes);
  EXPECT_EQ(a_strides, (Shape{0, 5, 0, 1}));
  const Shape b_strides{240, 80, 20, 2};
  expect_offsets_match(sizes, {out_strides, a_strides, b_strides});
  // Dims that merge for every operand collapse, others stay.
  const CoalescedLoop<3> loop = coalesce_loop<3>(sizes, {out_strides, a_strides, b_strides});
  EXPECT_EQ(loop.sizes.size(), 4u);
  EXPECT_FALSE(loop.contiguous());
}

TEST(SharedLoopGeometry, ContiguousOperandsOfOneShapeTakeTheLinearPath) {
  const Shape sizes{4, 1, 6, 7};
  const Shape dense = contiguous_strides(sizes);
  const CoalescedLoop<3> loop = coalesce_loop<3>(sizes, {dense, dense, dense});
  EXPECT_EQ(loop.sizes, (Shape{4 * 6 * 7}));
  EXPECT_TRUE(loop.contiguous());
  expect_offsets_match(sizes, {dense, dense, dense});
  // A broadcast operand (stride 0) keeps the strided path, with one dim after merging.
  const Shape scalar{0, 0, 0, 0};
  const CoalescedLoop<3> broadcast = coalesce_loop<3>(sizes, {dense, dense, scalar});
  EXPECT_EQ(broadcast.sizes.size(), 1u);
  EXPECT_FALSE(broadcast.contiguous());
  expect_offsets_match(sizes, {dense, dense, scalar});
  // A 0-d loop is one element.
  const CoalescedLoop<3> single = coalesce_loop<3>({}, {Shape{}, Shape{}, Shape{}});
  EXPECT_EQ(single.numel(), 1);
  EXPECT_TRUE(single.contiguous());
}

TEST(SharedLoopGeometry, ThirtyTwoBitPathOnlyWhereEveryOffsetFits) {
  const int64_t big = int64_t{1} << 30;
  // Offsets up to 2^30 + 7: the 32-bit path applies and agrees with the 64-bit one.
  expect_offsets_match({2, 8}, {Shape{big, 1}, Shape{8, 1}, Shape{0, 1}});
  EXPECT_TRUE((coalesce_loop<3>({2, 8}, {Shape{big, 1}, Shape{8, 1}, Shape{0, 1}}).fits_32bit()));
  // The last offset 2 * 2^30 + 7 does not fit in 31 bits.
  EXPECT_FALSE((coalesce_loop<3>({3, 8}, {Shape{big, 1}, Shape{8, 1}, Shape{0, 1}}).fits_32bit()));
  // Neither does a loop of 2^31 elements, whatever its strides.
  const Shape huge{int64_t{1} << 16, int64_t{1} << 15};
  const Shape huge_dense = contiguous_strides(huge);
  EXPECT_FALSE((coalesce_loop<3>(huge, {huge_dense, huge_dense, huge_dense}).fits_32bit()));
  const Shape half{int64_t{1} << 16, (int64_t{1} << 15) - 1};
  const Shape half_dense = contiguous_strides(half);
  EXPECT_TRUE((coalesce_loop<3>(half, {half_dense, half_dense, half_dense}).fits_32bit()));
}

TEST(SharedLoopGeometry, RandomGeometriesAgreeOnBothIndexWidths) {
  std::mt19937 random(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int ndim = 1 + static_cast<int>(random() % 5);
    Shape sizes(ndim);
    for (auto& size : sizes) size = 1 + static_cast<int64_t>(random() % 4);
    std::array<Shape, 3> strides;
    for (auto& operand : strides) {
      operand.resize(ndim);
      for (auto& stride : operand) stride = static_cast<int64_t>(random() % 3) * 7;
    }
    strides[0] = contiguous_strides(sizes);  // the output
    expect_offsets_match(sizes, strides);
  }
}

// ---- reductions ----

TEST(SharedReduceLayout, AdjacentReducedDimsReadTheInputAsOneBlock) {
  const ReductionPlan plan =
      plan_reduction({2, 3, 4, 5}, {60, 20, 5, 1}, {false, true, true, false});
  EXPECT_FALSE(plan.permuted);
  EXPECT_EQ(plan.layout.outer, 2);
  EXPECT_EQ(plan.layout.reduce, 12);
  EXPECT_EQ(plan.layout.inner, 5);
  EXPECT_EQ(plan.layout.offset(1, 2, 3), (1 * 12 + 2) * 5 + 3);
  // Size-1 dims between reduced ones do not split them.
  const ReductionPlan ones = plan_reduction({3, 1, 4}, {4, 4, 1}, {true, false, true});
  EXPECT_FALSE(ones.permuted);
  EXPECT_EQ(ones.layout.reduce, 12);
}

TEST(SharedReduceLayout, SeparatedReducedDimsPermuteKeptDimsFirst) {
  const Shape sizes{2, 3, 4, 5};
  const Shape strides{60, 20, 5, 1};
  const std::vector<bool> reduced{true, false, true, false};
  const ReductionPlan plan = plan_reduction(sizes, strides, reduced);
  ASSERT_TRUE(plan.permuted);
  EXPECT_EQ(plan.sizes, (Shape{3, 5, 2, 4}));
  EXPECT_EQ(plan.strides, (Shape{20, 1, 60, 5}));
  EXPECT_EQ(plan.layout.outer, 15);
  EXPECT_EQ(plan.layout.reduce, 8);
  EXPECT_EQ(plan.layout.inner, 1);
  // Block element (o, r) is x[n, c, h, w] with o = (c, w), r = (n, h).
  for (int64_t o = 0; o < 15; ++o)
    for (int64_t r = 0; r < 8; ++r) {
      const int64_t c = o / 5, w = o % 5, n = r / 4, h = r % 4;
      EXPECT_EQ(naive_offset(plan.sizes, plan.strides, plan.layout.offset(o, r, 0)),
                n * 60 + c * 20 + h * 5 + w);
    }
}

TEST(SharedReduceLayout, ReducedFlagsWrapAndRejectRepeats) {
  EXPECT_EQ(reduced_flags("sum", {2, 3, 4}, {-1, 0}), (std::vector<bool>{true, false, true}));
  EXPECT_EQ(reduced_flags("sum", {2, 3}, {}), (std::vector<bool>{true, true}));
  EXPECT_TRUE(testing::throws_error([] { reduced_flags("sum", {2, 3}, {1, -1}); }, "twice"));
}

// ---- matrix products ----

TEST(SharedMatrixLayout, OperandsAreReadInPlaceWhenRowOrColumnMajor) {
  const MatrixLayout row_major = operand_layout(4, 3, 5, 1, 1, 0);
  EXPECT_TRUE(row_major.in_place);
  EXPECT_FALSE(row_major.transposed);
  EXPECT_EQ(row_major.ld, 5);
  const MatrixLayout transposed = operand_layout(4, 3, 1, 4, 2, 12);  // x.transpose(-1, -2)
  EXPECT_TRUE(transposed.in_place);
  EXPECT_TRUE(transposed.transposed);
  EXPECT_EQ(transposed.ld, 4);
  EXPECT_EQ(transposed.batch_stride, 12);
  const MatrixLayout strided = operand_layout(4, 3, 6, 2, 2, 24);  // every other column
  EXPECT_FALSE(strided.in_place);
  EXPECT_EQ(strided.ld, 3);
  EXPECT_EQ(strided.batch_stride, 12);
  EXPECT_EQ(row_major_ld(1, 5, 999, 1), 5);  // a single row may have any row stride
}

TEST(SharedMatrixLayout, ResultsAreWrittenInPlaceOnlyWithoutOverlapOrAliasing) {
  EXPECT_TRUE(result_layout(3, 4, 4, 1, 2, 12, false).in_place);
  EXPECT_FALSE(result_layout(3, 4, 4, 1, 2, 8, false).in_place);  // batches overlap
  EXPECT_FALSE(result_layout(3, 4, 4, 1, 2, 12, true).in_place);  // shares an input's storage
  const MatrixLayout staged = result_layout(3, 4, 1, 3, 2, 12, false);
  EXPECT_FALSE(staged.in_place);
  EXPECT_EQ(staged.ld, 4);
  EXPECT_EQ(staged.batch_stride, 12);
}

TEST(SharedMatrixLayout, LeadingDimsCollapseIntoOneRowStride) {
  const int64_t sizes[] = {2, 3, 4}, dense[] = {12, 4, 1}, padded[] = {30, 10, 1};
  EXPECT_EQ(collapsed_row_stride(sizes, dense, 3), 4);
  const int64_t sliced[] = {24, 4, 1};  // every other block of 3 rows
  EXPECT_EQ(collapsed_row_stride(sizes, sliced, 3), -1);
  EXPECT_EQ(collapsed_row_stride(sizes, padded, 3), 10);
}

// ---- gathers ----

TEST(SharedIndexing, RowOffsetsMatchTheRowMajorLayout) {
  const Shape sizes{2, 5, 3, 4};
  const Around shape = around(sizes, 1);
  EXPECT_EQ(shape.outer, 2);
  EXPECT_EQ(shape.size, 5);
  EXPECT_EQ(shape.inner, 12);
  const Shape strides = contiguous_strides(sizes);
  const int64_t count = 3;
  for (int64_t i = 0; i < shape.outer * count * shape.inner; ++i) {
    const RowPosition at = row_position(i, count, shape.inner);
    EXPECT_EQ(Around({shape.outer, count, shape.inner}).offset(at.o, at.j, at.k), i);
    const int64_t c = at.k / 4, w = at.k % 4;
    EXPECT_EQ(shape.offset(at.o, 4, at.k), at.o * strides[0] + 4 * strides[1] + c * strides[2] + w);
  }
}

// ---- pooling ----

TEST(SharedPooling, CoveringOutputsHoldEveryWindowThatReachesAnInput) {
  for (int64_t input = 1; input <= 9; ++input)
    for (int64_t kernel = 1; kernel <= 4; ++kernel)
      for (int64_t stride = 1; stride <= 3; ++stride)
        for (int64_t padding = 0; padding <= kernel / 2; ++padding)
          for (int64_t dilation = 1; dilation <= 2; ++dilation)
            for (bool ceil_mode : {false, true}) {
              const int64_t output =
                  pooled_size(input, kernel, padding, stride, dilation, ceil_mode);
              if (output <= 0) continue;
              const PoolAxis axis{input, kernel, stride, padding, dilation, output};
              for (int64_t x = 0; x < input; ++x) {
                int64_t first, last;
                covering_outputs(axis, x, &first, &last);
                EXPECT_GE(first, 0);
                EXPECT_LE(last, output - 1);
                for (int64_t o = 0; o < output; ++o) {
                  bool covers = false;
                  for (int64_t i = 0; i < kernel; ++i)
                    covers |= o * stride - padding + i * dilation == x;
                  if (covers) {
                    EXPECT_TRUE(o >= first && o <= last) << "output " << o;
                  }
                }
              }
            }
}

TEST(SharedPooling, AdaptiveWindowsTileTheInputAndAreFoundFromIt) {
  for (int64_t in = 1; in <= 12; ++in)
    for (int64_t out = 1; out <= 12; ++out) {
      for (int64_t o = 0; o < out; ++o) {
        const AvgWindow window = adaptive_window(o, in, out);
        EXPECT_EQ(window.start, (o * in) / out);
        EXPECT_EQ(window.end, static_cast<int64_t>(std::ceil(double((o + 1) * in) / out)));
        EXPECT_FALSE(window.empty());
      }
      for (int64_t x = 0; x < in; ++x) {
        int64_t first, last;
        adaptive_covering_outputs(x, in, out, &first, &last);
        for (int64_t o = 0; o < out; ++o)
          if (adaptive_window(o, in, out).contains(x)) {
            EXPECT_TRUE(o >= first && o <= last);
          }
      }
    }
}

TEST(SharedPooling, WindowMaxAndAverageFollowPyTorchsRules) {
  // A 4x5 plane with a NaN at (2, 3).
  std::vector<double> plane(20);
  for (int i = 0; i < 20; ++i) plane[i] = static_cast<double>((i * 7) % 11);
  plane[2 * 5 + 3] = std::numeric_limits<double>::quiet_NaN();
  auto read = [&](int64_t h, int64_t w) { return plane[h * 5 + w]; };
  const PoolAxis rows{4, 2, 2, 1, 1, pooled_size(4, 2, 1, 2, 1, false)};
  const PoolAxis cols{5, 3, 2, 1, 1, pooled_size(5, 3, 1, 2, 1, false)};
  ASSERT_EQ(rows.output, 3);
  ASSERT_EQ(cols.output, 3);
  for (int64_t oh = 0; oh < rows.output; ++oh)
    for (int64_t ow = 0; ow < cols.output; ++ow) {
      double best;
      int64_t position;
      window_max(rows, cols, oh, ow, read, &best, &position);
      double expected = -INFINITY, sum = 0;
      int64_t expected_position = -1, inside = 0;
      for (int64_t h = oh * 2 - 1; h < oh * 2 + 1; ++h)
        for (int64_t w = ow * 2 - 1; w < ow * 2 + 2; ++w) {
          if (h < 0 || h >= 4 || w < 0 || w >= 5) continue;
          ++inside;
          sum += read(h, w);
          if (expected_position < 0 || read(h, w) > expected || std::isnan(read(h, w)))
            expected = read(h, w), expected_position = h * 5 + w;
        }
      EXPECT_EQ(position, expected_position);
      EXPECT_EQ(std::isnan(best), std::isnan(expected));
      if (!std::isnan(expected)) {
        EXPECT_EQ(best, expected);
      }
      const AvgWindow wh = avg_window(rows, oh), ww = avg_window(cols, ow);
      const double average = window_average<double>(wh, ww, false, read);
      EXPECT_EQ(std::isnan(average), std::isnan(sum));
      if (!std::isnan(sum)) {
        EXPECT_DOUBLE_EQ(average, sum / static_cast<double>(inside));
        // count_include_pad divides by the window inside input + padding: 2 x 3 here.
        EXPECT_DOUBLE_EQ(window_average<double>(wh, ww, true, read), sum / 6.0);
      }
    }
}

TEST(SharedChannelLayout, ChannelOfADenseElement) {
  const Shape sizes{2, 3, 4, 5};
  const ChannelLayout layout(sizes);
  EXPECT_EQ(layout.spatial, 20);
  EXPECT_EQ(layout.per_channel(), 40);
  for (int64_t i = 0; i < shape_numel(sizes); ++i) EXPECT_EQ(layout.channel_of(i), (i / 20) % 3);
}

// ---- element-wise functors ----

template <typename T>
bool same_bits(T a, T b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

// The run-time-kind functors of the CUDA kernels give the compile-time-kind ones of the CPU
// loops bit for bit.
template <math::Binary kKind, typename T>
void expect_binary_kinds_agree(const std::vector<T>& values, T alpha) {
  const math::BinaryFunctor<T> runtime{kKind, false, alpha};
  const math::BinaryFunctor<T, math::Fixed<kKind>, math::Fixed<false>> fixed{{}, {}, alpha};
  for (T a : values)
    for (T b : values) EXPECT_TRUE(same_bits(runtime(a, b), fixed(a, b))) << a << ", " << b;
}

TEST(SharedElementwise, RunTimeAndCompileTimeKindsAgree) {
  const std::vector<float> floats{-2.5f, -1.0f, -0.0f, 0.0f, 0.5f, 3.0f, INFINITY, NAN};
  expect_binary_kinds_agree<math::Binary::kAdd>(floats, 0.5f);
  expect_binary_kinds_agree<math::Binary::kSub>(floats, 2.0f);
  expect_binary_kinds_agree<math::Binary::kDiv>(floats, 1.0f);
  expect_binary_kinds_agree<math::Binary::kPow>(floats, 1.0f);
  expect_binary_kinds_agree<math::Binary::kMaximum>(floats, 1.0f);
  expect_binary_kinds_agree<math::Binary::kMinimum>(floats, 1.0f);
  const std::vector<int32_t> ints{-7, -1, 0, 2, 9};
  expect_binary_kinds_agree<math::Binary::kMul>(ints, 1);
  expect_binary_kinds_agree<math::Binary::kPow>(ints, 1);
  for (float x : floats) {
    const math::UnaryFunctor<float> runtime{math::Unary::kSigmoid};
    EXPECT_TRUE(
        same_bits(runtime(x), math::UnaryFunctor<float, math::Fixed<math::Unary::kSigmoid>>{}(x)));
    EXPECT_TRUE(same_bits(math::ScalarFunctor<float>{math::ScalarOp::kPow, 2.0, 2.0f}(x), x * x));
  }
  // NaN wins maximum / minimum; alpha scales the second operand.
  EXPECT_TRUE(std::isnan(math::BinaryFunctor<double>{math::Binary::kMaximum}(1.0, NAN)));
  EXPECT_EQ((math::BinaryFunctor<double>{math::Binary::kSub, false, 3.0}(1.0, 2.0)), -5.0);
  EXPECT_EQ((math::BinaryFunctor<bool>{math::Binary::kAdd}(true, false)), true);
  EXPECT_EQ((math::UnaryFunctor<uint8_t>{math::Unary::kAbs}(200)), 200);
  EXPECT_EQ((math::ClampFunctor<int64_t>{-2.5, 3.5}(7)), 3);
}

TEST(SharedElementwise, DevicePowerBySquaringMatchesTheHostPow) {
  // The device computes integer pow by repeated squaring; where the result is an integer
  // below 2^53 it must equal the host's (correctly rounded) pow.
  for (int64_t base = -9; base <= 9; ++base)
    for (int64_t exponent = -3; exponent <= 16; ++exponent) {
      const double expected = std::pow(static_cast<double>(base), static_cast<double>(exponent));
      if (std::abs(expected) >= 9007199254740992.0) continue;
      const double squared =
          math::integer_power_by_squaring(static_cast<double>(base), static_cast<double>(exponent));
      EXPECT_TRUE(same_bits(squared, expected) || (std::isnan(squared) && std::isnan(expected)))
          << base << "^" << exponent << ": " << squared << " vs " << expected;
    }
  EXPECT_EQ(math::integer_power_by_squaring(2.0, 0.5), std::pow(2.0, 0.5));
}

// Integer results outside the type's range (0^-1 and x/0 give inf in double) are clamped, NaN is
// 0: defined on the host, and what CUDA's conversions give on the device.
TEST(SharedElementwise, IntegerResultsOutsideTheRangeSaturate) {
  const math::BinaryFunctor<int32_t> power{math::Binary::kPow};
  EXPECT_EQ(power(0, -1), std::numeric_limits<int32_t>::max());
  EXPECT_EQ(power(-7, -1), 0);  // -1/7 truncated toward zero
  EXPECT_EQ(power(2, 40), std::numeric_limits<int32_t>::max());
  EXPECT_EQ(power(-2, 41), std::numeric_limits<int32_t>::lowest());
  EXPECT_EQ(power(3, 4), 81);
  const math::ScalarFunctor<int64_t> divide{math::ScalarOp::kDiv, 0.0, 0};
  EXPECT_EQ(divide(5), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(divide(-5), std::numeric_limits<int64_t>::lowest());
  EXPECT_EQ(divide(0), 0);  // 0/0 is NaN
  EXPECT_EQ(math::saturating_cast<uint8_t>(-3.0), 0);
  EXPECT_EQ(math::saturating_cast<uint8_t>(300.5), 255);
  EXPECT_EQ(math::saturating_cast<int16_t>(-12.9), -12);
}

}  // namespace
}  // namespace tessel
