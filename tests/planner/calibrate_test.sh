#!/usr/bin/env bash
# calibrate measures a profile that plan accepts: once as one process (collectives copied from
# the base profile, and the file says so) and once under mpirun -np 2 (collectives measured).
# Usage: calibrate_test.sh CALIBRATE PLAN
set -euo pipefail
calibrate="$PWD/$1"
plan="$PWD/$2"
dir="${TEST_TMPDIR:-/tmp}"
export OMPI_MCA_rmaps_base_oversubscribe=yes
# Each mpirun gets a directory of its own for its session files and shared-memory segments:
# tests run at once share /tmp and /dev/shm, and mpiruns whose pids are equal in their
# sandboxes' namespaces would otherwise share them (segfaults in the shared-memory transport).
# A short path: OpenMPI's Unix socket paths must stay under 108 characters.
mpi_dir=$(mktemp -d /tmp/ompi.XXXXXX)
trap 'rm -rf "$mpi_dir"' EXIT
export OMPI_MCA_orte_tmpdir_base="$mpi_dir" OMPI_MCA_btl_vader_backing_directory="$mpi_dir"
# OpenMPI leaks its own buffers at exit; under --config=asan only that would be reported.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"

"$calibrate" --quick --threads=1 --out="$dir/one.json"
grep -q '"gemm"' "$dir/one.json"
grep -q 'not measured (one rank)' "$dir/one.json"
# Per-kind rates and the layout they were measured under.
grep -q '"conv_grouped"' "$dir/one.json"
grep -q '"adam_update"' "$dir/one.json"
# The vocabulary-split loss as it runs (its decomposition over a group of the rank alone).
grep -q '"vocab_loss"' "$dir/one.json"
grep -q '"ranks_at_once": 1' "$dir/one.json"

# With --shapes_of, a model's convolutions are also timed at every local shape the planner prices.
mpirun --allow-run-as-root --oversubscribe -np 2 "$calibrate" --quick --threads=1 \
  --out="$dir/two.json" --shapes_of=resnet18 --batch=4 --image_size=32 --num_classes=10
grep -q 'MpiCommunicator over 2 ranks' "$dir/two.json"
grep -q '"ranks_at_once": 2' "$dir/two.json"
grep -q '"sync_exponent"' "$dir/two.json"
grep -q 'per ring step (least squares)' "$dir/two.json"
grep -q '"conv2d \[2, 64, 8, 8\]' "$dir/two.json"
grep -q 'local calls of the convolutions and linear layers of resnet18' "$dir/two.json"
grep -q 'each pass after writing as many bytes as' "$dir/two.json"
"$plan" --model=resnet18 --devices=2 --batch=4 --image_size=32 --num_classes=10 \
  --profile="$dir/two.json" > "$dir/resnet.txt"
grep -q -- '<- chosen' "$dir/resnet.txt"

for profile in one two; do
  "$plan" --model=bert_tiny --devices=2 --batch=4 --seq=16 --profile="$dir/$profile.json" \
    > "$dir/$profile.txt"
  grep -q -- '<- chosen' "$dir/$profile.txt"
done
# The plan says which profile it used and under which layout that profile was measured; a plan
# for one rank priced with the profile of 2 ranks sharing the cores says so.
grep -q 'compute measured with 2 ranks x 1 thread at once' "$dir/two.txt"
grep -q 'compute measured with 1 rank x 1 thread' "$dir/one.txt"
"$plan" --model=bert_tiny --devices=1 --batch=4 --seq=16 --profile="$dir/two.json" \
  > "$dir/single.txt"
grep -q 'note: this plan puts 1 rank(s) on a node' "$dir/single.txt"
echo "calibrate_test: PASS"
