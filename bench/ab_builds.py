#!/usr/bin/env python3
"""A/B step time of two builds of riftco on the suite's shapes (no PyTorch).

    /usr/bin/python3 bench/ab_builds.py --before /work/base/build --after build

For a change that must not slow the training step: runs rt-bench-step from
both build trees on S1-S3 (run_benchmarks.py's shapes, flash attention) for
each checkpointing policy, alternating before/after processes round by round
(order reversed in odd rounds), under the same environment as a full suite
run (OMP_WAIT_POLICY=passive, the OpenMP OpenBLAS, its native kernel set:
OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE removed unless --openblas-coretype
inherit), and prints the median step time and step CPU seconds of each side
and the ratios after/before. Ratios from alternating processes are what to
quote; absolute seconds on a shared machine are noise (CPU seconds less so:
a process that waits for its core is not charged for the wait).
"""
import argparse
import json
import pathlib
import statistics
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import run_benchmarks as suite  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", type=pathlib.Path, required=True, help="build tree of the baseline")
    ap.add_argument("--after", type=pathlib.Path, required=True, help="build tree of the change")
    ap.add_argument("--shapes", default="S1,S2,S3")
    ap.add_argument("--policies", default="disabled,block")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--openblas-coretype", choices=["inherit", "native"], default="native",
                    help="OpenBLAS kernel set, as run_benchmarks.py's option (default native, as a full run)")
    ap.add_argument("--json", type=pathlib.Path, default=None, help="also write the results here")
    args = ap.parse_args()
    suite.openblas_coretype = args.openblas_coretype

    env = suite.base_env(args.threads, suite.blas_dir(), "passive")
    tools = {side: (path / "rt-bench-step") for side, path in (("before", args.before), ("after", args.after))}
    for side, tool in tools.items():
        if not tool.exists():
            sys.exit(f"[ab_builds] {tool} ({side}) not found: build it first")
    rows = []
    for name in args.shapes.split(","):
        shape = suite.SHAPES[name]
        steps = 5 if name == "S1" else 3
        for policy in args.policies.split(","):
            times = {"before": [], "after": []}
            cpu = {"before": [], "after": []}
            for rnd in range(args.rounds):
                order = ["before", "after"] if rnd % 2 == 0 else ["after", "before"]
                for side in order:
                    cmd = [str(tools[side])] + suite.shape_args(shape) + [
                        "--policy", policy, "--steps", str(steps), "--warmup", "1", "--attention", "flash"]
                    r = suite.run_json(cmd, env, timeout=900)
                    times[side].append(r["step_seconds"])
                    cpu[side].append(r["step_cpu_seconds"])
                    suite.log(f"{name} {policy} round {rnd + 1} {side}: {r['step_seconds']:.3f} s/step, "
                              f"{r['step_cpu_seconds']:.3f} CPU s/step")
            before = statistics.median(times["before"])
            after = statistics.median(times["after"])
            before_cpu = statistics.median(cpu["before"])
            after_cpu = statistics.median(cpu["after"])
            rows.append({"shape": name, "policy": policy, "before_s": before, "after_s": after,
                         "ratio": after / before, "before_runs": times["before"], "after_runs": times["after"],
                         "before_cpu_s": before_cpu, "after_cpu_s": after_cpu, "cpu_ratio": after_cpu / before_cpu,
                         "before_cpu_runs": cpu["before"], "after_cpu_runs": cpu["after"]})
    print("| shape | policy | before s/step | after s/step | after/before | before CPU s | after CPU s | CPU after/before |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['shape']} | {r['policy']} | {r['before_s']:.3f} | {r['after_s']:.3f} | {r['ratio']:.3f} "
              f"| {r['before_cpu_s']:.3f} | {r['after_cpu_s']:.3f} | {r['cpu_ratio']:.3f} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
