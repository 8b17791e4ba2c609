"""The optimizer step fused into the backward pass from Python (issue 16):
Adam.backward_and_step(loss) against backward(retain_graph=False) + step(),
its refusals and riftco.PartialStepError; the stage configs'
optimizer_in_backward field, its pipeline runs (the same bits, recorded in
metadata.json) and refusals; rt-train --optimizer-in-backward."""
import json
import pathlib
import subprocess

import numpy as np
import pytest

from riftco_import import import_riftco

riftco = import_riftco()
ROOT = pathlib.Path(__file__).resolve().parents[2]
SHAPE = dict(vocab_size=256, context_length=64, model_width=32, heads=4, layers=2, feed_forward_width=64)
TOKENS = np.array([(i * 37 + 11) % 256 for i in range(32)], dtype=np.int32).reshape(2, 16)
TARGETS = np.array([(i * 53 + 7) % 256 for i in range(32)], dtype=np.int32).reshape(2, 16)


def model():
    return riftco.DecoderOnlyTransformer(riftco.TransformerConfig(**SHAPE), activation_checkpointing="block", seed=3)


def values(m):
    return [p.numpy().copy() for p in m.trainable_parameters()]


def test_backward_and_step_gives_the_bits_of_backward_then_step():
    plain, fused = model(), model()
    a = riftco.Adam(plain.trainable_parameters(), learning_rate=1e-2, max_grad_norm=0.0)
    b = riftco.Adam(fused.trainable_parameters(), learning_rate=1e-2, max_grad_norm=0.0)
    for _ in range(3):
        loss = plain.loss(TOKENS, TARGETS)
        loss.backward(retain_graph=False)
        norm_a = a.step()
        a.zero_grad()
        norm_b = b.backward_and_step(fused.loss(TOKENS, TARGETS))
        assert norm_a == norm_b
    assert b.step_count == 3
    for x, y in zip(values(plain), values(fused)):
        assert x.tobytes() == y.tobytes()
    assert all(p.grad is None for p in fused.trainable_parameters())  # freed inside the pass


def test_refusals_change_nothing():
    m = model()
    clipping = riftco.Adam(m.trainable_parameters(), max_grad_norm=1.0)
    with pytest.raises(riftco.ValueError, match=r"\[Adam::backward_and_step\] max_grad_norm is 1"):
        clipping.backward_and_step(m.loss(TOKENS, TARGETS))
    adam = riftco.Adam(m.trainable_parameters(), max_grad_norm=0.0)
    with pytest.raises(TypeError):
        adam.backward_and_step(None)
    head = next(p for p in m.trainable_parameters() if p.name == "lm_head.weight")
    poisoned = head.numpy().copy()
    poisoned[0, 0] = np.nan
    head.set_value(poisoned)
    before = values(m)
    with pytest.raises(riftco.ValueError, match=r"is not finite"):  # the first gradient: nothing moved
        adam.backward_and_step(m.loss(TOKENS, TARGETS))
    assert adam.step_count == 0
    for x, y in zip(before, values(m)):
        assert x.tobytes() == y.tobytes()


def test_a_failure_after_the_first_update_is_a_partial_step_error():
    # `a` (reached first) steps; W's gradient, x^T 1 = 4e38, overflows to inf.
    x = riftco.Variable(np.array([[2e38], [2e38]], dtype=np.float32))
    w = riftco.Variable(np.array([[1e-30]], dtype=np.float32), requires_grad=True, name="w")
    a = riftco.Variable(np.array([1.0], dtype=np.float32), requires_grad=True, name="a")
    far = riftco.sum(riftco.matmul(x, w))
    loss = riftco.add(far, riftco.sum(a))
    assert np.isfinite(loss.item())
    adam = riftco.Adam([a, w], max_grad_norm=0.0)
    with pytest.raises(riftco.PartialStepError, match=r"failed after updating 1 of 2 parameters.*'w'.*not finite"):
        adam.backward_and_step(loss)
    assert issubclass(riftco.PartialStepError, riftco.Error)
    assert "PartialStepError" in riftco.__all__
    assert a.numpy()[0] != 1.0 and w.numpy()[0, 0] == np.float32(1e-30)


def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("".join(f"the quick brown fox {i % 7} jumps over the lazy dog.\n" for i in range(200)))
    return path


def pretraining(tmp_path, name, **kwargs):
    kwargs.setdefault("max_grad_norm", 0.0)
    return riftco.PretrainingConfig(model=riftco.TransformerConfig(**SHAPE), data=str(corpus(tmp_path)), steps=3,
                                    batch=2, sequence_length=32, eval_interval=0, eval_batches=1,
                                    checkpoint_interval=0, output_dir=str(tmp_path / name), **kwargs)


@pytest.mark.parametrize("cls", [riftco.PretrainingConfig, riftco.PostTrainingConfig])
def test_the_config_field(cls):
    assert cls().optimizer_in_backward is False
    assert "optimizer_in_backward" in cls.fields
    c = cls(optimizer_in_backward=True)
    assert c.optimizer_in_backward is True and c.to_dict()["optimizer_in_backward"] is True
    with pytest.raises(TypeError, match=r"optimizer_in_backward"):
        cls(optimizer_in_backward="yes")


def test_a_run_with_it_gives_the_same_bits_and_records_it(tmp_path):
    for on in (False, True):
        result = riftco.pretrain(pretraining(tmp_path, f"on_{on}", optimizer_in_backward=on), plot=False)
        assert result.completed
        meta = json.loads((tmp_path / f"on_{on}" / "metadata.json").read_text())
        assert meta["config"]["optimizer_in_backward"] is on
    assert (tmp_path / "on_True" / "model.safetensors").read_bytes() == \
        (tmp_path / "on_False" / "model.safetensors").read_bytes()


@pytest.mark.parametrize("kwargs, needle", [
    (dict(max_grad_norm=1.0), r"optimizer_in_backward .* set max_grad_norm to 0"),
    (dict(gradient_accumulation_steps=2), r"optimizer_in_backward .* set gradient_accumulation_steps to 1"),
])
def test_refused_runs_write_nothing(tmp_path, kwargs, needle):
    with pytest.raises(riftco.ValueError, match=needle):
        riftco.pretrain(pretraining(tmp_path, "run", optimizer_in_backward=True, **kwargs), plot=False)
    assert not (tmp_path / "run").exists()
    post = riftco.PostTrainingConfig(base_model=str(tmp_path / "missing.safetensors"),
                                     data=str(tmp_path / "missing.jsonl"), output_dir=str(tmp_path / "post"),
                                     optimizer_in_backward=True, **{"max_grad_norm": 0.0, **kwargs})
    with pytest.raises(riftco.ValueError, match=needle):  # before the missing files are read
        riftco.post_train(post, plot=False)
    assert not (tmp_path / "post").exists()


def test_rt_train_flag(build_dir, tmp_path):
    train = build_dir / "rt-train"
    if not train.exists():
        pytest.skip("rt-train not built")
    tiny = ["--data", corpus(tmp_path), "--context-length", "64", "--model-width", "16", "--heads", "2",
            "--layers", "2", "--feed-forward-width", "32", "--batch", "2", "--sequence-length", "32",
            "--eval-batches", "1", "--steps", "2", "--quiet"]
    run = lambda *args: subprocess.run([str(train), "pretrain", *map(str, args)], capture_output=True, text=True,
                                       timeout=300)
    assert "--optimizer-in-backward" in run("--help").stdout
    out = tmp_path / "fused"
    r = run(*tiny, "--optimizer-in-backward", "--max-grad-norm", "0", "--output", out)
    assert r.returncode == 0, r.stderr
    assert "optimizer in backward" in r.stderr
    assert json.loads((out / "metadata.json").read_text())["config"]["optimizer_in_backward"] is True
    plain = tmp_path / "plain"
    assert run(*tiny, "--max-grad-norm", "0", "--output", plain).returncode == 0
    assert (out / "model.safetensors").read_bytes() == (plain / "model.safetensors").read_bytes()
    # metadata.json replays it.
    replay = tmp_path / "replay"
    r = run("--config", out / "metadata.json", "--output", replay, "--quiet")
    assert r.returncode == 0, r.stderr
    assert (replay / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()
    refused = tmp_path / "refused"
    r = run(*tiny, "--optimizer-in-backward", "--output", refused)
    assert r.returncode != 0 and "set max_grad_norm to 0" in r.stderr, r.stderr
    assert not refused.exists()
