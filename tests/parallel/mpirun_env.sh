# Sourced by the sh_tests here that start mpirun themselves: `binary` (their first argument) made
# absolute, and the environment tools/mpirun_test.sh sets up for MPI tests on this machine.
binary=$1
case "$binary" in
  /*) ;;
  *) binary="$PWD/$binary" ;;
esac
export OMPI_MCA_rmaps_base_oversubscribe=yes
# Each mpirun gets a directory of its own for its session files and shared-memory segments:
# tests run at once share /tmp and /dev/shm, and mpiruns whose pids are equal in their
# sandboxes' namespaces would otherwise share them (segfaults in the shared-memory transport).
# A short path: OpenMPI's Unix socket paths must stay under 108 characters.
mpi_dir=$(mktemp -d /tmp/ompi.XXXXXX)
trap 'rm -rf "$mpi_dir"' EXIT
export OMPI_MCA_orte_tmpdir_base="$mpi_dir" OMPI_MCA_btl_vader_backing_directory="$mpi_dir"
export OMP_NUM_THREADS=1
if [ -n "${ASAN_OPTIONS:-}" ]; then
  export ASAN_OPTIONS="$ASAN_OPTIONS:detect_leaks=0"
fi
