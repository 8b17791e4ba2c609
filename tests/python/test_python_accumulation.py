"""Issue 14 items 2, 3, 4b from Python: gradient accumulation and decay_embeddings
in the stage configs, Adam parameter groups, and the sampling options of
generate() / generate_samples()."""
import json

import numpy as np
import pytest

from riftco_import import import_riftco

riftco = import_riftco()
TINY = dict(vocab_size=256, context_length=32, model_width=16, heads=2, layers=2, feed_forward_width=32)


def tiny_model(seed=1):
    return riftco.DecoderOnlyTransformer(riftco.TransformerConfig(**TINY), seed=seed)


def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("".join(f"the quick brown fox {i % 7} jumps over the lazy dog.\n" for i in range(200)))
    return path


def test_parameter_groups_keep_norm_weights_out_of_weight_decay():
    model = tiny_model()
    groups = riftco.default_parameter_groups(model.trainable_parameters(), 0.5)
    assert [g["name"] for g in groups] == ["decay", "no_decay"]
    assert groups[1]["weight_decay"] == 0.0 and groups[0]["weight_decay"] == 0.5
    assert sorted(p.name for p in groups[1]["params"]) == [
        "blocks.0.attention_norm.weight", "blocks.0.mlp_norm.weight", "blocks.1.attention_norm.weight",
        "blocks.1.mlp_norm.weight", "final_norm.weight"]
    no_embeddings = riftco.default_parameter_groups(model.trainable_parameters(), 0.5, decay_embeddings=False)
    assert {"token_embedding.weight", "lm_head.weight"} <= {p.name for p in no_embeddings[1]["params"]}
    # By the model's own names: a relabelled norm weight stays out of decay.
    model.parameter("final_norm.weight").name = "my label"
    by_label = riftco.default_parameter_groups(model.trainable_parameters(), 0.5)
    by_name = riftco.default_parameter_groups(model.named_parameters(), 0.5)
    assert len(by_label[1]["params"]) == 4 and len(by_name[1]["params"]) == 5
    model.parameter("final_norm.weight").name = "final_norm.weight"

    opt = riftco.Adam(groups, learning_rate=0.1)
    assert [(g["name"], g["weight_decay"]) for g in opt.groups] == [("decay", 0.5), ("no_decay", 0.0)]
    norm = next(p for p in groups[1]["params"])
    weight = next(p for p in groups[0]["params"])
    norm_before, weight_before = norm.numpy().copy(), weight.numpy().copy()
    tokens = np.zeros((1, 4), dtype=np.int32)
    model.loss(tokens, np.full((1, 4), -100, dtype=np.int32)).backward()  # every target ignored: zero gradients
    opt.step()
    np.testing.assert_array_equal(norm.numpy(), norm_before)
    np.testing.assert_allclose(weight.numpy(), weight_before * (1 - 0.1 * 0.5), rtol=1e-6)


@pytest.mark.parametrize("groups, needle", [
    ([{"weight_decay": 0.1}], "'params' is missing"),
    ([{"params": [], "lr": 0.1}], "unknown key 'lr'"),
    ([{"params": [], "weight_decay": "high"}], "'weight_decay' must be a number"),
    ([{"params": [], "weight_decay": True}], "'weight_decay' must be a number (not a bool)"),
    ([{"params": [], "weight_decay": -1.0}], "weight_decay must be finite and >= 0"),
    ([{"params": [1, 2]}], "'params' must hold Variables"),
])
def test_bad_parameter_groups_are_value_errors(groups, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        riftco.Adam(groups)


def test_a_parameter_in_two_groups_is_refused():
    p = tiny_model().trainable_parameters()[0]
    with pytest.raises(ValueError, match="appears twice"):
        riftco.Adam([{"params": [p]}, {"params": [p], "name": "again"}])


def test_gradient_accumulation_matches_the_larger_batch_and_is_recorded(tmp_path):
    data = corpus(tmp_path)
    common = dict(model=riftco.TransformerConfig(**TINY), data=data, steps=2, sequence_length=16,
                  eval_batches=1, eval_interval=0, warmup_steps=1)
    losses = {}
    for name, batch, k in [("big", 4, 1), ("micro", 2, 2)]:
        config = riftco.PretrainingConfig(**common, batch=batch, gradient_accumulation_steps=k,
                                          output_dir=tmp_path / name)
        seen = []
        riftco.pretrain(config, lambda r, seen=seen: seen.append((r.loss, r.grad_norm)), plot=False)
        losses[name] = seen
    assert losses["micro"][0] == pytest.approx(losses["big"][0], rel=1e-5)
    meta = json.loads((tmp_path / "micro" / "metadata.json").read_text())
    assert meta["config"]["gradient_accumulation_steps"] == 2
    assert meta["facts"]["effective_batch"] == 4
    assert meta["config"]["decay_embeddings"] is True
    assert meta["facts"]["parameter_groups"][1]["name"] == "no_decay"
    with pytest.raises(ValueError, match="gradient_accumulation_steps must be in"):
        riftco.pretrain(riftco.PretrainingConfig(**common, gradient_accumulation_steps=0,
                                                 output_dir=tmp_path / "bad"), plot=False)
    assert riftco.PostTrainingConfig(decay_embeddings=False).decay_embeddings is False


def test_sampling_options_stop_strings_and_samples():
    model = tiny_model(seed=3)
    greedy = model.generate("Hi", max_new_tokens=8, temperature=0)
    assert greedy.stop_index is None
    # The defaults of the new options leave generate() as it was.
    assert model.generate("Hi", max_new_tokens=8, temperature=0, top_p=1.0, repetition_penalty=1.0).tokens == \
        greedy.tokens
    stop = bytes([greedy.tokens[2]]).decode("latin-1")
    if greedy.tokens[2] < 128:
        cut = model.generate("Hi", max_new_tokens=8, temperature=0, stop=[stop, "never"])
        first = greedy.tokens.index(greedy.tokens[2])
        assert cut.stop_index == 0 and len(cut.tokens) == first + 1
        assert cut.text == bytes(greedy.tokens[:first]).decode("utf-8", "replace")
    samples = model.generate_samples("Hi", num_samples=3, max_new_tokens=6, seed=7, top_p=0.9,
                                     repetition_penalty=1.3)
    assert len(samples) == 3
    again = model.generate_samples("Hi", num_samples=3, max_new_tokens=6, seed=7, top_p=0.9,
                                   repetition_penalty=1.3)
    assert [s.tokens for s in samples] == [s.tokens for s in again]
    assert model.generate("Hi", max_new_tokens=6, seed=7, top_p=0.9, repetition_penalty=1.3).tokens == \
        samples[0].tokens


@pytest.mark.parametrize("kwargs, needle", [
    (dict(top_p=0.0), "top_p must be in"),
    (dict(top_p=float("nan")), "top_p must be in"),
    (dict(repetition_penalty=0.0), "repetition_penalty"),
    (dict(repetition_penalty=float("inf")), "repetition_penalty"),
    (dict(stop=[""]), "stop string 0 is empty"),
    (dict(stop=[b"x"]), "stop must be a str or a list of str"),
    (dict(stop=3), "stop must be a str or a list of str"),
])
def test_bad_sampling_options_are_value_errors(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        tiny_model().generate("Hi", max_new_tokens=2, **kwargs)


def test_num_samples_must_be_positive():
    with pytest.raises(ValueError, match="num_samples must be in"):
        tiny_model().generate_samples("Hi", num_samples=0, max_new_tokens=2)


def test_gradient_accumulator_sums_weighted_micro_batches_like_one_batch():
    model = tiny_model(seed=4)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 256, size=(4, 10))
    targets = np.roll(tokens, -1, axis=1)
    targets[0, :7] = -100  # unequal real-target counts per micro-batch
    model.loss(tokens, targets).backward()
    params = model.trainable_parameters()
    reference = [p.grad.copy() for p in params]
    opt = riftco.Adam(params, learning_rate=1e-2)
    acc = riftco.GradientAccumulator(opt.parameters)
    counts = [(targets[:2] != -100).sum(), (targets[2:] != -100).sum()]
    for rows, count in zip([slice(0, 2), slice(2, 4)], counts):
        model.loss(tokens[rows], targets[rows]).backward()
        acc.add(float(count / sum(counts)))
    assert acc.count == 2
    by_name = {p.name: g for p, g in zip(opt.parameters, acc.gradients)}
    for p, ref in zip(params, reference):
        np.testing.assert_allclose(by_name[p.name], ref, rtol=1e-5, atol=1e-6 * np.abs(ref).max())
    opt.zero_grad()
    before = params[0].numpy().copy()
    assert opt.step(acc) > 0
    assert not np.array_equal(params[0].numpy(), before)
    acc.clear()
    assert acc.count == 0 and acc.gradients[0] is None
    with pytest.raises(ValueError, match="weight must be finite"):
        acc.add(float("nan"))


def test_a_parameter_listed_twice_in_one_list_is_refused():
    # Was accepted: Adam then updated it twice per step.
    p = tiny_model().trainable_parameters()[0]
    with pytest.raises(ValueError, match="appears twice"):
        riftco.Adam([p, p])


def test_step_with_an_accumulator_of_other_parameters_is_refused():
    model = tiny_model()
    params = model.trainable_parameters()
    opt = riftco.Adam(riftco.default_parameter_groups(params, 0.1))  # groups' order differs from params
    tokens = np.arange(8, dtype=np.int32).reshape(1, 8)
    model.loss(tokens, tokens).backward()
    acc = riftco.GradientAccumulator(params)
    acc.add()
    before = [p.numpy().copy() for p in params]
    with pytest.raises(ValueError, match="GradientAccumulator's parameter 1 is"):
        opt.step(acc)
    assert opt.step_count == 0
    assert all(np.array_equal(b, p.numpy()) for b, p in zip(before, params))
    own = riftco.GradientAccumulator(opt.parameters)
    own.add()
    opt.step(own)
    assert opt.step_count == 1


@pytest.mark.parametrize("call, needle", [
    (lambda: riftco.Adam([1, 2]), r"\[Adam\] parameter 0 must be a Variable or a parameter-group dict, got int"),
    (lambda: riftco.Adam("ab"), r"\[Adam\] parameter 0 must be a Variable"),
    (lambda: riftco.GradientAccumulator([None]), r"\[GradientAccumulator\] parameter 0 must be a Variable, got NoneType"),
    (lambda: riftco.default_parameter_groups([1.5], 0.1), r"\[default_parameter_groups\] parameter 0 .* got float"),
    (lambda: riftco.default_parameter_groups([("w", 1.5)], 0.1), r"\[default_parameter_groups\] parameter 0 .* got tuple"),
    (lambda: riftco.TransformerConfig(rope_base="big"), r"TransformerConfig.rope_base expects float, got str"),
    (lambda: riftco.TransformerConfig(rope_base=None), r"TransformerConfig.rope_base expects float, got NoneType"),
    (lambda: riftco.PretrainingConfig(tokenizer=5), r"PretrainingConfig.tokenizer expects .*, got int"),
    (lambda: riftco.PretrainingConfig(activation_checkpointing=3),
     r"PretrainingConfig.activation_checkpointing expects str, got int"),
    (lambda: riftco.PostTrainingConfig(activation_checkpointing=4),
     r"PostTrainingConfig.activation_checkpointing expects str, got int"),
])
def test_wrong_types_are_type_errors_naming_the_argument(call, needle):
    # Were RuntimeError('std::bad_cast').
    with pytest.raises(TypeError, match=needle):
        call()


@pytest.mark.parametrize("kwargs, needle", [
    (dict(prompt="\ud800"), "the prompt is not valid Unicode"),
    (dict(prompt="Hi", stop="\udfff"), "the stop string is not valid Unicode"),
    (dict(prompt="Hi", stop=["ok", "\ud800x"]), "stop string 1 is not valid Unicode"),
])
def test_unencodable_prompt_and_stop_strings_are_value_errors(kwargs, needle):
    # Were RuntimeError('std::bad_cast').
    model = tiny_model()
    with pytest.raises(ValueError, match=needle):
        model.generate(max_new_tokens=2, **kwargs)
    with pytest.raises(ValueError, match=needle):
        model.generate_samples(num_samples=2, max_new_tokens=2, **kwargs)


def test_accumulator_used_from_several_threads_does_not_crash():
    # add() released the GIL: one thread's clear() freed the sums another
    # thread's add() (or Adam.step(acc)) was using: segfault.
    import threading
    import time
    model = riftco.DecoderOnlyTransformer(riftco.TransformerConfig(
        vocab_size=256, context_length=32, model_width=128, heads=4, layers=1, feed_forward_width=256), seed=1)
    opt = riftco.Adam(model.trainable_parameters())
    tokens = np.arange(32, dtype=np.int32).reshape(1, 32)
    model.loss(tokens, tokens).backward()
    acc = riftco.GradientAccumulator(opt.parameters)
    done = threading.Event()

    def loop(work):
        while not done.is_set():
            work()

    def step():
        model.loss(tokens, tokens).backward()  # a new commit: add() sums each commit's gradient once
        acc.add(1.0)
        opt.step(acc)

    threads = [threading.Thread(target=loop, args=(w,)) for w in (lambda: acc.add(0.5), acc.add, acc.clear, step)]
    for t in threads:
        t.start()
    time.sleep(2.0)
    done.set()
    for t in threads:
        t.join()
    assert acc.count >= 0 and opt.step_count > 0
