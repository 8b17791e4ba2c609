"""rt-train --gradient-accumulation-steps / --decay-embeddings and rt-generate
--top-p / --repetition-penalty / --stop / --num-samples, end to end."""
import json
import pathlib
import subprocess

import pytest

TINY = ["--context-length", "64", "--model-width", "16", "--heads", "2", "--layers", "2",
        "--feed-forward-width", "32", "--sequence-length", "32", "--eval-batches", "1", "--quiet"]


def run(tool, *args):
    return subprocess.run([str(tool), *map(str, args)], capture_output=True, timeout=300)


@pytest.fixture(scope="module")
def tools(build_dir):
    train, generate = build_dir / "rt-train", build_dir / "rt-generate"
    if not train.exists() or not generate.exists():
        pytest.skip("rt-train / rt-generate not built")
    return train, generate


@pytest.fixture(scope="module")
def accumulated(tools, tmp_path_factory):
    out = tmp_path_factory.mktemp("accumulate")
    corpus = out / "text.txt"
    corpus.write_text("a small corpus for a small model.\n" * 200)
    r = run(tools[0], "pretrain", "--data", corpus, "--steps", 3, "--batch", 2, "--gradient-accumulation-steps", 3,
            "--decay-embeddings", "false", "--output", out / "run", *TINY)
    assert r.returncode == 0, r.stderr
    return out / "run"


def test_accumulation_and_groups_are_recorded_and_replayed(tools, accumulated, tmp_path):
    meta = json.loads((accumulated / "metadata.json").read_text())
    assert meta["config"]["gradient_accumulation_steps"] == 3
    assert meta["config"]["batch"] == 2
    assert meta["config"]["decay_embeddings"] is False
    assert meta["facts"]["effective_batch"] == 6
    no_decay = meta["facts"]["parameter_groups"][1]
    assert no_decay["name"] == "no_decay" and no_decay["weight_decay"] == 0
    assert "token_embedding.weight" in no_decay["parameter_names"]
    assert "final_norm.weight" in no_decay["parameter_names"]
    r = run(tools[0], "pretrain", "--config", accumulated / "metadata.json", "--output", tmp_path / "again", "--quiet")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "again" / "model.safetensors").read_bytes() == \
        (accumulated / "model.safetensors").read_bytes()


def test_generate_prints_separated_samples_and_cuts_at_stop_strings(tools, accumulated):
    model = accumulated / "model.safetensors"
    common = ["--model", model, "--prompt", "a ", "--max-new-tokens", 12, "--temperature", 0]
    plain = run(tools[1], *common)
    assert plain.returncode == 0, plain.stderr
    continuation = plain.stdout[len(b"a "):-1]  # greedy, 12 bytes, then a newline
    # Two adjacent ASCII bytes (two tokens) of the printed text (invalid UTF-8 prints as U+FFFD,
    # which holds no ASCII byte, so ASCII positions match the raw bytes).
    pairs = [i for i in range(len(continuation) - 1)
             if 0 < continuation[i] < 128 and 0 < continuation[i + 1] < 128]
    assert pairs, continuation  # deterministic: this tiny model's greedy text has one
    stop = continuation[pairs[0]:pairs[0] + 2]
    cut = subprocess.run([str(tools[1]), *map(str, common), "--stop", stop, "--stop", "\x01"], capture_output=True,
                         timeout=300)
    assert cut.returncode == 0, cut.stderr
    assert cut.stdout == b"a " + continuation[:pairs[0]] + b"\n"
    samples = run(tools[1], "--model", model, "--prompt", "a ", "--max-new-tokens", 8, "--num-samples", 3,
                  "--top-p", 0.9, "--repetition-penalty", 1.3, "--seed", 4)
    assert samples.returncode == 0, samples.stderr
    assert samples.stdout.count(b"=== sample ") == 3
    assert b"=== sample 3/3 ===" in samples.stdout
    again = run(tools[1], "--model", model, "--prompt", "a ", "--max-new-tokens", 8, "--num-samples", 3,
                "--top-p", 0.9, "--repetition-penalty", 1.3, "--seed", 4)
    assert again.stdout == samples.stdout


@pytest.mark.parametrize("args, needle", [
    (["--top-p", "0"], b"'--top-p' must be in (0, 1]"),
    (["--top-p", "1.5"], b"'--top-p' must be in (0, 1]"),
    (["--top-p", "nan"], b"--top-p"),
    (["--repetition-penalty", "0"], b"'--repetition-penalty' must be > 0"),
    (["--repetition-penalty", "-1"], b"'--repetition-penalty' must be > 0"),
    (["--stop", ""], b"'--stop' must not be empty"),
    (["--num-samples", "0"], b"--num-samples: expects an integer >= 1"),
])
def test_generate_bad_sampling_options_exit_2(tools, accumulated, args, needle):
    r = run(tools[1], "--model", accumulated / "model.safetensors", *args)
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr


@pytest.mark.parametrize("args, needle", [
    (["--gradient-accumulation-steps", "0"], b"--gradient-accumulation-steps: expects an integer >= 1"),
    (["--gradient-accumulation-steps", "many"], b"--gradient-accumulation-steps"),
    (["--decay-embeddings", "maybe"], b"--decay-embeddings"),
])
def test_train_bad_options_exit_2(tools, args, needle, tmp_path):
    r = run(tools[0], "pretrain", *args, "--output", tmp_path / "never")
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr
    assert not (tmp_path / "never").exists()

