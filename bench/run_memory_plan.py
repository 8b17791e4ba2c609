#!/usr/bin/python3
"""What each checkpointing plan keeps on the benchmark shapes S1–S3, for docs/checkpointing.md.

    /usr/bin/python3 bench/run_memory_plan.py            # S1–S3, writes the docs section and the SVGs
    /usr/bin/python3 bench/run_memory_plan.py --shapes S1 --out-dir /tmp/plan   # a scratch run

Runs build/rt-memory-plan --shape S --measure for each shape (uniform policies and a sweep of budgets
from the smallest feasible to keeping everything, plus the budget halfway between the block and the
disabled peaks), copies its two SVG charts to docs/images/, and writes the tables between the
MEMORY-PLAN markers of docs/checkpointing.md. OMP_WAIT_POLICY=passive, 2 threads, as the suite runs.
"""
import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- BEGIN MEMORY-PLAN (bench/run_memory_plan.py writes this part) -->", "<!-- END MEMORY-PLAN -->"


def targets(doc):
    """The issue's targets, read off one shape's rows."""
    rows = {r["name"]: r for r in doc["rows"]}
    disabled = rows["disabled"]["step_seconds"]
    halfway = next(r for r in doc["rows"] if r["name"].endswith("(halfway)"))
    fits = [rows[p] for p in ("block", "segments") if rows[p]["predicted_peak_bytes"] <= halfway["budget_bytes"]]
    best = min(fits, key=lambda r: r["step_seconds"])
    planned_extra = halfway["step_seconds"] - disabled
    uniform_extra = best["step_seconds"] - disabled
    return {
        "attention_over_disabled": rows["attention"]["step_seconds"] / disabled,
        "halfway_plan": halfway["plan"],
        "best_uniform": best["name"],
        "recompute_saving": 1 - planned_extra / uniform_extra if uniform_extra > 0 else float("nan"),
        "planned_over_uniform": halfway["step_seconds"] / best["step_seconds"],
        "peaks_within_budget": all(r["measured_peak_bytes"] <= r["budget_bytes"] for r in doc["rows"] if r["kind"] == "budget"),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default=str(ROOT / "build"))
    ap.add_argument("--shapes", nargs="+", default=["S1", "S2", "S3"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--out-dir", default="", help="scratch folder: do not touch docs/")
    args = ap.parse_args()
    tool = pathlib.Path(args.build_dir) / "rt-memory-plan"
    if not tool.exists():
        sys.exit(f"{tool} is not built (cmake --build build --target rt-memory-plan)")
    scratch = pathlib.Path(args.out_dir) if args.out_dir else ROOT / "build" / "memory-plan"
    env = dict(os.environ, OMP_WAIT_POLICY="passive", OMP_NUM_THREADS="2")
    load = os.getloadavg()[0]
    parts = [f"Measured with `/usr/bin/python3 bench/run_memory_plan.py` ({args.rounds} rounds over every row, "
             f"fastest of {args.steps} steps after a warm-up per row, 2 threads, load average {load:.1f} at the "
             "start). Peaks are the allocator's (deterministic); step times are wall clock (forward + backward + "
             "Adam). \"recompute %\" counts forward FLOPs a backward replays against one forward.\n"]
    summary = ["| shape | attention / disabled step | halfway budget: plan | best uniform that fits | "
               "recompute time saved vs it | planned / uniform step | every peak ≤ budget |",
               "|---|---:|---|---|---:|---:|---|"]
    for shape in args.shapes:
        out = scratch / shape
        print(f"[run_memory_plan] {shape} ...", flush=True)
        subprocess.run([str(tool), "--shape", shape, "--measure", "--steps", str(args.steps), "--rounds",
                        str(args.rounds), "--output", str(out)], check=True, env=env, stdout=subprocess.DEVNULL)
        doc = json.loads((out / "memory_plan.json").read_text())
        t = targets(doc)
        summary.append(f"| {shape} | {t['attention_over_disabled']:.2f} | {t['halfway_plan']} | {t['best_uniform']} | "
                       f"{100 * t['recompute_saving']:.0f}% | {t['planned_over_uniform']:.2f} | "
                       f"{'yes' if t['peaks_within_budget'] else 'NO'} |")
        d = doc["dimensions"]
        parts.append(f"\n### {shape}: {d['layers']} layers, width {d['model_width']}, {d['heads']} heads, "
                     f"batch {doc['batch']}, sequence {doc['sequence_length']}, {doc['attention']} attention\n")
        parts.append((out / "memory_plan.md").read_text())
        if not args.out_dir:
            images = ROOT / "docs" / "images"
            images.mkdir(exist_ok=True)
            for kind in ("peak", "time"):
                shutil.copy(out / f"memory_plan_{kind}.svg", images / f"memory_plan_{shape}_{kind}.svg")
            parts.append(f"\n![{shape} activation peak against the budget](images/memory_plan_{shape}_peak.svg)"
                         f" ![{shape} step time against the budget](images/memory_plan_{shape}_time.svg)\n")
    section = "\n".join(summary) + "\n\n" + "".join(parts)
    print(section)
    if args.out_dir:
        return
    path = ROOT / "docs" / "checkpointing.md"
    text = path.read_text()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    path.write_text(text[:start] + "\n" + section + "\n" + text[end:])
    print(f"[run_memory_plan] wrote {path} and docs/images/memory_plan_*.svg")


if __name__ == "__main__":
    main()
