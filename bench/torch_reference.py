"""PyTorch reference of riftco's DecoderOnlyTransformer (same equations, same
parameter names), used by the parity test and the side-by-side benchmarks.

Architecture (docs/transformer.md): token embedding → L blocks of
[RMSNorm → causal MHA with RoPE → residual; RMSNorm → SwiGLU MLP → residual]
→ final RMSNorm → untied LM head, no biases. RoPE rotates interleaved pairs
(2i, 2i+1) by position · base^(-2i/D).
"""
import json
import math
import struct

import numpy as np
import torch
import torch.utils.checkpoint  # not imported by `import torch` in 1.13
import torch.nn.functional as F


def read_safetensors(path):
    """An independent safetensors reader (struct + json + numpy)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    meta = header.pop("__metadata__", {})
    base = 8 + n
    tensors = {}
    for name, info in header.items():
        assert info["dtype"] == "F32", info
        begin, end = info["data_offsets"]
        arr = np.frombuffer(data[base + begin : base + end], dtype="<f4").reshape(info["shape"])
        tensors[name] = arr.copy()
    return tensors, meta


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, base=10000.0):
    # x (B, H, T, D): rotate pairs (2i, 2i+1).
    t, d = x.shape[-2], x.shape[-1]
    i = torch.arange(d // 2, dtype=torch.float64, device=x.device)
    theta = base ** (-2.0 * i / d)
    angle = torch.arange(t, dtype=torch.float64, device=x.device)[:, None] * theta[None, :]
    cos = torch.cos(angle).to(x.dtype)
    sin = torch.sin(angle).to(x.dtype)
    a, b = x[..., 0::2], x[..., 1::2]
    out = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1)
    return out.flatten(-2)


class Block(torch.nn.Module):
    def __init__(self, c, f):
        super().__init__()
        self.attention_norm = torch.nn.Parameter(torch.ones(c))
        self.query = torch.nn.Parameter(torch.zeros(c, c))
        self.key = torch.nn.Parameter(torch.zeros(c, c))
        self.value = torch.nn.Parameter(torch.zeros(c, c))
        self.output = torch.nn.Parameter(torch.zeros(c, c))
        self.mlp_norm = torch.nn.Parameter(torch.ones(c))
        self.gate = torch.nn.Parameter(torch.zeros(f, c))
        self.up = torch.nn.Parameter(torch.zeros(f, c))
        self.down = torch.nn.Parameter(torch.zeros(c, f))

    def forward(self, h, heads, eps):
        b, t, c = h.shape
        d = c // heads
        x = rms_norm(h, self.attention_norm, eps)

        def split(y):
            return y.view(b, t, heads, d).transpose(1, 2)

        q = rope(split(x @ self.query.T))
        k = rope(split(x @ self.key.T))
        v = split(x @ self.value.T)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(d)
        mask = torch.ones(t, t, dtype=torch.bool, device=h.device).triu(1)
        p = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
        a = (p @ v).transpose(1, 2).reshape(b, t, c)
        h = h + a @ self.output.T
        y = rms_norm(h, self.mlp_norm, eps)
        return h + (F.silu(y @ self.gate.T) * (y @ self.up.T)) @ self.down.T


class Transformer(torch.nn.Module):
    def __init__(self, vocab_size, model_width, heads, layers, feed_forward_width, norm_epsilon=1e-5,
                 checkpoint_blocks=False, **_):
        super().__init__()
        self.heads = heads
        self.eps = norm_epsilon
        self.checkpoint_blocks = checkpoint_blocks
        self.token_embedding = torch.nn.Parameter(torch.zeros(vocab_size, model_width))
        self.blocks = torch.nn.ModuleList(Block(model_width, feed_forward_width) for _ in range(layers))
        self.final_norm = torch.nn.Parameter(torch.ones(model_width))
        self.lm_head = torch.nn.Parameter(torch.zeros(vocab_size, model_width))

    def forward(self, tokens):
        h = self.token_embedding[tokens]
        for block in self.blocks:
            if self.checkpoint_blocks:
                h = torch.utils.checkpoint.checkpoint(block, h, self.heads, self.eps, use_reentrant=False)
            else:
                h = block(h, self.heads, self.eps)
        return rms_norm(h, self.final_norm, self.eps) @ self.lm_head.T

    def load_riftco(self, tensors):
        """Copies riftco parameter names into this model."""
        names = {
            "attention_norm.weight": "attention_norm", "attention.query.weight": "query",
            "attention.key.weight": "key", "attention.value.weight": "value",
            "attention.output.weight": "output", "mlp_norm.weight": "mlp_norm",
            "mlp.gate.weight": "gate", "mlp.up.weight": "up", "mlp.down.weight": "down",
        }
        with torch.no_grad():
            self.token_embedding.copy_(torch.from_numpy(tensors["token_embedding.weight"]))
            self.final_norm.copy_(torch.from_numpy(tensors["final_norm.weight"]))
            self.lm_head.copy_(torch.from_numpy(tensors["lm_head.weight"]))
            for i, block in enumerate(self.blocks):
                for ours, theirs in names.items():
                    getattr(block, theirs).copy_(torch.from_numpy(tensors[f"blocks.{i}.{ours}"]))

    def riftco_named_parameters(self):
        """(riftco name, parameter) pairs."""
        out = [("token_embedding.weight", self.token_embedding)]
        for i, block in enumerate(self.blocks):
            for ours, theirs in [("attention_norm.weight", "attention_norm"), ("attention.query.weight", "query"),
                                 ("attention.key.weight", "key"), ("attention.value.weight", "value"),
                                 ("attention.output.weight", "output"), ("mlp_norm.weight", "mlp_norm"),
                                 ("mlp.gate.weight", "gate"), ("mlp.up.weight", "up"), ("mlp.down.weight", "down")]:
                out.append((f"blocks.{i}.{ours}", getattr(block, theirs)))
        out += [("final_norm.weight", self.final_norm), ("lm_head.weight", self.lm_head)]
        return out
