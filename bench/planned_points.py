#!/usr/bin/env python3
"""Frontier points of the planner run as priced (parallel::ParallelModule), measured against the
planner's prediction: step time and peak memory per rank.

For each model (ResNet-18, ShuffleNet v2 x0.5 and BERT mini) and rank count, three points of the frontier on the
quiet 2-core CPU profiles (the smallest, the middle one and the fastest; on 2 ranks also three of
the per-op-degree frontier, `plan --per_op_degrees`, among points whose ops run at other degrees
than the rest; on other rank counts with --per_op_ranks) are written as plan files (`plan --point=K`) and trained by `parallel_bench
--planned` under mpirun, the points interleaved round by round on a quiet machine
(bench/harness.py). Each run times the median of its steps after warm-up; a cell is the median
over the rounds with the interquartile range. Writes bench/results/planned_points.md and the raw
lines beside it. With --calibrate the plans are priced with profiles measured by this run just
before its first round (written beside the table), as the shared machine's speed drifts; with
--calibrate_each_round each round measures profiles of its own
(planned_points_profiles/round_R_Nranks.json), each rank count's just before that rank count's
runs, and every run of that round is also priced under them (`parallel_bench --price_with`): a
cell's predicted step is then the median of the rounds' prices and its ratio the median of the
rounds' own measured / predicted.

  bazel build //bench:parallel_bench //tools/plan //tools/calibrate
  /usr/bin/python3 bench/planned_points.py [--rounds 5] [--models resnet18,shufflenet_v2_x0_5,bert_mini] [--calibrate | --calibrate_each_round] [--force]
"""

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Each model's sizes, as `plan` and `parallel_bench` take them, and its optimizer.
MODELS = {
    "resnet18": dict(flags=["--batch=8", "--image_size=64", "--num_classes=100"],
                     optimizer="sgd_momentum",
                     text="global batch 8, 64x64 images, 100 classes, SGD with momentum"),
    "shufflenet_v2_x0_5": dict(flags=["--batch=8", "--image_size=64", "--num_classes=100"],
                               optimizer="sgd_momentum",
                               text="global batch 8, 64x64 images, 100 classes, SGD with "
                                    "momentum"),
    "bert_mini": dict(flags=["--batch=8", "--seq=64"], optimizer="adamw",
                      text="global batch 8, sequence 64, pre-training (masked-LM and "
                           "next-sentence), dropout 0.1, AdamW"),
}
# Each rank count's profile, calibrated with that many ranks measuring at once (4 ranks share the
# 2 cores: each rank's device is half a core).
BASE_PROFILES = {2: "cpu_2core_quiet", 4: "cpu_2core_quiet_4ranks"}
PROFILES = dict(BASE_PROFILES)  # what the plans are priced with (--calibrate: this run's)


def calibrate(ranks, out, models):
    """Measures a profile with `ranks` ranks at once, on top of the committed one for that count
    (its collectives and memory as measured now, its description kept), into `out`; with the
    convolutions and linear layers of `models` timed at every local shape the planner prices."""
    base = os.path.join(ROOT, "parallel/profiles", BASE_PROFILES[ranks] + ".json")
    sizes = {}  # the models' sizes, as calibrate --shapes_of takes them (one set for all)
    for model in models:
        for flag in MODELS[model]["flags"]:
            name, value = flag.split("=")
            if sizes.setdefault(name, value) != value:
                raise SystemExit(f"calibrate --shapes_of takes one {name} for all models")
    subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(ranks),
                    os.path.join(ROOT, "bazel-bin/tools/calibrate/calibrate"), "--threads=1",
                    f"--name={BASE_PROFILES[ranks]}_now", f"--out={out}", f"--base={base}",
                    "--shapes_of=" + ",".join(models)] +
                   [f"{name}={value}" for name, value in sizes.items()],
                   cwd=ROOT, check=True, capture_output=True)
    PROFILES[ranks] = os.path.relpath(out, ROOT)


def plan_command(model, ranks, point, out, per_op=False):
    return [os.path.join(ROOT, "bazel-bin/tools/plan/plan"), f"--model={model}",
            f"--devices={ranks}"] + MODELS[model]["flags"] + [
                f"--profile={PROFILES[ranks]}", f"--optimizer={MODELS[model]['optimizer']}",
                "--any_plan", "--remat=1", f"--point={point}", f"--out={out}",
                f"--frontier_json={out}.frontier"] + (["--per_op_degrees"] if per_op else [])


def bench_command(model, ranks, plan_path, steps, warmup, price_with=None):
    return ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(ranks),
            os.path.join(ROOT, "bazel-bin/bench/parallel_bench"), f"--model={model}"] + \
        MODELS[model]["flags"] + [f"--plan={plan_path}", "--planned", f"--steps={steps}",
                                  f"--warmup={warmup}", "--threads=1"] + \
        ([f"--price_with={price_with}"] if price_with else [])


def run_json(argv):
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}): {' '.join(argv)}\n{done.stderr[-2000:]}")
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else None


def predicted_step_s(line):
    """The run's predicted step: under its round's own profile where it was priced again."""
    return line.get("repriced_step_s", line["predicted_step_s"])


def pick_points(model, ranks, workdir, per_op=False):
    """The smallest, the middle and the fastest executable point of the frontier, as plan files;
    with per_op, of the points whose ops run at other degrees than the rest (per-op degrees)."""
    kind = "per_op" if per_op else "grid"
    probe = os.path.join(workdir, f"{model}_probe{ranks}_{kind}.json")
    subprocess.run(plan_command(model, ranks, 0, probe, per_op), cwd=ROOT, check=True,
                   capture_output=True)
    with open(probe + ".frontier") as handle:
        frontier = json.load(handle)["points"]
    # Only points the runtime runs as priced (the planner marks the others).
    candidates = [index for index, point in enumerate(frontier)
                  if point.get("executable", True)
                  and (not per_op or "at other degrees" in point["summary"])]
    if not candidates:  # no point of this frontier mixes degrees
        print(f"planned_points: {model} on {ranks} ranks: no {kind} point to run", flush=True)
        return []
    chosen = sorted({candidates[0], candidates[len(candidates) // 2], candidates[-1]})
    plans = []
    for point in chosen:
        path = os.path.join(workdir, f"{model}_ranks{ranks}_{kind}_point{point}.json")
        subprocess.run(plan_command(model, ranks, point, path, per_op), cwd=ROOT, check=True,
                       capture_output=True)
        plans.append((point, path, frontier[point]["summary"]))
    return plans


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--ranks", default="2,4")
    parser.add_argument("--per_op_ranks", default="2",
                        help="rank counts whose per-op-degree frontier is run too")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--force", action="store_true")
    parser.add_argument("--calibrate", action="store_true",
                        help="plan with profiles measured at the start of this run (written "
                             "beside --out) instead of the committed ones: the shared machine's "
                             "speed drifts from hour to hour")
    parser.add_argument("--calibrate_each_round", action="store_true",
                        help="measure profiles before every round and price that round's runs "
                             "with them too (implies --calibrate)")
    parser.add_argument("--out", default=os.path.join(ROOT, "bench/results/planned_points.md"))
    args = parser.parse_args()
    args.calibrate = args.calibrate or args.calibrate_each_round
    workdir = os.path.join(os.environ.get("TMPDIR", "/tmp"), "planned_points")
    os.makedirs(workdir, exist_ok=True)
    raw_path = os.path.splitext(args.out)[0] + ".jsonl"
    began = time.time()
    quiet = harness.wait_for_quiet(max_wait=300, force=args.force, log=print)
    watch = harness.OtherProcesses()
    start_load = harness.load_average()
    rank_counts = [int(r) for r in args.ranks.split(",")]
    models = args.models.split(",")
    round_profiles_dir = os.path.splitext(args.out)[0] + "_profiles"

    def round_profile(round_index, ranks):
        return os.path.join(round_profiles_dir, f"round_{round_index}_{ranks}ranks.json")

    def calibrate_round(round_index, counts=None):
        os.makedirs(round_profiles_dir, exist_ok=True)
        for ranks in counts or rank_counts:
            out = round_profile(round_index, ranks)
            print(f"round {round_index}: calibrating {ranks} ranks into {out}", flush=True)
            calibrate(ranks, out, models)

    if args.calibrate_each_round:
        calibrate_round(0)  # round 0's profiles also pick the points
    elif args.calibrate:
        for ranks in rank_counts:
            out = os.path.splitext(args.out)[0] + f"_profile_{ranks}ranks.json"
            print(f"calibrating {ranks} ranks into {out}", flush=True)
            calibrate(ranks, out, models)
    plan_profiles = dict(PROFILES)  # what the points were picked and planned with
    sides = []
    for model in models:
        for ranks in rank_counts:
            per_op_ranks = {int(r) for r in args.per_op_ranks.split(",") if r}
            for per_op in ([False, True] if ranks in per_op_ranks else [False]):
                for point, path, summary in pick_points(model, ranks, workdir, per_op):
                    sides.append(dict(model=model, ranks=ranks, point=point, path=path,
                                      summary=summary,
                                      frontier="per-op degrees" if per_op else "dp x tp grid"))
    results = {id(side): [] for side in sides}
    with harness.RawLog(raw_path) as raw:
        raw.write(kind="run", environment=harness.environment(ROOT, 1), quiet=quiet.__dict__,
                  models={m: MODELS[m] for m in models}, profiles=PROFILES, rounds=args.rounds,
                  steps=args.steps,
                  warmup=args.warmup)
        def round_sides(round_index):
            """The round's runs in order; with --calibrate_each_round each rank count's runs come
            right after that rank count's calibration (round 0's came before the points were
            picked), so that a price is as close as it can be to the runs it prices."""
            if not args.calibrate_each_round:
                yield from harness.round_order(sides, round_index)
                return
            for ranks in harness.round_order(rank_counts, round_index):
                if round_index > 0:
                    calibrate_round(round_index, [ranks])
                yield from harness.round_order([s for s in sides if s["ranks"] == ranks],
                                               round_index)

        for round_index in range(args.rounds):
            for side in round_sides(round_index):
                price_with = (round_profile(round_index, side["ranks"])
                              if args.calibrate_each_round else None)
                argv = bench_command(side["model"], side["ranks"], side["path"], args.steps,
                                     args.warmup, price_with)
                line = run_json(argv)
                results[id(side)].append(line)
                raw.write(kind="step_median", round=round_index, model=side["model"],
                          ranks=side["ranks"],
                          frontier=side["frontier"], point=side["point"], command=" ".join(argv),
                          result=line)
                print(f"round {round_index} {side['model']} ranks {side['ranks']} "
                      f"{side['frontier']} point "
                      f"{side['point']}: "
                      f"{line['step_s'] * 1e3:.1f} ms (predicted "
                      f"{predicted_step_s(line) * 1e3:.1f}), peak "
                      f"{line['peak_bytes'] / 2**20:.1f} MiB (predicted "
                      f"{line['predicted_memory_bytes'] / 2**20:.1f})", flush=True)
    busy = watch.cores()
    end_load = harness.load_average()
    lines = [
        "# Frontier points run as priced: measured against the planner",
        "",
        f"Made by `bench/planned_points.py` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(began))} "
        f"in {(time.time() - began) / 60:.1f} minutes, Tessel at commit "
        f"{harness.git_commit(ROOT)}. "
        + "; ".join(f"{m}: {MODELS[m]['text']}" for m in models) +
        "; f32, 1 thread per rank, ranks under `mpirun --oversubscribe` on the 2-core machine; "
        "plans from `plan --profile=P --any_plan --remat=1 --point=K` (P: "
        + ", ".join(f"`{name}` for {ranks} ranks" for ranks, name in plan_profiles.items())
        + ", each calibrated with that many ranks measuring at once"
        + (", by this run before each of its rounds, each rank count's just before its runs "
           "(the plans picked with round 0's; "
           f"every run priced again under its round's, `parallel_bench --price_with`: "
           f"{os.path.basename(round_profiles_dir)}/round_R_Nranks.json)"
           if args.calibrate_each_round else
           ", by this run just before its first round" if args.calibrate else "")
        + (", with the models' convolutions and linear layers timed at every local shape "
           "their strategies make (`calibrate --shapes_of`)" if args.calibrate else "") + ") "
        "(the smallest, the middle and the fastest point of each frontier; on 2 ranks also of "
        "`--per_op_degrees` among points with ops at other degrees), trained by "
        "`parallel_bench --planned` (parallel::ParallelModule: every op with its planned split). "
        f"Per cell: the median over {args.rounds} interleaved rounds (each the median of "
        f"{args.steps} steps after {args.warmup} warm-up steps; a step is the slowest rank's) "
        "with the interquartile range"
        + ("; predicted: the median of the rounds' prices, measured / predicted: the median of "
           "the rounds' own ratios (their interquartile range)" if args.calibrate_each_round
           else "")
        + "; peak: the largest rank's allocator peak over the timed "
        "steps (parameters, gradients, optimizer state, activations and the moves' buffers), the median "
        "over the rounds; moves beyond the plan: gathers for views that cut across a split "
        "which the runtime made beyond those the planner prices (ShuffleNet's channel split and "
        "shuffle are priced gathers). "
        f"Raw lines (with the commands): {os.path.basename(raw_path)}.",
        "",
        f"- Machine: {'quiet' if not quiet.forced else 'NOT quiet (--force)'}; load average "
        f"{start_load:.2f} at the start, {end_load:.2f} at the end; other processes used "
        f"{busy:.2f} cores during the run. With 4 ranks on 2 cores every rank shares a core "
        "with another, as it did when its profile was calibrated.",
        "",
        "| model | ranks | frontier | point | plan | step (measured) | predicted | "
        "measured / predicted | peak per rank | predicted | measured / predicted | "
        "moves beyond the plan per step |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for side in sides:
        runs = results[id(side)]
        step = harness.summarize([r["step_s"] * 1e3 for r in runs])
        peak = harness.summarize([r["peak_bytes"] / 2**20 for r in runs])
        predicted_step = harness.summarize([predicted_step_s(r) * 1e3 for r in runs]).median
        ratio = harness.ratio_quartiles([r["step_s"] for r in runs],
                                        [predicted_step_s(r) for r in runs])
        predicted_peak = runs[0]["predicted_memory_bytes"] / 2**20
        lines.append(
            f"| {side['model']} | {side['ranks']} | {side['frontier']} | {side['point']} | "
            f"{side['summary']} | "
            f"{step.median:.1f} ms "
            f"({step.spread()}) | {predicted_step:.1f} ms | "
            + (f"{ratio.median:.2f} ({ratio.q1:.2f}-{ratio.q3:.2f})"
               if args.calibrate_each_round else f"{step.median / predicted_step:.2f}") + " | "
            f"{peak.median:.1f} MiB | {predicted_peak:.1f} MiB | "
            f"{peak.median / predicted_peak:.2f} | "
            f"{runs[0].get('unplanned_moves_per_step', 0):.0f} |")
    with open(args.out, "w") as handle:
        handle.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
