"""Hugging Face Llama checkpoints against `transformers` itself (4.44.2, eager
attention, Debian's torch 1.13): random small LlamaForCausalLM models (GQA,
tied, untied, a non-default rope_theta, a non-default rms_norm_eps, sharded)
are saved, converted, and compared: logits within 1e-5 of the largest |logit|
and the mean cross-entropy gradient of every parameter within 1e-5 relative
norm error, for materialized and flash attention; the round trip back loads in
transformers with identical logits; unsupported configs are refused by field
name; LoRA post-training with block checkpointing runs on a converted model."""
import pathlib
import subprocess

import numpy as np
import pytest

from riftco_import import import_riftco

torch = pytest.importorskip("torch", reason="PyTorch is not installed (Debian: python3-torch)")
transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed (bash scripts/python_env.sh puts 4.44.2 into .venv)")
riftco = import_riftco()

BASE = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, max_position_embeddings=32)
CONFIGS = {
    "gqa": dict(num_attention_heads=4, num_key_value_heads=2),
    "mqa_rope_theta": dict(num_attention_heads=4, num_key_value_heads=1, rope_theta=500000.0),
    "tied": dict(num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True),
    "untied_eps": dict(num_attention_heads=2, num_key_value_heads=2, rms_norm_eps=1e-5),
    "gqa_tied_sharded": dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                             rope_theta=20000.0),
}
TOL = 1e-5


def build_hf(directory, overrides, shard=False):
    """A seeded random LlamaForCausalLM (norm weights randomized too) saved to `directory`."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**{**BASE, **overrides})
    config._attn_implementation = "eager"
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.15)
    model.save_pretrained(directory, safe_serialization=True, max_shard_size="40KB" if shard else "5GB")
    return model


def batch(vocab, b=2, t=12, seed=3):
    rng = np.random.default_rng(seed)
    return (rng.integers(0, vocab, size=(b, t)).astype(np.int32),
            rng.integers(0, vocab, size=(b, t)).astype(np.int32))


def interleaved_to_hf(w, heads):
    """Our rotary row order (pairs) → Hugging Face's (halves), per head."""
    rows, cols = w.shape
    d = rows // heads
    return w.reshape(heads, d // 2, 2, cols).transpose(0, 2, 1, 3).reshape(rows, cols)


def hf_name(ours, config):
    """(Hugging Face name, rotary heads or 0) for one of our parameter names."""
    if ours == "token_embedding.weight":
        return "model.embed_tokens.weight", 0
    if ours == "final_norm.weight":
        return "model.norm.weight", 0
    if ours == "lm_head.weight":
        return "lm_head.weight", 0
    _, layer, rest = ours.split(".", 2)
    table = {"attention_norm.weight": ("input_layernorm.weight", 0),
             "attention.query.weight": ("self_attn.q_proj.weight", config.num_attention_heads),
             "attention.key.weight": ("self_attn.k_proj.weight", config.num_key_value_heads),
             "attention.value.weight": ("self_attn.v_proj.weight", 0),
             "attention.output.weight": ("self_attn.o_proj.weight", 0),
             "mlp_norm.weight": ("post_attention_layernorm.weight", 0),
             "mlp.gate.weight": ("mlp.gate_proj.weight", 0),
             "mlp.up.weight": ("mlp.up_proj.weight", 0),
             "mlp.down.weight": ("mlp.down_proj.weight", 0)}
    name, heads = table[rest]
    return f"model.layers.{layer}.{name}", heads


def hf_loss_and_grads(model, tokens, targets):
    model.zero_grad()
    logits = model(torch.from_numpy(tokens.astype(np.int64))).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             torch.from_numpy(targets.astype(np.int64)).reshape(-1))
    loss.backward()
    grads = {n: p.grad.detach().numpy().copy() for n, p in model.named_parameters()}
    return logits.detach().numpy(), loss.item(), grads


@pytest.mark.parametrize("case", sorted(CONFIGS))
def test_logits_and_every_gradient_match_transformers(tmp_path, case):
    overrides = CONFIGS[case]
    hf = build_hf(tmp_path / "hf", overrides, shard="sharded" in case)
    if "sharded" in case:
        assert (tmp_path / "hf" / "model.safetensors.index.json").exists()
    riftco.convert_from_hf(tmp_path / "hf", tmp_path / "model.safetensors")
    config = riftco.read_model_config(tmp_path / "model.safetensors")
    assert config.kv_heads == overrides["num_key_value_heads"]
    assert config.tie_embeddings == overrides.get("tie_word_embeddings", False)
    assert config.rope_base == overrides.get("rope_theta", 10000.0)
    tokens, targets = batch(BASE["vocab_size"])
    ref_logits, ref_loss, ref_grads = hf_loss_and_grads(hf, tokens, targets)
    for attention in ("materialized", "flash"):
        model = riftco.load_model(tmp_path / "model.safetensors", attention=attention)
        assert model.norm_epsilon == pytest.approx(overrides.get("rms_norm_eps", 1e-6), rel=1e-6)
        logits = model.forward(tokens).numpy()
        scale = np.abs(ref_logits).max()
        assert scale > 1.0  # weights large enough that a mistake shows
        assert np.abs(logits - ref_logits).max() <= TOL * scale, attention
        loss = model.loss(tokens, targets)
        assert abs(loss.item() - ref_loss) <= TOL * abs(ref_loss)
        loss.backward()
        names = set()
        for name, p in model.named_parameters():
            hf_param, heads = hf_name(name, hf.config)
            names.add(hf_param)
            ours = p.grad.copy()
            if heads:
                ours = interleaved_to_hf(ours, heads)
            ref = ref_grads[hf_param]
            error = np.linalg.norm(ours - ref) / np.linalg.norm(ref)
            assert error <= TOL, (attention, name, error)
        assert names == set(ref_grads), "every transformers parameter was compared"


def test_round_trip_reloads_in_transformers_with_identical_logits(tmp_path):
    for case in ("gqa", "tied", "mqa_rope_theta"):
        hf = build_hf(tmp_path / case, CONFIGS[case])
        riftco.convert_from_hf(tmp_path / case, tmp_path / f"{case}.safetensors")
        riftco.convert_to_hf(tmp_path / f"{case}.safetensors", tmp_path / f"{case}-back")
        back = transformers.LlamaForCausalLM.from_pretrained(tmp_path / f"{case}-back",
                                                             attn_implementation="eager").eval()
        assert back.config.num_key_value_heads == hf.config.num_key_value_heads
        assert back.config.tie_word_embeddings == hf.config.tie_word_embeddings
        assert back.config.rope_theta == hf.config.rope_theta
        assert back.config.rms_norm_eps == hf.config.rms_norm_eps
        tokens = torch.from_numpy(batch(BASE["vocab_size"])[0].astype(np.int64))
        with torch.no_grad():
            assert torch.equal(back(tokens).logits, hf(tokens).logits), case
        for (n1, p1), (n2, p2) in zip(sorted(hf.state_dict().items()), sorted(back.state_dict().items())):
            assert n1 == n2 and torch.equal(p1, p2), n1
        # The model object's save_hf writes the same checkpoint.
        model = riftco.load_hf_llama(tmp_path / case)
        model.save_hf(tmp_path / f"{case}-method")
        assert ((tmp_path / f"{case}-method" / "model.safetensors").read_bytes() ==
                (tmp_path / f"{case}-back" / "model.safetensors").read_bytes())


@pytest.mark.parametrize("field,overrides", [
    ("rope_scaling", dict(rope_scaling={"type": "linear", "factor": 2.0})),
    ("attention_bias", dict(attention_bias=True)),
    ("mlp_bias", dict(mlp_bias=True)),
    ("hidden_act", dict(hidden_act="gelu")),
])
def test_unsupported_configs_are_refused_naming_the_field(tmp_path, field, overrides):
    build_hf(tmp_path / "hf", dict(num_attention_heads=4, num_key_value_heads=2, **overrides))
    with pytest.raises(riftco.ModelStateError, match=field):
        riftco.convert_from_hf(tmp_path / "hf", tmp_path / "model.safetensors")
    assert not (tmp_path / "model.safetensors").exists()


def test_lora_post_training_with_block_checkpointing_on_a_converted_gqa_model(tmp_path):
    build_hf(tmp_path / "hf", CONFIGS["gqa"])
    riftco.convert_from_hf(tmp_path / "hf", tmp_path / "model.safetensors")
    tokens, targets = batch(BASE["vocab_size"], b=4, t=16, seed=5)

    def adapted(policy):
        model = riftco.load_model(tmp_path / "model.safetensors", activation_checkpointing=policy)
        model.add_lora(rank=4, alpha=8.0, targets=["query", "key", "value", "output", "down"], seed=7)
        model.set_base_trainable(False)
        return model

    plain, blocked = adapted("disabled"), adapted("block")
    shapes = dict((n, p.shape) for n, p in blocked.lora_parameters())
    assert shapes["blocks.0.attention.key.lora_b"] == (16, 4)  # 2 key/value heads of width 8
    opt = riftco.Adam(blocked.trainable_parameters(), learning_rate=1e-2)
    reference = riftco.Adam(plain.trainable_parameters(), learning_rate=1e-2)
    losses = []
    for step in range(6):
        for model, o in ((plain, reference), (blocked, opt)):
            o.zero_grad()
            loss = model.loss(tokens, targets)
            loss.backward()
            if model is blocked:
                losses.append(loss.item())
        for (n1, p1), (n2, p2) in zip(plain.lora_parameters(), blocked.lora_parameters()):
            assert n1 == n2 and np.array_equal(p1.grad, p2.grad), (step, n1)  # bit-identical
        reference.step()
        opt.step()
    assert losses[-1] < losses[0] - 0.05, losses


def test_post_training_pipeline_on_a_converted_model(build_dir, tmp_path):
    """rt-convert, then rt-train post-train (LoRA on query/key/value, block checkpointing) on the result."""
    convert, train = build_dir / "rt-convert", build_dir / "rt-train"
    if not convert.exists() or not train.exists():
        pytest.skip("rt-convert / rt-train not built")
    build_hf(tmp_path / "hf", dict(CONFIGS["gqa_tied_sharded"], vocab_size=256), shard=True)  # byte tokens
    r = subprocess.run([str(convert), "--from-hf", str(tmp_path / "hf"), "--output", str(tmp_path / "base.safetensors")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    chat = pathlib.Path(__file__).resolve().parents[2] / "data" / "chat_example.jsonl"
    r = subprocess.run([str(train), "post-train", "--base-model", str(tmp_path / "base.safetensors"), "--data",
                        str(chat), "--steps", "4", "--batch", "2", "--sequence-length", "24", "--eval-batches", "1",
                        "--lora-rank", "4", "--lora-targets", "query,key,value", "--activation-checkpointing", "block",
                        "--output", str(tmp_path / "post"), "--quiet"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "post" / "adapter.safetensors").exists()


def test_rt_convert_tool(build_dir, tmp_path):
    tool = build_dir / "rt-convert"
    if not tool.exists():
        pytest.skip(f"{tool} not built")
    build_hf(tmp_path / "hf", CONFIGS["gqa"])
    run = subprocess.run([str(tool), "--from-hf", str(tmp_path / "hf"), "--output", str(tmp_path / "m.safetensors")],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    run = subprocess.run([str(tool), "--to-hf", str(tmp_path / "m.safetensors"), "--output", str(tmp_path / "back")],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "back" / "config.json").exists() and (tmp_path / "back" / "model.safetensors").exists()
    usage = subprocess.run([str(tool), "--output", "x"], capture_output=True, text=True)
    assert usage.returncode == 2 and "--from-hf" in usage.stderr
    both = subprocess.run([str(tool), "--from-hf", "a", "--to-hf", "b", "--output", "x"], capture_output=True, text=True)
    assert both.returncode == 2
    missing = subprocess.run([str(tool), "--from-hf", str(tmp_path / "nope"), "--output", str(tmp_path / "x")],
                             capture_output=True, text=True)
    assert missing.returncode == 1 and "rt-convert: error: " in missing.stderr and "nope" in missing.stderr


def test_rt_convert_reads_a_config_file_as_the_other_tools_do(build_dir, tmp_path):
    tool = build_dir / "rt-convert"
    if not tool.exists():
        pytest.skip(f"{tool} not built")
    build_hf(tmp_path / "hf", CONFIGS["gqa"])
    config = tmp_path / "convert.toml"
    config.write_text(f'from-hf = "{tmp_path / "hf"}"\noutput = "{tmp_path / "m.safetensors"}"\n')
    run = subprocess.run([str(tool), "--config", str(config)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "m.safetensors").exists()
    # The command line wins over the file; one direction from each is refused.
    run = subprocess.run([str(tool), "--config", str(config), "--output", str(tmp_path / "n.safetensors")],
                         capture_output=True, text=True)
    assert run.returncode == 0 and (tmp_path / "n.safetensors").exists(), run.stderr
    run = subprocess.run([str(tool), "--config", str(config), "--to-hf", str(tmp_path / "m.safetensors")],
                         capture_output=True, text=True)
    assert run.returncode == 2 and "not both" in run.stderr, run.stderr
    no_output = tmp_path / "no_output.toml"
    no_output.write_text(f'from-hf = "{tmp_path / "hf"}"\n')
    run = subprocess.run([str(tool), "--config", str(no_output)], capture_output=True, text=True)
    assert run.returncode == 2 and "--output PATH is required" in run.stderr, run.stderr
