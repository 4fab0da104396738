#!/usr/bin/env bash
# run_main in a real process: the exit code, the one-line message on stderr, and stdout's
# buffered lines written before that message even when both go to one file.
# Usage: run_main_exit_test.sh TOOL
set -uo pipefail
tool="$1"
out="${TEST_TMPDIR:-/tmp}/run_main_output.txt"
failures=0

check() {  # check NAME EXPECTED_STATUS EXPECTED_OUTPUT ARGS...
  local name="$1" expected_status="$2" expected="$3"
  shift 3
  "$tool" "$@" > "$out" 2>&1  # a file: stdout is fully buffered
  local status=$?
  if [ "$status" -ne "$expected_status" ]; then
    echo "FAIL ($name): exit status $status, expected $expected_status" >&2
    failures=$((failures + 1))
  fi
  if [ "$(cat "$out")" != "$expected" ]; then
    echo "FAIL ($name): the output was:" >&2
    cat "$out" >&2
    echo "expected:" >&2
    echo "$expected" >&2
    failures=$((failures + 1))
  else
    echo "$name: ok"
  fi
}

name=$(basename "$tool")
check error 1 "step 1 done
step 2 done
$name: error: step 3 failed: error" error
check oom 1 "step 1 done
step 2 done
$name: out of memory: no room for step 3" oom
check exit 7 "step 1 done
step 2 done" exit=7
check success 0 "step 1 done
step 2 done" exit=0
exit "$failures"
