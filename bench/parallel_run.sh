#!/usr/bin/env bash
# The parallel benchmarks of bench/results/parallel.md (about 5-8 minutes on the 2-core VM):
#  1. scaling: ResNet-50 (128x128 images, 4 per rank) and BERT mini (seq 128, 8 sequences per rank)
#     at 1, 2 and 4 data-parallel ranks, plus BERT mini at tp=2 and dp=2 x tp=2;
#  2. the planner's chosen plans for resnet50, shufflenet_v2_x1_0 and bert_mini on 2 devices
#     (profile cpu_2core_example, and a profile calibrated at the start of the run), then each
#     plan run for its measured step time and peak memory.
# Every run prints one JSON line (bench/parallel_bench.cc); they are collected in $OUT.
# Usage: bench/parallel_run.sh [OUT.jsonl]   (FORCE=1: measure even on a busy machine, which the
# log then says; otherwise it waits up to 300 s for a quiet one, bench/harness.py, or refuses);
# the log's last line says how much CPU other processes used meanwhile.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/results/parallel_raw.jsonl}
plans=$(mktemp -d)
# SKIP_BUILD=1 uses the binaries already in bazel-bin.
if [ -z "${SKIP_BUILD:-}" ]; then
  bazel build //bench:parallel_bench //tools/plan >/dev/null
fi
force=()
[ -n "${FORCE:-}" ] && force=(--force)
machine=$(/usr/bin/python3 bench/harness.py quiet --max-wait 300 "${force[@]}")
export OMPI_MCA_rmaps_base_oversubscribe=yes
export OMPI_MCA_orte_tmpdir_base=/tmp
bench=bazel-bin/bench/parallel_bench
run() {
  local np=$1
  shift
  mpirun --allow-run-as-root --oversubscribe -np "$np" "$bench" "$@" | tee -a "$out"
}
: > "$out"
# Other work on the machine slows every rank: the load average goes into the log, start and end.
echo "# start $(date -u +%FT%TZ), load average $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores" >> "$out"
echo "# machine at the start: $machine" >> "$out"
# What else runs meanwhile goes into the log's last line.
. bench/watch.sh
watch_start "$plans"

for np in 1 2 4; do
  run "$np" --model=resnet50 --image_size=128 --batch_per_rank=4 --steps=3
done
for np in 1 2 4; do
  run "$np" --model=bert_mini --seq=128 --batch_per_rank=8 --steps=3
done
run 2 --model=bert_mini --seq=128 --batch=16 --tp=2 --steps=3
run 4 --model=bert_mini --seq=128 --batch=16 --dp=2 --tp=2 --steps=3

# The committed profile, and one calibrated now with 2 ranks of 1 thread measuring at once (the
# layout of the 2-rank runs below: every rank's throughput with the cores shared), and one with a
# single rank of 1 thread (the layout of the one-rank controls).
mpirun --allow-run-as-root --oversubscribe -np 2 bazel-bin/tools/calibrate/calibrate \
  --threads=1 --name=calibrated_now --out="$plans/calibrated_now.json" | tail -n 5 >&2
bazel-bin/tools/calibrate/calibrate --threads=1 --name=calibrated_now_one_rank \
  --out="$plans/calibrated_now_one_rank.json" | tail -n 3 >&2
plan() {
  local model=$1
  shift
  bazel-bin/tools/plan/plan --model="$model" --devices=2 --remat=1 \
    --out="$plans/$model.json" "$@" | tail -n 4 >&2
}
# Each model twice per profile: the plan the planner chose freely, and its best plan with
# --max_tp=1 (pure data parallelism, which the runtime executes as the planner prices it).
for profile in cpu_2core_example "$plans/calibrated_now.json"; do
  for limit in 0 1; do
    plan resnet50 --profile="$profile" --batch=8 --image_size=128 --optimizer=sgd_momentum \
      --max_tp=$limit
    run 2 --model=resnet50 --image_size=128 --batch=8 --plan="$plans/resnet50.json" --steps=3
    plan shufflenet_v2_x1_0 --profile="$profile" --batch=16 --image_size=128 \
      --optimizer=sgd_momentum --max_tp=$limit
    run 2 --model=shufflenet_v2_x1_0 --image_size=128 --batch=16 \
      --plan="$plans/shufflenet_v2_x1_0.json" --steps=3
    plan bert_mini --profile="$profile" --batch=16 --seq=128 --optimizer=adamw --max_tp=$limit
    run 2 --model=bert_mini --seq=128 --batch=16 --plan="$plans/bert_mini.json" --steps=3
  done
done
# Controls on the same models: one rank of one thread against the planner's 1-device plan priced
# with the one-rank profile, and two independent one-rank copies at once (no communication at
# all) against the same 1-device plan priced with the 2-rank profile (2 ranks sharing the cores).
control() {
  local model=$1 plan_args=$2 bench_args=$3
  # shellcheck disable=SC2086
  bazel-bin/tools/plan/plan --model="$model" --devices=1 --remat=1 \
    --profile="$plans/calibrated_now_one_rank.json" --out="$plans/$model.1.json" $plan_args |
    tail -n 4 >&2
  # shellcheck disable=SC2086
  bazel-bin/tools/plan/plan --model="$model" --devices=1 --remat=1 \
    --profile="$plans/calibrated_now.json" --out="$plans/$model.shared.json" $plan_args |
    tail -n 4 >&2
  # shellcheck disable=SC2086
  run 1 --model="$model" $bench_args --threads=1 --plan="$plans/$model.1.json" --steps=3
  local copies=()
  for copy in 1 2; do
    # shellcheck disable=SC2086
    mpirun --allow-run-as-root -np 1 "$bench" --model="$model" $bench_args --threads=1 \
      --steps=3 --plan="$plans/$model.shared.json" --label="independent copy $copy of 2" \
      > "$plans/copy$copy.json" &
    copies+=($!)
  done
  wait "${copies[@]}"
  cat "$plans/copy1.json" "$plans/copy2.json" | tee -a "$out"
}
control resnet50 "--batch=4 --image_size=128 --optimizer=sgd_momentum" \
  "--image_size=128 --batch=4"
control shufflenet_v2_x1_0 "--batch=8 --image_size=128 --optimizer=sgd_momentum" \
  "--image_size=128 --batch=8"
control bert_mini "--batch=8 --seq=128 --optimizer=adamw" "--seq=128 --batch=8"
watch_stop "$plans"
echo "# end $(date -u +%FT%TZ), load average $(cut -d' ' -f1-3 /proc/loadavg); $watch_line" >> "$out"
rm -rf "$plans"
