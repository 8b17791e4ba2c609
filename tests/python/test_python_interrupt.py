"""Ctrl-C stops a long generate, generate_samples or evaluate within moments
(a KeyboardInterrupt between tokens or batches), as it stops a training run,
instead of once the whole call has returned: the computation releases the
GIL, so Python's handler could not run until then."""
import signal
import subprocess
import sys
import time

import pytest

from riftco_import import import_riftco

riftco = import_riftco()

CHILD = r"""
import sys, time
import numpy as np
import riftco
what = sys.argv[1]
if what == "generate":  # one call of ~30 s: 4000 tokens of a 16-layer model
    config = riftco.TransformerConfig(vocab_size=256, context_length=4096, model_width=256, heads=4, layers=16,
                                      feed_forward_width=512)
else:
    config = riftco.TransformerConfig(vocab_size=256, context_length=2048, model_width=32, heads=4, layers=2,
                                      feed_forward_width=64)
model = riftco.DecoderOnlyTransformer(config, seed=1)
model.training = True
print("started", flush=True)
start = time.monotonic()
try:
    if what == "generate_samples":
        model.generate_samples("a", num_samples=60000, max_new_tokens=2000, temperature=1.0)
    elif what == "generate":
        model.generate("a", max_new_tokens=4000, temperature=1.0)
    else:
        riftco.evaluate(model, "riftco " * 2000000, batch=1, sequence_length=64)
except KeyboardInterrupt:
    print(f"interrupted after {time.monotonic() - start:.2f} s", flush=True)
    print("training", model.training, flush=True)
    sys.exit(0)
print("finished", flush=True)
"""


@pytest.mark.parametrize("what", ["generate_samples", "generate", "evaluate"])
def test_ctrl_c_stops_a_long_call_with_keyboard_interrupt(what):
    child = subprocess.Popen([sys.executable, "-c", CHILD, what], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout.readline().strip() == "started", child.stderr.read()
        time.sleep(1.0)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=30)  # the whole call would take many minutes
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, err
    assert "interrupted after" in out, out + err
    seconds = float(out.split("interrupted after ")[1].split()[0])
    assert seconds < 10.0, out  # signalled after 1 s; uninterrupted, each call runs ~30 s or far longer
    if what == "evaluate":
        assert "training True" in out  # evaluate (which evaluates in eval mode) restored the mode it found
