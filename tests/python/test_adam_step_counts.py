"""Adam bias-corrects each parameter by its own update count, as
torch.optim.Adam keeps state[p]['step'] per parameter: a parameter that has
no gradient at some steps (a branch a loss does not reach, an adapter
switched off) follows PyTorch's trajectory, not one corrected by the
optimizer-wide count."""
import numpy as np
import pytest

from riftco_import import import_riftco

riftco = import_riftco()

STEPS = 6
REACHES_B = {0, 3, 4}  # the steps whose loss also reaches b


def ours(lr, weight_decay):
    rng = np.random.default_rng(0)
    a0, b0 = rng.normal(size=(3, 4)), rng.normal(size=(4, 2))
    x0 = rng.normal(size=(2, 3))
    a = riftco.Variable(a0.astype(np.float32), requires_grad=True, name="a")
    b = riftco.Variable(b0.astype(np.float32), requires_grad=True, name="b")
    x = riftco.Variable(x0.astype(np.float32))
    opt = riftco.Adam([a, b], learning_rate=lr, weight_decay=weight_decay)
    for step in range(STEPS):
        opt.zero_grad()
        h = riftco.matmul(x, a)
        loss = riftco.sum(riftco.mul(h, h))
        if step in REACHES_B:
            loss = riftco.add(loss, riftco.sum(riftco.matmul(h, b)))
        loss.backward()
        opt.step()
    return opt, a.numpy(), b.numpy(), (a0, b0, x0)


def test_each_parameter_counts_its_own_updates():
    opt, _, _, _ = ours(1e-2, 0.0)
    assert opt.step_count == STEPS
    assert opt.parameter_step_counts == [STEPS, len(REACHES_B)]


def test_a_parameter_skipped_at_some_steps_matches_torch_adam():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (Debian: python3-torch)")
    for lr, weight_decay in ((1e-2, 0.0), (3e-2, 0.1)):
        opt, a_ours, b_ours, (a0, b0, x0) = ours(lr, weight_decay)
        a = torch.tensor(a0, dtype=torch.float64, requires_grad=True)
        b = torch.tensor(b0, dtype=torch.float64, requires_grad=True)
        x = torch.tensor(x0, dtype=torch.float64)
        reference = torch.optim.AdamW([a, b], lr=lr, weight_decay=weight_decay, eps=1e-8)
        for step in range(STEPS):
            reference.zero_grad(set_to_none=True)
            h = x @ a
            loss = (h * h).sum()
            if step in REACHES_B:
                loss = loss + (h @ b).sum()
            loss.backward()
            reference.step()
        assert [int(reference.state[p]["step"]) for p in (a, b)] == opt.parameter_step_counts
        np.testing.assert_allclose(a_ours, a.detach().numpy(), rtol=0, atol=2e-5)
        np.testing.assert_allclose(b_ours, b.detach().numpy(), rtol=0, atol=2e-5)
        # An optimizer-wide count would have moved b differently: the check can fail.
        assert np.abs(b.detach().numpy() - b0).max() > 1e-3
