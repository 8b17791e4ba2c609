#!/usr/bin/env python3
"""A/B step time of two builds of riftco on the suite's shapes (no PyTorch).

    /usr/bin/python3 bench/ab_builds.py --before /work/base/build --after build

For a change that must not slow the training step: runs rt-bench-step from
both build trees on S1-S3 (run_benchmarks.py's shapes, flash attention) for
each checkpointing policy, alternating before/after processes round by round
(order reversed in odd rounds), under the same environment as the suite
(OMP_WAIT_POLICY=passive, the OpenMP OpenBLAS), and prints the median step
time of each side and the ratio after/before. Ratios from alternating
processes are what to quote; absolute seconds on a shared machine are noise.
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
    ap.add_argument("--json", type=pathlib.Path, default=None, help="also write the results here")
    args = ap.parse_args()

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
            for rnd in range(args.rounds):
                order = ["before", "after"] if rnd % 2 == 0 else ["after", "before"]
                for side in order:
                    cmd = [str(tools[side])] + suite.shape_args(shape) + [
                        "--policy", policy, "--steps", str(steps), "--warmup", "1", "--attention", "flash"]
                    r = suite.run_json(cmd, env, timeout=900)
                    times[side].append(r["step_seconds"])
                    suite.log(f"{name} {policy} round {rnd + 1} {side}: {r['step_seconds']:.3f} s/step")
            before = statistics.median(times["before"])
            after = statistics.median(times["after"])
            rows.append({"shape": name, "policy": policy, "before_s": before, "after_s": after,
                         "ratio": after / before, "before_runs": times["before"], "after_runs": times["after"]})
    print("| shape | policy | before s/step | after s/step | after/before |")
    print("|---|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['shape']} | {r['policy']} | {r['before_s']:.3f} | {r['after_s']:.3f} | {r['ratio']:.3f} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
