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
        # An optimizer-wide count (riftco before 2026-12-02) ends elsewhere,
        # far outside the tolerance above: the comparison can fail.
        wrong = reference_with_optimizer_count(lr, weight_decay, a0, b0, x0)
        assert np.abs(wrong - b.detach().numpy()).max() > 1e-3


def reference_with_optimizer_count(lr, weight_decay, a0, b0, x0, beta1=0.9, beta2=0.999, eps=1e-8):
    """AdamW in float64 with every parameter bias-corrected by the optimizer's step count; returns b."""
    a, b = a0.copy(), b0.copy()
    m = [np.zeros_like(a), np.zeros_like(b)]
    v = [np.zeros_like(a), np.zeros_like(b)]
    for step in range(STEPS):
        h = x0 @ a
        grads = [x0.T @ (2 * h + (np.ones((2, 2)) @ b.T if step in REACHES_B else 0)), None]
        if step in REACHES_B:
            grads[1] = h.T @ np.ones((2, 2))
        for i, (p, g) in enumerate(zip((a, b), grads)):
            if g is None:
                continue
            p *= 1 - lr * weight_decay
            m[i] = beta1 * m[i] + (1 - beta1) * g
            v[i] = beta2 * v[i] + (1 - beta2) * g * g
            t = step + 1  # the optimizer's count, whatever the parameter had
            p -= lr * (m[i] / (1 - beta1 ** t)) / (np.sqrt(v[i] / (1 - beta2 ** t)) + eps)
    return b
