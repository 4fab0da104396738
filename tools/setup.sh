#!/usr/bin/env bash
# Installs every Debian package Tessel needs: the build, the tests, the PyTorch reference and
# the data sets. Idempotent: a second run installs nothing and says so.
# Usage: tools/setup.sh            (as root, or with sudo available)
set -euo pipefail

packages=(
  # build
  bazel-bootstrap bazel-rules-java bazel-platforms g++ clang-format
  # --config=clang and the fuzzers: clang 14, LLVM's OpenMP runtime, libFuzzer and sanitizers
  clang libomp-14-dev libclang-rt-14-dev
  # libraries, used through Bazel local repositories
  libeigen3-dev libgtest-dev libgmock-dev libbenchmark-dev libopenmpi-dev openmpi-bin
  nlohmann-json3-dev libcli11-dev zlib1g-dev
  # reference values, benchmarks and plots (never a dependency of the library)
  python3 python3-numpy python3-torch python3-torchvision libopenblas0-pthread python3-matplotlib python3-threadpoolctl
  # real data: Fashion-MNIST (IDX, gzip) and an English text corpus
  dataset-fashion-mnist fortunes
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages already installed"
  exit 0
fi

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "setup: installing ${#missing[@]} package(s): ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: installed ${missing[*]}"
