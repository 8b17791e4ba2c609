"""riftco.pretrain / riftco.post_train: the C++ stage pipelines, plus the PNG
loss curve drawn with matplotlib when it is installed."""
from __future__ import annotations

import warnings
from typing import Callable, Optional

from . import _core

Progress = Callable[[_core.StepReport], Optional[bool]]


def _finish(result: _core.RunResult, plot: bool, stage: str) -> _core.RunResult:
    """The run has completed and written its files: a loss curve that cannot be drawn or written (a
    directory in its place, a full disk, a broken matplotlib) is a warning, never the loss of the
    RunResult."""
    if plot and result.completed:
        try:
            from . import plot as _plot

            if _plot.matplotlib_available():
                _plot.write_loss_curve(result.output_dir)
        except Exception as e:  # noqa: BLE001 - anything the plot raises; KeyboardInterrupt still stops
            warnings.warn(f"riftco.{stage}: the run completed, but its loss curve was not written "
                          f"({type(e).__name__}: {e})",
                          RuntimeWarning, stacklevel=3)
    return result


def pretrain(config: _core.PretrainingConfig, progress: Optional[Progress] = None, *,
             plot: bool = True) -> _core.RunResult:
    """Runs the pretraining pipeline; returns a RunResult whose .files lists what the run wrote.

    progress(report) is called after every step; returning False stops the run (no final files,
    resumable with resume=True). Ctrl-C stops it the same way after the current step, then raises
    KeyboardInterrupt. plot: also write loss_curve.png with matplotlib (when installed); a plot that
    fails is a RuntimeWarning naming the failure, and the RunResult is still returned.
    """
    return _finish(_core.run_pretraining(config, progress), plot, "pretrain")


def post_train(config: _core.PostTrainingConfig, progress: Optional[Progress] = None, *,
               plot: bool = True) -> _core.RunResult:
    """Runs the post-training pipeline (LoRA or full fine-tuning); see pretrain()."""
    return _finish(_core.run_post_training(config, progress), plot, "post_train")
