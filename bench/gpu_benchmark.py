"""GPU benchmark (issue 18): our model on the CUDA backend (rt-bench-step
--backend cuda) against PyTorch eager (bench/torch_step.py --device cuda,
the architecture of bench/torch_reference.py, torch.utils.checkpoint with
use_reentrant=False per block for "block") on the same GPU, one fresh
process per row, in one run.

  python3 bench/gpu_benchmark.py --bench build-cuda/rt-bench-step --out results/ \
      [--timeout 90] [--deadline 300] [--steps 3] [--warmup 1]

Shapes: GPT-2-small width (768 wide, 12 heads, 12 layers) and deep narrow
(128 wide, 4 heads, 32 layers), vocab 256, sequence 1024, batch 16; policies
disabled and block. Reported per row: median step time, tokens/s, peak
device memory during a step above the bytes live before it (ours: the CUDA
allocator's peak; PyTorch: torch.cuda.max_memory_allocated), and the ratios
ours / PyTorch. Each process has --timeout seconds; rows not started before
--deadline seconds are listed as skipped. Writes rows.jsonl and table.md to
--out and prints the table.
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

SHAPES = [
    ("GPT-2-small width", dict(width=768, heads=12, layers=12)),
    ("deep narrow", dict(width=128, heads=4, layers=32)),
]
POLICIES = ["disabled", "block"]


def run_row(cmd, timeout, log):
    start = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        log.write(f"$ {' '.join(cmd)}\nTIMEOUT after {timeout} s\n{e.stderr or ''}\n")
        return {"error": f"timed out after {timeout} s"}
    log.write(f"$ {' '.join(cmd)}\nrc={p.returncode} ({time.time() - start:.1f} s)\n{p.stdout}\n{p.stderr}\n")
    log.flush()
    if p.returncode != 0:
        return {"error": f"exit {p.returncode}: {p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ''}"}
    try:
        return json.loads(p.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": "no JSON on stdout"}


def mib(b):
    return f"{b / 2**20:,.0f} MiB"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True, help="rt-bench-step built with -DRIFTCO_CUDA=ON")
    ap.add_argument("--python", default=sys.executable, help="python with torch (CUDA)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--timeout", type=float, default=90.0, help="seconds per process")
    ap.add_argument("--deadline", type=float, default=300.0, help="start no row after this many seconds")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--attention", default="flash", help="our attention kernel (flash or materialized)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    rows = []
    with open(os.path.join(args.out, "processes.log"), "w") as log, \
            open(os.path.join(args.out, "rows.jsonl"), "w") as jl:
        for shape_name, shape in SHAPES:
            for policy in POLICIES:
                common = ["--vocab", str(args.vocab), "--width", str(shape["width"]), "--heads", str(shape["heads"]),
                          "--layers", str(shape["layers"]), "--seq", str(args.seq), "--batch", str(args.batch),
                          "--policy", policy, "--steps", str(args.steps), "--warmup", str(args.warmup)]
                row = {"shape": shape_name, "policy": policy}
                for impl, cmd in [
                    ("ours", [args.bench, *common, "--backend", "cuda", "--attention", args.attention]),
                    ("torch", [args.python, os.path.join(HERE, "torch_step.py"), *common, "--device", "cuda"]),
                ]:
                    if time.time() - t0 > args.deadline:
                        row[impl] = {"error": f"skipped: past the {args.deadline:.0f} s deadline"}
                        continue
                    row[impl] = run_row(cmd, args.timeout, log)
                rows.append(row)
                jl.write(json.dumps(row) + "\n")
                jl.flush()
                print(json.dumps({k: (v if not isinstance(v, dict) else {x: v.get(x) for x in (
                    "step_seconds", "peak_bytes", "error")}) for k, v in row.items()}), flush=True)

    gpu = next((r["torch"].get("gpu") for r in rows if "gpu" in r.get("torch", {})), "unknown GPU")
    torch_version = next((r["torch"].get("torch_version") for r in rows if "torch_version" in r.get("torch", {})), "?")
    lines = [
        f"GPU: {gpu}; torch {torch_version}; vocab {args.vocab}, sequence {args.seq}, batch {args.batch}; "
        f"{args.warmup} warm-up + {args.steps} measured steps (median); fp32, TF32 off on both sides; "
        f"ours: {args.attention} attention; PyTorch: eager, materialized attention.",
        "",
        "| shape | policy | ours step | PyTorch step | step ours/PyTorch | ours tokens/s | PyTorch tokens/s "
        "| ours peak | PyTorch peak | peak ours/PyTorch |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        o, t = r["ours"], r["torch"]
        def cell(d, key, fmt):
            return fmt(d[key]) if key in d else "failed"
        step_ratio = f"{o['step_seconds'] / t['step_seconds']:.2f}" if "step_seconds" in o and "step_seconds" in t else "–"
        peak_ratio = f"{o['peak_bytes'] / t['peak_bytes']:.2f}" if "peak_bytes" in o and t.get("peak_bytes") else "–"
        lines.append(
            f"| {r['shape']} | {r['policy']} | {cell(o, 'step_seconds', lambda s: f'{s * 1000:,.0f} ms')} "
            f"| {cell(t, 'step_seconds', lambda s: f'{s * 1000:,.0f} ms')} | {step_ratio} "
            f"| {cell(o, 'tokens_per_second', lambda x: f'{x:,.0f}')} | {cell(t, 'tokens_per_second', lambda x: f'{x:,.0f}')} "
            f"| {cell(o, 'peak_bytes', mib)} | {cell(t, 'peak_bytes', mib)} | {peak_ratio} |")
    lines.append("")
    for r in rows:
        for impl in ("ours", "torch"):
            if "error" in r[impl]:
                lines.append(f"- {r['shape']}, {r['policy']}, {impl}: {r[impl]['error']}")
    # block vs disabled per implementation
    for shape_name, _ in SHAPES:
        by = {r["policy"]: r for r in rows if r["shape"] == shape_name}
        for impl in ("ours", "torch"):
            d, b = by.get("disabled", {}).get(impl, {}), by.get("block", {}).get(impl, {})
            if "step_seconds" in d and "step_seconds" in b:
                lines.append(f"- {shape_name}, {impl}: block / disabled step time "
                             f"{b['step_seconds'] / d['step_seconds']:.2f}, peak {b['peak_bytes'] / d['peak_bytes']:.2f}")
    table = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(table)
    print(table)


if __name__ == "__main__":
    main()
