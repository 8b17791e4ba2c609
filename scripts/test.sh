#!/usr/bin/env bash
# Sets up a fresh machine and runs every test: the C++ suite (GoogleTest via
# CTest, with the C ABI's C11 test program) in a release build, the
# installed-package consumers (C and C++, find_package and pkg-config), the
# Python package (a wheel installed into .venv) and the Python tests (with the
# kill -9 crash-safety trials), the installed-wheel test, the C++ suite again
# under AddressSanitizer + UBSan, and a bounded
# run of every libFuzzer harness (RIFTCO_FUZZ_SECONDS each, default 60), and,
# where nvcc is found, a compile check of the CUDA backend and the NCCL
# communicator (build-cuda: the library and the GPU test binaries, whose tests
# skip without a device).
# Every other build is CPU-only (-DRIFTCO_CUDA=OFF), as before the CUDA backend.
# The release build picks up MPI (RIFTCO_MPI=AUTO: Open MPI from setup.sh) and
# runs the communicator tests under mpirun; the Python wheel is built without
# MPI (-DRIFTCO_MPI=OFF) so it does not depend on the machine's libmpi.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh

jobs=$(nproc)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

echo "== release build =="
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DRIFTCO_CUDA=OFF >/dev/null
cmake --build build -j "$jobs"
ctest --test-dir build --output-on-failure -j "$jobs"

echo "== installed package: cmake --install, then out-of-tree C (find_package, pkg-config) and C++ consumers =="
bash tests/install/run.sh build

echo "== Python package (riftco wheel: scikit-build-core + nanobind, installed into .venv) =="
python=$(bash scripts/python_env.sh)  # one cached virtual environment (Debian's site packages visible)
rm -rf dist
CMAKE_BUILD_PARALLEL_LEVEL="$jobs" "$python" -m pip wheel . --no-deps --no-build-isolation -q -w dist \
  --config-settings=build-dir="build-python/{wheel_tag}" --config-settings=cmake.define.RIFTCO_CUDA=OFF \
  --config-settings=cmake.define.RIFTCO_MPI=OFF
"$python" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps dist/riftco-*.whl

echo "== Python tests (pytest in .venv: riftco, and Debian's numpy, torch and matplotlib) =="
RIFTCO_REQUIRE_PYTHON=1 RIFTCO_BUILD_DIR="$PWD/build" "$python" -m pytest tests/python -q

echo "== installed-wheel test (a fresh virtual environment, outside the source tree) =="
RIFTCO_WHEEL="$(ls "$PWD"/dist/riftco-*.whl)" "$python" -m pytest tests/install -q

echo "== sanitizer build (ASan + UBSan) =="
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DRIFTCO_SANITIZE=ON -DRIFTCO_CUDA=OFF >/dev/null
cmake --build build-asan -j "$jobs"
# LeakSanitizer is on: a leak around backward or checkpoint fails the suite.
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan --output-on-failure -j "$jobs"

echo "== fuzzers (libFuzzer + ASan + UBSan, ${RIFTCO_FUZZ_SECONDS:-60} s each) =="
CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRIFTCO_FUZZ=ON -DRIFTCO_CUDA=OFF >/dev/null
cmake --build build-fuzz -j "$jobs"
bash fuzz/run.sh build-fuzz build "${RIFTCO_FUZZ_SECONDS:-60}"

nvcc=$(command -v nvcc || { [ -x /usr/local/cuda/bin/nvcc ] && echo /usr/local/cuda/bin/nvcc; } || true)
if [ -n "$nvcc" ]; then
  echo "== CUDA backend + NCCL communicator compile check ($nvcc; docs/cuda.md, docs/distributed.md): library, CUDA and NCCL tests, run (GPU tests skip without a GPU) =="
  # RIFTCO_NCCL=AUTO: the NCCL communicator where nccl.h and libnccl are found (CUDA's own folders here).
  cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DRIFTCO_CUDA=ON -DCMAKE_CUDA_COMPILER="$nvcc" >/dev/null
  nccl_targets=$(grep -Eq '^NCCL_LIBRARY:FILEPATH=/' build-cuda/CMakeCache.txt && echo test_nccl_communicator test_nccl_data_parallel test_nccl_pipelines || true)
  cmake --build build-cuda -j "$jobs" --target riftco_transformer rt-train test_cuda_kernels test_cuda_model test_cuda_pipelines test_nccl_bootstrap $nccl_targets
  build-cuda/tests/test_cuda_kernels --gtest_brief=1
  build-cuda/tests/test_cuda_model --gtest_brief=1
  build-cuda/tests/test_cuda_pipelines --gtest_brief=1
  build-cuda/tests/test_nccl_bootstrap --gtest_brief=1
  if [ -n "$nccl_targets" ]; then
    for nccl_test in $nccl_targets; do
      RIFTCO_TEST_NCCL_RANKS=1 build-cuda/tests/$nccl_test --gtest_brief=1  # N = 1 NCCL world: skips, "needs 1 GPU", without one
      if command -v mpirun >/dev/null; then    # NCCL over MPI: skips, "needs 2 GPUs", with fewer
        RIFTCO_TEST_NCCL_RANKS=2 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
          OMPI_MCA_btl_vader_single_copy_mechanism=none mpirun -np 2 --oversubscribe build-cuda/tests/$nccl_test --gtest_brief=1
      fi
    done
  fi
else
  echo "== CUDA backend compile check: skipped (no nvcc) =="
fi
