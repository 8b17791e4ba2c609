"""Model transfer from Python (issue 18): model.to() and model.backend, and
activation offload on a cuda model. The CPU parts run everywhere; the CUDA
parts skip, saying why, without a usable CUDA device (the CPU-only build's
refusal is tested instead). Offload on the CPU: test_activation_offload.py."""
import numpy as np
import pytest

from riftco_import import import_riftco

riftco = import_riftco()
SHAPE = dict(vocab_size=256, context_length=32, model_width=16, heads=2, layers=3, feed_forward_width=32)
HAS_CUDA = "cuda" in riftco.available_backends()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="no usable CUDA device in this build/machine")


def model(**kwargs):
    return riftco.DecoderOnlyTransformer(riftco.TransformerConfig(**SHAPE), seed=5, activation_checkpointing="block",
                                         **kwargs)


def batch():
    tokens = np.arange(2 * 12).reshape(2, 12) * 37 % 256
    return tokens, (tokens * 7 + 1) % 256


def grads(m):
    tokens, targets = batch()
    loss = m.loss(tokens, targets)
    loss.backward()
    return float(loss.item()), [p.grad.copy() for p in m.trainable_parameters()]


def test_to_the_current_backend_changes_nothing():
    m = model()
    assert m.backend == "cpu"
    tokens, targets = batch()
    loss = m.loss(tokens, targets)
    session = riftco.DecodeSession(m)
    session.decode_token(3)
    assert m.to("cpu") is m and m.backend == "cpu"
    loss.backward()  # not stale: nothing moved
    session.decode_token(4)


@pytest.mark.skipif(HAS_CUDA, reason="this build has a usable CUDA device (test_to_cuda_... covers it)")
def test_to_cuda_without_a_device_is_a_backend_error_and_moves_nothing():
    m = model()
    tokens, targets = batch()
    loss = m.loss(tokens, targets)
    before = [p.numpy().copy() for p in m.parameters()]
    with pytest.raises(riftco.BackendError, match="cuda"):
        m.to("cuda")
    assert m.backend == "cpu"
    loss.backward()  # the earlier graph is not stale
    for want, p in zip(before, m.parameters()):
        np.testing.assert_array_equal(p.numpy(), want)


@needs_cuda
def test_to_cuda_makes_earlier_graphs_and_sessions_stale_and_matches_the_cpu():
    m = model()
    cpu_loss, cpu_grads = grads(m)
    for p in m.trainable_parameters():
        p.zero_grad()
    tokens, targets = batch()
    loss = m.loss(tokens, targets)
    session = riftco.DecodeSession(m)
    session.decode_token(3)
    assert m.to("cuda") is m and m.backend == "cuda"
    with pytest.raises(riftco.StaleGraphError):
        loss.backward()
    with pytest.raises(riftco.StaleGraphError):
        session.decode_token(4)
    cuda_loss, cuda_grads = grads(m)
    assert abs(cuda_loss - cpu_loss) <= 1e-4 * abs(cpu_loss)
    for c, g in zip(cpu_grads, cuda_grads):
        np.testing.assert_allclose(g, c, rtol=1e-3, atol=1e-4 * float(np.abs(c).max()))
    assert m.to("cpu").backend == "cpu"


@needs_cuda
def test_offload_on_cuda_gives_the_same_gradient_bits():
    plain = model().to("cuda")
    want_loss, want = grads(plain)
    offloaded = model(activation_offload=True).to("cuda")
    got_loss, got = grads(offloaded)
    assert got_loss == want_loss
    for w, g in zip(want, got):
        np.testing.assert_array_equal(g, w)
