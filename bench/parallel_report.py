#!/usr/bin/env python3
"""Tables for bench/results/parallel.md from the JSON lines of bench/parallel_run.sh.

Usage: bench/parallel_report.py bench/results/parallel_raw.jsonl
"""
import json
import sys

MIB = 1024.0 * 1024.0



def predicted_against_measured(r):
    """The cells predicted peak | measured | error | predicted step | measured | error."""
    pm, mm = r["predicted_memory_bytes"], r["peak_bytes"]
    pt, mt = r["predicted_step_s"], r["step_s"]
    return (f"{pm / MIB:.1f} MiB | {mm / MIB:.1f} MiB | {100 * (pm - mm) / mm:+.0f}% "
            f"| {pt:.3f} s | {mt:.3f} s | {100 * (pt - mt) / mt:+.0f}%")

def main(path):
    runs = [json.loads(line) for line in open(path) if line.startswith("{")]
    scaling = [r for r in runs if "plan" not in r and "label" not in r]
    plans = [r for r in runs if "plan" in r and r["ranks"] > 1]
    singles = [r for r in runs if "plan" in r and r["ranks"] == 1 and "label" not in r]
    copies = [r for r in runs if "label" in r]
    for line in open(path):
        if line.startswith("#"):
            print(line.strip("# \n") + "  ")
    print()

    print("### Scaling (weak: fixed batch per data-parallel rank)\n")
    print("| model | ranks | dp x tp | threads/rank | global batch | step (s) | samples/s "
          "| speed-up vs 1 rank | peak/rank (MiB) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    base = {}
    for r in scaling:
        if r["ranks"] == 1:
            base[r["model"]] = r["samples_per_s"]
    for r in scaling:
        speedup = r["samples_per_s"] / base[r["model"]] if r["model"] in base else float("nan")
        print(f"| {r['model']} | {r['ranks']} | {r['dp']} x {r['tp']} | {r['threads_per_rank']} "
              f"| {r['global_batch']} | {r['step_s']:.3f} | {r['samples_per_s']:.2f} "
              f"| {speedup:.2f} | {r['peak_bytes'] / MIB:.1f} |")

    print("\n### Bytes per step against the ring all-reduce\n")
    print("| model | ranks | dp x tp | gradient bytes per rank B | DDP all-reduce payload per step "
          "| ring traffic per rank 2(n-1)/n B | tensor-parallel collectives per step |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in scaling:
        n = r["dp"]
        b = r["parameter_bytes_per_rank"]
        ring = 2 * (n - 1) / n * r["dp_all_reduce_bytes_per_step"] if n > 1 else 0
        print(f"| {r['model']} | {r['ranks']} | {r['dp']} x {r['tp']} | {b / MIB:.1f} MiB "
              f"| {r['dp_all_reduce_bytes_per_step'] / MIB:.1f} MiB | {ring / MIB:.1f} MiB "
              f"| {r['tp_bytes_per_step'] / MIB:.1f} MiB |")

    print("\n### Planner: predicted against measured (2 ranks)\n")
    print("| model | profile | plan | predicted peak/rank | measured | error "
          "| predicted step | measured | error |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in plans:
        print(f"| {r['model']} | {r['plan_profile']} | {r['plan_summary']} | "
              f"{predicted_against_measured(r)} |")

    print("\n### Controls: one rank alone against the 1-device plan; two independent copies\n")
    print("| model | run | profile | threads | batch | predicted peak | measured | error "
          "| predicted step | measured | error |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in singles:
        print(f"| {r['model']} | one rank alone | {r['plan_profile']} | {r['threads_per_rank']} "
              f"| {r['global_batch']} | {predicted_against_measured(r)} |")
        for c in copies:
            if c["model"] == r["model"]:
                ct = c.get("predicted_step_s", r["predicted_step_s"])
                print(f"| {c['model']} | {c['label']} (no communication) "
                      f"| {c.get('plan_profile', r['plan_profile'])} | {c['threads_per_rank']} "
                      f"| {c['global_batch']} | | {c['peak_bytes'] / MIB:.1f} MiB | "
                      f"| {ct:.3f} s | {c['step_s']:.3f} s "
                      f"| {100 * (ct - c['step_s']) / c['step_s']:+.0f}% |")


if __name__ == "__main__":
    main(sys.argv[1])
