// PeerAccessTable with fake CUDA calls: peer access is asked for and enabled once per ordered
// pair, refusals are cached too, and a failed enable is tried again on the next call.
#include "cuda/peer_access.h"

#include <stdexcept>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace tessel::cuda {
namespace {

// A machine where GPU pairs listed in `linked` can reach each other; records every call.
struct FakeRuntime {
  std::vector<std::pair<int, int>> linked;
  std::vector<std::pair<int, int>> asked, enabled;
  int failures_left = 0;  // enable calls that throw before one succeeds

  PeerAccessTable table() {
    return PeerAccessTable({[this](int device, int peer) {
                              asked.emplace_back(device, peer);
                              for (const auto& pair : linked)
                                if (pair == std::make_pair(device, peer)) return true;
                              return false;
                            },
                            [this](int device, int peer) {
                              if (failures_left > 0) {
                                --failures_left;
                                throw std::runtime_error("peer access failed");
                              }
                              enabled.emplace_back(device, peer);
                            }});
  }
};

TEST(PeerAccess, EnablesEachOrderedPairOnceWhereTheGpusAllowIt) {
  FakeRuntime runtime;
  runtime.linked = {{0, 1}, {1, 0}};
  PeerAccessTable table = runtime.table();
  EXPECT_TRUE(table.ensure(0, 1));
  EXPECT_TRUE(table.ensure(0, 1));
  EXPECT_TRUE(table.ensure(1, 0));
  EXPECT_FALSE(table.ensure(0, 2));
  EXPECT_FALSE(table.ensure(0, 2));
  const std::vector<std::pair<int, int>> asked = {{0, 1}, {1, 0}, {0, 2}};
  const std::vector<std::pair<int, int>> enabled = {{0, 1}, {1, 0}};
  EXPECT_EQ(runtime.asked, asked);  // every answer is cached, refusals included
  EXPECT_EQ(runtime.enabled, enabled);
}

TEST(PeerAccess, ADeviceReachesItsOwnMemoryWithoutAsking) {
  FakeRuntime runtime;
  PeerAccessTable table = runtime.table();
  EXPECT_TRUE(table.ensure(3, 3));
  EXPECT_TRUE(runtime.asked.empty());
  EXPECT_TRUE(runtime.enabled.empty());
}

TEST(PeerAccess, AFailedEnableIsReportedAndTriedAgain) {
  FakeRuntime runtime;
  runtime.linked = {{2, 1}};
  runtime.failures_left = 1;
  PeerAccessTable table = runtime.table();
  EXPECT_THROW(table.ensure(2, 1), std::runtime_error);
  EXPECT_TRUE(table.ensure(2, 1));
  const std::vector<std::pair<int, int>> enabled = {{2, 1}};
  EXPECT_EQ(runtime.enabled, enabled);
  EXPECT_EQ(runtime.asked.size(), 2u);
}

}  // namespace
}  // namespace tessel::cuda
