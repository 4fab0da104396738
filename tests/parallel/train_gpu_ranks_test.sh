#!/usr/bin/env bash
# The train binary under mpirun -np 2 with --device=cuda stops before training with a clear error
# on every rank and a failed job: in a build without --config=cuda it has no NCCL; with it but no
# GPU, no GPU is visible (for --dp=2 and --tp=2 alike: both need NCCL on GPUs); --device=cuda:1 is
# refused (each rank picks its GPU from its rank on the node).
# Usage: train_gpu_ranks_test.sh TRAIN_BINARY
set -uo pipefail

# shellcheck source=tests/parallel/mpirun_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/mpirun_env.sh"
log="${TEST_TMPDIR:-/tmp}/train_gpu_ranks.log"

failures=0
# expect NAME PATTERN ARGS...: the job fails, stderr matches PATTERN (grep -E), no step trained.
expect() {
  local name=$1 pattern=$2
  shift 2
  timeout 120 mpirun --allow-run-as-root --oversubscribe -np 2 "$binary" --threads=1 "$@" \
    > "$log" 2>&1
  local status=$?
  if [ "$status" -eq 0 ]; then
    echo "FAIL ($name): the job exited 0" >&2
    failures=$((failures + 1))
  elif [ "$status" -eq 124 ]; then
    echo "FAIL ($name): still running after 120 s" >&2
    failures=$((failures + 1))
  fi
  if ! grep -Eq "$pattern" "$log"; then
    echo "FAIL ($name): the output lacks /$pattern/; it was:" >&2
    cat "$log" >&2
    failures=$((failures + 1))
  elif grep -q "| epoch " "$log"; then
    echo "FAIL ($name): a training step ran; the output was:" >&2
    cat "$log" >&2
    failures=$((failures + 1))
  else
    echo "$name: exit status $status, $(grep -Em1 "$pattern" "$log")"
  fi
}

expect "dp=2" \
  "train: error: --device=cuda: .*(this binary has no NCCL: NCCL needs a --config=cuda build|no GPU is visible to this rank \(device_count\(\) == 0\))" \
  --recipe=mlp_fashion_mnist --device=cuda --dp=2
expect "tp=2" \
  "train: error: --device=cuda: .* as dp 1 x tp 2, .*(this binary has no NCCL: NCCL needs a --config=cuda build|no GPU is visible to this rank \(device_count\(\) == 0\))" \
  --recipe=resnet18_fashion_mnist --device=cuda --tp=2
expect "cuda:1" \
  "train: error: --device=cuda:1: under mpirun each rank picks its own GPU" \
  --recipe=mlp_fashion_mnist --device=cuda:1 --dp=2
exit "$failures"
