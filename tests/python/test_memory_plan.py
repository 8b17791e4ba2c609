"""Issue 15 from Python: activation memory budgets in the stage configs, the
per-block plan on a model, and plan_activation_memory."""
import json

import numpy as np
import pytest

from riftco_import import import_riftco

riftco = import_riftco()
SHAPE = dict(vocab_size=256, context_length=64, model_width=32, heads=4, layers=4, feed_forward_width=64)


def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("".join(f"the quick brown fox {i % 7} jumps over the lazy dog.\n" for i in range(200)))
    return path


def config(tmp_path, name, **kw):
    return riftco.PretrainingConfig(model=riftco.TransformerConfig(**SHAPE), data=str(corpus(tmp_path)), steps=2,
                                    batch=3, sequence_length=48, eval_interval=0, eval_batches=1,
                                    checkpoint_interval=0, output_dir=str(tmp_path / name), **kw)


def test_budget_accepts_sizes_and_refuses_nonsense():
    assert riftco.PretrainingConfig(activation_memory_budget="2MiB").activation_memory_budget == 2 << 20
    assert riftco.PretrainingConfig(activation_memory_budget=12345).activation_memory_budget == 12345
    assert riftco.PostTrainingConfig(activation_memory_budget="1.5 kib").activation_memory_budget == 1536
    for bad in ("lots", "-1MiB", "5 parsecs", ""):
        with pytest.raises(ValueError, match="activation_memory_budget"):
            riftco.PretrainingConfig(activation_memory_budget=bad)
    with pytest.raises(ValueError, match="activation_memory_budget"):
        riftco.PretrainingConfig(activation_memory_budget=-5)
    with pytest.raises(TypeError):
        riftco.PretrainingConfig(activation_memory_budget=True)
    with pytest.raises(TypeError):
        riftco.PretrainingConfig(activation_memory_budget=1.5)


def test_pretraining_under_a_budget(tmp_path):
    free = riftco.pretrain(config(tmp_path, "free"), plot=False)
    assert free.activation_memory_plan == ""
    budget = free.activation_peak_bytes * 3 // 4
    peaks = []
    run = riftco.pretrain(config(tmp_path, "planned", activation_memory_budget=budget),
                          lambda r: peaks.append(r.activation_peak_bytes), plot=False)
    assert run.completed and 0 < max(peaks) <= budget and run.activation_peak_bytes <= budget
    assert run.final_train_loss == free.final_train_loss
    assert "predicted activation peak" in run.activation_memory_plan
    meta = json.loads((tmp_path / "planned" / "metadata.json").read_text())
    assert meta["config"]["activation_memory_budget"] == budget
    assert meta["facts"]["activation_memory_plan"]["predicted_peak_bytes"] <= budget
    with pytest.raises(ValueError, match="smallest plan"):
        riftco.pretrain(config(tmp_path, "tiny", activation_memory_budget=1000), plot=False)
    assert not (tmp_path / "tiny").exists()


def test_model_plans_and_the_planner():
    model = riftco.DecoderOnlyTransformer(riftco.TransformerConfig(**SHAPE), seed=3, attention="flash")
    tokens = np.arange(96).reshape(3, 32) % 256
    targets = (tokens * 7 + 1) % 256
    model.loss(tokens, targets).backward()
    reference = [p.grad.copy() for p in model.trainable_parameters()]

    model.activation_checkpointing_plan = [(1, "attention"), (2, "block"), (1, "mlp")]
    assert model.activation_checkpointing == "planned"
    assert model.activation_checkpointing_plan == [(1, "attention"), (2, "block"), (1, "mlp")]
    model.loss(tokens, targets).backward()
    for want, p in zip(reference, model.trainable_parameters()):
        np.testing.assert_array_equal(p.grad, want)
    for bad in ([(4, "mlp")], [(1, "keep")], [(4, "sometimes")]):
        with pytest.raises(ValueError):
            model.activation_checkpointing_plan = bad
    with pytest.raises(ValueError, match="planned"):
        model.activation_checkpointing = "planned"

    loose = model.plan_activation_memory("1GiB", batch=3, sequence_length=32, apply=False)
    assert loose["plan"] == [(1, "keep")] * 4 and loose["recompute_flops"] == 0
    assert loose["pinned_host_bytes"] == 0  # offload off
    model.activation_offload = True  # a cpu model: offload moves nothing, so the plan keeps no host bytes either
    with_offload = model.plan_activation_memory("1GiB", batch=3, sequence_length=32, apply=False)
    assert with_offload["pinned_host_bytes"] == 0 and with_offload["plan"] == loose["plan"]
    model.activation_offload = False
    middle = (loose["smallest_feasible_bytes"] + loose["disabled_peak_bytes"]) // 2
    planned = model.plan_activation_memory(middle, batch=3, sequence_length=32)
    assert planned["predicted_peak_bytes"] <= middle and model.activation_checkpointing == "planned"
    assert model.activation_checkpointing_plan == planned["plan"]
    with pytest.raises(ValueError, match=str(loose["smallest_feasible_bytes"])):
        model.plan_activation_memory(loose["smallest_feasible_bytes"] - 1, batch=3, sequence_length=32)


def test_planner_refuses_only_models_none_of_whose_blocks_trains():
    model = riftco.DecoderOnlyTransformer(riftco.TransformerConfig(**SHAPE), seed=3, attention="flash")
    model.add_lora(rank=2)
    model.set_base_trainable(False)
    for name, adapter in model.lora_parameters():  # adapters trained in blocks 1-3 only
        adapter.requires_grad = not name.startswith("blocks.0.")
    assert model.plan_activation_memory("1GiB", batch=2, sequence_length=16, apply=False)["recompute_flops"] == 0
    model.lora_active = False  # inactive adapters are not in the graph: no block trains
    with pytest.raises(ValueError, match="no block of the model has a trainable parameter"):
        model.plan_activation_memory("1GiB", batch=2, sequence_length=16)
