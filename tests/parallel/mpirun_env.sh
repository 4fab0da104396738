# Sourced by the sh_tests here that start mpirun themselves: `binary` (their first argument) made
# absolute, and the environment tools/mpirun_test.sh sets up for MPI tests on this machine.
binary=$1
case "$binary" in
  /*) ;;
  *) binary="$PWD/$binary" ;;
esac
export OMPI_MCA_rmaps_base_oversubscribe=yes
export OMPI_MCA_orte_tmpdir_base=/tmp
export OMP_NUM_THREADS=1
if [ -n "${ASAN_OPTIONS:-}" ]; then
  export ASAN_OPTIONS="$ASAN_OPTIONS:detect_leaks=0"
fi
