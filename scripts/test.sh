#!/usr/bin/env bash
# Sets up a fresh machine and runs every test: the C++ suite (GoogleTest via
# CTest) in a release build and again under AddressSanitizer + UBSan.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh

jobs=$(nproc)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

echo "== release build =="
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$jobs"
ctest --test-dir build --output-on-failure -j "$jobs"

echo "== Python tests (pytest, Debian's /usr/bin/python3 with numpy and torch) =="
RIFTCO_BUILD_DIR="$PWD/build" /usr/bin/python3 -m pytest tests/python -q

echo "== sanitizer build (ASan + UBSan) =="
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DRIFTCO_SANITIZE=ON >/dev/null
cmake --build build-asan -j "$jobs"
# LeakSanitizer is on: a leak around backward or checkpoint fails the suite.
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan --output-on-failure -j "$jobs"
