#!/usr/bin/env bash
# GPU checks in two steps, for GPU machines without Bazel, time-boxed, and honest about what ran.
#
#   tools/gpu_check.sh build     (here) builds every `gpu`-tagged test, the GPU benchmarks and
#                                tools/gpu_smoke with --config=cuda, and packs them, stripped and
#                                xz-compressed, into gpu_bin/ (git-ignored; under 60 MiB), with the
#                                runtime libraries a bare GPU image may lack (below).
#   tools/gpu_check.sh run       (on the GPU machine, from the repository root) in this order:
#       1. DIR/env.txt within ~30 s: nvidia-smi, driver and runtime versions, cuDNN, cuBLAS and
#          NCCL as loaded (gpu_smoke --versions), `ldd` of every binary with each library's path,
#          the Python and PyTorch the comparison uses.
#       2. gpu_smoke: devices, an own kernel, cuBLAS, cuDNN, one-rank NCCL, Tessel's backend, each
#          against the CPU. If it fails or sees no GPU, the run stops (exit 2) and summary.md
#          says why ("no GPU usable: ..." when there is none).
#       3. the gpu tests, most basic first: runtime, transfer, allocator, device_functions,
#          ops_check, blas_cudnn, model_step, policy_equality, the NCCL tests, recipes_gpu (any
#          other gpu test after them), with TESSEL_REQUIRE_GPU=1: a test that would skip for lack
#          of a GPU fails instead.
#       4. the benchmarks of bench/gpu_commands.txt (bf16 rows first).
#     After each entry DIR/summary.md and DIR/logs.tar.gz are rewritten, so a run killed at any
#     moment leaves everything finished so far. The exit status is 0 only when every entry ran
#     and is ok: a test binary whose tests all skipped, or that ran no test, is "not ok"; an entry
#     never started is listed as "not run: <why>" (deadline, missing library, no GPU).
#
# Options:
#   build [--no-bench] [--with-train]
#   run   [--out DIR]          output folder (default: $OUT when set, else gpu_bin/out); it gets
#                              env.txt, summary.md, logs.tar.gz and bench_* result files (at most
#                              8 files, all at its top)
#         [--timeout S]        per entry (default 120; a bench line may set its own)
#         [--deadline S]       from the start of `run`: no entry starts after it, and a running one
#                              is stopped there ("TIMEOUT (deadline)"); default 480
#         [--filter REGEX]     only the entries whose name matches (tests and bench labels)
#         [--gtest-filter P]   passed to every test binary
#         [--skip-tests] [--skip-bench]
#         [--bundle DIR]       the packed binaries (default gpu_bin; env GPU_CHECK_BUNDLE)
#         [--commands FILE]    bench lines (default bench/gpu_commands.txt; env GPU_CHECK_COMMANDS)
#         [--python PATH]      the Python with torch for the comparison (default
#                              /opt/torch/.venv/bin/python3 when there, else python3; env
#                              GPU_CHECK_PYTHON)
#   run --rerun NAME [--gtest-filter P] [--sanitizer] [--launch-blocking] [--timeout S]
#                              one test binary or bench label again, optionally under
#                              compute-sanitizer (memcheck) or CUDA_LAUNCH_BLOCKING=1; its log ends
#                              the output, and summary.md holds its one row.
#
# Libraries. The binaries link cudart statically and cuBLAS 13, cuDNN 9, NCCL 2, libgomp and
# OpenMPI's libmpi dynamically. Each library the machine lacks is decided on its own (ldd over
# every binary, until nothing more resolves): CUDA libraries come from the Python's
# site-packages (PyTorch's nvidia-* wheels) or /usr/local/cuda; libgomp, libstdc++ (only when the
# machine's is missing or too old: a "version `GLIBCXX_...' not found") and OpenMPI from the
# bundle. That path is set only for Tessel's binaries (through small wrappers in
# gpu_bin/unpacked/{tests,bench,tools}), never for Python and PyTorch or any other program.
#
# OpenMPI. The NCCL tests and recipes_gpu_test link //parallel:comm, hence libmpi.so.40, and call
# MPI_Init as one process without mpirun (MPI's singleton mode). Open MPI 4.1 then forks `orted`
# unless OMPI_MCA_ess_singleton_isolated=1, which `run` sets: one rank needs no daemon. Where the
# machine has no libmpi.so.40, the bundle's OpenMPI runtime is used: libmpi and the libraries it
# needs, the MCA components whose own dependencies are in that set (OMPI_MCA_mca_base_component_
# path) and the help texts (OPAL_PREFIX). An isolated singleton runs MPI_Init_thread,
# Comm_dup/split, Ibcast, Iallreduce, Isend/Irecv and Ibarrier on one rank with that runtime
# alone; without the isolated flag, MPI_Init fails looking for orted. (Checked with the
# system's OpenMPI hidden by an overlay in a mount namespace: the bundled runtime is chosen and
# the NCCL tests' MPI_Init_thread succeeds.) This tests the code as it runs under mpirun; building
# those tests without MPI would need a one-rank stand-in for the ~40 MPI calls of //parallel:comm.
# As root, OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM)=1 are set too.
#
# Bench lines (bench/gpu_commands.txt): "label | timeout seconds or - | shell command", run from
# the repository root with $GPU_BIN (wrapped binaries: $GPU_BIN/bench/train_step_bench), $PYTHON,
# $GPU_CHECK_RESULTS (result files: they come back as DIR/bench_<name>) and $GPU_CHECK_LOG_DIR.
# A line naming a binary that lacks a library is "not run: missing ...".
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
limit_bytes=$((60 * 1024 * 1024))
# Tests in the order that finds bugs soonest: the layers others build on first.
test_order=(runtime_test transfer_test allocator_test device_functions_test ops_check_test
  blas_cudnn_test chunk_passes_test model_step_test policy_equality_test nccl_smoke_test nccl_ddp_test
  tensor_parallel_gpu_test recipes_gpu_test)
# Libraries any Linux has: never bundled, never looked for.
base_libraries='linux-vdso.so.1 libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2 librt.so.1
  ld-linux-x86-64.so.2 /lib64/ld-linux-x86-64.so.2'

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }

die() {
  echo "gpu_check: $*" >&2
  exit 1
}

# ---------------------------------------------------------------------------------------------
# build

# Copies `library` (a path, links followed) into `folder`, under its own name.
copy_library() {
  local library=$1 folder=$2
  cp -L "$library" "$folder/$(basename "$library")"
}

# The shared libraries `file` needs (sonames), as ldd lists them.
needed_libraries() { ldd "$1" 2>/dev/null | awk '$2 == "=>" || /^\t\// { print $1 }'; }

is_base_library() { grep -qw -- "$1" <<<"$base_libraries"; }

# Where the dynamic linker finds `soname` here ("" when nowhere). Reads all of ldconfig's output:
# under pipefail, a reader that stops early would fail the pipeline.
system_library() { ldconfig -p | awk -v l="$1" '$1 == l && /x86-64/ && !found { print $NF; found = 1 }'; }

# The OpenMPI runtime one process needs, into $1/openmpi/{lib,lib/openmpi3,share/openmpi}.
pack_openmpi() {
  local target=$1/openmpi
  local libmpi
  libmpi=$(system_library libmpi.so.40)
  [ -n "$libmpi" ] || die "libmpi.so.40 not found (apt-get install libopenmpi-dev)"
  local components help
  components=$(ompi_info --path pkglibdir 2>/dev/null | awk '{ print $NF }')
  help=$(ompi_info --path pkgdatadir 2>/dev/null | awk '{ print $NF }')
  [ -d "$components" ] || die "OpenMPI's component folder not found (ompi_info --path pkglibdir)"
  mkdir -p "$target/lib/openmpi3" "$target/share/openmpi"
  # libmpi and what it needs, then the components whose dependencies all lie in that set
  # (the others need InfiniBand, UCX, libfabric, ...: nothing one process uses).
  local allowed="$base_libraries libmpi.so.40" library name path
  for library in $(needed_libraries "$libmpi"); do
    is_base_library "$library" || allowed="$allowed $library"
  done
  local common
  for common in "$(dirname "$(readlink -f "$libmpi")")"/libmca_common_*.so.*; do
    [[ "$common" =~ \.so\.[0-9]+$ ]] || continue
    local ok=1
    for library in $(needed_libraries "$common"); do
      grep -qw -- "$library" <<<"$allowed" || ok=0
    done
    [ "$ok" -eq 1 ] && allowed="$allowed $(basename "$common")"
  done
  for name in $allowed; do
    is_base_library "$name" && continue
    path=$(system_library "$name")
    [ -n "$path" ] || path=$(find "$(dirname "$(readlink -f "$libmpi")")" -name "$name" -print -quit)
    [ -n "$path" ] && copy_library "$path" "$target/lib"
  done
  local component count=0
  for component in "$components"/mca_*.so; do
    local ok=1
    for library in $(needed_libraries "$component"); do
      grep -qw -- "$library" <<<"$allowed" || ok=0
    done
    if [ "$ok" -eq 1 ]; then
      cp "$component" "$target/lib/openmpi3/"
      count=$((count + 1))
    fi
  done
  cp "$help"/help-*.txt "$target/share/openmpi/" 2>/dev/null || true
  strip --strip-unneeded "$target"/lib/*.so* "$target"/lib/openmpi3/*.so 2>/dev/null || true
  echo "gpu_check: OpenMPI runtime: $(find "$target/lib" -maxdepth 1 -type f | wc -l) libraries, $count components"
}

cmd_build() {
  local with_bench=1 with_train=0
  while [ $# -gt 0 ]; do
    case "$1" in
      --no-bench) with_bench=0 ;;
      --with-train) with_train=1 ;;
      *) die "build: unknown argument '$1'" ;;
    esac
    shift
  done
  [ -x /usr/local/cuda/bin/nvcc ] || die "/usr/local/cuda/bin/nvcc not found"

  local tests benches=""
  tests=$(bazel query --noshow_progress 'attr(tags, "\bgpu\b", kind("cc_test", //...))' 2>/dev/null)
  if [ "$with_bench" -eq 1 ]; then
    benches=$(bazel query --noshow_progress \
      'kind("cc_binary", rdeps(//bench/..., //cuda:backend))' 2>/dev/null || true)
  fi
  [ "$with_train" -eq 1 ] && benches="$benches //train:train"
  [ -n "$tests" ] || die "no gpu-tagged tests found"
  local smoke=//tools/gpu_smoke:gpu_smoke
  # shellcheck disable=SC2086
  bazel build --config=cuda $tests $benches $smoke

  local bundle="$root/gpu_bin"
  rm -rf "$bundle"
  mkdir -p "$bundle/tests" "$bundle/bench" "$bundle/tools" "$bundle/lib"
  local target path kind
  for target in $tests $benches $smoke; do
    path=${target#//}
    path="bazel-bin/${path/://}"
    case "$target" in
      //tests/*) kind=tests ;;
      //tools/*) kind=tools ;;
      *) kind=bench ;;
    esac
    strip -o "$bundle/$kind/$(basename "$path")" "$path"
  done
  # One xz per core (each takes ~100 MiB at -6).
  find "$bundle/tests" "$bundle/bench" "$bundle/tools" -type f -print0 |
    xargs -0 -r -n 1 -P "$(nproc)" xz -6 -f
  # Runtime libraries a bare GPU image may lack; `run` uses each only where the machine's is
  # missing (or too old).
  local library
  for library in libgomp.so.1 libstdc++.so.6 libgcc_s.so.1; do
    path=$(system_library "$library")
    [ -n "$path" ] || die "$library not found here"
    copy_library "$path" "$bundle/lib"
    xz -T2 -6 -f "$bundle/lib/$library"
  done
  local staging
  staging=$(mktemp -d)
  pack_openmpi "$staging"
  tar -C "$staging" -cJf "$bundle/openmpi.tar.xz" openmpi
  rm -rf "$staging"
  {
    echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (with local changes)')"
    echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) with --config=cuda on $(. /etc/os-release && echo "$PRETTY_NAME"), $(ldd --version | sed -n 1p)"
  } >"$bundle/BUILD_INFO"

  local total
  total=$(du -sb "$bundle" | cut -f1)
  (cd "$bundle" && ls -l tests bench tools lib openmpi.tar.xz)
  echo "gpu_check: gpu_bin/ holds $(find "$bundle" -type f | wc -l) files, $((total / 1024 / 1024)) MiB"
  if [ "$total" -gt "$limit_bytes" ]; then
    die "gpu_bin/ is over $((limit_bytes / 1024 / 1024)) MiB; build with --no-bench or fewer binaries"
  fi
}

# ---------------------------------------------------------------------------------------------
# run: state shared by the functions below

out_dir="" bundle="" unpacked="" logs="" results="" python="" commands=""
timeout_s=120 deadline_s=480 start_s=0 deadline_at=0
run_title="GPU check"
# One entry per test binary or bench line, in run order.
names=() kinds=() commands_of=() timeouts=() statuses=() counts=() seconds=() notes=()
smoke_status="" smoke_text=""
# Libraries no folder provides, and for each binary what it lacks ("" when nothing).
declare -A missing_of=()

now() { date +%s; }

# Decompresses the bundle into $unpacked/real/{tests,bench,tools} (plain files are copied, so a
# stand-in bundle can hold scripts), the libraries into $unpacked/bundled, OpenMPI into
# $unpacked/openmpi. With xz, or the Python's lzma where a bare image has no xz.
unpack_bundle() {
  rm -rf "$unpacked"
  mkdir -p "$unpacked/real" "$unpacked/bundled"
  local packed kind target pids=()
  for kind in tests bench tools lib; do
    [ -d "$bundle/$kind" ] || continue
    local destination="$unpacked/real/$kind"
    [ "$kind" = lib ] && destination="$unpacked/bundled"
    mkdir -p "$destination"
    for packed in "$bundle/$kind"/*; do
      [ -f "$packed" ] || continue
      target="$destination/$(basename "$packed" .xz)"
      if [[ "$packed" == *.xz ]]; then
        decompress "$packed" "$target" &
        pids+=($!)
      else
        cp "$packed" "$target"
      fi
    done
  done
  if [ -f "$bundle/openmpi.tar.xz" ]; then
    if command -v xz >/dev/null 2>&1; then
      tar -C "$unpacked" -xJf "$bundle/openmpi.tar.xz" &
    else
      "$python" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
        "$bundle/openmpi.tar.xz" "$unpacked" &
    fi
    pids+=($!)
  fi
  local pid failed=0
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
  [ "$failed" -eq 0 ] || die "could not unpack $bundle"
  find "$unpacked/real" -type f -exec chmod +x {} +
  [ -f "$bundle/BUILD_INFO" ] && cp "$bundle/BUILD_INFO" "$unpacked/BUILD_INFO"
  true
}

decompress() {
  if command -v xz >/dev/null 2>&1; then
    xz -dc "$1" >"$2"
  else
    "$python" -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$1" "$2"
  fi
}

# Every unpacked binary (real path), tests and bench and tools.
real_binaries() { find "$unpacked/real" -type f | sort; }

# Where the Python keeps its packages (PyTorch's nvidia-* wheels live there).
python_site_dirs() {
  "$python" -c 'import site, sys; print("\n".join(site.getsitepackages() + [site.getusersitepackages()]))' 2>/dev/null || true
}

# Folders that may hold the CUDA libraries, most specific first.
cuda_candidate_dirs() {
  local dir
  while IFS= read -r dir; do
    [ -d "$dir/nvidia" ] && find -L "$dir/nvidia" -maxdepth 3 -type d -name lib 2>/dev/null
  done < <(python_site_dirs)
  for dir in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu; do
    if [ -d "$dir" ]; then echo "$dir"; fi
  done
}

# `ldd` of the binaries $2... under LD_LIBRARY_PATH $1, each after a line "@@ binary".
ldd_all() {
  local path=$1 file
  shift
  for file in "$@"; do
    echo "@@ $file"
    LD_LIBRARY_PATH=$path ldd "$file" 2>&1 || true
  done
}

# What the ldd_all output on stdin says the binaries lack, one line each: "binary<TAB>soname"
# for a missing file, "binary<TAB>soname (VERSION)" for a version the copy found lacks (an old
# libstdc++ or glibc).
lacking_libraries() {
  awk '
    /^@@ / { file = substr($0, 4); next }
    $2 == "=>" && $3 == "not" { print file "\t" $1; next }
    / not found \(required by / && match($0, /: [^:]*: version `[^'"'"']*'"'"'/) {
      text = substr($0, RSTART + 2, RLENGTH - 2)
      library = text; sub(/: version.*/, "", library); n = split(library, parts, "/")
      version = text; sub(/.*version `/, "", version); sub(/'"'"'$/, "", version)
      print file "\t" parts[n] " (" version ")"
    }' | sort -u
}

# CUDA libraries: looked for in the Python's wheels and the toolkit, never bundled.
is_cuda_library() { [[ "$1" =~ ^lib(cudnn|cublas|cublasLt|nccl|cudart|nvrtc|nvJitLink|cuda)[._] ]]; }

# Decides, library by library, what goes on LD_LIBRARY_PATH for Tessel's binaries, and writes
# $unpacked/tessel_env.sh (sourced by every wrapper) and the wrappers.
setup_libraries() {
  local original=${LD_LIBRARY_PATH:-}
  mkdir -p "$unpacked/use"
  local candidates=() dir
  while IFS= read -r dir; do candidates+=("$dir"); done < <(cuda_candidate_dirs | awk '!seen[$0]++')
  local path_dirs=() use_bundled_mpi=0 changed library found binaries=() path
  ldd_output="$logs/ldd.txt"
  while IFS= read -r library; do binaries+=("$library"); done < <(real_binaries)
  library_notes=""
  # Until a pass adds nothing: that pass's ldd output is what env.txt shows.
  for _ in 1 2 3 4 5 6; do
    local checked=("${binaries[@]}")
    path=$(
      IFS=:
      echo "$unpacked/use${path_dirs[*]:+:${path_dirs[*]}}${original:+:$original}"
    )
    [ "$use_bundled_mpi" -eq 1 ] && checked+=("$unpacked"/openmpi/lib/openmpi3/*.so)
    ldd_all "$path" "${checked[@]}" >"$ldd_output"
    changed=0
    local entry
    while IFS= read -r entry; do
      library=${entry%% *}
      [ -e "$unpacked/use/$library" ] && continue
      found=""
      if is_cuda_library "$library"; then
        for dir in "${candidates[@]}"; do
          if [ -e "$dir/$library" ]; then found=$dir; break; fi
        done
      fi
      if [ -n "$found" ]; then
        if ! grep -qxF "$found" <<<"$(printf '%s\n' "${path_dirs[@]}")"; then
          path_dirs+=("$found")
          library_notes+="$library: from $found"$'\n'
          changed=1
        fi
      elif [ -e "$unpacked/bundled/$library" ]; then
        ln -s "$unpacked/bundled/$library" "$unpacked/use/$library"
        library_notes+="$library: bundled (the machine's is missing$([ "$entry" != "$library" ] && echo " or lacks ${entry#* }"))"$'\n'
        changed=1
      elif [ -e "$unpacked/openmpi/lib/$library" ]; then
        ln -s "$unpacked/openmpi/lib/$library" "$unpacked/use/$library"
        library_notes+="$library: bundled with OpenMPI"$'\n'
        [ "$library" = libmpi.so.40 ] && use_bundled_mpi=1
        changed=1
      fi
    done < <(lacking_libraries <"$ldd_output" | cut -f2 | sort -u)
    [ "$changed" -eq 1 ] || break
  done
  tessel_library_path=$(
    IFS=:
    echo "$unpacked/use${path_dirs[*]:+:${path_dirs[*]}}"
  )
  if [ "$changed" -eq 1 ]; then # the passes ran out: look once more with the final path
    ldd_all "$tessel_library_path${original:+:$original}" "${binaries[@]}" >"$ldd_output"
  fi
  # What still does not resolve, per binary (the OpenMPI components' needs are their binaries').
  local file
  while IFS=$'\t' read -r file library; do
    [[ "$file" == "$unpacked/real/"* ]] || continue
    file=$(basename "$file")
    missing_of[$file]="${missing_of[$file]:+${missing_of[$file]}, }$library"
  done < <(lacking_libraries <"$ldd_output")

  {
    echo "# Sourced by the wrappers of Tessel's binaries (tools/gpu_check.sh run)."
    echo "export LD_LIBRARY_PATH='$tessel_library_path'\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
    echo "export OMPI_MCA_ess_singleton_isolated=1"
    if [ "$use_bundled_mpi" -eq 1 ]; then
      echo "export OPAL_PREFIX='$unpacked/openmpi'"
      echo "export OMPI_MCA_mca_base_component_path='$unpacked/openmpi/lib/openmpi3'"
    fi
  } >"$unpacked/tessel_env.sh"
  used_bundled_mpi=$use_bundled_mpi
  local real kind
  for real in "${binaries[@]}"; do
    kind=$(basename "$(dirname "$real")")
    mkdir -p "$unpacked/$kind"
    printf '#!/bin/sh\n. "%s"\nexec "%s" "$@"\n' "$unpacked/tessel_env.sh" "$real" >"$unpacked/$kind/$(basename "$real")"
    chmod +x "$unpacked/$kind/$(basename "$real")"
  done
}

# ---------------------------------------------------------------------------------------------
# env.txt

start_python_probe() {
  python_probe="$logs/python_probe.txt"
  (
    PYTHONUNBUFFERED=1 timeout -k 5 25 "$python" - >"$python_probe" 2>&1 <<'PY' || echo "(the probe ended with status $?)" >>"$python_probe"
import sys
print("python", sys.version.split()[0], sys.executable)
try:
    import torch
except Exception as error:
    print("torch: not importable:", error)
    sys.exit(0)
print("torch", torch.__version__, "CUDA", torch.version.cuda, "cuDNN",
      torch.backends.cudnn.version())
try:
    print("NCCL", ".".join(map(str, torch.cuda.nccl.version())))
except Exception as error:
    print("NCCL: unknown:", error)
print("torch.cuda.is_available()", torch.cuda.is_available(), "devices",
      torch.cuda.device_count())
try:
    import torchvision
    print("torchvision", torchvision.__version__)
except Exception as error:
    print("torchvision: not importable:", error)
PY
  ) &
  python_probe_pid=$!
}

section() { printf '\n## %s\n' "$1"; }

# The machine and its GPUs: written before anything is unpacked.
write_env_machine() {
  local env="$out_dir/env.txt"
  {
    echo "# tools/gpu_check.sh run: the machine, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "host $(hostname 2>/dev/null || echo unknown); $(uname -srm); $( (. /etc/os-release && echo "$PRETTY_NAME") 2>/dev/null || echo 'unknown OS'); $(ldd --version 2>/dev/null | sed -n 1p)"
    echo "user $(id -un 2>/dev/null || id -u); $(nproc) cores; $(awk '/MemTotal/ { printf "%.0f GiB memory", $2 / 1048576 }' /proc/meminfo 2>/dev/null)"
    section "GPU devices"
    echo "/dev/nvidia*: $(ls /dev/nvidia* 2>/dev/null | paste -sd' ' - || true)"
    [ -n "$(ls /dev/nvidia* 2>/dev/null)" ] || echo "  (none: no GPU device files)"
    if [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then
      echo "CUDA_VISIBLE_DEVICES='$CUDA_VISIBLE_DEVICES'"
    else
      echo "CUDA_VISIBLE_DEVICES unset"
    fi
    section "nvidia-smi"
    if command -v nvidia-smi >/dev/null 2>&1; then
      timeout -k 2 8 nvidia-smi 2>&1 || echo "(nvidia-smi ended with status $?)"
      timeout -k 2 4 nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv 2>&1 || true
    else
      echo "nvidia-smi: not found"
    fi
  } >"$env"
}

# The bundle's binaries: versions as loaded, library decisions, ldd.
write_env_binaries() {
  {
    section "bundle"
    cat "$unpacked/BUILD_INFO" 2>/dev/null || echo "(no BUILD_INFO)"
    section "versions as loaded (gpu_smoke --versions)"
    local smoke="$unpacked/tools/gpu_smoke"
    if [ ! -x "$smoke" ]; then
      echo "gpu_smoke: not in the bundle"
    elif [ -n "${missing_of[gpu_smoke]:-}" ]; then
      echo "gpu_smoke: cannot start: missing ${missing_of[gpu_smoke]}"
    else
      timeout -k 2 12 "$smoke" --versions 2>&1 || echo "(gpu_smoke --versions ended with status $?)"
    fi
    section "libraries for Tessel's binaries"
    echo "LD_LIBRARY_PATH for them: $tessel_library_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "OpenMPI: $([ "$used_bundled_mpi" -eq 1 ] && echo "the bundle's (the machine has no libmpi.so.40)" || echo "the machine's (or not needed)"); singleton without orted (OMPI_MCA_ess_singleton_isolated=1)"
    printf '%s' "$library_notes"
    local name
    for name in $(real_binaries | xargs -n1 basename); do
      [ -n "${missing_of[$name]:-}" ] && echo "MISSING for $name: ${missing_of[$name]}"
    done
    section "ldd of every binary"
    awk -v real="$unpacked/real/" -v components="$unpacked/openmpi/" '
      /^@@ / { file = substr($0, 4)
               if (index(file, real) == 1) file = substr(file, length(real) + 1)
               if (index(file, components) == 1) file = "openmpi/" substr(file, length(components) + 1)
               print file ":"; next }
      { sub(/^[ \t]*/, "    "); print }' "$ldd_output"
  } >>"$out_dir/env.txt"
}

finish_env() {
  wait "$python_probe_pid" 2>/dev/null || true
  {
    section "Python and PyTorch for the comparison ($python; run without the bundle's libraries)"
    if [ -s "$python_probe" ]; then cat "$python_probe"; else echo "(no answer from $python)"; fi
  } >>"$out_dir/env.txt"
}

# ---------------------------------------------------------------------------------------------
# entries, results, summary

add_entry() { # kind name command timeout
  kinds+=("$1")
  names+=("$2")
  commands_of+=("$3")
  timeouts+=("$4")
  statuses+=("not run yet")
  counts+=("- - - -")
  seconds+=("")
  notes+=("")
}

collect_entries() {
  local filter=$1 skip_tests=$2 skip_bench=$3 name
  if [ "$skip_tests" -eq 0 ]; then
    local all ordered=()
    all=$(find "$unpacked/real/tests" -type f -printf '%f\n' 2>/dev/null | sort)
    for name in "${test_order[@]}"; do
      grep -qxF "$name" <<<"$all" && ordered+=("$name")
    done
    for name in $all; do
      grep -qxF "$name" <<<"$(printf '%s\n' "${ordered[@]}")" || ordered+=("$name")
    done
    for name in "${ordered[@]}"; do
      grep -Eq -- "$filter" <<<"$name" || continue
      add_entry test "$name" "" "$timeout_s"
    done
  fi
  if [ "$skip_bench" -eq 0 ] && [ -f "$commands" ]; then
    local line label limit command
    while IFS= read -r line; do
      [[ "$line" =~ ^[[:space:]]*(#|$) ]] && continue
      label=$(awk -F'|' '{ gsub(/^[ \t]+|[ \t]+$/, "", $1); print $1 }' <<<"$line")
      limit=$(awk -F'|' '{ gsub(/^[ \t]+|[ \t]+$/, "", $2); print $2 }' <<<"$line")
      command=$(sed 's/^[^|]*|[^|]*|[[:space:]]*//' <<<"$line")
      [[ "$limit" =~ ^[0-9]+$ ]] || limit=$timeout_s
      grep -Eq -- "$filter" <<<"$label" || continue
      add_entry bench "$label" "$command" "$limit"
    done <"$commands"
  fi
}

# Binaries a bench command names ($GPU_BIN/<kind>/<name>) that lack libraries: "lib (by name)".
bench_missing() {
  local name missing=""
  for name in $(grep -oE '\$\{?GPU_BIN\}?/[a-z]+/[A-Za-z0-9_]+' <<<"$1" | xargs -r -n1 basename); do
    [ -n "${missing_of[$name]:-}" ] && missing+="${missing:+; }${missing_of[$name]} ($name)"
  done
  echo "$missing"
}

# passed failed skipped not_run, the failed tests, and the test it stopped in, from a gtest log.
parse_gtest_log() {
  awk '
    /^\[==========\] Running [0-9]+ tests? from/ { total = $3 }
    /^\[ RUN      \] / { current = $4 }
    /^\[       OK \] .* \([0-9]+ ms\)$/ { passed++; current = "" }
    /^\[  SKIPPED \] .* \([0-9]+ ms\)$/ { skipped++; current = "" }
    /^\[  FAILED  \] .* \([0-9]+ ms\)$/ {
      failed++; name = $4; sub(/,$/, "", name); failures = failures (failures ? " " : "") name
      current = ""
    }
    END {
      if (current != "") { failed++; failures = failures (failures ? " " : "") current }
      not_run = total - passed - failed - skipped
      if (not_run < 0) not_run = 0
      printf "%d %d %d %d %d\t%s\t%s\n", total, passed, failed, skipped, not_run, failures, current
    }' "$1"
}

# Runs entry $1 with the time the deadline leaves; records status, counts, seconds and note.
run_entry() {
  local i=$1 kind=${kinds[$1]} name=${names[$1]}
  local log="$logs/$name.log" limit=${timeouts[$1]} cut_by_deadline=0
  if [ "$deadline_at" -gt 0 ]; then
    local left=$((deadline_at - $(now)))
    if [ "$left" -le 0 ]; then
      statuses[$i]="not run: deadline"
      return
    fi
    [ "$left" -lt "$limit" ] && { limit=$left; cut_by_deadline=1; }
  fi
  local missing
  if [ "$kind" = test ]; then missing=${missing_of[$name]:-}; else missing=$(bench_missing "${commands_of[$i]}"); fi
  if [ -n "$missing" ]; then
    statuses[$i]="not run: missing $missing"
    return
  fi
  statuses[$i]="running"
  write_summary running
  local start rc=0
  start=$(date +%s.%N)
  export TEST_TMPDIR="$work_tmp/$name"
  rm -rf "$TEST_TMPDIR"
  mkdir -p "$TEST_TMPDIR"
  echo "== $name (timeout ${limit}s) ..."
  if [ "$kind" = test ]; then
    (
      [ -n "$launch_blocking" ] && export CUDA_LAUNCH_BLOCKING=1
      if [ -n "$sanitizer" ]; then
        . "$unpacked/tessel_env.sh"
        exec timeout -k 10 "$limit" "$sanitizer" --tool memcheck --error-exitcode 99 \
          "$unpacked/real/tests/$name" ${gtest_filter:+--gtest_filter="$gtest_filter"}
      fi
      exec timeout -k 10 "$limit" "$unpacked/tests/$name" ${gtest_filter:+--gtest_filter="$gtest_filter"}
    ) >"$log" 2>&1 </dev/null || rc=$?
  else
    (
      [ -n "$launch_blocking" ] && export CUDA_LAUNCH_BLOCKING=1
      export GPU_BIN="$unpacked" GPU_CHECK_LOG_DIR="$logs" GPU_CHECK_RESULTS="$results" \
        PYTHON="$python" PYTHONUNBUFFERED=1
      exec timeout -k 10 "$limit" bash -c "${commands_of[$i]}"
    ) >"$log" 2>&1 </dev/null || rc=$?
  fi
  seconds[$i]=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')
  local status note=""
  case "$rc" in
    0) status=ok ;;
    124 | 137) status=TIMEOUT; [ "$cut_by_deadline" -eq 1 ] && status="TIMEOUT (deadline)" ;;
    *) if [ "$rc" -gt 128 ]; then status="CRASH (signal $((rc - 128)))"; else status="FAIL (exit $rc)"; fi ;;
  esac
  if [ "$kind" = test ]; then
    local parsed total passed failed skipped not_run failures stopped_in
    parsed=$(parse_gtest_log "$log")
    read -r total passed failed skipped not_run <<<"$(cut -f1 <<<"$parsed")"
    failures=$(cut -f2 <<<"$parsed")
    stopped_in=$(cut -f3 <<<"$parsed")
    counts[$i]="$passed $failed $skipped $not_run"
    if [ "$status" = ok ]; then
      if [ "$failed" -gt 0 ]; then
        status="FAIL"
      elif [ "$total" -eq 0 ]; then
        status="not ok: no test ran"
      elif [ "$passed" -eq 0 ]; then
        status="not ok: all skipped"
      elif [ "$not_run" -gt 0 ]; then
        status="not ok: $not_run not run"
      fi
    fi
    [ -n "$stopped_in" ] && note="stopped in $stopped_in"
    [ -n "$failures" ] && note="${note:+$note; }failed: $failures"
    [ "$total" -eq 0 ] && [ "$rc" -ne 0 ] && note="${note:+$note; }ended before any test started"
    [ -n "$sanitizer" ] && [ "$rc" -eq 99 ] && note="${note:+$note; }compute-sanitizer reported errors"
  fi
  statuses[$i]=$status
  notes[$i]=$note
  echo "== $name: $status ${counts[$i]/#- - - -/} (${seconds[$i]}s)"
  [ "$status" = ok ] || tail -n 25 "$log" | sed 's/^/   | /'
  copy_results
}

# Result files of the bench lines into DIR as bench_<name>, while DIR holds at most 8 files.
copy_results() {
  local file
  for file in "$results"/*; do
    [ -f "$file" ] || continue
    local target
    target="$out_dir/bench_$(basename "$file")"
    if [ -e "$target" ] || [ "$(find "$out_dir" -maxdepth 1 -type f | wc -l)" -lt 7 ]; then
      cp "$file" "$target.partial" && mv "$target.partial" "$target"
    fi
  done
}

is_ok() { [ "${statuses[$1]}" = ok ]; }

# DIR/summary.md from the entries so far, and DIR/logs.tar.gz; `state` is running, finished or
# stopped.
write_summary() {
  local state=$1 summary="$out_dir/summary.md.partial" i
  local done_count=0 bad=0 not_run=0 tests_passed=0 tests_failed=0 tests_skipped=0 tests_not_run=0
  for i in "${!names[@]}"; do
    case "${statuses[$i]}" in
      "not run yet" | running) ;;
      *) done_count=$((done_count + 1)) ;;
    esac
    case "${statuses[$i]}" in ok) ;; "not run"*) not_run=$((not_run + 1)); bad=$((bad + 1)) ;; *) bad=$((bad + 1)) ;; esac
    if [ "${kinds[$i]}" = test ] && [ "${counts[$i]}" != "- - - -" ]; then
      local p f s n
      read -r p f s n <<<"${counts[$i]}"
      tests_passed=$((tests_passed + p)) tests_failed=$((tests_failed + f))
      tests_skipped=$((tests_skipped + s)) tests_not_run=$((tests_not_run + n))
    fi
  done
  local elapsed=$(($(now) - start_s)) verdict
  case "$state" in
    running) verdict="IN PROGRESS: $done_count of ${#names[@]} entries done after ${elapsed}s (if this is the last word, the run was stopped here)" ;;
    stopped) verdict="STOPPED: $smoke_status" ;;
    *)
      if [ "$bad" -eq 0 ] && [ "${#names[@]}" -gt 0 ]; then
        verdict="ALL OK: ${#names[@]} entries ran and passed"
      else
        verdict="NOT OK: $bad of ${#names[@]} entries not ok ($not_run of them not run)"
      fi
      ;;
  esac
  {
    echo "# $run_title: $verdict"
    echo
    echo "- $(date -u +%Y-%m-%dT%H:%M:%SZ), ${elapsed}s since the start; per-entry timeout ${timeout_s}s, $([ "$deadline_at" -gt 0 ] && echo "deadline ${deadline_s}s" || echo "no deadline")$([ -n "$gtest_filter" ] && echo ", --gtest-filter '$gtest_filter'")$([ -n "$sanitizer" ] && echo ", under compute-sanitizer")$([ -n "$launch_blocking" ] && echo ", CUDA_LAUNCH_BLOCKING=1")."
    [ -f "$unpacked/BUILD_INFO" ] && sed 's/^/- bundle: /' "$unpacked/BUILD_INFO"
    echo "- smoke check: ${smoke_status:-not run}"
    echo "- tests: $tests_passed passed, $tests_failed failed, $tests_skipped skipped, $tests_not_run not run (in the binaries that started); entries not run: $not_run"
    echo
    echo "| # | entry | status | passed | failed | skipped | not run | seconds | note |"
    echo "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |"
    for i in "${!names[@]}"; do
      local p f s n label=${names[$i]}
      read -r p f s n <<<"${counts[$i]}"
      [ "${kinds[$i]}" = bench ] && label="bench: $label"
      echo "| $((i + 1)) | $label | ${statuses[$i]} | $p | $f | $s | $n | ${seconds[$i]:--} | ${notes[$i]} |"
    done
    if [ -n "$smoke_text" ]; then
      echo
      echo "## gpu_smoke"
      echo
      echo '```'
      echo "$smoke_text"
      echo '```'
    fi
    local shown=0
    for i in "${!names[@]}"; do
      case "${statuses[$i]}" in ok | "not run"* | running) continue ;; esac
      [ -f "$logs/${names[$i]}.log" ] || continue
      if [ "$shown" -eq 0 ]; then
        echo
        echo "## Not ok: the end of each log (all logs in logs.tar.gz)"
        shown=1
      fi
      echo
      echo "### ${names[$i]}: ${statuses[$i]}"
      echo
      echo '```'
      tail -n 30 "$logs/${names[$i]}.log"
      echo '```'
    done
  } >"$summary"
  mv "$summary" "$out_dir/summary.md"
  tar -czf "$out_dir/logs.tar.gz.partial" -C "$(dirname "$logs")" "$(basename "$logs")" 2>/dev/null &&
    mv "$out_dir/logs.tar.gz.partial" "$out_dir/logs.tar.gz"
  true
}

# gpu_smoke: sets smoke_status and smoke_text; returns non-zero when the run must stop.
run_smoke() {
  local smoke="$unpacked/tools/gpu_smoke" rc=0
  if [ ! -x "$smoke" ]; then
    smoke_status="the bundle has no tools/gpu_smoke (rebuild with tools/gpu_check.sh build)"
    return 1
  fi
  if [ -n "${missing_of[gpu_smoke]:-}" ]; then
    smoke_status="gpu_smoke cannot start: missing ${missing_of[gpu_smoke]}$(no_gpu_hints)"
    return 1
  fi
  timeout -k 5 90 "$smoke" >"$logs/gpu_smoke.log" 2>&1 </dev/null || rc=$?
  smoke_text=$(tail -n 40 "$logs/gpu_smoke.log")
  case "$rc" in
    0) smoke_status="ok ($(grep -m1 '^device 0:' "$logs/gpu_smoke.log" | sed 's/^device 0: //'))"; return 0 ;;
    2) smoke_status="no GPU usable: $(grep -m1 '^no GPU: ' "$logs/gpu_smoke.log" | sed 's/^no GPU: //')" ;;
    3) smoke_status="gpu_smoke was built without CUDA (rebuild with tools/gpu_check.sh build)" ;;
    124 | 137) smoke_status="gpu_smoke did not finish within 90 s (a hung driver or NCCL)" ;;
    *) smoke_status="the smoke check failed on the GPU (exit $rc): $(grep -m1 '^FAIL' "$logs/gpu_smoke.log" || tail -n 1 "$logs/gpu_smoke.log")" ;;
  esac
  return 1
}

# What the machine says about its GPUs, for a smoke check that could not even start.
no_gpu_hints() {
  [ -n "$(ls /dev/nvidia* 2>/dev/null)" ] || printf '; no GPU: no /dev/nvidia* device files'
  [ -n "${CUDA_VISIBLE_DEVICES+set}" ] && [ -z "$CUDA_VISIBLE_DEVICES" ] &&
    printf '; no GPU: CUDA_VISIBLE_DEVICES is set but empty'
  true
}

# ---------------------------------------------------------------------------------------------

cmd_run() {
  local filter="." skip_bench=0 skip_tests=0 rerun=""
  gtest_filter="" sanitizer="" launch_blocking=""
  out_dir=${OUT:-} bundle=${GPU_CHECK_BUNDLE:-$root/gpu_bin} commands=${GPU_CHECK_COMMANDS:-$root/bench/gpu_commands.txt}
  python=${GPU_CHECK_PYTHON:-}
  local timeout_given=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --out) out_dir=$2; shift ;;
      --out=*) out_dir=${1#*=} ;;
      --timeout) timeout_given=$2; shift ;;
      --timeout=*) timeout_given=${1#*=} ;;
      --deadline) deadline_s=$2; shift ;;
      --deadline=*) deadline_s=${1#*=} ;;
      --filter) filter=$2; shift ;;
      --filter=*) filter=${1#*=} ;;
      --gtest-filter) gtest_filter=$2; shift ;;
      --gtest-filter=*) gtest_filter=${1#*=} ;;
      --skip-bench) skip_bench=1 ;;
      --skip-tests) skip_tests=1 ;;
      --bundle) bundle=$2; shift ;;
      --bundle=*) bundle=${1#*=} ;;
      --commands) commands=$2; shift ;;
      --commands=*) commands=${1#*=} ;;
      --python) python=$2; shift ;;
      --python=*) python=${1#*=} ;;
      --rerun) rerun=$2; shift ;;
      --rerun=*) rerun=${1#*=} ;;
      --sanitizer) sanitizer=compute-sanitizer ;;
      --launch-blocking) launch_blocking=1 ;;
      *) die "run: unknown argument '$1' (tools/gpu_check.sh help)" ;;
    esac
    shift
  done
  [ -n "$timeout_given" ] && timeout_s=$timeout_given
  [[ "$timeout_s" =~ ^[0-9]+$ && "$deadline_s" =~ ^[0-9]+$ ]] || die "--timeout and --deadline take seconds"
  if [ -n "$sanitizer" ] || [ -n "$launch_blocking" ]; then
    [ -n "$rerun" ] || die "--sanitizer and --launch-blocking go with --rerun NAME"
  fi
  start_s=$(now)
  deadline_at=$((start_s + deadline_s))
  [ -d "$bundle" ] || die "no bundle at $bundle; run 'tools/gpu_check.sh build' first"
  bundle=$(cd "$bundle" && pwd)
  out_dir=${out_dir:-$bundle/out}
  mkdir -p "$out_dir"
  out_dir=$(cd "$out_dir" && pwd)
  # Only what an earlier run wrote here goes.
  rm -f "$out_dir"/{env.txt,summary.md,logs.tar.gz,summary.md.partial,logs.tar.gz.partial} "$out_dir"/bench_*
  if [ -z "$python" ]; then
    if [ -x /opt/torch/.venv/bin/python3 ]; then python=/opt/torch/.venv/bin/python3; else python=$(command -v python3 || echo python3); fi
  fi
  unpacked=${GPU_CHECK_UNPACK_DIR:-$bundle/unpacked}
  logs=${GPU_CHECK_LOG_DIR:-$bundle/logs}
  results="$logs/results"
  rm -rf "$logs"
  mkdir -p "$logs" "$results"
  work_tmp=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
  trap 'rm -rf "$work_tmp"' EXIT
  export PYTHONUNBUFFERED=1
  if [ "$(id -u)" -eq 0 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  fi
  if [ -n "$sanitizer" ]; then
    sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
    [ -n "$sanitizer" ] || die "compute-sanitizer not found (PATH, /usr/local/cuda/bin): the PyTorch wheels do not ship it"
    [ -n "$timeout_given" ] || timeout_s=400 # memcheck runs many times slower
  fi

  if [ -z "$rerun" ]; then
    start_python_probe
    write_env_machine
  fi
  unpack_bundle
  setup_libraries
  # TESSEL_REQUIRE_GPU: a gpu test that would skip for lack of a device fails instead.
  export TESSEL_REQUIRE_GPU=1

  if [ -n "$rerun" ]; then
    run_title="GPU check, rerun of $rerun"
    deadline_at=0
    collect_entries "." 0 0
    local i found=""
    for i in "${!names[@]}"; do [ "${names[$i]}" = "$rerun" ] && found=$i; done
    [ -n "$found" ] || die "--rerun: no test binary or bench label '$rerun' (have: ${names[*]})"
    [ -n "$sanitizer" ] && [ "${kinds[$found]}" = bench ] && die "--sanitizer takes a test binary, not a bench line"
    local entry_kind=${kinds[$found]} entry_command=${commands_of[$found]} entry_timeout=${timeouts[$found]}
    [ -n "$timeout_given$sanitizer" ] && entry_timeout=$timeout_s
    names=() kinds=() commands_of=() timeouts=() statuses=() counts=() seconds=() notes=()
    add_entry "$entry_kind" "$rerun" "$entry_command" "$entry_timeout"
    smoke_status="not run (rerun)"
    run_entry 0
    write_summary finished
    echo "--- $logs/$rerun.log (end)"
    tail -n 60 "$logs/$rerun.log"
    echo "gpu_check: $rerun: ${statuses[0]}; $out_dir/summary.md"
    is_ok 0
    return
  fi

  collect_entries "$filter" "$skip_tests" "$skip_bench"
  write_env_binaries
  finish_env
  echo "gpu_check: wrote $out_dir/env.txt ($(($(now) - start_s))s)"

  if ! run_smoke; then
    local i reason="no GPU"
    [[ "$smoke_status" == "no GPU"* ]] || reason="smoke check failed"
    for i in "${!names[@]}"; do
      if [ -n "${missing_of[${names[$i]}]:-}" ]; then
        statuses[$i]="not run: missing ${missing_of[${names[$i]}]}"
      else
        statuses[$i]="not run: $reason"
      fi
    done
    write_summary stopped
    echo "gpu_check: STOPPED: $smoke_status" >&2
    [ -n "$smoke_text" ] && echo "$smoke_text" >&2
    echo "gpu_check: $out_dir/summary.md" >&2
    exit 2
  fi
  echo "gpu_check: smoke check $smoke_status"

  local i
  for i in "${!names[@]}"; do
    run_entry "$i"
    write_summary running
  done
  write_summary finished
  echo
  sed -n '1,/^## /p' "$out_dir/summary.md" | sed '$d'
  local bad=0
  for i in "${!names[@]}"; do is_ok "$i" || bad=1; done
  [ "${#names[@]}" -gt 0 ] || bad=1
  return "$bad"
}

case "${1:-}" in
  build) shift; cmd_build "$@" ;;
  run) shift; cmd_run "$@" ;;
  -h | --help | help | "") usage ;;
  *) echo "gpu_check: unknown command '$1'" >&2; usage; exit 2 ;;
esac
