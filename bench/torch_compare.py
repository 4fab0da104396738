#!/usr/bin/python3
"""Runs the shapes of Tessel's CPU benchmarks in PyTorch and prints a Tessel/PyTorch table.

Reads the JSON that gemm_bench and conv_bench wrote (--benchmark_format=json), times the same
operation in PyTorch with the same thread count and the same timing rule (a warm-up call, then
repeated timed loops of at least --min-time seconds; the median of the repetitions), and writes
a Markdown table. bench/run.sh calls it; by hand:
  /usr/bin/python3 bench/torch_compare.py --threads 2 --tessel-json gemm.json conv.json \
      --output bench/results/cpu_ops.md --command "bench/run.sh --threads 2"
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F


def load_tessel(paths):
    """name -> (milliseconds per iteration, flops per second), preferring median aggregates."""
    runs, medians = {}, {}
    context = {}
    for path in paths:
        try:
            with open(path) as handle:
                data = json.load(handle)
        except (OSError, ValueError):
            print(f"torch_compare: no benchmark results in {path}, skipped", file=sys.stderr)
            continue
        context.update(data.get("context", {}))
        for entry in data["benchmarks"]:
            name = entry.get("run_name", entry["name"])
            scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[entry.get("time_unit", "ns")]
            value = (entry["real_time"] * scale, entry.get("flops"))
            if entry.get("run_type") == "aggregate":
                if entry.get("aggregate_name") == "median":
                    medians[name] = value
            else:
                runs.setdefault(name, []).append(value)
    result = dict(medians)
    for name, values in runs.items():
        if name not in result:
            result[name] = (statistics.median(v[0] for v in values), values[0][1])
    return result, context


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
    if kind == "BM_MatmulF32":
        (n,) = args
        a, b = pattern(n, n), pattern(n, n)
        return f"matmul op f32 {n}^3", 2.0 * n**3, lambda: torch.matmul(a, b)
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
    parser.add_argument("--tessel-json", nargs="+", required=True)
    parser.add_argument("--output", help="Markdown file to write (stdout always gets the table)")
    parser.add_argument("--command", default="bench/run.sh", help="command line to record")
    parser.add_argument("--min-time", type=float, default=0.5)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--machine", default="not checked",
                        help="how quiet the machine was (bench/harness.py quiet)")
    args = parser.parse_args()

    load_before = os.getloadavg()
    torch.set_num_threads(args.threads)
    blas, _limiter = blas_description(args.threads)
    tessel, context = load_tessel(args.tessel_json)

    rows = []
    with torch.no_grad():
        for name, (tessel_ms, tessel_flops) in tessel.items():
            case = torch_case(name)
            if case is None:
                print(f"torch_compare: no PyTorch equivalent for {name}, skipped", file=sys.stderr)
                continue
            description, flops, fn = case
            torch_ms = time_call(fn, args.min_time, args.repetitions)
            rows.append((description, tessel_ms, torch_ms, flops))
            print(f"{description:45s} tessel {tessel_ms:9.3f} ms  torch {torch_ms:9.3f} ms  "
                  f"ratio {tessel_ms / torch_ms:5.2f}", file=sys.stderr)

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
        "CPU kernels (oneDNN where built in).",
        "- OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE: "
        + ("unset for the PyTorch side" if "OPENBLAS_CORETYPE" not in os.environ
           else f"set ({os.environ.get('OPENBLAS_CORETYPE')}): OpenBLAS runs a slower kernel"),
        "- Tessel: Eigen 3.4 GEMM (default -c opt build, OpenMP), kernel build "
        f"{context.get('tessel_gemm_isa', '?')}; 3x3 convolutions as im2col + that GEMM.",
        f"- Time per call: median of {args.repetitions} repetitions of a loop of at least "
        f"{args.min_time} s, after a warm-up call (Google Benchmark for Tessel, the same rule "
        "in Python for PyTorch). Ratio < 1: Tessel faster.",
        f"- Load average (1 min) when the PyTorch side started and ended: {load_before[0]:.2f}, "
        f"{load_after[0]:.2f} on {os.cpu_count()} cores (both sides' own work included).",
        f"- Machine at the start: {args.machine}.",
        "",
        "| operation | Tessel ms | PyTorch ms | Tessel / PyTorch | Tessel GFLOP/s | "
        "PyTorch GFLOP/s |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for description, tessel_ms, torch_ms, flops in rows:
        lines.append(f"| {description} | {tessel_ms:.3f} | {torch_ms:.3f} | "
                     f"{tessel_ms / torch_ms:.2f} | {flops / tessel_ms / 1e6:.1f} | "
                     f"{flops / torch_ms / 1e6:.1f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.output:
        with open(args.output, "w") as handle:
            handle.write(text)


if __name__ == "__main__":
    main()
