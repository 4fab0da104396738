#!/usr/bin/python3
"""Draws a planner frontier (memory per device against time per iteration) as one PNG.

Usage: tools/plot_frontier.py FRONTIER.json --out frontier.png [--title TEXT]

FRONTIER.json is what `bazel run //parallel:plan -- ... --frontier_json=FILE` writes:
  {"model": "bert_base", "devices": 8, "profile": "h200_cluster",
   "memory_per_device": 17179869184, "chosen": 3,
   "points": [{"memory_bytes": ..., "time_s": ..., "remat_fraction": 1.0, "executable": true,
               "summary": "dp=8"}, ...]}
Points that need recomputation (remat_fraction < 1, the memory layer's auto policy) are drawn
apart from plain ones, and points the runtime would not run as priced (executable false) as open
grey marks; the memory limit is a vertical line (or, when it lies far right of every point, a
note, so the points keep the width of the plot) and the chosen plan is circled.
"""
import argparse
import json
import sys
import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

GIB = 1024.0 ** 3


def read_frontier(path):
    with open(path, encoding="utf-8") as source:
        frontier = json.load(source)
    points = frontier.get("points")
    if not isinstance(points, list) or not points:
        raise ValueError(f"{path}: no 'points' list (is this a frontier from the planner?)")
    for number, point in enumerate(points):
        for key in ("memory_bytes", "time_s"):
            if not isinstance(point.get(key), (int, float)):
                raise ValueError(f"{path}: points[{number}] has no numeric '{key}'")
    return frontier


def draw(frontier, out, title):
    points = frontier["points"]
    memory = [p["memory_bytes"] / GIB for p in points]
    time_ms = [p["time_s"] * 1e3 for p in points]
    executable = [p.get("executable", True) for p in points]
    plain = [i for i, p in enumerate(points) if executable[i] and p.get("remat_fraction", 1.0) >= 1.0]
    remat = [i for i, p in enumerate(points) if executable[i] and p.get("remat_fraction", 1.0) < 1.0]
    not_run = [i for i in range(len(points)) if not executable[i]]

    figure, axes = plt.subplots(figsize=(8, 5))
    axes.step(memory, time_ms, where="post", color="0.75", linewidth=1, zorder=1)
    axes.scatter([memory[i] for i in plain], [time_ms[i] for i in plain], color="tab:blue",
                 label="plan", zorder=2)
    if remat:
        axes.scatter([memory[i] for i in remat], [time_ms[i] for i in remat], color="tab:orange",
                     marker="s", label="plan under a memory budget (auto: recompute)", zorder=2)
    if not_run:
        axes.scatter([memory[i] for i in not_run], [time_ms[i] for i in not_run],
                     facecolors="none", edgecolors="0.5", label="not run as priced", zorder=2)
    limit = frontier.get("memory_per_device")
    limit_gib = limit / GIB if isinstance(limit, (int, float)) and limit > 0 else None
    xlabel = "memory per device (GiB)"
    if limit_gib is not None and limit_gib <= 1.5 * max(memory):
        axes.axvline(limit_gib, color="tab:red", linestyle="--", linewidth=1,
                     label=f"memory per device ({limit_gib:.1f} GiB)")
    elif limit_gib is not None:  # a line that far right would squeeze the points to the left
        xlabel += f"; the limit, {limit_gib:.1f} GiB, lies far right: every plan fits"
    chosen = frontier.get("chosen", -1)
    if isinstance(chosen, int) and 0 <= chosen < len(points):
        axes.scatter([memory[chosen]], [time_ms[chosen]], s=220, facecolors="none",
                     edgecolors="tab:green", linewidths=2, label="chosen", zorder=3)
        # Wrapped, and on the side of the point with more room.
        label = textwrap.fill(points[chosen].get("summary", ""), width=48)
        right_half = memory[chosen] > (min(memory) + max(memory)) / 2
        axes.annotate(label, (memory[chosen], time_ms[chosen]), textcoords="offset points",
                      xytext=(-10 if right_half else 10, 12), fontsize=7,
                      ha="right" if right_half else "left", va="bottom")
    axes.set_xlabel(xlabel)
    axes.set_ylabel("time per iteration (ms)")
    axes.set_title(title or f"{frontier.get('model', '?')} on {frontier.get('devices', '?')} devices "
                            f"({frontier.get('profile', '?')})")
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(out, dpi=120)
    plt.close(figure)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("frontier", help="frontier JSON written by the planner")
    parser.add_argument("--out", required=True, help="PNG to write")
    parser.add_argument("--title", default="", help="plot title")
    args = parser.parse_args()
    try:
        frontier = read_frontier(args.frontier)
    except (OSError, ValueError) as error:
        print(f"plot_frontier: {error}", file=sys.stderr)
        return 1
    draw(frontier, args.out, args.title)
    return 0


if __name__ == "__main__":
    sys.exit(main())
