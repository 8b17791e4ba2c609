"""PyTorch side of the step benchmark: bench/torch_reference.py's Transformer,
one shape and policy, N training steps (forward + backward + Adam) in this
fresh process; prints one JSON object with the same fields rt-bench-step
prints. Run with /usr/bin/python3 (Debian's python3-torch).

  torch_step.py --width 256 --heads 8 --layers 8 --seq 256 --batch 8 \
                --policy disabled|block --threads 2 --steps 3 --warmup 1

Memory is measured the way rt-bench-step measures it: peak resident set
during the steps minus the resident set after setup (model, Adam moments,
data), with the peak reset through /proc/self/clear_refs after setup.

--device cuda (bench/gpu_benchmark.py) runs the same model on the GPU and
synchronizes before every clock read; peak_bytes is then
torch.cuda.max_memory_allocated() during a step above the bytes allocated
before it (rt-bench-step --backend cuda reports its allocator the same way)
and peak_total_bytes the maximum including them.
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_reference import Transformer  # noqa: E402


def status_bytes(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return -1


def reset_peak_rss():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def mapped_libraries():
    found = set()
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) < 6 or not parts[5].startswith("/"):
                continue
            name = os.path.basename(parts[5])
            if any(k in name for k in ("blas", "lapack", "gomp", "libomp", "mkl")):
                found.add(parts[5])
    return sorted(found)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--ffn", type=int, default=0, help="0: 8/3·width rounded down to a multiple of 8")
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--policy", choices=["disabled", "block"], default="disabled")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--foreach", type=int, default=0,
                    help="torch.optim.Adam(foreach=...): 0 (1.13 default) or 1 (multi-tensor: no faster here, +230 MiB on S3)")
    args = ap.parse_args()
    ffn = args.ffn or args.width * 8 // 3 // 8 * 8

    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    model = Transformer(vocab_size=args.vocab, model_width=args.width, heads=args.heads, layers=args.layers,
                        feed_forward_width=ffn, norm_epsilon=1e-5, checkpoint_blocks=args.policy == "block")
    # The riftco initialization (transformer.hpp): N(0, 0.02²), residual
    # projections N(0, (0.02/√(2L))²), norms 1.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                std = 0.02 / (2 * args.layers) ** 0.5 if name.endswith(("output", "down")) else 0.02
                p.normal_(0.0, std)
    device = torch.device(args.device)
    cuda = args.device == "cuda"
    model.to(device)
    params = list(model.parameters())
    adam = torch.optim.Adam(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, foreach=bool(args.foreach))
    # Adam's moments are allocated at setup, as riftco's Adam does, so the
    # growth measured below is what a step needs on both sides.
    for p in params:
        adam.state[p] = {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p),
                         "exp_avg_sq": torch.zeros_like(p)}
    g = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g).to(device)
    targets = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g).to(device)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    rss_setup = status_bytes("VmRSS")
    hwm_reset = reset_peak_rss()
    times, forward_times, backward_times, optimizer_times, losses = [], [], [], [], []
    peak, peak_total = 0, 0
    sync()
    for i in range(args.warmup + args.steps):
        if cuda:
            before = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        logits = model(tokens)
        loss = torch.nn.functional.cross_entropy(logits.view(-1, args.vocab), targets.view(-1))
        sync()
        forward_end = time.perf_counter()
        loss.backward()
        losses.append(loss.item())
        del logits, loss
        sync()
        backward_end = time.perf_counter()
        adam.step()
        adam.zero_grad(set_to_none=True)  # riftco's Adam::zero_grad drops gradients the same way
        sync()
        end = time.perf_counter()
        if cuda:
            peak = max(peak, torch.cuda.max_memory_allocated() - before)
            peak_total = max(peak_total, torch.cuda.max_memory_allocated())
        if i >= args.warmup:
            times.append(end - start)
            forward_times.append(forward_end - start)
            backward_times.append(backward_end - forward_end)
            optimizer_times.append(end - backward_end)
    rss_peak = status_bytes("VmHWM")
    def median_of(v):
        s = sorted(v)
        n = len(s)
        return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])

    median = median_of(times)
    print(json.dumps({
        "impl": "pytorch", "torch_version": torch.__version__, "vocab": args.vocab, "width": args.width,
        "heads": args.heads, "layers": args.layers, "ffn": ffn, "seq": args.seq, "batch": args.batch,
        "policy": args.policy, "attention": "materialized (torch reference)", "threads": torch.get_num_threads(),
        "warmup": args.warmup, "steps": args.steps, "step_seconds": median, "step_times": times,
        "forward_seconds": median_of(forward_times), "backward_seconds": median_of(backward_times),
        "optimizer_seconds": median_of(optimizer_times),
        "losses": losses, "tokens_per_second": args.batch * args.seq / median,
        "rss_setup_bytes": rss_setup, "rss_growth_bytes": rss_peak - rss_setup if hwm_reset else -1,
        "adam_foreach": bool(args.foreach), "device": args.device,
        **({"peak_bytes": peak, "peak_total_bytes": peak_total, "gpu": torch.cuda.get_device_name(),
            "tf32_matmul": torch.backends.cuda.matmul.allow_tf32} if cuda else {}), "malloc_env": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")},
        "libraries": mapped_libraries(),
    }))


if __name__ == "__main__":
    main()
