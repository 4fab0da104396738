#!/usr/bin/env bash
# A rank killed (SIGKILL) mid-epoch under mpirun -np 2 - data parallel, tensor parallel, and
# while rank 0 writes a checkpoint - ends the whole job: every other rank is gone within the
# time limit, the job's exit status is non-zero, the output names the dead rank, and the newest
# complete checkpoint resumes (a second job continues from it and finishes).
# Usage: rank_death_test.sh TRAIN_BINARY
set -uo pipefail

# shellcheck source=tests/parallel/mpirun_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/mpirun_env.sh"
work="${TEST_TMPDIR:-/tmp}/rank_death_test"
rm -rf "$work"
mkdir -p "$work"
# Marks this test's ranks so the kill finds them and nothing else.
export TESSEL_RANK_DEATH_MARK="rank_death_$$"
real_binary=$(readlink -f "$binary")

failures=0
fail() {
  echo "FAIL ($1): $2" >&2
  [ -n "${3:-}" ] && [ -f "$3" ] && tail -n 40 "$3" >&2
  failures=$((failures + 1))
}

# The pid of this test's rank RANK (from the environment mpirun gives each rank).
rank_pid() {
  local rank=$1 environ pid
  for environ in /proc/[0-9]*/environ; do
    pid=${environ#/proc/}
    pid=${pid%/environ}
    # The rank itself, not a shell mpirun started it through.
    [[ "/proc/$pid/exe" -ef "$real_binary" ]] || continue
    if grep -qzx "TESSEL_RANK_DEATH_MARK=$TESSEL_RANK_DEATH_MARK" "$environ" 2>/dev/null &&
      grep -qzx "OMPI_COMM_WORLD_RANK=$rank" "$environ" 2>/dev/null; then
      echo "$pid"
      return 0
    fi
  done
  return 1
}

# The ranks of this test still running, for failure messages.
list_ranks() {
  local rank pid
  for rank in 0 1; do
    pid=$(rank_pid "$rank") && echo "rank $rank: pid $pid" || echo "rank $rank: not running"
  done
}

latest_step() {
  local name
  name=$(cat "$1/latest" 2>/dev/null) || return 1
  echo "${name#step_}"
}

# scenario NAME KILL_RANK WHEN TRAIN_FLAGS...: WHEN is "step" (after the second checkpoint) or
# "save" (the moment rank 0 has a checkpoint file half written, else after the second one).
scenario() {
  local name=$1 kill_rank=$2 when=$3 failures_before=$failures
  shift 3
  local dir="$work/$name" log="$work/$name.log" resume_log="$work/$name.resume.log"
  mkdir -p "$dir"
  mpirun --allow-run-as-root --oversubscribe -np 2 "$binary" --threads=1 --log_every=1 \
    --checkpoint_dir="$dir/ckpt" --checkpoint_every=2 --steps=400 "$@" >"$log" 2>&1 &
  local job=$!

  local waited=0 saw_write=0 step
  while :; do
    step=$(latest_step "$dir/ckpt" || echo 0)
    if [ "$when" = save ] && [ "$step" -ge 2 ] &&
      find "$dir/ckpt" -name '*.tmp.*' 2>/dev/null | grep -q .; then
      saw_write=1
      break
    fi
    [ "$when" = step ] && [ "$step" -ge 4 ] && break
    [ "$when" = save ] && [ "$step" -ge 8 ] && break
    if ! kill -0 "$job" 2>/dev/null; then
      fail "$name" "the job ended before the kill" "$log"
      return
    fi
    sleep 0.01
    waited=$((waited + 1))
    if [ "$waited" -gt 24000 ]; then
      fail "$name" "no second checkpoint after 240 s" "$log"
      kill -9 "$job"
      return
    fi
  done
  local pid
  pid=$(rank_pid "$kill_rank") || {
    fail "$name" "rank $kill_rank's process not found ($(list_ranks | paste -sd ';'); job \
$(kill -0 "$job" 2>/dev/null && echo running || echo ended))" "$log"
    kill -9 "$job" 2>/dev/null
    return
  }
  kill -9 "$pid"
  local killed_at
  killed_at=$(date +%s)

  local status=0
  wait "$job" || status=$?
  local seconds=$(($(date +%s) - killed_at))
  [ "$status" -ne 0 ] || fail "$name" "the job exited 0 after rank $kill_rank was killed" "$log"
  [ "$seconds" -le 60 ] || fail "$name" "the other rank took ${seconds}s to end"
  grep -Eq "rank $kill_rank .*(exited on signal 9|Killed)" "$log" ||
    fail "$name" "the output does not name rank $kill_rank as killed" "$log"
  # No rank of the job may outlive it.
  if rank_pid 0 >/dev/null || rank_pid 1 >/dev/null; then
    fail "$name" "a rank is still running after the job ended"
  fi

  local saved
  saved=$(latest_step "$dir/ckpt") || {
    fail "$name" "no complete checkpoint after the kill"
    return
  }
  local target=$((saved + 4))
  timeout 300 mpirun --allow-run-as-root --oversubscribe -np 2 "$binary" --threads=1 \
    --log_every=1 --checkpoint_dir="$dir/ckpt" --checkpoint_every=2 --resume "$@" \
    --steps="$target" >"$resume_log" 2>&1 || fail "$name" "resuming failed" "$resume_log"
  grep -q "resumed from .*step_$saved at step $saved" "$resume_log" ||
    fail "$name" "the resumed run did not start from step_$saved" "$resume_log"
  [ "$(latest_step "$dir/ckpt")" = "$target" ] ||
    fail "$name" "the resumed run did not reach step $target" "$resume_log"
  [ "$failures" -eq "$failures_before" ] || return
  echo "$name: killed rank $kill_rank $([ "$saw_write" = 1 ] && echo 'during a checkpoint write' ||
    echo 'mid-epoch'), job status $status after ${seconds}s, resumed from step $saved to $target"
}

# A small Fashion-MNIST-shaped data set (IDX files): loading the real one would take most of the
# test's time.
/usr/bin/python3 - "$work/data" <<'PY'
import os, random, struct, sys
folder = sys.argv[1]
os.makedirs(folder, exist_ok=True)
random.seed(0)
for split, count in (("train", 512), ("t10k", 64)):
    labels = [i % 10 for i in range(count)]
    with open(os.path.join(folder, f"{split}-images-idx3-ubyte"), "wb") as images:
        images.write(struct.pack(">IIII", 0x803, count, 28, 28))
        for label in labels:
            images.write(bytes((160 if row // 3 == label else 0) + random.randrange(96)
                               for row in range(28) for _ in range(28)))
    with open(os.path.join(folder, f"{split}-labels-idx1-ubyte"), "wb") as out:
        out.write(struct.pack(">II", 0x801, count) + bytes(labels))
PY

mlp=(--recipe=mlp_fashion_mnist --data="$work/data" --batch_size=32)
resnet=(--recipe=resnet18_fashion_mnist --data="$work/data" --batch_size=8)
scenario dp_rank1 1 step "${mlp[@]}" --dp=2
scenario tp_rank1 1 step "${resnet[@]}" --tp=2
scenario dp_rank0_saving 0 save "${resnet[@]}" --dp=2
exit "$failures"
