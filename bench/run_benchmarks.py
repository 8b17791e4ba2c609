#!/usr/bin/python3
"""riftco vs PyTorch: training-step benchmark suite (one command).

    /usr/bin/python3 bench/run_benchmarks.py                 # full run, writes docs/benchmarks.md
    /usr/bin/python3 bench/run_benchmarks.py --quick --out-dir /tmp/q   # smoke run (< 60 s)

Builds nothing: expects a build tree (default ./build) with rt-bench-step and,
for the kernel table, rt-bench-kernels.

For every shape and checkpointing policy it runs, in fresh processes and
alternating round by round,
  * ours:    build/rt-bench-step (flash attention, the policy under test);
  * PyTorch: bench/torch_step.py (bench/torch_reference.py's model;
             torch.utils.checkpoint(use_reentrant=False) per block for the
             block policy) twice per round — with glibc's default malloc and
             with MALLOC_MMAP_THRESHOLD_/MALLOC_TRIM_THRESHOLD_ raised so freed
             memory is not handed back to the kernel — and keeps the faster.
Each process does its warm-up step(s) and measured steps (forward + backward
+ Adam + zero_grad) on the same thread count. Both sides are given the same
OpenBLAS (the OpenMP build when installed, through LD_LIBRARY_PATH, so neither
depends on update-alternatives) and report the BLAS they actually mapped
(/proc/self/maps).

Reported per shape and policy: median step time, tokens/s, peak training
memory (ours: the allocator's peak above the live bytes before the step; both
sides: peak RSS growth of the process over its own setup, the comparable
figure) and the ratios ours/PyTorch. Outputs: JSON, a Markdown table (written
between the RESULTS markers of docs/benchmarks.md in a full run) and a PNG
chart of time and memory per policy.
"""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]

SHAPES = {
    "S1": dict(vocab=256, width=256, heads=8, layers=8, seq=256, batch=8),
    "S2": dict(vocab=256, width=128, heads=4, layers=32, seq=256, batch=8),
    "S3": dict(vocab=256, width=768, heads=12, layers=12, seq=128, batch=4),
}
QUICK_SHAPES = {
    "Q1": dict(vocab=256, width=32, heads=2, layers=2, seq=32, batch=2),
}
POLICIES = ["disabled", "block"]
TUNED_MALLOC = {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "8589934592"}
BLAS_DIRS = ["/usr/lib/x86_64-linux-gnu/openblas-openmp", "/usr/lib/x86_64-linux-gnu/openblas-pthread"]
RESULTS_BEGIN = "<!-- BEGIN RESULTS (bench/run_benchmarks.py writes this part) -->"
RESULTS_END = "<!-- END RESULTS -->"

# Targets of issue #6 (reported, never asserted in timed tests).
TARGET_TIME = 0.8
TARGET_MEMORY = 0.8
TARGET_BLOCK_COST = 1.35
TARGET_S2_BLOCK_PEAK = 0.35
TARGET_MATMUL_PEAK = 0.70


def log(*args):
    print("[run_benchmarks]", *args, file=sys.stderr, flush=True)


def shape_args(shape):
    return ["--vocab", str(shape["vocab"]), "--width", str(shape["width"]), "--heads", str(shape["heads"]),
            "--layers", str(shape["layers"]), "--seq", str(shape["seq"]), "--batch", str(shape["batch"])]


def run_json(cmd, env, timeout):
    start = time.time()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    line = proc.stdout.strip().splitlines()[-1]
    out = json.loads(line)
    out["process_seconds"] = time.time() - start
    return out


def blas_dir():
    for d in BLAS_DIRS:
        if os.path.exists(os.path.join(d, "libopenblas.so.0")):
            return d
    return None


def base_env(threads, blas, wait_policy):
    env = dict(os.environ)
    for k in list(env):
        if k.startswith("MALLOC_"):
            del env[k]
    env["OMP_NUM_THREADS"] = str(threads)
    if wait_policy:
        env["OMP_WAIT_POLICY"] = wait_policy
    env["OPENBLAS_NUM_THREADS"] = str(threads)
    if blas:
        env["LD_LIBRARY_PATH"] = blas + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    return env


def torch_available():
    try:
        subprocess.run(["/usr/bin/python3", "-c", "import torch"], check=True, capture_output=True, timeout=120)
        return True
    except (subprocess.CalledProcessError, FileNotFoundError, subprocess.TimeoutExpired):
        return False


def median(values):
    return statistics.median(values) if values else None


def summarize(runs):
    """Pools the measured steps of every process of one configuration."""
    if not runs:
        return None
    steps = [t for r in runs for t in r["step_times"]]
    med = median(steps)
    first = runs[0]
    out = {
        "step_seconds": med,
        "tokens_per_second": first["batch"] * first["seq"] / med,
        "step_times": steps,
        "rss_growth_bytes": max(r["rss_growth_bytes"] for r in runs),
        "processes": len(runs),
        "libraries": first["libraries"],
        "final_loss": first["losses"][-1],
        "forward_seconds": median([r["forward_seconds"] for r in runs]),
        "backward_seconds": median([r["backward_seconds"] for r in runs]),
        "optimizer_seconds": median([r["optimizer_seconds"] for r in runs]),
    }
    if "peak_bytes" in first:
        out["peak_bytes"] = max(r["peak_bytes"] for r in runs)
        out["reserved_bytes"] = max(r["reserved_bytes"] for r in runs)
    if "torch_version" in first:
        out["torch_version"] = first["torch_version"]
    return out


def bench_steps(args, shapes, blas):
    env = base_env(args.threads, blas, args.wait_policy)
    have_torch = not args.no_torch and torch_available()
    if not have_torch:
        log("PyTorch not available (or --no-torch): measuring riftco only")
    step_tool = args.build_dir / "rt-bench-step"
    if not step_tool.exists():
        sys.exit(f"[run_benchmarks] {step_tool} not found: build first (cmake --build {args.build_dir})")
    rows = []
    for name, shape in shapes.items():
        steps = args.steps if args.steps else (1 if args.quick else (5 if name == "S1" else 3))
        # Every round runs both policies, each as ours and PyTorch's two malloc
        # settings back to back (order reversed in odd rounds), so both the
        # ours/PyTorch and the block/disabled ratios compare processes that
        # ran minutes apart at most.
        runs = {p: {"ours": [], "torch_default_malloc": [], "torch_tuned_malloc": []} for p in POLICIES}
        for rnd in range(args.rounds):
            jobs = [(p, who) for p in POLICIES for who in ("ours", "torch_default_malloc", "torch_tuned_malloc")]
            if rnd % 2 == 1:
                jobs.reverse()
            for policy, who in jobs:
                if who != "ours" and not have_torch:
                    continue
                common = shape_args(shape) + ["--policy", policy, "--steps", str(steps),
                                              "--warmup", str(args.warmup)]
                if who == "ours":
                    cmd = [str(step_tool)] + common + ["--attention", "flash"]
                    e = env
                else:
                    cmd = ["/usr/bin/python3", str(ROOT / "bench" / "torch_step.py")] + common + [
                        "--threads", str(args.threads)]
                    e = dict(env, **TUNED_MALLOC) if who == "torch_tuned_malloc" else env
                r = run_json(cmd, e, timeout=args.timeout)
                if r["threads"] != args.threads:
                    sys.exit(f"[run_benchmarks] {who} ran on {r['threads']} threads, not {args.threads}: "
                             f"{' '.join(cmd)}")
                runs[policy][who].append(r)
                log(f"{name} {policy} round {rnd + 1} {who}: median {r['step_seconds']:.3f} s/step, "
                    f"rss growth {r['rss_growth_bytes'] / 2**20:.0f} MiB"
                    + (f", allocator peak {r['peak_bytes'] / 2**20:.0f} MiB" if 'peak_bytes' in r else ""))
        for policy in POLICIES:
            ours = summarize(runs[policy]["ours"])
            torch_d = summarize(runs[policy]["torch_default_malloc"])
            torch_t = summarize(runs[policy]["torch_tuned_malloc"])
            row = {"shape": name, **shape, "policy": policy, "threads": args.threads, "steps_per_process": steps,
                   "warmup_steps": args.warmup, "rounds": args.rounds, "ours": ours,
                   "torch_default_malloc": torch_d, "torch_tuned_malloc": torch_t}
            if torch_d and torch_t:
                fast = "torch_tuned_malloc" if torch_t["step_seconds"] < torch_d["step_seconds"] else "torch_default_malloc"
                lean = ("torch_tuned_malloc" if torch_t["rss_growth_bytes"] < torch_d["rss_growth_bytes"]
                        else "torch_default_malloc")
                best = row[fast]
                row["torch"] = {"step_seconds": best["step_seconds"], "tokens_per_second": best["tokens_per_second"],
                                "forward_seconds": best["forward_seconds"],
                                "backward_seconds": best["backward_seconds"],
                                "optimizer_seconds": best["optimizer_seconds"],
                                "time_from": fast, "rss_growth_bytes": row[lean]["rss_growth_bytes"],
                                "memory_from": lean, "libraries": best["libraries"],
                                "torch_version": best.get("torch_version")}
                row["time_ratio"] = ours["step_seconds"] / row["torch"]["step_seconds"]
                row["memory_ratio"] = ours["rss_growth_bytes"] / row["torch"]["rss_growth_bytes"]
            rows.append(row)
    return rows


def bench_kernels(args, blas):
    tool = args.build_dir / "rt-bench-kernels"
    if not tool.exists():
        log(f"{tool} not built (Google Benchmark missing?): no kernel table")
        return None
    out = args.out_dir / "kernels.json"
    # Kernels run alone with libgomp's default (spinning) wait policy: they
    # measure what a kernel can do, and every GEMM call is a parallel region.
    env = base_env(args.threads, blas, None)
    env.pop("OMP_WAIT_POLICY", None)
    cmd = [str(tool), f"--benchmark_out={out}", "--benchmark_out_format=json"]
    if args.quick:
        cmd.append("--benchmark_filter=Peak|Gemm/M:2048/N:256/K:256")
        cmd.append("--benchmark_min_time=0.01")
    else:  # the best of 3 repetitions per row, as the peaks are best-of-5 inside the binary
        cmd += ["--benchmark_repetitions=3"]
    log("kernel micro-benchmarks:", " ".join(cmd))
    subprocess.run(cmd, env=env, check=True, capture_output=True, text=True, timeout=args.timeout * 4)
    data = json.loads(out.read_text())
    best = {}  # name -> the repetition with the shortest time
    order = []
    for b in data["benchmarks"]:
        if b.get("run_type") == "aggregate":
            continue
        name = b.get("run_name", b["name"])
        if name not in best:
            order.append(name)
            best[name] = b
        elif b["real_time"] < best[name]["real_time"]:
            best[name] = b
    rows = []
    for name in order:
        b = best[name]
        rate_key = "GFLOP/s" if "GFLOP/s" in b else ("GB/s" if "GB/s" in b else None)
        rows.append({"name": name, "real_time": b["real_time"], "time_unit": b["time_unit"],
                     "rate": b.get(rate_key) if rate_key else None, "unit": rate_key,
                     "of_peak": b.get("of_peak"), "one_thread_gflops": b.get("one_thread_GFLOP/s")})
    return {"context": data.get("context", {}), "rows": rows, "repetitions": 1 if args.quick else 3}


def mib(b):
    return f"{b / 2**20:.0f}"


def fmt_ratio(x):
    return "—" if x is None else f"{x:.2f}"


def markdown(result):
    rows = result["steps"]
    lines = []
    lines.append(f"Command: `{result['command']}`  ")
    lines.append(f"Date: {result['date']}; threads: {result['threads']}; OMP_WAIT_POLICY "
                 f"{result['omp_wait_policy']} (both sides); machine load average at start "
                 f"{result['load_average_start']}, at end {result['load_average_end']}; "
                 f"{result['rounds']} round(s) per row, processes alternating.  ")
    if result.get("torch_version"):
        lines.append(f"PyTorch {result['torch_version']} (Debian python3-torch, /usr/bin/python3).  ")
    lines.append("BLAS mapped by each side (from /proc/self/maps): ours "
                 + ", ".join(f"`{x}`" for x in result["blas"]["ours"]) + "; PyTorch "
                 + (", ".join(f"`{x}`" for x in result["blas"]["torch"]) or "—") + ".")
    lines.append("")
    lines.append("| shape | policy | ours s/step | PyTorch s/step | time ours/PyTorch | ours tokens/s | "
                 "PyTorch tokens/s | ours allocator peak MiB | ours RSS growth MiB | PyTorch RSS growth MiB | "
                 "memory ours/PyTorch |")
    lines.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        o = r["ours"]
        t = r.get("torch")
        lines.append(
            f"| {r['shape']} (C {r['width']}, H {r['heads']}, L {r['layers']}, T {r['seq']}, B {r['batch']}) "
            f"| {r['policy']} | {o['step_seconds']:.3f} | {t['step_seconds']:.3f} | **{r['time_ratio']:.2f}** "
            f"| {o['tokens_per_second']:.0f} | {t['tokens_per_second']:.0f} | {mib(o['peak_bytes'])} "
            f"| {mib(o['rss_growth_bytes'])} | {mib(t['rss_growth_bytes'])} | **{r['memory_ratio']:.2f}** |"
            if t else
            f"| {r['shape']} | {r['policy']} | {o['step_seconds']:.3f} | — | — | {o['tokens_per_second']:.0f} | — "
            f"| {mib(o['peak_bytes'])} | {mib(o['rss_growth_bytes'])} | — | — |")
    lines.append("")
    lines.append("PyTorch per malloc setting (s/step, RSS growth MiB; the table keeps the faster time and the "
                 "smaller memory):")
    lines.append("")
    lines.append("| shape | policy | default malloc | MALLOC_MMAP_THRESHOLD_/TRIM_THRESHOLD_ raised |")
    lines.append("|---|---|---:|---:|")
    for r in rows:
        d, tt = r.get("torch_default_malloc"), r.get("torch_tuned_malloc")
        if d and tt:
            lines.append(f"| {r['shape']} | {r['policy']} | {d['step_seconds']:.3f} s, {mib(d['rss_growth_bytes'])} "
                         f"| {tt['step_seconds']:.3f} s, {mib(tt['rss_growth_bytes'])} |")
    lines.append("")
    lines.append("Where the step goes (median seconds per step of the row's time figure: forward = loss with the "
                 "graph built, backward = backward() and dropping the graph, Adam = step + zero_grad):")
    lines.append("")
    lines.append("| shape | policy | ours forward | ours backward | ours Adam | PyTorch forward | PyTorch backward | "
                 "PyTorch Adam |")
    lines.append("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        o, t = r["ours"], r.get("torch")
        if t:
            lines.append(f"| {r['shape']} | {r['policy']} | {o['forward_seconds']:.3f} | {o['backward_seconds']:.3f} "
                         f"| {o['optimizer_seconds']:.3f} | {t['forward_seconds']:.3f} | "
                         f"{t['backward_seconds']:.3f} | {t['optimizer_seconds']:.3f} |")
    lines.append("")
    if result.get("targets"):
        lines.append("Targets (issue #6):")
        lines.append("")
        lines.append("| target | measured | met |")
        lines.append("|---|---:|---|")
        for t in result["targets"]:
            lines.append(f"| {t['target']} | {t['measured']} | {'yes' if t['met'] else '**no**'} |")
        lines.append("")
    k = result.get("kernels")
    if k:
        reps = k.get("repetitions", 1)
        lines.append("Kernel micro-benchmarks (`rt-bench-kernels`, same run, libgomp's default wait policy, "
                     + (f"best of {reps} repetitions" if reps > 1 else "one repetition") + " (the peaks are best of 5); `of peak` is against the FMA peak for GFLOP/s rows and the STREAM triad over 64 MiB arrays for GB/s rows — operands that fit "
                     "in L2/L3 can exceed that DRAM figure):")
        lines.append("")
        lines.append("| benchmark | time | rate | of peak |")
        lines.append("|---|---:|---:|---:|")
        for b in k["rows"]:
            rate = "—" if b["rate"] is None else f"{b['rate']:.1f} {b['unit']}"
            if b["name"].startswith("BM_PeakFma"):
                rate += f" (one thread {b['one_thread_gflops']:.1f})"
            peak = "—" if b["of_peak"] is None else f"{100 * b['of_peak']:.0f}%"
            lines.append(f"| `{b['name']}` | {b['real_time']:.1f} {b['time_unit']} | {rate} | {peak} |")
        lines.append("")
    if result.get("chart"):
        lines.append(f"![time and memory per shape and policy]({result.get('chart_relative', result['chart'])})")
        lines.append("")
    return "\n".join(lines)


def targets(rows, kernels):
    out = []
    by = {(r["shape"], r["policy"]): r for r in rows}
    for r in rows:
        if "time_ratio" in r:
            out.append({"target": f"{r['shape']} {r['policy']}: step time ours/PyTorch <= {TARGET_TIME}",
                        "measured": f"{r['time_ratio']:.2f}", "met": r["time_ratio"] <= TARGET_TIME})
    for r in rows:
        if "memory_ratio" in r:
            out.append({"target": f"{r['shape']} {r['policy']}: peak memory (RSS growth) ours/PyTorch <= "
                                  f"{TARGET_MEMORY}",
                        "measured": f"{r['memory_ratio']:.2f}", "met": r["memory_ratio"] <= TARGET_MEMORY})
    for (shape, policy), r in by.items():
        if policy == "block" and (shape, "disabled") in by:
            ratio = r["ours"]["step_seconds"] / by[(shape, "disabled")]["ours"]["step_seconds"]
            out.append({"target": f"{shape}: ours block / disabled step time <= {TARGET_BLOCK_COST}",
                        "measured": f"{ratio:.2f}", "met": ratio <= TARGET_BLOCK_COST})
    if ("S2", "block") in by and ("S2", "disabled") in by:
        for key, label in (("peak_bytes", "allocator peak"), ("rss_growth_bytes", "RSS growth")):
            ratio = by[("S2", "block")]["ours"][key] / by[("S2", "disabled")]["ours"][key]
            out.append({"target": f"S2: ours block / disabled peak ({label}) <= {TARGET_S2_BLOCK_PEAK}",
                        "measured": f"{ratio:.2f}", "met": ratio <= TARGET_S2_BLOCK_PEAK})
    if kernels:
        for b in kernels["rows"]:
            if b["name"].startswith("BM_Gemm/M:1024/N:1024") or b["name"].startswith("BM_Gemm/M:2048/N:2048"):
                out.append({"target": f"matmul {b['name'].split('/real_time')[0][8:]} >= "
                                      f"{int(TARGET_MATMUL_PEAK * 100)}% of FMA peak",
                            "measured": f"{100 * b['of_peak']:.0f}%", "met": b["of_peak"] >= TARGET_MATMUL_PEAK})
    return out


def chart(rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib not installed (Debian: python3-matplotlib): no chart")
        return False
    rows = [r for r in rows if r.get("torch")]
    if not rows:
        return False
    labels = [f"{r['shape']}\n{r['policy']}" for r in rows]
    x = list(range(len(rows)))
    w = 0.38
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    panels = [("step time (s)", lambda r: r["ours"]["step_seconds"], lambda r: r["torch"]["step_seconds"],
               "time_ratio"),
              ("peak RSS growth over setup (MiB)", lambda r: r["ours"]["rss_growth_bytes"] / 2**20,
               lambda r: r["torch"]["rss_growth_bytes"] / 2**20, "memory_ratio")]
    for ax, (title, ours, theirs, ratio_key) in zip(axes, panels):
        a = [ours(r) for r in rows]
        b = [theirs(r) for r in rows]
        ax.bar([i - w / 2 for i in x], a, w, label="riftco", color="#2b6cb0")
        ax.bar([i + w / 2 for i in x], b, w, label="PyTorch", color="#dd6b20")
        for i, r in enumerate(rows):
            ax.text(i, max(a[i], b[i]) * 1.02, f"{r[ratio_key]:.2f}×", ha="center", va="bottom", fontsize=8)
        ax.set_xticks(x)
        ax.set_xticklabels(labels, fontsize=8)
        ax.set_title(title + " — label: riftco / PyTorch", fontsize=10)
        ax.set_ylim(0, max(max(a), max(b)) * 1.2)
        ax.legend(fontsize=8, loc="upper left")
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"Training step (forward + backward + Adam), {rows[0]['threads']} threads, lower is better",
                 fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def load_average():
    try:
        return open("/proc/loadavg").read().split()[0]
    except OSError:
        return "?"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny shape, 1 warm-up + 1 step, no docs update (< 60 s)")
    ap.add_argument("--build-dir", type=pathlib.Path, default=ROOT / "build")
    ap.add_argument("--out-dir", type=pathlib.Path, default=None,
                    help="where JSON and PNG go (default bench/results; --quick: build/bench-quick)")
    ap.add_argument("--docs", type=pathlib.Path, default=None,
                    help="Markdown file whose RESULTS block is replaced (default: docs/benchmarks.md for a full run "
                         "into bench/results; none for --quick, --shapes, --no-torch, --no-kernels or --out-dir)")
    ap.add_argument("--shapes", default=None, help="comma-separated subset of S1,S2,S3")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=None, help="alternating rounds per row (default 3, quick 1)")
    ap.add_argument("--steps", type=int, default=None, help="measured steps per process (default S1 5, others 3)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--timeout", type=int, default=900, help="seconds per process")
    ap.add_argument("--wait-policy", default="passive",
                    help="OMP_WAIT_POLICY for both sides ('' keeps the environment's). Passive by default: on a "
                         "shared machine threads spinning at barriers take the cores their preempted partners "
                         "need (PyTorch S1 under load: 3.7-4.0 s/step spinning, 2.0-2.4 s passive)")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--no-kernels", action="store_true")
    args = ap.parse_args()
    args.build_dir = args.build_dir.resolve()
    if args.rounds is None:
        args.rounds = 1 if args.quick else 3
    # Only a complete run into bench/results rewrites the published page; a
    # partial or scratch run leaves it alone unless --docs names a file.
    complete = (not args.quick and args.out_dir is None and not args.shapes and not args.no_torch
                and not args.no_kernels)
    if args.out_dir is None:
        args.out_dir = args.build_dir / "bench-quick" if args.quick else ROOT / "bench" / "results"
    args.out_dir.mkdir(parents=True, exist_ok=True)
    if args.docs is None and complete:
        args.docs = ROOT / "docs" / "benchmarks.md"
    shapes = QUICK_SHAPES if args.quick else SHAPES
    if args.shapes:
        shapes = {k: v for k, v in SHAPES.items() if k in args.shapes.split(",")}

    blas = blas_dir()
    log("OpenBLAS for both sides:", blas or "(system default)")
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    load_start = load_average()
    rows = bench_steps(args, shapes, blas)
    kernels = None if args.no_kernels else bench_kernels(args, blas)
    result = {
        "command": "/usr/bin/python3 bench/run_benchmarks.py " + " ".join(sys.argv[1:]),
        "date": started,
        "threads": args.threads,
        "omp_wait_policy": args.wait_policy or os.environ.get("OMP_WAIT_POLICY", "(libgomp default)"),
        "rounds": args.rounds,
        "load_average_start": load_start,
        "load_average_end": load_average(),
        "blas_dir": blas,
        "blas": {"ours": rows[0]["ours"]["libraries"] if rows else [],
                 "torch": rows[0]["torch"]["libraries"] if rows and rows[0].get("torch") else []},
        "torch_version": next((r["torch"]["torch_version"] for r in rows if r.get("torch")), None),
        "steps": rows,
        "kernels": kernels,
    }
    result["targets"] = targets(rows, kernels)
    png = args.out_dir / "benchmarks.png"
    result["chart"] = str(png) if chart(rows, png) else None
    if result["chart"] and args.docs:
        result["chart_relative"] = os.path.relpath(png, args.docs.parent)
    (args.out_dir / "benchmarks.json").write_text(json.dumps(result, indent=2) + "\n")
    md = markdown(result)
    (args.out_dir / "benchmarks.md").write_text(md + "\n")
    log("BLAS ours:", result["blas"]["ours"])
    log("BLAS PyTorch:", result["blas"]["torch"])
    print(md)
    if args.docs:
        text = args.docs.read_text() if args.docs.exists() else f"# Benchmarks\n\n{RESULTS_BEGIN}\n{RESULTS_END}\n"
        if RESULTS_BEGIN not in text:
            text += f"\n{RESULTS_BEGIN}\n{RESULTS_END}\n"
        head, rest = text.split(RESULTS_BEGIN, 1)
        _, tail = rest.split(RESULTS_END, 1)
        args.docs.write_text(head + RESULTS_BEGIN + "\n" + md + "\n" + RESULTS_END + tail)
        log("wrote", args.docs)
    log("wrote", args.out_dir / "benchmarks.json")


if __name__ == "__main__":
    main()
