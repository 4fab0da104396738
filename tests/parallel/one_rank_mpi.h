// MPI for a gtest binary that runs as one rank without mpirun (MPI's singleton mode): initialised
// before the first test, finalised at exit. Register it once per binary:
//   const auto* const kMpi = ::testing::AddGlobalTestEnvironment(new OneRankMpiEnvironment);
#pragma once

#include <mpi.h>

#include "gtest/gtest.h"

namespace tessel::parallel {

class OneRankMpiEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    }
  }
  void TearDown() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }
};

}  // namespace tessel::parallel
