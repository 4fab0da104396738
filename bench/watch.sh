# shellcheck shell=bash
# Sourced by the shell benchmarks: records what else runs on the machine while they measure
# (bench/harness.py watch over the tree of the sourcing script).
#   watch_start DIR   # before the runs; DIR: a scratch directory of the script's own
#   watch_stop DIR    # after them: sets watch_line, one line for the results

watch_start() {
  /usr/bin/python3 bench/harness.py watch --root $$ --stop "$1/stop" >"$1/watch" &
  watch_pid=$!
}

# Not inside $(...): the watcher is this shell's child, not a subshell's.
# shellcheck disable=SC2034  # watch_line is read by the sourcing script
watch_stop() {
  touch "$1/stop"
  if wait "$watch_pid" && [ -s "$1/watch" ]; then
    watch_line=$(cat "$1/watch")
  else
    watch_line="what else ran during the run was not recorded (the watcher failed)"
  fi
}
