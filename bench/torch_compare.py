#!/usr/bin/python3
"""Times the shapes of Tessel's CPU benchmarks against PyTorch, interleaved, into a table.

For every benchmark of the Tessel binaries given (gemm_bench, conv_bench), rounds alternate
between one Google Benchmark run of it in Tessel (a loop of at least --min-time seconds) and the
same operation in PyTorch in this process (the same rule: a loop of at least --min-time seconds
after a warm-up call), the first side alternating (bench/harness.py); each cell is the median
over the rounds with its interquartile range, the ratio that of the medians with the spread of
the per-round ratios. bench/run.sh calls it; by hand (OpenBLAS's idle threads must sleep, or
they spin through Tessel's rounds):
  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OPENBLAS_NUM_THREADS=2 OPENBLAS_THREAD_TIMEOUT=4 \
    /usr/bin/python3 bench/torch_compare.py --threads 2 --rounds 10 \
      --tessel-binary bazel-bin/bench/gemm_bench --tessel-binary bazel-bin/bench/conv_bench \
      --output bench/results/cpu_ops.md --command "bench/run.sh --threads 2"
"""

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402  (bench/harness.py: round order, medians and quartiles)


def list_benchmarks(binary, pattern):
    out = subprocess.run([binary, "--benchmark_list_tests", f"--benchmark_filter={pattern}"],
                         capture_output=True, text=True, check=True).stdout
    return [line.strip() for line in out.splitlines() if line.strip()]


def tessel_ms(binary, name, threads, min_time):
    """One Google Benchmark run of `name`: (milliseconds per iteration, the run's context)."""
    out = subprocess.run(
        [binary, f"--threads={threads}", f"--benchmark_filter=^{re.escape(name)}$",
         f"--benchmark_min_time={min_time}", "--benchmark_format=json"],
        capture_output=True, text=True, check=True).stdout
    data = json.loads(out)
    entry = data["benchmarks"][0]
    scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[entry.get("time_unit", "ns")]
    return entry["real_time"] * scale, data.get("context", {})


def time_call(fn, min_time, repetitions):
    """Median over repetitions of the mean time per call (ms) in a loop of >= min_time s."""
    fn()
    means = []
    for _ in range(repetitions):
        iterations, start = 0, time.perf_counter()
        while True:
            fn()
            iterations += 1
            elapsed = time.perf_counter() - start
            if elapsed >= min_time:
                break
        means.append(elapsed / iterations * 1e3)
    return statistics.median(means)


def pattern(*sizes):
    return torch.randn(*sizes, dtype=torch.float32)


def torch_case(name):
    """(description, flops, callable) for one Tessel benchmark name, or None if unknown."""
    parts = name.replace("/real_time", "").split("/")
    kind, args = parts[0], [int(p) for p in parts[1:]]
    if kind == "BM_GemmF32":
        (n,) = args
        a, b, c = pattern(n, n), pattern(n, n), torch.empty(n, n)
        return f"GEMM f32 {n}^3, into C", 2.0 * n**3, lambda: torch.mm(a, b, out=c)
    if kind == "BM_GemmF32TransposedB":
        n, accumulate = args
        a, b, c = pattern(n, n), pattern(n, n), torch.zeros(n, n)
        if accumulate:
            return (f"GEMM f32 {n}^3, B transposed, added to C", 2.0 * n**3,
                    lambda: c.addmm_(a, b.t()))
        return (f"GEMM f32 {n}^3, B transposed, into C", 2.0 * n**3,
                lambda: torch.mm(a, b.t(), out=c))
    if kind == "BM_GemmF32Batched":
        (n,) = args
        a, b, c = pattern(8, n, n), pattern(8, n, n), torch.empty(8, n, n)
        return f"GEMM f32 8 x {n}^3, into C", 2.0 * 8 * n**3, lambda: torch.bmm(a, b, out=c)
    if kind == "BM_MatmulF32":
        (n,) = args
        a, b = pattern(n, n), pattern(n, n)
        return f"matmul op f32 {n}^3", 2.0 * n**3, lambda: torch.matmul(a, b)
    if kind == "BM_LinearF32":
        (n,) = args
        x, w, b = pattern(n, n), pattern(n, n), pattern(n)
        return f"linear op f32 {n}^3 (+ bias)", 2.0 * n**3, lambda: F.linear(x, w, b)
    if kind == "BM_BmmF32":
        (n,) = args
        a, b = pattern(8, n, n), pattern(8, n, n)
        return f"bmm op f32 8 x {n}^3", 2.0 * 8 * n**3, lambda: torch.bmm(a, b)
    if kind == "BM_DropoutF32":
        (n,) = args
        x = pattern(n)
        return (f"dropout op f32 p 0.1 (training), {n} elements (G elements/s)", float(n),
                lambda: F.dropout(x, 0.1, training=True))
    if kind in ("BM_Conv2dForward", "BM_Conv2dBackward"):
        batch, channels, size = args
        x = pattern(batch, channels, size, size)
        w = pattern(channels, channels, 3, 3)
        flops = 2.0 * batch * channels * size * size * channels * 9
        shape = f"3x3 conv {'fwd' if kind.endswith('Forward') else 'bwd'}, " \
                f"N={batch} C={channels} {size}x{size}"
        if kind == "BM_Conv2dForward":
            return shape, flops, lambda: F.conv2d(x, w, None, 1, 1)
        grad = pattern(batch, channels, size, size)
        # The gradients of the input and the weight, as autograd computes them.
        return shape, 2 * flops, lambda: torch.ops.aten.convolution_backward(
            grad, x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, True, False])
    if kind == "BM_Conv2dPart":
        batch, ins, outs, size, stride, part = args
        x = pattern(batch, ins, size, size)
        w = pattern(outs, ins, 3, 3)
        out_size = (size - 1) // stride + 1
        flops = 2.0 * batch * outs * out_size * out_size * ins * 9
        name = ("fwd", "input grad", "weight grad")[part]
        shape = (f"3x3 conv {name}, N={batch} {ins}->{outs} {size}x{size}"
                 f"{f' stride {stride}' if stride > 1 else ''}")
        if part == 0:
            return shape, flops, lambda: F.conv2d(x, w, None, stride, 1)
        grad = pattern(batch, outs, out_size, out_size)
        mask = [part == 1, part == 2, False]
        return shape, flops, lambda: torch.ops.aten.convolution_backward(
            grad, x, w, None, [stride, stride], [1, 1], [1, 1], False, [0, 0], 1, mask)
    return None


def blas_description(threads):
    """Which BLAS PyTorch's matmul runs, with its kernel (OpenBLAS core type)."""
    try:
        import threadpoolctl
    except ImportError:
        return "unknown (python3-threadpoolctl not installed)", None
    torch.mm(torch.ones(8, 8), torch.ones(8, 8))  # loads the BLAS
    limiter = threadpoolctl.threadpool_limits(limits=threads, user_api="blas")
    for info in threadpoolctl.threadpool_info():
        if info.get("user_api") == "blas":
            return (f"{info.get('internal_api')} {info.get('version')}, kernel "
                    f"{info.get('architecture')}, {info.get('num_threads')} threads "
                    f"({os.path.basename(info.get('filepath', ''))})"), limiter
    return "no BLAS found by threadpoolctl", limiter


def cpu_model():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tessel-binary", action="append", required=True,
                        help="a Google Benchmark binary of Tessel's (repeatable)")
    parser.add_argument("--filter", default=".", help="which benchmarks (a regular expression)")
    parser.add_argument("--output", help="Markdown file to write (stdout always gets the table)")
    parser.add_argument("--command", default="bench/run.sh", help="command line to record")
    parser.add_argument("--min-time", type=float, default=0.5)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--machine", default="not checked",
                        help="how quiet the machine was (bench/harness.py quiet)")
    args = parser.parse_args()

    load_before = os.getloadavg()
    torch.set_num_threads(args.threads)
    blas, _limiter = blas_description(args.threads)
    watch = harness.OtherProcesses()
    rows, context = [], {}
    # Every round of every operation, beside the table: FILE.raw.jsonl.
    raw = harness.RawLog(os.path.splitext(args.output)[0] + ".raw.jsonl") if args.output else None
    with torch.no_grad():
        for binary in args.tessel_binary:
            for name in list_benchmarks(binary, args.filter):
                case = torch_case(name)
                if case is None:
                    print(f"torch_compare: no PyTorch equivalent for {name}, skipped",
                          file=sys.stderr)
                    continue
                description, flops, fn = case
                tessel, torch_side = [], []

                def run_tessel(times=tessel, binary=binary, name=name):
                    ms, run_context = tessel_ms(binary, name, args.threads, args.min_time)
                    context.update(run_context)
                    times.append(ms)

                def run_torch(times=torch_side, fn=fn):
                    times.append(time_call(fn, args.min_time, 1))

                for round_index in range(args.rounds):
                    for side in harness.round_order([run_tessel, run_torch], round_index):
                        side()
                if raw:
                    for side, times in (("tessel", tessel), ("pytorch", torch_side)):
                        for round_index, ms in enumerate(times):
                            raw.write(kind="round", operation=name, side=side,
                                      round=round_index, ms=round(ms, 4))
                t, p = harness.summarize(tessel), harness.summarize(torch_side)
                ratio = harness.ratio_quartiles(tessel, torch_side)
                rows.append((description, t, p, ratio, flops))
                print(f"{description:45s} tessel {t.median:9.3f} ms  torch {p.median:9.3f} ms  "
                      f"ratio {t.median / p.median:5.2f}", file=sys.stderr)

    if raw:
        raw.close()
    load_after = os.getloadavg()
    lines = [
        "# Tessel vs PyTorch, CPU ops",
        "",
        f"Made by `{args.command}` on {datetime.date.today().isoformat()}.",
        "",
        f"- CPU: {cpu_model()}, {os.cpu_count()} cores; {args.threads} threads on both sides "
        f"(Tessel: set_num_threads, reported {context.get('tessel_threads', '?')}; PyTorch: "
        "torch.set_num_threads and the BLAS thread limit).",
        f"- PyTorch {torch.__version__}; matmul BLAS: {blas}; convolutions through its own "
        "CPU kernels (oneDNN where built in); OpenBLAS's idle threads sleep at once "
        f"(OPENBLAS_THREAD_TIMEOUT={os.environ.get('OPENBLAS_THREAD_TIMEOUT', 'unset')}).",
        "- OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE: "
        + ("unset for the PyTorch side" if "OPENBLAS_CORETYPE" not in os.environ
           else f"set ({os.environ.get('OPENBLAS_CORETYPE')}) for the PyTorch side: OpenBLAS "
           "runs that kernel, not the one it picks for this CPU"),
        "- Tessel: GEMM (default -c opt build, OpenMP): f32 through Tessel's own AVX-512 kernel "
        "where the CPU has it, else (and f64) Eigen 3.4's; kernel build "
        f"{context.get('tessel_gemm_isa', '?')}; 3x3 stride-1 convolutions over 32 or more "
        "channels on planes of 7x7 and up (f32) as Winograd, F(2x2, 3x3) below 128 channels and "
        "F(4x4, 3x3) from 128 (forward and both gradients; the products through Tessel's own "
        "AVX-512 kernel where the CPU has it, else that GEMM; weight gradients whose per-thread "
        "sums would pass 16 MB as im2col), other convolutions as im2col + that GEMM.",
        f"- Timing (bench/harness.py): {args.rounds} rounds per operation, each one loop of at "
        f"least {args.min_time} s per side after a warm-up call (Google Benchmark for Tessel, "
        "the same rule in Python for PyTorch), the first side alternating. Cells: the median "
        "over the rounds (interquartile range); the ratio is that of the medians, with the "
        "interquartile range of the per-round ratios. Ratio < 1: Tessel faster.",
        f"- Load average (1 min) at the start and the end: {load_before[0]:.2f}, "
        f"{load_after[0]:.2f} on {os.cpu_count()} cores (both sides' own work included); other "
        f"processes used {watch.cores():.2f} cores during the run.",
        f"- Machine at the start: {args.machine}.",
        f"- Every round: {os.path.splitext(os.path.basename(args.output or 'cpu_ops'))[0]}"
        ".raw.jsonl (one JSON line per operation, side and round).",
        "",
        "| operation | Tessel ms: median (IQR) | PyTorch ms: median (IQR) | Tessel / PyTorch (IQR) "
        "| Tessel GFLOP/s | PyTorch GFLOP/s |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for description, t, p, ratio, flops in rows:
        lines.append(f"| {description} | {t.median:.3f} ({t.spread(3)}) | "
                     f"{p.median:.3f} ({p.spread(3)}) | {t.median / p.median:.2f} "
                     f"({ratio.q1:.2f}-{ratio.q3:.2f}) | {flops / t.median / 1e6:.1f} | "
                     f"{flops / p.median / 1e6:.1f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.output:
        with open(args.output, "w") as handle:
            handle.write(text)


if __name__ == "__main__":
    main()
