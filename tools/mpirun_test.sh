#!/usr/bin/env bash
# Runs a test binary as NP MPI ranks on this machine; the sh_test body behind
# tools/mpi_test.bzl, also usable by hand.
# Usage: tools/mpirun_test.sh NP BINARY [ARGS...]    ARGS (e.g. --gtest_filter=Mpi.*) go to every rank.
# Only rank 0 writes GoogleTest XML (Bazel's XML_OUTPUT_FILE), so each TEST is counted once;
# a failure on any other rank still fails the run through mpirun's exit status.
set -euo pipefail

if [ $# -lt 2 ]; then
  echo "usage: $0 NP BINARY [ARGS...]" >&2
  exit 2
fi
np=$1
binary=$2
shift 2
# mpirun looks a bare relative name up on PATH; give it an absolute path.
case "$binary" in
  /*) ;;
  *) binary="$PWD/$binary" ;;
esac

# More ranks than cores is normal here (np 2 and 4 on a 2-core machine).
export OMPI_MCA_rmaps_base_oversubscribe=yes
# Each mpirun gets a directory of its own under /tmp for its session files and shared-memory
# segments: tests run at once share /tmp and /dev/shm, and mpiruns whose pids are equal in their
# sandboxes' namespaces would otherwise share them (segfaults in the shared-memory transport). A
# short path, not Bazel's TMPDIR: OpenMPI's Unix socket paths must stay under 108 characters.
mpi_dir=$(mktemp -d /tmp/ompi.XXXXXX)
trap 'rm -rf "$mpi_dir"' EXIT
export OMPI_MCA_orte_tmpdir_base="$mpi_dir" OMPI_MCA_btl_vader_backing_directory="$mpi_dir"
# OpenMPI itself leaks at exit; under --config=asan that would fail every MPI test.
if [ -n "${ASAN_OPTIONS:-}" ]; then
  export ASAN_OPTIONS="$ASAN_OPTIONS:detect_leaks=0"
fi
# Split the cores between the ranks unless the caller chose a thread count.
if [ -z "${OMP_NUM_THREADS:-}" ]; then
  threads=$(($(nproc) / np))
  export OMP_NUM_THREADS=$((threads > 0 ? threads : 1))
fi

# Ranks other than 0 drop Bazel's XML and premature-exit files so they do not overwrite
# rank 0's results or race on the same marker.
mpirun --allow-run-as-root --oversubscribe --tag-output -np "$np" \
  bash -c 'if [ "${OMPI_COMM_WORLD_RANK:-0}" != 0 ]; then
             unset XML_OUTPUT_FILE GTEST_OUTPUT TEST_PREMATURE_EXIT_FILE
           fi
           exec "$@"' mpirun_test "$binary" "$@"
