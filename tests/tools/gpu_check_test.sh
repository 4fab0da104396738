#!/usr/bin/env bash
# tools/gpu_check.sh run on this CPU machine, against stand-in binaries (shell scripts that print
# what GoogleTest prints) in a bundle folder of their own:
#   - a smoke binary that sees no device stops the run: exit non-zero, "no GPU" in summary.md,
#     env.txt written, no test started;
#   - a hanging test is stopped by the per-entry timeout, a hanging bench line by the deadline,
#     what comes after is "not run: deadline", and summary.md counts passed, failed, skipped and
#     not run (parameterized names too); a binary whose tests all skipped is not ok;
#   - test binaries get TESSEL_REQUIRE_GPU=1 and the bundle's library folder, bench lines do not;
#   - a run killed part way leaves summary.md with the entries finished so far;
#   - --rerun runs one binary with --gtest-filter and CUDA_LAUNCH_BLOCKING=1; a run where all
#     passes exits 0.
# Usage: gpu_check_test.sh path/to/tools/gpu_check.sh
set -euo pipefail

script=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
work=$(mktemp -d "${TEST_TMPDIR:-/tmp}/gpu_check_test.XXXXXX")
marks="$work/marks" # stand-ins leave a file here when they run
mkdir -p "$marks"

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# $1 file, $2 text it must hold (fixed string).
expect_in() {
  grep -qF -- "$2" "$1" || {
    echo "--- $1:" >&2
    cat "$1" >&2
    fail "'$2' is not in $1"
  }
}

expect_not_in() {
  if grep -qF -- "$2" "$1"; then
    echo "--- $1:" >&2
    cat "$1" >&2
    fail "'$2' is in $1"
  fi
}

# A stand-in at $1 (bundle/tests/name) whose body is $2; it marks that it ran and records its
# arguments and environment.
stand_in() {
  mkdir -p "$(dirname "$1")"
  {
    echo '#!/usr/bin/env bash'
    echo "name=\$(basename \"\$0\"); marks='$marks'"
    echo 'echo "$*" >"$marks/$name.args"'
    echo 'echo "${LD_LIBRARY_PATH:-}" >"$marks/$name.path"'
    echo 'echo "${TESSEL_REQUIRE_GPU:-unset} ${CUDA_LAUNCH_BLOCKING:-unset}" >"$marks/$name.env"'
    echo "$2"
  } >"$1"
  chmod +x "$1"
}

smoke_without_gpu='[ "${1:-}" = --versions ] && { echo "CUDA driver:  none (stand-in)"; exit 0; }
echo "no GPU: cudaGetDeviceCount: cudaErrorNoDevice (no CUDA-capable device is detected)"
exit 2'
smoke_with_gpu='[ "${1:-}" = --versions ] && { echo "CUDA driver:  13.0 (stand-in)"; exit 0; }
echo "device 0: Stand-in H200, compute capability 9.0, 139.8 GiB"
echo "ok    own kernel: axpy"
echo "gpu_smoke: all 5 checks passed"'
passing='echo "[==========] Running 2 tests from 1 test suite."
echo "[ RUN      ] Suite.First"
echo "[       OK ] Suite.First (1 ms)"
echo "[ RUN      ] Zoo/Param.Case/resnet18_dtr"
echo "[       OK ] Zoo/Param.Case/resnet18_dtr (2 ms)"
echo "[  PASSED  ] 2 tests."'
# One test passes, the next hangs; a third never starts.
hanging='echo "[==========] Running 3 tests from 1 test suite."
echo "[ RUN      ] Transfer.First"
echo "[       OK ] Transfer.First (1 ms)"
echo "[ RUN      ] Transfer.Hangs"
exec sleep 300'
all_skipped='echo "[==========] Running 1 test from 1 test suite."
echo "[ RUN      ] Alloc.NeedsAGpu"
echo "[  SKIPPED ] Alloc.NeedsAGpu (0 ms)"
echo "[  SKIPPED ] 1 test, listed below:"
echo "[  SKIPPED ] Alloc.NeedsAGpu"'
one_param_fails='echo "[==========] Running 2 tests from 1 test suite."
echo "[ RUN      ] Zoo/Ops.Match/bert_swap"
echo "ops_check_test.cc:10: Failure"
echo "[  FAILED  ] Zoo/Ops.Match/bert_swap, where GetParam() = 4-byte object <01-00 00-00> (3 ms)"
echo "[ RUN      ] Zoo/Ops.Match/mlp_none"
echo "[       OK ] Zoo/Ops.Match/mlp_none (1 ms)"
echo "[  FAILED  ] 1 test, listed below:"
echo "[  FAILED  ] Zoo/Ops.Match/bert_swap, where GetParam() = 4-byte object <01-00 00-00>"
exit 1'
# Passes only when run under TESSEL_REQUIRE_GPU=1, as gpu_check.sh runs every test.
requires_gpu_variable='echo "[==========] Running 1 test from 1 test suite."
echo "[ RUN      ] Blas.Gemm"
if [ "${TESSEL_REQUIRE_GPU:-}" = 1 ]; then echo "[       OK ] Blas.Gemm (1 ms)"; exit 0; fi
echo "[  FAILED  ] Blas.Gemm (1 ms)"
exit 1'

run_check() { # out folder, then gpu_check.sh run's arguments; sets rc
  local out=$1
  shift
  rc=0
  "$script" run --out "$out" --python /bin/true "$@" >"$out.stdout" 2>&1 || rc=$?
}

# --- no GPU: the run stops after env.txt and the smoke check ----------------------------------
bundle="$work/no_gpu"
stand_in "$bundle/tools/gpu_smoke" "$smoke_without_gpu"
stand_in "$bundle/tests/runtime_test" "$passing"
stand_in "$bundle/tests/nccl_smoke_test" "$passing"
printf 'bench_line | - | touch "%s/bench_line_ran"\n' "$marks" >"$work/no_gpu_commands.txt"
run_check "$work/out_no_gpu" --bundle "$bundle" --commands "$work/no_gpu_commands.txt"
[ "$rc" -ne 0 ] || fail "a run without a GPU exited 0"
summary="$work/out_no_gpu/summary.md"
expect_in "$summary" "no GPU"
expect_in "$summary" "cudaErrorNoDevice"
expect_in "$summary" "| runtime_test | not run: no GPU |"
expect_in "$summary" "| nccl_smoke_test | not run: no GPU |"
expect_in "$summary" "| bench: bench_line | not run: no GPU |"
expect_in "$work/out_no_gpu/env.txt" "## nvidia-smi"
expect_in "$work/out_no_gpu/env.txt" "CUDA driver:  none (stand-in)"
expect_in "$work/out_no_gpu/env.txt" "## ldd of every binary"
expect_in "$work/out_no_gpu/env.txt" "tests/runtime_test:"
expect_in "$work/out_no_gpu/env.txt" "## Python and PyTorch"
[ ! -e "$marks/runtime_test.args" ] || fail "a test ran although the smoke check saw no GPU"
[ ! -e "$marks/bench_line_ran" ] || fail "a bench line ran although the smoke check saw no GPU"

# --- timeouts, the deadline, counts -----------------------------------------------------------
bundle="$work/gpu"
stand_in "$bundle/tools/gpu_smoke" "$smoke_with_gpu"
stand_in "$bundle/tests/runtime_test" "$passing"
stand_in "$bundle/tests/transfer_test" "$hanging"
stand_in "$bundle/tests/allocator_test" "$all_skipped"
stand_in "$bundle/tests/ops_check_test" "$one_param_fails"
stand_in "$bundle/tests/blas_cudnn_test" "$requires_gpu_variable"
cat >"$work/commands.txt" <<EOF
# comment lines and blank lines are skipped

environment | - | echo "\${LD_LIBRARY_PATH:-}" >"$marks/bench_path"; echo row >"\$GPU_CHECK_RESULTS/table.md"
endless | 300 | sleep 300
after_the_deadline | - | touch "$marks/after_the_deadline_ran"
EOF
deadline=40
started=$(date +%s)
run_check "$work/out_gpu" --bundle "$bundle" --commands "$work/commands.txt" --timeout 2 \
  --deadline "$deadline"
took=$(($(date +%s) - started))
[ "$rc" -ne 0 ] || fail "a run with failures exited 0"
[ "$took" -lt $((deadline + 30)) ] || fail "the run took ${took}s with a deadline of ${deadline}s"
summary="$work/out_gpu/summary.md"
expect_in "$summary" "NOT OK"
expect_in "$summary" "smoke check: ok (Stand-in H200"
expect_in "$summary" "| runtime_test | ok | 2 | 0 | 0 | 0 |"
expect_in "$summary" "| transfer_test | TIMEOUT | 1 | 1 | 0 | 1 |"
expect_in "$summary" "stopped in Transfer.Hangs"
expect_in "$summary" "| allocator_test | not ok: all skipped | 0 | 0 | 1 | 0 |"
expect_in "$summary" "| ops_check_test | FAIL (exit 1) | 1 | 1 | 0 | 0 |"
expect_in "$summary" "failed: Zoo/Ops.Match/bert_swap"
expect_in "$summary" "| blas_cudnn_test | ok | 1 | 0 | 0 | 0 |"
expect_in "$summary" "| bench: environment | ok |"
expect_in "$summary" "| bench: endless | TIMEOUT (deadline) |"
expect_in "$summary" "| bench: after_the_deadline | not run: deadline |"
expect_in "$summary" "tests: 5 passed, 2 failed, 1 skipped, 1 not run"
# The order: runtime before transfer before allocator before ops_check before blas_cudnn.
order=$(grep -oE '\| [a-z_]+_test \|' "$summary" | tr -d '| ' | paste -sd' ' -)
[ "$order" = "runtime_test transfer_test allocator_test ops_check_test blas_cudnn_test" ] ||
  fail "entries in the order '$order'"
[ ! -e "$marks/after_the_deadline_ran" ] || fail "an entry started after the deadline"
[ "$(cat "$marks/blas_cudnn_test.env")" = "1 unset" ] || fail "TESSEL_REQUIRE_GPU not exported"
expect_in "$marks/runtime_test.path" "$bundle/unpacked/use"
expect_not_in "$marks/bench_path" "$bundle/unpacked"
expect_in "$work/out_gpu/bench_table.md" "row"
tar -tzf "$work/out_gpu/logs.tar.gz" >"$work/archive.txt"
expect_in "$work/archive.txt" "logs/transfer_test.log"
expect_in "$work/archive.txt" "logs/gpu_smoke.log"
[ "$(find "$work/out_gpu" -type f | wc -l)" -le 8 ] || fail "more than 8 files in the output folder"

# --- killed part way: summary.md holds what finished ------------------------------------------
"$script" run --out "$work/out_killed" --python /bin/true --bundle "$bundle" \
  --commands /dev/null --timeout 8 >"$work/out_killed.stdout" 2>&1 &
pid=$!
for _ in $(seq 1 200); do
  grep -qF "| transfer_test | running |" "$work/out_killed/summary.md" 2>/dev/null && break
  sleep 0.3
done
kill "$pid"
wait "$pid" 2>/dev/null || true
summary="$work/out_killed/summary.md"
expect_in "$summary" "IN PROGRESS"
expect_in "$summary" "| runtime_test | ok | 2 | 0 | 0 | 0 |"
expect_in "$summary" "| transfer_test | running |"
expect_in "$summary" "| ops_check_test | not run yet |"
tar -tzf "$work/out_killed/logs.tar.gz" >"$work/killed_archive.txt"
expect_in "$work/killed_archive.txt" "logs/runtime_test.log"

# --- --rerun, and a run where everything passes ------------------------------------------------
rm -f "$marks"/runtime_test.*
run_check "$work/out_rerun" --bundle "$bundle" --commands /dev/null --rerun runtime_test \
  --gtest-filter 'Suite.*' --launch-blocking
[ "$rc" -eq 0 ] || fail "--rerun of a passing binary exited $rc"
expect_in "$work/out_rerun/summary.md" "rerun of runtime_test"
expect_in "$work/out_rerun/summary.md" "| runtime_test | ok |"
[ "$(grep -c '^| [0-9]' "$work/out_rerun/summary.md")" -eq 1 ] || fail "--rerun ran more than one entry"
expect_in "$marks/runtime_test.args" "--gtest_filter=Suite.*"
[ "$(cat "$marks/runtime_test.env")" = "1 1" ] || fail "--launch-blocking did not set CUDA_LAUNCH_BLOCKING=1"

run_check "$work/out_ok" --bundle "$bundle" --commands "$work/commands.txt" \
  --filter '^(runtime_test|blas_cudnn_test|environment)$'
[ "$rc" -eq 0 ] || fail "a run where every entry passed exited $rc"
expect_in "$work/out_ok/summary.md" "ALL OK: 3 entries ran and passed"

echo "PASS"
