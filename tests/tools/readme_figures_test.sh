#!/usr/bin/env bash
# tools/check_readme_figures.py: README.md quotes only figures found in the results files it
# cites, and the checker catches a figure that is not there, a date that is not there and a
# figure that cites nothing.
# Usage: readme_figures_test.sh CHECKER README.md
set -euo pipefail
checker=$1
readme=$2
root=$(dirname "$readme")  # bench/results/*.md lie beside it (the test's data)
failures=0

/usr/bin/python3 "$checker" "$readme" --root "$root" || { echo "FAIL: README.md quotes figures its results do not hold"; failures=$((failures + 1)); }

work="${TEST_TMPDIR:-/tmp}/readme_figures"
mkdir -p "$work/bench/results"
cat >"$work/bench/results/speed.md" <<'MD'
Made on 2026-12-02.
| case | ratio |
| resnet | 0.86 |
MD
expect_failure() {
  local name=$1 text=$2 fragment=$3
  printf '%s\n' "$text" >"$work/README.md"
  local out
  if out=$(/usr/bin/python3 "$checker" "$work/README.md" 2>&1); then
    echo "FAIL ($name): the checker passed"
    failures=$((failures + 1))
  elif ! grep -qF -- "$fragment" <<<"$out"; then
    echo "FAIL ($name): the output does not say '$fragment': $out"
    failures=$((failures + 1))
  fi
}
printf '%s\n' "Speed 0.86x PyTorch's time (bench/results/speed.md, 2026-12-02)." >"$work/README.md"
/usr/bin/python3 "$checker" "$work/README.md" >/dev/null || { echo "FAIL: a correct figure was refused"; failures=$((failures + 1)); }
expect_failure wrong_figure "Speed 0.80x PyTorch's time (bench/results/speed.md)." "0.80x"
expect_failure wrong_date "Speed 0.86x (bench/results/speed.md, 2026-11-30)." "2026-11-30"
expect_failure uncited "Speed 0.86x PyTorch's time, measured once." "cites no results file"
expect_failure missing_file "Speed 0.86x (bench/results/gone.md)." "does not exist"

[ "$failures" -eq 0 ] && echo "readme_figures_test: all checks passed"
exit "$failures"
