"""rt-train and rt-generate end to end on tiny settings, and their errors:
one clear line, a non-zero exit, no crash, existing outputs untouched."""
import json
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHAT = ROOT / "data" / "chat_example.jsonl"
TINY = ["--context-length", "64", "--model-width", "16", "--heads", "2", "--layers", "2",
        "--feed-forward-width", "32", "--batch", "2", "--sequence-length", "32", "--eval-batches", "1", "--quiet"]


def run(tool, *args):
    return subprocess.run([str(tool), *map(str, args)], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def tools(build_dir):
    train, generate = build_dir / "rt-train", build_dir / "rt-generate"
    if not train.exists() or not generate.exists():
        pytest.skip("rt-train / rt-generate not built")
    return train, generate


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "text.txt"
    path.write_text("a small corpus for a small model.\n" * 200)
    return path


@pytest.fixture(scope="module")
def pretrained(tools, corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("pretrain")
    r = run(tools[0], "pretrain", "--data", corpus, "--steps", 3, "--output", out,
            "--activation-checkpointing", "block", *TINY)
    assert r.returncode == 0, r.stderr
    return out


def test_pretrain_writes_outputs_and_records_the_policy(pretrained):
    meta = json.loads((pretrained / "metadata.json").read_text())
    assert meta["config"]["activation_checkpointing"] == "block"
    for name in ["model.safetensors", "metrics.jsonl", "loss_curve.svg"]:
        assert (pretrained / name).exists(), name
    assert not (pretrained / "loss_curve.png").exists()  # PNGs: python -m riftco.plot (matplotlib)
    assert (pretrained / "loss_curve.svg").read_text().rstrip().endswith("</svg>")


def test_activation_offload_is_recorded_and_changes_nothing_on_the_cpu(tools, corpus, tmp_path):
    outputs = {}
    for offload in (False, True):
        out = tmp_path / f"offload_{offload}"
        r = run(tools[0], "pretrain", "--data", corpus, "--steps", 2, "--output", out,
                "--activation-checkpointing", "block", *(["--activation-offload"] if offload else []), *TINY)
        assert r.returncode == 0, r.stderr
        assert json.loads((out / "metadata.json").read_text())["config"]["activation_offload"] is offload
        outputs[offload] = (out / "model.safetensors").read_bytes()
    assert outputs[True] == outputs[False]  # the CPU pipelines move nothing: same bits


def test_zero_and_bucket_flags_are_recorded_replayed_and_checked(tools, corpus, tmp_path):
    # One process: --zero 1 is plain Adam (nothing to shard), the same bits.
    outputs = {}
    for zero, mib in ((0, 25), (1, 2)):
        out = tmp_path / f"zero{zero}"
        r = run(tools[0], "pretrain", "--data", corpus, "--steps", 2, "--output", out, "--zero", zero,
                "--bucket-mib", mib, *TINY)
        assert r.returncode == 0, r.stderr
        meta = json.loads((out / "metadata.json").read_text())
        assert (meta["config"]["zero_stage"], meta["config"]["gradient_bucket_mib"]) == (zero, mib)
        assert meta["facts"]["zero_sharded"] is False
        assert meta["facts"]["communicator"] == "single-process"
        outputs[zero] = (out / "model.safetensors").read_bytes()
    assert outputs[0] == outputs[1]
    r = run(tools[0], "pretrain", "--config", tmp_path / "zero1" / "metadata.json", "--output", tmp_path / "again",
            "--quiet")
    assert r.returncode == 0, r.stderr
    config = json.loads((tmp_path / "again" / "metadata.json").read_text())["config"]
    assert (config["zero_stage"], config["gradient_bucket_mib"]) == (1, 2)
    for flag, value in (("--zero", 2), ("--zero", "one"), ("--bucket-mib", 0), ("--bucket-mib", 65537)):
        r = run(tools[0], "pretrain", "--data", corpus, "--steps", 1, "--output", tmp_path / "bad", flag, value, *TINY)
        assert r.returncode == 2, (flag, value, r.stderr)
        assert flag in r.stderr, r.stderr
        assert not (tmp_path / "bad").exists()


def test_stop_after_leaves_a_run_that_resumes_to_the_uninterrupted_bits(tools, corpus, tmp_path):
    common = ["--data", corpus, "--steps", 4, "--checkpoint-interval", 2, "--dropout", 0.1, *TINY]
    assert run(tools[0], "pretrain", *common, "--output", tmp_path / "whole").returncode == 0
    out = tmp_path / "stopped"
    r = run(tools[0], "pretrain", *common, "--stop-after", 3, "--output", out)
    assert r.returncode == 0, r.stderr
    assert "stopped after step 3 (--stop-after)" in r.stdout and "--resume continues from" in r.stdout, r.stdout
    # The checkpoint is at step 2: the message says so and that step 3 runs again (it used to hide that).
    assert "safetensors (step 2); step 3 runs again" in r.stdout, r.stdout
    # As a kill after step 3: the step-2 checkpoint and the partial metrics, no final files.
    assert (out / "training_checkpoint.safetensors").exists() and (out / "metrics.partial.jsonl").exists()
    assert not (out / "metadata.json").exists() and not (out / "model.safetensors").exists()
    r = run(tools[0], "pretrain", *common, "--resume", "--output", out)
    assert r.returncode == 0 and "done: 4 steps (resumed from step 2)" in r.stdout, r.stdout + r.stderr
    assert (out / "model.safetensors").read_bytes() == (tmp_path / "whole" / "model.safetensors").read_bytes()
    assert "stop_after" not in json.loads((out / "metadata.json").read_text())["config"]
    r = run(tools[0], "pretrain", *common, "--stop-after", -1, "--output", tmp_path / "bad")
    assert r.returncode == 2 and "--stop-after" in r.stderr, r.stderr


@pytest.mark.parametrize("stop", [4, 5])
def test_stop_after_the_last_step_completes_the_run(tools, corpus, tmp_path, stop):
    # Step N done with N >= --steps is the whole run: the final files, not a
    # stop that throws the last steps away (the last step writes no checkpoint).
    common = ["--data", corpus, "--steps", 4, "--checkpoint-interval", 2, *TINY]
    assert run(tools[0], "pretrain", *common, "--output", tmp_path / "whole").returncode == 0
    out = tmp_path / "stopped"
    r = run(tools[0], "pretrain", *common, "--stop-after", stop, "--output", out)
    assert r.returncode == 0 and "done: 4 steps" in r.stdout, r.stdout + r.stderr
    assert (out / "model.safetensors").read_bytes() == (tmp_path / "whole" / "model.safetensors").read_bytes()
    assert not (out / "training_checkpoint.safetensors").exists()


@pytest.mark.parametrize("policy", ["attention", "mlp"])
def test_sub_block_policies_train_the_same_model_as_disabled(tools, corpus, tmp_path, policy):
    outputs = {}
    for p in ("disabled", policy):
        out = tmp_path / p
        r = run(tools[0], "pretrain", "--data", corpus, "--steps", 2, "--output", out,
                "--activation-checkpointing", p, *TINY)
        assert r.returncode == 0, r.stderr
        assert json.loads((out / "metadata.json").read_text())["config"]["activation_checkpointing"] == p
        outputs[p] = (out / "model.safetensors").read_bytes()
    assert outputs[policy] == outputs["disabled"]  # same bits: checkpointing changes memory, not results


def test_post_train_lora_then_generate(tools, pretrained, tmp_path):
    out = tmp_path / "lora"
    r = run(tools[0], "post-train", "--base-model", pretrained / "model.safetensors", "--data", CHAT,
            "--steps", 2, "--batch", 2, "--sequence-length", 64, "--eval-batches", 1, "--lora-rank", 2,
            "--activation-checkpointing", "block", "--output", out, "--quiet")
    assert r.returncode == 0, r.stderr
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["config"]["activation_checkpointing"] == "block"
    assert meta["config"]["fine_tuning_method"] == "lora"
    g = run(tools[1], "--model", pretrained / "model.safetensors", "--adapter", out / "adapter.safetensors",
            "--prompt", "Hi", "--max-new-tokens", 5, "--seed", 1)
    assert g.returncode == 0, g.stderr
    assert g.stdout.startswith("Hi")
    again = run(tools[1], "--model", pretrained / "model.safetensors", "--adapter", out / "adapter.safetensors",
                "--prompt", "Hi", "--max-new-tokens", 5, "--seed", 1)
    assert again.stdout == g.stdout  # same seed, same text


def test_help_reads_well(tools):
    for args in (["pretrain", "--help"], ["post-train", "--help"]):
        r = run(tools[0], *args)
        assert r.returncode == 0
        assert "--activation-checkpointing POLICY:{disabled,block,segments,attention,mlp}=disabled" in r.stdout
        assert "--config FILE" in r.stdout
    assert "--seed INT=1234" in run(tools[0], "pretrain", "--help").stdout  # defaults shown
    assert "--base-model PATH" in run(tools[0], "post-train", "--help").stdout
    assert "pretrain" in run(tools[0], "--help").stdout and "post-train" in run(tools[0], "--help").stdout
    assert run(tools[1], "--help").returncode == 0


@pytest.mark.parametrize("args,exit_code,needle", [
    (["pretrain", "--bogus"], 2, "not expected: --bogus"),
    (["pretrain", "--activation-checkpointing", "sometimes"], 2, "sometimes not in {disabled,block,segments,attention,mlp}"),
    (["pretrain", "--attention", "sparse"], 2, "sparse not in {materialized,flash}"),
    (["pretrain", "--steps", "many"], 2, "--steps: expects an integer >= 1, got 'many'"),
    (["pretrain", "--steps", "0"], 2, "--steps: expects an integer >= 1, got '0'"),
    (["pretrain", "--seed", "-1"], 2, "--seed: expects an integer in [0, 18446744073709551615], got '-1'"),
    (["pretrain", "--batch", "4611686018427387904"], 2, "batch must be in"),
    (["pretrain", "--weight-decay", "inf"], 2, "--weight-decay: expects a finite number, got 'inf'"),
    (["pretrain", "--steps"], 2, "--steps: 1 required INT missing"),
    (["pretrain", "--steps=", "--batch", "2"], 2, "--steps: no value after '='"),
    ([], 2, "A subcommand is required"),
    (["post-train", "--base-model", "x", "--data", "x.jsonl", "--method", "full", "--lora-rank", "4"], 2,
     "apply to --method lora only"),
    (["frobnicate"], 2, "unknown command"),
    (["post-train", "--data", "x.jsonl"], 2, "--base-model PATH is required"),
    (["post-train", "--base-model", "x", "--data", "x.jsonl", "--method", "qlora"], 2, "qlora not in {lora,full}"),
])
def test_bad_arguments_get_one_clear_line(tools, args, exit_code, needle):
    r = run(tools[0], *args)
    assert r.returncode == exit_code, (r.returncode, r.stderr)
    assert needle in r.stderr
    assert "Traceback" not in r.stderr and "terminate called" not in r.stderr


def test_bad_files_fail_cleanly_and_leave_outputs_intact(tools, pretrained, corpus, tmp_path):
    before = {p.name: p.read_bytes() for p in pretrained.iterdir() if p.is_file()}
    bad_text = tmp_path / "bad.txt"
    bad_text.write_bytes(b"valid then \xff\xfe invalid")
    bad_chat = tmp_path / "bad.jsonl"
    bad_chat.write_text('{"prompt": "a", "response": "b"}\n{"prompt": 3}\n')
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes((pretrained / "model.safetensors").read_bytes()[:100])
    cases = [
        ("pretrain", "--data", tmp_path / "missing.txt", "--output", pretrained, *TINY),
        ("pretrain", "--data", bad_text, "--output", pretrained, *TINY),
        # (the base's own directory as --output is a usage error: test_an_output_that_is_an_input_...)
        ("post-train", "--base-model", pretrained / "model.safetensors", "--data", bad_chat, "--output",
         tmp_path / "post", "--sequence-length", "32"),
        ("post-train", "--base-model", truncated, "--data", CHAT, "--output", pretrained),
    ]
    for args in cases:
        r = run(tools[0], *args)
        assert r.returncode == 1, (args, r.stderr)
        assert "rt-train: error: [" in r.stderr, r.stderr
    # An adapter file for another model, and a model file passed as an adapter.
    g = run(tools[1], "--model", pretrained / "model.safetensors", "--adapter", pretrained / "model.safetensors")
    assert g.returncode == 1 and "rt-generate: error: [load]" in g.stderr
    g = run(tools[1], "--model", truncated)
    assert g.returncode == 1 and "[load]" in g.stderr
    after = {p.name: p.read_bytes() for p in pretrained.iterdir() if p.is_file()}
    assert after == before


@pytest.mark.parametrize("args,needle", [
    (["--top-k", "-1"], "--top-k: expects an integer >= 0, got '-1'"),
    (["--temperature", "nan"], "--temperature: expects a finite number, got 'nan'"),
    (["--temperature", "-0.5"], "'--temperature' must be >= 0"),
    (["--max-new-tokens", "-1"], "--max-new-tokens: expects an integer >= 0, got '-1'"),
    (["--seed", "-1"], "--seed: expects an integer in [0, 18446744073709551615], got '-1'"),
    # `--opt=` with no value took the next argument as its value (the prompt
    # "--max-new-tokens=3", then 200 tokens, exit 0).
    (["--prompt=", "--max-new-tokens=3"], "--prompt: no value after '='"),
    (["--prompt=hi", "--max-new-tokens="], "--max-new-tokens: no value after '='"),
])
def test_generate_bad_arguments_exit_2_with_a_hint(tools, pretrained, args, needle):
    r = run(tools[1], "--model", pretrained / "model.safetensors", *args)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert needle in r.stderr and "Try 'rt-generate --help'." in r.stderr, r.stderr


@pytest.mark.parametrize("args,needle", [
    (["--norm-epsilon", "inf"], "--norm-epsilon: expects a finite number, got 'inf'"),
    (["--norm-epsilon", "1e39"], "--norm-epsilon: expects a finite number, got '1e39'"),
    (["--learning-rate", "1e39"], "--learning-rate: expects a finite number, got '1e39'"),
    (["--learning-rate", "nan"], "--learning-rate: expects a finite number, got 'nan'"),
    (["--learning-rate", "0.1x"], "--learning-rate: expects a number, got '0.1x'"),
    (["--norm-epsilon", "0"], "norm_epsilon must be a finite number > 0"),
])
def test_non_finite_settings_exit_2_naming_the_option(tools, tmp_path, args, needle):
    r = run(tools[0], "pretrain", "--output", tmp_path / "out", *args)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert needle in r.stderr and "Try 'rt-train pretrain --help'." in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()


def test_post_train_sequence_longer_than_the_base_context_is_a_usage_error(tools, pretrained, tmp_path):
    r = run(tools[0], "post-train", "--base-model", pretrained / "model.safetensors", "--data", CHAT,
            "--sequence-length", 65, "--output", tmp_path / "out")
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "sequence_length must be in [1, context_length 64], got 65" in r.stderr
    assert "Try 'rt-train post-train --help'." in r.stderr
    assert not (tmp_path / "out").exists()


def test_fifos_are_refused_at_once(tools, pretrained, tmp_path):
    import os
    fifo = tmp_path / "pipe.safetensors"
    os.mkfifo(fifo)
    cases = [
        (tools[1], "--model", fifo),
        (tools[1], "--model", pretrained / "model.safetensors", "--adapter", fifo),
        (tools[0], "post-train", "--base-model", fifo, "--data", CHAT, "--output", tmp_path / "o"),
        (tools[0], "pretrain", "--data", fifo, "--output", tmp_path / "o2", *TINY),
    ]
    for tool, *args in cases:
        r = subprocess.run([str(tool), *map(str, args)], capture_output=True, text=True, timeout=60)
        assert r.returncode == 1, (args, r.stderr)
        assert "not a regular file" in r.stderr, r.stderr


def test_non_finite_weights_are_refused_unless_allowed(tools, pretrained, tmp_path):
    import struct
    data = bytearray((pretrained / "model.safetensors").read_bytes())
    header_len = struct.unpack("<Q", data[:8])[0]
    start = 8 + header_len
    for offset in range(start, len(data) - 3, 4):  # every weight NaN
        struct.pack_into("<f", data, offset, float("nan"))
    bad = tmp_path / "nan.safetensors"
    bad.write_bytes(bytes(data))
    r = run(tools[1], "--model", bad, "--max-new-tokens", 3)
    assert r.returncode == 1 and "not finite" in r.stderr and "--allow-non-finite" in r.stderr, r.stderr
    r = run(tools[1], "--model", bad, "--max-new-tokens", 3, "--allow-non-finite")
    assert "\x00" not in r.stdout
    assert r.returncode == 1 and "logits" in r.stderr and "not finite" in r.stderr, r.stderr


def test_an_adapter_for_another_base_is_refused_unless_allowed(tools, corpus, pretrained, tmp_path):
    other = tmp_path / "other"
    assert run(tools[0], "pretrain", "--data", corpus, "--steps", 2, "--seed", 7, "--output", other,
               *TINY).returncode == 0
    lora = tmp_path / "lora"
    assert run(tools[0], "post-train", "--base-model", pretrained / "model.safetensors", "--data", CHAT,
               "--steps", 1, "--batch", 2, "--sequence-length", 32, "--eval-batches", 1, "--lora-rank", 2,
               "--output", lora, "--quiet").returncode == 0
    r = run(tools[1], "--model", other / "model.safetensors", "--adapter", lora / "adapter.safetensors")
    assert r.returncode == 1 and "fingerprint" in r.stderr and "--allow-base-mismatch" in r.stderr, r.stderr
    r = run(tools[1], "--model", other / "model.safetensors", "--adapter", lora / "adapter.safetensors",
            "--allow-base-mismatch", "--max-new-tokens", 2)
    assert r.returncode == 0, r.stderr


def test_a_runs_metadata_replays_it_bit_for_bit(tools, pretrained, tmp_path):
    # --config metadata.json gives every recorded setting back; the command line wins over the file.
    r = run(tools[0], "pretrain", "--config", pretrained / "metadata.json", "--output", tmp_path / "again", "--quiet")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "again" / "model.safetensors").read_bytes() == (pretrained / "model.safetensors").read_bytes()
    replayed = json.loads((tmp_path / "again" / "metadata.json").read_text())["config"]
    original = json.loads((pretrained / "metadata.json").read_text())["config"]
    assert {k: v for k, v in replayed.items() if k != "output_dir"} == \
        {k: v for k, v in original.items() if k != "output_dir"}
    r = run(tools[0], "pretrain", "--config", pretrained / "metadata.json", "--steps", 1,
            "--output", tmp_path / "shorter", "--quiet")
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "shorter" / "metadata.json").read_text())["config"]["steps"] == 1


def test_post_train_metadata_replays_too(tools, pretrained, tmp_path):
    first = tmp_path / "first"
    assert run(tools[0], "post-train", "--base-model", pretrained / "model.safetensors", "--data", CHAT,
               "--steps", 2, "--batch", 2, "--sequence-length", 32, "--eval-batches", 1, "--lora-rank", 2,
               "--lora-targets", "query,value", "--output", first, "--quiet").returncode == 0
    r = run(tools[0], "post-train", "--config", first / "metadata.json", "--output", tmp_path / "second", "--quiet")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "second" / "adapter.safetensors").read_bytes() == (first / "adapter.safetensors").read_bytes()


def test_a_toml_config_file(tools, corpus, tmp_path):
    config = tmp_path / "run.toml"
    config.write_text(f"""# a run
steps = 2
sequence_length = 32
batch = 2
eval-batches = 1
data = "{corpus}"
activation_checkpointing = "segments"

[dimensions]
layers = 2
model_width = 16
heads = 2
context_length = 32
feed_forward_width = 16
""")
    r = run(tools[0], "pretrain", "--config", config, "--output", tmp_path / "out", "--quiet")
    assert r.returncode == 0, r.stderr
    meta = json.loads((tmp_path / "out" / "metadata.json").read_text())["config"]
    assert meta["dimensions"]["layers"] == 2 and meta["steps"] == 2
    assert meta["activation_checkpointing"] == "segments"


@pytest.mark.parametrize("text,needle", [
    ("bogus_key = 3\n", "'bogus_key' is not an option of pretrain"),
    ("steps = \"many\"\n", "--steps: expects an integer >= 1, got 'many'"),
    ("activation_checkpointing = \"often\"\n", "often not in {disabled,block,segments,attention,mlp}"),
    ("learning_rate = inf\n", "--learning-rate: expects a finite number"),
    ('{"steps": [1', "not valid JSON"),
    ('{"steps": 2, "lora": {"rank": [1, 2]}}', "'lora.rank' is not an option of pretrain"),
    ('{"steps": {"a": [[1]]}}', "must be a string, number or boolean"),
    ('{"stage": "post_training", "config": {"steps": 2}}', "cannot configure pretrain"),
    # Before: these three were resolved silently (the last duplicate won, a
    # JSON array was read as a TOML section header and ignored).
    ('{"steps": 3, "steps": 5}', "the key 'steps' appears twice in one object"),
    ('{"dimensions": {"layers": 1, "layers": 2}}', "the key 'layers' appears twice"),
    ('{"steps": 3, "layers": 1, "dimensions": {"layers": 2}}', "'dimensions.layers' and 'layers' both set --layers"),
    ('{"output": "a", "output_dir": "b"}', "'output' and 'output_dir' both set --output"),
    ('[{"steps": 3, "layers": 1}]', "expected a JSON object"),
    ("  []\n", "expected a JSON object"),
    ("layers = 1\n[dimensions]\nlayers = 2\n", "'layers' and 'dimensions.layers' both set --layers"),
    # Before: an option's two names were two options here; the first key won.
    ('{"zero": 0, "zero_stage": 1}', "'zero' and 'zero_stage' both set --zero"),
    ('{"bucket_mib": 3, "gradient_bucket_mib": 5}', "both set --bucket-mib"),
    # Before: null read as unset ({"data": null} trained on the default corpus).
    ('{"data": null}', "'data' is null: give it a value, or leave the key out"),
    ('{"dimensions": {"layers": null}}', "'layers' is null"),
    ('{"stage": "pretraining", "config": {"steps": null}}', "'steps' is null"),
])
def test_bad_config_files_exit_2_naming_the_setting(tools, tmp_path, text, needle):
    config = tmp_path / "bad.cfg"
    config.write_text(text)
    r = run(tools[0], "pretrain", "--config", config, "--output", tmp_path / "out")
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert needle in r.stderr and "Try 'rt-train pretrain --help'." in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()
    r = run(tools[0], "pretrain", "--config", tmp_path / "missing.toml")
    assert r.returncode == 2 and "missing.toml" in r.stderr


def test_pretrain_gqa_tied_rope_base_records_and_replays_the_architecture(tools, corpus, tmp_path):
    out = tmp_path / "gqa"
    r = run(tools[0], "pretrain", "--data", corpus, "--steps", 2, "--output", out, *TINY[:4], "--heads", "4",
            "--key-value-heads", "2", "--tie-embeddings", "--rope-base", "500000", *TINY[6:])
    assert r.returncode == 0, r.stderr
    dims = json.loads((out / "metadata.json").read_text())["config"]["dimensions"]
    assert dims["key_value_heads"] == 2 and dims["tie_embeddings"] is True and dims["rope_base"] == 500000
    r = run(tools[0], "pretrain", "--config", out / "metadata.json", "--output", tmp_path / "again", "--quiet")
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "again" / "metadata.json").read_text())["config"]["dimensions"] == dims
    g = run(tools[1], "--model", out / "model.safetensors", "--max-new-tokens", 5, "--temperature", 0)
    assert g.returncode == 0, g.stderr
    bad = run(tools[0], "pretrain", "--heads", "4", "--key-value-heads", "3", "--output", tmp_path / "bad", *TINY[6:])
    assert bad.returncode == 2 and "key_value_heads 3" in bad.stderr


@pytest.mark.parametrize("kind,needle", [
    ("directory", "not a regular file"),
    ("device", "not a regular file"),
    ("fifo", "not a regular file"),
    ("huge", "over the 1048576-byte limit"),
    ("deep_json", "nest deeper than 16 levels"),
    ("deep_toml", "nests deeper than 16 levels"),
    ("nul_value", "'output' holds a NUL byte"),
])
def test_hostile_config_files_exit_2_without_hanging_or_crashing(tools, tmp_path, kind, needle):
    # Before: a directory gave exit 1 "basic_filebuf::underflow", a FIFO hung,
    # /dev/zero read without end, 20 000 nested objects crashed (SIGSEGV), a
    # 200 kB dotted TOML section took minutes and gigabytes, and
    # "output": "m\u0000x" wrote the tokenizer to a file named "m".
    import os
    config = tmp_path / "c.cfg"
    if kind == "directory":
        config.mkdir()
    elif kind == "device":
        config = pathlib.Path("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(config)
    elif kind == "huge":
        config.write_text("#" * (2 << 20))
    elif kind == "deep_json":
        config.write_text('{"a":' * 20000 + "1" + "}" * 20000)
    elif kind == "deep_toml":
        config.write_text("[" + ".".join(["a"] * 100000) + "]\nvocab_size = 300\n")
    else:
        config.write_text('{"output": "' + str(tmp_path / "m") + '\\u0000x", "vocab_size": 300}')
    r = subprocess.run([str(tools[0]), "tokenizer", "--config", str(config)], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 2, (r.returncode, r.stderr[-500:])
    assert needle in r.stderr and "Try 'rt-train tokenizer --help'." in r.stderr, r.stderr[-500:]
    assert not (tmp_path / "m").exists()


def test_rt_eval_option_values_the_model_refuses_are_usage_errors(build_dir, pretrained):
    # Before: evaluate() refused them after the run had started: exit 1.
    model = pretrained / "model.safetensors"
    for args, needle in [(["--batch", 100000], "option '--batch' must be in [1, 65536], got 100000"),
                         (["--sequence-length", 65], "context length 64 (0: the context length), got 65")]:
        r = run(build_dir / "rt-eval", "--model", model, *args)
        assert r.returncode == 2, (r.returncode, r.stderr)
        assert needle in r.stderr and "Try 'rt-eval --help'." in r.stderr, r.stderr
    r = run(build_dir / "rt-eval", "--model", model, "--sequence-length", 64, "--batch", 4)
    assert r.returncode == 0, r.stderr


def test_rt_train_tokenizer_vocab_size_over_the_limit_is_a_usage_error(tools, corpus, tmp_path):
    # Before: refused by train_tokenizer() after the run had started: exit 1.
    r = run(tools[0], "tokenizer", "--data", corpus, "--vocab-size", 2000000, "--output", tmp_path / "t.model")
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "option '--vocab-size' must be in [260, 1048576], got 2000000" in r.stderr, r.stderr
    assert not (tmp_path / "t.model").exists()


def test_a_config_file_can_name_the_model_of_rt_generate_and_rt_eval(tools, build_dir, pretrained, tmp_path):
    # Before: --model was required() at parse time, before the config file
    # was applied: "--model is required" for a file that names it.
    config = tmp_path / "gen.toml"
    config.write_text(f'model = "{pretrained / "model.safetensors"}"\nmax_new_tokens = 3\ntemperature = 0\n')
    r = run(tools[1], "--config", config)
    assert r.returncode == 0, r.stderr
    config = tmp_path / "eval.json"
    config.write_text(json.dumps({"model": str(pretrained / "model.safetensors"), "sequence_length": 64}))
    r = run(build_dir / "rt-eval", "--config", config)
    assert r.returncode == 0, r.stderr
    for tool in (tools[1], build_dir / "rt-eval"):
        r = run(tool)
        assert r.returncode == 2 and "--model PATH is required" in r.stderr, r.stderr


def test_activation_memory_budget_prints_the_plan_and_stays_under_it(tools, corpus, tmp_path):
    shape = ["--context-length", "64", "--model-width", "32", "--heads", "2", "--layers", "4",
             "--feed-forward-width", "64", "--batch", "2", "--sequence-length", "48", "--eval-batches", "1", "--quiet"]
    free = run(tools[0], "pretrain", "--data", corpus, "--steps", 2, "--output", tmp_path / "free", *shape)
    assert free.returncode == 0, free.stderr
    peak = json.loads((tmp_path / "free" / "metadata.json").read_text())["results"]["activation_peak_bytes"]
    budget = peak * 7 // 8
    r = run(tools[0], "pretrain", "--data", corpus, "--steps", 2, "--output", tmp_path / "planned",
            "--activation-memory-budget", budget, *shape)
    assert r.returncode == 0, r.stderr
    assert "predicted activation peak" in r.stdout and "recompute" in r.stdout
    meta = json.loads((tmp_path / "planned" / "metadata.json").read_text())
    assert meta["results"]["activation_peak_bytes"] <= budget
    assert meta["facts"]["activation_memory_plan"]["budget_bytes"] == budget
    rows = [json.loads(line) for line in (tmp_path / "planned" / "metrics.jsonl").read_text().splitlines()]
    assert all(0 < row["activation_peak_bytes"] <= budget for row in rows)

    too_small = run(tools[0], "pretrain", "--data", corpus, "--steps", 1, "--output", tmp_path / "small",
                    "--activation-memory-budget", "10KiB", *shape)
    assert too_small.returncode == 1 and "the smallest plan" in too_small.stderr
    assert not (tmp_path / "small").exists()
    for bad in (["--activation-memory-budget", "lots"],
                ["--activation-memory-budget", "1MiB", "--activation-checkpointing", "block"]):
        r = run(tools[0], "pretrain", "--data", corpus, "--steps", 1, "--output", tmp_path / "bad", *bad, *shape)
        assert r.returncode == 2 and "--activation-memory-budget" in r.stderr, r.stderr


def test_an_output_that_is_an_input_is_refused_and_the_input_kept(tools, build_dir, pretrained, corpus, tmp_path):
    # Before: each of these exited 0 (or 1 after the harm) and replaced the input.
    convert = build_dir / "rt-convert"
    hf = tmp_path / "hf"
    assert run(convert, "--to-hf", pretrained / "model.safetensors", "--output", hf).returncode == 0
    weights = (hf / "model.safetensors").read_bytes()
    r = run(convert, "--from-hf", hf, "--output", hf / "model.safetensors")
    assert r.returncode == 2 and "inside the checkpoint directory" in r.stderr, r.stderr
    assert (hf / "model.safetensors").read_bytes() == weights
    d = tmp_path / "d"
    d.mkdir()
    (d / "model.safetensors").write_bytes((pretrained / "model.safetensors").read_bytes())
    r = run(convert, "--to-hf", d / "model.safetensors", "--output", d)
    assert r.returncode == 2 and "would replace the model-state file" in r.stderr, r.stderr
    assert (d / "model.safetensors").read_bytes() == (pretrained / "model.safetensors").read_bytes()
    text = tmp_path / "c.txt"
    text.write_bytes(corpus.read_bytes())
    r = run(tools[0], "tokenizer", "--data", text, "--vocab-size", 300, "--output", tmp_path / "." / "c.txt")
    assert r.returncode == 2 and "'--output' is the --data file" in r.stderr, r.stderr
    assert text.read_bytes() == corpus.read_bytes()
    before = {p.name: p.read_bytes() for p in pretrained.iterdir() if p.is_file()}
    for method in ("full", "lora"):
        r = run(tools[0], "post-train", "--base-model", pretrained / "model.safetensors", "--data", CHAT,
                "--method", method, "--steps", 1, "--batch", 2, "--sequence-length", 32, "--eval-batches", 1,
                "--output", pretrained, "--quiet")
        assert r.returncode == 2 and "holds the base model" in r.stderr, r.stderr
    assert {p.name: p.read_bytes() for p in pretrained.iterdir() if p.is_file()} == before


def test_an_hf_import_of_a_subword_model_takes_its_tokenizer(tools, build_dir, corpus, tmp_path):
    # Before: a model recording no tokenizer with a vocabulary other than 256
    # (every rt-convert --from-hf import) refused every tokenizer.
    tok = tmp_path / "tok.model"
    assert run(tools[0], "tokenizer", "--data", corpus, "--vocab-size", 300, "--output", tok).returncode == 0
    out = tmp_path / "sub"
    r = run(tools[0], "pretrain", "--data", corpus, "--steps", 2, "--output", out, "--tokenizer", tok, *TINY)
    assert r.returncode == 0, r.stderr
    convert = build_dir / "rt-convert"
    assert run(convert, "--to-hf", out / "model.safetensors", "--output", tmp_path / "hf").returncode == 0
    assert run(convert, "--from-hf", tmp_path / "hf", "--output", tmp_path / "back.st").returncode == 0
    r = run(tools[1], "--model", tmp_path / "back.st", "--max-new-tokens", 2)
    assert r.returncode == 2 and "records no tokenizer" in r.stderr, r.stderr
    r = run(tools[1], "--model", tmp_path / "back.st", "--tokenizer", tok, "--max-new-tokens", 2, "--prompt", "a")
    assert r.returncode == 0, r.stderr
    r = run(build_dir / "rt-eval", "--model", tmp_path / "back.st", "--tokenizer", tok, "--data", corpus,
            "--sequence-length", 32)
    assert r.returncode == 0, r.stderr


def test_seeds_fill_the_whole_uint64_range(tools, pretrained, corpus, tmp_path):
    # Before: the validator parsed with stoll, so seeds from 2^63 up were
    # refused with "expects an integer >= 0".
    for seed in ("9223372036854775808", "18446744073709551615"):
        r = run(tools[1], "--model", pretrained / "model.safetensors", "--max-new-tokens", 2, "--seed", seed)
        assert r.returncode == 0, r.stderr
    for bad in ("-1", "18446744073709551616", " 5", "+5", "5x"):
        r = run(tools[1], "--model", pretrained / "model.safetensors", "--seed", bad)
        assert r.returncode == 2 and "expects an integer in [0, 18446744073709551615]" in r.stderr, (bad, r.stderr)
    out = tmp_path / "big_seed"
    r = run(tools[0], "pretrain", "--data", corpus, "--steps", 1, "--seed", "18446744073709551615", "--output", out,
            *TINY)
    assert r.returncode == 0, r.stderr
    assert json.loads((out / "metadata.json").read_text())["config"]["seed"] == 2**64 - 1
    r = run(tools[0], "pretrain", "--config", out / "metadata.json", "--output", tmp_path / "again", "--quiet")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "again" / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()


def test_memory_plan_bounds_its_sizes_and_checks_the_output_first(build_dir, tmp_path):
    # Before: --budgets and --batch had no upper bound (an endless loop or an
    # overflow), and an unusable --output failed only after the profiling.
    plan = build_dir / "rt-memory-plan"
    shape = ["--model-width", 16, "--heads", 2, "--layers", 2, "--feed-forward-width", 32, "--sequence-length", 16]
    for args, needle in ((["--budgets", "9223372036854775807"], "--budgets: expects an integer in [2, 1000]"),
                         (["--batch", "4611686018427387904"], "--batch: expects an integer in [1, 1048576]"),
                         (["--batch", "1048577"], "--batch: expects an integer in [1, 1048576]")):
        r = run(plan, *shape, *args, "--output", tmp_path / "mp")
        assert r.returncode == 2 and needle in r.stderr, r.stderr
    (tmp_path / "file").write_text("x")
    r = run(plan, *shape, "--output", tmp_path / "file" / "sub")
    assert r.returncode == 2 and "option '--output'" in r.stderr and "profiling" not in r.stderr, r.stderr
    # A rank the adapters refuse is a usage error too (was exit 1 after "profiling").
    r = run(plan, *shape, "--lora-rank", 1000, "--output", tmp_path / "mp")
    assert r.returncode == 2 and "profiling" not in r.stderr, (r.returncode, r.stderr)
    r = run(plan, *shape, "--budgets", 3, "--key-value-heads", 1, "--output", tmp_path / "mp")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (tmp_path / "mp").iterdir()) == ["memory_plan.json", "memory_plan.md",
                                                                   "memory_plan_peak.svg"]
    # The shape is recorded whole (two GQA settings differ in their files).
    dims = json.loads((tmp_path / "mp" / "memory_plan.json").read_text())["dimensions"]
    assert dims["key_value_heads"] == 1 and "context_length" in dims


def test_a_data_file_the_run_writes_is_refused_and_kept(tools, corpus, tmp_path):
    # Before: exit 0, and the corpus was deleted (as the partial log) or
    # overwritten (as metrics.jsonl) after training on it.
    for name in ("metrics.partial.jsonl", "metrics.jsonl", "loss_curve.svg"):
        out = tmp_path / name.replace(".", "_")
        out.mkdir()
        (out / name).write_bytes(corpus.read_bytes())
        r = run(tools[0], "pretrain", "--data", out / name, "--steps", 1, "--output", out, *TINY)
        assert r.returncode == 2 and "a file this run writes or removes" in r.stderr, r.stderr
        assert (out / name).read_bytes() == corpus.read_bytes()
        assert sorted(p.name for p in out.iterdir()) == [name]


def test_a_replay_refuses_inputs_that_changed_since_the_run(tools, corpus, tmp_path):
    # Before: a changed data file replayed as another run, exit 0.
    data = tmp_path / "c.txt"
    data.write_bytes(corpus.read_bytes())
    first = tmp_path / "first"
    assert run(tools[0], "pretrain", "--data", data, "--steps", 2, "--output", first, *TINY).returncode == 0
    data.write_bytes(corpus.read_bytes() + b"one more line\n")
    r = run(tools[0], "pretrain", "--config", first / "metadata.json", "--output", tmp_path / "again", "--quiet")
    assert r.returncode == 2 and "data_fingerprint" in r.stderr and "changed since" in r.stderr, r.stderr
    assert not (tmp_path / "again").exists()
    # Named on the command line, the file is the user's choice.
    r = run(tools[0], "pretrain", "--config", first / "metadata.json", "--data", data,
            "--output", tmp_path / "chosen", "--quiet")
    assert r.returncode == 0, r.stderr


def test_post_train_defaults_and_method_override_of_a_replay(tools, pretrained, tmp_path):
    # The CLI's sequence length default is everyone's (64), not 128.
    r = run(tools[0], "post-train", "--help")
    assert "--sequence-length" in r.stdout
    line = next(l for l in r.stdout.splitlines() if "--sequence-length" in l)
    assert "64" in line and "128" not in line, line
    first = tmp_path / "lora"
    assert run(tools[0], "post-train", "--base-model", pretrained / "model.safetensors", "--data", CHAT,
               "--steps", 1, "--batch", 2, "--sequence-length", 32, "--eval-batches", 1, "--lora-rank", 2,
               "--output", first, "--quiet").returncode == 0
    # Before: "--lora-* options apply to --method lora only" for keys the file held.
    r = run(tools[0], "post-train", "--config", first / "metadata.json", "--method", "full",
            "--output", tmp_path / "full", "--quiet")
    assert r.returncode == 0, r.stderr
    r = run(tools[0], "post-train", "--config", first / "metadata.json", "--method", "full", "--lora-rank", 4,
            "--output", tmp_path / "bad", "--quiet")
    assert r.returncode == 2 and "--lora-rank: --lora-* options apply to --method lora only" in r.stderr, r.stderr


@pytest.mark.parametrize("value", ["0x10", " 1e-3", "1e-3 ", "1e-46", "-1e-60"])
def test_float_options_take_plain_numbers_a_float_can_hold(tools, tmp_path, value):
    r = run(tools[0], "pretrain", "--learning-rate", value, "--output", tmp_path / "out")
    assert r.returncode == 2 and "--learning-rate" in r.stderr, r.stderr


def test_tokenizer_output_that_cannot_be_written_fails_before_training(tools, corpus, tmp_path):
    for target in (tmp_path, pathlib.Path("/dev/full")):
        r = run(tools[0], "tokenizer", "--data", corpus, "--vocab-size", 300, "--output", target)
        assert r.returncode == 1 and str(target) in r.stderr and "wrote" not in r.stdout, r.stderr


def test_memory_plan_reads_a_config_file_as_the_other_tools_do(build_dir, tmp_path):
    plan = build_dir / "rt-memory-plan"
    config = tmp_path / "plan.toml"
    config.write_text('model-width = 16\nheads = 2\nlayers = 2\nfeed-forward-width = 32\nsequence-length = 16\n'
                      f'budgets = 2\noutput = "{tmp_path / "mp"}"\n')
    r = run(plan, "--config", config, "--layers", 3)  # the command line wins
    assert r.returncode == 0, r.stderr
    dims = json.loads((tmp_path / "mp" / "memory_plan.json").read_text())["dimensions"]
    assert dims["model_width"] == 16 and dims["layers"] == 3
    config.write_text("budgets = 1\n")
    r = run(plan, "--config", config, "--output", tmp_path / "other")
    assert r.returncode == 2 and "--budgets" in r.stderr, r.stderr


def test_generate_stops_at_a_stop_token(tools, pretrained):
    # --stop-token ID ends generation at that id (as Hugging Face's
    # eos_token_id), its text left out; by default the tokenizer's
    # end-of-sequence id, which bytes do not have.
    riftco = pytest.importorskip("riftco")
    model = pretrained / "model.safetensors"
    tokens = riftco.load_model(model).generate("a s", max_new_tokens=8, temperature=0).tokens
    stop = tokens[2]
    first = tokens.index(stop)
    greedy = ["--model", model, "--prompt", "a s", "--temperature", 0]
    r = run(tools[1], *greedy, "--max-new-tokens", 8, "--stop-token", stop)
    shorter = run(tools[1], *greedy, "--max-new-tokens", first)
    assert r.returncode == 0 and shorter.returncode == 0, (r.stderr, shorter.stderr)
    assert r.stdout == shorter.stdout
    assert run(tools[1], *greedy, "--max-new-tokens", 8).stdout != r.stdout
    bad = run(tools[1], "--model", model, "--prompt", "a", "--stop-token", 256)
    assert bad.returncode == 1 and "stop token 0 (256) is outside the vocabulary [0, 256)" in bad.stderr, bad.stderr
    assert run(tools[1], "--model", model, "--prompt", "a", "--stop-token", -1).returncode == 2


def test_values_that_look_like_an_empty_option_are_still_values(tools, pretrained):
    # The '--opt=' refusal is for the tools' own options only, and not where
    # an option takes the argument as its value (review: '-- SQL ... =' was refused).
    model = pretrained / "model.safetensors"
    for args in (["--prompt", "-- SQL: select the total ="], ["--prompt", "--max-new-tokens="],
                 ["--prompt", "a", "--stop", "---x="]):
        r = run(tools[1], "--model", model, "--max-new-tokens", 2, *args)
        assert r.returncode == 0, (args, r.stderr)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full on this system")
def test_output_that_cannot_be_written_is_an_error_not_exit_0(build_dir, tools, pretrained, corpus):
    # `rt-eval --json > result.json` on a full disk exited 0 with an empty file; cat and Python exit 1.
    model = pretrained / "model.safetensors"
    for tool, args in [(build_dir / "rt-eval", ["--model", model, "--data", corpus, "--json"]),
                       (tools[1], ["--model", model, "--max-new-tokens", 3, "--temperature", 0])]:
        with open("/dev/full", "w") as full:
            r = subprocess.run([str(tool), *map(str, args)], stdout=full, stderr=subprocess.PIPE, text=True,
                               timeout=300)
        assert r.returncode == 1, (tool, r.stderr)
        assert "writing to standard output failed" in r.stderr, r.stderr


def test_resume_takes_the_same_data_file_by_another_name_and_names_both_values(tools, corpus, tmp_path):
    # --data corpus.txt from its directory is the file the run named by its absolute path: a resume
    # was refused ("first difference: 'data'"). A real difference names both values.
    out = tmp_path / "run"
    common = ["--steps", 4, "--checkpoint-interval", 2, *TINY]
    r = run(tools[0], "pretrain", "--data", corpus, *common, "--stop-after", 2, "--output", out)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([str(tools[0]), "pretrain", "--data", corpus.name, *map(str, common), "--resume",
                        "--output", str(out)], capture_output=True, text=True, timeout=300, cwd=corpus.parent)
    assert r.returncode == 0, r.stderr
    assert (out / "model.safetensors").exists()
    other = tmp_path / "other"
    r = run(tools[0], "pretrain", "--data", corpus, *common, "--stop-after", 2, "--output", other)
    assert r.returncode == 0, r.stderr
    r = run(tools[0], "pretrain", "--data", corpus, *common[:-1], "--seed", 7, "--quiet", "--resume", "--output", other)
    assert r.returncode != 0
    assert "first difference: 'seed': the checkpoint's 1234, this run's 7" in r.stderr, r.stderr
