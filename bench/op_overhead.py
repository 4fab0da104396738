#!/usr/bin/python3
"""The matmul, linear and bmm ops against their bare GEMM kernels, interleaved round by round.

Each op (through the dispatcher: output allocation, checks, autograd bookkeeping, the bias) and
the kernel it runs (ops/cpu/gemm.h into a preallocated output, the same shapes) are timed by
gemm_bench in alternating rounds (the first side alternating, bench/harness.py), so that both
share the machine's drift; a cell is the median over the rounds with the interquartile range,
and the ratio op / kernel that of the medians with the spread of the per-round ratios. Measures
only on a quiet machine (waits, or refuses unless --force, which the result then says). Writes
bench/results/op_overhead.md and the raw rounds beside it (op_overhead.jsonl), keeping the earlier
runs below this one in both.

  bazel build //bench:gemm_bench
  /usr/bin/python3 bench/op_overhead.py [--threads 2] [--rounds 10] [--min-time 0.3] [--pause 1]
      [--force]
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BINARY = os.path.join(ROOT, "bazel-bin/bench/gemm_bench")
SIZES = [64, 128, 256, 512, 1024, 2048]
BMM_SIZES = [64, 128, 256, 512]
# (op, description, op benchmark, kernel benchmark, kernel description), per size.
PAIRS = (
    [("matmul", f"matmul f32 {n}^3", f"BM_MatmulF32/{n}/real_time", f"BM_GemmF32/{n}/real_time",
      "GEMM into C") for n in SIZES]
    + [("linear", f"linear f32 {n}^3 (+ bias)", f"BM_LinearF32/{n}/real_time",
        f"BM_GemmF32OntoRow/{n}/real_time", "GEMM, B transposed, onto the bias row")
       for n in SIZES]
    + [("bmm", f"bmm f32 8 x {n}^3", f"BM_BmmF32/{n}/real_time",
        f"BM_GemmF32Batched/{n}/real_time", "8 GEMMs into C") for n in BMM_SIZES])


def run_ms(name, threads, min_time):
    out = subprocess.run(
        [BINARY, f"--threads={threads}", f"--benchmark_filter=^{re.escape(name)}$",
         f"--benchmark_min_time={min_time}", "--benchmark_format=json"],
        capture_output=True, text=True, check=True).stdout
    entries = json.loads(out)["benchmarks"]
    if not entries:
        raise SystemExit(f"op_overhead: gemm_bench has no benchmark {name}")
    entry = entries[0]
    scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[entry.get("time_unit", "ns")]
    return entry["real_time"] * scale


def earlier_runs(path):
    """What `path` and its raw log hold before this run writes them (empty strings when new): the
    results file with its heading made that of a kept run, and the raw lines."""
    text = open(path).read() if os.path.isfile(path) else ""
    raw_path = os.path.splitext(path)[0] + ".jsonl"
    raw = open(raw_path).read() if os.path.isfile(raw_path) else ""
    made = re.search(r"on (\d{4}-\d{2}-\d{2} \d{2}:\d{2} UTC)", text)
    if text.startswith("# ") and made:
        text = f"## The run of {made.group(1)}" + text[text.index("\n"):]
    return text, raw


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--min-time", type=float, default=0.3)
    # Without a rest the process started right after another read up to 17% slower at 64^3,
    # where a loop lasts a fraction of a second (results/op_overhead.md, notes of 2026-12-06).
    parser.add_argument("--pause", type=float, default=1.0,
                        help="seconds of rest before each timed process")
    parser.add_argument("--filter", default=".", help="which pairs (a regular expression)")
    parser.add_argument("--force", action="store_true")
    parser.add_argument("--out", default=os.path.join(ROOT, "bench/results/op_overhead.md"))
    args = parser.parse_args()
    pairs = [pair for pair in PAIRS if re.search(args.filter, pair[1])]
    began = time.time()
    quiet = harness.wait_for_quiet(max_wait=300, force=args.force, log=print)
    watch = harness.OtherProcesses()
    start_load = harness.load_average()
    rows = []
    raw_path = os.path.splitext(args.out)[0] + ".jsonl"
    kept_text, kept_raw = earlier_runs(args.out)
    command = "bench/op_overhead.py" + "".join(f" {a}" for a in sys.argv[1:])
    with harness.RawLog(raw_path) as raw:
        raw.write(kind="run", command=command,
                  environment=harness.environment(ROOT, args.threads), quiet=quiet.__dict__,
                  rounds=args.rounds, min_time=args.min_time, pause=args.pause)
        for op, description, op_name, kernel_name, kernel_text in pairs:
            times = {"op": [], "kernel": []}

            def side(which, name):
                def run():
                    time.sleep(args.pause)
                    times[which].append(run_ms(name, args.threads, args.min_time))
                return run

            for round_index in range(args.rounds):
                for run in harness.round_order([side("op", op_name), side("kernel", kernel_name)],
                                               round_index):
                    run()
            for which, name in (("op", op_name), ("kernel", kernel_name)):
                for round_index, ms in enumerate(times[which]):
                    raw.write(kind="round", pair=description, side=which, benchmark=name,
                              round=round_index, ms=round(ms, 5))
            o, k = harness.summarize(times["op"]), harness.summarize(times["kernel"])
            ratio = harness.ratio_quartiles(times["op"], times["kernel"])
            rows.append((description, kernel_text, o, k, ratio))
            print(f"{description:32s} op {o.median:9.4f} ms  kernel {k.median:9.4f} ms  "
                  f"op/kernel {o.median / k.median:5.2f}", flush=True)
    end_load = harness.load_average()
    lines = [
        "# The matmul, linear and bmm ops against their bare GEMM kernels",
        "",
        f"Made by `{command}` on "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(began))} in "
        f"{(time.time() - began) / 60:.1f} minutes, Tessel at commit {harness.git_commit(ROOT)}; "
        f"{args.threads} threads. Each op (through the dispatcher: a new output each call, checks, "
        "the bias for linear) and the kernel it runs (ops/cpu/gemm.h into a preallocated output "
        "of the same shape) timed by `gemm_bench` in alternating rounds, the first side "
        f"alternating: {args.rounds} rounds, each one Google Benchmark loop of at least "
        f"{args.min_time} s per side, in a process of its own started after {args.pause} s of "
        "rest. Cells: the median over the rounds (interquartile range); "
        "the ratio is that of the medians with the interquartile range of the per-round ratios "
        "(1.00: the op costs nothing beyond its kernel). Raw rounds: op_overhead.jsonl"
        + (". The earlier runs are kept below, their rounds after this run's in it."
           if kept_text else "."),
        "",
        f"- Machine: {'quiet' if not quiet.forced else 'NOT quiet (--force)'}; load average "
        f"{start_load:.2f} at the start, {end_load:.2f} at the end (this run's own work "
        f"included); other processes used {watch.cores():.2f} cores during the run.",
        "",
        "| op | kernel | op ms: median (IQR) | kernel ms: median (IQR) | op / kernel (IQR) |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for description, kernel_text, o, k, ratio in rows:
        lines.append(f"| {description} | {kernel_text} | {o.median:.4f} ({o.spread(4)}) | "
                     f"{k.median:.4f} ({k.spread(4)}) | {o.median / k.median:.2f} "
                     f"({ratio.q1:.2f}-{ratio.q3:.2f}) |")
    with open(args.out, "w") as handle:
        handle.write("\n".join(lines) + "\n" + ("\n" + kept_text if kept_text else ""))
    with open(raw_path, "a") as handle:
        handle.write(kept_raw)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
