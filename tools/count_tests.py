#!/usr/bin/python3
"""Counts the test cases of one `bazel test` run from its build event file.

Usage: tools/count_tests.py BEP_JSON_FILE
Prints one line, `N passed, N failed` (`, N skipped` when nonzero); exits 1 if any failed.

Only tests of that invocation are counted (cached ones included), which a scan of
bazel-testlogs/ cannot tell apart from stale results. Each test's final attempt counts:
one per <testcase> in its test.xml (GoogleTest writes one per TEST; Bazel writes a single one
for tests without their own XML, e.g. sh_test). A target that failed although its XML shows
no failure (a crash after the results were written, a failure on an MPI rank other than 0,
a timeout) adds one failure; a test target that did not build or run adds one failure.
"""
import json
import sys
import urllib.parse
import xml.etree.ElementTree as ET

GOOD = ("PASSED", "FLAKY")


def count_xml(path):
    passed = failed = skipped = 0
    root = ET.parse(path).getroot()
    for case in root.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
        elif (case.get("result") == "skipped" or case.get("status") == "notrun"
              or case.find("skipped") is not None):
            skipped += 1
        else:
            passed += 1
    return passed, failed, skipped


def main():
    final = {}  # (label, run, shard) -> (attempt, status, xml path)
    tests = set()  # every test target this invocation was asked to run
    with open(sys.argv[1]) as events:
        for line in events:
            event = json.loads(line)
            eid = event.get("id", {})
            if "testResult" in eid:
                key = eid["testResult"]
                result = event.get("testResult", {})
                xml = None
                for out in result.get("testActionOutput", []):
                    if out.get("name") == "test.xml":
                        xml = urllib.parse.unquote(urllib.parse.urlparse(out["uri"]).path)
                slot = (key["label"], key.get("run", 1), key.get("shard", 1))
                attempt = key.get("attempt", 1)
                if slot not in final or final[slot][0] < attempt:
                    final[slot] = (attempt, result.get("status", "NO_STATUS"), xml)
            elif "targetConfigured" in eid:
                # Tests filtered out (e.g. by tag) are not configured, so are not listed here.
                if "testSize" in event.get("configured", {}):
                    tests.add(eid["targetConfigured"]["label"])

    passed = failed = skipped = 0
    for (label, _, _), (_, status, xml) in sorted(final.items()):
        p = f = s = 0
        if xml:
            try:
                p, f, s = count_xml(xml)
            except (OSError, ET.ParseError) as err:
                print(f"count_tests: cannot read {xml}: {err}", file=sys.stderr)
        if status not in GOOD and f == 0:
            f = 1
        if status in GOOD and p + f + s == 0:
            p = 1
        passed, failed, skipped = passed + p, failed + f, skipped + s

    ran = {label for (label, _, _) in final}
    for label in sorted(tests - ran):
        print(f"count_tests: {label} did not run (build failed?)", file=sys.stderr)
        failed += 1

    line = f"{passed} passed, {failed} failed"
    if skipped:
        line += f", {skipped} skipped"
    print(line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
