#include "parallel/launch.h"

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <thread>

#include "core/error.h"
#include "core/threading.h"

namespace tessel::parallel {

namespace {
bool mpi_active() {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

// The value of --threads N / --threads=N, or 0 when absent.
int threads_flag(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const char* value = nullptr;
    if (std::strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
      value = argv[i + 1];
    } else if (std::strncmp(argv[i], "--threads=", 10) == 0) {
      value = argv[i] + 10;
    }
    if (value == nullptr) continue;
    char* end = nullptr;
    long threads = std::strtol(value, &end, 10);
    TESSEL_CHECK(end != value && *end == '\0' && threads >= 1 && threads <= 4096,
                 "--threads: expected a positive thread count, got '", value, "'");
    return static_cast<int>(threads);
  }
  return 0;
}
}  // namespace

int world_rank() {
  if (!mpi_active()) return 0;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

int world_size() {
  if (!mpi_active()) return 1;
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

bool is_main_rank() { return world_rank() == 0; }

int local_rank_count() {
  if (!mpi_active()) return 1;
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int count = 1;
  MPI_Comm_size(node, &count);
  MPI_Comm_free(&node);
  return count;
}

int default_threads_per_rank() {
  int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / local_rank_count());
}

void abort_job(const char* message) {
  std::fprintf(stderr, "rank %d: %s\n", world_rank(), message);
  std::fflush(stderr);
  if (mpi_active()) MPI_Abort(MPI_COMM_WORLD, 1);
  std::exit(1);
}

int run_ranks(int argc, char** argv, const std::function<int(int, char**)>& program) {
  if (!mpi_active()) {
    int provided = 0;
    if (MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
      std::fprintf(stderr, "run_ranks: MPI_Init_thread failed\n");
      return 1;
    }
  }
  int code = 0;
  try {
    int threads = threads_flag(argc, argv);
    set_num_threads(threads > 0 ? threads : default_threads_per_rank());
    code = program(argc, argv);
  } catch (const std::exception& error) {
    abort_job(error.what());
  } catch (...) {
    abort_job("an unknown exception escaped the program");
  }
  MPI_Finalize();
  return code;
}

}  // namespace tessel::parallel
