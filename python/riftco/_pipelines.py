"""riftco.pretrain / riftco.post_train: the C++ stage pipelines, plus the PNG
loss curve drawn with matplotlib when it is installed."""
from __future__ import annotations

from typing import Callable, Optional

from . import _core

Progress = Callable[[_core.StepReport], Optional[bool]]


def _finish(result: _core.RunResult, plot: bool) -> _core.RunResult:
    if plot and result.completed:
        from . import plot as _plot

        if _plot.matplotlib_available():
            _plot.write_loss_curve(result.output_dir)
    return result


def pretrain(config: _core.PretrainingConfig, progress: Optional[Progress] = None, *,
             plot: bool = True) -> _core.RunResult:
    """Runs the pretraining pipeline; returns a RunResult whose .files lists what the run wrote.

    progress(report) is called after every step; returning False stops the run (no final files,
    resumable with resume=True). Ctrl-C stops it the same way after the current step, then raises
    KeyboardInterrupt. plot: also write loss_curve.png with matplotlib (when installed).
    """
    return _finish(_core.run_pretraining(config, progress), plot)


def post_train(config: _core.PostTrainingConfig, progress: Optional[Progress] = None, *,
               plot: bool = True) -> _core.RunResult:
    """Runs the post-training pipeline (LoRA or full fine-tuning); see pretrain()."""
    return _finish(_core.run_post_training(config, progress), plot)
