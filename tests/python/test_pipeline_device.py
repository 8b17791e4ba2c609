"""The pipelines' device option from Python and rt-train (issue 17): the
configs' `device` field, its checks, metadata.json's record, and 'cuda' on a
build or machine without CUDA refused (riftco.BackendError / exit 1) before
the output directory exists. The CUDA runs themselves are
tests/cuda/test_cuda_pipelines.cpp (they skip without a GPU)."""
import json
import pathlib
import subprocess

import pytest

from riftco_import import import_riftco

riftco = import_riftco()
ROOT = pathlib.Path(__file__).resolve().parents[2]
SHAPE = dict(vocab_size=256, context_length=64, model_width=32, heads=4, layers=2, feed_forward_width=64)
NO_CUDA = "cuda" not in riftco.available_backends()
needs_no_cuda = pytest.mark.skipif(not NO_CUDA, reason="CUDA is available here: 'cuda' is not refused")


def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("".join(f"the quick brown fox {i % 7} jumps over the lazy dog.\n" for i in range(200)))
    return path


def pretraining(tmp_path, name, **kwargs):
    return riftco.PretrainingConfig(model=riftco.TransformerConfig(**SHAPE), data=str(corpus(tmp_path)), steps=2,
                                    batch=2, sequence_length=32, eval_interval=0, eval_batches=1,
                                    checkpoint_interval=0, output_dir=str(tmp_path / name), **kwargs)


@pytest.mark.parametrize("cls", [riftco.PretrainingConfig, riftco.PostTrainingConfig])
def test_default_is_cpu_and_the_field_takes_the_backend_names(cls):
    assert cls().device == "cpu"
    assert "device" in cls.fields
    assert cls(device="cuda").device == "cuda"
    c = cls()
    c.device = "cuda"
    assert c.to_dict()["device"] == "cuda"
    with pytest.raises(ValueError, match=r"\[device\] unknown backend 'gpu' \(expected 'cpu' or 'cuda'\)"):
        cls(device="gpu")
    with pytest.raises(TypeError, match=r"device expects str, got int"):
        cls(device=1)


def test_metadata_records_the_device(tmp_path):
    result = riftco.pretrain(pretraining(tmp_path, "cpu"), plot=False)
    assert result.completed
    assert json.loads((tmp_path / "cpu" / "metadata.json").read_text())["config"]["device"] == "cpu"


@needs_no_cuda
def test_cuda_without_cuda_is_a_backend_error_before_any_file(tmp_path):
    with pytest.raises(riftco.BackendError, match=r"\[pretraining\] device cuda: .*not built in this package"):
        riftco.pretrain(pretraining(tmp_path, "run", device="cuda"), plot=False)
    assert not (tmp_path / "run").exists()
    post = riftco.PostTrainingConfig(base_model=str(tmp_path / "missing.safetensors"), data=str(corpus(tmp_path)),
                                     output_dir=str(tmp_path / "post"), device="cuda")
    with pytest.raises(riftco.BackendError, match=r"\[post_training\] device cuda: "):
        riftco.post_train(post, plot=False)
    assert not (tmp_path / "post").exists()


@pytest.fixture(scope="module")
def rt_train(build_dir):
    tool = build_dir / "rt-train"
    if not tool.exists():
        pytest.skip("rt-train not built")
    return tool


def cli(tool, *args):
    return subprocess.run([str(tool), *map(str, args)], capture_output=True, text=True, timeout=300)


TINY = ["--context-length", "64", "--model-width", "16", "--heads", "2", "--layers", "2", "--feed-forward-width",
        "32", "--batch", "2", "--sequence-length", "32", "--eval-batches", "1", "--steps", "2", "--quiet"]


def test_cli_device_cpu_is_recorded_and_a_bad_name_is_a_usage_error(rt_train, tmp_path):
    r = cli(rt_train, "pretrain", "--data", corpus(tmp_path), "--output", tmp_path / "run", "--device", "cpu", *TINY)
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "run" / "metadata.json").read_text())["config"]["device"] == "cpu"
    r = cli(rt_train, "pretrain", "--output", tmp_path / "bad", "--device", "gpu", *TINY)
    assert r.returncode == 2 and "--device" in r.stderr and "gpu" in r.stderr, r.stderr
    assert not (tmp_path / "bad").exists()


@needs_no_cuda
@pytest.mark.parametrize("command", ["pretrain", "post-train"])
def test_cli_cuda_without_cuda_fails_before_the_output_directory(rt_train, tmp_path, command):
    out = tmp_path / "run"
    extra = ["--base-model", tmp_path / "missing.safetensors", "--data", ROOT / "data" / "chat_example.jsonl"] \
        if command == "post-train" else ["--data", corpus(tmp_path)]
    r = cli(rt_train, command, *extra, "--output", out, "--device", "cuda", "--quiet")
    assert r.returncode == 1, r.stderr
    assert f"rt-train: error: [{command}] device cuda: the cuda backend is not built in this package" in r.stderr
    assert not out.exists()


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("device") / "model.safetensors"
    riftco.DecoderOnlyTransformer(riftco.TransformerConfig(**SHAPE), seed=2).save(str(path))
    return path


@pytest.mark.parametrize("tool", ["rt-generate", "rt-eval"])
def test_generate_and_eval_take_device_as_rt_train_does(build_dir, saved_model, tmp_path, tool):
    exe = build_dir / tool
    if not exe.exists():
        pytest.skip(f"{tool} not built")
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog.\n" * 20)
    work = ["--prompt", "the", "--max-new-tokens", "5"] if tool == "rt-generate" else ["--data", text]
    on_cpu = cli(exe, "--model", saved_model, *work, "--device", "cpu")
    assert on_cpu.returncode == 0, on_cpu.stderr
    assert on_cpu.stdout == cli(exe, "--model", saved_model, *work).stdout  # cpu is the default
    bad = cli(exe, "--model", saved_model, *work, "--device", "gpu")
    assert bad.returncode == 2 and "--device" in bad.stderr and "gpu" in bad.stderr, bad.stderr
    if NO_CUDA:
        r = cli(exe, "--model", saved_model, *work, "--device", "cuda")
        assert r.returncode == 1, r.stderr
        assert f"[{tool}] device cuda: the cuda backend is not built in this package; use --device cpu" in r.stderr \
            or f"[{tool}] device cuda: " in r.stderr and "--device cpu" in r.stderr, r.stderr
