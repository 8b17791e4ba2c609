"""Number arguments of the bound functions (generate's max_new_tokens, Adam's
learning_rate, evaluate's batch, ...). Python's bool is an int subclass and
nanobind's casters took True as 1: generate(max_new_tokens=True) ran one
token, Adam(learning_rate=True) trained at 1.0. Now a bool is a TypeError
there, as the config classes' fields already refuse one, and an int that does
not fit is a riftco.ValueError naming the argument and its range (was the
generic "incompatible function arguments"). numpy numbers still convert."""
import re

import numpy as np
import pytest

from riftco_import import import_riftco

riftco = import_riftco()
TINY = dict(vocab_size=256, context_length=16, model_width=16, heads=2, layers=1, feed_forward_width=32)


def tiny_model(**kw):
    return riftco.DecoderOnlyTransformer(riftco.TransformerConfig(**TINY), **kw)


def calls(model):
    """name -> a function taking one keyword value for that argument."""
    params = model.trainable_parameters()
    return {
        "generate max_new_tokens": lambda v: model.generate("ab", max_new_tokens=v),
        "generate top_k": lambda v: model.generate("ab", max_new_tokens=1, top_k=v),
        "generate seed": lambda v: model.generate("ab", max_new_tokens=1, seed=v),
        "generate temperature": lambda v: model.generate("ab", max_new_tokens=1, temperature=v),
        "generate top_p": lambda v: model.generate("ab", max_new_tokens=1, top_p=v),
        "generate repetition_penalty": lambda v: model.generate("ab", max_new_tokens=1, repetition_penalty=v),
        "generate_samples num_samples": lambda v: model.generate_samples("ab", num_samples=v, max_new_tokens=1),
        "DecoderOnlyTransformer seed": lambda v: tiny_model(seed=v),
        "DecoderOnlyTransformer norm_epsilon": lambda v: tiny_model(norm_epsilon=v),
        "Adam learning_rate": lambda v: riftco.Adam(params, learning_rate=v),
        "Adam beta1": lambda v: riftco.Adam(params, beta1=v),
        "Adam weight_decay": lambda v: riftco.Adam(params, weight_decay=v),
        "Adam max_grad_norm": lambda v: riftco.Adam(params, max_grad_norm=v),
        "default_parameter_groups weight_decay": lambda v: riftco.default_parameter_groups(
            model.named_parameters(), v),
        "GradientAccumulator.add weight": lambda v: riftco.GradientAccumulator(params).add(v),
        "evaluate batch": lambda v: riftco.evaluate(model, "abcdefgh" * 8, batch=v),
        "evaluate sequence_length": lambda v: riftco.evaluate(model, "abcdefgh" * 8, sequence_length=v),
        "plan_activation_memory batch": lambda v: model.plan_activation_memory("1GiB", v, 8, apply=False),
        "plan_activation_memory sequence_length": lambda v: model.plan_activation_memory("1GiB", 1, v, apply=False),
        "plan_activation_memory budget": lambda v: model.plan_activation_memory(v, 1, 8, apply=False),
        "split_text validation_fraction": lambda v: riftco.split_text("abcdef", "train", v),
    }


INTS = {"generate max_new_tokens", "generate top_k", "generate seed", "generate_samples num_samples",
        "DecoderOnlyTransformer seed", "evaluate batch", "evaluate sequence_length",
        "plan_activation_memory batch", "plan_activation_memory sequence_length", "plan_activation_memory budget"}
GOOD = {  # a value each argument takes (as a numpy number: converted as PyTorch converts it)
    "generate max_new_tokens": 1, "generate top_k": 2, "generate seed": 3, "generate temperature": 0.5,
    "generate top_p": 0.9, "generate repetition_penalty": 1.1, "generate_samples num_samples": 2,
    "DecoderOnlyTransformer seed": 4, "DecoderOnlyTransformer norm_epsilon": 1e-5, "Adam learning_rate": 1e-3,
    "Adam beta1": 0.9, "Adam weight_decay": 0.1, "Adam max_grad_norm": 1.0,
    "default_parameter_groups weight_decay": 0.1, "GradientAccumulator.add weight": 0.5, "evaluate batch": 2,
    "evaluate sequence_length": 8, "plan_activation_memory batch": 1, "plan_activation_memory sequence_length": 8,
    "plan_activation_memory budget": 1 << 30, "split_text validation_fraction": 0.5,
}


@pytest.mark.parametrize("name", sorted(GOOD))
def test_a_bool_is_refused_where_a_number_is_expected(name):
    model = tiny_model()
    call = calls(model)[name]
    for flag in (True, False, np.True_, np.False_):  # numpy's converts through __index__ and __float__
        with pytest.raises(TypeError):
            call(flag)
    call(GOOD[name])  # the model is still usable: nothing was half-applied


@pytest.mark.parametrize("name", sorted(GOOD))
def test_numpy_numbers_convert(name):
    model = tiny_model()
    value = GOOD[name]
    call = calls(model)[name]
    call(np.int64(value) if name in INTS else np.float32(value))
    if name not in INTS:
        call(int(value) if float(value).is_integer() else value)  # an int where a float is expected converts


@pytest.mark.parametrize("name", sorted(INTS))
def test_an_int_that_does_not_fit_names_the_argument(name):
    model = tiny_model()
    with pytest.raises(riftco.ValueError) as raised:
        calls(model)[name](1 << 80)
    message = str(raised.value)
    assert name.split()[-1] in message and "must be in [" in message and str(1 << 80) in message


@pytest.mark.parametrize("name", sorted(INTS))
def test_a_float_is_refused_where_an_int_is_expected(name):
    model = tiny_model()
    with pytest.raises(TypeError):
        calls(model)[name](2.0)


def test_a_negative_seed_names_the_range():
    with pytest.raises(riftco.ValueError, match=r"seed must be in \[0, 18446744073709551615\], got -1"):
        tiny_model().generate("ab", max_new_tokens=1, seed=-1)
    assert tiny_model().generate("ab", max_new_tokens=2, seed=(1 << 64) - 1).tokens  # the largest seed works


def test_a_bool_for_max_new_tokens_was_one_token():
    model = tiny_model()
    with pytest.raises(TypeError, match="max_new_tokens: int"):  # the signature shows what is expected
        model.generate("ab", max_new_tokens=True)
    assert len(model.generate("ab", max_new_tokens=3, temperature=0.0).tokens) == 3


def test_setters_losses_decoding_and_ops_refuse_a_bool_too():
    model = tiny_model()
    opt = riftco.Adam(model.trainable_parameters())
    x = riftco.Variable(np.ones((1, 2, 3, 4), dtype=np.float32))
    refused = {
        "Adam.learning_rate =": lambda v: setattr(opt, "learning_rate", v),
        "loss ignore_index": lambda v: model.loss([1, 2], [2, 3], ignore_index=v),
        "cross_entropy ignore_index": lambda v: riftco.cross_entropy(model([1, 2]), [2, 3], ignore_index=v),
        "set_dropout seed": lambda v: model.set_dropout(0.1, seed=v),
        "checkpoint_segment_blocks =": lambda v: setattr(model, "checkpoint_segment_blocks", v),
        "DecodeSession.decode_token": lambda v: riftco.DecodeSession(model).decode_token(v),
        "transpose dim0": lambda v: riftco.transpose(x, v, 2),
        "permute dims": lambda v: riftco.permute(x, [0, v, 2, 3]),
        "reshape shape": lambda v: riftco.reshape(x, [v, 24]),
        "repeat_heads groups": lambda v: riftco.repeat_heads(x, v),
        "causal_mask offset": lambda v: riftco.causal_mask(x, v),
        "rope position_offset": lambda v: riftco.rope(x, v),
        "rope base": lambda v: riftco.rope(x, 0, v),
        "scale factor": lambda v: riftco.scale(x, v),
        "block_dependencies index": lambda v: model.block_dependencies(v),
    }
    for name, call in refused.items():
        for flag in (True, np.True_):
            with pytest.raises(TypeError):
                call(flag)
        good = 2.0 if "base" in name or "factor" in name else np.int64(0 if "index" in name else 1)
        call(good)  # a number works
    assert opt.learning_rate == 1.0  # set by the number, not by True before it
    with pytest.raises(riftco.ValueError, match=r"ignore_index must be in \[-2147483648, 2147483647\]"):
        model.loss([1, 2], [2, 3], ignore_index=1 << 31)


def test_plan_groups_and_adam_groups_name_what_is_wrong():
    model = tiny_model()
    for plan, needle in [([(1, 2), (1, "keep")], "group 0 must be a (blocks, kind) pair with kind"),
                         ([1], "group 0 must be a (blocks, kind) pair, got int"),
                         ([(True, "keep")], "group 0 blocks must be an int")]:
        with pytest.raises(TypeError, match=re.escape(needle)):
            model.activation_checkpointing_plan = plan
    params = model.trainable_parameters()
    with pytest.raises(riftco.ValueError, match="parameter group 0: 'weight_decay' must be a number .* fits a float32"):
        riftco.Adam([{"params": params, "weight_decay": 10 ** 400}])
    for decay in (np.float32(0.1), np.int64(0), 0.1, 0):  # numpy numbers too, as the docs say
        riftco.Adam([{"params": params, "weight_decay": decay}])
    with pytest.raises(riftco.ValueError, match="not a bool"):
        riftco.Adam([{"params": params, "weight_decay": np.True_}])
    with pytest.raises(riftco.ValueError, match="parameter group 0: 'name'"):
        riftco.Adam([{"params": params, "name": "\udcff"}])


def test_config_fields_refuse_a_numpy_bool():
    with pytest.raises(TypeError):
        riftco.PretrainingConfig(steps=np.True_)
    with pytest.raises(TypeError):
        riftco.PretrainingConfig(learning_rate=np.True_)
    assert riftco.PretrainingConfig(steps=np.int64(3)).steps == 3
