#!/usr/bin/env bash
# GPU checks in two steps, for machines where the GPU machine has no Bazel:
#   tools/gpu_check.sh build   (here) builds every `gpu`-tagged test and the benchmark binaries
#                              that link //cuda:backend with --config=cuda, and puts them,
#                              stripped and xz-compressed, into gpu_bin/ (ignored by git; under
#                              64 MiB in all: each binary holds every kernel, ~9 MiB stripped).
#   tools/gpu_check.sh run     (on the GPU machine, from the repository root) unpacks them into
#                              gpu_bin/unpacked/, finds the CUDA libraries there (cuDNN 9, NCCL 2,
#                              cuBLAS) for LD_LIBRARY_PATH, runs every test binary, then each line
#                              of bench/gpu_commands.txt, and ends with one summary table.
# Options: build [--no-bench] [--with-train];  run [--timeout SECONDS] [--filter REGEX]
#          [--skip-bench] [--gtest-filter PATTERN]. Logs: gpu_bin/logs (GPU_CHECK_LOG_DIR), also
#          packed into $OUT/gpu_check_logs.tar.gz when $OUT is set.
# Bench commands file: one "label | shell command" per line (# comments); $GPU_BIN is the folder
# of the unpacked binaries (gpu_bin/unpacked: tests/ and bench/), $GPU_CHECK_LOG_DIR the logs
# folder: result tables (*.md, *.jsonl) written there also land in $OUT itself.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
bundle="$root/gpu_bin"
limit_bytes=$((64 * 1024 * 1024))

usage() { awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; }

cmd_build() {
  local with_bench=1 with_train=0
  while [ $# -gt 0 ]; do
    case "$1" in
      --no-bench) with_bench=0 ;;
      --with-train) with_train=1 ;;
      *) echo "gpu_check build: unknown argument '$1'" >&2; exit 2 ;;
    esac
    shift
  done
  [ -x /usr/local/cuda/bin/nvcc ] || { echo "gpu_check: /usr/local/cuda/bin/nvcc not found" >&2; exit 1; }

  local tests benches=""
  tests=$(bazel query --noshow_progress 'attr(tags, "\bgpu\b", kind("cc_test", //...))' 2>/dev/null)
  if [ "$with_bench" -eq 1 ]; then
    benches=$(bazel query --noshow_progress \
      'kind("cc_binary", rdeps(//bench/..., //cuda:backend))' 2>/dev/null || true)
  fi
  [ "$with_train" -eq 1 ] && benches="$benches //train:train"
  [ -n "$tests" ] || { echo "gpu_check: no gpu-tagged tests found" >&2; exit 1; }
  # shellcheck disable=SC2086
  bazel build --config=cuda $tests $benches

  rm -rf "$bundle"
  mkdir -p "$bundle/tests" "$bundle/bench"
  local target path kind name
  for target in $tests $benches; do
    path=${target#//}
    path="bazel-bin/${path/://}"
    name=$(basename "$path")
    case "$target" in
      //tests/*) kind=tests ;;
      *) kind=bench ;;
    esac
    strip -o "$bundle/$kind/$name" "$path"
    xz -T2 -6 -f "$bundle/$kind/$name"
  done
  # Host runtime libraries as a last resort (searched after the machine's own): a GPU image
  # without libgomp still runs the binaries.
  mkdir -p "$bundle/lib"
  local lib
  for lib in libgomp.so.1 libstdc++.so.6; do
    path=$(ldconfig -p | awk -v l="$lib" '$1 == l && /x86-64/ { print $NF; exit }')
    [ -n "$path" ] && cp -L "$path" "$bundle/lib/$lib" && xz -T2 -6 -f "$bundle/lib/$lib"
  done
  {
    echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"
    echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) with --config=cuda"
  } >"$bundle/BUILD_INFO"

  local total
  total=$(du -sb "$bundle" | cut -f1)
  (cd "$bundle" && ls -l tests bench)
  echo "gpu_check: gpu_bin/ holds $(find "$bundle" -type f | wc -l) files, $((total / 1024 / 1024)) MiB"
  if [ "$total" -gt "$limit_bytes" ]; then
    echo "gpu_check: gpu_bin/ is over 64 MiB; build with --no-bench or fewer binaries" >&2
    exit 1
  fi
}

# Folders holding the CUDA libraries the binaries need, most specific first, ':'-joined.
find_library_dirs() {
  local roots=() site
  for site in $(/usr/bin/env python3 -c 'import site, sys; print(" ".join(site.getsitepackages() + [site.getusersitepackages()]))' 2>/dev/null); do
    [ -d "$site" ] && roots+=("$site")
  done
  local dir
  for dir in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu /opt; do
    [ -d "$dir" ] && roots+=("$dir")
  done
  local found
  found=$(find -H "${roots[@]}" \( -name 'libcudnn.so.9*' -o -name 'libnccl.so.2*' \
    -o -name 'libcublas.so.1*' -o -name 'libcublasLt.so.1*' \) 2>/dev/null || true)
  # Not all there: search the whole machine, as the notes say.
  if ! grep -q 'libcudnn.so.9' <<<"$found" || ! grep -q 'libnccl.so.2' <<<"$found"; then
    found=$(find / -xdev \( -name 'libcudnn.so.9*' -o -name 'libnccl.so.2*' \
      -o -name 'libcublas.so.1*' -o -name 'libcublasLt.so.1*' \) 2>/dev/null || true)
  fi
  xargs -r -n1 dirname <<<"$found" | awk '!seen[$0]++' | paste -sd: -
}

cmd_run() {
  local timeout_s=300 filter="." skip_bench=0 gtest_filter=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --timeout) timeout_s=$2; shift ;;
      --timeout=*) timeout_s=${1#*=} ;;
      --filter) filter=$2; shift ;;
      --filter=*) filter=${1#*=} ;;
      --skip-bench) skip_bench=1 ;;
      --gtest-filter) gtest_filter=$2; shift ;;
      --gtest-filter=*) gtest_filter=${1#*=} ;;
      *) echo "gpu_check run: unknown argument '$1'" >&2; exit 2 ;;
    esac
    shift
  done
  [ -d "$bundle/tests" ] || { echo "gpu_check: no gpu_bin/ here; run 'tools/gpu_check.sh build' first" >&2; exit 1; }
  cat "$bundle/BUILD_INFO" 2>/dev/null || true
  # Unpack (xz, or Python's lzma where xz is missing) into a writable folder.
  local unpacked="${GPU_CHECK_UNPACK_DIR:-$bundle/unpacked}" packed target
  rm -rf "$unpacked"
  mkdir -p "$unpacked/tests" "$unpacked/bench" "$unpacked/lib"
  for packed in "$bundle"/tests/*.xz "$bundle"/bench/*.xz "$bundle"/lib/*.xz; do
    [ -f "$packed" ] || continue
    target="$unpacked/$(basename "$(dirname "$packed")")/$(basename "$packed" .xz)"
    if command -v xz >/dev/null 2>&1; then
      xz -dc "$packed" >"$target"
    else
      python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$packed" "$target"
    fi
    chmod +x "$target"
  done
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "nvidia-smi: not available"

  local libs
  libs=$(find_library_dirs)
  export LD_LIBRARY_PATH="${libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}:$unpacked/lib"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  local first missing
  first=$(find "$unpacked/tests" -type f | sort | head -n 1)
  missing=$(ldd "$first" 2>/dev/null | grep 'not found' || true)
  [ -z "$missing" ] || { echo "gpu_check: libraries still missing:"; echo "$missing"; }

  local logs="${GPU_CHECK_LOG_DIR:-$bundle/logs}" rows=()
  mkdir -p "$logs"
  export TEST_TMPDIR="${TMPDIR:-/tmp}/gpu_check.$$"
  mkdir -p "$TEST_TMPDIR"
  local binary name log rc start seconds passed failed skipped status
  for binary in $(find "$unpacked/tests" -type f | sort); do
    name=$(basename "$binary")
    grep -Eq "$filter" <<<"$name" || continue
    log="$logs/$name.log"
    start=$(date +%s.%N)
    rc=0
    timeout "$timeout_s" "$binary" ${gtest_filter:+--gtest_filter="$gtest_filter"} >"$log" 2>&1 || rc=$?
    seconds=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')
    passed=$(grep -c '^\[       OK \]' "$log" || true)
    # The line that ends each test, with its time (parameterized: Suite/Test.Case/param, where ...).
    failed=$(grep -Ec '^\[  FAILED  \] [A-Za-z_0-9/]+\.[A-Za-z_0-9/]+.* \([0-9]+ ms\)$' "$log" || true)
    skipped=$(grep -Ec '^\[  SKIPPED \] [A-Za-z_0-9/]+\.[A-Za-z_0-9/]+.* \([0-9]+ ms\)$' "$log" || true)
    case "$rc" in
      0) status=ok ;;
      124) status=TIMEOUT ;;
      *) status="FAIL(rc=$rc)" ;;
    esac
    rows+=("$(printf '%-34s %-12s %6s %6s %7s %8s' "$name" "$status" "$passed" "$failed" "$skipped" "$seconds")")
    echo "== $name: $status, $passed passed, $failed failed, $skipped skipped, ${seconds}s (log: ${log#"$root"/})"
    [ "$rc" -eq 0 ] || tail -n 30 "$log"
  done

  local commands="$root/bench/gpu_commands.txt" label command
  if [ "$skip_bench" -eq 0 ] && [ -f "$commands" ]; then
    export GPU_BIN="$unpacked" GPU_CHECK_LOG_DIR="$logs"
    while IFS= read -r line; do
      [[ "$line" =~ ^[[:space:]]*(#|$) ]] && continue
      label=$(sed 's/[[:space:]]*|.*//' <<<"$line")
      command=$(sed 's/^[^|]*|[[:space:]]*//' <<<"$line")
      grep -Eq "$filter" <<<"$label" || continue
      log="$logs/bench_${label//[^A-Za-z0-9_.-]/_}.log"
      start=$(date +%s.%N)
      rc=0
      timeout "$timeout_s" bash -c "$command" >"$log" 2>&1 </dev/null || rc=$?
      seconds=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')
      case "$rc" in 0) status=ok ;; 124) status=TIMEOUT ;; *) status="FAIL(rc=$rc)" ;; esac
      rows+=("$(printf '%-34s %-12s %6s %6s %7s %8s' "bench:$label" "$status" - - - "$seconds")")
      echo "== bench $label: $status, ${seconds}s"
      tail -n 15 "$log"
    done <"$commands"
  fi
  rm -rf "$TEST_TMPDIR"

  echo
  echo "GPU check summary"
  printf '%-34s %-12s %6s %6s %7s %8s\n' binary status passed failed skipped seconds
  local row bad=0
  for row in "${rows[@]}"; do
    echo "$row"
    grep -q ' ok ' <<<"$row" || bad=$((bad + 1))
  done
  echo "$bad of ${#rows[@]} entries not ok"
  # On the device machine, what is written under $OUT comes back (at most 8 files): the result
  # tables at the top, every log in one archive.
  if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then
    find "$logs" -maxdepth 1 \( -name '*.md' -o -name '*.jsonl' \) -exec cp {} "$OUT/" \;
    tar -czf "$OUT/gpu_check_logs.tar.gz" -C "$(dirname "$logs")" "$(basename "$logs")"
  fi
  [ "$bad" -eq 0 ]
}

case "${1:-}" in
  build) shift; cmd_build "$@" ;;
  run) shift; cmd_run "$@" ;;
  -h | --help | help | "") usage ;;
  *) echo "gpu_check: unknown command '$1'" >&2; usage; exit 2 ;;
esac
