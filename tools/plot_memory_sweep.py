#!/usr/bin/python3
"""Plots and tables of bench/memory_bench: reads the JSON lines of bench/memory_sweep (Tessel) and
bench/memory_sweep.py (PyTorch) and writes memory_sweep.png (step time relative to the
unconstrained run against the activation budget, one panel per model, a line per policy),
memory_largest_batch.png and the tables of memory.md.

    /usr/bin/python3 tools/plot_memory_sweep.py --tessel sweep.jsonl --torch torch.jsonl \\
        --outdir bench/results --command "bench/memory_bench" --notes notes.md
"""

import argparse
import datetime
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

POLICIES = ["dtr", "swap", "split", "auto"]
MODEL_TITLES = {"resnet50": "ResNet-50", "shufflenet": "ShuffleNet v2 x1.0",
                "bert_mini": "BERT mini"}
TARGETS = {0.5: 1.15, 0.3: 1.40}  # auto: at most this slowdown at activation fraction f


def mib(value):
    return f"{value / 2**20:.0f} MiB"


def read_lines(path):
    records = []
    if not path or not os.path.exists(path):
        return records
    with open(path) as handle:
        for line in handle:
            line = line.strip()
            if line.startswith("{"):
                records.append(json.loads(line))
    return records


def counters_text(per_step):
    parts = []
    for key, label in (("evictions", "ev"), ("recomputes", "rc"), ("swaps_out", "so"),
                       ("swaps_in", "si"), ("splits", "sp")):
        if per_step.get(key):
            parts.append(f"{per_step[key]} {label}")
    return ", ".join(parts) if parts else "-"


def describe_input(reference):
    model = reference["model"]
    if model == "bert_mini":
        return (f"batch {reference['batch']} x {reference.get('seq', 128)} tokens, vocabulary "
                f"{reference.get('vocab', 30522)}")
    size = reference.get("image", 224)
    return f"batch {reference['batch']}, {size}x{size}"


def plot_sweep(models, sweep, outdir):
    fig, axes = plt.subplots(2, len(models), figsize=(5 * len(models), 7.5), squeeze=False)
    for row, (key, what) in enumerate((("cpu_slowdown", "CPU time"), ("slowdown", "wall time"))):
        for axis, model in zip(axes[row], models):
            for policy in POLICIES:
                points = sorted((p["fraction"], p[key], p.get("slowdown_min"),
                                 p.get("slowdown_max")) for p in sweep
                                if p["model"] == model and p["policy"] == policy and p["ok"])
                if not points:
                    continue
                fractions = [p[0] for p in points]
                medians = [p[1] for p in points]
                if key == "slowdown" and all(p[2] is not None for p in points):
                    # The median with the range of the pairs' ratios.
                    errors = [[m - p[2] for m, p in zip(medians, points)],
                              [p[3] - m for m, p in zip(medians, points)]]
                    axis.errorbar(fractions, medians, yerr=errors, marker="o", capsize=3,
                                  label=policy)
                else:
                    axis.plot(fractions, medians, marker="o", label=policy)
            for fraction, target in TARGETS.items():
                axis.plot([fraction], [target], marker="_", markersize=18, color="black")
            axis.set_title(f"{MODEL_TITLES.get(model, model)}: {what}")
            axis.set_xlabel("activation budget f (budget = fixed + f * activations)")
            axis.set_ylabel(f"{what} per step / unconstrained")
            axis.invert_xaxis()
            axis.grid(alpha=0.3)
            axis.legend()
    fig.suptitle("Training under a memory budget: medians over pairs of runs, wall time with "
                 "the range (black bars: auto targets)")
    fig.tight_layout()
    path = os.path.join(outdir, "memory_sweep.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_largest(largest, outdir):
    if not largest:
        return None
    fig, axis = plt.subplots(figsize=(5, 3.5))
    labels = [p["policy"] for p in largest]
    axis.bar(labels, [p["batch"] for p in largest], color=["grey", "tab:blue"][: len(labels)])
    for index, point in enumerate(largest):
        axis.text(index, point["batch"], f"{point['batch']}", ha="center", va="bottom")
    model = MODEL_TITLES.get(largest[0]["model"], largest[0]["model"])
    axis.set_title(f"Largest batch within {mib(largest[0]['budget_bytes'])}: {model}")
    axis.set_ylabel("batch")
    fig.tight_layout()
    path = os.path.join(outdir, "memory_largest_batch.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def pairs_text(sweep):
    counts = sorted({p.get("pairs", 1) for p in sweep if p["ok"]})
    return "-".join(str(c) for c in counts) or "no"


def steps_text(models, sweep):
    parts = []
    for model in models:
        steps = sorted({len(p["step_times_s"]) for p in sweep if p["model"] == model and p["ok"]})
        if steps:
            parts.append(f"{'-'.join(map(str, steps))} for {MODEL_TITLES.get(model, model)}")
    return ", ".join(parts)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tessel", required=True, help="JSON lines of bench/memory_sweep")
    parser.add_argument("--torch", help="JSON lines of bench/memory_sweep.py")
    parser.add_argument("--outdir", default="bench/results")
    parser.add_argument("--command", default="bench/memory_bench")
    parser.add_argument("--notes", help="Markdown appended after the tables")
    parser.add_argument("--seconds", type=float, default=0, help="wall time of the whole run")
    parser.add_argument("--machine", help="how quiet the machine was (bench/harness.py quiet)")
    args = parser.parse_args()

    records = read_lines(args.tessel)
    torch_records = read_lines(args.torch)
    references = {r["model"]: r for r in records if r.get("kind") == "reference"}
    sweep = [r for r in records if r.get("kind") == "sweep"]
    largest = [r for r in records if r.get("kind") == "largest_batch"]
    models = [m for m in ("resnet50", "shufflenet", "bert_mini") if m in references]
    os.makedirs(args.outdir, exist_ok=True)
    plot_sweep(models, sweep, args.outdir)
    plot_largest(largest, args.outdir)

    out = []
    out.append("# Training under a memory budget: Tessel's policies and PyTorch's checkpointing\n")
    out.append(f"Made by `{args.command}` on {datetime.date.today().isoformat()}"
               + (f" in {args.seconds / 60:.1f} minutes" if args.seconds else "")
               + ". CPU only (the simulated device: one arena of the budget's size; swaps over a "
               "copy thread throttled to 25 GB/s), 2 threads on both sides, SGD with momentum "
               "0.9, random data. Each point: " + pairs_text(sweep) + " pairs of a budgeted and an "
               "unconstrained run, the first of each pair alternating; each run a fresh model, 1 "
               "warm-up step, then its timed steps (" + steps_text(models, sweep) + "), of which "
               "it counts the median.\n")
    if args.machine:
        out.append(f"Machine (bench/harness.py): {args.machine}.\n")
    out.append("Budgets are fractions f of the activation memory, `budget = fixed + f * (peak - "
               "fixed)` with fixed = parameters + gradients + momentum (as README.md, Training "
               "under a memory budget, defines it); the second column gives the same budget as a "
               "fraction of the whole peak (the form of the DTR paper). Cells: `CPU / wall (range)`: the median over the pairs of the "
               "budgeted run's step over the unconstrained run's (same allocator, no budget; the "
               "header gives the median of the unconstrained runs), in process CPU time (every "
               "thread: compute, recomputes, the copy thread's memcpy) and in wall time, and the "
               "range of the wall-time ratios over the pairs. A target is judged on the wall-time "
               "median (`met in CPU time` when only the CPU-time median meets it). "
               "CPU time leaves out waiting for the host link. `OOM`: the "
               "policy could not stay within the budget. Per step: ev evictions, rc recomputes, "
               "so/si swaps out/in, sp splits; the host link's busy time (its copy thread "
               "copying, on the same 2 cores) and the time compute waited for it. "
               "![sweep](memory_sweep.png)\n")

    for model in models:
        reference = references[model]
        peak, fixed = reference["peak_bytes"], reference["fixed_bytes"]
        title = MODEL_TITLES.get(model, model)
        out.append(f"## {title} ({describe_input(reference)})\n")
        out.append(f"Unconstrained: {reference['step_s']:.2f} s per step, whole peak {mib(peak)}, "
                   f"fixed {mib(fixed)}, activations {100 * (peak - fixed) / peak:.0f}% of the "
                   "peak.\n")
        out.append("| f | of whole peak | budget | " + " | ".join(POLICIES)
                   + " | auto per step |")
        out.append("|---|---|---|" + "---|" * len(POLICIES) + "---|")
        fractions = sorted({p["fraction"] for p in sweep if p["model"] == model}, reverse=True)
        for fraction in fractions:
            row = [p for p in sweep if p["model"] == model and p["fraction"] == fraction]
            if not row:
                continue
            cells = []
            auto_counters = "-"
            for policy in POLICIES:
                match = [p for p in row if p["policy"] == policy]
                if not match:
                    cells.append("")
                    continue
                point = match[0]
                text = "OOM"
                if point["ok"]:
                    text = f"{point['cpu_slowdown']:.2f}x / {point['slowdown']:.2f}x"
                    if "slowdown_min" in point:
                        text += f" ({point['slowdown_min']:.2f}-{point['slowdown_max']:.2f})"
                target = TARGETS.get(fraction)
                if policy == "auto" and target and point["ok"]:
                    if point["slowdown"] <= target:
                        text += " (met)"
                    elif point["cpu_slowdown"] <= target:
                        text += " (met in CPU time)"
                    else:
                        text += f" (target {target:.2f})"
                cells.append(text)
                if policy == "auto" and point["ok"]:
                    auto_counters = counters_text(point["per_step"])
                    if "link_busy_s" in point and point["per_step"].get("swaps_out"):
                        auto_counters += (f"; link busy {1000 * point['link_busy_s']:.0f} ms, "
                                          f"waited {1000 * point['link_wait_s']:.0f} ms")
            out.append(f"| {fraction:g} | {row[0]['whole_peak_fraction']:.2f} | "
                       f"{mib(row[0]['budget_bytes'])} | " + " | ".join(cells)
                       + f" | {auto_counters} |")
        torch_rows = [t for t in torch_records if t["model"] == model]
        plain = [t for t in torch_rows if not t["checkpoint"]]
        ckpt = [t for t in torch_rows if t["checkpoint"]]
        if plain and ckpt:
            p, c = plain[0], ckpt[0]
            out.append("")
            out.append("PyTorch 1.13 in the same run, same model, batch and threads (peak: resident "
                       "set high-water mark over the first steps of a fresh process, plus "
                       "parameters and batch; see bench/memory_sweep.py):\n")
            out.append("| | step time | peak | peak / plain peak | time / plain |")
            out.append("|---|---|---|---|---|")
            out.append(f"| PyTorch | {p['step_s']:.2f} s | {mib(p['peak_bytes'])} | 1.00 | 1.00x |")
            out.append(f"| PyTorch, checkpoint per stage | {c['step_s']:.2f} s | "
                       f"{mib(c['peak_bytes'])} | {c['peak_bytes'] / p['peak_bytes']:.2f} | "
                       f"{c['step_s'] / p['step_s']:.2f}x |")
            # Tessel auto at the smallest budget at least as large as checkpointing's peak share.
            share = c["peak_bytes"] / p["peak_bytes"]
            autos = sorted((pt for pt in sweep if pt["model"] == model and pt["policy"] == "auto"
                            and pt["ok"]), key=lambda pt: pt["whole_peak_fraction"])
            near = [pt for pt in autos if pt["whole_peak_fraction"] >= share - 1e-9]
            if near:
                pt = near[0]
                out.append(f"| Tessel auto at f = {pt['fraction']:g} | {pt['step_s']:.2f} s | "
                           f"{mib(pt['budget_bytes'])} (budget) | {pt['whole_peak_fraction']:.2f} "
                           f"| {pt['slowdown']:.2f}x |")
            out.append(f"| Tessel unconstrained | {reference['step_s']:.2f} s | {mib(peak)} | 1.00 "
                       "| 1.00x |")
        out.append("")

    if largest:
        model = MODEL_TITLES.get(largest[0]["model"], largest[0]["model"])
        size = largest[0].get("image", 224)
        out.append(f"## Largest batch within a fixed budget ({model} at {size}x{size}, "
                   f"{mib(largest[0]['budget_bytes'])})\n")
        out.append("Doubling, then bisection to within about 6%; a batch fits when two training "
                   "steps run within the budget. ![largest batch](memory_largest_batch.png)\n")
        out.append("| policy | largest batch | first batch that failed | s per sample |")
        out.append("|---|---|---|---|")
        for point in largest:
            capped = point["first_failing_batch"] > point.get("max_batch", 1 << 30)
            failed = f"none up to {point['max_batch']}" if capped else point["first_failing_batch"]
            batch = f"at least {point['batch']}" if capped else point["batch"]
            out.append(f"| {point['policy']} | {batch} | {failed} | "
                       f"{point['seconds_per_sample'] * 1000:.1f} ms |")
        if len(largest) >= 2 and largest[0]["batch"] > 0:
            ratio = largest[-1]["batch"] / largest[0]["batch"]
            capped = largest[-1]["first_failing_batch"] > largest[-1].get("max_batch", 1 << 30)
            out.append(f"\n{largest[-1]['policy']} trains a {'at least ' if capped else ''}"
                       f"{ratio:.1f}x larger batch than "
                       f"{largest[0]['policy']} (target: at least 3x).")
        out.append("")

    if args.notes and os.path.exists(args.notes):
        with open(args.notes) as handle:
            out.append(handle.read())
    path = os.path.join(args.outdir, "memory.md")
    with open(path, "w") as handle:
        handle.write("\n".join(out) + "\n")
    print(f"plot_memory_sweep: wrote {path}, memory_sweep.png, memory_largest_batch.png")


if __name__ == "__main__":
    main()
