#include "core/rng.h"

#include <cmath>

#include "gtest/gtest.h"
#include "ops/ops.h"
#include "tests/testing.h"

namespace tessel {
namespace {

TEST(Rng, PhiloxMatchesTheRandom123KnownAnswer) {
  // Philox4x32-10 with counter 0 and key 0 (Random123 kat_vectors).
  auto words = philox4x32(0, 0);
  EXPECT_EQ(words[0], 0x6627e8d5u);
  EXPECT_EQ(words[1], 0xe169c58du);
  EXPECT_EQ(words[2], 0xbc57ac4cu);
  EXPECT_EQ(words[3], 0x9b00dbd8u);
}

TEST(Rng, ElementsDependOnlyOnSeedOffsetAndIndex) {
  RngState state{123, 10};
  RngState shifted{123, 11};
  EXPECT_EQ(random_bits(state, 4), random_bits(shifted, 0));
  EXPECT_NE(random_bits(state, 0), random_bits(RngState{124, 10}, 0));
}

TEST(Rng, StateSaveAndRestoreReplaysTheSameTensor) {
  manual_seed(7);
  RngState saved = get_rng_state();
  Tensor first = randn({64});
  Tensor second = randn({64});
  EXPECT_FALSE(testing::bitwise_equal(first, second));
  set_rng_state(saved);
  EXPECT_TRUE(testing::bitwise_equal(randn({64}), first));
  manual_seed(7);
  EXPECT_TRUE(testing::bitwise_equal(randn({64}), first));
}

TEST(Rng, UniformAndNormalHaveTheRightMoments) {
  RngState state{2024, 0};
  const int n = 200000;
  double uniform_sum = 0, normal_sum = 0, normal_squares = 0;
  for (int i = 0; i < n; ++i) {
    float u = uniform_at(state, i);
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    uniform_sum += u;
    double z = normal_at(state, i);
    normal_sum += z;
    normal_squares += z * z;
  }
  EXPECT_NEAR(uniform_sum / n, 0.5, 0.005);
  EXPECT_NEAR(normal_sum / n, 0.0, 0.01);
  EXPECT_NEAR(normal_squares / n, 1.0, 0.01);
}

}  // namespace
}  // namespace tessel
