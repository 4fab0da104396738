// max_pool2d (values and saved indices), avg_pool2d and adaptive_avg_pool2d: PyTorch's window
// rules (padding, dilation, ceil_mode, count_include_pad), gradients, and bad inputs.
#include "ops/pool.h"

#include <cmath>

#include "core/op.h"
#include "ops/math/pooling.h"
#include "ops/ops.h"
#include "tests/ops/patterns.h"
#include "tests/testing.h"

namespace tessel {
namespace {

using testing::all_close;
using testing::expected;
using testing::gradcheck;
using testing::kF64;
using testing::pattern;
using testing::throws_error;

// The registered op's outputs: values and i64 indices.
std::vector<Tensor> max_pool_with_indices(const Tensor& x, std::vector<int64_t> kernel,
                                          std::vector<int64_t> stride, std::vector<int64_t> padding,
                                          std::vector<int64_t> dilation, bool ceil_mode) {
  return dispatch(ops::max_pool2d, {x},
                  Attrs{{"kernel_size", kernel},
                        {"stride", stride},
                        {"padding", padding},
                        {"dilation", dilation},
                        {"ceil_mode", ceil_mode}});
}

TEST(MaxPool2d, ValuesAndIndicesMatchPyTorch) {
  // F.max_pool2d(pat((1,2,5,5), 3), 3, 2, 1, return_indices=True)
  auto outputs =
      max_pool_with_indices(pattern({1, 2, 5, 5}, 3), {3, 3}, {2, 2}, {1, 1}, {1, 1}, false);
  EXPECT_TRUE(
      all_close(outputs[0], expected({-0.25, 0.5, 0.875, 1, 0.25, 0.625, 0.875, 0.875, 0.125, 0.625,
                                      1, -0.375, 0.375, 0.875, 1, -0.125, 0.625, 1},
                                     {1, 2, 3, 3})));
  EXPECT_EQ(outputs[1].dtype(), DType::kInt64);
  EXPECT_EQ(outputs[1].to_vector<int64_t>(),
            (std::vector<int64_t>{1, 3, 4, 10, 8, 9, 21, 21, 19, 1, 2, 4, 6, 13, 19, 16, 18, 19}));
  // The public function returns the values alone.
  EXPECT_TRUE(all_close(max_pool2d(pattern({1, 2, 5, 5}, 3), {3, 3}, {2, 2}, {1, 1}), outputs[0]));
}

TEST(MaxPool2d, CeilModeAddsAPartialWindowLikePyTorch) {
  // F.max_pool2d(pat((1,1,5,5), 1), 2, 2, 0, ceil_mode=True, return_indices=True)
  auto outputs =
      max_pool_with_indices(pattern({1, 1, 5, 5}, 1), {2, 2}, {2, 2}, {0, 0}, {1, 1}, true);
  EXPECT_TRUE(all_close(
      outputs[0], expected({1, 0.25, 0.625, 0.875, -0.25, 0.125, 0.625, 1, -0.375}, {1, 1, 3, 3})));
  EXPECT_EQ(outputs[1].to_vector<int64_t>(),
            (std::vector<int64_t>{5, 3, 4, 16, 13, 14, 21, 22, 24}));
  // Stride defaults to the kernel size; without ceil_mode the partial window is dropped.
  EXPECT_EQ(max_pool2d(pattern({1, 1, 5, 5}), {2, 2}).sizes(), (Shape{1, 1, 2, 2}));
}

TEST(MaxPool2d, DilationMatchesPyTorch) {
  // F.max_pool2d(pat((1,1,7,7), 2), 3, 1, 1, dilation=2)
  Tensor out = max_pool2d(pattern({1, 1, 7, 7}, 2), {3, 3}, {1, 1}, {1, 1}, {2, 2});
  EXPECT_TRUE(all_close(out, expected({0.875, 0.75,  0.875, 0.875, 0.875, 0.625, 1,     1, 1,
                                       1,     0.875, 0.75,  0.875, 0.875, 0.875, 0.625, 1, 1,
                                       1,     1,     0.75,  0.75,  0.75,  0.875, 0.75},
                                      {1, 1, 5, 5})));
}

TEST(MaxPool2d, AcceptsAThreeDimensionalInputAndNonContiguousViews) {
  Tensor x = randn({3, 6, 7});
  Tensor batched = max_pool2d(unsqueeze(x, 0), {3, 2}, {2, 1}, {1, 1});
  Tensor unbatched = max_pool2d(x, {3, 2}, {2, 1}, {1, 1});
  EXPECT_EQ(unbatched.sizes(), (Shape{3, 3, 8}));
  EXPECT_TRUE(all_close(unbatched, squeeze(batched, 0)));
  Tensor transposed = transpose(randn({2, 3, 7, 6}), 2, 3);
  EXPECT_TRUE(all_close(max_pool2d(transposed, {3, 3}, {2, 2}, {1, 1}),
                        max_pool2d(contiguous(transposed), {3, 3}, {2, 2}, {1, 1})));
}

TEST(MaxPool2d, PropagatesNaNLikePyTorch) {
  Tensor x = from_vector<double>({1, std::nan(""), 3, 4}, {1, 1, 2, 2});
  EXPECT_TRUE(std::isnan(max_pool2d(x, {2, 2}).item<double>()));
}

// Every window's value and index are those of window_max (ops/math/pooling.h, what the CUDA
// kernel runs), the window-by-window rule: the first maximum of ties, the last NaN, -inf counted
// as a value, -1 for a window wholly in the padding. Dense and strided rows, padding, dilation
// and ceil_mode's partial windows.
TEST(MaxPool2d, MatchesTheWindowByWindowRule) {
  // pattern() repeats every 17 values: 3x3 windows hold ties.
  std::vector<double> values = pattern({2, 3, 9, 8}).to_vector<double>();
  for (size_t i : {5, 6, 40, 77, 200, 201, 333}) values[i] = std::nan("");
  for (size_t i : {0, 1, 8, 9, 100, 250}) values[i] = -INFINITY;
  struct Case {
    Shape kernel, stride, padding, dilation;
    bool ceil_mode;
  };
  const std::vector<Case> cases = {
      {{2, 2}, {2, 2}, {0, 0}, {1, 1}, false}, {{3, 3}, {2, 2}, {1, 1}, {1, 1}, false},
      {{3, 3}, {1, 1}, {1, 1}, {1, 1}, false}, {{2, 3}, {1, 2}, {1, 0}, {1, 1}, false},
      {{3, 1}, {3, 1}, {0, 0}, {1, 1}, false}, {{3, 3}, {2, 2}, {1, 1}, {2, 1}, true},
      {{2, 2}, {3, 3}, {1, 1}, {1, 1}, true}};
  for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
    Tensor x = from_vector<double>(values, {2, 3, 9, 8}, dtype);
    // The same values, with the plane's rows strided (a transposed copy, transposed back).
    Tensor strided = transpose(contiguous(transpose(x, 2, 3)), 2, 3);
    ASSERT_NE(strided.stride(3), 1);
    for (const Case& c : cases) {
      SCOPED_TRACE("kernel " + shape_str(c.kernel) + " stride " + shape_str(c.stride) +
                   " padding " + shape_str(c.padding) + " dilation " + shape_str(c.dilation));
      const std::vector<Tensor> dense =
          max_pool_with_indices(x, c.kernel, c.stride, c.padding, c.dilation, c.ceil_mode);
      const std::vector<Tensor> from_strided =
          max_pool_with_indices(strided, c.kernel, c.stride, c.padding, c.dilation, c.ceil_mode);
      const int64_t out_h = dense[0].size(2), out_w = dense[0].size(3);
      PoolAxis axes[2];
      for (int d = 0; d < 2; ++d)
        axes[d] = {x.size(2 + d), c.kernel[d],   c.stride[d],
                   c.padding[d],  c.dilation[d], d == 0 ? out_h : out_w};
      std::vector<double> want_values;
      std::vector<int64_t> want_indices;
      for (int64_t plane = 0; plane < 6; ++plane) {
        for (int64_t oh = 0; oh < out_h; ++oh) {
          for (int64_t ow = 0; ow < out_w; ++ow) {
            double best;
            int64_t at;
            window_max(
                axes[0], axes[1], oh, ow,
                [&](int64_t h, int64_t w) { return values[(plane * 9 + h) * 8 + w]; }, &best, &at);
            // f32 holds these values exactly (pattern's are small fractions of 17ths in f64,
            // compared after the same rounding).
            want_values.push_back(dtype == DType::kFloat32 ? static_cast<float>(best) : best);
            want_indices.push_back(at);
          }
        }
      }
      for (const std::vector<Tensor>& got : {dense, from_strided}) {
        EXPECT_EQ(got[1].to_vector<int64_t>(), want_indices);
        const std::vector<double> got_values = got[0].to_vector<double>();
        ASSERT_EQ(got_values.size(), want_values.size());
        for (size_t i = 0; i < got_values.size(); ++i)
          EXPECT_TRUE(got_values[i] == want_values[i] ||
                      (std::isnan(got_values[i]) && std::isnan(want_values[i])))
              << i;
      }
    }
  }
}

// A plane large enough to go by blocks of output rows (300 x 300 windows of 9 taps), with ceil_mode
// adding a last partial row and column: the same values and positions as window_max.
TEST(MaxPool2d, LargePlanesGoByBlocksWithTheSameResults) {
  std::vector<double> values = randn({1, 1, 599, 600}, kF64).to_vector<double>();
  for (size_t i : {0, 7, 1200, 90000, 359399}) values[i] = std::nan("");
  const Tensor x = from_vector<double>(values, {1, 1, 599, 600});
  const std::vector<Tensor> got = max_pool_with_indices(x, {3, 3}, {2, 2}, {1, 1}, {1, 1}, true);
  const int64_t out_h = got[0].size(2), out_w = got[0].size(3);
  ASSERT_EQ(out_h, 300);
  ASSERT_EQ(out_w, 301);
  const PoolAxis rows{599, 3, 2, 1, 1, out_h}, cols{600, 3, 2, 1, 1, out_w};
  const std::vector<double> got_values = got[0].to_vector<double>();
  const std::vector<int64_t> got_indices = got[1].to_vector<int64_t>();
  int64_t mismatches = 0;
  for (int64_t oh = 0; oh < out_h; ++oh) {
    for (int64_t ow = 0; ow < out_w; ++ow) {
      double best;
      int64_t at;
      window_max(
          rows, cols, oh, ow, [&](int64_t h, int64_t w) { return values[h * 600 + w]; }, &best,
          &at);
      const size_t k = static_cast<size_t>(oh * out_w + ow);
      const bool same_value =
          got_values[k] == best || (std::isnan(got_values[k]) && std::isnan(best));
      if (!same_value || got_indices[k] != at) ++mismatches;
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(MaxPool2d, GradientsMatchFiniteDifferences) {
  // Random values have no ties, so the maxima do not move under the small perturbations.
  struct Case {
    std::vector<int64_t> kernel, stride, padding, dilation;
    bool ceil_mode;
  };
  std::vector<Case> cases = {{{2, 2}, {2, 2}, {0, 0}, {1, 1}, false},
                             {{3, 3}, {2, 2}, {1, 1}, {1, 1}, false},
                             {{3, 2}, {2, 2}, {1, 0}, {1, 1}, true},
                             {{2, 3}, {1, 2}, {0, 1}, {2, 1}, false},
                             {{3, 3}, {3, 3}, {1, 1}, {1, 1}, true}};
  for (const auto& c : cases) {
    Tensor x = transpose(randn({2, 2, 7, 6}, kF64), 2, 3).set_requires_grad(true);
    EXPECT_TRUE(gradcheck(
        [c](const std::vector<Tensor>& in) {
          return max_pool2d(in[0], c.kernel, c.stride, c.padding, c.dilation, c.ceil_mode);
        },
        {x}))
        << "kernel " << shape_str(c.kernel) << " ceil " << c.ceil_mode;
  }
}

TEST(MaxPool2d, BackwardRoutesGradientToTheMaxima) {
  Tensor x = from_vector<double>({1, 5, 2, 0, 3, 4, 9, 8, 7}, {1, 1, 3, 3}).set_requires_grad(true);
  Tensor y = max_pool2d(x, {2, 2}, {1, 1});  // maxima 5 (twice), 9, 8
  y.backward(ones_like(y));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{0, 2, 0, 0, 0, 0, 1, 1, 0}));
}

TEST(MaxPool2d, BadInputsAreNamed) {
  EXPECT_TRUE(throws_error(
      [] {
        max_pool2d(zeros({1, 1, 4, 4}), {3, 3}, {1, 1}, {2, 2});
      },
      "padding must be between 0 and half the kernel size"));
  EXPECT_TRUE(throws_error(
      [] {
        max_pool2d(zeros({1, 1, 2, 2}), {3, 3});
      },
      "input shape [1, 1, 2, 2] is too small for kernel_size [3, 3]"));
  EXPECT_TRUE(throws_error(
      [] {
        max_pool2d(zeros({4, 4}), {2, 2});
      },
      "expected a 3-D (C, H, W) or 4-D (N, C, H, W) input, got shape [4, 4]"));
  EXPECT_TRUE(throws_error(
      [] {
        max_pool2d(zeros({1, 1, 4, 4}, DType::kInt64), {2, 2});
      },
      "max_pool2d: expected a f32 or f64 input, got i64"));
  EXPECT_TRUE(throws_error(
      [] {
        max_pool2d(zeros({1, 1, 4, 4}), {2, 2}, {0, 1});
      },
      "stride must be positive"));
}

TEST(AvgPool2d, PaddingWithAndWithoutCountIncludePadMatchPyTorch) {
  // F.avg_pool2d(pat((1,1,5,5), 6), 3, 2, 1, count_include_pad=True / False)
  Tensor x = pattern({1, 1, 5, 5}, 6);
  EXPECT_TRUE(all_close(avg_pool2d(x, {3, 3}, {2, 2}, {1, 1}, false, true),
                        expected({-0.08333333333, 0.25, 0.1805555556, -0.375, 0, 0.375,
                                  -0.1805555556, -0.25, 0.08333333333},
                                 {1, 1, 3, 3}),
                        1e-9, 1e-9));
  EXPECT_TRUE(
      all_close(avg_pool2d(x, {3, 3}, {2, 2}, {1, 1}, false, false),
                expected({-0.1875, 0.375, 0.40625, -0.5625, 0, 0.5625, -0.40625, -0.375, 0.1875},
                         {1, 1, 3, 3})));
}

TEST(AvgPool2d, CeilModeWindowsMatchPyTorch) {
  // F.avg_pool2d(pat((1,1,5,5), 6), 2, 2, 1, ceil_mode=True, count_include_pad=True / False)
  Tensor x = pattern({1, 1, 5, 5}, 6);
  EXPECT_TRUE(
      all_close(avg_pool2d(x, {2, 2}, {2, 2}, {1, 1}, true, true),
                expected({-0.0625, 0.15625, 0, -0.3125, -0.0625, 0.6875, -0.03125, -0.5625, 0.1875},
                         {1, 1, 3, 3})));
  EXPECT_TRUE(
      all_close(avg_pool2d(x, {2, 2}, {2, 2}, {1, 1}, true, false),
                expected({-0.25, 0.3125, 0, -0.625, -0.0625, 0.6875, -0.0625, -0.5625, 0.1875},
                         {1, 1, 3, 3})));
  // F.avg_pool2d(pat((1,1,6,6), 2), 3, 2, 0, ceil_mode=True): the last window is cut by the edge.
  EXPECT_TRUE(all_close(
      avg_pool2d(pattern({1, 1, 6, 6}, 2), {3, 3}, {2, 2}, {0, 0}, true),
      expected({-0.25, 0.5, 0, 0, 0.2777777778, -0.4583333333, 0.1875, 0.2291666667, -0.625},
               {1, 1, 3, 3}),
      1e-9, 1e-9));
}

TEST(AvgPool2d, GradientsMatchFiniteDifferences) {
  struct Case {
    std::vector<int64_t> kernel, stride, padding;
    bool ceil_mode, count_include_pad;
  };
  std::vector<Case> cases = {{{2, 2}, {2, 2}, {0, 0}, false, true},
                             {{3, 3}, {2, 2}, {1, 1}, false, true},
                             {{3, 3}, {2, 2}, {1, 1}, false, false},
                             {{2, 3}, {2, 2}, {1, 1}, true, true},
                             {{3, 2}, {2, 1}, {1, 0}, true, false}};
  for (const auto& c : cases) {
    Tensor x = transpose(randn({2, 2, 6, 7}, kF64), 2, 3).set_requires_grad(true);
    EXPECT_TRUE(gradcheck(
        [c](const std::vector<Tensor>& in) {
          return avg_pool2d(in[0], c.kernel, c.stride, c.padding, c.ceil_mode, c.count_include_pad);
        },
        {x}))
        << "kernel " << shape_str(c.kernel) << " ceil " << c.ceil_mode;
  }
}

TEST(AvgPool2d, BadInputsAreNamed) {
  EXPECT_TRUE(throws_error(
      [] {
        avg_pool2d(zeros({1, 1, 4, 4}), {2, 2}, {2, 2}, {2, 2});
      },
      "avg_pool2d: padding must be between 0 and half the kernel size"));
  EXPECT_TRUE(throws_error(
      [] {
        avg_pool2d(zeros({1, 1, 4, 4}, DType::kInt32), {2, 2});
      },
      "got i32"));
  EXPECT_TRUE(throws_error([] { avg_pool2d(zeros({1, 1, 1, 4}), {2, 2}); }, "is too small"));
}

TEST(AdaptiveAvgPool2d, UnevenWindowsMatchPyTorch) {
  // F.adaptive_avg_pool2d(pat((1,1,5,7), 4), (3, 4))
  EXPECT_TRUE(all_close(
      adaptive_avg_pool2d(pattern({1, 1, 5, 7}, 4), {3, 4}),
      expected({-0.0625, 0.1458333333, -0.1666666667, -0.3125, 0.3333333333, -0.1666666667, -0.125,
                0.08333333333, -0.15625, -0.125, 0.2708333333, -0.40625},
               {1, 1, 3, 4}),
      1e-9, 1e-9));
}

TEST(AdaptiveAvgPool2d, OneByOneIsTheGlobalMean) {
  Tensor x = randn({2, 3, 5, 4}, kF64);
  Tensor pooled = adaptive_avg_pool2d(x, {1, 1});
  EXPECT_TRUE(all_close(pooled, mean(x, {2, 3}, true), 1e-12, 1e-12));
  EXPECT_EQ(adaptive_avg_pool2d(randn({3, 6, 6}), {2}).sizes(), (Shape{3, 2, 2}));
}

TEST(AdaptiveAvgPool2d, GradientsMatchFiniteDifferences) {
  Tensor x = transpose(randn({2, 2, 7, 5}, kF64), 2, 3).set_requires_grad(true);
  for (std::vector<int64_t> size : {std::vector<int64_t>{3, 4}, {1, 1}, {5, 7}, {2, 3}}) {
    EXPECT_TRUE(gradcheck(
        [size](const std::vector<Tensor>& in) { return adaptive_avg_pool2d(in[0], size); }, {x}))
        << shape_str(size);
  }
}

TEST(AdaptiveAvgPool2d, BadInputsAreNamed) {
  EXPECT_TRUE(throws_error(
      [] {
        adaptive_avg_pool2d(zeros({1, 1, 4, 4}), {0, 2});
      },
      "output_size must be positive"));
  EXPECT_TRUE(throws_error([] { adaptive_avg_pool2d(zeros({4}), {2, 2}); }, "got shape [4]"));
  EXPECT_TRUE(throws_error(
      [] {
        adaptive_avg_pool2d(zeros({1, 1, 4, 4}, DType::kBool), {2, 2});
      },
      "got bool"));
}

TEST(Pooling, OpsAreBatchSplittable) {
  for (const char* name : {"max_pool2d", "avg_pool2d", "adaptive_avg_pool2d"}) {
    const OpDef& op = OpRegistry::get().find(name);
    ASSERT_EQ(op.splits.size(), 1u) << name;
    EXPECT_EQ(op.splits[0].output_dim, 0) << name;
    EXPECT_EQ(op.splits[0].input_dims, (std::vector<int>{0})) << name;
  }
}

}  // namespace
}  // namespace tessel
