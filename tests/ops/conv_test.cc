// conv2d: values against PyTorch and against a direct seven-loop convolution, every path
// (im2col + GEMM, 1x1, depthwise, grouped) forward and backward, and bad inputs.
#include "ops/conv.h"

#include <functional>

#include "core/op.h"
#include "core/threading.h"
#include "ops/cpu/gemm.h"
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

struct ConvArgs {
  std::vector<int64_t> stride{1, 1}, padding{0, 0}, dilation{1, 1};
  int64_t groups = 1;
};

// The definition of a convolution, looped directly in double.
Tensor reference_conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const ConvArgs& a) {
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), wd = x.size(3);
  const int64_t o = w.size(0), cg = w.size(1), kh = w.size(2), kw = w.size(3);
  const int64_t og = o / a.groups;
  const int64_t oh = (h + 2 * a.padding[0] - a.dilation[0] * (kh - 1) - 1) / a.stride[0] + 1;
  const int64_t ow = (wd + 2 * a.padding[1] - a.dilation[1] * (kw - 1) - 1) / a.stride[1] + 1;
  auto xv = x.to_vector<double>();
  auto wv = w.to_vector<double>();
  std::vector<double> bv = bias.defined() ? bias.to_vector<double>() : std::vector<double>(o, 0.0);
  std::vector<double> out(static_cast<size_t>(n * o * oh * ow));
  for (int64_t b = 0; b < n; ++b)
    for (int64_t oc = 0; oc < o; ++oc)
      for (int64_t y = 0; y < oh; ++y)
        for (int64_t z = 0; z < ow; ++z) {
          double total = bv[oc];
          for (int64_t ic = 0; ic < cg; ++ic)
            for (int64_t i = 0; i < kh; ++i)
              for (int64_t j = 0; j < kw; ++j) {
                int64_t iy = y * a.stride[0] - a.padding[0] + i * a.dilation[0];
                int64_t iz = z * a.stride[1] - a.padding[1] + j * a.dilation[1];
                if (iy < 0 || iy >= h || iz < 0 || iz >= wd) continue;
                int64_t channel = (oc / og) * cg + ic;
                total += wv[((oc * cg + ic) * kh + i) * kw + j] *
                         xv[((b * c + channel) * h + iy) * wd + iz];
              }
          out[((b * o + oc) * oh + y) * ow + z] = total;
        }
  return from_vector<double>(out, {n, o, oh, ow});
}

Tensor run_conv(const Tensor& x, const Tensor& w, const Tensor& bias, const ConvArgs& a) {
  return conv2d(x, w, bias, a.stride, a.padding, a.dilation, a.groups);
}

TEST(Conv2d, PaddedConvolutionMatchesPyTorch) {
  // F.conv2d(pat((1,2,4,4)), pat((3,2,3,3), 1), pat((3,), 2), padding=1)
  Tensor out =
      conv2d(pattern({1, 2, 4, 4}), pattern({3, 2, 3, 3}, 1), pattern({3}, 2), {1, 1}, {1, 1});
  EXPECT_TRUE(all_close(
      out,
      expected({-2.828125, -2.90625, 1.265625,  0.234375, 2.328125, -0.25,    -2.96875,  -2.046875,
                0.578125,  0.03125,  1.828125,  0.078125, -2.15625, -2.28125, -1.046875, -0.765625,
                -1.34375,  -3.34375, -1.46875,  1.578125, 0.171875, 4.234375, -0.734375, -2.421875,
                -1.734375, 0.03125,  -0.421875, 2.734375, -0.4375,  -1.96875, -1.4375,   -0.78125,
                1.203125,  -2.1875,  -2.609375, -1.0625,  -0.65625, 2.078125, 3.890625,  -0.140625,
                -0.859375, -2.09375, -0.28125,  0.34375,  1.015625, -0.0625,  -0.234375, -0.796875},
               {1, 3, 4, 4})));
}

TEST(Conv2d, StrideAndDilationMatchPyTorch) {
  // F.conv2d(pat((1,2,6,6)), pat((2,2,3,3), 3), stride=2, padding=1, dilation=2)
  Tensor out =
      conv2d(pattern({1, 2, 6, 6}), pattern({2, 2, 3, 3}, 3), Tensor(), {2, 2}, {1, 1}, {2, 2});
  EXPECT_TRUE(all_close(
      out, expected({-0.078125, 0.03125, -1.5, 3.515625, 1.3125, -1.375, -0.84375, -0.9375},
                    {1, 2, 2, 2})));
}

TEST(Conv2d, GroupsSplitChannelsLikePyTorch) {
  // F.conv2d(pat((1,4,4,4)), pat((4,2,2,2), 5), groups=2)
  Tensor out =
      conv2d(pattern({1, 4, 4, 4}), pattern({4, 2, 2, 2}, 5), Tensor(), {1, 1}, {0, 0}, {1, 1}, 2);
  EXPECT_TRUE(all_close(
      out,
      expected({1.125,    1.28125,  -0.15625,  -0.375,    -0.75,    1,         -0.28125, -0.125,
                -0.5,     -1.6875,  0.296875,  0.6875,    0.671875, -0.53125,  -1.46875, 0.90625,
                0.234375, 0.890625, -0.4375,   -0.34375,  2.671875, -0.59375,  0.03125,  -0.671875,
                2.4375,   -0.65625, -0.828125, -0.265625, -1,       -0.671875, -0.28125, -0.484375,
                -0.15625, -0.5625,  2.6875,    -0.171875},
               {1, 4, 3, 3})));
}

TEST(Conv2d, DepthwiseWithMultiplierMatchesPyTorch) {
  // F.conv2d(pat((1,3,4,4)), pat((6,1,3,3), 7), pat((6,), 1), stride=2, padding=1, groups=3)
  Tensor out = conv2d(pattern({1, 3, 4, 4}), pattern({6, 1, 3, 3}, 7), pattern({6}, 1), {2, 2},
                      {1, 1}, {1, 1}, 3);
  EXPECT_TRUE(all_close(
      out,
      expected({0.953125, -2.0625,  -0.765625, -1.828125, -1.90625, -0.859375, -0.453125, 0.796875,
                -0.8125,  2.578125, 2.140625,  -0.890625, 1.890625, -1.15625,  -0.359375, -0.359375,
                1.078125, -0.84375, -1.15625,  2.5625,    0.3125,   3.5,       2.828125,  0.46875},
               {1, 6, 2, 2})));
}

TEST(Conv2d, BackwardMatchesPyTorch) {
  // xx = pat((1,2,4,4)), ww = pat((2,2,3,3), 2), bb = pat((2,), 4);
  // y = F.conv2d(xx, ww, bb, stride=2, padding=1); y.backward(pat(y.shape, 8))
  Tensor x = pattern({1, 2, 4, 4}).set_requires_grad(true);
  Tensor w = pattern({2, 2, 3, 3}, 2).set_requires_grad(true);
  Tensor b = pattern({2}, 4).set_requires_grad(true);
  Tensor y = conv2d(x, w, b, {2, 2}, {1, 1});
  EXPECT_TRUE(all_close(
      y, expected({-1.234375, 0.921875, 0.375, 0.140625, 1.046875, -1.015625, -1.140625, -1.3125},
                  {1, 2, 2, 2})));
  y.backward(pattern({1, 2, 2, 2}, 8));
  EXPECT_TRUE(all_close(
      x.grad(),
      expected({0.625,    0.34375,   0.53125,   -0.21875, -0.359375, 0.125,     0.25,   0.109375,
                0.4375,   -0.828125, -1.25,     0.6875,   -0.171875, 0.65625,   0.3125, 0.125,
                -0.15625, -0.546875, -0.109375, -0.0625,  1.015625,  -0.5625,   -0.75,  0.4375,
                -0.0625,  0.703125,  0.25,      0.0625,   0.65625,   -0.734375, -1.375, 0.5625},
               {1, 2, 4, 4})));
  EXPECT_TRUE(
      all_close(w.grad(), expected({-0.875,   1.25,      1.15625,   -0.484375, -0.8125,   -0.765625,
                                    0.703125, -0.890625, -0.84375,  -0.5,      -0.78125,  1.25,
                                    -0.25,    -0.859375, -0.8125,   0.9375,    1.453125,  -0.890625,
                                    0.4375,   -0.375,    -0.140625, 0.28125,   0.984375,  0.890625,
                                    -0.40625, -0.1875,   -0.28125,  0.25,      0.453125,  -0.375,
                                    0.1875,   -0.25,     0.984375,  -0.5,      -0.359375, -0.1875},
                                   {2, 2, 3, 3})));
  EXPECT_TRUE(all_close(b.grad(), expected({0.125, -0.25}, {2})));
}

// Every kernel path on shapes big enough for several images per thread, in f32, against the
// direct loop.
TEST(Conv2d, EveryPathMatchesTheDirectDefinition) {
  struct Case {
    Shape x, w;
    ConvArgs args;
    bool bias;
  };
  std::vector<Case> cases = {
      {{5, 6, 9, 8}, {7, 6, 3, 3}, {{1, 1}, {1, 1}, {1, 1}, 1}, true},  // im2col + GEMM
      {{3, 4, 11, 10}, {6, 4, 3, 2}, {{2, 3}, {1, 0}, {2, 1}, 1}, false},
      {{4, 6, 7, 7}, {9, 2, 3, 3}, {{1, 1}, {1, 1}, {1, 1}, 3}, true},  // grouped
      {{3, 8, 6, 6}, {5, 8, 1, 1}, {{1, 1}, {0, 0}, {1, 1}, 1}, true},  // 1x1: no columns
      {{3, 8, 6, 6}, {5, 8, 1, 1}, {{2, 2}, {0, 0}, {1, 1}, 1}, false},
      {{4, 5, 9, 9}, {10, 1, 3, 3}, {{1, 1}, {1, 1}, {1, 1}, 5}, true},  // depthwise
      {{2, 4, 10, 9}, {4, 1, 5, 3}, {{2, 1}, {2, 1}, {1, 2}, 4}, false},
      {{1, 3, 8, 8}, {4, 3, 3, 3}, {{1, 1}, {1, 1}, {1, 1}, 1}, true},  // batch of one
      // Taps that only read padding: the kernel is cut to the live ones.
      {{3, 4, 1, 1}, {5, 4, 3, 3}, {{1, 1}, {1, 1}, {1, 1}, 1}, true},   // the centre alone
      {{3, 4, 2, 2}, {5, 4, 3, 3}, {{2, 2}, {1, 1}, {1, 1}, 1}, false},  // the last 2x2
      {{2, 6, 1, 5}, {4, 3, 3, 3}, {{1, 1}, {1, 1}, {1, 1}, 2}, true},   // rows only, grouped
  };
  for (const auto& c : cases) {
    Tensor x = randn(c.x);
    Tensor w = randn(c.w);
    Tensor b = c.bias ? randn({c.w[0]}) : Tensor();
    Tensor out = run_conv(x, w, b, c.args);
    EXPECT_TRUE(all_close(out, reference_conv2d(x, w, b, c.args), 1e-5, 1e-5))
        << "x " << shape_str(c.x) << " w " << shape_str(c.w);
  }
}

// Strided convolutions with output rows of 8 or more take each input row apart into its
// stride's phases for im2col (and put them back together for col2im): forward against the direct
// loop, and both gradients against the direct loop by linearity: dL/dw[j] = sum(upstream *
// conv(x, e_j)), dL/dx[j] = sum(upstream * conv(e_j, w)).
TEST(Conv2d, StridedColumnsMatchTheDirectDefinition) {
  struct Case {
    Shape x, w;
    ConvArgs args;
  };
  const std::vector<Case> cases = {
      {{2, 3, 17, 19}, {4, 3, 3, 3}, {{2, 2}, {1, 1}, {1, 1}, 1}},  // odd width, stride 2
      {{2, 2, 12, 20}, {3, 2, 3, 3}, {{2, 2}, {0, 0}, {1, 1}, 1}},  // no padding, even width
      {{1, 2, 9, 29}, {3, 2, 3, 3}, {{1, 3}, {2, 2}, {1, 2}, 1}},   // stride 3, dilated
  };
  for (const auto& c : cases) {
    Tensor x = randn(c.x).set_requires_grad(true);
    Tensor w = randn(c.w).set_requires_grad(true);
    Tensor y = run_conv(x, w, Tensor(), c.args);
    EXPECT_TRUE(
        all_close(y, reference_conv2d(x.detach(), w.detach(), Tensor(), c.args), 1e-5, 1e-5))
        << "x " << shape_str(c.x);
    Tensor upstream = randn(y.sizes());
    y.backward(upstream);
    const Tensor upstream64 = upstream.to(kF64);
    std::vector<double> expected_grad(static_cast<size_t>(w.numel()));
    for (size_t j = 0; j < expected_grad.size(); ++j) {
      std::vector<float> unit(expected_grad.size(), 0.0f);
      unit[j] = 1.0f;
      Tensor basis = from_vector<float>(unit, c.w);
      expected_grad[j] = sum(mul(upstream64, reference_conv2d(x.detach(), basis, Tensor(), c.args)))
                             .item<double>();
    }
    EXPECT_TRUE(all_close(w.grad(), from_vector<double>(expected_grad, c.w), 1e-4, 1e-4))
        << "x " << shape_str(c.x);
    std::vector<double> expected_input_grad(static_cast<size_t>(x.numel()));
    for (size_t j = 0; j < expected_input_grad.size(); ++j) {
      std::vector<float> unit(expected_input_grad.size(), 0.0f);
      unit[j] = 1.0f;
      Tensor basis = from_vector<float>(unit, c.x);
      expected_input_grad[j] =
          sum(mul(upstream64, reference_conv2d(basis, w.detach(), Tensor(), c.args)))
              .item<double>();
    }
    EXPECT_TRUE(all_close(x.grad(), from_vector<double>(expected_input_grad, c.x), 1e-4, 1e-4))
        << "x " << shape_str(c.x);
  }
}

// Stride-1 3x3 convolutions over 32 or more channels in f32 run as Winograd F(2x2, 3x3) (the
// weight gradient as F(3x3, 2x2)), over 128 and more as F(4x4, 3x3), on planes of 16 2x2 tiles
// and more, im2col below: forward against the direct loop, input and weight gradients against the
// f64 (im2col) ones, on odd and even planes either side of the bound and of whole 4x4 tiles,
// every padding it takes, a strided (transposed) input and a channel slice.
// Small planes share a GEMM between images (im2col); a few images of a batch, as a memory
// policy runs them, make a narrower one, whose outputs and input gradients keep the whole batch's
// bits (the same passes over the input channels). Eigen's portable AVX2 build of the GEMM
// still rounds some columns of a narrower product differently: there, close.
TEST(Conv2d, AFewImagesOfABatchKeepTheWholeBatchsBits) {
  manual_seed(31);
  Tensor x = randn({64, 256, 4, 4}).set_requires_grad(true), w = randn({256, 256, 3, 3});
  const ConvArgs same{{1, 1}, {1, 1}, {1, 1}, 1};
  Tensor upstream = randn({64, 256, 4, 4});
  Tensor whole = run_conv(x, w, Tensor(), same);
  whole.backward(upstream);
  Tensor part = slice(x.detach(), 0, 0, 4).clone().set_requires_grad(true);
  Tensor few = run_conv(part, w, Tensor(), same);
  few.backward(slice(upstream, 0, 0, 4).clone());
  if (cpu::avx512_kernels()) {
    EXPECT_TRUE(testing::bitwise_equal(slice(whole.detach(), 0, 0, 4), few.detach()));
    EXPECT_TRUE(testing::bitwise_equal(slice(x.grad(), 0, 0, 4), part.grad()));
  } else {
    EXPECT_TRUE(all_close(slice(whole.detach(), 0, 0, 4), few.detach(), 1e-6, 1e-5));
    EXPECT_TRUE(all_close(slice(x.grad(), 0, 0, 4), part.grad(), 1e-6, 1e-5));
  }
}

TEST(Conv2d, WinogradPathMatchesTheDirectDefinitionAndTheF64Gradient) {
  struct Case {
    Shape x;
    int64_t out_channels, padding;
    bool bias, transposed;
  };
  const std::vector<Case> cases = {
      {{3, 32, 8, 8}, 32, 1, true, false},
      {{2, 40, 7, 9}, 36, 1, false, false},
      {{2, 32, 5, 6}, 48, 0, true, false},
      {{1, 33, 4, 4}, 32, 2, false, false},
      {{2, 32, 2, 3}, 32, 1, true, false},
      {{2, 32, 9, 7}, 32, 1, true, true},
      // Paddings 0 and 2 on planes of 16 tiles and more.
      {{2, 32, 10, 11}, 48, 0, true, false},
      {{1, 33, 12, 12}, 32, 2, false, false},
      // F(4x4, 3x3): planes that end inside a tile either way, paddings 0 and 2, a transposed
      // input.
      {{2, 128, 7, 9}, 128, 1, true, false},
      {{2, 128, 10, 11}, 136, 0, false, false},
      {{1, 130, 12, 12}, 128, 2, true, false},
      {{2, 128, 9, 7}, 128, 1, false, true},
      // More than 128 input channels (the AVX-512 products' passes over the channels), output
      // channels not a multiple of 8 (a partial block of rows), either way round.
      {{1, 160, 8, 8}, 150, 1, true, false},
      {{1, 150, 8, 8}, 160, 1, false, false},
      // ResNet-18's last stage on 16x16 images: 2x2 planes, 512 channels, 3x3 padding 1.
      {{3, 512, 2, 2}, 512, 1, false, false},
      {{5, 256, 4, 4}, 256, 1, false, false},
  };
  for (const auto& c : cases) {
    Tensor x = c.transposed ? transpose(randn({c.x[0], c.x[1], c.x[3], c.x[2]}), 2, 3) : randn(c.x);
    Tensor w = randn({c.out_channels, c.x[1], 3, 3});
    Tensor b = c.bias ? randn({c.out_channels}) : Tensor();
    const ConvArgs args{{1, 1}, {c.padding, c.padding}, {1, 1}, 1};
    x.set_requires_grad(true);
    w.set_requires_grad(true);
    Tensor y = run_conv(x, w, b, args);
    EXPECT_TRUE(all_close(y, reference_conv2d(x, w, b, args), 1e-4, 1e-4))
        << "x " << shape_str(c.x) << " padding " << c.padding;
    Tensor upstream = randn(y.sizes());
    y.backward(upstream);
    Tensor x64 = x.detach().to(DType::kFloat64).set_requires_grad(true);
    Tensor w64 = w.detach().to(DType::kFloat64).set_requires_grad(true);
    Tensor y64 = run_conv(x64, w64, Tensor(), args);
    y64.backward(upstream.to(DType::kFloat64));
    EXPECT_TRUE(all_close(x.grad(), x64.grad(), 1e-4, 1e-4))
        << "x " << shape_str(c.x) << " padding " << c.padding;
    EXPECT_TRUE(all_close(w.grad(), w64.grad(), 1e-4, 1e-4))
        << "x " << shape_str(c.x) << " padding " << c.padding;
  }
  // Over chunks of the batch (as a memory policy runs it), each image as in the whole batch,
  // with 2x2 tiles and with 4x4 ones.
  for (const int64_t channels : {64, 128}) {
    Tensor x = randn({6, channels, 14, 14}), w = randn({channels, channels, 3, 3});
    const ConvArgs same{{1, 1}, {1, 1}, {1, 1}, 1};
    Tensor whole = run_conv(x, w, Tensor(), same);
    Tensor first = run_conv(slice(x, 0, 0, 2), w, Tensor(), same);
    Tensor rest = run_conv(slice(x, 0, 2, 6), w, Tensor(), same);
    EXPECT_TRUE(testing::bitwise_equal(slice(whole, 0, 0, 2), first)) << channels;
    EXPECT_TRUE(testing::bitwise_equal(slice(whole, 0, 2, 6), rest)) << channels;
  }
  // A channel slice of a bigger batch: the planes are dense, the channels strided.
  Tensor wide = slice(randn({2, 48, 6, 6}), 1, 8, 40);
  Tensor w = randn({32, 32, 3, 3});
  const ConvArgs same{{1, 1}, {1, 1}, {1, 1}, 1};
  EXPECT_TRUE(all_close(run_conv(wide, w, Tensor(), same),
                        reference_conv2d(wide, w, Tensor(), same), 1e-4, 1e-4));
}

// The weight each conv2d or linear op ran with while `run` ran.
std::vector<Shape> weights_run(const std::function<Tensor()>& run) {
  std::vector<Shape> weights;
  TraceHook previous = set_trace_hook([&](const OpDef& op, const std::vector<Tensor>& inputs,
                                          const std::vector<Tensor>&, const Attrs&) {
    if (op.name == "conv2d" || op.name == "linear") weights.push_back(inputs[1].sizes());
  });
  run();
  set_trace_hook(previous);
  return weights;
}

TEST(Conv2d, TapsThatOnlyReadPaddingAreSkippedAndGetZeroGradient) {
  // A 3x3 kernel with padding 1 over a 1x1 plane reads the input with its centre alone: it runs
  // as a product of the channels (one linear op), and the other taps' gradients are zero.
  Tensor x = randn({2, 4, 1, 1}).set_requires_grad(true);
  Tensor w = randn({3, 4, 3, 3}).set_requires_grad(true);
  Tensor y;
  EXPECT_EQ(weights_run([&] {
              return y = conv2d(x, w, Tensor(), {1, 1}, {1, 1});
            }),
            (std::vector<Shape>{{3, 4}}));
  EXPECT_EQ(y.sizes(), (Shape{2, 3, 1, 1}));
  EXPECT_TRUE(
      all_close(y, reference_conv2d(x, w, Tensor(), {{1, 1}, {1, 1}, {1, 1}, 1}), 1e-5, 1e-5));
  sum(y).backward();
  Tensor centre = narrow(narrow(w.grad(), 2, 1, 1), 3, 1, 1);
  EXPECT_TRUE(all_close(sum(abs(w.grad())), sum(abs(centre)), 0, 0));
  EXPECT_GT(sum(abs(centre)).item<double>(), 0.0);
  // Stride 2 over a 2x2 plane: the one output reads rows and columns 0 and 1 with taps 1 and 2.
  Tensor small = randn({2, 4, 2, 2});
  EXPECT_EQ(weights_run([&] {
              return conv2d(small, w, Tensor(), {2, 2}, {1, 1});
            }),
            (std::vector<Shape>{{3, 4, 2, 2}}));
  // Every tap reads the input somewhere: the kernel stays whole.
  EXPECT_EQ(weights_run([&] {
              return conv2d(small, w, Tensor(), {1, 1}, {1, 1});
            }),
            (std::vector<Shape>{{3, 4, 3, 3}}));
}

TEST(Conv2d, NonContiguousInputsAndWeights) {
  Tensor x = transpose(randn({2, 3, 7, 6}, kF64), 2, 3);  // (2, 3, 6, 7)
  Tensor w = transpose(randn({3, 4, 3, 3}, kF64), 0, 1);  // (4, 3, 3, 3)
  Tensor b = slice(randn({8}, kF64), 0, 0, 8, 2);
  ConvArgs args{{1, 2}, {1, 1}, {1, 1}, 1};
  EXPECT_TRUE(all_close(run_conv(x, w, b, args), reference_conv2d(x, w, b, args), 1e-12, 1e-12));
  // A channel slice of a bigger batch (strided batch dim) through the 1x1 and depthwise paths.
  Tensor wide = slice(randn({2, 6, 5, 5}, kF64), 1, 1, 5);
  ConvArgs pointwise;
  Tensor w1 = randn({3, 4, 1, 1}, kF64);
  EXPECT_TRUE(all_close(run_conv(wide, w1, Tensor(), pointwise),
                        reference_conv2d(wide, w1, Tensor(), pointwise), 1e-12, 1e-12));
  ConvArgs depthwise{{1, 1}, {1, 1}, {1, 1}, 4};
  Tensor wd = randn({4, 1, 3, 3}, kF64);
  EXPECT_TRUE(all_close(run_conv(wide, wd, Tensor(), depthwise),
                        reference_conv2d(wide, wd, Tensor(), depthwise), 1e-12, 1e-12));
}

TEST(Conv2d, WritesIntoABatchSliceOfALargerOutput) {
  Tensor x = randn({4, 3, 6, 6}, kF64);
  Tensor w = randn({5, 3, 3, 3}, kF64);
  Tensor whole = conv2d(x, w, Tensor(), {1, 1}, {1, 1});
  Tensor out = zeros({4, 5, 6, 6}, kF64);
  const OpDef& op = ops::conv2d;
  Attrs attrs{{"stride", std::vector<int64_t>{1, 1}},
              {"padding", std::vector<int64_t>{1, 1}},
              {"dilation", std::vector<int64_t>{1, 1}},
              {"groups", int64_t{1}}};
  // How a split runs: each chunk of the batch into its slice of one output.
  dispatch(op, {slice(x, 0, 0, 2), w, Tensor()}, attrs, {slice(out, 0, 0, 2)});
  dispatch(op, {slice(x, 0, 2, 4), w, Tensor()}, attrs, {slice(out, 0, 2, 4)});
  EXPECT_TRUE(all_close(out, whole, 1e-12, 1e-12));
  // A channel-strided output (every other channel of a bigger tensor) is staged and copied.
  Tensor interleaved = zeros({4, 10, 6, 6}, kF64);
  dispatch(op, {x, w, Tensor()}, attrs, {slice(interleaved, 1, 0, 10, 2)});
  EXPECT_TRUE(all_close(slice(interleaved, 1, 0, 10, 2), whole, 1e-12, 1e-12));
}

TEST(Conv2d, SingleThreadGivesTheSameValues) {
  Tensor x = randn({3, 4, 8, 8});
  Tensor w = randn({6, 4, 3, 3});
  Tensor threaded = conv2d(x, w, Tensor(), {1, 1}, {1, 1});
  int threads = get_num_threads();
  set_num_threads(1);
  Tensor serial = conv2d(x, w, Tensor(), {1, 1}, {1, 1});
  set_num_threads(threads);
  EXPECT_TRUE(all_close(threaded, serial));
}

// Finite differences over every input of each configuration.
TEST(Conv2d, GradientsMatchFiniteDifferences) {
  struct Case {
    const char* name;
    Shape x, w;
    ConvArgs args;
    bool bias;
  };
  std::vector<Case> cases = {
      {"plain with bias", {2, 3, 5, 5}, {4, 3, 3, 3}, {}, true},
      {"stride 2, padding 1", {2, 2, 6, 5}, {3, 2, 3, 3}, {{2, 2}, {1, 1}, {1, 1}, 1}, true},
      {"dilation 2", {1, 2, 7, 7}, {2, 2, 3, 3}, {{1, 1}, {2, 1}, {2, 2}, 1}, false},
      {"groups 2", {2, 4, 5, 5}, {6, 2, 3, 3}, {{1, 1}, {1, 1}, {1, 1}, 2}, true},
      {"depthwise", {2, 3, 5, 5}, {3, 1, 3, 3}, {{2, 1}, {1, 1}, {1, 1}, 3}, true},
      {"depthwise multiplier, dilated",
       {1, 2, 6, 6},
       {4, 1, 3, 2},
       {{1, 2}, {2, 1}, {2, 1}, 2},
       false},
      {"1x1", {2, 3, 4, 4}, {2, 3, 1, 1}, {}, true},
      {"1x1 stride 2", {2, 3, 5, 5}, {2, 3, 1, 1}, {{2, 2}, {0, 0}, {1, 1}, 1}, false},
      // Small planes and several images per thread: images share one GEMM.
      {"images side by side", {5, 2, 4, 4}, {3, 2, 3, 3}, {{1, 1}, {1, 1}, {1, 1}, 1}, true},
      {"images side by side, groups 2",
       {5, 4, 3, 3},
       {4, 2, 2, 2},
       {{1, 1}, {1, 0}, {1, 1}, 2},
       true},
      {"images side by side, 1x1", {5, 3, 3, 3}, {2, 3, 1, 1}, {}, false},
      {"3x3 over a 1x1 plane", {2, 3, 1, 1}, {2, 3, 3, 3}, {{1, 1}, {1, 1}, {1, 1}, 1}, true},
      {"3x3 stride 2 over 2x2", {2, 3, 2, 2}, {2, 3, 3, 3}, {{2, 2}, {1, 1}, {1, 1}, 1}, false},
  };
  for (const auto& c : cases) {
    Tensor x = randn(c.x, kF64).set_requires_grad(true);
    Tensor w = randn(c.w, kF64).set_requires_grad(true);
    Tensor b = c.bias ? randn({c.w[0]}, kF64).set_requires_grad(true) : Tensor();
    ConvArgs args = c.args;
    std::vector<Tensor> inputs = {x, w};
    if (c.bias) inputs.push_back(b);
    EXPECT_TRUE(gradcheck(
        [args](const std::vector<Tensor>& in) {
          return run_conv(in[0], in[1], in.size() > 2 ? in[2] : Tensor(), args);
        },
        inputs))
        << c.name;
  }
}

TEST(Conv2d, GradientsOfNonContiguousInputs) {
  Tensor x = transpose(randn({2, 3, 6, 5}, kF64), 2, 3).set_requires_grad(true);  // (2,3,5,6)
  Tensor w = transpose(randn({3, 4, 3, 3}, kF64), 0, 1).set_requires_grad(true);  // (4,3,3,3)
  EXPECT_TRUE(gradcheck(
      [](const std::vector<Tensor>& in) {
        return conv2d(in[0], in[1], Tensor(), {2, 1}, {1, 1});
      },
      {x, w}));
  Tensor xd = transpose(randn({1, 2, 5, 4}, kF64), 2, 3).set_requires_grad(true);
  Tensor wd = randn({2, 1, 3, 3}, kF64).set_requires_grad(true);
  EXPECT_TRUE(gradcheck(
      [](const std::vector<Tensor>& in) {
        return conv2d(in[0], in[1], Tensor(), {1, 1}, {1, 1}, {1, 1}, 2);
      },
      {xd, wd}));
}

TEST(Conv2d, BackwardOpsAreRegisteredSplittableAndCosted) {
  const OpDef& forward = ops::conv2d;
  EXPECT_EQ(forward.splits.at(0).input_dims, (std::vector<int>{0, -1, -1}));
  EXPECT_EQ(ops::conv2d_backward_input->splits.at(0).input_dims, (std::vector<int>{0, -1}));
  EXPECT_NE(OpRegistry::get().find_or_null("conv2d_backward_weight"), nullptr);
  Attrs attrs{{"stride", std::vector<int64_t>{1, 1}},
              {"padding", std::vector<int64_t>{1, 1}},
              {"dilation", std::vector<int64_t>{1, 1}},
              {"groups", int64_t{1}}};
  OpCost cost = forward.cost({zeros({2, 3, 8, 8}), zeros({4, 3, 3, 3}), Tensor()},
                             {zeros({2, 4, 8, 8})}, attrs);
  EXPECT_DOUBLE_EQ(cost.flops, 2.0 * 2 * 4 * 8 * 8 * 3 * 3 * 3);
}

TEST(Conv2d, ChannelMismatchNamesTheShapes) {
  EXPECT_TRUE(throws_error(
      [] {
        conv2d(zeros({1, 3, 5, 5}), zeros({8, 4, 3, 3}));
      },
      "conv2d: input has 3 channels but weight expects 4 (weight shape [8, 4, 3, 3])"));
  EXPECT_TRUE(throws_error(
      [] {
        conv2d(zeros({1, 6, 5, 5}), zeros({8, 2, 3, 3}), Tensor(), {1, 1}, {0, 0}, {1, 1}, 2);
      },
      "input has 6 channels but weight expects 4 (weight shape [8, 2, 3, 3], groups=2)"));
  EXPECT_TRUE(throws_error(
      [] {
        conv2d(zeros({1, 4, 5, 5}), zeros({6, 1, 3, 3}), Tensor(), {1, 1}, {0, 0}, {1, 1}, 4);
      },
      "groups=4 does not divide the weight's 6 output channels"));
}

TEST(Conv2d, KernelLargerThanPaddedInputIsAnError) {
  EXPECT_TRUE(throws_error(
      [] {
        conv2d(zeros({1, 1, 4, 4}), zeros({1, 1, 5, 5}));
      },
      "conv2d: kernel 5x5 (weight shape [1, 1, 5, 5], dilation [1, 1]) is "
      "larger than the padded input 4x4"));
  EXPECT_TRUE(throws_error(
      [] {
        conv2d(zeros({1, 1, 4, 4}), zeros({1, 1, 3, 3}), Tensor(), {1, 1}, {0, 0}, {2, 2});
      },
      "kernel 5x5"));
  // Padding makes room.
  EXPECT_EQ(conv2d(zeros({1, 1, 4, 4}), zeros({1, 1, 5, 5}), Tensor(), {1, 1}, {1, 1}).sizes(),
            (Shape{1, 1, 2, 2}));
}

TEST(Conv2d, BadDtypesRanksAndAttributes) {
  EXPECT_TRUE(throws_error(
      [] {
        conv2d(zeros({1, 1, 4, 4}, DType::kInt64), zeros({1, 1, 3, 3}, DType::kInt64));
      },
      "conv2d: expected a f32 or f64 input, got i64"));
  EXPECT_TRUE(throws_error(
      [] {
        conv2d(zeros({1, 1, 4, 4}), zeros({1, 1, 3, 3}, kF64));
      },
      "input is f32 but weight is f64"));
  EXPECT_TRUE(throws_error(
      [] {
        conv2d(zeros({1, 4, 4}), zeros({1, 1, 3, 3}));
      },
      "expected a 4-D input (N, C, H, W), got shape [1, 4, 4]"));
  EXPECT_TRUE(throws_error(
      [] {
        conv2d(zeros({1, 1, 4, 4}), zeros({2, 1, 3, 3}), zeros({3}));
      },
      "bias has shape [3] but weight has 2 output channels"));
  EXPECT_TRUE(throws_error(
      [] {
        conv2d(zeros({1, 1, 4, 4}), zeros({1, 1, 3, 3}), Tensor(), {0, 1});
      },
      "stride must be positive"));
  EXPECT_TRUE(throws_error(
      [] {
        conv2d(zeros({1, 1, 4, 4}), zeros({1, 1, 3, 3}), Tensor(), {1, 1, 1});
      },
      "stride must have 1 or 2 values"));
}

}  // namespace
}  // namespace tessel
