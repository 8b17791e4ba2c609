#!/usr/bin/env python3
"""Where a training step's thread scaling goes: perf samples at 1 and N threads.

    /usr/bin/python3 bench/thread_profile.py --shape S3 --policy disabled --threads 2

Runs build/rt-bench-step on one of run_benchmarks.py's shapes (flash
attention) under `perf record -e cpu-clock` once with 1 thread and once with
N, in the suite's environment (OMP_WAIT_POLICY=passive, the OpenMP OpenBLAS,
its native kernel set unless --openblas-coretype inherit), and prints per
symbol: the 1-thread samples, the N-thread samples of the main thread and of
the others, and the difference N − 1 (CPU that N threads spend beyond one:
repacking, memory contention, wake-ups, TLB shootdowns). Samples before the
steps (the model's initialization, up to the last sample of
Random::normal, sincos or Tensor::fill in the run's first half) are dropped.
It also prints the "main only" symbols (the other threads have at most 15%
as many samples): code that runs while the others wait, which costs wall
time at N threads. CPU samples, not seconds: valid on a loaded machine,
where wall-clock splits are not. Needs perf with perf_event_paranoid <= 2.
"""
import argparse
import collections
import pathlib
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import run_benchmarks as suite  # noqa: E402

SETUP_MARKERS = ("Random::normal", "sincos", "Tensor::fill")


def record(tool, shape, policy, steps, threads, data):
    env = suite.base_env(threads, suite.blas_dir(), "passive")
    cmd = ["perf", "record", "-q", "-e", "cpu-clock", "-F", "1999", "-o", str(data), "--", str(tool)]
    cmd += suite.shape_args(shape) + ["--policy", policy, "--steps", str(steps), "--warmup", "1",
                                      "--attention", "flash"]
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)


def samples(data):
    """(time, tid, symbol) of rt-bench-step's samples after its setup."""
    out = subprocess.run(["perf", "script", "-i", str(data), "-F", "comm,tid,time,ip,sym"], check=True,
                         capture_output=True, text=True).stdout
    rows = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 4 or parts[0] != "rt-bench-step":
            continue
        rows.append((float(parts[2].rstrip(":")), int(parts[1]), " ".join(parts[4:]) or "?"))
    if not rows:
        sys.exit(f"[thread_profile] no rt-bench-step samples in {data}")
    middle = (rows[0][0] + rows[-1][0]) / 2
    setup = [t for t, _, s in rows if t < middle and any(m in s for m in SETUP_MARKERS)]
    start = max(setup) if setup else rows[0][0]
    return [r for r in rows if r[0] > start]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", type=pathlib.Path, default=suite.ROOT / "build")
    ap.add_argument("--shape", default="S3", choices=sorted(suite.SHAPES))
    ap.add_argument("--policy", default="disabled")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--openblas-coretype", choices=["inherit", "native"], default="native")
    args = ap.parse_args()
    if args.threads < 2:
        sys.exit("[thread_profile] --threads must be at least 2")
    suite.openblas_coretype = args.openblas_coretype
    tool = args.build / "rt-bench-step"
    if not tool.exists():
        sys.exit(f"[thread_profile] {tool} not found: build it first")
    shape = suite.SHAPES[args.shape]
    with tempfile.TemporaryDirectory() as tmp:
        one_data, many_data = pathlib.Path(tmp, "one.data"), pathlib.Path(tmp, "many.data")
        record(tool, shape, args.policy, args.steps, 1, one_data)
        record(tool, shape, args.policy, args.steps, args.threads, many_data)
        one, many = samples(one_data), samples(many_data)
    main_tid = min(tid for _, tid, _ in many)  # the process's first thread runs main()
    c1 = collections.Counter(s for _, _, s in one)
    cm = collections.Counter(s for _, tid, s in many if tid == main_tid)
    co = collections.Counter(s for _, tid, s in many if tid != main_tid)
    print(f"{args.shape} {args.policy}, {args.steps} steps + 1 warm-up, cpu-clock at 1999 Hz per thread; "
          f"samples: 1 thread {len(one)}, {args.threads} threads {len(many)} "
          f"(main {sum(cm.values())}, others {sum(co.values())}), difference {len(many) - len(one):+d}")
    print(f"| symbol | 1 thread | {args.threads} threads: main | others | difference |")
    print("|---|---:|---:|---:|---:|")
    symbols = sorted(set(c1) | set(cm) | set(co), key=lambda s: -abs(cm[s] + co[s] - c1[s]))
    for s in symbols[:args.top]:
        print(f"| `{s[:80]}` | {c1[s]} | {cm[s]} | {co[s]} | {cm[s] + co[s] - c1[s]:+d} |")
    serial = sorted(((s, n) for s, n in cm.items() if co[s] <= 0.15 * n), key=lambda x: -x[1])
    print(f"\nMain only (others <= 15% of main's samples): {sum(n for _, n in serial)} samples of main's "
          f"{sum(cm.values())}")
    for s, n in serial[:args.top // 2]:
        print(f"  {n:6d}  {s[:100]}")


if __name__ == "__main__":
    main()
