"""PyTorch 2.x side of the step benchmark (bench/run_benchmarks.py): the
model of bench/torch_sac_step.py (bench/torch_reference.py's parameters and
initialization; blocks with F.rms_norm and F.scaled_dot_product_attention
(is_causal), the fused CPU flash kernel), one shape, policy and form, N
training steps (forward + backward + Adam) in this fresh process; prints one
JSON object with the fields bench/torch_step.py prints. Needs PyTorch >= 2.4:
run it with the interpreter of scripts/torch2_env.sh.

  torch2_step.py --width 256 --heads 8 --layers 8 --seq 256 --batch 8 \
                 --policy disabled|block --form eager|compiled --threads 2 --steps 3 --warmup 1 \
                 [--optimizer-in-backward]
  torch2_step.py --check-in-backward   # the fused step against the ordinary one, every form, then exit

Forms: eager; compiled = torch.compile (Inductor, default mode) of the loss
function (model + cross-entropy; Adam stays eager). The block policy wraps
every block in torch.utils.checkpoint(use_reentrant=False) in both forms
(under torch.compile the partitioner sees the checkpoint regions). The
compiled form runs at least 2 warm-up steps (the first compiles forward and
backward); warm-up steps are never timed. compile_seconds = the warm-up
steps' wall time minus as many median measured steps; the Inductor cache
(TORCHINDUCTOR_CACHE_DIR, set by the driver) makes later processes reuse the
generated code, and the JSON reports its hits and misses.

--optimizer-in-backward: the optimizer step fused into the backward pass,
PyTorch's documented recipe (tutorial "How to save memory by fusing the
optimizer step into the backward pass"): one torch.optim.Adam([p],
foreach=False, same lr/betas/eps) per parameter and
p.register_post_accumulate_grad_hook running that optimizer's step() and
zero_grad(set_to_none=True), so each gradient is applied and freed as soon as
it is accumulated; the step is then forward + backward only (Adam's time is
inside backward_seconds; optimizer_seconds is the empty remainder). The hooks
run in the autograd engine, outside any compiled graph: under torch.compile
AOTAutograd's backward is one node that returns every parameter's gradient
at once, and only then do the per-parameter hooks run, so the compiled form
is correct but cannot free a gradient before the last one is made.
--check-in-backward runs 2 steps of a small model in both step forms (both
policies; eager and compiled, or the one form --form names) and compares
the parameters with the ordinary step's in the same form (eager:
bit-identical; compiled: within 1e-5 relative; no gradient left behind);
it prints one JSON object, with a form that PyTorch
refused or that came out wrong marked "skip" and the reason, and exits
non-zero only when the eager form fails.

Memory, two figures:
  rss_growth_bytes  peak resident set during the measured steps minus the
                    resident set after the warm-up steps, gc.collect() and
                    malloc_trim(0) (so the compiler's own memory — graphs,
                    generated code — is not counted as training memory; the
                    trim hands freed activations back so the measured steps
                    must fault them in again);
  peak_bytes        PyTorch's own accounting: one further (untimed) step under
                    torch.profiler with profile_memory=True; the running sum
                    of the c10 CPU allocator's allocation/free events over the
                    step, maximum above its start (the bytes live before the
                    step: parameters, Adam moments, data) — the figure
                    riftco's allocator peak reports. PyTorch has no CPU
                    allocator statistics API (torch.cuda.memory_stats and
                    torch.accelerator are for devices); MKL/OpenMP scratch
                    outside c10 is not in it.
"""
import argparse
import ctypes
import gc
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_sac_step import Transformer, initialize  # noqa: E402
from torch_step import mapped_libraries, reset_peak_rss, status_bytes  # noqa: E402


def median_of(v):
    s = sorted(v)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def malloc_trim():
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        return True
    except (OSError, AttributeError):
        return False


def profiled_peak(step):
    """Runs step() under the profiler; the c10 CPU allocator's peak bytes above
    the bytes live when it started (running sum of its allocation events)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    sizes = []

    def walk(nodes):
        for e in nodes:
            if e.tag == torch._C._profiler._EventType.Allocation:
                sizes.append((e.start_time_ns, e.extra_fields.alloc_size))
            walk(e.children)

    walk(prof.profiler.kineto_results.experimental_event_tree())
    running, peak = 0, 0
    for _, size in sorted(sizes, key=lambda x: x[0]):
        running += size
        peak = max(peak, running)
    return peak, len(sizes)


def inductor_cache_counters():
    try:
        from torch._dynamo.utils import counters
        return {k: v for k, v in counters["inductor"].items() if "cache" in k}
    except Exception:  # noqa: BLE001 — a version without these counters reports none
        return {}


def new_adam(params):
    """torch.optim.Adam(foreach=False) with its moments allocated at setup, as
    riftco's Adam does (so a step's memory is what the step needs)."""
    adam = torch.optim.Adam(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, foreach=False)
    for p in params:
        adam.state[p] = {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p),
                         "exp_avg_sq": torch.zeros_like(p)}
    return adam


def make_optimizer(params, in_backward):
    """The ordinary step's Adam, or None after registering the fused form:
    one Adam per parameter, stepped and its gradient dropped by a
    post-accumulate-grad hook (the PyTorch tutorial's recipe)."""
    if not in_backward:
        return new_adam(params)
    per_parameter = {p: new_adam([p]) for p in params}

    def step_and_free(p):
        per_parameter[p].step()
        per_parameter[p].zero_grad(set_to_none=True)

    for p in params:
        p.register_post_accumulate_grad_hook(step_and_free)
    return None


def make_loss(model, vocab, form):
    """Model + cross-entropy, eager or torch.compile'd (Adam stays outside)."""
    def loss_of(tok, tgt):
        return F.cross_entropy(model(tok).view(-1, vocab), tgt.view(-1))

    return torch.compile(loss_of) if form == "compiled" else loss_of


def check_in_backward(forms):
    """2 steps of a small model in the ordinary and the fused step form, per
    policy and form; the parameters must agree (eager: the same bits — the same
    single-tensor Adam on the same gradients; compiled: within float
    tolerance) and no parameter may keep a gradient. Returns the report."""
    v, c, heads, layers, t, b = 64, 32, 4, 3, 16, 2
    f = c * 8 // 3 // 8 * 8
    g = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, v, (b, t), generator=g)
    targets = torch.randint(0, v, (b, t), generator=g)

    def trained(policy, form, in_backward):
        torch._dynamo.reset()
        model = Transformer(v, c, heads, layers, f, 1e-5, "block" if policy == "block" else "none", sdpa=True)
        initialize(model, layers)
        adam = make_optimizer(list(model.parameters()), in_backward)
        loss_fn = make_loss(model, v, form)
        for _ in range(2):
            loss_fn(tokens, targets).backward()
            if adam is not None:
                adam.step()
                adam.zero_grad(set_to_none=True)
        return dict(model.named_parameters())

    report = {"check": "optimizer_in_backward", "torch_version": torch.__version__, "forms": {}}
    for form in forms:
        entry = {"max_relative_difference": 0.0, "status": "ok"}
        tol = 0.0 if form == "eager" else 1e-5
        try:
            for policy in ("disabled", "block"):
                want = trained(policy, form, False)
                got = trained(policy, form, True)
                kept = [n for n, p in got.items() if p.grad is not None]
                if kept:
                    raise AssertionError(f"{policy}: {len(kept)} parameters kept a gradient ({kept[0]}, ...)")
                for n, p in got.items():
                    scale = want[n].detach().abs().max().clamp_min(torch.finfo(torch.float32).tiny)  # all zeros: no 0/0
                    err = ((p.detach() - want[n].detach()).abs().max() / scale).item()
                    entry["max_relative_difference"] = max(entry["max_relative_difference"], err)
                    if not err <= tol:
                        raise AssertionError(f"{policy}: parameter {n} differs from the ordinary step by {err:.3g} "
                                             f"relative after 2 steps (> {tol:g})")
        except Exception as e:  # noqa: BLE001 — PyTorch refusing the form is a reported outcome, not a crash
            entry = {"status": "skip", "reason": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
        report["forms"][form] = entry
    return report


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--ffn", type=int, default=0, help="0: 8/3·width rounded down to a multiple of 8")
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--policy", choices=["disabled", "block"], default="disabled")
    ap.add_argument("--form", choices=["eager", "compiled"], default=None,
                    help="eager (default) or compiled; --check-in-backward: the one form to check (default both)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1, help="warm-up steps (compiled: at least 2)")
    ap.add_argument("--no-profile-memory", action="store_true", help="skip the profiled step (no peak_bytes)")
    ap.add_argument("--optimizer-in-backward", action="store_true",
                    help="Adam fused into backward: a per-parameter Adam stepped by post-accumulate-grad hooks")
    ap.add_argument("--check-in-backward", action="store_true",
                    help="compare the fused step with the ordinary one (2 steps, small model) and exit")
    args = ap.parse_args()
    if args.check_in_backward:
        report = check_in_backward([args.form] if args.form else ["eager", "compiled"])
        print(json.dumps(report))
        sys.exit(0 if report["forms"].get("eager", {"status": "ok"})["status"] == "ok" else 1)
    args.form = args.form or "eager"
    if args.threads < 1 or args.steps < 1 or args.warmup < 0:
        sys.exit(f"torch2_step: --threads {args.threads} and --steps {args.steps} must be >= 1, "
                 f"--warmup {args.warmup} >= 0")
    warmup = max(args.warmup, 2) if args.form == "compiled" else args.warmup
    ffn = args.ffn or args.width * 8 // 3 // 8 * 8

    torch.set_num_threads(args.threads)
    model = Transformer(args.vocab, args.width, args.heads, args.layers, ffn, 1e-5,
                        "block" if args.policy == "block" else "none", sdpa=True)
    initialize(model, args.layers)
    adam = make_optimizer(list(model.parameters()), args.optimizer_in_backward)
    g = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g)
    targets = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g)
    loss_fn = make_loss(model, args.vocab, args.form)
    losses = []

    def step(times=None):
        start = time.perf_counter()
        loss = loss_fn(tokens, targets)
        forward_end = time.perf_counter()
        loss.backward()  # --optimizer-in-backward: Adam runs in here, parameter by parameter
        losses.append(loss.item())
        del loss
        backward_end = time.perf_counter()
        if adam is not None:
            adam.step()
            adam.zero_grad(set_to_none=True)
        end = time.perf_counter()
        if times is not None:
            times.append((end - start, forward_end - start, backward_end - forward_end, end - backward_end))
        return end - start

    warmup_times = [step() for _ in range(warmup)]
    gc.collect()
    trimmed = malloc_trim()
    rss_base = status_bytes("VmRSS")
    hwm_reset = reset_peak_rss()
    measured = []
    for _ in range(args.steps):
        step(measured)
    rss_peak = status_bytes("VmHWM")
    peak, events = (None, 0) if args.no_profile_memory else profiled_peak(step)

    times = [m[0] for m in measured]
    median = median_of(times)
    print(json.dumps({
        "impl": "pytorch2", "form": args.form, "torch_version": torch.__version__, "vocab": args.vocab,
        "width": args.width, "heads": args.heads, "layers": args.layers, "ffn": ffn, "seq": args.seq,
        "batch": args.batch, "policy": args.policy, "attention": "F.scaled_dot_product_attention",
        "threads": torch.get_num_threads(), "warmup": warmup, "steps": args.steps,
        "step_seconds": median, "step_times": times,
        "forward_seconds": median_of([m[1] for m in measured]),
        "backward_seconds": median_of([m[2] for m in measured]),
        "optimizer_seconds": median_of([m[3] for m in measured]),
        "warmup_times": warmup_times, "compile_seconds": (sum(warmup_times) - warmup * median
                                                          if args.form == "compiled" else None),
        "inductor_cache": inductor_cache_counters() if args.form == "compiled" else None,
        "inductor_cache_dir": os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
        "losses": losses, "tokens_per_second": args.batch * args.seq / median,
        "rss_setup_bytes": rss_base, "rss_growth_bytes": rss_peak - rss_base if hwm_reset else -1,
        "rss_baseline": "after warm-up, gc.collect and malloc_trim" if trimmed else "after warm-up",
        "allocator_peak_bytes": peak, "allocator_events": events,
        "allocator_peak_source": None if peak is None else "torch.profiler profile_memory (c10 CPU allocator)",
        "adam_foreach": False, "optimizer_in_backward": args.optimizer_in_backward,
        "malloc_env": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")},
        "libraries": mapped_libraries(),
    }))


if __name__ == "__main__":
    main()
