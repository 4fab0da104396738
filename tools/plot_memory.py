#!/usr/bin/python3
"""Draws a memory JSON (memory::write_memory_json) as a PNG.

Top: bytes allocated (and reserved) over the allocator's logical clock, the budget, and the
policy events (evict, recompute, swap_out, swap_in, split, oom) marked by kind. Bottom: the
block map at the time of the snapshot, one row per segment, free blocks in grey.

  /usr/bin/python3 tools/plot_memory.py memory.json -o memory.png
"""

import argparse
import hashlib
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

POLICY_MARKERS = {
    "evict": ("v", "tab:red"),
    "recompute": ("^", "tab:green"),
    "swap_out": (">", "tab:purple"),
    "swap_in": ("<", "tab:cyan"),
    "split": ("s", "tab:orange"),
    "oom": ("X", "black"),
}


def unit_for(max_bytes):
    for scale, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if max_bytes >= 2 * scale:
            return scale, name
    return 1, "B"


def owner_colour(owner):
    if not owner:
        return "tab:blue"
    digest = int(hashlib.md5(owner.encode()).hexdigest(), 16)
    return plt.get_cmap("tab20")(digest % 20)


def plot_timeline(axis, data):
    events = data.get("timeline", [])
    stats = data.get("stats", {})
    budget = stats.get("budget", 0)
    peak_seen = max([e["allocated_after"] for e in events]
                    + [e.get("reserved_after", 0) for e in events]
                    + [budget, stats.get("peak_allocated_bytes", 0), 1])
    scale, unit = unit_for(peak_seen)

    clocks = [e["clock"] for e in events]
    axis.step(clocks, [e["allocated_after"] / scale for e in events], where="post",
              color="tab:blue", linewidth=1.2, label="allocated")
    if any(e.get("reserved_after", 0) for e in events):
        axis.step(clocks, [e.get("reserved_after", 0) / scale for e in events], where="post",
                  color="tab:gray", linewidth=1.0, linestyle="--", label="reserved")
    if budget:
        axis.axhline(budget / scale, color="tab:red", linewidth=1.4, linestyle=":", zorder=4,
                     label=f"budget {budget / scale:.2f} {unit}")
    for kind, (marker, colour) in POLICY_MARKERS.items():
        points = [e for e in events if e["kind"] == kind]
        if points:
            axis.scatter([e["clock"] for e in points],
                         [e["allocated_after"] / scale for e in points], marker=marker,
                         color=colour, s=28, zorder=3, label=f"{kind} ({len(points)})")
    dropped = data.get("timeline_dropped", 0)
    note = f" ({dropped} earlier events not shown)" if dropped else ""
    axis.set_xlabel("logical clock (events)" + note)
    axis.set_ylabel(unit)
    axis.set_title(f"{data.get('device', '?')}: allocated bytes over time "
                   f"(peak {stats.get('peak_allocated_bytes', 0) / scale:.2f} {unit}, "
                   f"fragmentation {stats.get('fragmentation', 0):.2f})")
    axis.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    axis.grid(alpha=0.3)


def plot_blocks(axis, data):
    blocks = data.get("blocks", [])
    if not blocks:
        axis.text(0.5, 0.5, "no segments", ha="center", va="center", transform=axis.transAxes)
        axis.set_axis_off()
        return
    bases = {}
    for block in blocks:  # blocks come in address order: the first of a segment is its base
        bases.setdefault(block["segment"], block["address"])
    largest_segment = max(sum(b["size"] for b in blocks if b["segment"] == s) for s in bases)
    scale, unit = unit_for(largest_segment)
    owners = {}
    for block in blocks:
        start = (block["address"] - bases[block["segment"]]) / scale
        if block["allocated"]:
            colour = owner_colour(block["owner"])
            owners.setdefault(block["owner"] or "(unlabelled)", colour)
        else:
            colour = "whitesmoke"
        axis.barh(block["segment"], block["size"] / scale, left=start, height=0.8, color=colour,
                  edgecolor="dimgray", linewidth=0.3)
    handles = [Patch(facecolor=colour, edgecolor="dimgray", label=owner)
               for owner, colour in list(owners.items())[:12]]
    handles.append(Patch(facecolor="whitesmoke", edgecolor="dimgray", label="free"))
    axis.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    axis.set_yticks(sorted(bases))
    axis.set_ylabel("segment")
    axis.invert_yaxis()
    axis.set_xlabel(f"offset in segment ({unit})")
    stats = data.get("stats", {})
    axis.set_title(f"blocks at the snapshot: {stats.get('allocated_bytes', 0) / scale:.2f} {unit} "
                   f"allocated, {stats.get('free_blocks', 0)} free blocks, largest "
                   f"{stats.get('largest_free_block', 0) / scale:.2f} {unit}")


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("input", help="JSON written by memory::write_memory_json")
    parser.add_argument("-o", "--output", help="PNG to write (default: the input with .png)")
    parser.add_argument("--title", help="a title above both panels")
    args = parser.parse_args(argv)

    try:
        with open(args.input) as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as error:
        sys.exit(f"plot_memory: cannot read {args.input}: {error}")
    for key in ("stats", "blocks", "timeline"):
        if key not in data:
            sys.exit(f"plot_memory: {args.input} has no '{key}' (not a memory JSON?)")

    stem = args.input[:-5] if args.input.endswith(".json") else args.input
    output = args.output or stem + ".png"
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(13, 8),
                                         gridspec_kw={"height_ratios": [3, 1.4]})
    plot_timeline(top, data)
    plot_blocks(bottom, data)
    if args.title:
        figure.suptitle(args.title)
    figure.tight_layout()
    figure.savefig(output, dpi=120)
    print(f"wrote {output}")


if __name__ == "__main__":
    main(sys.argv[1:])
