#!/usr/bin/python3
"""Tessel's 3x3 convolutions with and without Winograd (TESSEL_CONV_WINOGRAD=0), interleaved.

Waits for a quiet machine (bench/harness.py), then runs bazel-bin/bench/conv_bench --rounds times
per side, the side going first alternating, and writes bench/results/conv_winograd_ab.md (median
and interquartile range per shape, the ratio of the medians) and the raw rounds beside it.
  bazel build //bench:conv_bench && bench/conv_winograd_ab.py --rounds 5
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import harness  # noqa: E402


def run_side(winograd, threads, min_time):
    env = dict(os.environ, TESSEL_CONV_WINOGRAD="1" if winograd else "0")
    out = subprocess.run([os.path.join(ROOT, "bazel-bin", "bench", "conv_bench"),
                          "--threads=%d" % threads, "--benchmark_min_time=%g" % min_time,
                          "--benchmark_format=json"],
                         env=env, capture_output=True, text=True, check=True).stdout
    return {b["name"]: b["real_time"] for b in json.loads(out)["benchmarks"]}


def quartiles(values):
    q = statistics.quantiles(values, n=4, method="inclusive")
    return statistics.median(values), q[0], q[2]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--min-time", type=float, default=0.3)
    args = parser.parse_args()
    machine = subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "bench", "harness.py"),
                              "quiet"], capture_output=True, text=True, check=True).stdout.strip()
    times = {True: {}, False: {}}
    raw_path = os.path.join(ROOT, "bench", "results", "conv_winograd_ab.raw.jsonl")
    with open(raw_path, "w") as raw:
        for round_ in range(args.rounds):
            for winograd in ((True, False) if round_ % 2 == 0 else (False, True)):
                for name, ms in run_side(winograd, args.threads, args.min_time).items():
                    times[winograd].setdefault(name, []).append(ms)
                    raw.write(json.dumps({"round": round_, "winograd": winograd,
                                          "benchmark": name, "ms": ms}) + "\n")
            print("conv_winograd_ab: round %d of %d" % (round_ + 1, args.rounds), flush=True)
    load = os.getloadavg()[0]
    lines = ["# 3x3 convolutions in Tessel: Winograd against im2col", "",
             "Made by `bench/conv_winograd_ab.py --rounds %d --threads %d` on %s, %s. Machine at "
             "the start: %s; load average at the end %.2f (the benchmark's own work included). "
             "Each round runs bazel-bin/bench/conv_bench once per side (`TESSEL_CONV_WINOGRAD=1` "
             "and `=0`), the first side alternating; cells: median ms (interquartile range) over "
             "the rounds; raw rounds: conv_winograd_ab.raw.jsonl." %
             (args.rounds, args.threads,
              datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              open("/proc/cpuinfo").read().split("model name")[1].split(":")[1].split("\n")[0]
              .strip(), machine, load), "",
             "| benchmark (batch/channels/size) | Winograd ms | im2col ms | Winograd / im2col |",
             "| --- | ---: | ---: | ---: |"]
    for name in times[True]:
        w, w1, w3 = quartiles(times[True][name])
        i, i1, i3 = quartiles(times[False][name])
        lines.append("| %s | %.2f (%.2f-%.2f) | %.2f (%.2f-%.2f) | %.2f |" %
                     (name.replace("/real_time", ""), w, w1, w3, i, i1, i3, w / i))
    with open(os.path.join(ROOT, "bench", "results", "conv_winograd_ab.md"), "w") as out:
        out.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
