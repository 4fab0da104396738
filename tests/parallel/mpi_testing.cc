#include "tests/parallel/mpi_testing.h"

#include <mpi.h>

#include <cstdlib>

#include "parallel/launch.h"

namespace tessel::parallel::testing {

void MpiTest::TearDown() {
  int failed_here = HasFailure() ? 1 : 0;
  int failed_anywhere = 0;
  MPI_Allreduce(&failed_here, &failed_anywhere, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (failed_anywhere && !failed_here) {
    ADD_FAILURE() << "this test failed on another rank (its output is tagged with its rank)";
  }
}

const std::shared_ptr<MpiCommunicator>& MpiTest::shared_world() {
  static std::shared_ptr<MpiCommunicator> world = [] {
    CommOptions options;
    if (std::getenv("TESSEL_COLLECTIVE_TIMEOUT_S") == nullptr) options.timeout_s(120);
    return MpiCommunicator::world(options.name("world"));
  }();
  return world;
}

}  // namespace tessel::parallel::testing

int main(int argc, char** argv) {
  return tessel::parallel::run_ranks(argc, argv, [](int count, char** arguments) {
    ::testing::InitGoogleTest(&count, arguments);
    return RUN_ALL_TESTS();
  });
}
