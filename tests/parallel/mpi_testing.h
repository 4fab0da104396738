// Support for multi-rank GoogleTest binaries (run by //tools:mpi_test.bzl under mpirun): a main
// that starts the ranks through run_ranks, and a fixture whose tests fail on every rank when
// they fail on any, so rank 0's XML (the one Bazel reads) records failures seen elsewhere.
//   class Collectives : public MpiTest {};   TEST_F(Collectives, ...) { world().all_reduce(t); }
#pragma once

#include <memory>

#include "gtest/gtest.h"
#include "parallel/mpi_communicator.h"

namespace tessel::parallel::testing {

class MpiTest : public ::testing::Test {
 protected:
  // Agrees with the other ranks on the outcome (over MPI_COMM_WORLD itself, so a communicator
  // left unusable by the test does not matter).
  void TearDown() override;
  // One communicator over all ranks for the whole binary; its timeout is
  // TESSEL_COLLECTIVE_TIMEOUT_S when set, else 120 s, so a broken test fails instead of hanging.
  static MpiCommunicator& world() { return *shared_world(); }
  static const std::shared_ptr<MpiCommunicator>& shared_world();
  static int rank() { return world().rank(); }
  static int size() { return world().size(); }
};

}  // namespace tessel::parallel::testing
