"""docs/c-abi.md names every function rt.h declares (its function index):
an appended function is documented where a C user looks for it."""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_every_c_function_is_named_in_the_c_abi_docs():
    header = (ROOT / "include" / "riftco_transformer" / "rt.h").read_text()
    declared = re.findall(r"^RT_API\s+[\w\s\*]+?\b(rt_\w+)\s*\(", header, flags=re.M)
    assert len(declared) > 50, "the header's declarations were not found"
    docs = (ROOT / "docs" / "c-abi.md").read_text()
    missing = [name for name in declared if f"`{name}`" not in docs]
    assert not missing, f"docs/c-abi.md does not name: {missing}"


def test_the_c_headers_are_ascii():
    # A non-ASCII byte in a public header warns (or fails) under some
    # compilers' code pages (MSVC's C4819); rt.h had two arrows.
    for name in ("rt.h", "rt.hpp"):
        text = (ROOT / "include" / "riftco_transformer" / name).read_bytes()
        bad = [i for i, b in enumerate(text) if b > 127]
        assert not bad, f"{name}: non-ASCII bytes at offsets {bad[:5]}"
