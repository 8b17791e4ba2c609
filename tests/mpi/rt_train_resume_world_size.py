#!/usr/bin/env python3
"""`rt-train` resumes at another world size (docs/distributed.md, "Resume at
another world size"), end to end through the command line:

- `mpirun -np 2 rt-train pretrain --stop-after 3` stops as an interrupted run
  would (no final files, the step-3 training checkpoint kept); `rt-train
  pretrain --resume` in one process finishes it, and the reverse (1 process,
  then 2 ranks with ZeRO-1). Without dropout the final weights match the
  uninterrupted 1-process and 2-rank runs within float tolerance, and
  metadata.json's world_size_history records both sizes.
- LoRA post-training the same way (2 ranks, then 1 process).
- With dropout 0.1 the resume at another size is refused with the documented
  message, and the checkpoint is left as it was.

  rt_train_resume_world_size.py MPIEXEC NP_FLAG RT_TRAIN SOURCE_DIR WORK
"""
import array
import json
import pathlib
import shutil
import subprocess
import sys

MPIEXEC, NP_FLAG, RT_TRAIN, SOURCE_DIR, WORK = sys.argv[1:6]
WORK = pathlib.Path(WORK)
TOLERANCE = 1e-5  # max |difference| of any weight; a lost Adam state or step is ~1e-3 after 3 steps
MODEL = ["--context-length", "32", "--model-width", "16", "--heads", "2", "--layers", "2",
         "--feed-forward-width", "32", "--sequence-length", "16", "--batch", "4", "--steps", "6",
         "--warmup-steps", "2", "--eval-interval", "3", "--eval-batches", "1", "--checkpoint-interval", "3"]
POST = ["--data", f"{SOURCE_DIR}/data/chat_example.jsonl", "--steps", "4", "--batch", "4",
        "--sequence-length", "32", "--lora-rank", "2", "--eval-interval", "2", "--eval-batches", "1",
        "--checkpoint-interval", "2"]
failures = []


def run(ranks, *args, expect=0):
    command = ([MPIEXEC, NP_FLAG, str(ranks), "--oversubscribe"] if ranks > 1 else []) + [RT_TRAIN, *map(str, args)]
    r = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if (r.returncode == 0) != (expect == 0):
        sys.exit(f"{' '.join(command)}: exit {r.returncode}, expected {'0' if expect == 0 else 'a failure'}\n"
                 f"{r.stdout}\n{r.stderr}")
    return r


def weights(path):
    """{name: array of floats} of a safetensors file of F32 tensors."""
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", (path, name, info["dtype"])
        begin, end = info["data_offsets"]
        out[name] = array.array("f", data[8 + n + begin:8 + n + end])
    return out


def max_difference(a, b):
    wa, wb = weights(a), weights(b)
    if wa.keys() != wb.keys():
        failures.append(f"{a} and {b} hold different tensors")
        return float("inf")
    return max(max((abs(x - y) for x, y in zip(wa[k], wb[k])), default=0.0) for k in wa)


def expect(condition, what):
    if not condition:
        failures.append(what)


def stop_then_resume(name, first, second, stage, args, final_steps, stop):
    """`first` ranks run to --stop-after `stop`; `second` ranks resume. Returns the run directory."""
    out = WORK / name
    r = run(first[0], stage, *args, *first[1:], "--stop-after", stop, "--output", out)
    expect(r.stdout.count(f"stopped after step {stop} (--stop-after)") == 1 and "--resume continues from" in r.stdout,
           f"{name}: the stop is printed once, by rank 0:\n{r.stdout}")
    expect((out / "training_checkpoint.safetensors").exists(), f"{name}: no training checkpoint after the stop")
    expect(not (out / "metadata.json").exists(), f"{name}: a stopped run wrote metadata.json")
    r = run(second[0], stage, *args, *second[1:], "--resume", "--output", out)
    expect(f"done: {final_steps} steps (resumed from step {stop})" in r.stdout, f"{name}: resume output:\n{r.stdout}")
    meta = json.loads((out / "metadata.json").read_text())
    history = [{"world_size": first[0], "first_step": 1, "last_step": stop},
               {"world_size": second[0], "first_step": stop + 1, "last_step": final_steps}]
    expect(meta["world_size"] == second[0] and meta["world_size_history"] == history,
           f"{name}: metadata.json world_size {meta['world_size']}, history {meta['world_size_history']}; "
           f"expected {second[0]}, {history}")
    return out


shutil.rmtree(WORK, ignore_errors=True)
WORK.mkdir(parents=True)
(WORK / "corpus.txt").write_text("".join(f"the quick brown fox jumps over the lazy dog {i}.\n" for i in range(151)))
pre = ["--data", WORK / "corpus.txt", *MODEL]

# Uninterrupted references.
run(1, "pretrain", *pre, "--output", WORK / "one")
run(2, "pretrain", *pre, "--output", WORK / "two")
reference = max_difference(WORK / "one/model.safetensors", WORK / "two/model.safetensors")
print(f"uninterrupted, 1 process vs 2 ranks: max weight difference {reference:.3g}")

for name, first, second in (("two_then_one", (2,), (1,)), ("one_then_two_zero", (1,), (2, "--zero", "1"))):
    out = stop_then_resume(name, first, second, "pretrain", pre, 6, 3)
    for ref in ("one", "two"):
        d = max_difference(out / "model.safetensors", WORK / ref / "model.safetensors")
        print(f"{name} vs uninterrupted {ref}: max weight difference {d:.3g}")
        expect(d <= TOLERANCE, f"{name}: weights differ from the uninterrupted '{ref}' run by {d} > {TOLERANCE}")

# LoRA post-training on the 1-process model: 2 ranks stop at step 2, one process resumes.
post = ["--base-model", WORK / "one/model.safetensors", *POST]
run(1, "post-train", *post, "--output", WORK / "lora_one")
out = stop_then_resume("lora_two_then_one", (2,), (1,), "post-train", post, 4, 2)
d = max_difference(out / "adapter.safetensors", WORK / "lora_one/adapter.safetensors")
print(f"lora_two_then_one vs uninterrupted: max adapter difference {d:.3g}")
expect(d <= TOLERANCE, f"lora_two_then_one: the adapter differs from the uninterrupted run by {d} > {TOLERANCE}")

# With dropout the ranks' streams are their own: refused, the checkpoint kept as it was.
dropout = WORK / "dropout"
run(2, "pretrain", *pre, "--dropout", "0.1", "--stop-after", 3, "--output", dropout)
checkpoint = (dropout / "training_checkpoint.safetensors").read_bytes()
r = run(1, "pretrain", *pre, "--dropout", "0.1", "--resume", "--output", dropout, expect=1)
expect("made by a job of 2 rank(s) (world_size 2), this job has 1" in r.stderr
       and "the dropout streams are per rank" in r.stderr and "resume with mpirun -np 2" in r.stderr,
       f"dropout: expected the documented refusal:\n{r.stderr}")
expect((dropout / "training_checkpoint.safetensors").read_bytes() == checkpoint,
       "dropout: the refused resume changed the checkpoint")
expect(not (dropout / "metadata.json").exists(), "dropout: the refused resume wrote metadata.json")

# --stop-after takes a step count.
r = subprocess.run([RT_TRAIN, "pretrain", *map(str, pre), "--stop-after", "-1", "--output", str(WORK / "bad")],
                   capture_output=True, text=True, timeout=60)
expect(r.returncode == 2 and "--stop-after" in r.stderr, f"--stop-after -1: exit {r.returncode}\n{r.stderr}")

if failures:
    sys.exit("\n".join(failures))
shutil.rmtree(WORK)
print("rt-train resumes at another world size: ok")
