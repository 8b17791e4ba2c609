#!/usr/bin/env bash
# Creates (once) and prints the path of the project's Python virtual
# environment, .venv at the repository root (git ignores it). Debian's python3
# refuses system-wide pip installs, so everything pip brings lives here, and
# only from PyPI: the build backend (scikit-build-core, nanobind) and the
# extras the examples use, and transformers for the Hugging Face parity tests. The environment sees Debian's site packages
# (python3-numpy, python3-pytest, python3-torch, python3-matplotlib from
# scripts/setup.sh), so PyTorch is never pip-installed for a test. Run again
# it only checks; delete .venv to start over.
#   usage: bash scripts/python_env.sh   → prints the interpreter to use
set -euo pipefail
cd "$(dirname "$0")/.."
venv="$PWD/.venv"
stamp="$venv/.riftco-env-2"
# transformers: the Hugging Face Llama parity tests (tests/python/test_hf_llama.py);
# 4.44.2 works with Debian's torch 1.13.
requirements=("scikit-build-core>=0.10" "nanobind>=2.4" "tqdm")
optional=("transformers==4.44.2")  # without it (no network, no wheel) those tests skip and say why
if [ ! -f "$stamp" ]; then
  echo "[python_env] creating $venv" >&2
  /usr/bin/python3 -m venv --system-site-packages "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "${requirements[@]}" >&2
  if ! "$venv/bin/python" -m pip install -q --disable-pip-version-check "${optional[@]}" >&2; then
    echo "[python_env] could not install ${optional[*]}: the Hugging Face parity tests will skip" >&2
  fi
  touch "$stamp"
fi
echo "$venv/bin/python"
