"""bench/in_backward.py (run_benchmarks.py --optimizer-in-backward): the
like-for-like and against-ordinary ratios, the tables and issue 16's memory
targets, over hand-made rows (stdlib only, no riftco, no measuring)."""
import in_backward as ib
import run_benchmarks as rb

MIB = 2**20


def side(seconds, rss_mib, peak_mib=None, ours=False):
    out = {"step_seconds": seconds, "step_times": [seconds], "rss_growth_bytes": rss_mib * MIB,
           "forward_seconds": 0.3, "backward_seconds": 0.6, "optimizer_seconds": 0.1}
    if peak_mib is not None:
        out["peak_bytes" if ours else "allocator_peak_bytes"] = peak_mib * MIB
    return out


def row(**sides):
    return {"shape": "S3", "policy": "block", "threads": 1, **sides}


def full_row():
    return row(ours=side(1.0, 350, 340, ours=True), ours_inbwd=side(1.1, 60, 40, ours=True),
               torch2_eager=side(3.0, 500, 345), torch2_compiled=side(2.0, 400, 343),
               torch2_eager_inbwd=side(3.3, 150, 68), torch2_compiled_inbwd=side(2.2, 415, 336))


def test_sides_follow_the_forms_that_passed_the_check():
    assert ib.sides(["eager"]) == ["ours_inbwd", "torch2_eager_inbwd"]
    assert ib.sides([]) == ["ours_inbwd"]
    assert ib.is_side("torch2_compiled_inbwd") and not ib.is_side("torch2_compiled")


def test_ratios_pick_the_fastest_and_smallest_form_of_each_group():
    x = ib.ratios(full_row())
    assert abs(x["time_like"] - 1.1 / 2.2) < 1e-12 and x["time_like_form"] == "compiled"
    assert abs(x["rss_like"] - 60 / 150) < 1e-12 and x["rss_like_form"] == "eager"
    assert abs(x["allocator_like"] - 40 / 68) < 1e-12 and x["allocator_like_form"] == "eager"
    assert abs(x["time_ordinary"] - 1.1 / 2.0) < 1e-12 and x["time_ordinary_form"] == "compiled"
    assert abs(x["rss_ordinary"] - 60 / 400) < 1e-12 and x["rss_ordinary_form"] == "compiled"
    assert abs(x["allocator_ordinary"] - 40 / 343) < 1e-12
    assert abs(x["allocator_vs_ours_ordinary"] - 40 / 340) < 1e-12


def test_ratios_without_pytorch_or_without_ours():
    assert ib.ratios(row(ours=side(1.0, 350, 340, ours=True))) is None
    x = ib.ratios(row(ours=side(1.0, 350, 340, ours=True), ours_inbwd=side(1.1, 60, 40, ours=True)))
    assert x == {"allocator_vs_ours_ordinary": 40 / 340}
    # A compiled form skipped by the check: the like-for-like ratio uses eager alone.
    r = full_row()
    del r["torch2_compiled_inbwd"]
    assert ib.ratios(r)["time_like_form"] == "eager"


def test_tables_and_targets_render_only_with_the_in_backward_sides():
    plain = row(ours=side(1.0, 350, 340, ours=True))
    assert ib.tables([plain]) == []
    r = full_row()
    r["in_backward"] = ib.ratios(r)
    md = "\n".join(ib.tables([plain, r]))
    assert "| S3 | block | 1.100 | 3.300 | 2.200 | **0.50 (compiled)** | 0.55 (compiled) |" in md
    assert "| S3 | block | 60 | 150 | 415 | **0.40 (eager)** | 0.15 (compiled) | 40 | 68 | 336 " \
           "| **0.59 (eager)** | 0.12 (compiled) | 0.12 |" in md
    ts = ib.targets([plain, r], 1, rb.TARGET_MEMORY)
    assert [(t["measured"], t["met"]) for t in ts] == [("0.40", True), ("0.15", True)]
    assert "like" not in ts[0]["target"] and "PyTorch 2 in-backward (eager)" in ts[0]["target"]
    assert "PyTorch 2 ordinary step (compiled)" in ts[1]["target"]
    r["in_backward"]["rss_like"] = 0.9
    assert not ib.targets([r], 1, rb.TARGET_MEMORY)[0]["met"]


def suite_markdown(r):
    r = dict(r, ours=dict(r["ours"], tokens_per_second=1.0), **rb.SHAPES["S3"])
    result = {"command": "x", "date": "d", "threads": [1], "rounds": [1], "omp_wait_policy": "passive",
              "load_average_start": "1", "load_average_end": "1", "blas": {"ours": [], "torch": []}, "steps": [r]}
    result["targets"] = rb.targets([r], None)
    return rb.markdown(result)


def test_the_suite_report_gets_the_tables_only_when_measured():
    # The default run's rows carry no in_backward key: its report is that of
    # a run without the option.
    assert "In-backward" not in suite_markdown(row(ours=side(1.0, 350, 340, ours=True)))
    r = full_row()
    r["in_backward"] = ib.ratios(r)
    md = suite_markdown(r)
    assert md.index("Peak training memory") < md.index("In-backward step (the optimizer step fused")
    assert "| 16 | 1 | S3 block: RSS growth ours in-backward / smaller PyTorch 2 in-backward (eager) <= 0.8 " \
           "| 0.40 | yes |" in md
