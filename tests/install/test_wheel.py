"""The installed-wheel test (issue 13): build a wheel (or take RIFTCO_WHEEL),
install it into a fresh virtual environment with nothing but pip (numpy comes
from PyPI as its one dependency), and from a directory outside the source tree
import riftco, train one step and run examples/pretrain.py --steps 2."""
import os
import pathlib
import subprocess
import sys
import textwrap
import venv

ROOT = pathlib.Path(__file__).resolve().parents[2]


def run(*args, **kwargs):
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=900, **kwargs)
    assert r.returncode == 0, f"{args}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def wheel(tmp_path):
    given = os.environ.get("RIFTCO_WHEEL")
    if given:
        return pathlib.Path(given)
    out = tmp_path / "wheelhouse"
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", out, ROOT)
    return next(out.glob("riftco-*.whl"))


def test_wheel_installs_and_trains_outside_the_source_tree(tmp_path):
    whl = wheel(tmp_path)
    env_dir = tmp_path / "fresh-venv"
    venv.create(env_dir, with_pip=True, system_site_packages=False)
    python = env_dir / "bin" / "python"
    run(python, "-m", "pip", "install", "--disable-pip-version-check", "-q", whl)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["OMP_NUM_THREADS"] = env.get("OMP_NUM_THREADS", "2")
    script = textwrap.dedent("""
        import pathlib, numpy as np, riftco
        assert not pathlib.Path(riftco.__file__).is_relative_to(pathlib.Path(%r)), riftco.__file__
        assert (pathlib.Path(riftco.__file__).parent / "_core.pyi").exists()
        assert (pathlib.Path(riftco.__file__).parent / "py.typed").exists()
        model = riftco.DecoderOnlyTransformer(riftco.TransformerConfig(context_length=32, model_width=16, heads=2,
                                              layers=2, feed_forward_width=32), activation_checkpointing="block")
        opt = riftco.Adam(model.trainable_parameters(), learning_rate=1e-2)
        tokens = np.arange(32).reshape(2, 16) %% 256
        loss = model.loss(tokens, (tokens + 1) %% 256)
        loss.backward()
        opt.step()
        after = model.loss(tokens, (tokens + 1) %% 256).item()
        assert after < loss.item(), (after, loss.item())
        print("one step:", loss.item(), "->", after)
    """ % str(ROOT))
    r = run(python, "-c", script, cwd=elsewhere, env=env)
    assert "one step:" in r.stdout
    corpus = elsewhere / "corpus.txt"
    corpus.write_text("a small corpus for a small model.\n" * 200)
    r = run(python, ROOT / "examples" / "pretrain.py", "--steps", 2, "--data", corpus, "--output-dir",
            elsewhere / "run", "--context-length", 32, "--model-width", 16, "--heads", 2, "--layers", 2,
            "--feed-forward-width", 32, "--batch", 2, "--sequence-length", 16, "--eval-batches", 1,
            cwd=elsewhere, env=env)
    assert "step 2/2" in r.stdout  # plain progress lines: no tqdm in a fresh environment
    assert str(elsewhere / "run" / "model.safetensors") in r.stdout
    assert (elsewhere / "run" / "metadata.json").exists()
    assert not (elsewhere / "run" / "loss_curve.png").exists()  # no matplotlib here: the SVG only
    assert (elsewhere / "run" / "loss_curve.svg").exists()
