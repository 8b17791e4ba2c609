#!/usr/bin/env bash
# Installs everything riftco needs to build and test on a fresh Debian 12
# machine (run as root, or with sudo available). Safe to run again: it only
# calls apt-get when a package is missing.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libopenblas-dev            # BLAS (sgemm) for every matmul
  libopenblas0-openmp        # the OpenMP OpenBLAS both sides of bench/run_benchmarks.py load
  nlohmann-json3-dev         # JSON: model-state headers, metadata
  libsentencepiece-dev       # subword tokenizers (SentencePiece BPE / unigram): rt-train tokenizer
  libcli11-dev               # command-line parsing of the rt-* tools (tools/cli.hpp)
  libgtest-dev               # C++ tests
  libbenchmark-dev           # kernel micro-benchmarks
  python3 python3-numpy python3-pytest  # independent file readers, Python tests
  python3-venv python3-dev  # the riftco package: .venv (scripts/python_env.sh), extension headers
  python3-torch              # PyTorch parity tests and the reference benchmark
  python3-matplotlib         # the benchmark suite's chart (bench/run_benchmarks.py)
  fortunes                   # the default training corpus (/usr/share/games/fortunes)
  clang libclang-rt-dev libomp-dev  # libFuzzer harnesses in fuzz/ (clang's fuzzer and OpenMP runtimes)
  openmpi-bin libopenmpi-dev # data parallelism: the MPI communicator (docs/distributed.md; optional at build time)
  iproute2                   # ip netns: the two-"hosts" MPI test over TCP (tests/mpi/two_hosts_netns.sh)
)

missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "[setup] installing: ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "[setup] all build and test dependencies present"
