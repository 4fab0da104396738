// Autocast on CPU: inside an AutocastGuard matmul, bmm, linear and conv2d run on bf16 casts of
// their f32 inputs and return bf16 (PyTorch's convention), other ops widen bf16 inputs back to
// f32, views keep them, and gradients reach the f32 parameters in f32. CPU kernels compute bf16
// products in f32 and round the result.
#include "core/autocast.h"

#include "core/autograd.h"
#include "ops/ops.h"
#include "tests/testing.h"

namespace tessel {
namespace {

using testing::all_close;
using testing::bitwise_equal;
using testing::throws_error;

constexpr DType kBF16 = DType::kBFloat16;
constexpr DType kF32 = DType::kFloat32;

Tensor bf16(const Tensor& t) { return to_dtype(t, kBF16); }
Tensor f32(const Tensor& t) { return to_dtype(t, kF32); }

TEST(AutocastGuard, IsScopedAndNests) {
  EXPECT_FALSE(autocast_dtype().has_value());
  {
    AutocastGuard autocast(kBF16);
    EXPECT_EQ(autocast_dtype(), kBF16);
    {
      AutocastGuard off(kBF16, /*enabled=*/false);
      EXPECT_FALSE(autocast_dtype().has_value());
    }
    EXPECT_EQ(autocast_dtype(), kBF16);
  }
  EXPECT_FALSE(autocast_dtype().has_value());
}

TEST(AutocastGuard, RefusesANonHalfDtype) {
  EXPECT_TRUE(throws_error([] { AutocastGuard autocast(kF32); }, "must be bf16 or f16, got f32"));
}

TEST(Autocast, ProductsAndConvolutionsReturnBf16) {
  Tensor a = randn({4, 6}), b = randn({6, 3});
  AutocastGuard autocast(kBF16);
  EXPECT_EQ(matmul(a, b).dtype(), kBF16);
  EXPECT_EQ(bmm(randn({2, 4, 6}), randn({2, 6, 3})).dtype(), kBF16);
  EXPECT_EQ(linear(a, randn({5, 6}), randn({5})).dtype(), kBF16);
  EXPECT_EQ(conv2d(randn({1, 2, 5, 5}), randn({3, 2, 3, 3})).dtype(), kBF16);
}

TEST(Autocast, ProductEqualsTheF32ProductOfRoundedInputsRounded) {
  Tensor a = randn({5, 7}), b = randn({7, 4});
  Tensor expected = bf16(matmul(f32(bf16(a)), f32(bf16(b))));
  AutocastGuard autocast(kBF16);
  EXPECT_TRUE(bitwise_equal(matmul(a, b), expected));
}

TEST(Autocast, OtherOpsWidenBf16InputsToF32) {
  Tensor x = randn({3, 4});
  AutocastGuard autocast(kBF16);
  Tensor product = matmul(x, randn({4, 2}));
  Tensor activated = relu(product);
  EXPECT_EQ(activated.dtype(), kF32);
  EXPECT_TRUE(bitwise_equal(activated, relu(f32(product))));
  EXPECT_EQ(cross_entropy(product, from_vector<int64_t>({0, 1, 1}, {3})).dtype(), kF32);
}

TEST(Autocast, ViewsAndCastsKeepBf16) {
  AutocastGuard autocast(kBF16);
  Tensor product = matmul(randn({3, 4}), randn({4, 2}));
  EXPECT_EQ(transpose(product, 0, 1).dtype(), kBF16);
  EXPECT_EQ(reshape(product, {6}).dtype(), kBF16);
  EXPECT_EQ(to_dtype(product, DType::kFloat16).dtype(), DType::kFloat16);
}

TEST(Autocast, F64InputsAreNotLowered) {
  AutocastGuard autocast(kBF16);
  Tensor a = randn({2, 3}, DType::kFloat64), b = randn({3, 2}, DType::kFloat64);
  EXPECT_EQ(matmul(a, b).dtype(), DType::kFloat64);
}

TEST(Autocast, GradientsReachF32ParametersInF32) {
  Tensor x = randn({6, 8});
  Tensor w = randn({4, 8}).set_requires_grad(true);
  Tensor bias = randn({4}).set_requires_grad(true);
  Tensor kernel = randn({3, 2, 3, 3}).set_requires_grad(true);
  Tensor conv_bias = randn({3}).set_requires_grad(true);
  Tensor image = randn({2, 2, 6, 6});
  Tensor loss;
  {
    AutocastGuard autocast(kBF16);
    // sum widens the bf16 outputs to f32.
    loss = add(sum(linear(x, w, bias)), sum(conv2d(image, kernel, conv_bias, {1, 1}, {1, 1})));
  }
  EXPECT_EQ(loss.dtype(), kF32);
  loss.backward();
  ASSERT_EQ(w.grad().dtype(), kF32);
  ASSERT_EQ(kernel.grad().dtype(), kF32);
  ASSERT_EQ(bias.grad().dtype(), kF32);
  ASSERT_EQ(conv_bias.grad().dtype(), kF32);
  // The f32 gradients of the same computation, within bf16's precision.
  Tensor w32 = w.detach().set_requires_grad(true), b32 = bias.detach().set_requires_grad(true);
  Tensor k32 = kernel.detach().set_requires_grad(true);
  Tensor cb32 = conv_bias.detach().set_requires_grad(true);
  add(sum(linear(x, w32, b32)), sum(conv2d(image, k32, cb32, {1, 1}, {1, 1}))).backward();
  EXPECT_TRUE(all_close(w.grad(), w32.grad(), 2e-2, 2e-2));
  EXPECT_TRUE(all_close(bias.grad(), b32.grad(), 2e-2, 2e-2));
  EXPECT_TRUE(all_close(kernel.grad(), k32.grad(), 2e-2, 2e-2));
  EXPECT_TRUE(all_close(conv_bias.grad(), cb32.grad(), 2e-2, 2e-2));
}

TEST(Autocast, BackwardInsideTheGuardKeepsTheForwardDtypes) {
  Tensor w = randn({3, 5}).set_requires_grad(true);
  AutocastGuard autocast(kBF16);
  Tensor out = linear(randn({2, 5}), w);
  sum(out).backward();
  EXPECT_EQ(w.grad().dtype(), kF32);
}

TEST(Autocast, Bf16OutputUsedTwiceAccumulatesItsGradient) {
  Tensor x = randn({2, 4});
  Tensor w = randn({3, 4}).set_requires_grad(true);
  Tensor loss;
  {
    AutocastGuard autocast(kBF16);
    Tensor y = linear(x, w);  // read by sum and by a view: two gradients meet at y
    loss = add(sum(y), sum(transpose(y, 0, 1)));
  }
  loss.backward();
  Tensor w32 = w.detach().set_requires_grad(true);
  mul(sum(linear(x, w32)), 2.0).backward();
  EXPECT_EQ(w.grad().dtype(), kF32);
  EXPECT_TRUE(all_close(w.grad(), w32.grad(), 2e-2, 2e-2));
}

TEST(Bf16OnCpu, ProductsAndConvolutionsComputeInF32AndRound) {
  Tensor a = bf16(randn({3, 5})), b = bf16(randn({5, 2}));
  EXPECT_TRUE(bitwise_equal(matmul(a, b), bf16(matmul(f32(a), f32(b)))));
  Tensor x = bf16(randn({1, 2, 5, 5})), k = bf16(randn({3, 2, 3, 3}));
  EXPECT_TRUE(bitwise_equal(conv2d(x, k), bf16(conv2d(f32(x), f32(k)))));
}

TEST(Bf16OnCpu, MixedDtypesAreStillRefused) {
  EXPECT_TRUE(throws_error(
      [] {
        matmul(bf16(randn({2, 2})), randn({2, 2}));
      },
      "matmul: a is bf16 but b is f32"));
}

}  // namespace
}  // namespace tessel
