"""Two Python threads on one model: one computes with the GIL released
(generate, backward and Adam.step, save), the other replaces values, names
or flags of the model's variables. Before: heap corruption within seconds
(free(): corrupted unsorted chunks, SIGSEGV, shapes read from freed memory).
Each case runs in its own interpreter, so a crash fails the test instead of
ending the session."""
import subprocess
import sys
import textwrap

import pytest

from riftco_import import import_riftco

riftco = import_riftco()

SCRIPT = textwrap.dedent("""
    import sys, threading, time, tempfile, os
    import riftco
    mode, seconds = sys.argv[1], float(sys.argv[2])
    model = riftco.DecoderOnlyTransformer(riftco.TransformerConfig(
        vocab_size=256, context_length=32, model_width=16, heads=2, layers=2, feed_forward_width=32), seed=1)
    params = model.parameters()
    values = [p.numpy().copy() for p in params]
    tmp = tempfile.mkdtemp()
    model.save(os.path.join(tmp, "m.safetensors"))
    stop = time.time() + seconds
    errors = []

    def reader():
        adam = riftco.Adam(model.trainable_parameters(), learning_rate=1e-3)
        while time.time() < stop:
            try:
                if mode == "generate":
                    model.generate([1, 2], max_new_tokens=4, seed=1)
                elif mode == "grads":  # steps while the other thread runs backward and drops gradients
                    adam.step()
                elif mode == "train":
                    model.loss([1, 2, 3], [2, 3, 4]).backward()
                    adam.step()
                else:
                    model.save(os.path.join(tmp, "r.safetensors"))
            except riftco.Error as e:  # a stale graph or session is a fine answer
                errors.append(type(e).__name__)

    def writer():
        i = 0
        while time.time() < stop:
            if mode == "grads":
                model.loss([1, 2, 3], [2, 3, 4]).backward()
                for p in params:
                    p.clear_grad()
                i += 1
                continue
            if mode == "save" and i % 2:
                model.load_state(os.path.join(tmp, "m.safetensors"))
            else:
                params[i % len(params)].set_value(values[i % len(params)])
            params[i % len(params)].name = params[i % len(params)].name
            i += 1

    threads = [threading.Thread(target=reader), threading.Thread(target=writer)]
    for t in threads: t.start()
    for t in threads: t.join()
    print("ok", len(errors))
""")


@pytest.mark.parametrize("mode", ["generate", "train", "save", "grads"])
def test_changing_variables_while_another_thread_computes_never_corrupts_memory(tmp_path, mode):
    script = tmp_path / "race.py"
    script.write_text(SCRIPT)
    r = subprocess.run([sys.executable, str(script), mode, "3"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.startswith("ok"), (r.returncode, r.stdout, r.stderr[-2000:])


def test_a_change_from_inside_a_computation_of_the_same_thread_is_refused():
    # A checkpoint function that replaces a variable while backward replays it:
    # a riftco.ValueError (or the checkpoint contract's error), never a deadlock.
    w = riftco.Variable([1.0, 1.0, 1.0], requires_grad=True, name="w")
    other = riftco.Variable([0.0], name="other")
    calls = []

    def fn(x):
        calls.append(1)
        if len(calls) > 1:  # in the replay, inside backward
            other.set_value([1.0])
        return x * w

    x = riftco.Variable([1.0, 2.0, 3.0], requires_grad=True)
    y = riftco.checkpoint(x, [w], fn)
    with pytest.raises(riftco.ValueError, match=r"\[set_value\] called from code that runs inside a forward, backward"):
        riftco.sum(y).backward()


def test_a_checkpoint_function_may_change_variables_it_made_itself_when_replayed():
    # A device-agnostic mask made and moved inside the function: fine at the
    # forward, and at the replay inside backward too.
    w = riftco.Variable([1.0, 2.0, 3.0], requires_grad=True, name="w")

    def fn(x):
        mask = riftco.Variable([1.0, 0.0, 1.0])
        mask.to(x.backend)
        mask.name = "mask"
        mask.set_value([1.0, 1.0, 0.0])
        return x * w * mask

    x = riftco.Variable([1.0, 2.0, 3.0], requires_grad=True)
    riftco.sum(riftco.checkpoint(x, [w], fn)).backward()
    assert list(x.grad) == [1.0, 2.0, 0.0]


DEADLOCK_SCRIPT = textwrap.dedent("""
    # A checkpoint function, replayed inside backward (or backward_and_step),
    # waits for another thread's riftco computation while a third thread's
    # change (set_value, Adam.step) waits for the lock. With the variables lock
    # held exclusively by backward_and_step, or preferring a waiting writer,
    # this hung (review of 2026-12-02); both must finish.
    import sys, threading, time
    from concurrent.futures import ThreadPoolExecutor
    import riftco
    mode = sys.argv[1]
    model = riftco.DecoderOnlyTransformer(riftco.TransformerConfig(
        vocab_size=256, context_length=32, model_width=16, heads=2, layers=2, feed_forward_width=32), seed=1)
    v = riftco.Variable([1.0], requires_grad=True)
    riftco.sum(v * v).backward()
    other = riftco.Adam([v])
    pool = ThreadPoolExecutor(1)
    w = riftco.Variable([1.0, 1.0, 1.0], requires_grad=True, name="w")
    def change():
        if mode == "set_value":
            model.parameters()[0].set_value(model.parameters()[0].numpy().copy())
        else:
            other.step()
    def fn(x):
        if riftco.checkpoint_replaying():
            if mode != "backward_and_step":
                writer = threading.Thread(target=change)
                writer.start()
                time.sleep(0.3)  # the change is waiting for the lock now
            pool.submit(lambda: model.forward([[1, 2, 3]])).result()
        return x * w
    x = riftco.Variable([1.0, 2.0, 3.0], requires_grad=True)
    loss = riftco.sum(riftco.checkpoint(x, [w], fn))
    if mode == "backward_and_step":
        riftco.Adam([w], learning_rate=1e-3).backward_and_step(loss)
    else:
        loss.backward()
    print("ok")
""")


@pytest.mark.parametrize("mode", ["backward_and_step", "set_value", "step"])
def test_a_checkpoint_function_may_wait_for_another_threads_computation(tmp_path, mode):
    script = tmp_path / "wait.py"
    script.write_text(DEADLOCK_SCRIPT)
    try:
        r = subprocess.run([sys.executable, str(script), mode], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{mode}: deadlocked (no answer in 60 s)")
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), (r.returncode, r.stdout, r.stderr[-2000:])


def test_a_step_from_inside_a_computation_is_refused():
    # Adam.step writes the weights in place; from inside a computation of this
    # thread (here a checkpoint function's replay) it is refused before
    # anything moves, as any change there is.
    w = riftco.Variable([1.0, 2.0], requires_grad=True, name="w")
    v = riftco.Variable([1.0], requires_grad=True)
    riftco.sum(v * v).backward()
    other = riftco.Adam([v], learning_rate=0.1)
    seen = []

    def fn(x):
        if riftco.checkpoint_replaying():
            try:
                other.step()
            except riftco.ValueError as e:
                seen.append(str(e))
        return x * w

    x = riftco.Variable([3.0, 4.0], requires_grad=True)
    riftco.sum(riftco.checkpoint(x, [w], fn)).backward()
    assert seen and "[Adam.step] called from code that runs inside" in seen[0], seen
    assert v.numpy()[0] == 1.0
