"""riftco's safetensors files, checked by code that is not riftco's.

An independent reader and writer (struct + json + numpy only) exchange files
with the C++ library through the gtest binary: the SafetensorsInterop tests in
tests/cpp/test_safetensors.cpp write to $RIFTCO_SAFETENSORS_OUT and read
$RIFTCO_SAFETENSORS_IN when those are set.

Run: /usr/bin/python3 -m pytest tests/python   (after building into build/,
or set RIFTCO_BUILD_DIR to another build tree).
"""

import json
import os
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD_DIR = Path(os.environ.get("RIFTCO_BUILD_DIR", REPO / "build"))
TEST_BINARY = BUILD_DIR / "tests" / "riftco_tests"

pytestmark = pytest.mark.skipif(
    not TEST_BINARY.is_file(),
    reason=f"{TEST_BINARY} is not built (cmake --build build, or set RIFTCO_BUILD_DIR)",
)


# ---- independent reader and writer -------------------------------------------------


def _no_duplicate_keys(pairs):
    keys = [key for key, _ in pairs]
    assert len(keys) == len(set(keys)), f"duplicate keys in header: {keys}"
    return dict(pairs)


def read_safetensors(path):
    """Returns ([(name, float32 array)] in data order, metadata, header length)."""
    data = Path(path).read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length].decode("utf-8"), object_pairs_hook=_no_duplicate_keys)
    metadata = header.pop("__metadata__", {})
    body = data[8 + length :]
    entries = sorted(header.items(), key=lambda item: tuple(item[1]["data_offsets"]))
    tensors, cursor = [], 0
    for name, info in entries:
        assert info["dtype"] == "F32", name
        begin, end = info["data_offsets"]
        assert begin == cursor, f"{name}: data section not tiled ({begin} != {cursor})"
        shape = tuple(info["shape"])
        assert end - begin == 4 * int(np.prod(shape, dtype=np.int64)), name
        tensors.append((name, np.frombuffer(body[begin:end], dtype="<f4").reshape(shape)))
        cursor = end
    assert cursor == len(body), "trailing bytes after the tensors"
    return tensors, metadata, length


def write_safetensors(path, tensors, metadata, header_order=None):
    """Writes tensors in the given data order; the header lists them in `header_order`
    (names) and is not padded, as other writers are free to do."""
    entries, chunks, offset = {}, [], 0
    for name, array in tensors:
        raw = np.ascontiguousarray(array, dtype="<f4").tobytes()
        entries[name] = {"dtype": "F32", "shape": list(array.shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    header = {"__metadata__": metadata} if metadata else {}
    for name in header_order or list(entries):
        header[name] = entries[name]
    encoded = json.dumps(header, ensure_ascii=False).encode("utf-8")
    Path(path).write_bytes(struct.pack("<Q", len(encoded)) + encoded + b"".join(chunks))


def bits(array):
    return np.ascontiguousarray(array, dtype="<f4").view("<u4")


# ---- the C++ side -------------------------------------------------------------------


def run_gtest(test, **env_paths):
    env = dict(os.environ, OMP_NUM_THREADS="2", **{key: str(value) for key, value in env_paths.items()})
    return subprocess.run(
        [str(TEST_BINARY), f"--gtest_filter=SafetensorsInterop.{test}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def expected_tensors():
    """Same values as interop_tensors() in tests/cpp/test_safetensors.cpp."""
    f32 = np.float32
    norm = np.array([1.0, -0.0, 0.0, np.finfo(f32).max], dtype=f32)
    norm[2] = np.array([0x00000001], dtype="<u4").view(f32)[0]  # smallest denormal
    special = np.array([np.inf, -np.inf, 0.0, f32(1) / f32(3), -2.5], dtype=f32)
    special[2] = np.array([0x7FC00000], dtype="<u4").view(f32)[0]  # quiet NaN
    return [
        ("embedding.weight", ((np.arange(12, dtype=f32) - 5) * f32(0.25)).reshape(3, 4)),
        ("blocks.0.norm", norm),
        ("special", special),
        ("scalar", np.array(42.5, dtype=f32)),
        ("empty", np.zeros((0, 3), dtype=f32)),
        ("cube", (np.arange(12, dtype=f32) * f32(1.5) - f32(7)).reshape(2, 3, 2)),
    ]


def test_reads_a_file_written_by_riftco(tmp_path):
    out = tmp_path / "from_cpp.safetensors"
    result = run_gtest("WritesFileForIndependentReader", RIFTCO_SAFETENSORS_OUT=out)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[  SKIPPED ]" not in result.stdout

    tensors, metadata, header_length = read_safetensors(out)
    expected = expected_tensors()
    assert [name for name, _ in tensors] == [name for name, _ in expected]
    for (name, actual), (_, wanted) in zip(tensors, expected):
        assert actual.shape == wanted.shape, name
        np.testing.assert_array_equal(bits(actual), bits(wanted), err_msg=name)
    assert metadata == {"format": "riftco.test", "note": "héllo ✓"}

    raw = out.read_bytes()
    assert header_length % 8 == 0
    header_text = raw[8 : 8 + header_length].decode("utf-8")
    assert header_text.startswith("{") and header_text.rstrip(" ").endswith("}")
    # Header order is data order in our files.
    names = [name for name in json.loads(header_text) if name != "__metadata__"]
    assert names == [name for name, _ in expected]


def test_riftco_reads_and_rewrites_a_file_from_another_writer(tmp_path):
    rng = np.random.default_rng(0)
    source = [
        ("w", rng.standard_normal((4, 5)).astype(np.float32)),
        ("scalar", np.array(-3.25, dtype=np.float32)),
        ("nothing", np.zeros((0,), dtype=np.float32)),
        ("v", rng.standard_normal((7,)).astype(np.float32)),
        ("t", rng.standard_normal((2, 1, 3)).astype(np.float32)),
    ]
    metadata = {"writer": "numpy", "ünïcode": "✓ ok"}
    src, out = tmp_path / "from_python.safetensors", tmp_path / "rewritten.safetensors"
    write_safetensors(src, source, metadata, header_order=["t", "v", "scalar", "w", "nothing"])

    result = run_gtest("RewritesFileFromIndependentWriter", RIFTCO_SAFETENSORS_IN=src, RIFTCO_SAFETENSORS_OUT=out)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[  SKIPPED ]" not in result.stdout

    tensors, rewritten_metadata, _ = read_safetensors(out)
    assert rewritten_metadata == metadata
    assert [name for name, _ in tensors] == [name for name, _ in source]  # data order survives
    for (name, actual), (_, wanted) in zip(tensors, source):
        assert actual.shape == wanted.shape, name
        np.testing.assert_array_equal(bits(actual), bits(wanted), err_msg=name)


def test_riftco_refuses_a_file_with_overlapping_tensors(tmp_path):
    src, out = tmp_path / "bad.safetensors", tmp_path / "never.safetensors"
    header = json.dumps(
        {
            "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
            "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
        }
    ).encode()
    src.write_bytes(struct.pack("<Q", len(header)) + header + bytes(12))
    result = run_gtest("RewritesFileFromIndependentWriter", RIFTCO_SAFETENSORS_IN=src, RIFTCO_SAFETENSORS_OUT=out)
    assert result.returncode != 0
    assert f"[load] {src}: tensor 'b' at [4, 12) overlaps tensor 'a' at [0, 8)" in result.stdout + result.stderr
    assert not out.exists()


def test_reference_safetensors_library_agrees(tmp_path):
    numpy_loader = pytest.importorskip("safetensors.numpy", reason="the safetensors package is not installed")
    out = tmp_path / "from_cpp.safetensors"
    result = run_gtest("WritesFileForIndependentReader", RIFTCO_SAFETENSORS_OUT=out)
    assert result.returncode == 0, result.stdout + result.stderr
    loaded = numpy_loader.load_file(str(out))
    expected = dict(expected_tensors())
    assert set(loaded) == set(expected)
    for name, wanted in expected.items():
        np.testing.assert_array_equal(bits(loaded[name]), bits(wanted), err_msg=name)
