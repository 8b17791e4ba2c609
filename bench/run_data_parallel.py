#!/usr/bin/python3
"""Data-parallel scaling over MPI on the S1 shape, and the S3 communication projection (one command).

    /usr/bin/python3 bench/run_data_parallel.py            # full run: docs/benchmarks.md + docs/distributed.md
    /usr/bin/python3 bench/run_data_parallel.py --quick    # tiny shape, checks only (< 60 s; CTest bench_data_parallel_quick)

Builds nothing: expects a build tree (default ./build, configured with MPI)
holding rt-bench-dp-step (bench/data_parallel_step.cpp), which times the
pipelines' own training step: stage::data_parallel_step (gradients averaged in
25 MiB buckets during backward) under `mpirun -np 2`,
the single-process step otherwise; no setup, data loading or file writing
inside the timed region.

Configurations, at equal total cores (2 here):
  1 rank  x 1 thread   the per-core baseline
  1 rank  x 2 threads  one process on both cores
  2 ranks x 1 thread   mpirun -np 2 (--bind-to none, like the single process)
  2 ranks x 1 thread, ZeRO-1 (rt-train --zero 1's optimizer: ShardedAdam)
for the checkpointing policies disabled and block, each in a fresh process,
alternating round by round (order reversed in odd rounds) so every
configuration sees the same machine load. A job's step time is the slowest
rank's; a row reports its fastest round (the JSON keeps every round).
Scaling efficiency: tokens/s(2 x 1) / tokens/s(1 x 2), and / (2 x tokens/s(1 x 1)).

The S3 part measures one rank's step (1 and 2 threads, phases split) and the
all-reduce over S3's gradient volume between 2 ranks here, then projects 8
hosts at 10/25/100 Gb/s (written between markers in docs/distributed.md).
Every job is checked (a failure exits non-zero): all ranks end with the same
parameter checksum; reruns of a configuration end with the same bits; ZeRO-1
ends with plain data parallelism's bits and block with disabled's; the first
step's loss agrees with one process's.
"""
import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from run_benchmarks import SHAPES, QUICK_SHAPES, base_env, blas_dir, load_average, shape_args  # noqa: E402
from dp_projection import projection, projection_markdown  # noqa: E402

POLICIES = ["disabled", "block"]
# name, ranks, threads per rank, ZeRO stage
CONFIGS = [("1x1", 1, 1, 0), ("1x2", 1, 2, 0), ("2x1", 2, 1, 0), ("2x1-zero1", 2, 1, 1)]
TARGET_EFFICIENCY = 0.9
TARGET_ZERO_STATE = 0.55
DP_BEGIN = "<!-- BEGIN DATA PARALLEL RESULTS (bench/run_data_parallel.py writes this part) -->"
DP_END = "<!-- END DATA PARALLEL RESULTS -->"
PROJ_BEGIN = "<!-- BEGIN S3 PROJECTION (bench/run_data_parallel.py writes this part) -->"
PROJ_END = "<!-- END S3 PROJECTION -->"
MPI_ROOT_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                "OMPI_MCA_rmaps_base_oversubscribe": "1"}


def log(*args):
    print("[run_data_parallel]", *args, file=sys.stderr, flush=True)


def run_job(args, shape, policy, ranks, threads, zero, steps, warmup, reps, blas, scratch):
    """One fresh job; returns every rank's JSON, rank order."""
    out = scratch / f"job{time.monotonic_ns()}"
    env = base_env(threads, blas, args.wait_policy)
    env.setdefault("OMPI_MCA_btl_vader_single_copy_mechanism", "none")
    if args.mpi_yield:  # a rank waiting in a collective yields its core (MPI's passive wait)
        env["OMPI_MCA_mpi_yield_when_idle"] = "1"
    if os.geteuid() == 0:
        env.update({k: v for k, v in MPI_ROOT_ENV.items() if k not in env})
    cmd = [str(args.build_dir / "rt-bench-dp-step"), "--out", str(out), "--policy", policy, "--steps", str(steps),
           "--warmup", str(warmup), "--zero", str(zero), "--allreduce-reps", str(reps)] + [
        a for a in shape_args(shape)]
    if ranks > 1:
        exported = [x for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_WAIT_POLICY", "LD_LIBRARY_PATH")
                    if k in env for x in ("-x", k)]
        cmd = [args.mpirun, "-np", str(ranks), "--oversubscribe", "--bind-to", "none"] + exported + cmd
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    missing = [r for r in range(ranks) if not (out / f"rank{r}.json").exists()]
    if missing:
        sys.exit(f"[run_data_parallel] rank(s) {missing} of {ranks} wrote no result (did the launcher start "
                 f"{ranks} MPI ranks of an MPI build?): {' '.join(cmd)}")
    rows = [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)]
    shutil.rmtree(out, ignore_errors=True)
    for r in rows:
        if r["world_size"] != ranks or r["threads"] != threads:
            sys.exit(f"[run_data_parallel] rank {r['rank']} ran as {r['world_size']} rank(s) x {r['threads']} "
                     f"thread(s), not {ranks} x {threads}: {' '.join(cmd)}")
    sums = {r["parameter_checksum"] for r in rows}
    if len(sums) != 1:
        sys.exit(f"[run_data_parallel] ranks end with different parameters ({sorted(sums)}): {' '.join(cmd)}")
    # The job's step i takes as long as its slowest rank.
    job_steps = [max(r["step_times"][i] for r in rows) for i in range(len(rows[0]["step_times"]))]
    # CPU seconds of the whole job per step (every rank, every thread).
    job_cpu = [sum(r["cpu_times"][i] for r in rows) for i in range(len(rows[0]["cpu_times"]))]
    return {"ranks": rows, "step_seconds": statistics.median(job_steps), "step_times": job_steps,
            "checksum": rows[0]["parameter_checksum"],
            "cpu_seconds": statistics.median(job_cpu),
            "first_loss": rows[0]["losses"][0]}


def summarize(jobs, shape):
    best = min(jobs, key=lambda j: j["step_seconds"])
    tokens = shape["batch"] * shape["seq"]
    per_rank = best["ranks"]
    return {
        "step_seconds": best["step_seconds"],
        "median_round_step_seconds": statistics.median(j["step_seconds"] for j in jobs),
        "round_step_seconds": [j["step_seconds"] for j in jobs],
        "cpu_seconds": min(j["cpu_seconds"] for j in jobs),
        "round_cpu_seconds": [j["cpu_seconds"] for j in jobs],
        "round_step_times_per_rank": [[r["step_times"] for r in j["ranks"]] for j in jobs],
        "tokens_per_second": tokens / best["step_seconds"],
        "adam_state_bytes": max(r["adam_state_bytes"] for r in per_rank),
        "peak_bytes": max(r["peak_bytes"] for j in jobs for r in j["ranks"]),
        "peak_total_bytes": max(r["peak_total_bytes"] for j in jobs for r in j["ranks"]),
        "rss_peak_bytes": max(r["rss_peak_bytes"] for j in jobs for r in j["ranks"]),
        "rss_growth_bytes": max(r["rss_growth_bytes"] for j in jobs for r in j["ranks"]),
        "allreduce_seconds": statistics.median(r["allreduce_seconds"] for j in jobs for r in j["ranks"]),
        "allreduce_latency_seconds": statistics.median(r["allreduce_latency_seconds"] for j in jobs
                                                       for r in j["ranks"]),
        "gradient_bytes": per_rank[0]["gradient_bytes"],
        "parameters": per_rank[0]["parameters"],
        "first_loss": best["first_loss"],
        "forward_seconds": best["ranks"][0]["forward_seconds"],
        "backward_seconds": best["ranks"][0]["backward_seconds"],
        "optimizer_seconds": best["ranks"][0]["optimizer_seconds"],
        "rounds": len(jobs),
        "checksums": sorted({j["checksum"] for j in jobs}),
    }


def bench_scaling(args, shape, blas, scratch):
    jobs = {(p, c[0]): [] for p in POLICIES for c in CONFIGS}
    order = [(p, c) for p in POLICIES for c in CONFIGS]
    for rnd in range(args.rounds):
        for policy, (name, ranks, threads, zero) in (order if rnd % 2 == 0 else list(reversed(order))):
            j = run_job(args, shape, policy, ranks, threads, zero, args.steps, args.warmup, 3, blas, scratch)
            jobs[(policy, name)].append(j)
            r0 = j["ranks"][0]
            log(f"{policy} {name} round {rnd + 1}: {j['step_seconds']:.3f} s/step, allocator peak "
                f"{r0['peak_total_bytes'] / 2**20:.0f} MiB, Adam state {r0['adam_state_bytes'] / 2**20:.1f} MiB, "
                f"RSS {r0['rss_peak_bytes'] / 2**20:.0f} MiB (rank 0)")
    rows = []
    for policy in POLICIES:
        for name, ranks, threads, zero in CONFIGS:
            s = summarize(jobs[(policy, name)], shape) if jobs[(policy, name)] else None
            rows.append({"policy": policy, "config": name, "ranks": ranks, "threads": threads, "zero": zero,
                         "result": s})
    # One process and two ranks must train the same model: the first step's
    # loss (before any update) agrees to float tolerance.
    for policy in POLICIES:
        losses = [r["result"]["first_loss"] for r in rows if r["policy"] == policy and r["result"]]
        if max(losses) - min(losses) > 1e-4 * max(1.0, abs(losses[0])):
            sys.exit(f"[run_data_parallel] {policy}: first-step losses differ across configurations: {losses}")
    # Bits: every rerun of a configuration ends with the same parameters;
    # ZeRO-1 ends with plain data parallelism's, and block with disabled's.
    by = {(r["policy"], r["config"]): r["result"] for r in rows if r["result"]}
    for (policy, name), res in by.items():
        if len(res["checksums"]) != 1:
            sys.exit(f"[run_data_parallel] {policy} {name}: reruns end with different parameters {res['checksums']}")
        pairs = [((policy, "2x1"), "ZeRO-1 vs plain data parallelism")] if name == "2x1-zero1" else []
        if policy != "disabled":
            pairs.append((("disabled", name), f"{policy} vs disabled"))
        for other, what in pairs:
            if other in by and by[other]["checksums"] != res["checksums"]:
                sys.exit(f"[run_data_parallel] {name}: {what} end with different parameters "
                         f"({res['checksums']} vs {by[other]['checksums']})")
    return rows


def efficiencies(rows):
    by = {(r["policy"], r["config"]): r["result"] for r in rows}
    out = []
    for policy in POLICIES:
        one, two_threads = by.get((policy, "1x1")), by.get((policy, "1x2"))
        for name in ("2x1", "2x1-zero1"):
            dp = by.get((policy, name))
            if not (dp and one and two_threads):
                out.append({"policy": policy, "config": name, "equal_cores": None, "per_core": None})
                continue
            out.append({"policy": policy, "config": name,
                        "equal_cores": dp["tokens_per_second"] / two_threads["tokens_per_second"],
                        "per_core": dp["tokens_per_second"] / (2 * one["tokens_per_second"]),
                        "threads_speedup": two_threads["tokens_per_second"] / one["tokens_per_second"],
                        # the work one core does alone / the work the 2 ranks do together
                        "cpu_work": one["cpu_seconds"] / dp["cpu_seconds"]})
    zero = []
    for policy in POLICIES:
        plain, sharded = by.get((policy, "2x1")), by.get((policy, "2x1-zero1"))
        zero.append({"policy": policy, "ratio": (sharded["adam_state_bytes"] / plain["adam_state_bytes"]
                                                  if plain and sharded else None)})
    return out, zero


def bench_projection_inputs(args, name, shape, blas, scratch):
    """S3 on one rank (1 and 2 threads, phases timed) and S3's all-reduce between 2 ranks."""
    out = {}
    jobs = {1: [], 2: []}
    for rnd in range(args.proj_rounds):  # alternating, as the scaling rows
        for threads in ((1, 2) if rnd % 2 == 0 else (2, 1)):
            jobs[threads].append(run_job(args, shape, "disabled", 1, threads, 0, args.proj_steps, 1, 0, blas,
                                         scratch))
            log(f"{name} 1x{threads} round {rnd + 1}: {jobs[threads][-1]['step_seconds']:.3f} s/step")
    for threads in (1, 2):
        out[f"1x{threads}"] = summarize(jobs[threads], shape)
    # The all-reduce alone over S3's gradient bytes (the steps are skipped: one of 1 row).
    tiny = dict(shape, batch=2, layers=shape["layers"])
    j = run_job(args, tiny, "disabled", 2, 1, 0, 1, 0, 5, blas, scratch)
    out["allreduce_seconds"] = max(r["allreduce_seconds"] for r in j["ranks"])
    out["allreduce_latency_seconds"] = max(r["allreduce_latency_seconds"] for r in j["ranks"])
    out["gradient_bytes"] = j["ranks"][0]["gradient_bytes"]
    out["parameters"] = j["ranks"][0]["parameters"]
    log(f"{name} all-reduce of {out['gradient_bytes'] / 2**20:.0f} MiB between 2 ranks here: "
        f"{out['allreduce_seconds']:.3f} s")
    return out


def fmt(x, digits=2):
    return "—" if x is None else f"{x:.{digits}f}"


def mib(b):
    return f"{b / 2**20:.0f}"


def scaling_markdown(res):
    shape = res["shape"]
    lines = [f"Command: `{res['command']}`  ",
             f"Date: {res['date']}; shape {res['shape_name']} (C {shape['width']}, H {shape['heads']}, "
             f"L {shape['layers']}, T {shape['seq']}, global batch {shape['batch']}); {res['steps']} measured "
             f"step(s) after {res['warmup']} warm-up per process; {res['rounds']} rounds, processes alternating; "
             f"OMP_WAIT_POLICY {res['wait_policy']}; `mpirun --bind-to none`"
             f"{', OMPI_MCA_mpi_yield_when_idle=1' if res['mpi_yield'] else ''}; a row is its fastest round "
             f"(every round in `{res['json']}`). Machine: {res['cores']} cores shared with "
             f"other jobs; `uptime` load average at start {res['load_start']}, at end {res['load_end']}.  ",
             "Timed: the pipelines' step (`stage::data_parallel_step` on 2 ranks: forward and backward on the "
             "rank's rows, the gradients averaged in 25 MiB buckets started during backward, Adam; the "
             "single-process step on 1), slowest rank per step. ZeRO-1: the same step with `rt-train --zero 1`'s "
             "optimizer (`ShardedAdam` on the buckets' averaged gradients: the rank's shard of Adam updated, "
             "all-gather of the parameters). Memory per rank: Adam state = the allocator's bytes made by building the optimizer; "
             "allocator peak = the largest live bytes during a step (parameters, gradients, Adam state and "
             "activations); RSS = the process's peak resident set (VmHWM). CPU s/step = user + system CPU "
             "seconds of every rank's threads per step (getrusage; median of the job's steps, smallest round): "
             "the work done, whatever share of the cores other jobs leave (a rank waiting in MPI's yielding "
             "poll counts too).",
             "",
             "| policy | ranks × threads | ZeRO | s/step | tokens/s | CPU s/step (all ranks) | Adam state MiB/rank "
             "| allocator peak MiB/rank | peak RSS MiB/rank |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in res["rows"]:
        s = r["result"]
        label = f"{r['ranks']} × {r['threads']}"
        zero = "ZeRO-1" if r["zero"] else "off"
        if s is None:
            lines.append(f"| {r['policy']} | {label} | {zero} | not run | — | — | — | — | — |")
        else:
            lines.append(f"| {r['policy']} | {label} | {zero} | {s['step_seconds']:.3f} | "
                         f"{s['tokens_per_second']:.0f} | {s['cpu_seconds']:.3f} | "
                         f"{s['adam_state_bytes'] / 2**20:.1f} | "
                         f"{mib(s['peak_total_bytes'])} | {mib(s['rss_peak_bytes'])} |")
    lines += ["", "Scaling efficiency (2 ranks × 1 thread):", "",
              "| policy | ZeRO | vs 1 rank × 2 threads (equal cores) | vs 2 × (1 rank × 1 thread) | "
              "1 → 2 threads speedup of one rank | CPU s/step 1 × 1 / 2 × 1 |",
              "|---|---|---:|---:|---:|---:|"]
    for e in res["efficiency"]:
        zero = "ZeRO-1" if e["config"].endswith("zero1") else "off"
        if e["equal_cores"] is None:
            lines.append(f"| {e['policy']} | {zero} | not run | — | — | — |")
        else:
            lines.append(f"| {e['policy']} | {zero} | **{e['equal_cores']:.2f}** | {e['per_core']:.2f} | "
                         f"{e['threads_speedup']:.2f} | {e['cpu_work']:.2f} |")
    lines += ["", "The last column is the work ratio: 1.00 when two ranks together spend no more CPU time on "
              "a step than one single-threaded process does (no data-parallel overhead beyond the cores).",
              "", "Targets (issue 17, reported):", "", "| target | measured | met |", "|---|---:|---|"]
    for t in res["targets"]:
        met = "—" if t["met"] is None else ("yes" if t["met"] else "**no**")
        lines.append(f"| {t['target']} | {t['measured']} | {met} |")
    lines.append("")
    if res.get("chart"):
        lines += [f"![tokens/s and memory per rank]({res['chart_relative']})", ""]
    return "\n".join(lines)


def chart(res, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib not installed (Debian: python3-matplotlib): no chart")
        return False
    rows = [r for r in res["rows"] if r["result"]]
    labels = [f"{r['policy']}\n{r['ranks']}×{r['threads']}" + ("\nZeRO-1" if r["zero"] else "") for r in rows]
    x = list(range(len(rows)))
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.6))
    colors = ["#2b6cb0" if r["ranks"] == 1 else ("#dd6b20" if not r["zero"] else "#38a169") for r in rows]
    axes[0].bar(x, [r["result"]["tokens_per_second"] for r in rows], color=colors)
    axes[0].set_title("tokens/s (higher is better)", fontsize=10)
    w = 0.4
    axes[1].bar([i - w / 2 for i in x], [r["result"]["peak_total_bytes"] / 2**20 for r in rows], w,
                label="allocator peak", color="#2b6cb0")
    axes[1].bar([i + w / 2 for i in x], [r["result"]["adam_state_bytes"] / 2**20 for r in rows], w,
                label="Adam state", color="#38a169")
    axes[1].set_title("memory per rank (MiB)", fontsize=10)
    axes[1].legend(fontsize=8)
    for ax in axes:
        ax.set_xticks(x)
        ax.set_xticklabels(labels, fontsize=7)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"Data parallelism on {res['shape_name']}: 1 rank × 1 or 2 threads vs 2 ranks × 1 thread", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def replace_between(path, begin, end, body, heading):
    text = path.read_text()
    if begin not in text:
        text = text.rstrip("\n") + f"\n\n{heading}\n\n{begin}\n{end}\n"
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    path.write_text(head + begin + "\n" + body + "\n" + end + tail)
    log("wrote", path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny shape, checks only, no docs update (< 60 s)")
    ap.add_argument("--build-dir", type=pathlib.Path, default=ROOT / "build")
    ap.add_argument("--out-dir", type=pathlib.Path, default=None,
                    help="JSON and PNG (default bench/results; --quick: BUILD/dp-quick)")
    ap.add_argument("--rounds", type=int, default=None, help="alternating rounds (default 3, quick 2)")
    ap.add_argument("--steps", type=int, default=None, help="measured steps per process (default 4, quick 2)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--proj-steps", type=int, default=2, help="measured S3 steps per process")
    ap.add_argument("--proj-rounds", type=int, default=3)
    ap.add_argument("--no-projection", action="store_true")
    ap.add_argument("--mpirun", default=shutil.which("mpirun") or "mpirun")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per process")
    ap.add_argument("--wait-policy", default="passive", help="OMP_WAIT_POLICY for every process")
    ap.add_argument("--no-mpi-yield", dest="mpi_yield", action="store_false",
                    help="let Open MPI busy-poll while a rank waits (default: OMPI_MCA_mpi_yield_when_idle=1; "
                         "on a shared machine a polling rank takes the core its partner needs: S1 2 x 1, "
                         "alternating, 2.44/1.75 s/step polling vs 1.41/1.65 yielding)")
    ap.add_argument("--docs", action="store_true", default=None,
                    help="write docs/benchmarks.md and docs/distributed.md (default: a full run into bench/results)")
    ap.add_argument("--no-docs", dest="docs", action="store_false", help="leave the docs alone")
    ap.add_argument("--render", type=pathlib.Path, default=None, metavar="JSON",
                    help="measure nothing: rewrite the Markdown, chart and docs from a saved data_parallel.json")
    args = ap.parse_args()
    args.build_dir = args.build_dir.resolve()
    if args.render:
        res = json.loads(args.render.read_text())
        args.out_dir = args.out_dir or args.render.resolve().parent
        args.docs = True if args.docs is None else args.docs
        write_outputs(args, res)
        return
    if not (args.build_dir / "rt-bench-dp-step").exists():
        sys.exit(f"[run_data_parallel] {args.build_dir / 'rt-bench-dp-step'} not found: build it "
                 f"(cmake --build {args.build_dir} --target rt-bench-dp-step)")
    if args.rounds is None:
        args.rounds = 2 if args.quick else 3
    if args.steps is None:
        args.steps = 2 if args.quick else 4
    if args.docs is None:
        args.docs = not args.quick and args.out_dir is None
    if args.out_dir is None:
        args.out_dir = args.build_dir / "dp-quick" if args.quick else ROOT / "bench" / "results"
    args.out_dir.mkdir(parents=True, exist_ok=True)
    scratch = args.out_dir / "dp-scratch"
    scratch.mkdir(exist_ok=True)
    shape_name, shape = ("Q1", QUICK_SHAPES["Q1"]) if args.quick else ("S1", SHAPES["S1"])
    if shape["batch"] % 2:
        sys.exit(f"[run_data_parallel] {shape_name}'s batch {shape['batch']} is not divisible by 2 ranks")
    blas = blas_dir()
    command = "/usr/bin/python3 bench/run_data_parallel.py " + " ".join(sys.argv[1:])
    res = {"command": command.strip(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "shape_name": shape_name, "shape": shape, "steps": args.steps, "warmup": args.warmup,
           "rounds": args.rounds, "wait_policy": args.wait_policy, "mpi_yield": args.mpi_yield, "cores": os.cpu_count(),
           "load_start": load_average(), "blas_dir": blas,
           "json": os.path.relpath(args.out_dir / "data_parallel.json", ROOT)}
    res["rows"] = bench_scaling(args, shape, blas, scratch)
    res["efficiency"], zero = efficiencies(res["rows"])
    res["targets"] = []
    for e in res["efficiency"]:
        if e["config"] == "2x1":
            res["targets"].append({"target": f"{e['policy']}: 2-rank efficiency at equal cores >= {TARGET_EFFICIENCY}",
                                   "measured": fmt(e["equal_cores"]),
                                   "met": None if e["equal_cores"] is None else e["equal_cores"] >= TARGET_EFFICIENCY})
    for z in zero:
        res["targets"].append({"target": f"{z['policy']}: ZeRO-1 Adam-state bytes per rank / plain DP at N = 2 "
                                         f"<= {TARGET_ZERO_STATE}",
                               "measured": "not run" if z["ratio"] is None else f"{z['ratio']:.3f}",
                               "met": None if z["ratio"] is None else z["ratio"] <= TARGET_ZERO_STATE})
    if not args.no_projection:
        pname, pshape = ("Q1", QUICK_SHAPES["Q1"]) if args.quick else ("S3", SHAPES["S3"])
        res["projection"] = projection(bench_projection_inputs(args, pname, pshape, blas, scratch), pname, pshape)
        res["projection"].update(command=command.strip(), date=res["date"])
    res["load_end"] = load_average()
    shutil.rmtree(scratch, ignore_errors=True)
    write_outputs(args, res)


def write_outputs(args, res):
    """JSON, Markdown and chart into args.out_dir; the docs' blocks with args.docs."""
    png = args.out_dir / "data_parallel.png"
    res["chart"] = str(png) if chart(res, png) else None
    if res["chart"]:
        res["chart_relative"] = os.path.relpath(png, ROOT / "docs")
    (args.out_dir / "data_parallel.json").write_text(json.dumps(res, indent=2) + "\n")
    md = scaling_markdown(res)
    (args.out_dir / "data_parallel.md").write_text(md + "\n")
    print(md)
    if res.get("projection"):
        pmd = projection_markdown(res["projection"], f"{res['load_start']} → {res['load_end']}")
        (args.out_dir / "data_parallel_projection.md").write_text(pmd + "\n")
        print(pmd)
    if args.docs:
        replace_between(ROOT / "docs" / "benchmarks.md", DP_BEGIN, DP_END, md, "## Data parallelism (MPI)")
        if res.get("projection"):
            replace_between(ROOT / "docs" / "distributed.md", PROJ_BEGIN, PROJ_END, pmd,
                            "## Projection: S3 on 8 hosts")
    log("wrote", args.out_dir / "data_parallel.json")


if __name__ == "__main__":
    main()
