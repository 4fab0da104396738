#!/usr/bin/python3
"""GEMM f32 n^3 in Tessel and PyTorch, alternating round by round, so that both sides share
the noise of a busy machine; prints each round's ratio and the median (Tessel / PyTorch).

Usage (after `bazel build //bench:gemm_bench`):
  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OPENBLAS_NUM_THREADS=2 OPENBLAS_THREAD_TIMEOUT=4 \
    bench/gemm_interleaved.py --size 1024 --threads 2 --rounds 9
(OPENBLAS_THREAD_TIMEOUT=4: OpenBLAS's threads sleep as soon as PyTorch's round ends instead of
spinning through Tessel's.)
"""
import argparse
import json
import statistics
import subprocess
import time

import torch


def tessel_ms(binary, size, threads, min_time):
    out = subprocess.run(
        [binary, f"--threads={threads}", f"--benchmark_filter=BM_GemmF32/{size}/",
         f"--benchmark_min_time={min_time}", "--benchmark_format=json"],
        check=True, capture_output=True, text=True).stdout
    bench = json.loads(out)["benchmarks"][0]
    scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[bench["time_unit"]]
    return bench["real_time"] * scale


def torch_ms(a, b, c, min_time):
    torch.mm(a, b, out=c)  # warm-up
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < min_time:
        torch.mm(a, b, out=c)
        calls += 1
    return (time.perf_counter() - start) / calls * 1e3


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--min-time", type=float, default=0.5)
    parser.add_argument("--binary", default="bazel-bin/bench/gemm_bench")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    n = args.size
    a, b, c = torch.randn(n, n), torch.randn(n, n), torch.empty(n, n)
    flops = 2.0 * n * n * n
    ratios = []
    print(f"GEMM f32 {n}^3, {args.threads} threads, {args.rounds} alternating rounds")
    print("round  tessel ms  (GFLOP/s)  pytorch ms  (GFLOP/s)  tessel/pytorch")
    for round_index in range(args.rounds):
        t = tessel_ms(args.binary, n, args.threads, args.min_time)
        p = torch_ms(a, b, c, args.min_time)
        ratios.append(t / p)
        print(f"{round_index:5d}  {t:9.2f}  ({flops / t / 1e6:7.1f})  {p:10.2f}  "
              f"({flops / p / 1e6:7.1f})  {t / p:14.2f}")
    print(f"median tessel/pytorch: {statistics.median(ratios):.2f} "
          f"(min {min(ratios):.2f}, max {max(ratios):.2f})")


if __name__ == "__main__":
    main()
