"""The "in-backward step" rows of bench/run_benchmarks.py
(--optimizer-in-backward): the optimizer step fused into the backward pass
on both sides — ours `rt-bench-step --optimizer-in-backward`
(Adam::backward_and_step), PyTorch 2 `torch2_step.py --optimizer-in-backward`
(one Adam per parameter stepped by post-accumulate-grad hooks, PyTorch's
documented recipe) — measured beside the ordinary step's sides of the same
row. Ratios: like for like (ours in-backward / PyTorch 2 in-backward) and
against PyTorch 2's ordinary step (the suite's usual columns); memory both as
RSS growth and as allocator peak. Pure functions over the suite's rows."""

SUFFIX = "_inbwd"
TORCH2_FORMS = ("eager", "compiled")


def sides(torch2_forms):
    """The extra processes of a row: ours, then each PyTorch 2 form that
    passed torch2_step.py --check-in-backward."""
    return ["ours" + SUFFIX] + [f"torch2_{f}{SUFFIX}" for f in torch2_forms]


def is_side(who):
    return who.endswith(SUFFIX)


def _smallest(row, keys, field):
    """(key, value) of the side with the smallest `field`, or (None, None)."""
    have = [k for k in keys if row.get(k) and row[k].get(field)]
    if not have:
        return None, None
    key = min(have, key=lambda k: row[k][field])
    return key, row[key][field]


def _form(key):
    return key[len("torch2_"):].replace(SUFFIX, "")


def ratios(row):
    """Ours in-backward against PyTorch 2 in-backward ("like") and against
    PyTorch 2's ordinary step ("ordinary"): step time over the fastest form,
    RSS growth and allocator peak over the smallest form (each picked
    separately, named in *_form); None when the row has no in-backward ours."""
    ours = row.get("ours" + SUFFIX)
    if not ours:
        return None
    out = {}
    groups = {"like": [f"torch2_{f}{SUFFIX}" for f in TORCH2_FORMS],
              "ordinary": [f"torch2_{f}" for f in TORCH2_FORMS]}
    after = ours.get("rss_growth_after_warmup_bytes")  # the baseline PyTorch 2's figure has
    ours_values = {"step_seconds": ours["step_seconds"],
                   "rss_growth_bytes": after if after is not None else ours["rss_growth_bytes"],
                   "allocator_peak_bytes": ours.get("peak_bytes")}
    for group, keys in groups.items():
        for field, name in (("step_seconds", "time"), ("rss_growth_bytes", "rss"),
                            ("allocator_peak_bytes", "allocator")):
            key, value = _smallest(row, keys, field)
            if key and ours_values[field]:
                out[f"{name}_{group}"] = ours_values[field] / value
                out[f"{name}_{group}_form"] = _form(key)
    if row.get("ours") and row["ours"].get("peak_bytes") and ours.get("peak_bytes"):
        out["allocator_vs_ours_ordinary"] = ours["peak_bytes"] / row["ours"]["peak_bytes"]
    return out


def _ratio(r, name):
    x = r.get("in_backward") or {}
    if x.get(name) is None:
        return "—"
    return f"{x[name]:.2f} ({x[name + '_form']})" if name + "_form" in x else f"{x[name]:.2f}"


def _mib(side, field):
    return "—" if not side or side.get(field) is None else f"{side[field] / 2**20:.0f}"


def _sec(side):
    return "—" if not side else f"{side['step_seconds']:.3f}"


def tables(rows):
    """Markdown lines for one thread count's rows ([] when none has the
    in-backward sides)."""
    rs = [r for r in rows if r.get("ours" + SUFFIX)]
    if not rs:
        return []
    lines = ["In-backward step (the optimizer step fused into the backward pass on both sides: ours "
             "`rt-bench-step --optimizer-in-backward`, PyTorch 2 one Adam per parameter stepped by "
             "`register_post_accumulate_grad_hook`). Ratios: **like for like** = ours in-backward / the fastest "
             "(smallest) PyTorch 2 in-backward form; *vs ordinary* = ours in-backward / the fastest (smallest) "
             "form of PyTorch 2's ordinary step (the columns above); the form each ratio used in brackets.", "",
             "| shape | policy | ours in-bwd s | PT2 eager in-bwd s | PT2 compiled in-bwd s "
             "| **ours / PT2 in-bwd (like for like)** | ours in-bwd / PT2 ordinary |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for r in rs:
        lines.append(f"| {r['shape']} | {r['policy']} | {_sec(r['ours' + SUFFIX])} "
                     f"| {_sec(r.get('torch2_eager' + SUFFIX))} | {_sec(r.get('torch2_compiled' + SUFFIX))} "
                     f"| **{_ratio(r, 'time_like')}** | {_ratio(r, 'time_ordinary')} |")
    lines += ["", "In-backward step memory (MiB; RSS growth and allocator peak measured as in the table above):", "",
              "| shape | policy | ours in-bwd RSS (after warm-up) | PT2 eager in-bwd RSS | PT2 compiled in-bwd RSS "
              "| **ours / PT2 in-bwd RSS** | ours in-bwd / PT2 ordinary RSS | ours in-bwd allocator "
              "| PT2 eager in-bwd allocator | PT2 compiled in-bwd allocator | **ours / PT2 in-bwd allocator** "
              "| ours in-bwd / PT2 ordinary allocator | ours in-bwd / ours ordinary allocator |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rs:
        o, e, c = r["ours" + SUFFIX], r.get("torch2_eager" + SUFFIX), r.get("torch2_compiled" + SUFFIX)
        ours_rss = "rss_growth_after_warmup_bytes" if o.get("rss_growth_after_warmup_bytes") is not None \
            else "rss_growth_bytes"
        lines.append(f"| {r['shape']} | {r['policy']} | {_mib(o, ours_rss)} "
                     f"| {_mib(e, 'rss_growth_bytes')} | {_mib(c, 'rss_growth_bytes')} "
                     f"| **{_ratio(r, 'rss_like')}** | {_ratio(r, 'rss_ordinary')} | {_mib(o, 'peak_bytes')} "
                     f"| {_mib(e, 'allocator_peak_bytes')} | {_mib(c, 'allocator_peak_bytes')} "
                     f"| **{_ratio(r, 'allocator_like')}** | {_ratio(r, 'allocator_ordinary')} "
                     f"| {_ratio(r, 'allocator_vs_ours_ordinary')} |")
    lines.append("")
    return lines


def targets(rows, threads, limit):
    """Issue 16's memory target (RSS growth ours / PyTorch 2 <= limit) for
    the in-backward step, like for like and against PyTorch 2's ordinary
    step."""
    out = []
    for r in rows:
        x = r.get("in_backward") or {}
        for key, against in (("rss_like", "PyTorch 2 in-backward"), ("rss_ordinary", "PyTorch 2 ordinary step")):
            if x.get(key) is not None:
                out.append({"issue": 16, "threads": threads,
                            "target": f"{r['shape']} {r['policy']}: RSS growth ours in-backward / smaller "
                                      f"{against} ({x[key + '_form']}) <= {limit}",
                            "measured": f"{x[key]:.2f}", "met": x[key] <= limit})
    return out
