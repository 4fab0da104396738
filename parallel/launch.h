// Launch helpers for programs started with mpirun (one rank per device; several nodes with
// `mpirun -H` or a hostfile). run_ranks initialises MPI, gives each rank its share of the cores
// and turns an error on any rank into "rank R: <message>" on stderr and a failed job.
//   int main(int argc, char** argv) { return tessel::parallel::run_ranks(argc, argv, train); }
#pragma once

#include <functional>

namespace tessel::parallel {

// Runs `program(argc, argv)` on this rank between MPI_Init_thread (funneled) and MPI_Finalize
// and returns its exit code. Threads per rank: --threads N (or --threads=N) in argv when given,
// else default_threads_per_rank(). A tessel::Error (or any std::exception) escaping `program`
// is printed as "rank R: <message>" to stderr and ends the whole job with MPI_Abort(1), so no
// rank is left waiting in a collective.
int run_ranks(int argc, char** argv, const std::function<int(int, char**)>& program);

// MPI_COMM_WORLD rank and size; 0 and 1 when MPI is not initialised (a plain single process).
int world_rank();
int world_size();
// Rank 0 alone prints progress and writes metrics and checkpoints.
bool is_main_rank();
// Ranks of this job on this node (MPI_Comm_split_type shared memory); 1 without MPI.
int local_rank_count();
// max(1, cores of this node / ranks on this node).
int default_threads_per_rank();
// Prints "rank R: <message>" to stderr and aborts the job with exit code 1.
[[noreturn]] void abort_job(const char* message);

}  // namespace tessel::parallel
