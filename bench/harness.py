"""The measuring rules every comparison in bench/ shares, so that no figure can flatter.

- A quiet machine: before a run the harness waits until no other process uses the CPU and the
  1-minute load average is under 1, and refuses to measure when that does not happen in time
  (--force measures anyway, and the results say "taken under load"). During the run it counts the
  CPU time of every process outside its own process tree, so a result records how much else ran.
- Sides interleaved round by round, the first side alternating, and enough rounds for a stable
  median (MIN_TRAINING_STEPS per side for training steps). The idle side must not spin: both
  sides' OpenMP threads wait passively (OMP_WAIT_POLICY=passive) and PyTorch's OpenBLAS threads
  sleep at once (OPENBLAS_THREAD_TIMEOUT=4), or their spinning takes the other side's time.
- Medians with the interquartile range and the number of rounds, never the fastest step.
- Raw data: one JSON line per timed step (and one per run and per row) beside the table.

  quiet = harness.wait_for_quiet(max_wait=300, force=args.force, log=print)
  watch = harness.OtherProcesses()
  ... for round_index in range(rounds): for side in harness.round_order(sides, round_index): ...
  summary = harness.summarize(times)        # median, q1, q3, iqr, count, low, high
  busy = watch.cores()                      # CPU cores other processes used meanwhile
  with harness.RawLog(path, append=False) as raw: raw.write(kind="step", ...)
"""

import dataclasses
import json
import os
import platform
import statistics
import subprocess
import sys
import time

# Training steps per side below which a median is not trusted.
MIN_TRAINING_STEPS = 20
# What "quiet" means: the 1-minute load average below LOAD_LIMIT and other processes using less
# than OTHER_CORES_LIMIT cores while the harness samples them.
LOAD_LIMIT = 1.0
OTHER_CORES_LIMIT = 0.1

_TICKS = os.sysconf("SC_CLK_TCK")


def _read(path):
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:  # the process ended meanwhile, or it is not ours to read
        return ""


def _stat_fields(pid):
    """/proc/PID/stat's fields after the command name (field 3 onwards), or None."""
    text = _read(f"/proc/{pid}/stat")
    close = text.rfind(")")
    return text[close + 2:].split() if close >= 0 else None


def _process_ticks(fields, with_children):
    """CPU clock ticks of a process (utime + stime), with its waited-for children's if asked."""
    ticks = int(fields[11]) + int(fields[12])
    if with_children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks


def _all_pids():
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _own_tree(pids_to_parent, root=None):
    """The process `root` (this one by default) and its descendants."""
    own = {root or os.getpid()}
    grew = True
    while grew:
        grew = False
        for pid, parent in pids_to_parent.items():
            if parent in own and pid not in own:
                own.add(pid)
                grew = True
    return own


def _snapshot(root=None):
    """(machine busy ticks, ticks of the tree of `root` (this process by default), {pid: (name,
    ticks)} of other processes).

    The tree's ticks include children that already ended (cutime/cstime of their waiting parent),
    so machine - tree counts only what ran outside it."""
    first = _read("/proc/stat").splitlines()[0].split()[1:]
    values = [int(v) for v in first]
    # user nice system idle iowait irq softirq steal: busy is all but idle and iowait.
    machine = sum(values[:8]) - values[3] - values[4]
    stats, parents = {}, {}
    for pid in _all_pids():
        fields = _stat_fields(pid)
        if fields:
            stats[pid] = fields
            parents[pid] = int(fields[1])
    own = _own_tree(parents, root)
    tree = 0
    others = {}
    for pid, fields in stats.items():
        if pid in own:
            tree += _process_ticks(fields, with_children=True)
        else:
            name = _read(f"/proc/{pid}/comm").strip() or str(pid)
            others[pid] = (name, _process_ticks(fields, with_children=False))
    return machine, tree, others


class OtherProcesses:
    """Counts the CPU time processes outside a process tree (this process's by default) use from
    its creation on."""

    def __init__(self, root=None):
        self.root = root
        self.start_time = time.monotonic()
        self.machine, self.tree, self.others = _snapshot(root)

    def cores(self):
        """Average cores other processes used since creation (0 when no time has passed)."""
        machine, tree, _ = _snapshot(self.root)
        seconds = time.monotonic() - self.start_time
        if seconds <= 0:
            return 0.0
        other_ticks = (machine - self.machine) - (tree - self.tree)
        return max(0.0, other_ticks / _TICKS / seconds)

    def busiest(self, count=3):
        """The other processes that used the most CPU since creation: [(name, cores)]."""
        _, _, now = _snapshot(self.root)
        seconds = max(time.monotonic() - self.start_time, 1e-9)
        used = {}
        for pid, (name, ticks) in now.items():
            before = self.others.get(pid, (name, 0))[1]
            if ticks > before:
                used[name] = used.get(name, 0.0) + (ticks - before) / _TICKS / seconds
        return sorted(used.items(), key=lambda item: -item[1])[:count]


@dataclasses.dataclass
class Quiet:
    """How quiet the machine was when a run began."""
    load: float  # 1-minute load average
    other_cores: float  # CPU cores other processes used over the sample
    waited: float  # seconds spent waiting for quiet
    forced: bool  # measured although the machine never became quiet

    def describe(self):
        state = ("taken under load (--force): the machine did not become quiet"
                 if self.forced else "quiet")
        return (f"{state}; load average {self.load:.2f}, other processes {self.other_cores:.2f} "
                f"cores at the start (waited {self.waited:.0f} s)")


def load_average():
    return os.getloadavg()[0]


def sample_quiet(seconds=2.0):
    """(load average, other processes' cores over `seconds`, their busiest [(name, cores)])."""
    watch = OtherProcesses()
    time.sleep(seconds)
    return load_average(), watch.cores(), watch.busiest()


def wait_for_quiet(max_wait=300.0, force=False, log=None, sample=sample_quiet, sleep=time.sleep,
                   load_limit=LOAD_LIMIT, cores_limit=OTHER_CORES_LIMIT):
    """Waits (up to max_wait seconds) until the machine is quiet; returns a Quiet. When it does not
    become quiet: raises SystemExit saying why, or with `force` returns Quiet(forced=True)."""
    began = time.monotonic()
    said = None  # when the wait was last reported
    while True:
        load, cores, busiest = sample()
        waited = time.monotonic() - began
        if load < load_limit and cores < cores_limit:
            return Quiet(load, cores, waited, forced=False)
        why = (f"load average {load:.2f} (limit {load_limit}), other processes {cores:.2f} cores "
               f"(limit {cores_limit})" +
               (": " + ", ".join(f"{name} {used:.2f}" for name, used in busiest) if busiest
                else ""))
        if waited >= max_wait:
            if force:
                if log:
                    log(f"harness: not quiet after {waited:.0f} s ({why}); measuring anyway "
                        "(--force), the results say so")
                return Quiet(load, cores, waited, forced=True)
            raise SystemExit(f"harness: the machine is not quiet ({why}) after waiting "
                             f"{waited:.0f} s; stop what runs, or pass --force to measure anyway "
                             "(the results are then marked as taken under load)")
        if log and (said is None or waited - said >= 30):
            log(f"harness: waiting for a quiet machine: {why}")
            said = waited
        sleep(min(10.0, max(0.0, max_wait - waited)))


def watch_run(root, stop_file, interval=10.0, sleep=time.sleep):
    """For a run a shell script makes: counts what processes outside the tree of `root` use until
    `stop_file` exists or `root` has ended, and returns one line for the results: the cores they
    used on average and at most over one interval, and the busiest of them."""
    whole = OtherProcesses(root)
    most = 0.0
    while not os.path.exists(stop_file) and os.path.exists(f"/proc/{root}"):
        part = OtherProcesses(root)
        sleep(interval)
        most = max(most, part.cores())
    busiest = [(name, used) for name, used in whole.busiest() if used >= 0.005]
    return (f"during the run other processes used {whole.cores():.2f} cores on average (at most "
            f"{most:.2f} over {interval:g} s)" +
            (": " + ", ".join(f"{name} {used:.2f}" for name, used in busiest) if busiest else ""))


def round_order(sides, round_index):
    """The sides in the order of round `round_index`: the first side alternates, so neither
    always runs after the other (whose caches it then finds cold)."""
    return list(sides) if round_index % 2 == 0 else list(reversed(sides))


@dataclasses.dataclass
class Summary:
    median: float
    q1: float
    q3: float
    count: int
    low: float
    high: float

    @property
    def iqr(self):
        return self.q3 - self.q1

    def spread(self, digits=1):
        """'q1-q3' for a table cell."""
        return f"{self.q1:.{digits}f}-{self.q3:.{digits}f}"


def summarize(values):
    """Median, quartiles (inclusive method: within the data's range), count, min and max."""
    values = list(values)
    if not values:
        raise ValueError("summarize: no values")
    if len(values) == 1:
        q1 = q3 = values[0]
    else:
        q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return Summary(statistics.median(values), q1, q3, len(values), min(values), max(values))


def ratio_quartiles(numerators, denominators):
    """The quartiles of numerator / denominator over the rounds both sides ran (paired in
    order): how far the ratio of the medians moves from round to round."""
    pairs = [a / b for a, b in zip(numerators, denominators) if b > 0]
    return summarize(pairs)


def _command_output(argv, env=None):
    try:
        return subprocess.run(argv, capture_output=True, text=True, env=env).stdout
    except OSError:
        return ""


def cpu_model():
    for line in _read("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def git_commit(root):
    commit = _command_output(["git", "-C", root, "rev-parse", "--short=12", "HEAD"]).strip()
    # Results files are what a run writes, not the code it measures.
    dirty = _command_output(["git", "-C", root, "status", "--porcelain", "--untracked-files=no",
                             "--", ".", ":!bench/results"])
    return (commit or "unknown") + (" (with uncommitted changes)" if dirty.strip() else "")


TORCH_PROBE = r"""
import json, os, sys
import torch
threads = int(sys.argv[1])
torch.set_num_threads(threads)
torch.mm(torch.ones(8, 8), torch.ones(8, 8))
info = {"torch": torch.__version__, "threads": torch.get_num_threads(),
        "mkldnn": bool(torch.backends.mkldnn.is_available()),
        "cpu_capability": "", "blas": ""}
try:
    import torchvision
    info["torchvision"] = torchvision.__version__
except ImportError:
    pass
config = torch.__config__.show()
for line in config.splitlines():
    line = line.strip().lstrip("- ")
    if "MKL-DNN" in line or "oneDNN" in line:
        info["onednn"] = line
    if line.startswith("CPU capability usage:"):
        info["cpu_capability"] = line.split(":", 1)[1].strip()
    if "BLAS_INFO=" in line:
        info["blas_info"] = line.split("BLAS_INFO=", 1)[1].split(",")[0]
    if "USE_MKLDNN=" in line:
        info["use_mkldnn"] = line.split("USE_MKLDNN=", 1)[1].split(",")[0]
try:
    import threadpoolctl
    blas = [i for i in threadpoolctl.threadpool_info() if i.get("user_api") == "blas"]
    if blas:
        info["blas"] = f"{blas[0]['internal_api']} {blas[0]['version']} kernel " \
                       f"{blas[0].get('architecture')}"
        info["blas_threads"] = blas[0].get("num_threads")
except ImportError:
    pass
print(json.dumps(info))
"""


def torch_environment(python, threads, env=None):
    """PyTorch's versions, thread counts and build configuration (oneDNN, BLAS and its kernel,
    the CPU capability its kernels dispatch to), as the PyTorch side will see them."""
    out = _command_output([python, "-c", TORCH_PROBE, str(threads)], env=env)
    try:
        return json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"torch": "unknown"}


# OpenBLAS's kernels that use AVX2 (its core names). On a CPU model OpenBLAS does not know it falls
# back to Prescott (SSE3) even where AVX2 is there, which makes no fair anchor.
AVX2_KERNELS = {"haswell", "zen", "skylakex", "cooperlake", "sapphirerapids"}


def cpu_has_avx2(cpuinfo="/proc/cpuinfo"):
    for line in _read(cpuinfo).splitlines():
        if line.startswith("flags"):
            return "avx2" in line.split()
    return False


def coretype_for(blas, has_avx2):
    """The OPENBLAS_CORETYPE that gives OpenBLAS its AVX2 kernel: "Haswell" when the CPU has AVX2
    and `blas` (as torch_environment reports it: "openblas 0.3.21 kernel Prescott") names a kernel
    without it; None otherwise (another BLAS, or the kernel is fine)."""
    if not has_avx2 or not blas.lower().startswith("openblas") or " kernel " not in blas:
        return None
    return None if blas.rsplit(" ", 1)[-1].lower() in AVX2_KERNELS else "Haswell"


def without_blas_overrides(env):
    """`env` less the OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE some machines set for old OpenBLAS
    builds (they slow a current one down)."""
    return {k: v for k, v in env.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}


def blas_coretype(python, threads, env=None):
    """coretype_for the OpenBLAS that `python`'s PyTorch loads here (None: leave it be)."""
    return coretype_for(torch_environment(python, threads, env).get("blas", ""), cpu_has_avx2())


def describe_torch(info):
    """One line for a results header."""
    parts = [f"PyTorch {info.get('torch', 'unknown')}"]
    if info.get("torchvision"):
        parts.append(f"torchvision {info['torchvision']}")
    build = [f"BLAS: {info.get('blas') or info.get('blas_info') or 'unknown'}"]
    if info.get("cpu_capability"):
        build.append(f"kernels dispatched for {info['cpu_capability']}")
    build.append(info["onednn"] if info.get("mkldnn") and info.get("onednn") else
                 f"oneDNN {'on' if info.get('mkldnn') else 'off'}")
    return ", ".join(parts) + "; " + ", ".join(build)


def environment(root, threads, python=None, torch_env=None):
    """What a run records about the machine and the software: a dict for the raw log."""
    result = {
        "machine": cpu_model(),
        "cores": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "commit": git_commit(root),
        "threads": threads,
    }
    if python:
        result["pytorch"] = torch_environment(python, threads, torch_env)
    return result


class RawLog:
    """One JSON object per line; `append` keeps what the file holds."""

    def __init__(self, path, append=False):
        self.path = path
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self.handle = open(path, "a" if append else "w")

    def write(self, **record):
        self.handle.write(json.dumps(record, sort_keys=True) + "\n")
        self.handle.flush()

    def close(self):
        self.handle.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def main(argv=None):
    """`harness.py quiet [--max-wait S] [--force]`: for shell scripts; waits for a quiet machine
    and prints how quiet it was (one line for a results file), or exits 1 saying why not.
    `harness.py watch --root PID --stop FILE [--interval S]`: run in the background by a script
    that measures (PID: the script), prints what else ran until FILE exists (watch_run).
    `harness.py blas-coretype [--threads N] [--python P]`: prints the OPENBLAS_CORETYPE the
    PyTorch side needs for its AVX2 kernel (coretype_for), or nothing."""
    import argparse
    parser = argparse.ArgumentParser(description=main.__doc__.splitlines()[0])
    parser.add_argument("command", choices=["quiet", "watch", "blas-coretype"])
    parser.add_argument("--root", type=int)
    parser.add_argument("--stop")
    parser.add_argument("--interval", type=float, default=10.0)
    parser.add_argument("--max-wait", type=float, default=300)
    parser.add_argument("--force", action="store_true")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--python", default="/usr/bin/python3")
    args = parser.parse_args(argv)
    if args.command == "watch":
        if not args.root or not args.stop:
            parser.error("watch needs --root PID and --stop FILE")
        print(watch_run(args.root, args.stop, args.interval))
        return 0
    if args.command == "blas-coretype":
        print(blas_coretype(args.python, args.threads, without_blas_overrides(os.environ)) or "")
        return 0
    try:
        quiet = wait_for_quiet(args.max_wait, args.force,
                               log=lambda line: print(line, file=sys.stderr, flush=True))
    except SystemExit as refusal:
        print(refusal, file=sys.stderr)
        return 1
    print(quiet.describe())
    return 0


if __name__ == "__main__":
    sys.exit(main())
