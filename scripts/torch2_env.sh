#!/usr/bin/env bash
# Creates (once) and prints the interpreter of .venv-torch2/ (git ignores it):
# PyTorch 2.x from PyPI for the benchmarks only: the PyTorch 2 columns (eager
# and torch.compile) of bench/run_benchmarks.py, which calls this script in a
# full run, and bench/run_sac_benchmark.py. The test command never needs it:
# the tests compare against Debian's python3-torch 1.13
# (scripts/python_env.sh), and `run_benchmarks.py --quick` (ctest
# bench_suite_quick) skips the PyTorch 2 columns when .venv-torch2 is absent.
#
# Lean on purpose: torch's wheel with --no-deps plus its pure-Python
# dependencies and numpy (bench/torch_reference.py imports it), not the
# several GB of nvidia-* CUDA wheels, which a CPU-only machine does not need
# for `import torch`. If that import fails anyway, the full dependency set is
# installed. Run again it only checks the stamp; delete .venv-torch2 to start
# over (or set TORCH2_VERSION to another pin, which makes a new stamp).
#   usage: bash scripts/torch2_env.sh   → prints the interpreter to use
set -euo pipefail
cd "$(dirname "$0")/.."
version="${TORCH2_VERSION:-2.15.0}"
venv="$PWD/.venv-torch2"
stamp="$venv/.riftco-torch-$version"
pure=(filelock typing-extensions sympy networkx jinja2 fsspec mpmath MarkupSafe numpy)
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
if [ ! -f "$stamp" ]; then
  echo "[torch2_env] creating $venv with torch==$version (PyPI)" >&2
  /usr/bin/python3 -m venv "$venv"
  "${pip[@]}" --no-deps "torch==$version" >&2
  "${pip[@]}" "${pure[@]}" >&2
  if ! "$venv/bin/python" -c "import torch, torch.utils.checkpoint" >&2; then
    echo "[torch2_env] import torch failed without the CUDA wheels: installing torch's full dependency set" >&2
    "${pip[@]}" "torch==$version" >&2
    "$venv/bin/python" -c "import torch"
  fi
  rm -f "$venv"/.riftco-torch-*
  "$venv/bin/python" -c "import torch; print(torch.__version__)" > "$stamp"
fi
echo "$venv/bin/python"
