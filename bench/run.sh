#!/usr/bin/env bash
# Builds Tessel's CPU benchmarks and times each against the same shape in PyTorch with the same
# thread count, in interleaved rounds (bench/torch_compare.py), writing bench/results/cpu_ops.md
# (with the command that made it); then bench/compare_pytorch times whole training steps
# (bench/results/training_step.md).
# Usage: bench/run.sh [--threads N] [--min-time SECONDS] [--rounds N] [--filter REGEX]
#        [--max-wait SECONDS] [--force]   (or ./tessel bench ...). Defaults: 2 threads, 0.5 s,
#        10 rounds, every benchmark. Measures only on a quiet machine (bench/harness.py):
#        waits up to --max-wait (300 s), then refuses unless --force (the results say so).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
command_line="bench/run.sh${*:+ $*}"

threads=2
min_time=0.5
rounds=10
filter="."
max_wait=300
force=()
while [ $# -gt 0 ]; do
  case "$1" in
    --threads) threads=$2; shift 2 ;;
    --threads=*) threads=${1#*=}; shift ;;
    --min-time) min_time=$2; shift 2 ;;
    --min-time=*) min_time=${1#*=}; shift ;;
    --rounds) rounds=$2; shift 2 ;;
    --rounds=*) rounds=${1#*=}; shift ;;
    --filter) filter=$2; shift 2 ;;
    --filter=*) filter=${1#*=}; shift ;;
    --max-wait) max_wait=$2; shift 2 ;;
    --max-wait=*) max_wait=${1#*=}; shift ;;
    --force) force=(--force); shift ;;
    -h | --help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done

bazel build //bench:gemm_bench //bench:conv_bench //bench:dropout_bench
machine=$(/usr/bin/python3 bench/harness.py quiet --max-wait "$max_wait" "${force[@]}")

# Some CPUs here have OPENBLAS_CORETYPE (and OPENBLAS_L2_SIZE) set so that old OpenBLAS builds
# run; they slow a current OpenBLAS down. Unset both for this comparison only; where OpenBLAS
# then picks a kernel without AVX2 on a CPU with it (an unknown model falls back to Prescott),
# OPENBLAS_CORETYPE=Haswell instead: the anchor is the AVX2 build. The script reports the kernel.
# OPENBLAS_THREAD_TIMEOUT=4: OpenBLAS's idle threads sleep at once instead of spinning through
# Tessel's rounds.
mkdir -p bench/results
coretype=$(/usr/bin/python3 bench/harness.py blas-coretype --threads "$threads")
env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE ${coretype:+OPENBLAS_CORETYPE=$coretype} \
  OPENBLAS_NUM_THREADS="$threads" \
  OPENBLAS_THREAD_TIMEOUT=4 OMP_NUM_THREADS="$threads" OMP_WAIT_POLICY=passive \
  /usr/bin/python3 bench/torch_compare.py --threads "$threads" --min-time "$min_time" \
  --rounds "$rounds" --filter "$filter" \
  --tessel-binary bazel-bin/bench/gemm_bench --tessel-binary bazel-bin/bench/conv_bench \
  --tessel-binary bazel-bin/bench/dropout_bench \
  --output bench/results/cpu_ops.md --command "$command_line" --machine "$machine"
echo "run.sh: wrote bench/results/cpu_ops.md" >&2

# Whole training steps against PyTorch (writes bench/results/training_step.md); skipped when
# --filter picks some of the op benchmarks.
if [ "$filter" = "." ]; then
  bench/compare_pytorch --threads "$threads" --max-wait "$max_wait" "${force[@]}"
fi
