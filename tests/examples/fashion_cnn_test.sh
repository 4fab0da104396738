#!/usr/bin/env bash
# examples/fashion_cnn on a tiny synthetic Fashion-MNIST (class k lights up row block k): alone
# (saved as safetensors and reloaded into a new model with the same accuracy), inside a memory
# budget, and on two ranks through DDP; each run reports a test accuracy. Then the planner's
# prices for it (--plan), and a tensor-parallel point of them trained as planned on two ranks.
# Usage: fashion_cnn_test.sh FASHION_CNN
set -euo pipefail
example="$PWD/$1"
dir="${TEST_TMPDIR:-/tmp}/fashion"
export OMPI_MCA_rmaps_base_oversubscribe=yes
# Each mpirun gets a directory of its own for its session files and shared-memory segments:
# tests run at once share /tmp and /dev/shm, and mpiruns whose pids are equal in their
# sandboxes' namespaces would otherwise share them (segfaults in the shared-memory transport).
# A short path: OpenMPI's Unix socket paths must stay under 108 characters.
mpi_dir=$(mktemp -d /tmp/ompi.XXXXXX)
trap 'rm -rf "$mpi_dir"' EXIT
export OMPI_MCA_orte_tmpdir_base="$mpi_dir" OMPI_MCA_btl_vader_backing_directory="$mpi_dir"
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"  # OpenMPI's own leaks

/usr/bin/python3 - "$dir" <<'PY'
import gzip, os, struct, sys
directory = sys.argv[1]
os.makedirs(directory, exist_ok=True)
for prefix, count in (("train", 256), ("t10k", 40)):
    labels = bytes(i % 10 for i in range(count))
    images = bytearray()
    for label in labels:
        image = bytearray(28 * 28)
        for row in range(label * 2, label * 2 + 3):
            image[row * 28:(row + 1) * 28] = b"\xff" * 28
        images += image
    with gzip.open(f"{directory}/{prefix}-images-idx3-ubyte.gz", "wb") as out:
        out.write(struct.pack(">IIII", 0x803, count, 28, 28) + bytes(images))
    with gzip.open(f"{directory}/{prefix}-labels-idx1-ubyte.gz", "wb") as out:
        out.write(struct.pack(">II", 0x801, count) + labels)
PY

"$example" --data="$dir" --epochs=2 --steps=3 --threads=1 --save="$dir/model.safetensors" |
  tee "$dir/alone.txt"
grep -q '^3 steps, test accuracy' "$dir/alone.txt"
# The model saved as safetensors and loaded into a new one classifies the test set the same.
trained=$(sed -n 's/^3 steps, test accuracy \([0-9.]*\).*/\1/p' "$dir/alone.txt")
grep -q "^saved to $dir/model.safetensors and loaded into a new model: test accuracy $trained\$" \
  "$dir/alone.txt"

"$example" --data="$dir" --steps=2 --threads=1 --budget=64MiB | tee "$dir/budget.txt"
grep -q '^2 steps, test accuracy .*; memory: policy auto, budget 64.00 MiB' "$dir/budget.txt"

"$example" --data="$dir" --epochs=2 --steps=3 --threads=1 --budget=0.5 | tee "$dir/fraction.txt"
grep -q '^3 steps, test accuracy .*; memory: policy auto, budget ' "$dir/fraction.txt"

mpirun --allow-run-as-root --oversubscribe -np 2 "$example" --data="$dir" --steps=2 \
  --threads=1 | tee "$dir/ranks.txt"
grep -q '^2 steps, test accuracy' "$dir/ranks.txt"
# --plan: the planner's frontier for this model on 4 CPU devices, a data-parallel plan chosen.
"$example" --plan=4 | tee "$dir/plan.txt"
grep -q '^fashion_cnn: .* batch 128 on 4 devices of profile ' "$dir/plan.txt"
grep -q '<- chosen' "$dir/plan.txt"
grep -q '^chosen: point .*dp=' "$dir/plan.txt"
# A tensor-parallel point of the 2-device frontier, trained as planned on two ranks
# (parallel::ParallelModule).
"$example" --plan=2 | tee "$dir/plan2.txt"
point=$(sed -n 's/^[ *]*\([0-9][0-9]*\) .* tp=2, .*/\1/p' "$dir/plan2.txt" | head -n 1)
test -n "$point"
mpirun --allow-run-as-root --oversubscribe -np 2 "$example" --data="$dir" --plan=2 \
  --point="$point" --steps=2 --threads=1 | tee "$dir/planned.txt"
grep -q "^training point $point: tp=2, " "$dir/planned.txt"
grep -q '^2 steps as planned, test accuracy' "$dir/planned.txt"
echo "fashion_cnn_test: PASS"
