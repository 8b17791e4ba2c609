"""ZeRO stage and gradient bucket size from Python (issue 17): the stage
configs' int fields, their type and value checks, and a one-process run
with zero_stage=1 equal to plain Adam (ZeRO-1 needs mpirun to shard;
tests/mpi/test_data_parallel.cpp covers two ranks)."""
import json

import pytest

from riftco_import import import_riftco

riftco = import_riftco()
SHAPE = dict(vocab_size=256, context_length=64, model_width=32, heads=4, layers=2, feed_forward_width=64)


def test_defaults_and_keywords():
    for cls in (riftco.PretrainingConfig, riftco.PostTrainingConfig):
        assert cls().zero_stage == 0
        assert cls().gradient_bucket_mib == 25
        c = cls(zero_stage=1, gradient_bucket_mib=4)
        assert (c.zero_stage, c.gradient_bucket_mib) == (1, 4)


@pytest.mark.parametrize("kwargs, needle", [
    (dict(zero_stage="1"), r"PretrainingConfig.zero_stage expects int, got str"),
    (dict(zero_stage=1.0), r"PretrainingConfig.zero_stage expects int, got float"),
    (dict(gradient_bucket_mib=None), r"PretrainingConfig.gradient_bucket_mib expects int, got NoneType"),
    # bool is an int subclass: True would silently be ZeRO-1, False a 0 MiB bucket.
    (dict(zero_stage=True), r"PretrainingConfig.zero_stage expects int, got bool"),
    (dict(gradient_bucket_mib=False), r"PretrainingConfig.gradient_bucket_mib expects int, got bool"),
    (dict(steps=True), r"PretrainingConfig.steps expects int, got bool"),
    (dict(dropout=True), r"PretrainingConfig.dropout expects float, got bool"),
])
def test_wrong_types_are_type_errors_naming_the_field(kwargs, needle):
    with pytest.raises(TypeError, match=needle):
        riftco.PretrainingConfig(**kwargs)


def run(tmp_path, name, **kwargs):
    path = tmp_path / "corpus.txt"
    path.write_text("".join(f"the quick brown fox {i % 7} jumps over the lazy dog.\n" for i in range(200)))
    out = tmp_path / name
    c = riftco.PretrainingConfig(model=riftco.TransformerConfig(**SHAPE), data=str(path), steps=3, batch=2,
                                 sequence_length=32, eval_interval=0, eval_batches=1, checkpoint_interval=0,
                                 output_dir=str(out), **kwargs)
    return riftco.pretrain(c, plot=False), out


@pytest.mark.parametrize("kwargs, needle", [
    (dict(zero_stage=2), "zero_stage must be 0"),
    (dict(zero_stage=-1), "zero_stage must be 0"),
    (dict(gradient_bucket_mib=0), r"gradient_bucket_mib must be in \[1, 65536\]"),
])
def test_bad_values_are_value_errors_before_anything_is_written(tmp_path, kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        run(tmp_path, "bad", **kwargs)
    assert not (tmp_path / "bad").exists()


def test_one_process_zero_1_is_plain_adam_and_recorded(tmp_path):
    plain, _ = run(tmp_path, "plain")
    zero, out = run(tmp_path, "zero", zero_stage=1, gradient_bucket_mib=1)
    assert zero.final_train_loss == plain.final_train_loss
    assert zero.final_validation_loss == plain.final_validation_loss
    config = json.loads((out / "metadata.json").read_text())["config"]
    assert (config["zero_stage"], config["gradient_bucket_mib"]) == (1, 1)


@pytest.mark.parametrize("cls", [riftco.PretrainingConfig, riftco.PostTrainingConfig])
@pytest.mark.parametrize("field, value, kind", [
    ("zero_stage", True, "bool"), ("zero_stage", "1", "str"), ("zero_stage", 1.0, "float"), ("zero_stage", None, "NoneType"),
    ("gradient_bucket_mib", False, "bool"), ("learning_rate", True, "bool"), ("learning_rate", "0.1", "str"),
])
def test_attribute_assignment_refuses_the_same_types_and_keeps_the_value(cls, field, value, kind):
    c = cls()
    before = getattr(c, field)
    with pytest.raises(TypeError, match=rf"{cls.__name__}.{field} expects (int|float), got {kind}"):
        setattr(c, field, value)
    assert getattr(c, field) == before
    c.zero_stage = 1
    assert c.zero_stage == 1 and type(c.zero_stage) is int


def test_int_fields_out_of_range_are_errors_not_wraparound():
    with pytest.raises((TypeError, OverflowError, ValueError)):
        riftco.PretrainingConfig(zero_stage=2**64)
