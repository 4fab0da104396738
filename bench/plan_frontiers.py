#!/usr/bin/python3
"""The planner's frontiers at cluster scale, with and without ZeRO points.

Plans BERT large (sequence 128) and ResNet-152 (224x224) on the h200_cluster profile (8 H200 per
node, NVLink inside a node, InfiniBand between nodes) for 8, 64 and 512 devices, once with no
ZeRO (--zero=0) and once with ZeRO stages 1, 2 and 3 as frontier points of their own
(--zero=0,1,2,3); Adam, the default global batch (8 samples per device for BERT, 32 for ResNet),
recomputation fractions 1, 0.5 and 0.25; ResNet's batch norms normalise each rank's rows
(--batch_norm=per_rank, DDP's way at this scale). Writes bench/results/planner_frontiers.md (the
frontiers' ends, the planning time of each: the median of 5 runs with the range),
planner_frontiers.jsonl (every point, every run's times) and planner_frontiers.png.
Deterministic, except the planning times; about 2 minutes on a quiet machine.

Usage: bench/plan_frontiers.py [--no-build] [--out bench/results]
"""
import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = ["bert_large", "resnet152"]
DEVICES = [8, 64, 512]
ZERO = {"without ZeRO": "0", "with ZeRO 1, 2 and 3": "0,1,2,3"}
GIB = 1024.0 ** 3
REPEATS = 5  # runs of each plan: its planning time is the median, with the range


def plan(model, devices, zero, scratch):
    frontier_path = os.path.join(scratch, f"{model}_{devices}_{zero.replace(',', '')}.json")
    command = [os.path.join(ROOT, "bazel-bin", "tools", "plan", "plan"), "--model=" + model,
               f"--devices={devices}", "--zero=" + zero, "--frontier_json=" + frontier_path]
    if model.startswith("resnet"):
        command.append("--batch_norm=per_rank")
    timings = []  # (trace, frontier, total) seconds of each run
    for _ in range(REPEATS):
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        if result.returncode != 0:
            sys.exit(f"plan_frontiers: {' '.join(command)} failed:\n{result.stderr}")
        timing = re.search(r"traced in ([0-9.]+) s, frontier in ([0-9.]+) s, ([0-9.]+) s in all",
                           result.stdout)
        if not timing:
            sys.exit("plan_frontiers: no timing line in the plan's output")
        timings.append([float(group) for group in timing.groups()])
    with open(frontier_path, encoding="utf-8") as source:
        frontier = json.load(source)  # the same points every run: the planner is deterministic
    frontier["command"] = "plan " + " ".join(command[1:-1])
    for column, key in enumerate(("trace_s", "frontier_s", "total_s")):
        frontier[key + "_runs"] = [run[column] for run in timings]
        frontier[key] = statistics.median(frontier[key + "_runs"])
    frontier["zero"] = zero
    return frontier


def describe(point):
    return (f"{point['memory_bytes'] / GIB:.2f} GiB, {point['time_s'] * 1e3:.1f} ms: "
            f"{point['summary']}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--no-build", action="store_true")
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    args = parser.parse_args()
    if not args.no_build:
        subprocess.run(["bazel", "build", "//tools/plan"], cwd=ROOT, check=True)
    commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    # The planning times are measured: on a quiet machine only (bench/harness.py).
    quiet = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "harness.py"), "quiet",
                            "--max-wait", "300"], cwd=ROOT, capture_output=True, text=True)
    if quiet.returncode != 0:
        sys.exit(f"plan_frontiers: {quiet.stderr.strip() or 'the machine is busy'}")
    runs = []
    with tempfile.TemporaryDirectory() as scratch:
        for model in MODELS:
            for devices in DEVICES:
                for label, zero in ZERO.items():
                    print(f"plan_frontiers: {model} on {devices} devices {label}", file=sys.stderr)
                    runs.append(plan(model, devices, zero, scratch))

    with open(os.path.join(args.out, "planner_frontiers.jsonl"), "w", encoding="utf-8") as out:
        for run in runs:
            out.write(json.dumps(run) + "\n")

    figure, axes = plt.subplots(len(MODELS), len(DEVICES), figsize=(15, 8.5))
    for row, model in enumerate(MODELS):
        for column, devices in enumerate(DEVICES):
            axis = axes[row][column]
            for run in runs:
                if run["model"] != model or run["devices"] != devices:
                    continue
                points = run["points"]
                if run["zero"] == "0":
                    axis.plot([p["memory_bytes"] / GIB for p in points],
                              [p["time_s"] * 1e3 for p in points], "k.-", label="without ZeRO")
                    continue
                for stage, style in ((0, "C0o"), (1, "C1s"), (2, "C3^"), (3, "C2v")):
                    chosen = [p for p in points if p.get("zero_stage", 0) == stage]
                    if chosen:
                        axis.plot([p["memory_bytes"] / GIB for p in chosen],
                                  [p["time_s"] * 1e3 for p in chosen], style, mfc="none",
                                  label="with ZeRO: stage %d" % stage if stage else
                                  "with ZeRO run: stage 0 points")
            axis.set_xscale("log")
            axis.set_yscale("log")
            axis.set_title(f"{model}, {devices} devices")
            axis.set_xlabel("memory per device (GiB)")
            axis.set_ylabel("time per iteration (ms)")
            axis.grid(True, which="both", alpha=0.3)
            axis.legend(fontsize=7)
    figure.suptitle("Planner frontiers on h200_cluster (Adam; recomputation 1, 0.5, 0.25 of the "
                    "activations)")
    figure.tight_layout()
    figure.savefig(os.path.join(args.out, "planner_frontiers.png"), dpi=110)

    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    lines = [
        "# The planner's frontiers at cluster scale, with and without ZeRO",
        "",
        f"Made by `bench/plan_frontiers.py` on {now} (UTC), Tessel at commit {commit}. Every "
        "figure but the planning times is deterministic (the planner's prices on the "
        "`h200_cluster` profile: 8 H200 per node, NVLink inside a node, InfiniBand between "
        "nodes). Adam (two state tensors per parameter), default global batch (8 samples per "
        "device for BERT, sequence 128; 32 per device for ResNet, 224x224), recomputation "
        "fractions 1, 0.5 and 0.25; ResNet's batch norms normalise each rank's rows "
        "(`--batch_norm=per_rank`, as DDP does; the whole batch's statistics would add two small "
        "collectives per batch norm over every data-parallel device). Raw points: "
        "planner_frontiers.jsonl (with each run's "
        f"command). Machine at the start: {quiet.stdout.strip()}.",
        "",
        "ZeRO points are priced as `parallel::ZeroOptimizer` runs them: one collective per "
        "parameter tensor (stage 1: an all-gather of the updated parameters after DDP's bucketed "
        "all-reduce; stage 2: a reduce-scatter of each gradient and the all-gather; stage 3: the "
        "reduce-scatter, an all-gather of each parameter for its forward op and another for the "
        "backward op that reads it, the whole parameter and its gradient held at that op), so each "
        "pays the ring latency of its group once per tensor. The recipes run ZeRO (`--zero`, or a "
        "plan file's `zero_stage`) over each data-parallel group, beside BERT's tensor-parallel "
        "split too.",
        "",
        "![frontiers](planner_frontiers.png)",
        "",
        f"| model | devices | ZeRO | points | least memory per device | fastest | planning time: "
        f"median of {REPEATS} runs (range; trace + frontier medians) |",
        "| --- | ---: | --- | ---: | --- | --- | ---: |",
    ]
    for run in runs:
        points = run["points"]
        least = min(points, key=lambda p: (p["memory_bytes"], p["time_s"]))
        fastest = min(points, key=lambda p: (p["time_s"], p["memory_bytes"]))
        label = [name for name, value in ZERO.items() if value == run["zero"]][0]
        lines.append(f"| {run['model']} | {run['devices']} | {label} | {len(points)} | "
                     f"{describe(least)} | {describe(fastest)} | {run['total_s']:.2f} s "
                     f"({min(run['total_s_runs']):.2f}-{max(run['total_s_runs']):.2f}; "
                     f"{run['trace_s']:.2f} + {run['frontier_s']:.2f}) |")
    lines += ["", "What ZeRO adds at the low-memory end, per model and device count:", "",
              "| model | devices | least memory without ZeRO | with ZeRO | time at that point, "
              "without / with |", "| --- | ---: | ---: | ---: | --- |"]
    for model in MODELS:
        for devices in DEVICES:
            pair = {run["zero"]: run for run in runs
                    if run["model"] == model and run["devices"] == devices}
            least = {zero: min(run["points"], key=lambda p: (p["memory_bytes"], p["time_s"]))
                     for zero, run in pair.items()}
            plain, zero = least["0"], least["0,1,2,3"]
            lines.append(f"| {model} | {devices} | {plain['memory_bytes'] / GIB:.2f} GiB | "
                         f"{zero['memory_bytes'] / GIB:.2f} GiB (stage "
                         f"{zero.get('zero_stage', 0)}) | {plain['time_s'] * 1e3:.1f} ms / "
                         f"{zero['time_s'] * 1e3:.1f} ms |")
    with open(os.path.join(args.out, "planner_frontiers.md"), "w", encoding="utf-8") as out:
        out.write("\n".join(lines) + "\n")
    print("plan_frontiers: wrote planner_frontiers.md, .jsonl and .png", file=sys.stderr)


if __name__ == "__main__":
    main()
