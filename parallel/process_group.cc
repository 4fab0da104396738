#include "parallel/process_group.h"

#include "core/error.h"

namespace tessel::parallel {

namespace {
// Splits `comm` by `color` (ordered by `key`) into a new communicator wrapped for Tessel; the
// MPI communicator from the split is duplicated by MpiCommunicator and freed here.
std::shared_ptr<MpiCommunicator> split(MPI_Comm comm, int color, int key, CommOptions options) {
  MPI_Comm part = MPI_COMM_NULL;
  int code = MPI_Comm_split(comm, color, key, &part);
  TESSEL_CHECK(code == MPI_SUCCESS, "ProcessGrid: MPI_Comm_split failed for group '",
               options.name(), "'");
  auto communicator = std::make_shared<MpiCommunicator>(part, options);
  MPI_Comm_free(&part);
  return communicator;
}
}  // namespace

ProcessGrid::ProcessGrid(int dp, int tp, CommOptions options, MPI_Comm world, Device device)
    : dp_size_(dp), tp_size_(tp) {
  TESSEL_CHECK(dp >= 1 && tp >= 1, "ProcessGrid: dp and tp must be at least 1, got dp ", dp,
               " and tp ", tp);
  auto world_communicator = std::make_shared<MpiCommunicator>(world, options.name("world"));
  int ranks = world_communicator->size();
  TESSEL_CHECK(static_cast<int64_t>(dp) * tp == ranks, "ProcessGrid: dp (", dp, ") x tp (", tp,
               ") = ", static_cast<int64_t>(dp) * tp, " but the job has ", ranks,
               " ranks; choose dp and tp whose product is the number of ranks (mpirun -np)");
  int rank = world_communicator->rank();
  dp_index_ = rank / tp;
  tp_index_ = rank % tp;
  MPI_Comm base = world_communicator->mpi_comm();
  std::shared_ptr<MpiCommunicator> data_parallel =
      split(base, tp_index_, dp_index_, options.name("dp"));
  std::shared_ptr<MpiCommunicator> tensor_parallel =
      split(base, dp_index_, tp_index_, options.name("tp"));
  world_ = std::move(world_communicator);
  // Same ranks, same order: a device communicator is built over its group's own MPI comm. Every
  // rank makes the dp one, then the tp one, so the collective creations pair up.
  auto on_device = [&](const std::shared_ptr<MpiCommunicator>& group, const char* name) {
    return device.is_cpu()
               ? std::shared_ptr<Communicator>(group)
               : make_device_communicator(group->mpi_comm(), device, options.name(name));
  };
  data_parallel_on_device_ = on_device(data_parallel, "dp");
  tensor_parallel_on_device_ = on_device(tensor_parallel, "tp");
  data_parallel_ = std::move(data_parallel);
  tensor_parallel_ = std::move(tensor_parallel);
}

}  // namespace tessel::parallel
