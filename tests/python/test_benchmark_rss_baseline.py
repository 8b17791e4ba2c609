"""bench/run_benchmarks.py reads our RSS growth against PyTorch 2 from the
same baseline as PyTorch 2's (after the warm-up and a trim), and keeps the
over-setup figure for PyTorch 1.13. No measuring: hand-made process records
(stdlib only, no riftco)."""
import run_benchmarks as rb

MiB = 2**20


def record(over_setup, after_warmup=None, step=0.5):
    r = {"batch": 4, "seq": 128, "step_times": [step, step], "rss_growth_bytes": over_setup * MiB,
         "libraries": [], "losses": [1.0], "forward_seconds": 0.1, "backward_seconds": 0.3,
         "optimizer_seconds": 0.1}
    if after_warmup is not None:
        r["rss_growth_after_warmup_bytes"] = after_warmup * MiB
    return r


def test_the_after_warmup_figure_is_pooled_and_preferred():
    ours = rb.summarize([record(343, 340), record(342, 341)])
    assert ours["rss_growth_bytes"] == 343 * MiB  # the larger process, as before
    assert ours["rss_growth_after_warmup_bytes"] == 341 * MiB
    assert rb.like_rss(ours) == 341 * MiB


def test_a_record_without_it_falls_back_to_the_over_setup_figure():
    # An older rt-bench-step (or one process lacking the field): no mixed baselines.
    ours = rb.summarize([record(343, 340), record(342)])
    assert ours["rss_growth_after_warmup_bytes"] is None
    assert rb.like_rss(ours) == 343 * MiB
    torch2 = rb.summarize([record(446)])  # PyTorch 2's records carry only rss_growth_bytes (after warm-up)
    assert rb.like_rss(torch2) == 446 * MiB
