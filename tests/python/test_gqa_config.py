"""Grouped-query attention, the RoPE base and tied embeddings from Python:
TransformerConfig fields and their errors, the repeat_heads op, and models
built with them (parameters, decode == forward, save/load)."""
import numpy as np
import pytest

from riftco_import import import_riftco

riftco = import_riftco()

GQA = dict(vocab_size=64, context_length=16, model_width=32, heads=4, layers=2, feed_forward_width=48,
           key_value_heads=2, rope_base=500000.0, tie_embeddings=True)


def test_config_fields_defaults_and_errors():
    default = riftco.TransformerConfig()
    assert default.key_value_heads == 0 and default.kv_heads == default.heads
    assert default.rope_base == 10000.0 and default.tie_embeddings is False
    config = riftco.TransformerConfig(**GQA)
    assert config.kv_heads == 2 and config.rope_base == 500000.0 and config.tie_embeddings is True
    c, kv, f, v = 32, 16, 48, 64
    assert config.parameter_count() == v * c + c + 2 * (2 * c + 2 * c * c + 2 * kv * c + 3 * c * f)
    with pytest.raises(riftco.ValueError, match="key_value_heads 3"):
        riftco.TransformerConfig(**{**GQA, "key_value_heads": 3}).validate()
    with pytest.raises(riftco.ValueError, match="rope_base"):
        riftco.TransformerConfig(**{**GQA, "rope_base": 1.0}).validate()
    with pytest.raises(TypeError):
        riftco.TransformerConfig(tie_embeddings="yes")


def test_repeat_heads_forward_and_backward():
    x = riftco.Variable(np.arange(2 * 2 * 3 * 4, dtype=np.float32).reshape(2, 2, 3, 4), requires_grad=True)
    y = riftco.repeat_heads(x, 3)
    assert y.shape == (2, 6, 3, 4)
    out = y.numpy()
    for h in range(6):
        assert np.array_equal(out[:, h], x.numpy()[:, h // 3])
    riftco.sum(y).backward()
    assert np.array_equal(x.grad, np.full((2, 2, 3, 4), 3.0, dtype=np.float32))
    with pytest.raises(riftco.ShapeError):
        riftco.repeat_heads(riftco.Variable(np.zeros((2, 3), dtype=np.float32)), 2)


def test_gqa_tied_model_decodes_saves_and_loads(tmp_path):
    model = riftco.DecoderOnlyTransformer(riftco.TransformerConfig(**GQA), seed=3)
    names = [n for n, _ in model.named_parameters()]
    assert "lm_head.weight" not in names
    assert model.parameter("blocks.0.attention.key.weight").shape == (16, 32)
    tokens = np.array([[1, 5, 9, 2, 7, 3]], dtype=np.int32)
    full = model.forward(tokens).numpy()[0]
    session = riftco.DecodeSession(model)
    for t, token in enumerate(tokens[0]):
        np.testing.assert_allclose(session.decode_token(int(token)), full[t], atol=1e-5)
    model.save(tmp_path / "m.safetensors")
    assert riftco.read_model_config(tmp_path / "m.safetensors") == model.config
    again = riftco.load_model(tmp_path / "m.safetensors", attention="flash")
    np.testing.assert_allclose(again.forward(tokens).numpy()[0], full, atol=1e-5)
