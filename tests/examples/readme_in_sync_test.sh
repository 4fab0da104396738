#!/usr/bin/env bash
# README.md shows tests/examples/readme_example.cc verbatim: fail when the two drift apart.
set -euo pipefail
readme="$1"
example="$2"
# The first ```cpp block of the README.
shown=$(awk '/^```cpp$/{inside=1; next} /^```$/{if (inside) exit} inside' "$readme")
if [ "$shown" != "$(cat "$example")" ]; then
  echo "README.md's C++ example differs from $example; paste the file into the README" >&2
  diff <(echo "$shown") "$example" >&2 || true
  exit 1
fi
echo "README example in sync"
