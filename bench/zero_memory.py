#!/usr/bin/python3
"""ZeRO on 2 ranks: the memory each stage saves, measured against the planner's price.

Runs bench/parallel_bench under `mpirun -np 2` (dp = 2) for BERT mini (AdamW, 8 sequences of 128
tokens per rank) and ResNet-50 (SGD with momentum, 4 images of 128x128 per rank) with --zero=0, 1,
2 and 3, and plans the same runs with //tools/plan (--zero=Z --max_tp=1 --remat=1 --any_plan on
the cpu_2core_quiet profile). Writes bench/results/zero.md and zero.jsonl. Peak memory is
deterministic; the step times are medians of 3 steps of one run each (not a comparison: ZeRO's
price in time on 2 cores is what the planner prices, shown beside it). About 3 minutes.

Usage: bench/zero_memory.py [--no-build] [--force]
"""
import argparse
import datetime
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 1024.0 ** 2
CASES = [
    ("bert_mini", ["--model=bert_mini", "--seq=128", "--batch_per_rank=8"],
     ["--model=bert_mini", "--batch=16", "--seq=128", "--optimizer=adamw"]),
    ("resnet50", ["--model=resnet50", "--image_size=128", "--batch_per_rank=4"],
     ["--model=resnet50", "--batch=8", "--image_size=128", "--optimizer=sgd_momentum"]),
]


def measure(flags, zero):
    command = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2",
               os.path.join(ROOT, "bazel-bin", "bench", "parallel_bench")] + flags + [
                   "--steps=3", f"--zero={zero}"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"zero_memory: {' '.join(command)} failed:\n{result.stderr[-2000:]}")
    line = [l for l in result.stdout.splitlines() if l.startswith("{")][-1]
    measured = json.loads(line)
    measured["command"] = " ".join(command[6:])
    return measured


def predict(flags, zero):
    command = [os.path.join(ROOT, "bazel-bin", "tools", "plan", "plan"), "--devices=2",
               "--profile=cpu_2core_quiet", f"--zero={zero}", "--max_tp=1", "--remat=1",
               "--any_plan"] + flags
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"zero_memory: {' '.join(command)} failed:\n{result.stderr}")
    chosen = re.search(r"chosen: point \d+, ([0-9.]+) (MiB|GiB) per device .*?, ([0-9.]+) (ms|s) "
                       r"per iteration: (.*)", result.stdout)
    state = re.search(r"parameters, gradients and optimizer state ([0-9.]+) (MiB|GiB)",
                      result.stdout)
    if not chosen or not state:
        sys.exit("zero_memory: no chosen plan in the planner's output")
    scale = {"MiB": 1.0, "GiB": 1024.0}
    return {"memory_mib": float(chosen.group(1)) * scale[chosen.group(2)],
            "step_s": float(chosen.group(3)) / (1000.0 if chosen.group(4) == "ms" else 1.0),
            "summary": chosen.group(5),
            "state_mib": float(state.group(1)) * scale[state.group(2)],
            "command": "plan " + " ".join(command[1:])}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--no-build", action="store_true")
    parser.add_argument("--force", action="store_true", help="measure on a busy machine too")
    args = parser.parse_args()
    if not args.no_build:
        subprocess.run(["bazel", "build", "//bench:parallel_bench", "//tools/plan"], cwd=ROOT,
                       check=True)
    quiet = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "harness.py"), "quiet",
                            "--max-wait", "300"] + (["--force"] if args.force else []),
                           cwd=ROOT, capture_output=True, text=True)
    if quiet.returncode != 0:
        sys.exit(f"zero_memory: {quiet.stderr.strip() or 'the machine is busy'}")
    commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    start = datetime.datetime.now(datetime.timezone.utc)
    rows = []
    for model, bench_flags, plan_flags in CASES:
        for zero in (0, 1, 2, 3):
            print(f"zero_memory: {model} --zero={zero}", file=sys.stderr)
            rows.append({"model": model, "zero": zero, "measured": measure(bench_flags, zero),
                         "predicted": predict(plan_flags, zero)})
    with open(os.path.join(ROOT, "bench", "results", "zero.jsonl"), "w") as out:
        for row in rows:
            out.write(json.dumps(row) + "\n")

    lines = [
        "# ZeRO on 2 ranks: memory saved, measured against the planner",
        "",
        f"Made by `bench/zero_memory.py` on {start:%Y-%m-%d %H:%M} (UTC), Tessel at commit "
        f"{commit}; machine at the start: {quiet.stdout.strip()}. Each row: `mpirun -np 2 "
        "bench/parallel_bench` (dp = 2, one thread per rank) with `--zero=0`, `1`, `2` or `3`: peak "
        "memory allocated per rank (the larger of the two ranks, over 3 timed steps after a "
        "warm-up step; deterministic), and the median step time of those 3 steps (one run, not "
        "interleaved: an indication only). Predicted: `plan --devices=2 --profile="
        "cpu_2core_quiet --zero=Z --max_tp=1 --remat=1 --any_plan` for the same model, batch and "
        "optimizer; its memory is parameters, gradients and optimizer state plus the activations "
        "kept for backward. Commands and every figure: zero.jsonl.",
        "",
        "| model | --zero | measured peak per rank | saved vs --zero=0 | predicted memory per "
        "device | of it: parameters, gradients, state | predicted saving | measured step | "
        "predicted step |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        base = next(r for r in rows if r["model"] == row["model"] and r["zero"] == 0)
        peak = row["measured"]["peak_bytes"] / MIB
        saved = (base["measured"]["peak_bytes"] - row["measured"]["peak_bytes"]) / MIB
        predicted_saved = base["predicted"]["memory_mib"] - row["predicted"]["memory_mib"]
        lines.append(
            f"| {row['model']} | {row['zero']} | {peak:.1f} MiB | {saved:.1f} MiB | "
            f"{row['predicted']['memory_mib']:.1f} MiB | {row['predicted']['state_mib']:.1f} MiB"
            f" | {predicted_saved:.1f} MiB | {row['measured']['step_s']:.3f} s | "
            f"{row['predicted']['step_s']:.3f} s |")
    with open(os.path.join(ROOT, "bench", "results", "zero.md"), "w") as out:
        out.write("\n".join(lines) + "\n")
    print("zero_memory: wrote bench/results/zero.md and zero.jsonl", file=sys.stderr)


if __name__ == "__main__":
    main()
