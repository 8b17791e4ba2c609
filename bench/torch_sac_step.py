"""PyTorch 2.x side of the checkpointing benchmark (bench/run_sac_benchmark.py):
one shape and checkpointing policy, N training steps (forward + backward +
Adam) in this fresh process; prints one JSON object with the fields
bench/torch_step.py prints. Needs PyTorch >= 2.4 (selective activation
checkpointing): run it with the interpreter of scripts/torch2_env.sh.

  torch_sac_step.py --width 256 --heads 8 --layers 8 --seq 256 --batch 8 \
                    --policy none|sac-matmuls|attention|mlp|block --threads 2 --steps 3 --warmup 1
  torch_sac_step.py --check     # every policy against bench/torch_reference.py's model, then exit

The model is bench/torch_reference.py's Transformer (same parameters, same
initialization as torch_step.py) with its blocks written the PyTorch 2.x way
(--model sdpa, the default): F.rms_norm and F.scaled_dot_product_attention
(is_causal), which on the CPU runs the fused flash-attention kernel, as ours
does. --model reference keeps torch_reference.py's block equations
(hand-written RMSNorm, materialized softmax attention).

Policies, per block, all through torch.utils.checkpoint(use_reentrant=False):
  none         no checkpoint;
  sac-matmuls  selective activation checkpointing of the whole block: a
               context_fn (create_selective_checkpoint_contexts) whose policy
               saves the outputs of aten.mm / addmm / bmm and the fused
               scaled-dot-product-attention ops and recomputes everything else
               (norms, RoPE, SwiGLU, residual adds) — the "save matmuls"
               policy (JAX's dots_saveable);
  attention    checkpoint of the block's attention half only (norm, q/k/v,
               RoPE, attention, output projection, residual): riftco's
               `attention` policy;
  mlp          checkpoint of the MLP half only (norm, gate/up, SwiGLU, down,
               residual): riftco's `mlp` policy;
  block        checkpoint of the whole block: riftco's `block`.

Memory is measured as torch_step.py measures it: peak resident set during the
steps minus the resident set after setup. PyTorch has no allocator
statistics for CPU tensors (torch.cuda.memory_stats is CUDA-only), so the
JSON carries none.
"""
import argparse
import functools
import json
import os
import sys
import time

import torch
import torch.nn.functional as F
import torch.utils.checkpoint as checkpointing

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_reference  # noqa: E402
from torch_step import mapped_libraries, reset_peak_rss, status_bytes  # noqa: E402

POLICIES = ["none", "sac-matmuls", "attention", "mlp", "block"]

# Ops whose outputs the "save matmuls" policy keeps (those this PyTorch has).
SAVED_OPS = [getattr(getattr(torch.ops.aten, name), "default") for name in (
    "mm", "addmm", "bmm", "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_fused_attention_overrideable") if hasattr(torch.ops.aten, name)]


def save_matmuls(ctx, op, *args, **kwargs):
    if op in SAVED_OPS:
        return checkpointing.CheckpointPolicy.MUST_SAVE
    return checkpointing.CheckpointPolicy.PREFER_RECOMPUTE


class Block(torch_reference.Block):
    """torch_reference.Block's parameters and equations, split into halves."""

    def __init__(self, c, f, sdpa):
        super().__init__(c, f)
        self.sdpa = sdpa

    def attention_half(self, h, heads, eps):
        b, t, c = h.shape
        d = c // heads
        if self.sdpa:
            x = F.rms_norm(h, (c,), self.attention_norm, eps)
        else:
            x = torch_reference.rms_norm(h, self.attention_norm, eps)

        def split(y):
            return y.view(b, t, heads, d).transpose(1, 2)

        q = torch_reference.rope(split(x @ self.query.T))
        k = torch_reference.rope(split(x @ self.key.T))
        v = split(x @ self.value.T)
        if self.sdpa:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = (q @ k.transpose(-1, -2)) / d ** 0.5
            mask = torch.ones(t, t, dtype=torch.bool).triu(1)
            o = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ v
        return h + o.transpose(1, 2).reshape(b, t, c) @ self.output.T

    def mlp_half(self, h, eps):
        if self.sdpa:
            y = F.rms_norm(h, (h.shape[-1],), self.mlp_norm, eps)
        else:
            y = torch_reference.rms_norm(h, self.mlp_norm, eps)
        return h + (F.silu(y @ self.gate.T) * (y @ self.up.T)) @ self.down.T

    def forward(self, h, heads, eps):
        return self.mlp_half(self.attention_half(h, heads, eps), eps)


class Transformer(torch_reference.Transformer):
    def __init__(self, vocab_size, model_width, heads, layers, feed_forward_width, norm_epsilon, policy, sdpa):
        super().__init__(vocab_size, model_width, heads, layers, feed_forward_width, norm_epsilon)
        self.blocks = torch.nn.ModuleList(Block(model_width, feed_forward_width, sdpa) for _ in range(layers))
        self.policy = policy
        self.sac_context = functools.partial(checkpointing.create_selective_checkpoint_contexts, save_matmuls)

    def run_block(self, block, h):
        p, heads, eps = self.policy, self.heads, self.eps
        if p == "none":
            return block(h, heads, eps)
        if p == "block":
            return checkpointing.checkpoint(block, h, heads, eps, use_reentrant=False)
        if p == "sac-matmuls":
            return checkpointing.checkpoint(block, h, heads, eps, use_reentrant=False, context_fn=self.sac_context)
        if p == "attention":
            h = checkpointing.checkpoint(block.attention_half, h, heads, eps, use_reentrant=False)
            return block.mlp_half(h, eps)
        if p == "mlp":
            h = block.attention_half(h, heads, eps)
            return checkpointing.checkpoint(block.mlp_half, h, eps, use_reentrant=False)
        raise ValueError(f"torch_sac_step: unknown policy {p!r} (one of {', '.join(POLICIES)})")

    def forward(self, tokens):
        h = self.token_embedding[tokens]
        for block in self.blocks:
            h = self.run_block(block, h)
        return torch_reference.rms_norm(h, self.final_norm, self.eps) @ self.lm_head.T


def initialize(model, layers):
    # The riftco initialization (transformer.hpp), as torch_step.py does it.
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                std = 0.02 / (2 * layers) ** 0.5 if name.endswith(("output", "down")) else 0.02
                p.normal_(0.0, std)


def check(args):
    """Every policy and both block forms give the reference model's loss and
    gradients (to float32 round-off: SDPA and F.rms_norm sum in other orders)."""
    v, c, heads, layers, t, b = 64, 32, 4, 3, 16, 2
    f = c * 8 // 3 // 8 * 8
    reference = torch_reference.Transformer(v, c, heads, layers, f, 1e-5)
    initialize(reference, layers)
    g = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, v, (b, t), generator=g)
    targets = torch.randint(0, v, (b, t), generator=g)

    def loss_and_grads(model):
        loss = F.cross_entropy(model(tokens).view(-1, v), targets.view(-1))
        loss.backward()
        return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}

    want_loss, want_grads = loss_and_grads(reference)
    worst = 0.0
    for sdpa in (False, True):
        for policy in POLICIES:
            model = Transformer(v, c, heads, layers, f, 1e-5, policy, sdpa)
            model.load_state_dict(reference.state_dict())
            loss, grads = loss_and_grads(model)
            # Relative to each tensor's largest entry; the reference blocks
            # run the same ops in the same order, so they must match exactly.
            tol = 1e-5 if sdpa else 0.0
            err = max([abs(loss - want_loss) / abs(want_loss)]
                      + [((grads[n] - want_grads[n]).abs().max() / want_grads[n].abs().max()).item() for n in grads])
            worst = max(worst, err)
            if err > tol:
                sys.exit(f"torch_sac_step --check: policy {policy} ({'sdpa' if sdpa else 'reference'} blocks) "
                         f"differs from torch_reference.py by {err:.3g} relative (> {tol:g})")
    print(json.dumps({"check": "ok", "torch_version": torch.__version__, "policies": POLICIES,
                      "max_relative_difference": worst}))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--ffn", type=int, default=0, help="0: 8/3·width rounded down to a multiple of 8")
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--policy", choices=POLICIES, default="none")
    ap.add_argument("--model", choices=["sdpa", "reference"], default="sdpa")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--check", action="store_true", help="compare every policy with torch_reference.py and exit")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.check:
        check(args)
        return
    ffn = args.ffn or args.width * 8 // 3 // 8 * 8
    model = Transformer(args.vocab, args.width, args.heads, args.layers, ffn, 1e-5, args.policy,
                        args.model == "sdpa")
    initialize(model, args.layers)
    params = list(model.parameters())
    adam = torch.optim.Adam(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, foreach=False)
    # Adam's moments are allocated at setup, as riftco's Adam and
    # torch_step.py do, so the growth measured below is what a step needs.
    for p in params:
        adam.state[p] = {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p),
                         "exp_avg_sq": torch.zeros_like(p)}
    g = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g)
    targets = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g)

    rss_setup = status_bytes("VmRSS")
    hwm_reset = reset_peak_rss()
    times, forward_times, backward_times, optimizer_times, losses = [], [], [], [], []
    for i in range(args.warmup + args.steps):
        start = time.perf_counter()
        logits = model(tokens)
        loss = F.cross_entropy(logits.view(-1, args.vocab), targets.view(-1))
        forward_end = time.perf_counter()
        loss.backward()
        losses.append(loss.item())
        del logits, loss
        backward_end = time.perf_counter()
        adam.step()
        adam.zero_grad(set_to_none=True)
        end = time.perf_counter()
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
        "impl": "pytorch2", "torch_version": torch.__version__, "vocab": args.vocab, "width": args.width,
        "heads": args.heads, "layers": args.layers, "ffn": ffn, "seq": args.seq, "batch": args.batch,
        "policy": args.policy, "model": args.model,
        "attention": "F.scaled_dot_product_attention" if args.model == "sdpa" else "materialized (torch reference)",
        "saved_ops": [str(op) for op in SAVED_OPS] if args.policy == "sac-matmuls" else [],
        "threads": torch.get_num_threads(), "warmup": args.warmup, "steps": args.steps,
        "step_seconds": median, "step_times": times, "forward_seconds": median_of(forward_times),
        "backward_seconds": median_of(backward_times), "optimizer_seconds": median_of(optimizer_times),
        "losses": losses, "tokens_per_second": args.batch * args.seq / median,
        "rss_setup_bytes": rss_setup, "rss_growth_bytes": rss_peak - rss_setup if hwm_reset else -1,
        "allocator_stats": None, "adam_foreach": False,
        "malloc_env": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")},
        "libraries": mapped_libraries(),
    }))


if __name__ == "__main__":
    main()
