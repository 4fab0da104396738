#!/usr/bin/python3
"""BERT mini with its whole vocabulary (30522 words) under memory budgets on the CPU.

Its MLM head over every position makes (8 x 128, 30522) logits: with the whole logits (the
checkpoints' forward, memory_sweep --mlm_logits) they and their log-probabilities are one working
set of 2 x 119 MiB; scored in chunks (linear_cross_entropy, the default) they never exist whole.
Runs //bench:memory_sweep for both heads: the unconstrained peak and step, then every policy at
activation budgets f = 0.5, 0.2 and 0.1 (5 pairs of a budgeted and an unconstrained run per
cell, each after 8 warm-up steps and more while auto still tries its ways, the median of 2 timed
steps; the ratio is the median over the pairs). Waits for a quiet machine (bench/harness.py) and
records it. Writes bench/results/memory_vocab.md and memory_vocab.jsonl. About 20 minutes.

Usage: bench/memory_vocab.py [--no-build] [--force] [--threads=2]
"""
import argparse
import datetime
import json
import os
import subprocess
import sys

import harness

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results")
MIB = 1024.0 ** 2
MODEL = ["--model=bert_mini", "--batch=8", "--seq=128", "--vocab=30522"]
POLICIES = "dtr,swap,split,auto"
FRACTIONS = "0.5,0.2,0.1"
HEADS = [("scored in chunks (linear_cross_entropy)", []),
         ("whole logits (--mlm_logits)", ["--mlm_logits"])]


def run(flags, threads):
    command = [os.path.join(ROOT, "bazel-bin", "bench", "memory_sweep")] + MODEL + flags + [
        "--threads=%d" % threads, "--policies=" + POLICIES, "--fractions=" + FRACTIONS,
        "--pairs=5", "--warmup=8", "--steps=2"]
    print("$ " + " ".join(command[1:]), flush=True)
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit("memory_vocab: memory_sweep failed:\n" + result.stderr[-3000:])
    sys.stderr.write(result.stderr)
    lines = [json.loads(l) for l in result.stdout.splitlines() if l.startswith("{")]
    for line in lines:
        line["command"] = "memory_sweep " + " ".join(command[1:])
    return lines


def cell(line):
    if not line["ok"]:
        return "fails (%s)" % line["error"].split("\n")[0]
    low, high = line.get("slowdown_min", 0), line.get("slowdown_max", 0)
    moved = line["per_step"]
    return "%.2fx (%.2f-%.2f; %d recomputes, %d swaps out per step)" % (
        line["slowdown"], low, high, moved["recomputes"], moved["swaps_out"])


def table(lines):
    reference = next(l for l in lines if l["kind"] == "reference")
    rows = [l for l in lines if l["kind"] == "sweep"]
    policies = POLICIES.split(",")
    out = ["Unconstrained: %.0f ms per step (median), peak %.1f MiB, fixed %.1f MiB (parameters, "
           "gradients, momentum)." % (1e3 * reference["step_s"], reference["peak_bytes"] / MIB,
                                      reference["fixed_bytes"] / MIB), "",
           "| f | of whole peak | budget | " + " | ".join(policies) + " |",
           "| --- | --- | --- | " + " | ".join("---" for _ in policies) + " |"]
    for fraction in [float(f) for f in FRACTIONS.split(",")]:
        at = {l["policy"]: l for l in rows if abs(l["fraction"] - fraction) < 1e-9}
        any_line = next(iter(at.values()))
        out.append("| %g | %.2f | %.1f MiB | %s |" % (
            fraction, any_line["whole_peak_fraction"], any_line["budget_bytes"] / MIB,
            " | ".join(cell(at[p]) if p in at else "" for p in policies)))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-build", action="store_true")
    parser.add_argument("--force", action="store_true", help="measure even on a busy machine")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if not args.no_build:
        subprocess.run(["bazel", "build", "-c", "opt", "//bench:memory_sweep"], cwd=ROOT,
                       check=True)
    os.environ["OMP_WAIT_POLICY"] = "passive"
    quiet = harness.wait_for_quiet(max_wait=600, force=args.force, log=print)
    watch = harness.OtherProcesses()
    started = datetime.datetime.now(datetime.timezone.utc)
    load_start = harness.load_average()
    results = [(name, run(flags, args.threads)) for name, flags in HEADS]
    busy = watch.cores()
    load_end = harness.load_average()
    minutes = (datetime.datetime.now(datetime.timezone.utc) - started).total_seconds() / 60
    commit = harness.git_commit(ROOT)

    with open(os.path.join(RESULTS, "memory_vocab.jsonl"), "w") as raw:
        for name, lines in results:
            for line in lines:
                raw.write(json.dumps(dict(line, head=name)) + "\n")
    md = ["# BERT mini with 30522 words under memory budgets (CPU)", "",
          "Made by `bench/memory_vocab.py` on %s UTC in %.1f minutes, Tessel at commit %s. "
          "BERT mini, 8 sequences of 128 tokens, BERT's vocabulary of 30522 words, SGD with "
          "momentum, %d threads; the simulated device of the CPU (one arena of the budget's "
          "size, swaps over a copy thread throttled to 25 GB/s). Per cell: the median over 5 "
          "pairs of a budgeted and an unconstrained run (each after 8 warm-up steps, the median "
          "of 2 timed steps) of the ratio of their step times, the range over the pairs, and "
          "what the policy moved per step. f: the budget is fixed + f x (peak - fixed). "
          "Raw lines (with the commands): memory_vocab.jsonl." %
          (started.strftime("%Y-%m-%d %H:%M"), minutes, commit, args.threads), "",
          "- Machine: %s; load average (1 min) %.2f at the start, %.2f at the end; other "
          "processes used %.2f cores during the run." %
          (quiet.describe(), load_start, load_end,
           busy), ""]
    for name, lines in results:
        md += ["## The MLM head " + name, ""] + table(lines) + [""]
    with open(os.path.join(RESULTS, "memory_vocab.md"), "w") as out:
        out.write("\n".join(md))
    print("memory_vocab: wrote bench/results/memory_vocab.md")


if __name__ == "__main__":
    main()
