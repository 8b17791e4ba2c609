"""Golden end-to-end check: our saved weights in an equivalent PyTorch model give
the same logits, loss and gradients (tolerance: 2e-5 absolute on logits and
loss, 1e-4 relative to each gradient's max magnitude)."""
import json
import subprocess

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (Debian: python3-torch with /usr/bin/python3)")
from torch_reference import Transformer, read_safetensors  # noqa: E402


@pytest.mark.parametrize("attention,policy", [("materialized", "disabled"), ("flash", "block"),
                                              ("materialized", "segments"), ("flash", "attention"),
                                              ("materialized", "mlp")])
def test_matches_pytorch(build_dir, tmp_path, attention, policy):
    tool = build_dir / "tests" / "rt-parity-dump"
    if not tool.exists():
        pytest.skip(f"{tool} not built")
    subprocess.run([str(tool), str(tmp_path), attention, policy], check=True)
    params, meta = read_safetensors(tmp_path / "model.safetensors")
    outputs, _ = read_safetensors(tmp_path / "outputs.safetensors")
    batch = json.loads((tmp_path / "batch.json").read_text())
    dims = json.loads(meta["dimensions"])
    assert "activation_checkpointing" not in meta  # policy is not architecture

    torch.manual_seed(0)
    model = Transformer(norm_epsilon=batch["norm_epsilon"], **dims).double()
    model.load_riftco({k: v.astype(np.float64) for k, v in params.items()})
    b = batch["batch"]
    tokens = torch.tensor(batch["tokens"]).view(b, -1)
    targets = torch.tensor(batch["targets"]).view(b, -1)
    logits = model(tokens)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                             ignore_index=-100)
    loss.backward()

    np.testing.assert_allclose(outputs["logits"], logits.detach().numpy(), atol=2e-5, rtol=0)
    assert abs(float(outputs["loss"]) - loss.item()) < 2e-5
    for name, p in model.riftco_named_parameters():
        ours = outputs["grad." + name]
        ref = p.grad.numpy()
        scale = max(np.abs(ref).max(), 1e-12)
        assert np.abs(ours - ref).max() <= 1e-4 * scale + 1e-7, name
