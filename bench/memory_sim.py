#!/usr/bin/python3
"""The memory policies in the simulated H200: bench/results/memory_sim.md, .jsonl and .png.

Runs //bench:memory_sweep --simulate (the memory layer over ops on the meta device, step times
from a device profile, deterministic: the same figures on any machine at any load, for the same
build) for each
model below: slowdown against the unconstrained step at fractions of the whole peak (the DTR
paper's measure) and of the activation memory (the goals), and the largest batch that trains
within a fixed budget, per policy (a batch whose step is more than 10x the unconstrained step
at that batch counts as not training: thrashing); then the CPU regime (memory.md's models on the
CPU profile, where swapping is cheap). Prints progress. On two cores the whole run takes about
40 minutes.

  bench/memory_sim.py                      # everything, into bench/results/
  bench/memory_sim.py --cases resnet50     # one model's sweep (ids below), no largest batch
"""
import argparse
import concurrent.futures
import datetime
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results")
PROFILE = "parallel/profiles/h200_cluster.json"
POLICIES = "dtr,swap,auto"

# id: (memory_sweep flags, whole-peak fractions)
SWEEPS = {
    # The DTR paper's ResNet-1202 (He et al.'s CIFAR-10 ResNet) at its batch and budgets.
    "cifar_resnet1202": (["--model=cifar_resnet1202", "--batch=64", "--image=32"], "0.9,0.45,0.22"),
    "resnet50": (["--model=resnet50", "--batch=128"], "0.9,0.7,0.5,0.45,0.3,0.22"),
    "resnet152": (["--model=resnet152", "--batch=128"], "0.9,0.7,0.45,0.3,0.22"),
    "shufflenet_v2_x2_0": (["--model=shufflenet_v2_x2_0", "--batch=256"],
                           "0.9,0.7,0.45,0.3,0.22"),
    "bert_base": (["--model=bert_base", "--batch=32", "--seq=512", "--vocab=30522"],
                  "0.9,0.6,0.45,0.3,0.2"),
    "bert_large": (["--model=bert_large", "--batch=8", "--seq=512", "--vocab=30522"],
                   "0.9,0.6,0.45,0.3,0.2"),
}
# The goals are set on the activation memory: budget = fixed + f * (peak - fixed).
ACTIVATION_SWEEPS = {"resnet50": "0.5,0.2", "bert_base": "0.5,0.2"}
# id: (memory_sweep flags, [(budget, largest batch tried)]): an H100's 80 GB and an H200's 141 GB.
LARGEST = {
    "resnet50": (["--model=resnet50"], [("80GB", 8192), ("141GB", 16384)]),
    "bert_base": (["--model=bert_base", "--seq=512", "--vocab=30522"],
                  [("80GB", 2048), ("141GB", 4096)]),
}
LARGEST_POLICIES = "none,dtr,swap,auto"
LARGEST_MAX_SLOWDOWN = 10
# Steps differ by what earlier ones left behind, and auto runs each of its five ways (mixed,
# recompute first, recompute only, planned at two headrooms) for a few steps from the second step
# under pressure (memory/way_chooser.h): every sweep point is the median of 5 steps after 8 warm-up steps, and
# memory_sweep adds warm-up steps while auto still tries its ways.
STEP_FLAGS = ["--warmup=8", "--steps=5"]
# The CPU regime: the 2-core machine's calibrated profile and the 25 GB/s host link the memory
# layer simulates on the CPU, where copies are about as fast as compute and swapping is cheap;
# memory.md's models, batches and fractions of the activations, measured there in wall time.
CPU_PROFILE = "parallel/profiles/cpu_2core_quiet.json"
CPU_SWEEPS = {
    "resnet50_cpu": ["--model=resnet50", "--batch=8", "--image=224"],
    "shufflenet_v2_x1_0_cpu": ["--model=shufflenet", "--batch=16", "--image=224"],
    "bert_mini_cpu": ["--model=bert_mini", "--batch=8", "--seq=128"],
}
CPU_FRACTIONS = "1,0.5,0.3,0.2"
# One step's memory timeline: (case, memory_sweep flags), drawn by tools/plot_memory.py.
TIMELINE = ("resnet50", ["--model=resnet50", "--batch=128", "--policies=auto", "--fractions=0.2"])

# The papers' points (fraction of the whole peak, slowdown), for the tables and the plot.
PAPER_POINTS = {
    "DTR, ResNet-1202 batch 64 (8.9 GB peak)": [(0.9, 1.28), (0.45, 1.42), (0.22, 1.47)],
    "DTR, Transformer (9.9 GB peak)": [(0.6, 1.15), (0.2, 1.60)],
}


def sweep_binary():
    return os.path.join(ROOT, "bazel-bin", "bench", "memory_sweep")


def run_sweep(flags, log, profile=PROFILE):
    command = [sweep_binary(), "--simulate=" + profile] + flags
    if "--largest_batch" not in flags:
        command += STEP_FLAGS
    log.write("$ " + " ".join(command[1:]) + "\n")
    log.flush()
    started = time.time()
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        sys.stderr.write(result.stderr)
        raise SystemExit("memory_sim: memory_sweep failed: " + " ".join(command))
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    for line in lines:
        line["command"] = "memory_sweep " + " ".join(command[1:])
        line["simulator_wall_s"] = round(time.time() - started, 1)
    return lines


def fmt_bytes(value):
    return "%.2f GiB" % (value / 2**30)


def sweep_table(lines):
    reference = next(l for l in lines if l["kind"] == "reference")
    rows = [l for l in lines if l["kind"] == "sweep"]
    fractions = sorted({round(l["whole_peak_fraction"], 3) for l in rows}, reverse=True)
    policies = []
    for l in rows:
        if l["policy"] not in policies:
            policies.append(l["policy"])
    out = ["| fraction of the whole peak (of the activations) | budget | " +
           " | ".join(policies) + " |",
           "| ---: | ---: | " + " | ".join("---:" for _ in policies) + " |"]
    for fraction in fractions:
        cells = []
        budget = activation = 0
        for policy in policies:
            cell = next((l for l in rows if l["policy"] == policy and
                         round(l["whole_peak_fraction"], 3) == fraction), None)
            if cell is None:
                cells.append("")
                continue
            budget, activation = cell["budget_bytes"], cell["fraction"]
            if not cell["ok"]:
                cells.append("fails")
                continue
            per_step = cell["per_step"]
            detail = []
            if per_step["recomputed_bytes"]:
                detail.append("recomputes " + fmt_bytes(per_step["recomputed_bytes"]))
            if per_step["swapped_out_bytes"]:
                detail.append("swaps out " + fmt_bytes(per_step["swapped_out_bytes"]))
            if cell["stall_s"] > 0:
                detail.append("stalls %.1f ms" % (1e3 * cell["stall_s"]))
            cells.append("**%.2fx** (%s)" % (cell["slowdown"], ", ".join(detail) or "nothing moved"))
        out.append("| %.2f (%.2f) | %s | %s |" % (fraction, activation, fmt_bytes(budget),
                                                  " | ".join(cells)))
    head = ("%s, batch %d%s: unconstrained step %.1f ms simulated, peak %s, fixed (parameters, "
            "gradients, momentum) %s" %
            (reference["model"], reference["batch"],
             ", sequence %d, vocabulary %d" % (reference["seq"], reference["vocab"])
             if reference["model"].startswith("bert")
             else ", %dx%d" % (reference["image"], reference["image"]),
             1e3 * reference["step_s"], fmt_bytes(reference["peak_bytes"]),
             fmt_bytes(reference["fixed_bytes"])))
    return head, out


def largest_table(lines):
    out = ["| model | budget | policy | largest batch | first failing | simulated s per sample |"
           " vs none | fragmentation at the peak |",
           "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
    base = {}
    for l in lines:
        if l["policy"] == "none":
            base[(l["model"], l["budget_bytes"])] = l["batch"]
    for l in lines:
        none = base.get((l["model"], l["budget_bytes"]))
        ratio = l["batch"] / none if none else 0
        if "first_failure" not in l:
            failing = "none up to %d" % l["max_batch"]
        elif l["first_failure"].startswith("a step took more than"):
            failing = "%d (over %gx)" % (l["first_failing_batch"], l["max_slowdown"])
        else:
            failing = "%d (out of memory)" % l["first_failing_batch"]
        out.append("| %s | %s | %s | %d | %s | %.4g | %.1fx | %s |" %
                   (l["model"], fmt_bytes(l["budget_bytes"]), l["policy"], l["batch"], failing,
                    l["seconds_per_sample"], ratio,
                    fmt_bytes(l["reserved_at_peak_bytes"] - l["peak_bytes"])))
    return out


def plot(sweeps, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("memory_sim: matplotlib missing, no plot")
        return False
    ids = list(sweeps)
    figure, axes = plt.subplots(1, len(ids), figsize=(4.2 * len(ids), 3.8), squeeze=False)
    for axis, case in zip(axes[0], ids):
        rows = [l for l in sweeps[case] if l["kind"] == "sweep"]
        for policy, marker in (("dtr", "o"), ("swap", "s"), ("auto", "^")):
            points = sorted((l["whole_peak_fraction"], l["slowdown"]) for l in rows
                            if l["policy"] == policy and l["ok"])
            if points:
                axis.plot([p[0] for p in points], [p[1] for p in points], marker=marker,
                          label=policy)
        paper = PAPER_POINTS["DTR, Transformer (9.9 GB peak)" if case.startswith("bert") else
                             "DTR, ResNet-1202 batch 64 (8.9 GB peak)"]
        axis.plot([p[0] for p in paper], [p[1] for p in paper], "k--x", label="DTR paper")
        axis.set_title(case)
        axis.set_xlabel("budget / whole peak")
        axis.set_ylabel("slowdown (simulated H200)")
        axis.invert_xaxis()
        axis.set_ylim(bottom=1.0)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    return True


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(SWEEPS),
                        help="sweep ids (default: all), comma-separated: " + ", ".join(SWEEPS))
    parser.add_argument("--no-largest", action="store_true", help="skip the largest-batch runs")
    parser.add_argument("--no-cpu", action="store_true", help="skip the CPU regime's runs")
    parser.add_argument("--no-build", action="store_true")
    parser.add_argument("--out", default=RESULTS)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="sweeps run at once (default: one per core)")
    args = parser.parse_args()
    cases = [c for c in args.cases.split(",") if c]
    for case in cases:
        if case not in SWEEPS:
            raise SystemExit("memory_sim: unknown case %r (known: %s)" % (case, ", ".join(SWEEPS)))
    if not args.no_build:
        subprocess.run(["bazel", "build", "//bench:memory_sweep"], cwd=ROOT, check=True)
    os.makedirs(args.out, exist_ok=True)
    log = sys.stdout
    # Every sweep is its own deterministic process: run them side by side, the longest first.
    jobs = []
    for case in cases:
        flags, fractions = SWEEPS[case]
        jobs.append((("sweep", case), "%s at %s of the whole peak" % (case, fractions),
                     flags + ["--policies=" + POLICIES, "--whole_peak_fractions=" + fractions]))
        if case in ACTIVATION_SWEEPS:
            jobs.append((("activations", case),
                         "%s at %s of the activations" % (case, ACTIVATION_SWEEPS[case]),
                         flags + ["--policies=" + POLICIES,
                                  "--fractions=" + ACTIVATION_SWEEPS[case]]))
    if not args.no_largest:
        for case, (flags, budgets) in LARGEST.items():
            if case not in cases:
                continue
            for budget, max_batch in budgets:
                jobs.insert(0, (("largest", case, budget),
                                "largest %s batch within %s" % (case, budget),
                                flags + ["--largest_batch", "--budget=" + budget,
                                         "--max_batch=%d" % max_batch,
                                         "--max_slowdown=%g" % LARGEST_MAX_SLOWDOWN,
                                         "--policies=" + LARGEST_POLICIES]))
    if not args.no_cpu:
        for case, flags in CPU_SWEEPS.items():
            jobs.append((("cpu", case), "%s at %s of the activations" % (case, CPU_FRACTIONS),
                         flags + ["--policies=" + POLICIES, "--fractions=" + CPU_FRACTIONS]))
    json_path = os.path.join(args.out, "memory_sim_timeline.json")
    if TIMELINE[0] in cases:
        jobs.append((("timeline", TIMELINE[0]), "one step's timeline (%s)" % " ".join(TIMELINE[1]),
                     TIMELINE[1] + ["--memory_json=" + json_path]))

    def run_job(job):
        key, title, flags = job
        print("memory_sim: started %s" % title, flush=True)
        lines = run_sweep(flags, log, CPU_PROFILE if key[0] == "cpu" else PROFILE)
        print("memory_sim: finished %s (%.0f s)" % (title, lines[0]["simulator_wall_s"]),
              flush=True)
        return key, lines

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = dict(pool.map(run_job, jobs))
    sweeps = {case: results[("sweep", case)] for case in cases}
    activation_sweeps = {case: results[("activations", case)] for case in cases
                         if ("activations", case) in results}
    largest = [line for case, (_, budgets) in LARGEST.items() for budget, _ in budgets
               for line in results.get(("largest", case, budget), [])]
    cpu_sweeps = {case: results[("cpu", case)] for case in CPU_SWEEPS if ("cpu", case) in results}
    timeline = None
    if ("timeline", TIMELINE[0]) in results:
        timeline = results[("timeline", TIMELINE[0])][0]
        subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "tools", "plot_memory.py"),
                        json_path, "-o", os.path.join(args.out, "memory_sim_timeline.png"),
                        "--title", "ResNet-50 batch 128 under auto at f = 0.2 of its activations "
                        "(simulated H200): one training step"], cwd=ROOT, check=True)

    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    with open(os.path.join(args.out, "memory_sim.jsonl"), "w") as raw:
        for group in (sweeps, activation_sweeps, cpu_sweeps):
            for case, lines in group.items():
                for line in lines:
                    raw.write(json.dumps(dict(line, case=case)) + "\n")
        for line in largest:
            raw.write(json.dumps(line) + "\n")
    plotted = plot(sweeps, os.path.join(args.out, "memory_sim.png"))

    md = ["# Memory policies in the simulated H200", "",
          "Made by `bench/memory_sim.py` on %s (UTC), Tessel at commit %s. Every figure is "
          "simulated: the memory layer (caching allocator, residency manager, policies) runs for "
          "real over ops on the meta device, and time comes from the device profile `%s` (f32 "
          "GEMM 50 TFLOP/s, convolution 40 TFLOP/s, HBM 4 TB/s, 5 us per op, host link "
          "50 GB/s each way). The same command, built the same way (`bazel build -c opt`, gcc), "
          "gives the same figures on any machine at any "
          "load; raw lines (one per point, with the command): memory_sim.jsonl." %
          (stamp, commit, PROFILE), "",
          "- Slowdown: the simulated time of a training step (SGD with momentum; the median of "
          "5 steps after 8 or more warm-up steps under the budget, in which auto tries its five "
          "ways) "
          "over the unconstrained step. Fractions: budget over the whole "
          "unconstrained peak (the DTR paper's measure), in brackets the part of the "
          "activation memory that fits above the fixed memory.",
          "- Per cell: what the policy moved per step, and how long the compute stream waited "
          "for the host link (stalls).", ""]
    if plotted:
        md += ["![slowdown against the budget](memory_sim.png)", ""]
    md += ["The DTR paper's points (its own GPU measurements): " +
           "; ".join("%s: %s" % (name, ", ".join("%.2fx at %d%%" % (s, round(100 * f))
                                                   for f, s in points))
                     for name, points in PAPER_POINTS.items()) + ".", ""]
    for case, lines in sweeps.items():
        head, table = sweep_table(lines)
        md += ["## " + head, ""] + table + [""]
        if case in activation_sweeps:
            _, table = sweep_table(activation_sweeps[case])
            md += ["At fractions of the activation memory (the goals: auto at most 1.10x at "
                   "0.5 and 1.25x at 0.2):", ""] + table + [""]
    if timeline:
        md += ["## One step at f = 0.2", "",
               "ResNet-50, batch 128, under auto at 0.2 of its activation memory (%s budget): "
               "the allocated bytes of one training step (the last of 5 after 8 warm-up steps) "
               "with every "
               "eviction, recompute and swap, and the blocks after it (%.2fx the unconstrained "
               "step). Data: memory_sim_timeline.json (tools/plot_memory.py draws it)." %
               (fmt_bytes(timeline["budget_bytes"]), timeline["slowdown"]), "",
               "![one step under auto at f = 0.2](memory_sim_timeline.png)", ""]
    if largest:
        md += (["## Largest batch within a fixed budget", "",
               "The largest batch for which two training steps run within the budget, each "
               "at most %gx the unconstrained step at that batch (slower counts as thrashing; "
               "simulating such runs to the end took hours). Doubling, then bisection to within "
               "1/16. Fragmentation: the bytes reserved from the device beyond the peak of "
               "those allocated (MegEngine's measure)." % LARGEST_MAX_SLOWDOWN, ""] +
               largest_table(largest) + [""])
    if cpu_sweeps:
        md += ["## The CPU regime", "",
               "The same simulator with this repository's 2-core CPU profile (`%s`: one thread's "
               "rates beside another busy core) and the 25 GB/s host link the memory layer "
               "simulates on the CPU: copies about as fast as compute, so swapping is cheap. "
               "memory.md measures these models, batches and budgets in wall time on the CPU, "
               "where the steps move by 10-30%% with the machine's load; here the same choices "
               "cost the same every run. What the model leaves out: on two cores the copy thread "
               "takes CPU time and memory bandwidth from the compute. Fractions are of the "
               "activation memory, as in memory.md." % CPU_PROFILE, ""]
        for case, lines in cpu_sweeps.items():
            head, table = sweep_table(lines)
            md += ["### " + head.replace("ms simulated", "ms simulated on the CPU profile"), ""]
            md += table + [""]
    with open(os.path.join(args.out, "memory_sim.md"), "w") as out:
        out.write("\n".join(md))
    print("memory_sim: wrote %s" % os.path.join(args.out, "memory_sim.md"))


if __name__ == "__main__":
    main()
