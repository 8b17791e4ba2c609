import os
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))


@pytest.fixture(scope="session")
def build_dir():
    path = pathlib.Path(os.environ.get("RIFTCO_BUILD_DIR", ROOT / "build"))
    if not path.is_dir():
        pytest.skip(f"build directory {path} not found: build first (cmake -S . -B build)")
    return path
