"""Activation offload from Python (issue 18 step 4): the model property and
keyword, the stage configs' field. On the CPU nothing moves: same gradients,
same run; the CUDA side is tests/cuda/test_cuda_model.cpp."""
import json

import numpy as np

from riftco_import import import_riftco

riftco = import_riftco()
SHAPE = dict(vocab_size=256, context_length=64, model_width=32, heads=4, layers=4, feed_forward_width=64)


def grads(model):
    tokens = np.arange(96).reshape(3, 32) % 256
    model.loss(tokens, (tokens * 7 + 1) % 256).backward()
    return [p.grad.copy() for p in model.trainable_parameters()]


def test_model_property_and_keyword_change_no_bits_on_the_cpu():
    plain = riftco.DecoderOnlyTransformer(riftco.TransformerConfig(**SHAPE), seed=3, activation_checkpointing="block")
    assert plain.activation_offload is False
    offloaded = riftco.DecoderOnlyTransformer(riftco.TransformerConfig(**SHAPE), seed=3,
                                              activation_checkpointing="block", activation_offload=True)
    assert offloaded.activation_offload is True
    for want, got in zip(grads(plain), grads(offloaded)):
        np.testing.assert_array_equal(got, want)
    offloaded.activation_offload = False
    assert offloaded.activation_offload is False


def test_stage_config_field_is_recorded(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("".join(f"the quick brown fox {i % 7} jumps over the lazy dog.\n" for i in range(200)))
    assert riftco.PretrainingConfig().activation_offload is False
    assert riftco.PostTrainingConfig(activation_offload=True).activation_offload is True
    runs = {}
    for offload in (False, True):
        out = tmp_path / f"offload_{offload}"
        c = riftco.PretrainingConfig(model=riftco.TransformerConfig(**SHAPE), data=str(path), steps=2, batch=3,
                                     sequence_length=48, eval_interval=0, eval_batches=1, checkpoint_interval=0,
                                     activation_checkpointing="block", activation_offload=offload,
                                     output_dir=str(out))
        runs[offload] = riftco.pretrain(c, plot=False)
        assert json.loads((out / "metadata.json").read_text())["config"]["activation_offload"] is offload
    assert runs[True].final_train_loss == runs[False].final_train_loss
