#!/usr/bin/env bash
# An error on one rank ends the whole job: mpirun exits non-zero and stderr holds the failing
# rank's message as run_ranks prints it ("rank 1: deliberate failure ...").
# Usage: rank_error_test.sh BINARY
set -uo pipefail

# shellcheck source=tests/parallel/mpirun_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/mpirun_env.sh"
log="${TEST_TMPDIR:-/tmp}/rank_error_stderr.log"

failures=0
for np in 2 4; do
  # The other ranks would wait 300 s in their collective; the abort must end them long before.
  timeout 120 mpirun --allow-run-as-root --oversubscribe -np "$np" "$binary" 2> "$log" > /dev/null
  status=$?
  if [ "$status" -eq 0 ]; then
    echo "FAIL (np $np): the job exited 0 although rank 1 threw" >&2
    failures=$((failures + 1))
  elif [ "$status" -eq 124 ]; then
    echo "FAIL (np $np): the job was still running after 120 s (the other ranks hung)" >&2
    failures=$((failures + 1))
  fi
  if grep -q "^rank 1: deliberate failure on rank 1 after all_reduce gave $np" "$log"; then
    echo "np $np: exit status $status, rank 1's message printed"
  else
    echo "FAIL (np $np): stderr lacks 'rank 1: deliberate failure on rank 1 ...'; it was:" >&2
    cat "$log" >&2
    failures=$((failures + 1))
  fi
done
exit "$failures"
