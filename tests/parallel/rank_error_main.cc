// A job in which rank 1 throws a tessel::Error after one collective while the other ranks wait
// in the next one: run_ranks must print "rank 1: <message>" and end the whole job with a
// non-zero exit instead of leaving them waiting. Driven by rank_error_test.sh.
#include "core/error.h"
#include "ops/ops.h"
#include "parallel/launch.h"
#include "parallel/mpi_communicator.h"

int main(int argc, char** argv) {
  using namespace tessel;
  return parallel::run_ranks(argc, argv, [](int, char**) {
    auto world = parallel::MpiCommunicator::world();
    Tensor tensor = ones({4});
    world->all_reduce(tensor);
    TESSEL_CHECK(world->rank() != 1, "deliberate failure on rank ", world->rank(),
                 " after all_reduce gave ", tensor.to_vector<float>()[0]);
    world->all_reduce(tensor);  // never completes: rank 1 is gone
    return 0;
  });
}
