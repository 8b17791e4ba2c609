"""Gradient parity with PyTorch through the Python API: logits, loss and every
parameter gradient of riftco's model (computed here, in the package's
environment) against bench/torch_reference.py's model in float64. PyTorch
runs in this interpreter when it has it, else in Debian's /usr/bin/python3
(python3-torch) through tests/python/torch_side.py."""
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from riftco_import import import_riftco

riftco = import_riftco()
HERE = pathlib.Path(__file__).resolve().parent


def torch_outputs(model_path, arrays_path, out_path):
    try:
        import torch  # noqa: F401
    except ImportError:
        torch = None
    if torch is not None:
        sys.path.insert(0, str(HERE))
        import torch_side
        torch_side.main([str(model_path), str(arrays_path), str(out_path)])
        return
    system = pathlib.Path("/usr/bin/python3")
    probe = subprocess.run([str(system), "-c", "import torch"], capture_output=True) if system.exists() else None
    if probe is None or probe.returncode != 0:
        pytest.skip("PyTorch is not installed (Debian: python3-torch)")
    subprocess.run([str(system), str(HERE / "torch_side.py"), str(model_path), str(arrays_path), str(out_path)],
                   check=True, timeout=300)


@pytest.mark.parametrize("attention,policy", [("materialized", "disabled"), ("flash", "block"),
                                              ("flash", "segments"), ("materialized", "attention"),
                                              ("flash", "mlp")])
def test_logits_loss_and_every_gradient_match_pytorch(tmp_path, attention, policy):
    config = riftco.TransformerConfig(vocab_size=64, context_length=16, model_width=32, heads=4, layers=3,
                                      feed_forward_width=48)
    model = riftco.DecoderOnlyTransformer(config, attention=attention, activation_checkpointing=policy, seed=11)
    rng = np.random.default_rng(3)
    tokens = rng.integers(0, 64, size=(2, 12))
    targets = rng.integers(0, 64, size=(2, 12))
    targets[0, :3] = -100  # ignored positions
    logits = model(tokens).numpy().copy()
    loss = model.loss(tokens, targets)
    loss.backward()
    model.save(tmp_path / "model.safetensors")
    np.savez(tmp_path / "arrays.npz", tokens=tokens, targets=targets, norm_epsilon=model.norm_epsilon)
    torch_outputs(tmp_path / "model.safetensors", tmp_path / "arrays.npz", tmp_path / "torch.npz")
    ref = np.load(tmp_path / "torch.npz")

    np.testing.assert_allclose(logits, ref["logits"], atol=2e-5, rtol=0)
    assert abs(loss.item() - float(ref["loss"])) < 2e-5
    names = [n for n, _ in model.named_parameters()]
    assert sorted(names) == sorted(k[len("grad."):] for k in ref.files if k.startswith("grad."))
    for name, p in model.named_parameters():
        ours, theirs = p.grad, ref["grad." + name]
        scale = max(np.abs(theirs).max(), 1e-12)
        assert np.abs(ours - theirs).max() <= 1e-4 * scale + 1e-7, name
