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
        try:
            row = json.loads(line)
            step = int(row["step"])
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path}: line {number}: not a metrics row ({e})") from None
        value = row.get("loss")
        out["train"][0].append(step)
        out["train"][1].append(math.nan if value is None else float(value))
        if "validation_loss" in row:
            value = row["validation_loss"]
            out["validation"][0].append(step)
            out["validation"][1].append(math.nan if value is None else float(value))
    return out


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
