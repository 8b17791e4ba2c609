"""The Python API (issue 13): the spec's snippet verbatim, the documented
errors, configs, Variables and numpy, checkpoint(), graph lifetime, files,
decoding, memory statistics, Ctrl-C during a pipeline, and riftco.plot."""
import gc
import json
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from riftco_import import import_riftco

riftco = import_riftco()
ROOT = pathlib.Path(__file__).resolve().parents[2]
TINY = dict(vocab_size=256, context_length=32, model_width=16, heads=2, layers=2, feed_forward_width=32)


def tiny_model(**kwargs):
    return riftco.DecoderOnlyTransformer(riftco.TransformerConfig(**TINY), seed=kwargs.pop("seed", 1), **kwargs)


def batch(seed=0, b=2, t=12):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 256, size=(b, t))
    return tokens, np.roll(tokens, -1, axis=1)


def test_spec_snippet_runs_as_written():
    from riftco import DecoderOnlyTransformer, TransformerConfig, PretrainingConfig, PostTrainingConfig
    config = TransformerConfig(vocab_size=256, context_length=128, model_width=128, heads=4, layers=4,
                               feed_forward_width=344)
    model = DecoderOnlyTransformer(config, attention="flash", activation_checkpointing="block").to("cpu")
    assert model.activation_checkpointing == "block"
    model.set_activation_checkpointing("disabled")
    PretrainingConfig(attention="flash", activation_checkpointing="block")
    PostTrainingConfig(fine_tuning_method="lora", activation_checkpointing="block")
    # What the snippet set is what the objects hold.
    assert model.activation_checkpointing == "disabled"
    assert model.attention == "flash"
    assert PretrainingConfig(attention="flash", activation_checkpointing="block").activation_checkpointing == "block"
    assert PostTrainingConfig(fine_tuning_method="lora").fine_tuning_method == "lora"


def test_policy_is_a_settable_property_and_seed_and_epsilon_are_keywords():
    model = tiny_model(attention="materialized", norm_epsilon=1e-6, seed=7)
    assert model.norm_epsilon == 1e-6
    model.activation_checkpointing = "segments"
    assert model.activation_checkpointing == "segments"
    same = tiny_model(seed=7)
    other = tiny_model(seed=8)
    assert np.array_equal(model.parameters()[0].numpy(), same.parameters()[0].numpy())
    assert not np.array_equal(model.parameters()[0].numpy(), other.parameters()[0].numpy())


@pytest.mark.parametrize("backend", ["cuda", "metal"])
def test_absent_backend_is_a_backend_error_naming_what_the_build_has(backend):
    if backend in riftco.available_backends():
        pytest.skip(f"this build has a usable {backend} device (tests/python/test_model_transfer.py covers it)")
    model = tiny_model()
    with pytest.raises(riftco.BackendError) as e:
        model.to(backend)
    assert backend in str(e.value) and "'cpu'" in str(e.value)
    assert isinstance(e.value, riftco.Error) and isinstance(e.value, RuntimeError)
    assert model.to("cpu") is model  # and the model still works
    assert backend not in riftco.available_backends()


@pytest.mark.parametrize("make,accepted", [
    (lambda m: m.set_activation_checkpointing("blocks"), ["'disabled'", "'block'", "'segments'", "'attention'", "'mlp'"]),
    (lambda m: setattr(m, "activation_checkpointing", "on"), ["'disabled'", "'block'", "'segments'", "'attention'", "'mlp'"]),
    (lambda m: riftco.DecoderOnlyTransformer(riftco.TransformerConfig(**TINY), attention="fast"),
     ['"materialized"', '"flash"']),
    (lambda m: riftco.PretrainingConfig(attention="sdpa"), ['"materialized"', '"flash"']),
    (lambda m: riftco.PostTrainingConfig(activation_checkpointing="all"), ["'disabled'", "'block'", "'segments'", "'attention'", "'mlp'"]),
    (lambda m: riftco.PostTrainingConfig(fine_tuning_method="qlora"), ["'lora'", "'full'"]),
    (lambda m: m.to("tpu"), ["'cpu'", "'cuda'"]),
])
def test_unknown_strings_are_value_errors_listing_the_accepted_values(make, accepted):
    model = tiny_model()
    with pytest.raises(ValueError) as e:
        make(model)
    assert isinstance(e.value, riftco.ValueError)
    for value in accepted:
        assert value in str(e.value)


def test_configs_take_every_field_as_a_keyword_with_the_cpp_defaults():
    c = riftco.PretrainingConfig()
    assert (c.steps, c.batch, c.learning_rate, c.attention, c.activation_checkpointing) == (200, 8, 0.003, "flash",
                                                                                           "disabled")
    assert c.data is None and str(c.output_dir) == "runs/run"
    assert c.model == riftco.TransformerConfig()
    assert riftco.PostTrainingConfig().learning_rate == 0.001  # the post-training default differs
    for cls in (riftco.PretrainingConfig, riftco.PostTrainingConfig, riftco.TransformerConfig, riftco.LoraConfig):
        default = cls()
        assert repr(cls(**default.to_dict())) == repr(default)
        assert repr(default).startswith(cls.__name__ + "(")
        assert list(default.to_dict()) == list(cls.fields)
    c = riftco.PretrainingConfig(steps=5, model=riftco.TransformerConfig(layers=2), data="x.txt", resume=True)
    assert (c.steps, c.model.layers, str(c.data), c.resume) == (5, 2, "x.txt", True)
    assert "steps=5" in repr(c) and "layers=2" in repr(c)
    c.model.layers = 3  # nested configs are edited in place
    assert c.model.layers == 3
    with pytest.raises(TypeError, match="unexpected keyword argument 'stpes'"):
        riftco.PretrainingConfig(stpes=5)
    assert riftco.LoraConfig(targets="attention").targets == ["query", "key", "value", "output"]
    assert riftco.LoraConfig(targets=["up", "down"]).targets == ["up", "down"]


def test_variables_numpy_views_and_gradients():
    x = riftco.Variable(np.arange(6, dtype=np.float64).reshape(2, 3), requires_grad=True, name="x")
    assert x.shape == (2, 3) and x.is_leaf and x.numpy().dtype == np.float32
    assert not x.numpy().flags.writeable  # views: writes go through set_value (versions)
    assert x.grad is None
    y = riftco.sum(x * x)
    y.backward()
    np.testing.assert_array_equal(x.grad, 2 * np.arange(6).reshape(2, 3))
    assert y.item() == 55.0
    x.set_value([[1, 1, 1], [1, 1, 1]])  # the graph read the old value: stale
    with pytest.raises(riftco.StaleGraphError, match="backward"):
        y.backward()


def test_backward_retain_graph_false_frees_the_graph_with_the_same_gradients():
    model = tiny_model()
    tokens, targets = batch()
    kept = model.loss(tokens, targets)
    kept.backward()
    expected = [p.grad.copy() for p in model.trainable_parameters()]
    for p in model.trainable_parameters():
        p.zero_grad()
    loss = model.loss(tokens, targets)
    # The nodes nearest the loss, reached through parents() (four levels), and
    # numpy views of their values (views hold their buffers): none may be
    # donated to a gradient.
    nodes, level = [], [loss]
    for _ in range(4):
        nodes += level
        level = [q for v in level for q in v.parents()]
    held = [v.numpy() for v in nodes]
    copies = [h.copy() for h in held]
    loss.backward(retain_graph=False)
    for p, g in zip(model.trainable_parameters(), expected):
        np.testing.assert_array_equal(p.grad, g)  # same bits as the kept-graph pass
    for h, c in zip(held, copies):
        np.testing.assert_array_equal(h, c)  # a buffer the caller holds is never donated to a gradient
    del nodes
    with pytest.raises(riftco.BackwardError, match="released"):
        loss.backward()  # the graph is gone: a typed error, gradients untouched
    for p, g in zip(model.trainable_parameters(), expected):
        np.testing.assert_array_equal(p.grad, g)
    kept.backward(retain_graph=True)  # the default keeps it: a second pass works
    with pytest.raises(TypeError):
        loss.backward(None, False)  # retain_graph is keyword-only


def test_loss_takes_arrays_and_lists_and_checks_shapes():
    model = tiny_model()
    tokens, targets = batch()
    a = model.loss(tokens, targets).item()
    b = model.loss(tokens.tolist(), targets.tolist()).item()
    assert a == b and np.isfinite(a)
    logits = model(tokens)
    assert logits.shape == (2, 12, 256)
    with pytest.raises(riftco.ShapeError, match=r"\[loss\] tokens \(2, 12\) and targets \(4, 6\)"):
        model.loss(tokens, targets.reshape(4, 6))
    with pytest.raises(riftco.ValueError, match="integers"):
        model.loss(tokens.astype(np.float32), targets)
    with pytest.raises(riftco.ValueError):
        model.loss(tokens + 256, targets)  # outside the vocabulary


def test_adam_step_makes_the_graph_stale_and_lowers_the_loss():
    model = tiny_model()
    tokens, targets = batch()
    opt = riftco.Adam(model.trainable_parameters(), learning_rate=1e-2)
    loss = model.loss(tokens, targets)
    first = loss.item()
    loss.backward()
    assert opt.step() > 0
    with pytest.raises(riftco.StaleGraphError):
        loss.backward()
    for _ in range(5):
        opt.zero_grad()
        loss = model.loss(tokens, targets)
        loss.backward()
        opt.step()
    assert model.loss(tokens, targets).item() < first
    assert opt.step_count == 6 and "learning_rate=0.01" in repr(opt)


def test_graph_lifetime_after_the_model_handle_is_released():
    for policy in ("disabled", "block"):
        model = tiny_model(activation_checkpointing=policy)
        tokens, targets = batch()
        loss = model.loss(tokens, targets)
        named = model.named_parameters()
        del model
        gc.collect()
        loss.backward()
        for name, p in named:
            assert p.grad is not None and p.grad.shape == p.shape, name
            assert np.abs(p.grad).sum() > 0, name


def test_block_checkpointing_gives_the_same_loss_and_gradients_and_retains_less():
    grads, stats = {}, {}
    for policy in ("disabled", "block"):
        model = tiny_model(activation_checkpointing=policy)
        loss = model.loss(*batch())
        stats[policy] = loss.graph_statistics()
        loss.backward()
        grads[policy] = (loss.item(), {n: p.grad.copy() for n, p in model.named_parameters()})
    assert grads["disabled"][0] == grads["block"][0]
    for name, g in grads["disabled"][1].items():
        np.testing.assert_array_equal(g, grads["block"][1][name], err_msg=name)
    assert stats["block"].element_count < stats["disabled"].element_count
    assert "cross_entropy" in tiny_model().loss(*batch()).retained_report()


def test_checkpoint_of_a_python_block_replays_and_enforces_the_contract():
    w = riftco.Variable(np.random.default_rng(0).normal(size=(4, 4)), requires_grad=True, name="w")
    x = riftco.Variable(np.ones((3, 4)), requires_grad=True, name="x")

    def block(h):
        return riftco.silu(riftco.linear(h, w))

    plain = riftco.sum(block(x))
    plain.backward()
    expected = (w.grad.copy(), x.grad.copy())
    riftco.reset_checkpoint_replay_count()
    seen = []

    def watched_block(h):
        seen.append(riftco.checkpoint_replaying())
        return block(h)

    assert not riftco.checkpoint_replaying()
    out = riftco.sum(riftco.checkpoint(x, [w], watched_block))
    out.backward()
    assert riftco.checkpoint_replay_count() == 1
    assert seen == [False, True]  # the forward call, then the replay
    assert not riftco.checkpoint_replaying()
    np.testing.assert_allclose(w.grad, expected[0], rtol=0, atol=0)
    np.testing.assert_allclose(x.grad, expected[1], rtol=0, atol=0)

    with pytest.raises(riftco.CheckpointContractError) as e:
        riftco.checkpoint(x, [], block)  # w used but not declared
    assert e.value.violation in (riftco.CheckpointViolation.MissingDependency,
                                 riftco.CheckpointViolation.CapturedExternalNode)
    assert str(e.value).startswith("[checkpoint]")
    with pytest.raises(riftco.CheckpointContractError) as e:
        riftco.checkpoint(x, [w, w], block)
    assert e.value.violation == riftco.CheckpointViolation.DuplicateDependency
    with pytest.raises(riftco.CheckpointContractError) as e:
        riftco.checkpoint(x, [w], lambda h: riftco.linear(riftco.Variable(np.ones((3, 4))), w))
    assert e.value.violation == riftco.CheckpointViolation.InputUnused
    with pytest.raises(TypeError, match="must return a riftco.Variable"):
        riftco.checkpoint(x, [w], lambda h: 3)

    def failing_on_replay(h, calls=[0]):
        calls[0] += 1
        if calls[0] > 1:
            raise KeyError("replay failed")
        return block(h)

    bad = riftco.sum(riftco.checkpoint(x, [w], failing_on_replay))
    before = w.grad.copy()
    with pytest.raises(KeyError, match="replay failed"):
        bad.backward()  # the Python error comes through, and no gradient changed
    np.testing.assert_array_equal(w.grad, before)


def test_save_load_fingerprint_and_load_options(tmp_path):
    model = tiny_model(seed=4)
    path = tmp_path / "model.safetensors"
    model.save(path)
    loaded = riftco.load_model(path, attention="flash", activation_checkpointing="block")
    assert loaded.fingerprint() == model.fingerprint() == riftco.model_fingerprint(model)
    assert riftco.read_model_config(path) == model.config
    assert loaded.activation_checkpointing == "block"
    tokens, targets = batch()
    assert loaded.loss(tokens, targets).item() == pytest.approx(model.loss(tokens, targets).item(), abs=1e-5)

    fresh = tiny_model(seed=5)
    fresh.load_state(path)
    assert fresh.fingerprint() == model.fingerprint()
    with pytest.raises(riftco.ModelStateError, match=r"^\[load\]"):
        riftco.load_model(tmp_path / "missing.safetensors")

    # A file with a NaN weight: refused by default, accepted with allow_non_finite.
    raw_dir = tmp_path / "raw"
    raw_dir.mkdir()
    nan_path = _write_with_nan(path, raw_dir / "nan.safetensors")
    with pytest.raises(riftco.ModelStateError, match="finite"):
        riftco.load_model(nan_path)
    assert np.isnan(riftco.load_model(nan_path, allow_non_finite=True).parameters()[0].numpy()[0, 0])

    # Adapters: saved alone, loaded onto the same base; another base needs allow_base_mismatch.
    model = tiny_model(seed=4)
    model.add_lora(rank=2, targets="query,value", seed=1)
    model.save_adapter(tmp_path / "adapter.safetensors")
    base = riftco.load_model(path)
    base.load_adapter(tmp_path / "adapter.safetensors")
    assert base.has_lora and base.lora_config.rank == 2
    other = tiny_model(seed=9)
    with pytest.raises(riftco.ModelStateError, match="fingerprint"):
        other.load_adapter(tmp_path / "adapter.safetensors")
    other.load_adapter(tmp_path / "adapter.safetensors", allow_base_mismatch=True)
    assert other.has_lora


def _write_with_nan(source, target):
    """A copy of a model-state file with its first float set to NaN (safetensors layout)."""
    data = bytearray(pathlib.Path(source).read_bytes())
    header_len = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + header_len])
    first = min((v["data_offsets"][0], k) for k, v in header.items() if k != "__metadata__")
    at = 8 + header_len + first[0]
    data[at:at + 4] = np.array([np.nan], dtype="<f4").tobytes()
    pathlib.Path(target).write_bytes(bytes(data))
    return target


def test_lora_add_merge_and_trainable_parameters():
    model = tiny_model()
    tokens, targets = batch()
    before = model(tokens).numpy().copy()
    model.add_lora(riftco.LoraConfig(rank=2, alpha=4.0, targets="all"))
    model.set_base_trainable(False)
    names = [n for n, _ in model.lora_parameters()]
    assert names and all(".lora_" in n for n in names)
    # parameter(name) takes every name named_parameters() gives, adapters too
    # (it refused them until 2026-12-02).
    for name, variable in model.named_parameters():
        assert model.parameter(name).name == variable.name == name
        np.testing.assert_array_equal(model.parameter(name).numpy(), variable.numpy())
    assert [id(p) for p in model.trainable_parameters()] and len(model.trainable_parameters()) == len(names)
    np.testing.assert_array_equal(model(tokens).numpy(), before)  # B starts at zero
    opt = riftco.Adam(model.trainable_parameters(), learning_rate=1e-2)
    model.loss(tokens, targets).backward()
    opt.step()
    adapted = model(tokens).numpy().copy()
    assert not np.array_equal(adapted, before)
    model.merge_lora()
    assert not model.has_lora
    np.testing.assert_allclose(model(tokens).numpy(), adapted, atol=1e-5)


def test_decode_session_and_generate():
    model = tiny_model()
    tokens = [72, 105, 33]
    session = riftco.DecodeSession(model)
    for t in tokens:
        logits = session.decode_token(t)
    full = model(np.array([tokens])).numpy()[0, -1]
    np.testing.assert_allclose(logits, full, atol=1e-4)
    assert session.position == 3 and session.capacity == 32
    out = model.generate("Hi", max_new_tokens=5, temperature=0)
    assert len(out.tokens) == 5 and isinstance(out.text, str) and str(out) == out.text
    assert model.generate([72, 105], max_new_tokens=5, temperature=0).tokens == out.tokens
    long = model.generate("x" * 30, max_new_tokens=10, temperature=0)
    assert long.reached_context and len(long.tokens) < 10
    del model
    gc.collect()
    assert session.decode_token(1).shape == (256,)  # the session holds the model's state


def test_memory_stats_and_no_grad():
    riftco.reset_peak_memory()
    model = tiny_model()
    loss = model.loss(*batch())
    stats = riftco.memory_stats()
    assert stats.peak_bytes >= stats.live_bytes > 0
    with riftco.no_grad():
        assert not riftco.is_grad_enabled()
        assert model.loss(*batch()).graph_statistics().node_count == 1
    assert riftco.is_grad_enabled()
    del loss


def _pretrain_config(tmp_path, **kwargs):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog.\n" * 100)
    base = dict(model=riftco.TransformerConfig(**TINY), data=corpus, steps=4, batch=2, sequence_length=16,
                warmup_steps=1, eval_interval=2, eval_batches=1, checkpoint_interval=2,
                output_dir=tmp_path / "run")
    base.update(kwargs)
    return riftco.PretrainingConfig(**base)


def test_pipeline_progress_stop_and_data_error(tmp_path):
    reports = []
    result = riftco.pretrain(_pretrain_config(tmp_path), progress=lambda r: reports.append(r) or r.step < 2)
    assert not result.completed and [r.step for r in reports] == [1, 2]
    assert reports[0].total_steps == 4 and reports[1].validation_loss is not None
    assert "metadata" not in result.files
    with pytest.raises(riftco.DataError, match=r"^\[data\]"):
        riftco.pretrain(_pretrain_config(tmp_path, data=tmp_path / "missing.txt"))
    with pytest.raises(ZeroDivisionError):  # a callback's exception stops the run and comes through
        riftco.pretrain(_pretrain_config(tmp_path), progress=lambda r: 1 / 0)


def test_ctrl_c_stops_a_pipeline_cleanly_at_the_next_step(tmp_path):
    script = textwrap.dedent(f"""
        import os, pathlib, signal, sys, threading, riftco
        # Ctrl-C as a terminal delivers it: a shell that runs the suite in the
        # background starts it with SIGINT ignored, and Python keeps that.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        corpus = pathlib.Path({str(tmp_path)!r}) / "c.txt"
        corpus.write_text("the quick brown fox jumps over the lazy dog.\\n" * 100)
        config = riftco.PretrainingConfig(model=riftco.TransformerConfig(**{TINY!r}), data=corpus, steps=1000000,
                                          batch=2, sequence_length=16, eval_interval=0, checkpoint_interval=1,
                                          output_dir=pathlib.Path({str(tmp_path)!r}) / "run")
        last = [0]
        def progress(report):
            last[0] = report.step
            if report.step == 3:  # Ctrl-C from outside while the next step runs
                threading.Timer(0.01, os.kill, (os.getpid(), signal.SIGINT)).start()
        try:
            riftco.pretrain(config, progress)
        except KeyboardInterrupt:
            print("interrupted after step", last[0])
            sys.exit(0)
        sys.exit("not interrupted")
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    step = int(r.stdout.split()[-1])
    assert 3 <= step < 1000, r.stdout
    run = tmp_path / "run"
    assert not (run / "metadata.json").exists()  # stopped, not completed
    assert (run / "training_checkpoint.safetensors").exists()  # resumable


def test_plot_module_writes_a_png_from_metrics(tmp_path):
    pytest.importorskip("matplotlib")
    result = riftco.pretrain(_pretrain_config(tmp_path))
    assert result.completed
    png = result.files["loss_curve_png"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    png.unlink()
    r = subprocess.run([sys.executable, "-m", "riftco.plot", str(result.output_dir)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert pathlib.Path(r.stdout.strip()) == png and png.stat().st_size > 10000
    from riftco import plot
    series = plot.read_metrics(result.output_dir)
    assert series["train"][0] == [1, 2, 3, 4] and series["validation"][0] == [2, 4]
    r = subprocess.run([sys.executable, "-m", "riftco.plot", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 2 and "metrics.jsonl" in r.stderr


def test_plot_of_a_diverged_run_draws_instead_of_failing(tmp_path):
    # ±1e308 losses made matplotlib's linear axis overflow: exit 1 with an IndexError traceback.
    pytest.importorskip("matplotlib")
    run = tmp_path / "diverged"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n'
                                       '{"step": 2, "loss": 1e308, "validation_loss": -1e308}\n'
                                       '{"step": 3, "loss": null}\n')
    r = subprocess.run([sys.executable, "-m", "riftco.plot", str(run)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert (run / "loss_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _metrics_run(path):
    path.mkdir()
    (path / "metrics.jsonl").write_text('{"step": 1, "loss": 5.0}\n{"step": 2, "loss": 4.0, "validation_loss": 4.5}\n')
    return path


def test_loss_curve_refuses_a_directory_or_symlink_target_and_leaves_no_temporary(tmp_path):
    # As the C++ writer: only a missing target or a regular file is replaced (os.replace would put the
    # PNG in place of the symlink itself), the error says why, and no temporary is left beside it.
    pytest.importorskip("matplotlib")
    from riftco import plot
    run = _metrics_run(tmp_path / "run")
    (run / "loss_curve.png").mkdir()
    with pytest.raises(IsADirectoryError, match=r"^\[write_loss_curve\] .*loss_curve.png: the target is a directory"):
        plot.write_loss_curve(run)
    assert sorted(p.name for p in run.iterdir()) == ["loss_curve.png", "metrics.jsonl"]
    (run / "loss_curve.png").rmdir()
    elsewhere = tmp_path / "elsewhere.png"
    elsewhere.write_bytes(b"keep")
    (run / "loss_curve.png").symlink_to(elsewhere)
    with pytest.raises(FileExistsError, match="not a regular file .*refusing to replace it"):
        plot.write_loss_curve(run)
    assert (run / "loss_curve.png").is_symlink() and elsewhere.read_bytes() == b"keep"
    assert sorted(p.name for p in run.iterdir()) == ["loss_curve.png", "metrics.jsonl"]


def test_loss_curve_temporary_is_its_own_synced_and_removed_on_failure(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    import os
    from riftco import plot
    run = _metrics_run(tmp_path / "run")
    (run / "loss_curve.png.tmp").mkdir()  # another plotter's temporary under a fixed name: not ours to use
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
    png = plot.write_loss_curve(run)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and len(synced) >= 1
    umask = os.umask(0)
    os.umask(umask)
    assert png.stat().st_mode & 0o777 == 0o666 & ~umask  # what open() gives, not mkstemp's 0600
    before = png.read_bytes()

    def failing_replace(src, dst):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="No space left"):
        plot.write_loss_curve(run, title="again")
    assert sorted(p.name for p in run.iterdir()) == ["loss_curve.png", "loss_curve.png.tmp", "metrics.jsonl"]
    assert png.read_bytes() == before


def test_plot_command_reports_a_target_it_cannot_replace_in_one_line(tmp_path):
    pytest.importorskip("matplotlib")
    run = _metrics_run(tmp_path / "run")
    (run / "loss_curve.png").mkdir()
    r = subprocess.run([sys.executable, "-m", "riftco.plot", str(run)], capture_output=True, text=True)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: [write_loss_curve] ") and "directory" in r.stderr
    assert sorted(p.name for p in run.iterdir()) == ["loss_curve.png", "metrics.jsonl"]


def test_pipeline_keeps_its_result_when_the_plot_fails(tmp_path):
    # The run has completed and written its files by the time the plot is drawn: a plot that fails
    # is a warning naming the failure, and the RunResult comes back.
    pytest.importorskip("matplotlib")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "loss_curve.png").mkdir()
    with pytest.warns(RuntimeWarning, match=r"riftco.pretrain: .*loss curve was not written \(IsADirectoryError: "):
        result = riftco.pretrain(_pretrain_config(tmp_path))
    assert result.completed and result.steps == 4
    assert {"weights", "metadata", "metrics"} <= set(result.files)
    assert not [p.name for p in (tmp_path / "run").iterdir() if ".tmp" in p.name]


def test_loss_curve_temporary_is_named_as_the_cpp_writer_names_its_own(tmp_path, monkeypatch):
    # ".<name>.tmp.<pid>.<digits>" with at most 228 bytes of the name: the
    # C++ remove_stale_temporaries recognises one a killed plot left (it
    # reads digits only), and a 255-byte target name still fits NAME_MAX.
    pytest.importorskip("matplotlib")
    import os
    import re
    from riftco import plot
    run = _metrics_run(tmp_path / "run")
    seen = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: (seen.append(os.path.basename(src)), real_replace(src, dst))[1])
    plot.write_loss_curve(run)
    assert re.fullmatch(r"\.loss_curve\.png\.tmp\.%d\.\d+" % os.getpid(), seen[-1]), seen
    long_name = "é" * 100 + "x" * 51 + ".png"  # 255 bytes
    png = plot.write_loss_curve(run, output=run / long_name)
    assert png.name == long_name and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(os.fsencode(seen[-1])) <= 255 and os.fsencode(seen[-1]).startswith(b"." + ("é" * 100).encode()[:228])
