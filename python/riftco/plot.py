"""Loss curves with matplotlib: ``python -m riftco.plot RUN_DIR`` writes
RUN_DIR/loss_curve.png from RUN_DIR/metrics.jsonl (train loss every logged
step, validation loss where it was measured)."""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys
from typing import Dict, List, Optional, Tuple

Series = Tuple[List[int], List[float]]


def matplotlib_available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def read_metrics(run_dir) -> Dict[str, Series]:
    """{"train": (steps, losses), "validation": (steps, losses)} from metrics.jsonl (null losses → NaN)."""
    path = pathlib.Path(run_dir) / "metrics.jsonl"
    out: Dict[str, Series] = {"train": ([], []), "validation": ([], [])}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:  # every conversion of the row, so a bad value names the file and line too
            row = json.loads(line)
            step = int(row["step"])
            loss = _loss(row.get("loss"))
            validation = _loss(row["validation_loss"]) if "validation_loss" in row else None
        except (ValueError, KeyError, TypeError, OverflowError) as e:
            raise ValueError(f"{path}: line {number}: not a metrics row ({type(e).__name__}: {e})") from None
        out["train"][0].append(step)
        out["train"][1].append(loss)
        if validation is not None:
            out["validation"][0].append(step)
            out["validation"][1].append(validation)
    return out


def _loss(value) -> float:
    return math.nan if value is None else float(value)


def write_loss_curve(run_dir, output: Optional[pathlib.Path] = None, title: Optional[str] = None) -> pathlib.Path:
    """Draws the run's loss curve to `output` (default RUN_DIR/loss_curve.png); returns the path."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    run_dir = pathlib.Path(run_dir)
    output = pathlib.Path(output) if output is not None else run_dir / "loss_curve.png"
    if title is None:
        title = "loss"
        meta = run_dir / "metadata.json"
        if meta.exists():
            try:
                title = f"{json.loads(meta.read_text())['stage']} loss"
            except (ValueError, KeyError, TypeError):
                pass
    series = read_metrics(run_dir)
    figure = Figure(figsize=(8, 5), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    axes.plot(*series["train"], label="train loss", color="#1F77B4", linewidth=1.5)
    if series["validation"][0]:
        axes.plot(*series["validation"], label="validation loss", color="#D62728", marker="o", linewidth=1.5)
    axes.set_xlabel("step")
    axes.set_ylabel("cross-entropy (nats/token)")
    axes.set_title(title)
    axes.grid(True, alpha=0.3)
    axes.legend()
    figure.tight_layout()
    tmp = output.with_name(output.name + ".tmp")
    figure.savefig(tmp, format="png")
    tmp.replace(output)
    return output


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m riftco.plot", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=pathlib.Path, help="a run directory holding metrics.jsonl")
    parser.add_argument("--output", type=pathlib.Path, help="where to write (default RUN_DIR/loss_curve.png)")
    parser.add_argument("--title", help="plot title (default: '<stage> loss' from metadata.json)")
    args = parser.parse_args(argv)
    if not (args.run_dir / "metrics.jsonl").is_file():
        parser.error(f"{args.run_dir / 'metrics.jsonl'} not found: is {args.run_dir} a run directory?")
    if not matplotlib_available():
        print("error: matplotlib is not installed (pip install matplotlib)", file=sys.stderr)
        return 2
    print(write_loss_curve(args.run_dir, args.output, args.title))
    return 0


if __name__ == "__main__":
    sys.exit(main())
