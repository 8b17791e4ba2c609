"""`import riftco` for the Python-package tests. scripts/test.sh installs the
package into .venv and sets RIFTCO_REQUIRE_PYTHON=1: a missing or broken
package is then an error. Elsewhere (plain /usr/bin/python3) the tests skip."""
import importlib
import os

import pytest


def import_riftco():
    if os.environ.get("RIFTCO_REQUIRE_PYTHON"):
        return importlib.import_module("riftco")
    return pytest.importorskip("riftco", reason="the riftco package is not installed (bash scripts/test.sh installs it)")
