#!/usr/bin/env bash
# calibrate measures a profile that plan accepts: once as one process (collectives copied from
# the base profile, and the file says so) and once under mpirun -np 2 (collectives measured).
# Usage: calibrate_test.sh CALIBRATE PLAN
set -euo pipefail
calibrate="$PWD/$1"
plan="$PWD/$2"
dir="${TEST_TMPDIR:-/tmp}"
export OMPI_MCA_rmaps_base_oversubscribe=yes
export OMPI_MCA_orte_tmpdir_base=/tmp
# OpenMPI leaks its own buffers at exit; under --config=asan only that would be reported.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"

"$calibrate" --quick --threads=1 --out="$dir/one.json"
grep -q '"gemm"' "$dir/one.json"
grep -q 'not measured (one rank)' "$dir/one.json"

mpirun --allow-run-as-root --oversubscribe -np 2 "$calibrate" --quick --threads=1 \
  --out="$dir/two.json"
grep -q 'MpiCommunicator over 2 ranks' "$dir/two.json"

for profile in one two; do
  "$plan" --model=bert_tiny --devices=2 --batch=4 --seq=16 --profile="$dir/$profile.json" \
    > "$dir/$profile.txt"
  grep -q -- '<- chosen' "$dir/$profile.txt"
done
echo "calibrate_test: PASS"
