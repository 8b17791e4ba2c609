#!/usr/bin/python3
"""riftco vs PyTorch: training-step benchmark suite (one command).

    /usr/bin/python3 bench/run_benchmarks.py --threads 2,1 --rounds 2,1   # full run, writes docs/benchmarks.md
    /usr/bin/python3 bench/run_benchmarks.py --quick --out-dir /tmp/q     # smoke run (< 60 s)
    /usr/bin/python3 bench/run_benchmarks.py --render bench/results/benchmarks.json   # re-render, no measuring
    /usr/bin/python3 bench/run_benchmarks.py --shapes S3 --optimizer-in-backward --out-dir /tmp/ib   # + fused step

Builds nothing: expects a build tree (default ./build) with rt-bench-step and,
for the kernel table, rt-bench-kernels.

For every thread count (--threads, a list), shape and checkpointing policy it
runs, in fresh processes and alternating round by round,
  * ours:         build/rt-bench-step (flash attention, the policy under test);
  * PyTorch 1.13: bench/torch_step.py with Debian's /usr/bin/python3
                  (bench/torch_reference.py's model, materialized attention)
                  twice per round — glibc's default malloc and
                  MALLOC_MMAP_THRESHOLD_/MALLOC_TRIM_THRESHOLD_ raised — keeping
                  the faster time and the smaller memory;
  * PyTorch 2.x:  bench/torch2_step.py with .venv-torch2's interpreter
                  (scripts/torch2_env.sh creates it in a full run; --quick uses
                  it only if present) in two forms, eager (SDPA + F.rms_norm)
                  and torch.compile (Inductor; cache in <build>/inductor-cache;
                  compile seconds reported apart from the step);
  block policy: torch.utils.checkpoint(use_reentrant=False) per block on every
  PyTorch side. Each process does its warm-up step(s) and measured steps
  (forward + backward + Adam + zero_grad) on the same thread count, with
  OMP_WAIT_POLICY=passive. Ours and 1.13 get the same OpenBLAS (the OpenMP
  build when installed, through LD_LIBRARY_PATH); every side reports the
  BLAS/OpenMP libraries it mapped (/proc/self/maps).

Reported per thread count, shape and policy: median step time, the ratio ours
/ fastest PyTorch 2 form (and which form), ours / 1.13, peak training memory
(RSS growth on every side; allocator peaks: ours, and PyTorch 2's c10
allocator through the profiler), compile times, phase times, ours' model
FLOPs utilization (model FLOPs per step / step time / the 512-bit FMA peak at
the same thread count; `model_flops`), a thread-scaling table when several
counts ran, and the targets of issues 6 and 16.

--optimizer-in-backward adds, to every row and round, ours with the
optimizer step fused into the backward pass (rt-bench-step
--optimizer-in-backward) and each PyTorch 2 form with PyTorch's fused
recipe (torch2_step.py --optimizer-in-backward: per-parameter Adam in
post-accumulate-grad hooks; a form torch2_step.py --check-in-backward finds
refused or wrong is skipped with the reason logged), alternating with the
rest, and "in-backward step" tables (bench/in_backward.py): ours against
PyTorch 2 in-backward (like for like) and against PyTorch 2's ordinary step.
Outputs:
JSON, Markdown (written between the RESULTS markers of docs/benchmarks.md in
a full run) and a PNG chart.
"""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

import in_backward

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

# Targets of issues 6 and 16 (reported, never asserted in timed tests).
TARGET_TIME_TORCH2 = 0.7  # issue 16: ours / fastest PyTorch 2 form
TARGET_TIME = 0.8
TARGET_MEMORY = 0.8
TARGET_BLOCK_COST = 1.25  # issue 16 (issue 6: 1.35)
TARGET_S2_BLOCK_PEAK = 0.35
TARGET_MATMUL_PEAK = 0.70
TARGET_S3_MFU = 0.60  # issue 16: the whole S3 step in model FLOPs / the 512-bit FMA peak


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


# OpenBLAS kernel-set overrides some machines set for every process (this
# one: OPENBLAS_CORETYPE=Haswell, OPENBLAS_L2_SIZE, because older OpenBLAS
# builds misbehave on some CPUs). "inherit" keeps them; "native" removes both
# for every process of a run (both sides), so OpenBLAS picks its kernels for
# this CPU (AVX-512 where it has it) as PyTorch 2's MKL does. Set by main().
OPENBLAS_OVERRIDES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
openblas_coretype = "inherit"


def base_env(threads, blas, wait_policy):
    env = dict(os.environ)
    for k in list(env):
        if k.startswith("MALLOC_") or (openblas_coretype == "native" and k in OPENBLAS_OVERRIDES):
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


def like_rss(ours):
    """Our RSS growth measured as PyTorch 2's is (after the warm-up, our cache
    released and malloc trimmed); the figure over setup where a run lacks it."""
    after = ours.get("rss_growth_after_warmup_bytes")
    return after if after is not None else ours["rss_growth_bytes"]


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
        # ours: the same baseline as bench/torch2_step.py's (after the warm-up and a trim)
        "rss_growth_after_warmup_bytes": (max(r["rss_growth_after_warmup_bytes"] for r in runs)
                                          if all(r.get("rss_growth_after_warmup_bytes", -1) >= 0 for r in runs)
                                          else None),
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
    if first.get("allocator_peak_bytes") is not None:
        out["allocator_peak_bytes"] = max(r["allocator_peak_bytes"] for r in runs)
    if first.get("form"):
        out["form"] = first["form"]
        out["warmup_steps"] = first["warmup"]
    if first.get("compile_seconds") is not None:
        # In process order: the first may have compiled cold, later ones hit
        # the Inductor cache.
        out["compile_seconds"] = [r["compile_seconds"] for r in runs]
        out["inductor_cache"] = [r.get("inductor_cache") for r in runs]
    return out


def torch2_python(args):
    """The PyTorch 2.x interpreter, or None with the reason logged. --torch2
    setup (a full run's default) creates .venv-torch2 through
    scripts/torch2_env.sh when it is missing; auto uses it only if present."""
    if args.torch2 == "off":
        log("PyTorch 2.x columns skipped: --torch2 off")
        return None
    if args.torch_python:
        return args.torch_python
    venv_python = ROOT / ".venv-torch2" / "bin" / "python"
    if args.torch2 == "auto" and not venv_python.exists():
        log(f"PyTorch 2.x columns skipped: {venv_python} absent (--torch2 setup, or bash scripts/torch2_env.sh, "
            "creates it)")
        return None
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "torch2_env.sh")], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"[run_benchmarks] scripts/torch2_env.sh failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return proc.stdout.strip().splitlines()[-1]


def torch2_env(env, args):
    """Inductor's cache inside the build tree: later processes and later runs
    reuse the generated code (compile_seconds then measures a cache hit)."""
    cache = args.build_dir / "inductor-cache"
    cache.mkdir(parents=True, exist_ok=True)
    return dict(env, TORCHINDUCTOR_CACHE_DIR=str(cache), **TUNED_MALLOC) if args.torch2_malloc == "tuned" else \
        dict(env, TORCHINDUCTOR_CACHE_DIR=str(cache))


def measure_shape(args, name, shape, threads, rounds, blas, have_torch, python2):
    env = base_env(threads, blas, args.wait_policy)
    step_tool = args.build_dir / "rt-bench-step"
    steps = args.steps if args.steps else (1 if args.quick else (5 if name == "S1" else 3))
    # Every round runs both policies, each as ours and every PyTorch process
    # back to back (order reversed in odd rounds), so both the ours/PyTorch
    # and the block/disabled ratios compare processes that ran minutes apart
    # at most.
    sides = ["ours"] + (["torch_default_malloc", "torch_tuned_malloc"] if have_torch else []) + \
        ([f"torch2_{f}" for f in args.torch2_forms] if python2 else [])
    if args.optimizer_in_backward:
        sides += in_backward.sides(args.in_backward_forms if python2 else [])
    runs = {p: {who: [] for who in sides} for p in args.policies}
    loads = []  # 1-minute load average after each process
    for rnd in range(rounds):
        jobs = [(p, who) for p in args.policies for who in sides]
        if rnd % 2 == 1:
            jobs.reverse()
        for policy, who in jobs:
            common = shape_args(shape) + ["--policy", policy, "--steps", str(steps), "--warmup", str(args.warmup)]
            timeout = args.timeout
            fused = in_backward.is_side(who)
            base = who[:-len(in_backward.SUFFIX)] if fused else who
            if base == "ours":
                cmd, e = [str(step_tool)] + common + ["--attention", "flash"], env
            elif base.startswith("torch2_"):
                cmd = [python2, str(ROOT / "bench" / "torch2_step.py")] + common + [
                    "--threads", str(threads), "--form", base[len("torch2_"):]]
                e = torch2_env(env, args)
                timeout = args.timeout * 2  # a cold compile of S2's 32 blocks
            else:
                cmd = ["/usr/bin/python3", str(ROOT / "bench" / "torch_step.py")] + common + [
                    "--threads", str(threads)]
                e = dict(env, **TUNED_MALLOC) if who == "torch_tuned_malloc" else env
            if fused:
                cmd.append("--optimizer-in-backward")
            r = run_json(cmd, e, timeout=timeout)
            if r["threads"] != threads:
                sys.exit(f"[run_benchmarks] {who} ran on {r['threads']} threads, not {threads}: {' '.join(cmd)}")
            if r.get("optimizer_in_backward", False) != fused:
                sys.exit(f"[run_benchmarks] {who} reported optimizer_in_backward "
                         f"{r.get('optimizer_in_backward')}, not {fused}: {' '.join(cmd)}")
            r["load_average"] = load_average()
            loads.append(float(r["load_average"]) if r["load_average"] != "?" else 0.0)
            runs[policy][who].append(r)
            extra = ""
            if r.get("peak_bytes") is not None:
                extra += f", allocator peak {r['peak_bytes'] / 2**20:.0f} MiB"
            if r.get("allocator_peak_bytes") is not None:
                extra += f", PyTorch allocator peak {r['allocator_peak_bytes'] / 2**20:.0f} MiB"
            if r.get("compile_seconds") is not None:
                extra += f", compile {r['compile_seconds']:.1f} s"
            log(f"{threads}T {name} {policy} round {rnd + 1} {who}: median {r['step_seconds']:.3f} s/step, "
                f"rss growth {r['rss_growth_bytes'] / 2**20:.0f} MiB{extra} (load {r['load_average']})")
    rows = []
    for policy in args.policies:
        row = {"shape": name, **shape, "policy": policy, "threads": threads, "steps_per_process": steps,
               "warmup_steps": args.warmup, "rounds": rounds, "load_samples": loads}
        for who in sides:
            row[who] = summarize(runs[policy][who])
        ours = row["ours"]
        torch_d, torch_t = row.get("torch_default_malloc"), row.get("torch_tuned_malloc")
        if torch_d and torch_t:
            fast = "torch_tuned_malloc" if torch_t["step_seconds"] < torch_d["step_seconds"] else "torch_default_malloc"
            lean = ("torch_tuned_malloc" if torch_t["rss_growth_bytes"] < torch_d["rss_growth_bytes"]
                    else "torch_default_malloc")
            best = row[fast]
            row["torch"] = {"step_seconds": best["step_seconds"], "tokens_per_second": best["tokens_per_second"],
                            "forward_seconds": best["forward_seconds"], "backward_seconds": best["backward_seconds"],
                            "optimizer_seconds": best["optimizer_seconds"],
                            "time_from": fast, "rss_growth_bytes": row[lean]["rss_growth_bytes"],
                            "memory_from": lean, "libraries": best["libraries"],
                            "torch_version": best.get("torch_version")}
            row["time_ratio"] = ours["step_seconds"] / row["torch"]["step_seconds"]
            row["memory_ratio"] = ours["rss_growth_bytes"] / row["torch"]["rss_growth_bytes"]
        forms = [w for w in sides if w.startswith("torch2_") and not in_backward.is_side(w) and row.get(w)]
        if forms:
            fastest = min(forms, key=lambda w: row[w]["step_seconds"])
            leanest = min(forms, key=lambda w: row[w]["rss_growth_bytes"])
            row["torch2_fastest"] = fastest[len("torch2_"):]
            row["torch2_leanest"] = leanest[len("torch2_"):]
            row["time_ratio_torch2"] = ours["step_seconds"] / row[fastest]["step_seconds"]
            # Both sides above the resident set after their warm-up and a trim (like_rss).
            row["memory_ratio_torch2"] = like_rss(ours) / row[leanest]["rss_growth_bytes"]
            peaks = [row[w]["allocator_peak_bytes"] for w in forms if row[w].get("allocator_peak_bytes")]
            if peaks and ours.get("peak_bytes"):
                row["allocator_ratio_torch2"] = ours["peak_bytes"] / min(peaks)
        if args.optimizer_in_backward:
            row["in_backward"] = in_backward.ratios(row)
        rows.append(row)
    return rows


def bench_steps(args, shapes, blas):
    have_torch = not args.no_torch and torch_available()
    if not have_torch:
        log("PyTorch 1.13 not available (or --no-torch): no 1.13 column")
    python2 = None if args.no_torch else torch2_python(args)
    if python2:
        # The PyTorch 2 model must compute what the reference model computes.
        check = subprocess.run([python2, str(ROOT / "bench" / "torch_sac_step.py"), "--check"], capture_output=True,
                               text=True, timeout=args.timeout)
        if check.returncode != 0:
            sys.exit(f"[run_benchmarks] torch_sac_step.py --check failed:\n{check.stdout}{check.stderr[-2000:]}")
        checked = json.loads(check.stdout.strip().splitlines()[-1])
        log(f"PyTorch {checked['torch_version']}: the SDPA model matches torch_reference.py "
            f"(max relative difference {checked['max_relative_difference']:.2g})")
        log(f"PyTorch 2.x: {python2}, forms {', '.join(args.torch2_forms)}, malloc {args.torch2_malloc}, "
            f"Inductor cache {args.build_dir / 'inductor-cache'}")
        if args.optimizer_in_backward:
            check_in_backward(args, python2)
    step_tool = args.build_dir / "rt-bench-step"
    if not step_tool.exists():
        sys.exit(f"[run_benchmarks] {step_tool} not found: build first (cmake --build {args.build_dir})")
    rows = []
    for threads, rounds in zip(args.threads, args.rounds):
        for name, shape in shapes.items():
            rows += measure_shape(args, name, shape, threads, rounds, blas, have_torch, python2)
            # What is measured so far, for --render should the run be cut short.
            (args.out_dir / "benchmarks.partial.json").write_text(json.dumps(make_result(args, rows, None)) + "\n")
    return rows


def check_in_backward(args, python2):
    """torch2_step.py --check-in-backward per PyTorch 2 form: the fused step
    must leave the parameters of the ordinary one (2 steps, small model). A
    form PyTorch refuses or gets wrong is left out (args.in_backward_forms)
    with its reason logged and kept in the result; a failing eager form
    stops the run."""
    env = torch2_env(base_env(args.threads[0], None, args.wait_policy), args)
    args.in_backward_check = {}
    for form in args.torch2_forms:
        proc = subprocess.run([python2, str(ROOT / "bench" / "torch2_step.py"), "--check-in-backward",
                               "--form", form, "--threads", str(args.threads[0])],
                              env=env, capture_output=True, text=True, timeout=args.timeout * 2)
        try:
            entry = json.loads(proc.stdout.strip().splitlines()[-1])["forms"][form]
        except (IndexError, ValueError, KeyError):
            entry = {"status": "skip", "reason": f"exit {proc.returncode}: {proc.stderr[-500:]}"}
        args.in_backward_check[form] = entry
        if entry["status"] == "ok":
            log(f"PyTorch 2 {form} in-backward: 2 steps match the ordinary step "
                f"(max relative difference {entry['max_relative_difference']:.2g})")
        elif form == "eager":
            sys.exit(f"[run_benchmarks] torch2_step.py --check-in-backward --form eager failed: {entry['reason']}")
        else:
            log(f"PyTorch 2 {form} in-backward skipped: {entry['reason']}")
    args.in_backward_forms = [f for f in args.torch2_forms if args.in_backward_check[f]["status"] == "ok"]


def bench_kernels(args, blas):
    tool = args.build_dir / "rt-bench-kernels"
    if not tool.exists():
        log(f"{tool} not built (Google Benchmark missing?): no kernel table")
        return None
    out = args.out_dir / "kernels.json"
    # Kernels run alone with libgomp's default (spinning) wait policy: they
    # measure what a kernel can do, and every GEMM call is a parallel region.
    env = base_env(args.threads[0], blas, None)
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
                     "of_peak": b.get("of_peak"), "one_thread_gflops": b.get("one_thread_GFLOP/s"),
                     "avx512_gflops": b.get("avx512_GFLOP/s"),
                     "one_thread_avx512_gflops": b.get("one_thread_avx512_GFLOP/s")})
    return {"context": data.get("context", {}), "rows": rows, "repetitions": 1 if args.quick else 3,
            "threads": args.threads[0]}


def ffn_width(width):
    """rt-bench-step's feed-forward width: SwiGLU's 8/3·C rounded down to a multiple of 8."""
    return width * 8 // 3 // 8 * 8


def model_flops(shape):
    """Model FLOPs of one training step (forward + backward) of a SHAPES row,
    PaLM's MFU convention (Chowdhery et al. 2022, appendix B): the forward is
    2 FLOPs per matmul weight per token (q, k, v, o, the SwiGLU gate, up and
    down per block, and the LM head; the embedding is a lookup, norms and
    pointwise ops are left out) plus attention's score and value products
    over the causal pairs (2·d FLOPs per pair, head and product: C·T(T+1) each
    per layer and sequence); the backward is twice the forward. What a
    checkpointing policy replays is not model FLOPs: the block policy does
    the same model FLOPs as disabled in a longer step, as MFU (not hardware
    FLOPs utilization) counts it."""
    c, layers, vocab, seq, batch = shape["width"], shape["layers"], shape["vocab"], shape["seq"], shape["batch"]
    f = shape.get("ffn") or ffn_width(c)
    matmul_weights = layers * (4 * c * c + 3 * c * f) + vocab * c
    attention = layers * batch * 2 * c * seq * (seq + 1)
    forward = 2 * matmul_weights * batch * seq + attention
    return 3 * forward


def fma_peak_512(kernels, threads, kernel_threads):
    """(GFLOP/s, note) of the 512-bit FMA loop at `threads`, from the kernel
    table's BM_PeakFma row (measured on `kernel_threads`); None without it.
    At 1 thread a kernel table from before `one_thread_avx512_GFLOP/s` existed
    gives the all-thread 512-bit figure scaled by the 256-bit loop's one-thread
    share (noted as derived)."""
    row = next((b for b in (kernels or {}).get("rows", []) if b["name"].startswith("BM_PeakFma")), None)
    if not row or not row.get("avx512_gflops"):
        return None
    if threads == kernel_threads:
        return row["avx512_gflops"], "measured"
    if threads == 1:
        if row.get("one_thread_avx512_gflops"):
            return row["one_thread_avx512_gflops"], "measured"
        if row.get("one_thread_gflops") and row.get("rate"):
            return row["avx512_gflops"] * row["one_thread_gflops"] / row["rate"], "derived"
    return None


def utilization(rows, kernels, kernel_threads):
    """Per row: model GFLOP per step, achieved GFLOP/s (model FLOPs over the
    median step, Adam included) and its fraction of the 512-bit FMA peak at
    the row's thread count (None where that peak is not known)."""
    out = []
    for r in rows:
        flops = model_flops(r)
        achieved = flops / r["ours"]["step_seconds"] / 1e9
        peak = fma_peak_512(kernels, r["threads"], kernel_threads)
        out.append({"shape": r["shape"], "policy": r["policy"], "threads": r["threads"],
                    "model_gflop": flops / 1e9, "step_seconds": r["ours"]["step_seconds"],
                    "achieved_gflops": achieved, "peak_gflops": peak and peak[0], "peak_note": peak and peak[1],
                    "of_peak": peak and achieved / peak[0]})
    return out


def mib(b):
    return "—" if b is None else f"{b / 2**20:.0f}"


def sec(x):
    return "—" if not x else f"{x['step_seconds']:.3f}"


def fmt_ratio(x):
    return "—" if x is None else f"{x:.2f}"


def shape_label(r):
    return f"{r['shape']} (C {r['width']}, H {r['heads']}, L {r['layers']}, T {r['seq']}, B {r['batch']})"


def thread_counts(rows):
    seen = []
    for r in rows:
        if r["threads"] not in seen:
            seen.append(r["threads"])
    return seen


def best_step_ratio(r):
    """ours / fastest PyTorch 2 over the fastest single measured steps: the
    steps least disturbed by other work on a loaded machine."""
    forms = [r[k] for k in ("torch2_eager", "torch2_compiled") if r.get(k)]
    if not forms:
        return None
    return min(r["ours"]["step_times"]) / min(min(x["step_times"]) for x in forms)


def compile_cell(x):
    c = x and x.get("compile_seconds")
    if not c:
        return "—"
    def one(x):  # below 0.5 s a cache hit is lost in the steps' noise (the difference can come out negative)
        return f"{x:.1f}" if x >= 0.5 else "< 0.5"

    return one(c[0]) + (f" / {one(statistics.median(c[1:]))}" if len(c) > 1 else "")


def markdown(result):
    rows = result["steps"]
    has2 = any(r.get("time_ratio_torch2") is not None for r in rows)
    lines = []
    lines.append(f"Command: `{result['command']}`  ")
    lines.append(f"Date: {result['date']}; threads: {', '.join(map(str, result['threads']))}; rounds per row: "
                 f"{', '.join(f'{n} at {t} thread(s)' for t, n in zip(result['threads'], result['rounds']))}, "
                 f"processes alternating; OMP_WAIT_POLICY {result['omp_wait_policy']} (all sides); "
                 f"OpenBLAS kernel set {result.get('openblas_coretype', 'as in the environment')}; machine load "
                 f"average (1 min) at start {result['load_average_start']}, at end {result['load_average_end']}"
                 + (f", after each process min {result['load']['min']:.2f} / median {result['load']['median']:.2f}"
                    f" / max {result['load']['max']:.2f}" if result.get("load") else "") + ".  ")
    if result.get("torch_version"):
        lines.append(f"PyTorch 1.13: {result['torch_version']} (Debian python3-torch, /usr/bin/python3, "
                     "bench/torch_step.py, materialized attention).  ")
    ib = result.get("optimizer_in_backward")
    if ib and ib.get("check"):
        lines.append("In-backward step, PyTorch 2 forms checked against the ordinary step (torch2_step.py "
                     "--check-in-backward, 2 steps): " + "; ".join(
                         f"{f} " + (f"ok (max relative difference {c['max_relative_difference']:.2g})"
                                    if c["status"] == "ok" else f"skipped: {c['reason']}")
                         for f, c in ib["check"].items()) + ".  ")
    if result.get("torch2_version"):
        lines.append(f"PyTorch 2: {result['torch2_version']} from PyPI (scripts/torch2_env.sh → .venv-torch2, "
                     "bench/torch2_step.py: F.scaled_dot_product_attention + F.rms_norm; its bundled MKL and "
                     f"libgomp), malloc: {result['torch2_malloc']}; compiled = torch.compile (Inductor), cache "
                     "`TORCHINDUCTOR_CACHE_DIR=<build>/inductor-cache`.  ")
    else:
        lines.append(f"PyTorch 2: not measured ({result.get('torch2_skipped', 'skipped')}).  ")
    lines.append("BLAS mapped by each side (from /proc/self/maps): ours "
                 + ", ".join(f"`{x}`" for x in result["blas"]["ours"]) + "; PyTorch 1.13 "
                 + (", ".join(f"`{x}`" for x in result["blas"]["torch"]) or "—") + "; PyTorch 2 "
                 + (", ".join(f"`{os.path.basename(x)}`" for x in result["blas"].get("torch2", [])) or "—") + ".")
    lines.append("")
    for threads in thread_counts(rows):
        rs = [r for r in rows if r["threads"] == threads]
        lines.append(f"### {threads} thread{'s' if threads > 1 else ''}")
        lines.append("")
        lines.append("Step time (s/step, median of every measured step of the row's processes) and ratios: "
                     "**ours / fastest PyTorch 2 form** (which one in the next column), the same over the fastest "
                     "single steps of each side (the least disturbed by other work on the machine), ours / "
                     "PyTorch 1.13.")
        lines.append("")
        lines.append("| shape | policy | ours | PyTorch 1.13 | PyTorch 2 eager | PyTorch 2 compiled | fastest PyTorch 2 "
                     "| **ours / fastest PyTorch 2** | (best steps) | ours / 1.13 | ours tokens/s |")
        lines.append("|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|")
        for r in rs:
            lines.append(f"| {shape_label(r)} | {r['policy']} | {sec(r['ours'])} | {sec(r.get('torch'))} "
                         f"| {sec(r.get('torch2_eager'))} | {sec(r.get('torch2_compiled'))} "
                         f"| {r.get('torch2_fastest', '—')} | **{fmt_ratio(r.get('time_ratio_torch2'))}** "
                         f"| {fmt_ratio(best_step_ratio(r))} | {fmt_ratio(r.get('time_ratio'))} | {r['ours']['tokens_per_second']:.0f} |")
        lines.append("")
        lines.append("Peak training memory (MiB). RSS growth: ours and 1.13 over setup, warm-up included; "
                     "PyTorch 2 over the state after warm-up + gc + malloc_trim (compiler memory excluded), and "
                     "ours the same way (after warm-up: `release_cached_memory()` + malloc_trim), which the "
                     "ratio to PyTorch 2 uses. "
                     "Allocator peak: ours `memory_stats()`, PyTorch 2 its c10 CPU allocator's events under "
                     "torch.profiler (one extra step); both above the bytes live before the step.")
        lines.append("")
        lines.append("| shape | policy | ours RSS | ours RSS after warm-up | 1.13 RSS | PT2 eager RSS "
                     "| PT2 compiled RSS | **ours / smaller PT2 RSS** (after warm-up) | ours / 1.13 RSS "
                     "| ours allocator | PT2 eager allocator | PT2 compiled allocator | ours / smaller PT2 allocator |")
        lines.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in rs:
            o = r["ours"]
            e, c, t = r.get("torch2_eager"), r.get("torch2_compiled"), r.get("torch")
            lines.append(f"| {r['shape']} | {r['policy']} | {mib(o['rss_growth_bytes'])} "
                         f"| {mib(o.get('rss_growth_after_warmup_bytes'))} | {mib(t and t['rss_growth_bytes'])} | {mib(e and e['rss_growth_bytes'])} "
                         f"| {mib(c and c['rss_growth_bytes'])} | **{fmt_ratio(r.get('memory_ratio_torch2'))}** "
                         f"| {fmt_ratio(r.get('memory_ratio'))} | {mib(o.get('peak_bytes'))} "
                         f"| {mib(e and e.get('allocator_peak_bytes'))} | {mib(c and c.get('allocator_peak_bytes'))} "
                         f"| {fmt_ratio(r.get('allocator_ratio_torch2'))} |")
        lines.append("")
        lines += in_backward.tables(rs)
        if any(r.get("torch2_compiled") for r in rs):
            lines.append("torch.compile seconds (warm-up wall time minus as many measured steps; first process "
                         "/ median of the later ones, which reuse the Inductor cache) and Inductor FX-graph cache "
                         "hits/misses over the row's processes:")
            lines.append("")
            lines.append("| shape | policy | compile s | cache hits / misses |")
            lines.append("|---|---|---:|---:|")
            for r in rs:
                c = r.get("torch2_compiled")
                if c:
                    caches = [x or {} for x in c.get("inductor_cache", [])]
                    hits = sum(x.get("fxgraph_cache_hit", 0) for x in caches)
                    miss = sum(x.get("fxgraph_cache_miss", 0) for x in caches)
                    lines.append(f"| {r['shape']} | {r['policy']} | {compile_cell(c)} | {hits} / {miss} |")
            lines.append("")
        if any(r.get("torch_default_malloc") for r in rs):
            lines.append("PyTorch 1.13 per malloc setting (s/step, RSS growth MiB; the 1.13 columns keep the "
                         "faster time and the smaller memory):")
            lines.append("")
            lines.append("| shape | policy | default malloc | MALLOC_MMAP_THRESHOLD_/TRIM_THRESHOLD_ raised |")
            lines.append("|---|---|---:|---:|")
            for r in rs:
                d, tt = r.get("torch_default_malloc"), r.get("torch_tuned_malloc")
                if d and tt:
                    lines.append(f"| {r['shape']} | {r['policy']} | {d['step_seconds']:.3f} s, "
                                 f"{mib(d['rss_growth_bytes'])} | {tt['step_seconds']:.3f} s, "
                                 f"{mib(tt['rss_growth_bytes'])} |")
            lines.append("")
        lines.append("Where the step goes (median s/step: forward = loss with the graph built, backward = "
                     "backward() and dropping the graph, Adam = step + zero_grad):")
        lines.append("")
        lines.append("| shape | policy | ours fwd / bwd / Adam | PT2 eager fwd / bwd / Adam "
                     "| PT2 compiled fwd / bwd / Adam | 1.13 fwd / bwd / Adam |")
        lines.append("|---|---|---:|---:|---:|---:|")

        def phases(x):
            return "—" if not x else (f"{x['forward_seconds']:.3f} / {x['backward_seconds']:.3f} / "
                                      f"{x['optimizer_seconds']:.3f}")

        for r in rs:
            lines.append(f"| {r['shape']} | {r['policy']} | {phases(r['ours'])} | {phases(r.get('torch2_eager'))} "
                         f"| {phases(r.get('torch2_compiled'))} | {phases(r.get('torch'))} |")
        lines.append("")
        us = [u for u in result.get("utilization", []) if u["threads"] == threads]
        if us:
            lines.append("Model FLOPs utilization (ours; PaLM's MFU convention, `model_flops` in "
                         "bench/run_benchmarks.py): model FLOPs per step = 3 × the forward's (2 per matmul "
                         "weight per token — attention projections, SwiGLU, LM head; not the embedding lookup, "
                         "norms or pointwise ops — plus attention's causal score and value products); the block "
                         "policy's replay is not counted, so its row has the same model FLOPs in a longer step. "
                         "Achieved = model FLOPs / median step (Adam included); peak = the 512-bit FMA loop at "
                         f"{threads} thread{'s' if threads > 1 else ''}"
                         + (" (derived: the all-thread 512-bit figure × the 256-bit loop's one-thread share)"
                            if any(u["peak_note"] == "derived" for u in us) else "") + ".")
            lines.append("")
            lines.append("| shape | policy | model GFLOP / step | ours s/step | achieved GFLOP/s | 512-bit FMA peak "
                         "| **of peak (MFU)** |")
            lines.append("|---|---|---:|---:|---:|---:|---:|")
            for u in us:
                peak = "—" if u["peak_gflops"] is None else f"{u['peak_gflops']:.1f}"
                mfu = "—" if u["of_peak"] is None else f"{100 * u['of_peak']:.1f}%"
                lines.append(f"| {u['shape']} | {u['policy']} | {u['model_gflop']:.2f} | {u['step_seconds']:.3f} "
                             f"| {u['achieved_gflops']:.1f} | {peak} | **{mfu}** |")
            lines.append("")
    counts = thread_counts(rows)
    if len(counts) > 1:
        lo, hi = min(counts), max(counts)
        sides = [("ours", "ours"), ("torch", "PyTorch 1.13"), ("torch2_eager", "PT2 eager"),
                 ("torch2_compiled", "PT2 compiled")]
        sides = [(k, n) for k, n in sides if any(r.get(k) for r in rows)]
        lines.append(f"### Thread scaling ({lo} → {hi} threads)")
        lines.append("")
        lines.append(f"s/step at {lo} and {hi} threads and the speed-up t({lo}) / t({hi}) per side; "
                     f"the last column is ours / fastest PyTorch 2 at each count. Rounds per count as above.")
        lines.append("")
        lines.append("| shape | policy | " + " | ".join(n for _, n in sides) + " | ours / fastest PT2 |")
        lines.append("|---|---|" + "---:|" * (len(sides) + 1))
        by = {(r["threads"], r["shape"], r["policy"]): r for r in rows}
        for r in rows:
            if r["threads"] != hi or (lo, r["shape"], r["policy"]) not in by:
                continue
            a = by[(lo, r["shape"], r["policy"])]
            cells = []
            for k, _ in sides:
                x, y = a.get(k), r.get(k)
                cells.append("—" if not (x and y) else f"{x['step_seconds']:.3f} → {y['step_seconds']:.3f} "
                             f"({x['step_seconds'] / y['step_seconds']:.2f}×)")
            lines.append(f"| {r['shape']} | {r['policy']} | " + " | ".join(cells)
                         + f" | {fmt_ratio(a.get('time_ratio_torch2'))} → {fmt_ratio(r.get('time_ratio_torch2'))} |")
        lines.append("")
    if result.get("targets"):
        lines.append("### Targets")
        lines.append("")
        lines.append("| issue | threads | target | measured | met |")
        lines.append("|---|---:|---|---:|---|")
        for t in result["targets"]:
            lines.append(f"| {t['issue']} | {t.get('threads', '—')} | {t['target']} | {t['measured']} "
                         f"| {'yes' if t['met'] else '**no**'} |")
        lines.append("")
    k = result.get("kernels")
    if k:
        reps = k.get("repetitions", 1)
        lines.append(f"Kernel micro-benchmarks (`rt-bench-kernels`, same run, {result['threads'][0]} threads, "
                     "libgomp's default wait policy, "
                     + (f"best of {reps} repetitions" if reps > 1 else "one repetition") + " (the peaks are best of 5); `of peak` is against the widest FMA peak the CPU has for GFLOP/s rows (512-bit where it has AVX-512F, as OpenBLAS's native kernels and our flash/SwiGLU kernels use) and the STREAM triad over 64 MiB arrays for GB/s rows — operands that fit "
                     "in L2/L3 can exceed that DRAM figure):")
        lines.append("")
        lines.append("| benchmark | time | rate | of peak |")
        lines.append("|---|---:|---:|---:|")
        for b in k["rows"]:
            rate = "—" if b["rate"] is None else f"{b['rate']:.1f} {b['unit']}"
            if b["name"].startswith("BM_PeakFma"):
                rate += f" (256-bit; one thread {b['one_thread_gflops']:.1f})"
                if b.get("avx512_gflops"):
                    rate += f"; 512-bit {b['avx512_gflops']:.1f} GFLOP/s"
                    if b.get("one_thread_avx512_gflops"):
                        rate += f", one thread {b['one_thread_avx512_gflops']:.1f}"
            peak = "—" if b["of_peak"] is None else f"{100 * b['of_peak']:.0f}%"
            lines.append(f"| `{b['name']}` | {b['real_time']:.1f} {b['time_unit']} | {rate} | {peak} |")
        lines.append("")
    if result.get("chart"):
        lines.append(f"![time and memory per shape and policy]({result.get('chart_relative', result['chart'])})")
        lines.append("")
    return "\n".join(lines)


def targets(rows, kernels, utilization=None):
    """Issue 16's targets per thread count (S3's MFU from `utilization`);
    issue 6's (against 1.13) at the first thread count; the kernel rows."""
    out = []
    counts = thread_counts(rows)
    for threads in counts:
        rs = [r for r in rows if r["threads"] == threads]
        by = {(r["shape"], r["policy"]): r for r in rs}
        for r in rs:
            if r.get("time_ratio_torch2") is not None:
                out.append({"issue": 16, "threads": threads,
                            "target": f"{r['shape']} {r['policy']}: step ours / fastest PyTorch 2 "
                                      f"({r['torch2_fastest']}) <= {TARGET_TIME_TORCH2}",
                            "measured": f"{r['time_ratio_torch2']:.2f}",
                            "met": r["time_ratio_torch2"] <= TARGET_TIME_TORCH2})
        for (shape, policy), r in by.items():
            if policy == "block" and (shape, "disabled") in by:
                ratio = r["ours"]["step_seconds"] / by[(shape, "disabled")]["ours"]["step_seconds"]
                out.append({"issue": 16, "threads": threads,
                            "target": f"{shape}: ours block / disabled step <= {TARGET_BLOCK_COST}",
                            "measured": f"{ratio:.2f}", "met": ratio <= TARGET_BLOCK_COST})
        out += in_backward.targets(rs, threads, TARGET_MEMORY)
        for r in rs:
            if r.get("memory_ratio_torch2") is not None:
                out.append({"issue": 16, "threads": threads,
                            "target": f"{r['shape']} {r['policy']}: RSS growth ours / smaller PyTorch 2 "
                                      f"({r['torch2_leanest']}), both after warm-up, <= {TARGET_MEMORY}",
                            "measured": f"{r['memory_ratio_torch2']:.2f}",
                            "met": r["memory_ratio_torch2"] <= TARGET_MEMORY})
    for u in utilization or []:
        if u["shape"] == "S3" and u["of_peak"] is not None:
            out.append({"issue": 16, "threads": u["threads"],
                        "target": f"S3 {u['policy']}: whole step >= {int(TARGET_S3_MFU * 100)}% of the 512-bit "
                                  "FMA peak in model FLOPs (MFU)",
                        "measured": f"{100 * u['of_peak']:.1f}%", "met": u["of_peak"] >= TARGET_S3_MFU})
    rs = [r for r in rows if r["threads"] == counts[0]] if counts else []
    for r in rs:
        if "time_ratio" in r:
            out.append({"issue": 6, "threads": counts[0],
                        "target": f"{r['shape']} {r['policy']}: step ours / PyTorch 1.13 <= {TARGET_TIME}",
                        "measured": f"{r['time_ratio']:.2f}", "met": r["time_ratio"] <= TARGET_TIME})
    for r in rs:
        if "memory_ratio" in r:
            out.append({"issue": 6, "threads": counts[0],
                        "target": f"{r['shape']} {r['policy']}: RSS growth ours / PyTorch 1.13 <= {TARGET_MEMORY}",
                        "measured": f"{r['memory_ratio']:.2f}", "met": r["memory_ratio"] <= TARGET_MEMORY})
    by = {(r["shape"], r["policy"]): r for r in rs}
    if ("S2", "block") in by and ("S2", "disabled") in by:
        for key, label in (("peak_bytes", "allocator peak"), ("rss_growth_bytes", "RSS growth")):
            ratio = by[("S2", "block")]["ours"][key] / by[("S2", "disabled")]["ours"][key]
            out.append({"issue": 6, "threads": counts[0],
                        "target": f"S2: ours block / disabled peak ({label}) <= {TARGET_S2_BLOCK_PEAK}",
                        "measured": f"{ratio:.2f}", "met": ratio <= TARGET_S2_BLOCK_PEAK})
    if kernels:
        for b in kernels["rows"]:
            if b["name"].startswith("BM_Gemm/M:1024/N:1024") or b["name"].startswith("BM_Gemm/M:2048/N:2048"):
                out.append({"issue": 6, "threads": counts[0] if counts else None,
                            "target": f"matmul {b['name'].split('/real_time')[0][8:]} >= "
                                      f"{int(TARGET_MATMUL_PEAK * 100)}% of FMA peak",
                            "measured": f"{100 * b['of_peak']:.0f}%", "met": b["of_peak"] >= TARGET_MATMUL_PEAK})
    return out


SIDES = [("ours", "riftco", "#2b6cb0"), ("torch", "PyTorch 1.13", "#a0aec0"),
         ("torch2_eager", "PyTorch 2 eager", "#dd6b20"), ("torch2_compiled", "PyTorch 2 compiled", "#c53030")]


def chart(rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib not installed (Debian: python3-matplotlib): no chart")
        return False
    counts = thread_counts(rows)
    sides = [s for s in SIDES if any(r.get(s[0]) for r in rows)]
    if len(sides) < 2:
        return False
    fig, axes = plt.subplots(len(counts), 2, figsize=(14, 4.6 * len(counts)), squeeze=False)
    w = 0.8 / len(sides)
    for axrow, threads in zip(axes, counts):
        rs = [r for r in rows if r["threads"] == threads]
        x = list(range(len(rs)))
        panels = [("step time (s)", lambda s: s["step_seconds"], "time_ratio_torch2", "ours / fastest PyTorch 2"),
                  ("peak RSS growth (MiB; ours, PyTorch 2 after warm-up)", lambda s: like_rss(s) / 2**20,
                   "memory_ratio_torch2",
                   "ours / smaller PyTorch 2")]
        for ax, (title, value, ratio_key, ratio_label) in zip(axrow, panels):
            top = 0
            for j, (key, label, color) in enumerate(sides):
                vals = [value(r[key]) if r.get(key) else 0 for r in rs]
                top = max(top, max(vals))
                ax.bar([i - 0.4 + w * (j + 0.5) for i in x], vals, w, label=label, color=color)
            for i, r in enumerate(rs):
                if r.get(ratio_key) is not None:
                    ax.text(i, top * 1.02, f"{r[ratio_key]:.2f}×", ha="center", va="bottom", fontsize=8)
            ax.set_xticks(x)
            ax.set_xticklabels([f"{r['shape']}\n{r['policy']}" for r in rs], fontsize=8)
            ax.set_title(f"{title}, {threads} thread{'s' if threads > 1 else ''} — label: {ratio_label}", fontsize=10)
            ax.set_ylim(0, top * 1.15)
            ax.grid(axis="y", alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(sides), fontsize=9)
    fig.suptitle("Training step (forward + backward + Adam), lower is better", fontsize=11)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def load_average():
    try:
        return open("/proc/loadavg").read().split()[0]
    except OSError:
        return "?"


def int_list(text, option):
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        sys.exit(f"[run_benchmarks] {option} {text!r}: a comma-separated list of positive integers")
    if not values or min(values) < 1:
        sys.exit(f"[run_benchmarks] {option} {text!r}: every value must be >= 1")
    return values


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
    ap.add_argument("--threads", default="2",
                    help="thread count, or a comma-separated list measured one after the other, e.g. 2,1 "
                         "(the first is the main table's and the kernel benchmarks'; default %(default)s)")
    ap.add_argument("--rounds", default=None,
                    help="alternating rounds per row (default 3, quick 1); one value, or one per --threads entry")
    ap.add_argument("--steps", type=int, default=None, help="measured steps per process (default S1 5, others 3)")
    ap.add_argument("--warmup", type=int, default=1, help="warm-up steps per process (PyTorch 2 compiled: >= 2)")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per process (PyTorch 2: twice this)")
    ap.add_argument("--wait-policy", default="passive",
                    help="OMP_WAIT_POLICY for both sides ('' keeps the environment's). Passive by default: on a "
                         "shared machine threads spinning at barriers take the cores their preempted partners "
                         "need (PyTorch S1 under load: 3.7-4.0 s/step spinning, 2.0-2.4 s passive)")
    ap.add_argument("--no-torch", action="store_true", help="riftco only (no PyTorch 1.13 and no PyTorch 2)")
    ap.add_argument("--torch2", choices=["setup", "auto", "off"], default=None,
                    help="PyTorch 2.x columns: setup = create .venv-torch2 with scripts/torch2_env.sh when missing "
                         "(default of a full run), auto = only if .venv-torch2 exists (default of --quick), off")
    ap.add_argument("--torch-python", default=None, help="a PyTorch >= 2.4 interpreter instead of .venv-torch2's")
    ap.add_argument("--torch2-forms", default=None,
                    help="PyTorch 2 forms: eager,compiled (default; --quick: eager, as a cold compile takes ~25 s)")
    ap.add_argument("--torch2-malloc", choices=["tuned", "default"], default="tuned",
                    help="PyTorch 2 processes' malloc: MALLOC_MMAP_THRESHOLD_/TRIM_THRESHOLD_ raised (default) or "
                         "glibc's default")
    ap.add_argument("--no-kernels", action="store_true")
    ap.add_argument("--policies", default="disabled,block", help="checkpointing policies: a subset of "
                    "disabled,block (default both; a subset is a partial run, leaving docs/benchmarks.md alone)")
    ap.add_argument("--optimizer-in-backward", action="store_true",
                    help="also measure the optimizer step fused into the backward pass: ours "
                         "(rt-bench-step --optimizer-in-backward) and PyTorch 2's hook recipe, per form; adds "
                         "the in-backward tables")
    ap.add_argument("--openblas-coretype", choices=["inherit", "native"], default=None,
                    help="native (default of a full run): remove OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE for every "
                         "process (both sides), so OpenBLAS picks this CPU's kernels as PyTorch 2's MKL does; "
                         "inherit (default of --quick, which ctest runs): keep them from the environment "
                         "(docs/benchmarks.md, 'OpenBLAS kernel set')")
    ap.add_argument("--render", type=pathlib.Path, default=None,
                    help="measure nothing: rewrite the Markdown, chart and docs block from this benchmarks.json")
    args = ap.parse_args()
    global openblas_coretype
    openblas_coretype = args.openblas_coretype or ("inherit" if args.quick else "native")
    args.build_dir = args.build_dir.resolve()
    if args.render:
        result = json.loads(args.render.read_text())
        args.out_dir = (args.out_dir or args.render.resolve().parent)
        args.out_dir.mkdir(parents=True, exist_ok=True)
        if args.docs is None and args.out_dir.resolve() == (ROOT / "bench" / "results").resolve():
            args.docs = ROOT / "docs" / "benchmarks.md"
        publish(result, args)
        return
    args.threads = int_list(args.threads, "--threads")
    rounds = int_list(args.rounds, "--rounds") if args.rounds else [1 if args.quick else 3]
    if len(rounds) == 1:
        rounds *= len(args.threads)
    if len(rounds) != len(args.threads):
        sys.exit(f"[run_benchmarks] --rounds {args.rounds}: one value or one per --threads entry "
                 f"({len(args.threads)})")
    args.rounds = rounds
    if args.torch2 is None:
        args.torch2 = "auto" if args.quick else "setup"
    forms = (args.torch2_forms or ("eager" if args.quick else "eager,compiled")).split(",")
    if not forms or not set(forms) <= {"eager", "compiled"}:
        sys.exit(f"[run_benchmarks] --torch2-forms {args.torch2_forms}: a subset of eager,compiled")
    args.torch2_forms = forms
    args.in_backward_forms = []
    args.in_backward_check = None
    args.policies = args.policies.split(",")
    if not args.policies or not set(args.policies) <= set(POLICIES) or len(set(args.policies)) < len(args.policies):
        sys.exit(f"[run_benchmarks] --policies {','.join(args.policies)}: a subset of {','.join(POLICIES)}")
    # Only a complete run into bench/results rewrites the published page; a
    # partial or scratch run leaves it alone unless --docs names a file.
    complete = (not args.quick and args.out_dir is None and not args.shapes and not args.no_torch
                and not args.no_kernels and args.torch2 != "off" and len(args.policies) == len(POLICIES))
    if args.out_dir is None:
        args.out_dir = args.build_dir / "bench-quick" if args.quick else ROOT / "bench" / "results"
    args.out_dir.mkdir(parents=True, exist_ok=True)
    if args.docs is None and complete:
        args.docs = ROOT / "docs" / "benchmarks.md"
    shapes = QUICK_SHAPES if args.quick else SHAPES
    if args.shapes:
        shapes = {k: v for k, v in SHAPES.items() if k in args.shapes.split(",")}
        if not shapes:
            sys.exit(f"[run_benchmarks] --shapes {args.shapes}: none of {','.join(SHAPES)}")

    blas = blas_dir()
    log("OpenBLAS for both sides:", blas or "(system default)")
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    load_start = load_average()
    args.started, args.load_start, args.blas = started, load_start, blas
    rows = bench_steps(args, shapes, blas)
    kernels = None if args.no_kernels else bench_kernels(args, blas)
    publish(make_result(args, rows, kernels), args)
    (args.out_dir / "benchmarks.partial.json").unlink(missing_ok=True)


def make_result(args, rows, kernels):
    samples = [x for r in rows for x in r.get("load_samples", [])]
    first2 = next((r[k] for r in rows for k in ("torch2_eager", "torch2_compiled") if r.get(k)), None)
    result = {
        "command": "/usr/bin/python3 bench/run_benchmarks.py " + " ".join(sys.argv[1:]),
        "date": args.started,
        "threads": args.threads,
        "omp_wait_policy": args.wait_policy or os.environ.get("OMP_WAIT_POLICY", "(libgomp default)"),
        "openblas_coretype": ("native (OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE removed)" if openblas_coretype == "native"
                              else os.environ.get("OPENBLAS_CORETYPE", "(unset: native)")),
        "rounds": args.rounds,
        "load_average_start": args.load_start,
        "load_average_end": load_average(),
        "load": ({"min": min(samples), "median": statistics.median(samples), "max": max(samples)}
                 if samples else None),
        "blas_dir": args.blas,
        "blas": {"ours": rows[0]["ours"]["libraries"] if rows else [],
                 "torch": next((r["torch"]["libraries"] for r in rows if r.get("torch")), []),
                 "torch2": first2["libraries"] if first2 else []},
        "torch_version": next((r["torch"]["torch_version"] for r in rows if r.get("torch")), None),
        "torch2_version": first2["torch_version"] if first2 else None,
        "torch2_malloc": args.torch2_malloc, "torch2_forms": args.torch2_forms,
        "torch2_skipped": None if first2 else f"--torch2 {args.torch2}" + (
            "; .venv-torch2 absent" if args.torch2 == "auto" else ""),
        "steps": rows,
        "kernels": kernels,
    }
    if args.optimizer_in_backward:
        result["optimizer_in_backward"] = {"torch2_forms": args.in_backward_forms, "check": args.in_backward_check}
    return result


def publish(result, args):
    """Targets, chart, JSON, Markdown and the docs block from result["steps"]."""
    rows, kernels = result["steps"], result.get("kernels")
    kernel_threads = (kernels or {}).get("threads") or (result["threads"][0] if result.get("threads") else None)
    result["utilization"] = utilization(rows, kernels, kernel_threads)
    result["targets"] = targets(rows, kernels, result["utilization"])
    png = args.out_dir / "benchmarks.png"
    result["chart"] = str(png) if chart(rows, png) else None
    result.pop("chart_relative", None)
    if result["chart"] and args.docs:
        result["chart_relative"] = os.path.relpath(png, args.docs.parent)
    (args.out_dir / "benchmarks.json").write_text(json.dumps(result, indent=2) + "\n")
    md = markdown(result)
    (args.out_dir / "benchmarks.md").write_text(md + "\n")
    log("BLAS ours:", result["blas"]["ours"])
    log("BLAS PyTorch:", result["blas"]["torch"], result["blas"].get("torch2"))
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
