#!/usr/bin/env python3
"""Runs every command README.md shows, as written, with training cut to a few steps.

Usage: readme_commands.py README TRAIN PLAN

Commands come from the ```sh blocks (lines joined at a trailing backslash, comments dropped) and
run in one scratch directory in README order, so a plan file one command writes is read by the
next:
  ./tessel train ARGS and bazel-bin/train/train ARGS (also under mpirun): the train binary with
      ARGS and --steps=2 added;
  bazel run //parallel:plan -- ARGS: the plan binary with ARGS.
Commands that build or test (./tessel test or fuzz, bazel build or test, tools/gpu_check.sh) are
what the suite and CI run themselves; commands for a GPU (--device=cuda) need one, and commands
whose data path is a placeholder (/path/to/) need data the reader brings: these are listed as
not run here. Any other command fails the test, so a new kind of README command gets a way to
run here.
"""
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

BUILD_OR_TEST = ("./tessel test", "./tessel fuzz", "bazel build", "bazel test",
                 "tools/gpu_check.sh")
TRAIN_PREFIXES = ("./tessel train", "bazel-bin/train/train")
PLAN_PREFIX = "bazel run //parallel:plan --"
TRAIN_LIMITS = ["--steps=2"]


def readme_commands(path):
    commands, inside, pending = [], False, ""
    with open(path, encoding="utf-8") as readme:
        for line in readme:
            line = line.rstrip("\n")
            if line.strip() == "```sh":
                inside = True
                continue
            if line.strip() == "```":
                inside = False
                continue
            if not inside:
                continue
            if pending:
                line = pending + " " + line.strip()
                pending = ""
            if line.endswith("\\"):
                pending = line[:-1].rstrip()
                continue
            command = re.sub(r"\s+#.*$", "", line).strip()
            if command and not command.startswith("#"):
                commands.append(command)
    return commands


def translate(command, train, plan):
    """The argv to run for `command`, or a reason it is not run here."""
    if command.startswith(BUILD_OR_TEST):
        return None, "builds or tests: run by the suite and CI themselves"
    if "--device=cuda" in command:
        return None, "needs a GPU and the CUDA build"
    if "/path/to/" in command:
        return None, "its data path is a placeholder"
    words = shlex.split(command)
    launcher = []
    if words[0] == "mpirun":
        # As root, Open MPI wants --allow-run-as-root (the README says so); ranks may share cores.
        program_at = next(i for i, w in enumerate(words) if not w.startswith("-") and i > 0
                          and not words[i - 1] in ("-np", "-n"))
        launcher = (["mpirun", "--allow-run-as-root", "--oversubscribe"]
                    + [w for w in words[1:program_at] if w != "--oversubscribe"])
        words = words[program_at:]
    text = " ".join(words)
    for prefix in TRAIN_PREFIXES:
        if text == prefix or text.startswith(prefix + " "):
            args = shlex.split(text[len(prefix):])
            if "--help" in args:
                return launcher + [train] + args, None
            return launcher + [train] + args + TRAIN_LIMITS, None
    if text.startswith(PLAN_PREFIX):
        return launcher + [plan] + shlex.split(text[len(PLAN_PREFIX):]), None
    return None, "UNKNOWN"


def main():
    readme, train, plan = (os.path.abspath(p) for p in sys.argv[1:4])
    commands = readme_commands(readme)
    assert commands, "no ```sh commands found in " + readme
    scratch = tempfile.mkdtemp(prefix="readme_commands_", dir=os.environ.get("TEST_TMPDIR"))
    # mpirun's session files and shared-memory segments in a directory of its own (tests run at
    # once share /tmp and /dev/shm), under /tmp: OpenMPI's socket paths stay under 108 characters.
    mpi_dir = tempfile.mkdtemp(prefix="ompi.", dir="/tmp")
    env = dict(os.environ, OMPI_MCA_rmaps_base_oversubscribe="yes",
               OMPI_MCA_orte_tmpdir_base=mpi_dir, OMPI_MCA_btl_vader_backing_directory=mpi_dir,
               HOME=scratch)
    env["ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", "") + ":detect_leaks=0"  # Open MPI's leaks
    ran, skipped, failed, unknown = 0, [], [], []
    for command in commands:
        argv, reason = translate(command, train, plan)
        if reason == "UNKNOWN":
            unknown.append(command)
            continue
        if argv is None:
            skipped.append((command, reason))
            continue
        print("$ " + command + "\n  runs: " + " ".join(argv), flush=True)
        result = subprocess.run(argv, cwd=scratch, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, timeout=900)
        ran += 1
        tail = "\n".join(result.stdout.splitlines()[-6:])
        print("  exit " + str(result.returncode) + "\n" + tail + "\n", flush=True)
        if result.returncode != 0:
            failed.append(command)
    for command, reason in skipped:
        print("not run here (" + reason + "): " + command)
    for command in unknown:
        print("UNKNOWN KIND OF COMMAND (teach tests/tools/readme_commands.py to run it): "
              + command)
    print(f"{ran} README commands ran, {len(failed)} failed, {len(skipped)} not run here, "
          f"{len(unknown)} unknown")
    for command in failed:
        print("FAILED: " + command)
    shutil.rmtree(mpi_dir, ignore_errors=True)
    return 1 if failed or unknown or ran == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
