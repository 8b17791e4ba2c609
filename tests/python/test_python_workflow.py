"""Workflow through the public Python API (issue 13): pretrain a tiny model,
LoRA post-train it, generate text, with both checkpointing policies: the
losses are bit-identical between policies. And the examples in examples/."""
import json
import pathlib
import subprocess
import sys

import pytest

from riftco_import import import_riftco

riftco = import_riftco()
ROOT = pathlib.Path(__file__).resolve().parents[2]
CHAT = ROOT / "data" / "chat_example.jsonl"
TINY = riftco.TransformerConfig(vocab_size=256, context_length=48, model_width=16, heads=2, layers=2,
                                feed_forward_width=32)


def losses(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [(r["step"], r["loss"], r.get("validation_loss")) for r in rows]


def workflow(tmp_path, policy):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("What is 2 + 3? It is 5. The quick brown fox jumps over the lazy dog.\n" * 80)
    pre = riftco.pretrain(riftco.PretrainingConfig(
        model=TINY, data=corpus, steps=6, batch=2, sequence_length=24, warmup_steps=1, eval_interval=3,
        eval_batches=1, checkpoint_interval=0, attention="flash", activation_checkpointing=policy,
        output_dir=tmp_path / f"pre-{policy}"), plot=False)
    assert pre.completed and pre.files["weights"].name == "model.safetensors"
    meta = json.loads(pre.files["metadata"].read_text())
    assert meta["config"]["activation_checkpointing"] == policy
    post = riftco.post_train(riftco.PostTrainingConfig(
        base_model=pre.weights, data=CHAT, fine_tuning_method="lora", lora=riftco.LoraConfig(rank=2),
        steps=4, batch=2, sequence_length=48, warmup_steps=1, eval_interval=2, eval_batches=1,
        checkpoint_interval=0, attention="flash", activation_checkpointing=policy,
        output_dir=tmp_path / f"post-{policy}"), plot=False)
    assert post.completed and post.files["weights"].name == "adapter.safetensors"
    model = riftco.load_model(pre.weights, attention="flash", activation_checkpointing=policy)
    model.load_adapter(post.weights)
    text = model.generate("What is 2 + 3?", max_new_tokens=12, temperature=0).text
    assert isinstance(text, str) and len(text.encode("utf-8", "surrogateescape")) > 0
    return pre, post, text


def test_pretrain_lora_generate_bit_identical_between_policies(tmp_path):
    runs = {policy: workflow(tmp_path, policy) for policy in ("disabled", "block")}
    (pre_d, post_d, text_d), (pre_b, post_b, text_b) = runs["disabled"], runs["block"]
    assert losses(pre_d.output_dir) == losses(pre_b.output_dir)  # exact floats from JSON: bit-identical
    assert losses(post_d.output_dir) == losses(post_b.output_dir)
    assert len(losses(pre_d.output_dir)) == 6 and len(losses(post_d.output_dir)) == 4
    assert pre_d.final_train_loss == pre_b.final_train_loss
    assert post_d.final_validation_loss == post_b.final_validation_loss
    assert pre_d.weights.read_bytes() == pre_b.weights.read_bytes()
    assert text_d == text_b


def run_example(name, *args, cwd=None):
    return subprocess.run([sys.executable, str(ROOT / "examples" / name), *map(str, args)], capture_output=True,
                          text=True, timeout=300, cwd=cwd)


def test_examples_pretrain_post_train_and_custom_loop(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a small corpus for a small model.\n" * 200)
    small = ["--context-length", 48, "--model-width", 16, "--heads", 2, "--layers", 2, "--feed-forward-width", 32,
             "--batch", 2, "--sequence-length", 24, "--eval-batches", 1]
    r = run_example("pretrain.py", "--data", corpus, "--steps", 2, "--output-dir", tmp_path / "pre",
                    "--activation-checkpointing", "block", "--attention", "materialized", *small)
    assert r.returncode == 0, r.stderr
    assert str(tmp_path / "pre" / "model.safetensors") in r.stdout
    meta = json.loads((tmp_path / "pre" / "metadata.json").read_text())
    assert meta["config"]["activation_checkpointing"] == "block" and meta["config"]["attention"] == "materialized"
    r = run_example("post_train.py", "--base-model", tmp_path / "pre" / "model.safetensors", "--data", CHAT,
                    "--steps", 2, "--batch", 2, "--sequence-length", 48, "--eval-batches", 1, "--lora-rank", 2,
                    "--activation-checkpointing", "segments", "--output-dir", tmp_path / "post")
    assert r.returncode == 0, r.stderr
    assert str(tmp_path / "post" / "adapter.safetensors") in r.stdout
    r = run_example("pretrain.py", "--activation-checkpointing", "sometimes")
    assert r.returncode == 2 and "invalid choice" in r.stderr
    r = run_example("train_loop.py", "--steps", 4, "--output", tmp_path / "loop.png")
    assert r.returncode == 0, r.stderr
    assert "step 4" in r.stdout
    if (tmp_path / "loop.png").exists():
        assert (tmp_path / "loop.png").read_bytes()[:4] == b"\x89PNG"


def test_example_flags_cover_every_config_field():
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import config_flags
    finally:
        sys.path.pop(0)
    for cls in (riftco.PretrainingConfig, riftco.PostTrainingConfig):
        parser = config_flags.parser_for(cls, "test")
        dests = {a.dest for a in parser._actions}
        for field in config_flags.flat_fields(cls()):
            assert field in dests, (cls.__name__, field)
        config = config_flags.config_from(cls, parser.parse_args([]))
        assert repr(config) == repr(cls(**{k: v for k, v in cls().to_dict().items()}))
