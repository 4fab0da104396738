#!/usr/bin/python3
"""bench/harness.py: medians and quartiles, the alternating round order, waiting for a quiet
machine (refusing, or measuring under --force and saying so), counting other processes' CPU, and
the raw JSON lines.
Usage: harness_test.py PATH/TO/bench/harness.py"""

import json
import os
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv.pop(1))))
import harness  # noqa: E402


class Summaries(unittest.TestCase):
    def test_median_quartiles_and_range(self):
        summary = harness.summarize([5.0, 1.0, 4.0, 2.0, 3.0, 100.0])
        self.assertEqual(summary.median, 3.5)
        # Inclusive quartiles: positions 1.25 and 3.75 of the sorted values 1 2 3 4 5 100.
        self.assertAlmostEqual(summary.q1, 2.25)
        self.assertAlmostEqual(summary.q3, 4.75)
        self.assertAlmostEqual(summary.iqr, 2.5)
        self.assertEqual((summary.count, summary.low, summary.high), (6, 1.0, 100.0))
        self.assertEqual(summary.spread(), "2.2-4.8")

    def test_one_value_and_none(self):
        summary = harness.summarize([7.0])
        self.assertEqual((summary.median, summary.q1, summary.q3), (7.0, 7.0, 7.0))
        with self.assertRaises(ValueError):
            harness.summarize([])

    def test_ratio_quartiles_pair_rounds_in_order(self):
        ratio = harness.ratio_quartiles([2.0, 4.0, 6.0], [1.0, 2.0, 2.0])
        self.assertEqual(ratio.median, 2.0)
        self.assertEqual((ratio.low, ratio.high), (2.0, 3.0))

    def test_rounds_alternate_the_first_side(self):
        self.assertEqual(harness.round_order(["a", "b"], 0), ["a", "b"])
        self.assertEqual(harness.round_order(["a", "b"], 1), ["b", "a"])
        self.assertEqual(harness.round_order(["a", "b"], 2), ["a", "b"])


class Quiet(unittest.TestCase):
    def samples(self, *values):
        values = list(values)
        return lambda: values.pop(0) if len(values) > 1 else values[0]

    def test_a_quiet_machine_starts_at_once(self):
        quiet = harness.wait_for_quiet(sample=self.samples((0.3, 0.0, [])), sleep=lambda s: None)
        self.assertFalse(quiet.forced)
        self.assertIn("quiet; load average 0.30", quiet.describe())

    def test_it_waits_until_the_machine_is_quiet(self):
        slept = []
        busy = (1.8, 1.2, [("cc1plus", 1.1)])
        quiet = harness.wait_for_quiet(max_wait=600, sample=self.samples(busy, busy, (0.5, 0.01, [])),
                                       sleep=slept.append, log=lambda line: None)
        self.assertFalse(quiet.forced)
        self.assertEqual(len(slept), 2)

    def test_a_busy_machine_is_refused_naming_what_runs(self):
        busy = (2.5, 1.5, [("cc1plus", 1.4)])
        with self.assertRaises(SystemExit) as caught:
            harness.wait_for_quiet(max_wait=0, sample=self.samples(busy), sleep=lambda s: None)
        message = str(caught.exception)
        for fragment in ("not quiet", "load average 2.50", "cc1plus 1.40", "--force"):
            self.assertIn(fragment, message)

    def test_force_measures_anyway_and_says_so(self):
        busy = (0.2, 0.9, [("java", 0.9)])  # a low load average, but another process runs
        quiet = harness.wait_for_quiet(max_wait=0, force=True, sample=self.samples(busy),
                                       sleep=lambda s: None)
        self.assertTrue(quiet.forced)
        self.assertIn("taken under load", quiet.describe())


    def test_the_command_line_prints_one_line_for_a_results_file(self):
        # With --force it always measures: the line says whether the machine was quiet.
        result = subprocess.run([sys.executable, harness.__file__, "quiet", "--max-wait", "0",
                                 "--force"], capture_output=True, text=True)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertRegex(result.stdout, r"^(quiet|taken under load \(--force\)).*load average")


class BlasAnchor(unittest.TestCase):
    def test_an_sse3_kernel_on_an_avx2_cpu_is_pinned_to_haswell(self):
        self.assertEqual(harness.coretype_for("openblas 0.3.21 kernel Prescott", True), "Haswell")
        self.assertEqual(harness.coretype_for("openblas 0.3.21 kernel Sandybridge", True),
                         "Haswell")

    def test_an_avx2_kernel_another_blas_or_an_older_cpu_stay_as_they_are(self):
        self.assertIsNone(harness.coretype_for("openblas 0.3.21 kernel Haswell", True))
        self.assertIsNone(harness.coretype_for("openblas 0.3.21 kernel Zen", True))
        self.assertIsNone(harness.coretype_for("openblas 0.3.21 kernel Prescott", False))
        self.assertIsNone(harness.coretype_for("mkl 2024.0 kernel skylake", True))
        self.assertIsNone(harness.coretype_for("", True))

    def test_the_cpu_flags_are_read_from_cpuinfo(self):
        with tempfile.NamedTemporaryFile("w", suffix="cpuinfo", delete=False) as handle:
            handle.write("processor\t: 0\nflags\t\t: fpu sse3 avx avx2 fma\n")
        self.assertTrue(harness.cpu_has_avx2(handle.name))
        with open(handle.name, "w") as rewritten:
            rewritten.write("processor\t: 0\nflags\t\t: fpu sse3 avx\n")
        self.assertFalse(harness.cpu_has_avx2(handle.name))
        os.unlink(handle.name)


class OtherProcesses(unittest.TestCase):
    def test_a_busy_process_outside_this_tree_is_named(self):
        # The shell exits at once: its background `yes` is no descendant of this process.
        watch = harness.OtherProcesses()
        subprocess.run(["sh", "-c", "timeout 4 yes > /dev/null 2>&1 &"], check=True)
        time.sleep(2)  # it is still running when the harness looks
        names = [name for name, _ in watch.busiest(count=20)]
        self.assertIn("yes", names)
        self.assertGreater(watch.cores(), 0.0)

    def test_own_children_do_not_count(self):
        # A busy child of this process belongs to its tree, not to the others.
        child = subprocess.Popen(["yes"], stdout=subprocess.DEVNULL)
        try:
            time.sleep(0.5)
            _, _, others = harness._snapshot()
            self.assertNotIn(child.pid, others)
        finally:
            child.kill()
            child.wait()


class Watch(unittest.TestCase):
    def run_watch(self, roots, busy_seconds):
        """Runs `harness.py watch` on each of `roots` at once while this process keeps a core
        busy; returns each watcher's line."""
        with tempfile.TemporaryDirectory() as scratch:
            stop = os.path.join(scratch, "stop")
            watchers = [subprocess.Popen([sys.executable, harness.__file__, "watch", "--root",
                                          str(root), "--stop", stop, "--interval", "0.5"],
                                         stdout=subprocess.PIPE, text=True) for root in roots]
            end = time.monotonic() + busy_seconds
            while time.monotonic() < end:
                pass
            open(stop, "w").close()
            outs = [watcher.communicate(timeout=30)[0] for watcher in watchers]
        for watcher in watchers:
            self.assertEqual(watcher.returncode, 0)
        return outs

    def cores(self, line):
        prefix = "during the run other processes used "
        self.assertTrue(line.startswith(prefix), line)
        return float(line[len(prefix):].split()[0])

    def test_a_busy_process_outside_the_watched_tree_is_counted(self):
        # The watched tree is a sleeping child's: this process, busy, is outside it.
        sleeper = subprocess.Popen(["sleep", "60"])
        try:
            (line,) = self.run_watch([sleeper.pid], busy_seconds=2.0)
        finally:
            sleeper.kill()
            sleeper.wait()
        self.assertGreater(self.cores(line), 0.3)
        self.assertRegex(line, r"at most \d+\.\d\d over 0.5 s")

    def test_the_watched_tree_itself_does_not_count(self):
        # Watching this process's tree: its own busy loop (and the watchers, its children) are not
        # others. What else the machine runs meanwhile is, in both watchers alike: a second one,
        # watching a sleeper's tree at the same time, counts the loop besides.
        sleeper = subprocess.Popen(["sleep", "60"])
        try:
            own, outside = self.run_watch([os.getpid(), sleeper.pid], busy_seconds=2.0)
        finally:
            sleeper.kill()
            sleeper.wait()
        self.assertLess(self.cores(own), self.cores(outside) - 0.3)

    def test_it_ends_with_its_root(self):
        # No stop file ever comes: the watcher stops once the process it watches has ended.
        sleeper = subprocess.Popen(["sleep", "0.3"])
        with tempfile.TemporaryDirectory() as scratch:
            watcher = subprocess.Popen([sys.executable, harness.__file__, "watch", "--root",
                                        str(sleeper.pid), "--stop", os.path.join(scratch, "never"),
                                        "--interval", "0.2"], stdout=subprocess.PIPE, text=True)
            sleeper.wait()  # reaped: its /proc entry goes
            out, _ = watcher.communicate(timeout=30)
        self.assertEqual(watcher.returncode, 0)
        self.assertIn("other processes used", out)


class Raw(unittest.TestCase):
    def test_json_lines_append_or_start_over(self):
        path = os.path.join(tempfile.mkdtemp(), "results", "x.raw.jsonl")
        with harness.RawLog(path) as raw:
            raw.write(kind="run", run="r1")
            raw.write(kind="step", side="tessel", ms=1.5)
        with harness.RawLog(path, append=True) as raw:
            raw.write(kind="step", side="pytorch", ms=2.0)
        with open(path) as handle:
            records = [json.loads(line) for line in handle]
        self.assertEqual([r["kind"] for r in records], ["run", "step", "step"])
        with harness.RawLog(path) as raw:
            raw.write(kind="run", run="r2")
        with open(path) as handle:
            self.assertEqual(len(handle.readlines()), 1)


if __name__ == "__main__":
    unittest.main(verbosity=2)
