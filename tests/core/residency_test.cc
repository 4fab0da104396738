// Proves the interfaces the memory layer builds on: a test-only residency hook keeps the
// op record of every op output, evicts an output's bytes, and the next access recomputes it from
// the recorded op call, bitwise equal to the original.
#include <mutex>
#include <unordered_set>

#include "core/op.h"
#include "core/rng.h"
#include "core/storage.h"
#include "gtest/gtest.h"
#include "ops/ops.h"
#include "tests/testing.h"

namespace tessel {
namespace {

using testing::bitwise_equal;

class RecomputeOnAccess : public ResidencyHooks {
 public:
  void make_resident(StorageImpl& storage) override {
    ASSERT_TRUE(storage.producer) << "evicted storage without an op record";
    ++recomputes;
    replay_op_call(*storage.producer);
  }
  void on_op_recorded(const std::shared_ptr<OpCall>& call, double seconds) override {
    call->cost_seconds = seconds;
    for (auto& weak : call->output_storages)
      if (auto storage = weak.lock()) storage->producer = call;
  }
  void on_user_release(StorageImpl& storage) override {
    // A dropped tensor that op records still need becomes an evicted placeholder.
    if (storage.record_refs() > 0 && storage.producer && storage.pins() == 0) {
      storage.release_bytes(Residency::kEvicted);
      ++placeholders;
    }
  }
  int recomputes = 0;
  int placeholders = 0;
};

class ResidencyTest : public ::testing::Test {
 protected:
  void SetUp() override { set_residency_hooks(hooks_); }
  void TearDown() override { set_residency_hooks(nullptr); }
  std::shared_ptr<RecomputeOnAccess> hooks_ = std::make_shared<RecomputeOnAccess>();
};

TEST_F(ResidencyTest, EvictedOutputIsRecomputedBitwiseEqual) {
  Tensor x = randn({16, 32});
  Tensor w = randn({8, 32});
  Tensor y = tanh(linear(x, w));
  Tensor expected = clone(y);
  y.storage()->release_bytes(Residency::kEvicted);
  EXPECT_EQ(y.storage()->state(), Residency::kEvicted);
  EXPECT_TRUE(bitwise_equal(y, expected));  // reading pins through the accessor: recompute
  // tanh, then linear: its output was dropped after tanh read it, so it was a placeholder.
  EXPECT_EQ(hooks_->recomputes, 2);
  EXPECT_EQ(y.storage()->state(), Residency::kResident);
}

TEST_F(ResidencyTest, RecomputeChainsThroughEvictedInputs) {
  Tensor x = randn({64});
  Tensor a = exp(x);
  Tensor b = mul(a, a);
  Tensor expected = clone(b);
  a.storage()->release_bytes(Residency::kEvicted);
  b.storage()->release_bytes(Residency::kEvicted);
  EXPECT_TRUE(bitwise_equal(b, expected));
  EXPECT_EQ(hooks_->recomputes, 2);
}

TEST_F(ResidencyTest, DroppedTensorNeededByARecordBecomesAPlaceholder) {
  Tensor x = randn({128});
  Tensor b;
  {
    Tensor a = sigmoid(x);
    b = mul(a, 3.0);
  }  // a's last user reference is gone, but b's op record refers to it
  EXPECT_EQ(hooks_->placeholders, 1);
  Tensor expected = clone(b);
  b.storage()->release_bytes(Residency::kEvicted);
  EXPECT_TRUE(bitwise_equal(b, expected));
  EXPECT_EQ(hooks_->recomputes, 2);  // b, then its evicted input a
}

TEST_F(ResidencyTest, RandomOpsReplayTheSameNumbers) {
  manual_seed(5);
  Tensor noise = randn({100});
  Tensor expected = clone(noise);
  randn({100});  // the generator moves on
  noise.storage()->release_bytes(Residency::kEvicted);
  EXPECT_TRUE(bitwise_equal(noise, expected));
}

TEST_F(ResidencyTest, RecomputeRefusesInputsModifiedInPlace) {
  Tensor x = randn({8});
  Tensor y = exp(x);
  x.mul_(2.0);
  y.storage()->release_bytes(Residency::kEvicted);
  EXPECT_TRUE(testing::throws_error([&] { y.to_vector<float>(); }, "modified in place"));
}

TEST_F(ResidencyTest, PinnedStorageCannotBeReleased) {
  Tensor x = randn({8});
  StorageAccess access(*x.storage());
  EXPECT_TRUE(
      testing::throws_error([&] { x.storage()->release_bytes(Residency::kEvicted); }, "pinned"));
}

TEST(Residency, EvictedStorageWithoutAMemoryLayerIsAClearError) {
  Tensor x = randn({8});
  x.storage()->release_bytes(Residency::kEvicted);
  EXPECT_TRUE(testing::throws_error([&] { x.to_vector<float>(); }, "no memory layer is installed"));
}

}  // namespace
}  // namespace tessel
