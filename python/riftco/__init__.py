"""riftco: a transformer training lab with activation checkpointing.

A thin Python layer over the C++ core (nanobind): the classes and functions
below are the C++ ones, with numpy arrays for values and gradients and Python
exceptions for C++ errors. See docs/python.md.

    from riftco import DecoderOnlyTransformer, TransformerConfig
    model = DecoderOnlyTransformer(TransformerConfig(layers=2), attention="flash",
                                   activation_checkpointing="block").to("cpu")
"""
from __future__ import annotations

from ._core import (  # noqa: F401  (re-exported)
    ACTIVATION_CHECKPOINTING_KINDS,
    ATTENTION_KINDS,
    FINE_TUNING_METHODS,
    Adam,
    BackendError,
    BackwardError,
    ByteTokenizer,
    CheckpointContractError,
    CheckpointViolation,
    DataError,
    DecodeSession,
    DecoderOnlyTransformer,
    Error,
    EvaluationResult,
    GenerationResult,
    GradientAccumulator,
    GraphStatistics,
    LoadOptions,
    LoraConfig,
    MemoryStats,
    ModelStateError,
    PartialStepError,
    PostTrainingConfig,
    PretrainingConfig,
    RetainedNode,
    RunResult,
    ShapeError,
    StaleGraphError,
    StepReport,
    Tokenizer,
    TransformerConfig,
    ValueError,
    Variable,
    add,
    available_backends,
    causal_attention,
    causal_mask,
    checkpoint,
    convert_from_hf,
    convert_to_hf,
    checkpoint_replay_count,
    checkpoint_replaying,
    cross_entropy,
    default_parameter_groups,
    embedding,
    evaluate,
    gelu,
    is_grad_enabled,
    linear,
    load_hf_llama,
    load_model,
    matmul,
    mean,
    memory_stats,
    model_fingerprint,
    mul,
    no_grad,
    permute,
    read_model_config,
    release_cached_memory,
    repeat_heads,
    reset_checkpoint_replay_count,
    reset_peak_memory,
    reshape,
    rms_norm,
    rope,
    run_post_training,
    run_pretraining,
    scale,
    silu,
    softmax,
    split_text,
    sub,
    sum,
    swiglu,
    train_tokenizer,
    transpose,
)
from ._pipelines import post_train, pretrain  # noqa: F401


def _no_grad_call(self, fn):
    """`@riftco.no_grad()` on a function runs every call of it without building graphs (PyTorch's form).
    On a generator function every step of the generator runs without graphs, and the caller's code
    between its yields with them, as PyTorch's decorator does (the plain wrapper only covered the call
    that creates the generator, so its body built graphs)."""
    import functools
    import inspect

    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def generator_without_grad(*args, **kwargs):
            gen = fn(*args, **kwargs)
            try:
                with self:
                    response = gen.send(None)
                while True:
                    try:
                        request = yield response
                    except GeneratorExit:
                        with self:
                            gen.close()
                        raise
                    except BaseException as error:  # thrown in by the caller: into the generator
                        with self:
                            response = gen.throw(error)
                    else:
                        with self:
                            response = gen.send(request)
            except StopIteration as stop:
                return stop.value
        return generator_without_grad

    @functools.wraps(fn)
    def without_grad(*args, **kwargs):
        with self:
            return fn(*args, **kwargs)
    return without_grad


no_grad.__call__ = _no_grad_call

__version__ = "0.1.0"

# Tracebacks and reprs say riftco.ShapeError, not riftco._core.ShapeError.
for _name, _obj in list(globals().items()):
    if isinstance(_obj, type) and getattr(_obj, "__module__", "") == "riftco._core":
        try:
            _obj.__module__ = "riftco"
        except (AttributeError, TypeError):
            pass
del _name, _obj

# Names `from riftco import *` brings (not ValueError/sum, which would shadow builtins).
__all__ = [
    "ACTIVATION_CHECKPOINTING_KINDS", "ATTENTION_KINDS", "FINE_TUNING_METHODS", "Adam", "BackendError",
    "BackwardError", "ByteTokenizer", "CheckpointContractError", "CheckpointViolation", "DataError",
    "DecodeSession", "DecoderOnlyTransformer", "Error", "EvaluationResult", "GenerationResult", "GradientAccumulator", "GraphStatistics", "LoadOptions",
    "LoraConfig", "MemoryStats", "ModelStateError", "PartialStepError", "PostTrainingConfig", "PretrainingConfig", "RetainedNode",
    "RunResult", "ShapeError", "StaleGraphError", "StepReport", "Tokenizer", "TransformerConfig", "Variable",
    "available_backends", "checkpoint", "default_parameter_groups", "evaluate", "checkpoint_replay_count", "checkpoint_replaying", "load_model", "memory_stats",
    "model_fingerprint", "no_grad", "post_train", "pretrain", "read_model_config", "release_cached_memory",
    "reset_checkpoint_replay_count", "reset_peak_memory", "split_text", "train_tokenizer",
    "is_grad_enabled", "convert_from_hf", "convert_to_hf", "load_hf_llama",
]
