#!/usr/bin/env python3
"""A custom training loop in plain Python: model, Adam, loss, backward, step,
and a loss curve drawn with matplotlib (when installed)."""
import argparse
import pathlib

import numpy as np

import riftco

TEXT = ("It was the best of times, it was the worst of times, it was the age of wisdom, "
        "it was the age of foolishness, it was the epoch of belief, it was the epoch of incredulity. ") * 20


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--sequence-length", type=int, default=32)
    parser.add_argument("--activation-checkpointing", choices=riftco.ACTIVATION_CHECKPOINTING_KINDS,
                        default="block")
    parser.add_argument("--output", type=pathlib.Path, default=pathlib.Path("train_loop_loss.png"))
    args = parser.parse_args(argv)

    data = np.frombuffer(TEXT.encode(), dtype=np.uint8).astype(np.int64)
    config = riftco.TransformerConfig(context_length=64, model_width=32, heads=2, layers=2, feed_forward_width=64)
    model = riftco.DecoderOnlyTransformer(config, attention="flash",
                                          activation_checkpointing=args.activation_checkpointing, seed=0)
    optimizer = riftco.Adam(model.trainable_parameters(), learning_rate=3e-3, max_grad_norm=1.0)
    rng = np.random.default_rng(0)
    losses = []
    for step in range(1, args.steps + 1):
        starts = rng.integers(0, len(data) - args.sequence_length - 1, size=args.batch)
        tokens = np.stack([data[s:s + args.sequence_length] for s in starts])
        targets = np.stack([data[s + 1:s + args.sequence_length + 1] for s in starts])
        optimizer.zero_grad()
        loss = model.loss(tokens, targets)  # (B, T) integer arrays → scalar Variable
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if step % max(1, args.steps // 10) == 0 or step == args.steps:
            print(f"step {step}  loss {losses[-1]:.4f}", flush=True)
    print("sample:", repr(model.generate("it was the ", max_new_tokens=30, temperature=0).text))

    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        print("matplotlib is not installed: no loss curve")
        return 0
    figure = Figure(figsize=(7, 4))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    axes.plot(range(1, len(losses) + 1), losses)
    axes.set(xlabel="step", ylabel="loss", title="custom training loop")
    axes.grid(True, alpha=0.3)
    figure.savefig(args.output)
    print(f"loss curve: {args.output.resolve()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
