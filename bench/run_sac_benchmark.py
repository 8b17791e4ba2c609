#!/usr/bin/python3
"""riftco's checkpointing policies vs PyTorch 2.x selective activation
checkpointing: step time and peak memory, side by side (issue 15, item 4).

    /usr/bin/python3 bench/run_sac_benchmark.py              # full run: S1-S3, 3 rounds, writes the docs
    /usr/bin/python3 bench/run_sac_benchmark.py --quick      # tiny shape, 1 round, no docs (< 2 min)

Builds nothing: expects build/rt-bench-step. PyTorch 2.x comes from
scripts/torch2_env.sh (.venv-torch2/, created on first use from PyPI; several
GB) or --torch-python. Before measuring it runs `torch_sac_step.py --check`
(every PyTorch policy gives the reference model's loss and gradients).

For every shape (run_benchmarks.py's S1-S3) it runs, in fresh processes,
alternating round by round (order reversed in odd rounds), 2 threads,
OMP_WAIT_POLICY=passive on both sides:
  * ours:    build/rt-bench-step --attention flash --policy disabled|attention|mlp|block;
  * PyTorch: bench/torch_sac_step.py --policy none|sac-matmuls|attention|mlp|block
             (F.scaled_dot_product_attention + F.rms_norm blocks), with glibc's
             default malloc and with MALLOC_MMAP_THRESHOLD_/TRIM_THRESHOLD_
             raised, keeping the faster time and the smaller memory, as
             run_benchmarks.py does.
Reported per pair of policies: median step time, the ratio ours/PyTorch, each
side's step time and peak over its own no-checkpoint row, peak RSS growth
over setup (both sides) and our allocator's peak. The machine's load average
is sampled before every process. Outputs bench/results/sac.{json,md,png}
and, in a full run, the block between the SAC markers of
docs/checkpointing-benchmark.md.
"""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run_benchmarks as rb  # noqa: E402

ROOT = rb.ROOT
OURS = ["disabled", "attention", "mlp", "block"]
THEIRS = ["none", "sac-matmuls", "attention", "mlp", "block"]
# (ours, PyTorch): what each row of the table compares. SAC "save matmuls"
# keeps what our disabled graph keeps (projection and attention outputs) and
# recomputes the pointwise ops, which our fused blocks recompute anyway.
PAIRS = [("disabled", "none"), ("disabled", "sac-matmuls"), ("attention", "attention"), ("mlp", "mlp"),
         ("block", "block")]
BEGIN = "<!-- BEGIN SAC RESULTS (bench/run_sac_benchmark.py writes this part) -->"
END = "<!-- END SAC RESULTS -->"
TARGET_ATTENTION = 1.15  # issue 15: attention-only recompute <= 1.15x the disabled step


def log(*args):
    print("[run_sac_benchmark]", *args, file=sys.stderr, flush=True)


def torch2_python(args):
    if args.torch_python:
        return args.torch_python
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "torch2_env.sh")], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"[run_sac_benchmark] scripts/torch2_env.sh failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return proc.stdout.strip().splitlines()[-1]


def bench(args, shapes, python, blas):
    env = rb.base_env(args.threads, blas, args.wait_policy)
    tool = args.build_dir / "rt-bench-step"
    if not tool.exists():
        sys.exit(f"[run_sac_benchmark] {tool} not found: build first (cmake --build {args.build_dir} "
                 "--target rt-bench-step)")
    mallocs = {"both": ["default", "tuned"], "default": ["default"], "tuned": ["tuned"]}[args.torch_malloc]
    loads = []
    rows = {}
    for name, shape in shapes.items():
        steps = args.steps if args.steps else (1 if args.quick else (5 if name == "S1" else 3))
        runs = {("ours", p): [] for p in args.ours}
        runs.update({(f"torch_{m}", p): [] for p in args.torch for m in mallocs})
        jobs = list(runs)
        for rnd in range(args.rounds):
            for who, policy in (jobs if rnd % 2 == 0 else list(reversed(jobs))):
                common = rb.shape_args(shape) + ["--policy", policy, "--steps", str(steps),
                                                 "--warmup", str(args.warmup)]
                if who == "ours":
                    cmd, e = [str(tool)] + common + ["--attention", "flash"], env
                else:
                    cmd = [python, str(ROOT / "bench" / "torch_sac_step.py")] + common + [
                        "--threads", str(args.threads)]
                    e = dict(env, **rb.TUNED_MALLOC) if who == "torch_tuned" else env
                load = float(rb.load_average())
                loads.append(load)
                r = rb.run_json(cmd, e, timeout=args.timeout)
                if r["threads"] != args.threads:
                    sys.exit(f"[run_sac_benchmark] {who} ran on {r['threads']} threads, not {args.threads}")
                r["load_average"] = load
                runs[(who, policy)].append(r)
                log(f"{name} round {rnd + 1} {who} {policy}: {r['step_seconds']:.3f} s/step, "
                    f"rss growth {r['rss_growth_bytes'] / 2**20:.0f} MiB (load {load:.2f})")
        summary = {}
        for p in args.ours:
            summary[f"ours {p}"] = rb.summarize(runs[("ours", p)])
        for p in args.torch:
            per = {m: rb.summarize(runs[(f"torch_{m}", p)]) for m in mallocs}
            fast = min(per, key=lambda m: per[m]["step_seconds"])
            lean = min(per, key=lambda m: per[m]["rss_growth_bytes"])
            best = dict(per[fast])
            best.update(time_from=f"{fast} malloc", rss_growth_bytes=per[lean]["rss_growth_bytes"],
                        memory_from=f"{lean} malloc", per_malloc=per)
            summary[f"torch {p}"] = best
        rows[name] = {"shape": shape, "steps_per_process": steps, "summary": summary}
    return rows, loads


def table_rows(rows):
    out = []
    for name, data in rows.items():
        s = data["summary"]
        o0, t0 = s["ours disabled"], s["torch none"]

        def best(x):  # the fastest measured step of all processes (PyTorch: of both malloc settings)
            return min(t for y in x.get("per_malloc", {"": x}).values() for t in y["step_times"])

        for ours_p, theirs_p in PAIRS:
            if f"ours {ours_p}" not in s or f"torch {theirs_p}" not in s:
                continue
            o, t = s[f"ours {ours_p}"], s[f"torch {theirs_p}"]
            out.append({
                "shape": name, **data["shape"], "ours_policy": ours_p, "torch_policy": theirs_p,
                "ours_seconds": o["step_seconds"], "torch_seconds": t["step_seconds"],
                "time_ratio": o["step_seconds"] / t["step_seconds"],
                # The fastest measured step of all processes: the least
                # disturbed by other work on a loaded machine.
                "ours_best_seconds": best(o), "torch_best_seconds": best(t),
                "best_time_ratio": best(o) / best(t),
                "ours_best_vs_disabled": best(o) / best(o0), "torch_best_vs_none": best(t) / best(t0),
                "ours_vs_disabled": o["step_seconds"] / o0["step_seconds"],
                "torch_vs_none": t["step_seconds"] / t0["step_seconds"],
                "ours_rss_bytes": o["rss_growth_bytes"], "torch_rss_bytes": t["rss_growth_bytes"],
                "memory_ratio": o["rss_growth_bytes"] / t["rss_growth_bytes"],
                "ours_peak_bytes": o["peak_bytes"], "ours_peak_vs_disabled": o["peak_bytes"] / o0["peak_bytes"],
                "torch_rss_vs_none": t["rss_growth_bytes"] / t0["rss_growth_bytes"],
                "torch_time_from": t["time_from"], "torch_memory_from": t["memory_from"],
                "ours_losses_last": o["final_loss"], "torch_losses_last": t["final_loss"],
            })
    return out


def markdown(result):
    mib = rb.mib
    lines = [f"Command: `{result['command']}`  ",
             f"Date: {result['date']}; {result['threads']} threads; OMP_WAIT_POLICY {result['omp_wait_policy']} "
             f"(both sides); {result['rounds']} round(s) per row, processes alternating; measured steps per "
             "process: " + ", ".join(f"{n} {d['steps_per_process']}" for n, d in result["raw"].items())
             + f", after {result['warmup']} warm-up step(s).  ",
             f"Machine load average (1 min) sampled before each of {result['processes']} processes: min "
             f"{result['load']['min']:.2f}, median {result['load']['median']:.2f}, max {result['load']['max']:.2f} "
             "(2 cores, shared with other builds).  ",
             f"PyTorch {result['torch_version']} from PyPI (scripts/torch2_env.sh), blocks with "
             "F.scaled_dot_product_attention (is_causal) and F.rms_norm; its GEMMs are the wheel's built-in MKL. "
             "Ours: FlashAttention; BLAS/OpenMP mapped: " + ", ".join(f"`{x}`" for x in result["blas_ours"]) + ".",
             "",
             "| shape | ours | PyTorch | ours s/step | PyTorch s/step | time ours/PyTorch | ours ÷ disabled "
             "| PyTorch ÷ none | ours RSS growth MiB | PyTorch RSS growth MiB | memory ours/PyTorch "
             "| ours allocator peak MiB (÷ disabled) | PyTorch RSS growth ÷ none | time ours/PyTorch, best steps |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        lines.append(
            f"| {r['shape']} (C {r['width']}, H {r['heads']}, L {r['layers']}, T {r['seq']}, B {r['batch']}) "
            f"| {r['ours_policy']} | {r['torch_policy']} | {r['ours_seconds']:.3f} | {r['torch_seconds']:.3f} "
            f"| **{r['time_ratio']:.2f}** | {r['ours_vs_disabled']:.2f} | {r['torch_vs_none']:.2f} "
            f"| {mib(r['ours_rss_bytes'])} | {mib(r['torch_rss_bytes'])} | **{r['memory_ratio']:.2f}** "
            f"| {mib(r['ours_peak_bytes'])} ({r['ours_peak_vs_disabled']:.2f}) | {r['torch_rss_vs_none']:.2f} "
            f"| {r['best_time_ratio']:.2f} |")
    lines += ["", "Time columns are medians of every measured step of the row's processes; the last column "
              "divides the fastest single steps instead (the least disturbed by other work on the machine).", "",
              "Issue 15 target, attention-only recompute ≤ "
              f"{TARGET_ATTENTION}× the disabled step (ours, same run; PyTorch's attention-half checkpoint "
              "for comparison):", "",
              "| shape | ours attention ÷ disabled (median steps) | (best steps) | met (median) "
              "| PyTorch attention ÷ none (median) | (best) |", "|---|---:|---:|---|---:|---:|"]
    for t in result["targets"]:
        lines.append(f"| {t['shape']} | {t['ratio']:.2f} | {t['best_ratio']:.2f} | {'yes' if t['met'] else '**no**'} "
                     f"| {t['torch_ratio']:.2f} | {t['torch_best_ratio']:.2f} |")
    lines += ["", "PyTorch per malloc setting (s/step, RSS growth MiB; the table keeps the faster time and the "
              "smaller memory):", "", "| shape | PyTorch policy | default malloc | raised thresholds |",
              "|---|---|---:|---:|"]
    for name, data in result["raw"].items():
        for p in THEIRS:
            if f"torch {p}" not in data["summary"]:
                continue
            per = data["summary"][f"torch {p}"]["per_malloc"]
            cells = [f"{per[m]['step_seconds']:.3f} s, {mib(per[m]['rss_growth_bytes'])}" if m in per else "—"
                     for m in ("default", "tuned")]
            lines.append(f"| {name} | {p} | {cells[0]} | {cells[1]} |")
    lines.append("")
    if result.get("chart_relative"):
        lines += [f"![step time and peak per shape and policy]({result['chart_relative']})", ""]
    return "\n".join(lines)


def chart(rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib not installed (Debian: python3-matplotlib): no chart")
        return False
    labels = [f"{r['shape']}\n{r['ours_policy']}\n{r['torch_policy']}" for r in rows]
    x = list(range(len(rows)))
    w = 0.38
    fig, axes = plt.subplots(2, 1, figsize=(14, 8))
    panels = [("step time (s)", "ours_seconds", "torch_seconds", 1, "time_ratio"),
              ("peak RSS growth over setup (MiB)", "ours_rss_bytes", "torch_rss_bytes", 2**20, "memory_ratio")]
    for ax, (title, ok, tk, scale, ratio) in zip(axes, panels):
        a = [r[ok] / scale for r in rows]
        b = [r[tk] / scale for r in rows]
        ax.bar([i - w / 2 for i in x], a, w, label="riftco (upper policy name)", color="#2b6cb0")
        ax.bar([i + w / 2 for i in x], b, w, label="PyTorch 2.x (lower policy name)", color="#dd6b20")
        for i, r in enumerate(rows):
            ax.text(i, max(a[i], b[i]) * 1.02, f"{r[ratio]:.2f}×", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(x)
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_title(title + " — label: riftco / PyTorch", fontsize=10)
        ax.set_ylim(0, max(max(a), max(b)) * 1.2)
        ax.legend(fontsize=8, loc="upper left")
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle("Checkpointing policies: riftco vs PyTorch selective activation checkpointing "
                 "(forward + backward + Adam, 2 threads, lower is better)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny shape, 1 round, 1 step, no docs update")
    ap.add_argument("--build-dir", type=pathlib.Path, default=ROOT / "build")
    ap.add_argument("--out-dir", type=pathlib.Path, default=None,
                    help="default bench/results (--quick: BUILD/bench-quick)")
    ap.add_argument("--docs", type=pathlib.Path, default=None,
                    help="file whose SAC block is replaced (default docs/checkpointing-benchmark.md for a full "
                         "run into bench/results; none otherwise)")
    ap.add_argument("--shapes", default=None, help="comma-separated subset of S1,S2,S3")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=None, help="default 3 (quick: 1)")
    ap.add_argument("--steps", type=int, default=None, help="measured steps per process (default S1 5, others 3)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--timeout", type=int, default=900, help="seconds per process")
    ap.add_argument("--wait-policy", default="passive", help="OMP_WAIT_POLICY for both sides")
    ap.add_argument("--ours", default=",".join(OURS), help="our policies to run (default all: %(default)s)")
    ap.add_argument("--torch", default=",".join(THEIRS), help="PyTorch policies to run (default all: %(default)s)")
    ap.add_argument("--torch-malloc", choices=["both", "default", "tuned"], default="both")
    ap.add_argument("--torch-python", default=None, help="a PyTorch >= 2.4 interpreter (default: torch2_env.sh's)")
    ap.add_argument("--render", type=pathlib.Path, default=None,
                    help="measure nothing: rewrite the Markdown, chart and docs block from this sac.json")
    args = ap.parse_args()
    args.build_dir = args.build_dir.resolve()
    if args.render:
        result = json.loads(args.render.read_text())
        args.out_dir = args.out_dir or args.render.resolve().parent
        args.out_dir.mkdir(parents=True, exist_ok=True)
        if args.docs is None and args.out_dir.resolve() == (ROOT / "bench" / "results").resolve():
            args.docs = ROOT / "docs" / "checkpointing-benchmark.md"
        publish(result, args)
        return
    if args.rounds is None:
        args.rounds = 1 if args.quick else 3
    args.ours, args.torch = args.ours.split(","), args.torch.split(",")
    for given, known, side in ((args.ours, OURS, "--ours"), (args.torch, THEIRS, "--torch")):
        if "disabled" not in given and "none" not in given or not set(given) <= set(known):
            sys.exit(f"[run_sac_benchmark] {side} {','.join(given)}: a subset of {','.join(known)} "
                     "that includes the no-checkpoint policy (the ratios divide by it)")
    complete = (not args.quick and args.out_dir is None and not args.shapes and args.ours == OURS
                and args.torch == THEIRS)
    if args.out_dir is None:
        args.out_dir = args.build_dir / "bench-quick" if args.quick else ROOT / "bench" / "results"
    args.out_dir.mkdir(parents=True, exist_ok=True)
    if args.docs is None and complete:
        args.docs = ROOT / "docs" / "checkpointing-benchmark.md"
    shapes = rb.QUICK_SHAPES if args.quick else rb.SHAPES
    if args.shapes:
        shapes = {k: v for k, v in rb.SHAPES.items() if k in args.shapes.split(",")}
    if args.quick and args.steps is None:
        args.steps = 1

    python = torch2_python(args)
    check = subprocess.run([python, str(ROOT / "bench" / "torch_sac_step.py"), "--check"], capture_output=True,
                           text=True, timeout=args.timeout)
    if check.returncode != 0:
        sys.exit(f"[run_sac_benchmark] torch_sac_step.py --check failed:\n{check.stdout}{check.stderr[-2000:]}")
    checked = json.loads(check.stdout.strip().splitlines()[-1])
    log(f"PyTorch {checked['torch_version']} ({python}): every policy matches torch_reference.py "
        f"(max relative difference {checked['max_relative_difference']:.2g})")
    blas = rb.blas_dir()
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    raw, loads = bench(args, shapes, python, blas)
    first = next(iter(raw.values()))["summary"]
    result = {
        "command": "/usr/bin/python3 bench/run_sac_benchmark.py " + " ".join(sys.argv[1:]),
        "date": started, "threads": args.threads, "omp_wait_policy": args.wait_policy, "rounds": args.rounds,
        "warmup": args.warmup, "processes": len(loads),
        "load": {"min": min(loads), "median": statistics.median(loads), "max": max(loads), "samples": loads},
        "torch_version": checked["torch_version"], "torch_python": python, "torch_check": checked,
        "blas_ours": first["ours disabled"]["libraries"], "libraries_torch": first["torch none"]["libraries"],
        "raw": raw,
    }
    publish(result, args)


def publish(result, args):
    """Rows, targets, chart, JSON, Markdown and the docs block from result["raw"]."""
    rows = table_rows(result["raw"])
    result["rows"] = rows
    result["targets"] = [{"shape": r["shape"], "ratio": r["ours_vs_disabled"], "best_ratio": r["ours_best_vs_disabled"],
                          "met": r["ours_vs_disabled"] <= TARGET_ATTENTION, "torch_ratio": r["torch_vs_none"],
                          "torch_best_ratio": r["torch_best_vs_none"]}
                         for r in rows if r["ours_policy"] == "attention"]
    png = args.out_dir / "sac.png"
    result.pop("chart_relative", None)
    if chart(rows, png):
        result["chart"] = str(png)
        result["chart_relative"] = os.path.relpath(png, (args.docs or (args.out_dir / "sac.md")).parent)
    (args.out_dir / "sac.json").write_text(json.dumps(result, indent=2) + "\n")
    md = markdown(result)
    (args.out_dir / "sac.md").write_text(md + "\n")
    print(md)
    if args.docs:
        text = args.docs.read_text()
        if BEGIN not in text:
            text += f"\n{BEGIN}\n{END}\n"
        head, rest = text.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        args.docs.write_text(head + BEGIN + "\n" + md + "\n" + END + tail)
        log("wrote", args.docs)
    log("wrote", args.out_dir / "sac.json")


if __name__ == "__main__":
    main()
