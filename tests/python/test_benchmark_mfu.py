"""bench/run_benchmarks.py's model FLOPs utilization (MFU): the FLOP count,
the peak it divides by, and the report rows and issue 16's S3 target. No
measuring: pure functions over hand-made rows (stdlib only, no riftco)."""
import run_benchmarks as rb

S3 = rb.SHAPES["S3"]


def per_op_flops(vocab, width, heads, layers, seq, batch, ffn):
    """The count spelled out op by op (forward), as an independent check."""
    tokens = batch * seq
    d = width // heads
    block = 0
    for n_in, n_out in [(width, width)] * 4 + [(width, ffn)] * 2 + [(ffn, width)]:  # q k v o, gate up, down
        block += 2 * n_in * n_out * tokens
    pairs = sum(i + 1 for i in range(seq))  # causal: query i sees keys 0..i
    block += batch * heads * pairs * 2 * d  # scores q·k
    block += batch * heads * pairs * 2 * d  # probabilities × values
    head = 2 * width * vocab * tokens
    return 3 * (layers * block + head)


def test_s3_model_flops_follow_the_convention():
    assert rb.ffn_width(768) == 2048
    expected = per_op_flops(256, 768, 12, 12, 128, 4, 2048)
    assert rb.model_flops(S3) == expected
    assert abs(expected / 1e9 - 265.18) < 0.01  # the figure docs/benchmarks.md quotes
    # An explicit --ffn width is the one counted.
    assert rb.model_flops(dict(S3, ffn=1024)) == per_op_flops(256, 768, 12, 12, 128, 4, 1024)


def peak_table(**extra):
    row = {"name": "BM_PeakFma/iterations:1", "rate": 272.0, "one_thread_gflops": 136.0, "avx512_gflops": 540.0}
    row.update(extra)
    return {"rows": [{"name": "BM_Gemm/M:64", "rate": 1.0}, row]}


def test_peak_at_the_row_thread_count():
    assert rb.fma_peak_512(peak_table(), 2, 2) == (540.0, "measured")
    assert rb.fma_peak_512(peak_table(one_thread_avx512_gflops=271.0), 1, 2) == (271.0, "measured")
    value, note = rb.fma_peak_512(peak_table(), 1, 2)  # an older table: scaled by the 256-bit share
    assert note == "derived" and abs(value - 270.0) < 1e-9
    assert rb.fma_peak_512(peak_table(), 4, 2) is None
    assert rb.fma_peak_512(peak_table(avx512_gflops=0.0), 2, 2) is None  # no AVX-512F
    assert rb.fma_peak_512(None, 2, 2) is None


def step_row(policy, threads, seconds):
    return {"shape": "S3", **S3, "policy": policy, "threads": threads, "ours": {"step_seconds": seconds}}


def test_utilization_and_the_s3_target():
    flops = rb.model_flops(S3)
    # Steps timed so that disabled is at 66% of the peak and block at 55%.
    rows = [step_row("disabled", 2, flops / (0.66 * 540e9)), step_row("block", 2, flops / (0.55 * 540e9)),
            step_row("disabled", 3, 1.0)]
    us = rb.utilization(rows, peak_table(), 2)
    assert [round(u["of_peak"], 6) for u in us[:2]] == [0.66, 0.55]
    assert us[0]["model_gflop"] == us[1]["model_gflop"]  # the replay is not model FLOPs
    assert us[2]["of_peak"] is None and us[2]["achieved_gflops"] == flops / 1e9
    s3 = [t for t in rb.targets(rows, None, us) if "model FLOPs" in t["target"]]
    assert [(t["threads"], t["measured"], t["met"]) for t in s3] == [(2, "66.0%", True), (2, "55.0%", False)]
    assert "S3 disabled: whole step >= 60% of the 512-bit FMA peak" in s3[0]["target"]


def test_markdown_prints_the_utilization_table():
    rows = [step_row("disabled", 2, 1.0)]
    result = {"command": "x", "date": "d", "threads": [2], "rounds": [1], "omp_wait_policy": "passive",
              "load_average_start": "1", "load_average_end": "1", "blas": {"ours": [], "torch": []},
              "steps": [dict(r, **{"ours": dict(r["ours"], tokens_per_second=1.0, rss_growth_bytes=1,
                                                forward_seconds=0.3, backward_seconds=0.6,
                                                optimizer_seconds=0.1)}) for r in rows]}
    result["utilization"] = rb.utilization(rows, peak_table(), 2)
    result["targets"] = rb.targets(rows, None, result["utilization"])
    md = rb.markdown(result)
    gflop = rb.model_flops(S3) / 1e9
    assert f"| S3 | disabled | {gflop:.2f} | 1.000 | {gflop:.1f} | 540.0 | **{100 * gflop / 540:.1f}%** |" in md
    assert "PaLM's MFU convention" in md
    assert "| 16 | 2 | S3 disabled: whole step >= 60% of the 512-bit FMA peak in model FLOPs (MFU) |" in md
