#include "core/dtype.h"

#include <cmath>

#include "gtest/gtest.h"
#include "tests/testing.h"

namespace tessel {
namespace {

TEST(DType, ElementSizesMatchTheirCTypes) {
  EXPECT_EQ(element_size(DType::kFloat32), 4u);
  EXPECT_EQ(element_size(DType::kFloat64), 8u);
  EXPECT_EQ(element_size(DType::kBFloat16), 2u);
  EXPECT_EQ(element_size(DType::kFloat16), 2u);
  EXPECT_EQ(element_size(DType::kInt32), 4u);
  EXPECT_EQ(element_size(DType::kInt64), 8u);
  EXPECT_EQ(element_size(DType::kUInt8), 1u);
  EXPECT_EQ(element_size(DType::kBool), 1u);
}

TEST(DType, PromotionFollowsCategoryThenWidth) {
  EXPECT_EQ(promote_types(DType::kInt64, DType::kFloat32), DType::kFloat32);
  EXPECT_EQ(promote_types(DType::kFloat32, DType::kFloat64), DType::kFloat64);
  EXPECT_EQ(promote_types(DType::kBool, DType::kUInt8), DType::kUInt8);
  EXPECT_EQ(promote_types(DType::kUInt8, DType::kInt32), DType::kInt32);
  EXPECT_EQ(promote_types(DType::kInt32, DType::kInt64), DType::kInt64);
  EXPECT_EQ(promote_types(DType::kBFloat16, DType::kFloat32), DType::kFloat32);
  EXPECT_EQ(promote_types(DType::kInt64, DType::kBFloat16), DType::kBFloat16);
  EXPECT_EQ(promote_types(DType::kFloat16, DType::kBFloat16), DType::kFloat32);
}

TEST(DType, NamesRoundTripAndUnknownNamesAreErrors) {
  for (int i = 0; i < kNumDTypes; ++i) {
    auto dtype = static_cast<DType>(i);
    EXPECT_EQ(dtype_from_name(dtype_name(dtype)), dtype);
  }
  EXPECT_EQ(dtype_from_name("float32"), DType::kFloat32);
  EXPECT_TRUE(testing::throws_error([] { dtype_from_name("f128"); }, "unknown dtype name 'f128'"));
}

TEST(DType, BFloat16RoundsToNearestEven) {
  EXPECT_EQ(static_cast<float>(BFloat16(1.0f)), 1.0f);
  EXPECT_EQ(static_cast<float>(BFloat16(3.14159265f)),
            3.140625f);  // torch.tensor(3.14159265).bfloat16()
  EXPECT_EQ(BFloat16(1.0f + 1.0f / 256).bits, BFloat16(1.0f).bits);            // tie to even (down)
  EXPECT_EQ(static_cast<float>(BFloat16(-2.5e38f)), -2.498948632075642e+38f);  // torch .bfloat16()
  EXPECT_TRUE(std::isnan(static_cast<float>(BFloat16(NAN))));
}

TEST(DType, Float16ConvertsNormalsSubnormalsAndOverflow) {
  EXPECT_EQ(static_cast<float>(Float16(1.0f)), 1.0f);
  EXPECT_EQ(static_cast<float>(Float16(65504.0f)), 65504.0f);  // largest finite half
  EXPECT_TRUE(std::isinf(static_cast<float>(Float16(70000.0f))));
  EXPECT_EQ(static_cast<float>(Float16(5.9604645e-8f)), 5.9604645e-8f);  // smallest subnormal
  EXPECT_EQ(static_cast<float>(Float16(0.1f)), 0.0999755859375f);        // torch.tensor(0.1).half()
  EXPECT_EQ(static_cast<float>(Float16(-3.0f)), -3.0f);
  EXPECT_EQ(Float16(0.0f).bits, 0);
}

TEST(DType, TensorsConvertBetweenEveryPairOfDTypes) {
  Tensor source = from_vector<float>({0.0f, 1.0f, 2.0f, 100.0f}, {4});
  for (int i = 0; i < kNumDTypes; ++i) {
    auto dtype = static_cast<DType>(i);
    if (dtype == DType::kBool) continue;
    Tensor converted = from_vector<float>(source.to_vector<float>(), {4}, dtype);
    EXPECT_EQ(converted.dtype(), dtype);
    EXPECT_EQ(converted.to_vector<double>(), (std::vector<double>{0, 1, 2, 100}))
        << dtype_name(dtype);
  }
  Tensor flags = from_vector<float>({0.0f, 0.5f}, {2}, DType::kBool);
  EXPECT_EQ(flags.to_vector<bool>(), (std::vector<bool>{false, true}));
}

}  // namespace
}  // namespace tessel
