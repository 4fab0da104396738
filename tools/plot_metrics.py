#!/usr/bin/python3
"""Draws training curves from a JSON-lines metrics file as one PNG.

Usage: tools/plot_metrics.py METRICS.jsonl --out curves.png [--metrics loss,lr] [--title TEXT]

Each line is one JSON object with a "step" and some metrics, e.g.
  {"kind": "train", "step": 100, "loss": 0.52, "lr": 0.1, "samples_per_s": 3100}
  {"kind": "eval", "step": 100, "eval_loss": 0.61, "accuracy": 0.83}
Every metric gets its own subplot against the step; lines of different kinds ("kind" or
"event") that share a metric are drawn as separate, labelled series. Unknown keys, lines without
a numeric step (such as a final summary) and lines that are not JSON objects are skipped.
"""
import argparse
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

# Plotted by default, in this order, when present.
DEFAULT_METRICS = [
    "loss", "eval_loss", "test_loss",
    "accuracy", "eval_accuracy", "test_accuracy",
    "lr", "samples_per_s",
]


def is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def read_series(path, metrics):
    """Returns {metric: {kind: ([steps], [values])}} and the number of lines skipped."""
    series = {metric: {} for metric in metrics}
    skipped = 0
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            line = line.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                print(f"{path}:{number}: skipped, not JSON ({error.msg})", file=sys.stderr)
                skipped += 1
                continue
            if not isinstance(record, dict) or not is_number(record.get("step")):
                skipped += 1
                continue
            kind = str(record.get("kind", record.get("event", "")))
            for metric in metrics:
                value = record.get(metric)
                if is_number(value):
                    steps, values = series[metric].setdefault(kind, ([], []))
                    steps.append(record["step"])
                    values.append(value)
    return {metric: kinds for metric, kinds in series.items() if kinds}, skipped


def plot(series, out, title):
    rows = len(series)
    figure, axes = plt.subplots(rows, 1, figsize=(8, 2.6 * rows), sharex=True, squeeze=False)
    for axis, (metric, kinds) in zip(axes[:, 0], series.items()):
        for kind, (steps, values) in sorted(kinds.items()):
            order = sorted(range(len(steps)), key=steps.__getitem__)
            xs = [steps[i] for i in order]
            ys = [values[i] for i in order]
            axis.plot(xs, ys, marker="o" if len(xs) <= 30 else None, markersize=3,
                      label=kind or metric)
        axis.set_ylabel(metric)
        axis.grid(True, alpha=0.3)
        if len(kinds) > 1 or any(kinds):
            axis.legend(loc="best", fontsize="small")
    axes[-1, 0].set_xlabel("step")
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(out, dpi=110)
    plt.close(figure)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("metrics_file", help="JSON-lines file, one object per line")
    parser.add_argument("--out", required=True, help="PNG file to write")
    parser.add_argument("--metrics", default=",".join(DEFAULT_METRICS),
                        help="comma-separated keys to plot (default: %(default)s)")
    parser.add_argument("--title", default="", help="title above the plots")
    args = parser.parse_args()

    metrics = [name.strip() for name in args.metrics.split(",") if name.strip()]
    try:
        series, skipped = read_series(args.metrics_file, metrics)
    except OSError as error:
        sys.exit(f"plot_metrics: cannot read '{args.metrics_file}': {error.strerror}")
    if not series:
        sys.exit(f"plot_metrics: '{args.metrics_file}' has no line with a numeric 'step' and any "
                 f"of: {', '.join(metrics)}")
    plot(series, args.out, args.title)
    points = sum(len(s) for kinds in series.values() for s, _ in kinds.values())
    print(f"wrote {args.out}: {len(series)} metrics, {points} points"
          + (f", {skipped} lines skipped" if skipped else ""))


if __name__ == "__main__":
    main()
