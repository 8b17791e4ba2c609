"""Crash safety: rt-train killed with SIGKILL at random moments (in a step, in
a checkpoint save, in the final switch of the run directory), then resumed,
ends byte-identical to an uninterrupted run, with no temporary files left and
a directory that is complete. RIFTCO_KILL_TRIALS sets the number of trials
(default 20); the delays come from a seeded generator, so a failure repeats,
and are drawn within the fastest of three uninterrupted runs (and of any
later run that ended before its kill: the load may drop after the timing
runs), so that most kills land whatever the machine's load."""
import os
import pathlib
import random
import signal
import subprocess
import time

import pytest

TRIALS = int(os.environ.get("RIFTCO_KILL_TRIALS", "20"))
STEPS = 40


def tiny_args(corpus, out):
    return ["pretrain", "--data", str(corpus), "--steps", str(STEPS), "--checkpoint-interval", "1",
            "--context-length", "32", "--model-width", "16", "--heads", "2", "--layers", "2",
            "--feed-forward-width", "32", "--batch", "2", "--sequence-length", "16", "--eval-batches", "1",
            "--eval-interval", "4", "--output", str(out), "--quiet"]


def env():
    e = dict(os.environ)
    e["OMP_NUM_THREADS"] = "2"
    return e


@pytest.fixture(scope="module")
def setup(build_dir, tmp_path_factory):
    tool = build_dir / "rt-train"
    if not tool.exists():
        pytest.skip("rt-train not built")
    base = tmp_path_factory.mktemp("crash")
    corpus = base / "corpus.txt"
    corpus.write_text("".join(f"line {i % 13} of a corpus for a crash test.\n" for i in range(400)))
    reference = base / "reference"
    fastest = float("inf")
    for attempt in range(3):
        out = reference if attempt == 0 else base / f"timing{attempt}"
        start = time.monotonic()
        r = subprocess.run([str(tool), *tiny_args(corpus, out)], capture_output=True, text=True, env=env(),
                           timeout=300)
        fastest = min(fastest, time.monotonic() - start)
        assert r.returncode == 0, r.stderr
    return tool, corpus, reference, fastest, base


def temporaries(directory):
    return [p.name for p in pathlib.Path(directory).iterdir() if ".tmp." in p.name or p.name == ".write_probe"]


def test_kill_9_at_random_moments_then_resume_is_byte_identical(setup):
    tool, corpus, reference, seconds, base = setup
    want = (reference / "model.safetensors").read_bytes()
    want_losses = [line.split('"loss":')[1].split(",")[0]
                   for line in (reference / "metrics.jsonl").read_text().splitlines()]
    rng = random.Random(20261130)
    kills = 0
    for trial in range(TRIALS):
        out = base / f"trial{trial}"
        resume = False
        for _ in range(rng.randint(1, 3)):  # one to three kills per trial
            args = tiny_args(corpus, out) + (["--resume"] if resume else [])
            if resume and (out / "metadata.json").exists() and not (out / "training_checkpoint.safetensors").exists():
                break  # it completed before the kill landed
            p = subprocess.Popen([str(tool), *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env())
            started = time.monotonic()
            deadline = started + rng.uniform(0.0, seconds * 0.9)
            while p.poll() is None and time.monotonic() < deadline:
                time.sleep(0.005)
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                kills += 1
            elif not resume:
                # A whole run ended before its kill: the machine got faster
                # since the timing runs (their load went away), so later
                # delays are drawn within this run's time.
                seconds = min(seconds, time.monotonic() - started)
            p.wait()
            resume = True
        done = (out / "metadata.json").exists() and not (out / "training_checkpoint.safetensors").exists()
        if not done:
            r = subprocess.run([str(tool), *tiny_args(corpus, out), "--resume"], capture_output=True, text=True,
                               env=env(), timeout=300)
            assert r.returncode == 0, (trial, r.stderr)
        assert (out / "model.safetensors").read_bytes() == want, f"trial {trial}: the model differs"
        losses = [line.split('"loss":')[1].split(",")[0] for line in (out / "metrics.jsonl").read_text().splitlines()]
        assert losses == want_losses, f"trial {trial}: the loss log differs"
        assert (out / "metadata.json").exists()
        assert not (out / "training_checkpoint.safetensors").exists()
        assert not (out / "metrics.partial.jsonl").exists()
        assert temporaries(out) == [], f"trial {trial}: {temporaries(out)}"
    print(f"[crash-safety] {kills} kills landed in {TRIALS} trials; every trial resumed byte-identical")
    assert kills >= TRIALS // 2, f"only {kills} kills landed: the runs finish too fast for the delays"
