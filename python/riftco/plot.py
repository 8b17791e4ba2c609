"""Loss curves with matplotlib: ``python -m riftco.plot RUN_DIR`` writes
RUN_DIR/loss_curve.png from RUN_DIR/metrics.jsonl (train loss every logged
step, validation loss where it was measured)."""
from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import secrets
import stat
import sys
from typing import Dict, List, Optional, Tuple

Series = Tuple[List[int], List[float]]


def matplotlib_available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


_MAX_FILE_BYTES = 1 << 30


def _read_regular_file(path: pathlib.Path) -> str:
    """The text of `path`, which must be a regular file: opened without blocking and checked
    with fstat first (a FIFO or a device would block or never end; the C++ loaders do the same).
    OSError naming the path otherwise; UnicodeDecodeError for text that is not UTF-8."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"{path}: not a regular file")
        if info.st_size > _MAX_FILE_BYTES:
            raise OSError(f"{path}: {info.st_size} bytes, over the {_MAX_FILE_BYTES}-byte limit")
        chunks = []
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks).decode("utf-8")
    finally:
        os.close(fd)


def read_metrics(run_dir) -> Dict[str, Series]:
    """{"train": (steps, losses), "validation": (steps, losses)} from metrics.jsonl (null losses → NaN)."""
    path = pathlib.Path(run_dir) / "metrics.jsonl"
    out: Dict[str, Series] = {"train": ([], []), "validation": ([], [])}
    for number, line in enumerate(_read_regular_file(path).splitlines(), 1):
        if not line.strip():
            continue
        try:  # every conversion of the row, so a bad value names the file and line too
            row = json.loads(line)
            step = row["step"]
            if type(step) is not int:  # noqa: E721 - a bool or 2.9 is no step
                raise TypeError(f"step {step!r} is not an integer")
            loss = _loss(row.get("loss"))
            validation = _loss(row["validation_loss"]) if "validation_loss" in row else None
        except (ValueError, KeyError, TypeError, OverflowError, RecursionError) as e:
            raise ValueError(f"{path}: line {number}: not a metrics row ({type(e).__name__}: {e})") from None
        out["train"][0].append(step)
        out["train"][1].append(loss)
        if validation is not None:
            out["validation"][0].append(step)
            out["validation"][1].append(validation)
    return out


def _loss(value) -> float:
    if value is None:
        return math.nan
    if type(value) not in (int, float):  # "1.5" or true is no loss
        raise TypeError(f"loss {value!r} is not a number or null")
    return float(value)


def write_loss_curve(run_dir, output: Optional[pathlib.Path] = None, title: Optional[str] = None) -> pathlib.Path:
    """Draws the run's loss curve to `output` (default RUN_DIR/loss_curve.png); returns the path."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    run_dir = pathlib.Path(run_dir)
    output = pathlib.Path(output) if output is not None else run_dir / "loss_curve.png"
    _check_replaceable(output)  # before drawing (and again just before writing)
    if title is None:
        title = "loss"
        meta = run_dir / "metadata.json"
        if meta.exists():
            try:
                title = f"{json.loads(_read_regular_file(meta))['stage']} loss"
            except (OSError, ValueError, KeyError, TypeError, RecursionError):
                pass  # the title only
    series = read_metrics(run_dir)
    figure = Figure(figsize=(8, 5), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    # A diverged run's ±1e308 made matplotlib's linear axis overflow (an
    # IndexError deep in its tick code): such a range is drawn on a symlog
    # axis, clipped to ±1e30 (its autoscaled ticks overflowed near 1e300).
    finite = [v for v in series["train"][1] + series["validation"][1] if math.isfinite(v)]
    huge = bool(finite) and not (math.isfinite(max(finite) - min(finite)) and max(abs(v) for v in finite) < 1e100)

    def drawn(values):
        return [max(-1e30, min(1e30, v)) if huge and math.isfinite(v) else v for v in values]

    axes.plot(series["train"][0], drawn(series["train"][1]), label="train loss", color="#1F77B4", linewidth=1.5)
    if series["validation"][0]:
        axes.plot(series["validation"][0], drawn(series["validation"][1]), label="validation loss", color="#D62728",
                  marker="o", linewidth=1.5)
    if huge:
        axes.set_yscale("symlog")
    axes.set_xlabel("step")
    axes.set_ylabel("cross-entropy (nats/token" + (", symlog; beyond ±1e30 drawn at ±1e30)" if huge else ")"))
    axes.set_title(title)
    axes.grid(True, alpha=0.3)
    axes.legend()
    figure.tight_layout()
    _write_atomically(output, lambda f: figure.savefig(f, format="png"))
    return output


def _check_replaceable(output: pathlib.Path) -> None:
    """As the C++ writer (atomic_file.cpp): only a missing target or a regular file is replaced;
    os.replace would put the file in place of a symlink itself, or fail on a directory late."""
    try:
        mode = os.lstat(output).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(f"[write_loss_curve] {output}: the target is a directory")
    if not stat.S_ISREG(mode):
        raise FileExistsError(f"[write_loss_curve] {output}: the target exists and is not a regular file "
                              "(a symlink, device, FIFO or socket): refusing to replace it")


def _write_atomically(output: pathlib.Path, write) -> None:
    """write(file) into a temporary of its own beside `output` (".<name>.tmp.<pid>.<digits>", created
    with O_EXCL, so concurrent writers never share one; mode 0666 less the umask, as open() gives),
    fsync, os.replace over `output`, fsync the directory. The temporary is removed on any failure
    (KeyboardInterrupt included); `output` is then the old file or absent, never a partial one."""
    _check_replaceable(output)
    directory = output.parent
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    # The C++ writer's names (src/io/atomic_file.cpp): at most 228 bytes of the
    # target's name, cut between characters, so any valid name fits NAME_MAX;
    # digits only after ".tmp.", so remove_stale_temporaries recognises one a
    # killed plot left.
    name = os.fsencode(output.name)
    cut = min(len(name), 228)
    while 0 < cut < len(name) and (name[cut] & 0xC0) == 0x80:
        cut -= 1
    for _ in range(100):
        suffix = f".tmp.{os.getpid()}.{secrets.randbelow(10**12)}".encode()
        temporary = directory / os.fsdecode(b"." + name[:cut] + suffix)
        try:
            fd = os.open(temporary, flags, 0o666)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"[write_loss_curve] {output}: cannot create a temporary file in {directory}")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, output)
    except BaseException:
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass
        raise
    dir_fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


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
    try:
        print(write_loss_curve(args.run_dir, args.output, args.title))
    except (OSError, ValueError) as e:  # a target that cannot be replaced, an unreadable or bad metrics row
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
