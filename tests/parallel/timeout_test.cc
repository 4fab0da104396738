// A rank that never arrives: the others fail within the communicator's timeout (3 s here) with
// an error naming the collective and the missing rank, instead of hanging; the communicator is
// unusable afterwards. Run with 2 and 4 ranks.
#include <mpi.h>

#include <memory>
#include <string>

#include "ops/ops.h"
#include "parallel/mpi_communicator.h"
#include "parallel/process_group.h"
#include "tests/parallel/mpi_testing.h"
#include "tests/testing.h"

namespace tessel::parallel {
namespace {

using tessel::testing::throws_error;
using testing::MpiTest;

constexpr double kTimeoutS = 3.0;

class Timeouts : public MpiTest {
 protected:
  // A fresh communicator per test: a timeout leaves it unusable.
  static std::shared_ptr<MpiCommunicator> fresh(const std::string& name) {
    return std::make_shared<MpiCommunicator>(MPI_COMM_WORLD,
                                             CommOptions().name(name).timeout_s(kTimeoutS));
  }
  // Every rank, the skipping one included, meets here before the next test.
  static void meet() { MPI_Barrier(MPI_COMM_WORLD); }
};

TEST_F(Timeouts, ARankThatSkipsAnAllReduceIsNamedByTheOthers) {
  auto comm = fresh("skip");
  Tensor tensor = ones({4});
  comm->all_reduce(tensor);  // #1 works
  if (comm->rank() != 1) {
    // Rank 0 knows from the arrival messages; the others hear it from rank 0.
    EXPECT_TRUE(throws_error([&] { comm->all_reduce(tensor); },
                             "all_reduce #2 (sum, f32 [4]) on communicator 'skip' timed out "
                             "after 3 s: rank 1 did not arrive"));
    EXPECT_TRUE(throws_error([&] { comm->all_reduce(tensor); },
                             "unusable after an earlier "
                             "failure"));
    EXPECT_TRUE(throws_error([&] { comm->barrier(); }, "rank 1 did not arrive"));
  }
  meet();
}

TEST_F(Timeouts, WhenRankZeroIsMissingTheOthersSaySo) {
  auto comm = fresh("no_root");
  if (comm->rank() != 0) {
    EXPECT_TRUE(throws_error([&] { comm->barrier(); }, "barrier #1"));
    EXPECT_TRUE(throws_error([&] { comm->barrier(); }, "rank 0 itself probably did not arrive"));
  }
  meet();
}

TEST_F(Timeouts, SeveralMissingRanksAreAllNamed) {
  if (size() < 4) GTEST_SKIP() << "needs 4 ranks";
  auto comm = fresh("two_missing");
  if (comm->rank() == 0 || comm->rank() == 2) {
    // An all_reduce needs every rank on every rank (a broadcast may finish early on some).
    Tensor tensor = zeros({2, 2}, DType::kInt64);
    EXPECT_TRUE(throws_error([&] { comm->all_reduce(tensor, ReduceOp::kMax); },
                             "ranks 1, 3 did not arrive"));
  }
  meet();
}

TEST_F(Timeouts, AMissingRankInASubGroupIsNamedWithItsWorldRank) {
  if (size() < 4) GTEST_SKIP() << "needs 4 ranks";
  ProcessGrid grid(2, 2, CommOptions().timeout_s(kTimeoutS));
  // The dp group of tp index 1 holds world ranks 1 and 3; world rank 3 skips.
  if (grid.tp_index() == 1 && grid.dp_index() == 0) {
    Tensor tensor = ones({3});
    EXPECT_TRUE(throws_error([&] { grid.data_parallel()->all_reduce(tensor); },
                             "on communicator 'dp' timed out after 3 s: rank 1 (world rank 3) "
                             "did not arrive"));
  }
  meet();
}

TEST_F(Timeouts, ARecvWithNoSenderTimesOut) {
  auto comm = fresh("p2p");
  if (comm->rank() == 0) {
    Tensor tensor = zeros({5});
    EXPECT_TRUE(throws_error([&] { comm->recv(tensor, 1, 9); },
                             "recv of f32 [5] from rank 1 with tag 9 on communicator 'p2p' timed "
                             "out after 3 s: rank 1 did not send it"));
  }
  meet();
}

TEST_F(Timeouts, AnAsyncAllReduceTimesOutInWait) {
  auto comm = fresh("async");
  if (comm->rank() != 1) {
    Tensor tensor = ones({8}, DType::kFloat64);
    auto work = comm->all_reduce_async(tensor, ReduceOp::kMean);
    EXPECT_FALSE(work->poll());
    EXPECT_TRUE(throws_error([&] { work->wait(); }, "all_reduce #1 (mean, f64 [8])"));
  }
  meet();
}

TEST(TimeoutSetting, ComesFromTheEnvironmentAndMustBePositive) {
  setenv("TESSEL_COLLECTIVE_TIMEOUT_S", "7.5", 1);
  EXPECT_EQ(collective_timeout_from_env(), 7.5);
  setenv("TESSEL_COLLECTIVE_TIMEOUT_S", "soon", 1);
  EXPECT_TRUE(throws_error([] { collective_timeout_from_env(); },
                           "TESSEL_COLLECTIVE_TIMEOUT_S must be a positive number"));
  setenv("TESSEL_COLLECTIVE_TIMEOUT_S", "0", 1);
  EXPECT_TRUE(throws_error([] { collective_timeout_from_env(); }, "positive"));
  unsetenv("TESSEL_COLLECTIVE_TIMEOUT_S");
  EXPECT_EQ(collective_timeout_from_env(), 300.0);
  EXPECT_TRUE(
      throws_error([] { MpiCommunicator comm(MPI_COMM_WORLD, CommOptions().timeout_s(-1)); },
                   "timeout must be a positive number"));
}

}  // namespace
}  // namespace tessel::parallel
