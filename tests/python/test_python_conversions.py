"""Argument and result conversion at the Python boundary, from an adversarial
review: zero-copy numpy views, error messages that are not UTF-8, 0-d values,
a progress callback without a truth value, generate() without a tokenizer,
config assignments, a reused no_grad(), token-id and str conversions, and
riftco.plot.read_metrics on bad rows."""
import gc
import json
import os
import threading

import numpy as np
import pytest

from riftco_import import import_riftco

riftco = import_riftco()
TINY = dict(vocab_size=256, context_length=16, model_width=16, heads=2, layers=2, feed_forward_width=32)


def tiny_model(**config):
    return riftco.DecoderOnlyTransformer(riftco.TransformerConfig(**{**TINY, **config}), seed=1)


# --- numpy views -------------------------------------------------------------

def test_numpy_is_a_read_only_view_that_shows_an_adam_step():
    model = tiny_model()
    p = model.parameters()[-1]
    view = p.numpy()
    assert not view.flags.owndata and not view.flags.writeable
    with pytest.raises(ValueError):
        view.flags.writeable = True  # the buffer itself is read-only
    assert view.ctypes.data == p.numpy().ctypes.data  # the same buffer, not a copy
    before = view.copy()
    opt = riftco.Adam(model.trainable_parameters(), learning_rate=0.1)
    model.loss([1, 2, 3], [2, 3, 4]).backward()
    opt.step()
    assert not np.array_equal(view, before)
    assert np.array_equal(view, p.numpy())


def test_a_view_outlives_its_variable_and_model():
    v = riftco.Variable(np.arange(6.0).reshape(2, 3), requires_grad=True)
    view = v.numpy()
    (riftco.sum(v * 2.0)).backward()
    grad = v.grad
    assert not grad.flags.writeable and not grad.flags.owndata
    del v
    gc.collect()
    for _ in range(3):  # new buffers must not reuse the viewed ones
        riftco.Variable(np.full((2, 3), 7.0)).numpy()
    np.testing.assert_array_equal(view, np.arange(6.0).reshape(2, 3))
    np.testing.assert_array_equal(grad, np.full((2, 3), 2.0))


def test_a_grad_view_keeps_its_pass_and_accumulator_views_show_later_adds():
    w = riftco.Variable(np.ones(3), requires_grad=True)
    riftco.sum(w * 2.0).backward()
    first = w.grad
    riftco.sum(w * 3.0).backward()  # each pass commits a new gradient buffer
    np.testing.assert_array_equal(first, np.full(3, 2.0))
    np.testing.assert_array_equal(w.grad, np.full(3, 3.0))
    acc = riftco.GradientAccumulator([w])
    acc.add()
    sums = acc.gradients[0]
    assert not sums.flags.writeable
    acc.add()  # the same commit again: summed once only
    np.testing.assert_array_equal(sums, np.full(3, 3.0))
    riftco.sum(w * 4.0).backward()
    acc.add()  # a new commit: added into the same buffer
    np.testing.assert_array_equal(sums, np.full(3, 7.0))


# --- error messages ----------------------------------------------------------

def test_an_error_message_with_non_utf8_bytes_keeps_its_text(tmp_path):
    bad = os.fsdecode(os.fsencode(str(tmp_path)) + b"/no-such-\xff/model.safetensors")
    with pytest.raises(riftco.Error) as e:
        riftco.load_model(bad)
    assert "[load]" in str(e.value) and "\\xff" in str(e.value), e.value.args


def test_a_nul_in_an_enum_string_keeps_the_accepted_values():
    with pytest.raises(riftco.ValueError, match="materialized"):
        tiny_model().set_attention("flash\0x")


# --- 0-d values --------------------------------------------------------------

def test_scalars_stay_0d_and_seed_a_scalar_loss():
    assert riftco.Variable(np.zeros(())).shape == ()
    assert riftco.Variable(3.0).shape == ()
    model = tiny_model()
    loss = model.loss([1, 2, 3], [2, 3, 4])
    for seed in (1.0, np.float32(2.0), np.array(1.0)):
        loss.backward(seed)
    w = riftco.Variable(np.ones(3), requires_grad=True)
    (w * 2.0 + 1.0).backward(np.ones(3))
    np.testing.assert_array_equal(w.grad, np.full(3, 2.0))


# --- progress callbacks ------------------------------------------------------

def test_a_progress_answer_without_truth_value_raises_its_own_error(tmp_path):
    (tmp_path / "data.txt").write_text(("the quick brown fox jumps over the lazy dog. " * 20 + "\n") * 50)
    config = riftco.PretrainingConfig(model=riftco.TransformerConfig(**TINY), steps=3, batch=2,
                                      sequence_length=16, data=tmp_path / "data.txt", output_dir=tmp_path / "run",
                                      eval_interval=0, eval_batches=1, warmup_steps=1)
    with pytest.raises(ValueError, match="truth value") as e:
        riftco.pretrain(config, progress=lambda report: np.array([True, False]))
    assert not isinstance(e.value, SystemError)


@pytest.mark.parametrize("progress", [5, "x", [print]])
def test_a_progress_that_is_not_callable_is_refused_before_the_run(tmp_path, progress):
    # Before: step 1 ran and the run's files were written, then TypeError.
    (tmp_path / "data.txt").write_text(("the quick brown fox jumps over the lazy dog. " * 20 + "\n") * 50)
    config = riftco.PretrainingConfig(model=riftco.TransformerConfig(**TINY), steps=3, batch=2,
                                      sequence_length=16, data=tmp_path / "data.txt", output_dir=tmp_path / "run",
                                      eval_interval=0, eval_batches=1, warmup_steps=1)
    with pytest.raises(TypeError, match="progress must be a callable"):
        riftco.pretrain(config, progress=progress)
    assert not (tmp_path / "run").exists()


def test_a_run_uses_the_config_as_it_was_when_called(tmp_path):
    # Before: the run read the caller's object with the GIL released; a
    # callback setting steps = 40 made a 2-step run train 40 steps.
    (tmp_path / "data.txt").write_text(("the quick brown fox jumps over the lazy dog. " * 20 + "\n") * 50)
    config = riftco.PretrainingConfig(model=riftco.TransformerConfig(**TINY), steps=2, batch=2,
                                      sequence_length=16, data=tmp_path / "data.txt", output_dir=tmp_path / "run",
                                      eval_interval=0, eval_batches=1, warmup_steps=1)
    seen = []

    def progress(report):
        seen.append(report.step)
        config.steps = 40
        config.output_dir = tmp_path / "elsewhere"

    result = riftco.pretrain(config, progress=progress, plot=False)
    assert seen == [1, 2] and result.steps == 2
    assert json.loads((tmp_path / "run" / "metadata.json").read_text())["config"]["steps"] == 2
    assert not (tmp_path / "elsewhere").exists()


# --- derived sizes of a config -----------------------------------------------

@pytest.mark.parametrize("fields", [dict(heads=0), dict(heads=-1, model_width=-2**63),
                                    dict(vocab_size=2**31 - 1, model_width=2**31 - 1, layers=2**31 - 1,
                                         feed_forward_width=2**31 - 1, heads=1)])
def test_derived_sizes_of_an_invalid_config_are_value_errors(fields):
    # Before: heads=0 killed the interpreter (SIGFPE in head_width); huge sizes overflowed int64.
    config = riftco.TransformerConfig(**{**TINY, **fields})
    with pytest.raises(riftco.ValueError, match="TransformerDimensions"):
        config.head_width
    with pytest.raises(riftco.ValueError, match="TransformerDimensions"):
        config.parameter_count()
    assert riftco.TransformerConfig(**TINY).head_width == 8


# --- generate() --------------------------------------------------------------

def test_generate_without_tokenizer_refuses_a_non_byte_vocabulary_where_it_needs_text():
    # A str prompt (encoded as bytes) or stop strings (decoded as bytes) need the bytes tokenizer's 256.
    model = tiny_model(vocab_size=1000)
    for seed in range(3):
        with pytest.raises(riftco.ValueError, match=r"vocabulary is 256 \(tokenizer=None: bytes, for the str prompt\) "
                                                    r"but the model's is 1000"):
            model.generate("ab", max_new_tokens=60, seed=seed)
        with pytest.raises(riftco.ValueError, match=r"vocabulary is 256 \(tokenizer=None: bytes, for the stop strings\)"):
            model.generate_samples([1, 2], num_samples=2, max_new_tokens=4, seed=seed, stop="x")


@pytest.mark.parametrize("vocab_size", [64, 300, 1000])
def test_generate_from_token_ids_without_tokenizer_works_for_any_vocabulary(vocab_size):
    # Was: "the tokenizer's vocabulary is 256 (tokenizer=None: bytes) but the model's is 64" for a
    # prompt of ids, which C++ generate() and C rt_generate accept. Ids in, ids out; no text to decode.
    model = tiny_model(vocab_size=vocab_size)
    prompt = [1, 2, vocab_size - 1]
    out = model.generate(prompt, max_new_tokens=6, temperature=0)
    assert len(out.tokens) == 6 and all(0 <= t < vocab_size for t in out.tokens)
    assert out.text is None and "text=None" in repr(out) and str(out) == repr(out)
    session = riftco.DecodeSession(model)  # the same greedy continuation, token by token
    for t in prompt:
        logits = session.decode_token(t)
    for t in out.tokens:
        assert int(np.argmax(logits)) == t
        logits = session.decode_token(t)
    samples = model.generate_samples(np.array(prompt), num_samples=2, max_new_tokens=3, seed=4)
    assert [s.tokens for s in samples][0] == model.generate(prompt, max_new_tokens=3, seed=4).tokens
    assert all(s.text is None for s in samples)
    with pytest.raises(riftco.ValueError, match=f"outside the vocabulary \\[0, {vocab_size}\\)"):
        model.generate([vocab_size], max_new_tokens=1)
    # A byte model keeps its text for an id prompt.
    byte_model = tiny_model()
    assert isinstance(byte_model.generate([104, 105], max_new_tokens=2, temperature=0).text, str)


def test_generate_refuses_a_2d_prompt():
    with pytest.raises(riftco.ValueError, match="prompt"):
        tiny_model().generate([[1, 2], [3, 4]], max_new_tokens=1, temperature=0)
    assert len(tiny_model().generate(np.array([1, 2]), max_new_tokens=1, temperature=0).tokens) == 1


# --- config assignment -------------------------------------------------------

CONFIG_CASES = [(riftco.PretrainingConfig, "attention", None), (riftco.PretrainingConfig, "device", 3),
                (riftco.PretrainingConfig, "data", 5), (riftco.PretrainingConfig, "model", None),
                (riftco.PretrainingConfig, "activation_memory_budget", None),
                (riftco.PretrainingConfig, "resume", "yes"), (riftco.PretrainingConfig, "steps", "3"),
                (riftco.PretrainingConfig, "learning_rate", "x"), (riftco.PostTrainingConfig, "lora", 3),
                (riftco.PostTrainingConfig, "fine_tuning_method", 1), (riftco.PostTrainingConfig, "base_model", 1.5),
                (riftco.TransformerConfig, "tie_embeddings", "yes"), (riftco.LoraConfig, "targets", 5),
                (riftco.LoraConfig, "targets", [1]), (riftco.LoraConfig, "alpha", True)]


@pytest.mark.parametrize("cls,field,value", CONFIG_CASES)
def test_a_wrong_type_names_the_field_as_keyword_and_assignment(cls, field, value):
    with pytest.raises(TypeError, match=f"{cls.__name__}.{field} expects"):
        cls(**{field: value})
    config = cls()
    before = config.to_dict()
    with pytest.raises(TypeError, match=f"{cls.__name__}.{field} expects"):
        setattr(config, field, value)
    assert repr(config.to_dict()) == repr(before)


def test_every_config_field_assignment_names_the_field():
    for cls in (riftco.TransformerConfig, riftco.LoraConfig, riftco.PretrainingConfig, riftco.PostTrainingConfig):
        for field in cls.fields:
            with pytest.raises(TypeError, match=f"{cls.__name__}.{field} expects"):
                setattr(cls(), field, object())


def test_config_assignments_still_work():
    config = riftco.PretrainingConfig()
    config.model.layers = 3  # nested configs are references
    config.attention, config.data, config.resume = "flash", "x.txt", True
    config.activation_memory_budget = "1MiB"
    assert (config.model.layers, config.attention, str(config.data), config.resume) == (3, "flash", "x.txt", True)
    config.data = None
    assert config.data is None and config.activation_memory_budget == 2**20
    lora = riftco.LoraConfig(targets=("query", "value"))
    lora.targets = "mlp"
    assert lora.targets == ["gate", "up", "down"]
    with pytest.raises(riftco.ValueError):
        lora.targets = "\udcff"


# --- add_lora keywords -------------------------------------------------------

def test_add_lora_refuses_a_config_and_its_keywords_together():
    # Was: add_lora(config, rank=8, alpha=32, targets="all") silently ignored the keywords.
    model = tiny_model()
    config = riftco.LoraConfig(rank=2, alpha=4.0, targets="query")
    with pytest.raises(TypeError, match=r"^add_lora\(\) got a LoraConfig and the keywords rank=8, alpha=32.0, "
                                        r"targets='all': give one or the other"):
        model.add_lora(config, rank=8, alpha=32.0, targets="all", seed=5)
    with pytest.raises(TypeError, match=r"the keywords rank=2:"):
        model.add_lora(config=config, rank=2)  # even the config's own value: which one was meant is unclear
    assert not model.has_lora
    model.add_lora(config, seed=5)  # seed is no LoraConfig field: allowed beside a config
    assert (model.lora_config.rank, model.lora_config.alpha, model.lora_config.targets) == (2, 4.0, ["query"])
    model.remove_lora()
    model.add_lora(config, targets=None)  # the documented default
    model.remove_lora()
    with pytest.raises(TypeError, match=r"add_lora\(\) config expects a LoraConfig or None, got dict"):
        model.add_lora({"rank": 2})
    with pytest.raises(TypeError, match=r"add_lora\(\) got an unexpected keyword argument 'rnak'"):
        model.add_lora(rnak=2)
    model.add_lora(rank=4, alpha=8.0, targets=["query", "value"], seed=3)
    assert (model.lora_config.rank, model.lora_config.alpha, model.lora_config.targets) == (4, 8.0, ["query", "value"])
    assert "rank: int = 8, alpha: float = 16.0" in model.add_lora.__doc__.splitlines()[0]


@pytest.mark.parametrize("keyword, value, message", [
    ("rank", True, "LoraConfig.rank expects int, got bool"), ("rank", False, "LoraConfig.rank expects int, got bool"),
    ("alpha", True, "LoraConfig.alpha expects float, got bool"), ("rank", 1.5, "LoraConfig.rank expects int, got float"),
    ("seed", True, r"add_lora\(\) seed expects int, got bool"), ("seed", 1.0, r"add_lora\(\) seed expects int, got float"),
])
def test_add_lora_and_lora_config_refuse_a_bool_for_a_number(keyword, value, message):
    # Was: add_lora(rank=True) made a rank-1 adapter (docs/python.md: a bool for an int field is a TypeError).
    model = tiny_model()
    with pytest.raises(TypeError, match=message):
        model.add_lora(**{keyword: value})
    assert not model.has_lora
    if keyword != "seed":
        with pytest.raises(TypeError, match=message):
            riftco.LoraConfig(**{keyword: value})


def test_lora_ints_out_of_range_and_empty_targets_name_the_problem():
    model = tiny_model()
    with pytest.raises(riftco.ValueError, match=r"\[LoraConfig.rank\] must be in \[-9223372036854775808, "
                                                r"9223372036854775807\], got 9223372036854775808"):
        model.add_lora(rank=2**63)
    with pytest.raises(riftco.ValueError, match=r"\[add_lora\] seed must be in \[0, 18446744073709551615\], got -1"):
        model.add_lora(seed=-1)
    for targets in ([], "", ()):
        with pytest.raises(riftco.ValueError, match=r"\[LoraConfig.targets\] targets must not be empty"):
            model.add_lora(targets=targets)
        with pytest.raises(riftco.ValueError, match="targets must not be empty"):
            riftco.LoraConfig(targets=targets)
    assert not model.has_lora
    model.add_lora(seed=2**64 - 1, rank=np.int64(2))  # numpy integers are still integers
    assert model.lora_config.rank == 2


# --- no_grad -----------------------------------------------------------------

def test_one_no_grad_object_nests_and_refuses_another_threads_exit():
    no_grad = riftco.no_grad()
    w = riftco.Variable(np.ones(3), requires_grad=True)
    with no_grad:
        with no_grad:
            pass
        assert not riftco.is_grad_enabled() and not (w * 2.0).requires_grad
    assert riftco.is_grad_enabled()
    no_grad.__enter__()
    errors, modes = [], []

    def exit_elsewhere():
        try:
            no_grad.__exit__(None, None, None)
        except riftco.Error as e:
            errors.append(e)
        modes.append(riftco.is_grad_enabled())

    t = threading.Thread(target=exit_elsewhere)
    t.start()
    t.join()
    assert len(errors) == 1 and modes == [True] and not riftco.is_grad_enabled()
    no_grad.__exit__(None, None, None)
    assert riftco.is_grad_enabled()
    with pytest.raises(riftco.Error, match="without __enter__"):
        no_grad.__exit__(None, None, None)


# --- token ids and str arguments ---------------------------------------------

def test_token_id_conversions_name_the_problem():
    model = tiny_model()
    with pytest.raises(riftco.ValueError, match=str(2**64 - 1)):
        model(np.array([2**64 - 1], dtype=np.uint64))
    assert model(np.array([1, 2], dtype=np.uint64)).shape == (1, 2, 256)
    for bad in (5, "hello"):
        with pytest.raises(TypeError, match=r"token ids must be .*got (int|str)"):
            model(bad)
    # bytes was refused and bytearray read as its byte values: both refused.
    for bad in (b"abc", bytearray(b"abc")):
        with pytest.raises(TypeError, match=r"token ids must be .*got (bytes|bytearray) \(text is a str\)"):
            model(bad)


def test_a_sequence_longer_than_the_context_is_refused_before_it_is_copied():
    # A (B, T) array is checked against the context before its ids are
    # converted: a (65536, 65536) int16 array (8 GiB) asked for 32 GiB first.
    model = tiny_model()
    big = np.lib.stride_tricks.as_strided(np.zeros(1, dtype=np.int16), shape=(1 << 16, 1 << 16), strides=(0, 0))
    for call in (lambda: model(big), lambda: model.loss(big, big)):
        with pytest.raises(riftco.ShapeError, match="sequence length 65536 exceeds the context length 16"):
            call()


@pytest.mark.parametrize("values, dtype", [
    (np.array([1 + 2j, 3]), "complex128"),
    (np.array([1.0, None], dtype=object), "object"),
    (np.array(["1.5"]), "<U3"),
    (np.array(["2026-12-02"], dtype="datetime64[D]"), "datetime64"),
])
def test_a_variable_takes_real_numbers_only(values, dtype):
    # numpy's float32 cast dropped the imaginary part (a warning at most),
    # read None as NaN and parsed strings and dates.
    with pytest.raises(TypeError, match="real numbers .*got dtype " + dtype.replace("[", r"\[")):
        riftco.Variable(values)
    v = riftco.Variable([1.0, 2.0])
    with pytest.raises(TypeError, match="real numbers"):
        v.set_value(values)
    np.testing.assert_array_equal(v.numpy(), [1.0, 2.0])
    for fine in ([True, False], np.arange(3, dtype=np.uint8), np.float16([0.5]), []):
        riftco.Variable(fine)


def test_lone_surrogates_are_value_errors(tmp_path):
    model = tiny_model()
    calls = [lambda: riftco.Tokenizer().encode("\udcff"), lambda: riftco.evaluate(model, "ab\udcff" * 10),
             lambda: riftco.train_tokenizer("\udcff", tmp_path / "t.model"),
             lambda: model.set_attention("\udcff"), lambda: setattr(model, "activation_checkpointing", "\udcff"),
             lambda: riftco.PretrainingConfig(attention="\udcff"),
             lambda: model.plan_activation_memory("1\udcffMiB", 1, 8)]
    for call in calls:
        with pytest.raises(riftco.ValueError, match="not valid Unicode"):
            call()
    assert model.attention == "materialized"


# --- riftco.plot -------------------------------------------------------------

@pytest.mark.parametrize("row", ['{"step": 1, "loss": "abc"}', '{"step": 1e999}', '{"step": 1, "loss": [1]}',
                                 '{"step": 1, "validation_loss": "x"}', '[1]', '{"loss": 1}', 'not json',
                                 # Before: read as steps 1 and 2 with losses 1.5 and 1.0; a RecursionError.
                                 '{"step": true, "loss": 1.0}', '{"step": 2.9, "loss": 1.0}',
                                 '{"step": 2, "loss": "1.5"}', '{"step": 2, "loss": true}',
                                 '{"step": 2, "loss": ' + '[' * 100000 + ']' * 100000 + '}'])
def test_read_metrics_names_file_and_line_for_a_bad_row(tmp_path, row):
    from riftco import plot
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 0, "loss": 1.0}) + "\n" + row + "\n")
    with pytest.raises(ValueError, match=r"metrics.jsonl: line 2: not a metrics row"):
        plot.read_metrics(tmp_path)


def test_plot_refuses_a_fifo_instead_of_waiting_forever(tmp_path):
    from riftco import plot
    os.mkfifo(tmp_path / "metrics.jsonl")
    with pytest.raises(OSError, match="not a regular file"):
        plot.read_metrics(tmp_path)
    os.remove(tmp_path / "metrics.jsonl")
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 1.0}) + "\n")
    os.mkfifo(tmp_path / "metadata.json")  # only the title: the default one, at once
    if plot.matplotlib_available():
        assert plot.write_loss_curve(tmp_path).exists()


# --- checkpoint lifetime -----------------------------------------------------

def test_a_checkpoint_function_that_captures_only_its_weight_is_freed():
    # docs/python.md "Lifetime": a function holding the output (a bound method of
    # the object storing it) forms a cycle the GC cannot see; this pattern does not.
    class Block:
        def __init__(self):
            self.w = riftco.Variable(np.ones((64, 64)), requires_grad=True)

        def __call__(self, x):
            w = self.w
            self.last = riftco.checkpoint(x, [w], lambda h: riftco.silu(riftco.linear(h, w)))
            return self.last

    gc.collect()
    base = riftco.memory_stats().live_bytes
    for _ in range(3):
        block = Block()
        riftco.sum(block(riftco.Variable(np.ones((8, 64)), requires_grad=True))).backward()
        del block
        gc.collect()
    assert riftco.memory_stats().live_bytes == base


# --- numpy operands on the left ----------------------------------------------

def test_numpy_operands_on_the_left_keep_the_graph():
    # Before: numpy's operator ran first and returned a numpy value through
    # __array__, detached from autograd.
    w = riftco.Variable(np.array([1.0, 2.0, 3.0], dtype=np.float32), requires_grad=True)
    for left in (np.float64(0.5), np.float32(0.5), np.ones(()) * 0.5, np.full(3, 0.5)):
        for y in (left * w, left + w, left - w):
            assert isinstance(y, riftco.Variable), type(y)
        riftco.sum(left * w).backward()
        np.testing.assert_array_equal(w.grad, np.full(3, 0.5, dtype=np.float32))
    m = riftco.Variable(np.eye(3, dtype=np.float32), requires_grad=True)
    y = np.ones((2, 3), dtype=np.float32) @ m
    assert isinstance(y, riftco.Variable) and y.numpy().shape == (2, 3)
    assert np.asarray(w).shape == (3,)  # __array__ still converts explicitly


# --- paths that are not UTF-8 ------------------------------------------------

def test_a_path_that_is_not_utf8_is_refused_before_the_run_and_shown_escaped(tmp_path):
    # Before: the run trained, wrote its weights, then raised nlohmann's
    # RuntimeError writing metadata.json (no metadata, no checkpoint).
    data = os.fsdecode(bytes(tmp_path) + b"/data\xff.txt")
    with open(data, "w") as f:
        f.write(("the quick brown fox jumps over the lazy dog. " * 20 + "\n") * 50)
    for field, value in (("data", data), ("output_dir", os.fsdecode(bytes(tmp_path) + b"/run\xff"))):
        kwargs = dict(data=tmp_path / "ok.txt", output_dir=tmp_path / "run")
        kwargs[field] = value
        config = riftco.PretrainingConfig(model=riftco.TransformerConfig(**TINY), steps=2, batch=2,
                                          sequence_length=16, eval_batches=1, **kwargs)
        with pytest.raises(riftco.ValueError, match=f"{field} is not valid UTF-8"):
            riftco.pretrain(config)
        assert not os.path.exists(kwargs["output_dir"])
    # A tokenizer whose path is not UTF-8 loads, and its repr escapes the byte.
    tok = os.fsdecode(bytes(tmp_path) + b"/tok\xff.model")
    riftco.train_tokenizer(("the quick brown fox jumps over the lazy dog. " * 20 + "\n") * 50, tok, vocab_size=300)
    assert "\\xff" in repr(riftco.Tokenizer.load(tok))


# --- str arguments that are not text -----------------------------------------

def test_str_arguments_that_cannot_be_utf8_are_value_errors_naming_the_argument(tmp_path):
    # Before: nanobind's anonymous "incompatible function arguments" TypeError.
    model = tiny_model()
    v = riftco.Variable([1.0, 2.0], requires_grad=True)
    bad = "\ud800"
    cases = [
        (lambda: riftco.Variable([1.0], name=bad), "[Variable] name"),
        (lambda: setattr(v, "name", bad), "[Variable.name]"),
        (lambda: v.mark_changed(bad), "[mark_changed]"),
        (lambda: v.to(bad), "[to] backend"),
        (lambda: model.to(bad), "[to] backend"),
        (lambda: model.parameter(bad), "[parameter] name"),
        (lambda: riftco.memory_stats(bad), "[memory_stats] backend"),
        (lambda: riftco.reset_peak_memory(bad), "[reset_peak_memory] backend"),
        (lambda: riftco.release_cached_memory(bad), "[release_cached_memory] backend"),
        (lambda: riftco.checkpoint(v, [], lambda x: x * 2.0, name=bad), "[checkpoint] name"),
        (lambda: riftco.ByteTokenizer().encode(bad), "[encode] text"),
        (lambda: riftco.load_model(tmp_path / "m.safetensors", attention=bad), "[load_model] attention"),
    ]
    for call, needle in cases:
        with pytest.raises(riftco.ValueError) as e:
            call()
        assert needle in str(e.value), (needle, str(e.value))
    assert v.name == ""


def test_a_nul_in_an_argument_does_not_cut_the_message_short(tmp_path):
    model = tiny_model()
    with pytest.raises(riftco.ValueError, match=r'flash\\0x.*expected'):
        model.save(tmp_path / "m.safetensors") or riftco.load_model(tmp_path / "m.safetensors", attention="flash\0x")
    with pytest.raises(riftco.ValueError, match=r"cpu\\0x"):
        model.to("cpu\0x")


# --- PyTorch conventions -----------------------------------------------------

def test_no_grad_decorates_a_function_and_a_variables_truth_is_its_one_value():
    w = riftco.Variable([1.0, 2.0], requires_grad=True)

    @riftco.no_grad()
    def predict(x):
        assert not riftco.is_grad_enabled()
        return x * 2.0

    assert not predict(w).requires_grad and riftco.is_grad_enabled()
    assert predict.__name__ == "predict"

    # A generator function: every step runs without graphs, the caller's code between yields with
    # them (PyTorch's decorator; the plain wrapper covered only the call that makes the generator).
    @riftco.no_grad()
    def steps(x, n):
        for _ in range(n):
            sent = yield (x * 2.0).requires_grad, riftco.is_grad_enabled()
            if sent == "stop":
                return "stopped"

    gen = steps(w, 3)
    assert next(gen) == (False, False) and riftco.is_grad_enabled()
    assert gen.send(None) == (False, False) and riftco.is_grad_enabled()
    with pytest.raises(StopIteration) as stopped:
        gen.send("stop")
    assert stopped.value.value == "stopped" and riftco.is_grad_enabled()
    gen = steps(w, 5)
    next(gen)
    with pytest.raises(KeyError):
        gen.throw(KeyError("into the generator"))
    gen = steps(w, 5)
    next(gen)
    gen.close()
    assert riftco.is_grad_enabled()
    assert bool(riftco.Variable([0.0])) is False and bool(riftco.Variable(3.0)) is True
    with pytest.raises(ValueError, match="ambiguous"):
        bool(w)
