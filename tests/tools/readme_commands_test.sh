#!/usr/bin/env bash
# Every command README.md shows, run as written with training cut to two steps (the rules are in
# readme_commands.py). Usage: readme_commands_test.sh README TRAIN PLAN
set -euo pipefail
exec /usr/bin/python3 "$(dirname "$0")/readme_commands.py" "$@"
