"""Charts users look at, in runs/<id>/ (matplotlib, Agg): scaling (bagging and data
parallelism), roofline, the quality/speed trade-off at a fixed scale, one test's quality
curve.

All are drawn from the typed results alone (harness/results.py), so a user can redraw
them from results.json (results.load). Which tests belong together is `harness/experiments.py`'s
decision, shared with the report's lines. Each function returns what it drew and writes
no file when there is nothing to draw.
"""
from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")  # no display on compute nodes
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

from harness import experiments  # noqa: E402
from harness.results import TestResult  # noqa: E402


def scaling(tests: list[TestResult], path: str) -> int:
    """FLOPS and VFLOPS against Sys_scale. Bagging series, one per (workload, B,
    precision, P), scale M at a fixed P; a data-parallel series, one per (workload, B,
    precision), scales P at M = 1 (the paper's Fig. 9 puts the two side by side). The
    ideal line goes through each series' smallest scale (drawn once when two series
    share it). Returns the number of points drawn, a test with M = 1 counting once per
    series it starts; draws nothing (returns 0) when no series spans two scales."""
    series = experiments.scaling_series(tests)
    if not series:
        return 0
    fig, ax = plt.subplots(figsize=(7, 4.5))
    points, ideals = 0, {}
    for s in series:
        scale = [t.M * t.P for t in s.tests]
        dp = s.kind == "data parallelism"
        label = f"{s.workload} B={s.B} {s.precision} " + ("data parallelism (M=1)" if dp else f"P={s.P}")
        ax.plot(scale, [t.flops / 1e12 for t in s.tests], "^-" if dp else "o-", label=f"FLOPS {label}")
        ax.plot(scale, [t.vflops / 1e12 for t in s.tests], "v--" if dp else "s--", label=f"VFLOPS {label}")
        base = s.tests[0].flops / 1e12 / scale[0]   # Tflops per rank at the smallest scale
        ideals.setdefault((s.workload, s.B, s.precision, scale[0], base), (label, set()))[1].update(scale)
        points += len(s.tests)
    for (*_, base), (label, scales) in ideals.items():   # bagging P=1 and DP share M=1, P=1: one line
        xs = sorted(scales)
        ax.plot(xs, [base * x for x in xs], ":", color="grey", label=f"ideal {label}")
    ax.set_xlabel("Sys_scale = M x P (ranks)")
    ax.set_ylabel("Tflops")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({t.M * t.P for s in series for t in s.tests}))
    ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_title("HPC AI500 V3.0 scaling: bagging and data parallelism")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    _save(fig, path)
    return points


def roofline(tests: list[TestResult], ceilings: dict, path: str) -> int:
    """Per-rank roofline: GEMM and convolution ceilings (median over ranks), the memory
    slope of the triad bandwidth, and each test at (its arithmetic intensity, FLOPS per
    rank used). Returns the number of tests placed."""
    gemm, conv, bw = ceilings["gemm_flops"], ceilings["conv_flops"], ceilings["bandwidth"]
    xs = [t.intensity for t in tests]
    lo, hi = min(xs + [gemm / bw]) / 4, max(xs + [gemm / bw]) * 4
    fig, ax = plt.subplots(figsize=(7, 4.5))
    grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    ax.plot(grid, [min(gemm, bw * x) / 1e12 for x in grid], "-", color="black", label="GEMM ceiling / triad bandwidth")
    ax.plot(grid, [min(conv, bw * x) / 1e12 for x in grid], "--", color="tab:blue", label="convolution ceiling")
    for t in tests:
        ax.plot(t.intensity, t.flops / (t.M * t.P) / 1e12, "o",
                label=f"test {t.index}: {t.workload} M={t.M} P={t.P} B={t.B}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP/byte, training step estimate)")
    ax.set_ylabel("Tflops per rank")
    ax.set_title(f"Roofline per rank ({ceilings['precision']})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    _save(fig, path)
    return len(tests)


def tradeoff(tests: list[TestResult], path: str) -> int:
    """Quality against speed at a fixed Sys_scale (the paper's Fig. 7): one panel per
    group of `experiments.fixed_scale_groups` (same workload, B, precision and M x P,
    two or more layouts), ensemble quality against FLOPS, each point labelled "M x P",
    the target as a dotted line. FLOPS, not VFLOPS, on x: VFLOPS already folds the
    quality in, and the trade-off is between the two. `tests`: one result per test index
    (repetitions folded). Returns the points drawn (one per test); 0 and no file when
    no group holds two layouts."""
    groups = experiments.fixed_scale_groups(tests)
    if not groups:
        return 0
    cols = min(3, len(groups))
    rows = math.ceil(len(groups) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.5 * cols, 3.8 * rows), squeeze=False)
    points = 0
    for ax, g in zip(axes.flat, groups):
        xs, ys = [t.flops / 1e12 for t in g.tests], [t.quality for t in g.tests]
        ax.plot(xs, ys, "o", color="tab:blue")
        for t, x, y in zip(g.tests, xs, ys):
            ax.annotate(f"{t.M} x {t.P}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
        ax.axhline(g.tests[0].target_quality, linestyle=":", color="grey", label="target")
        ax.margins(0.15)   # room for the "M x P" labels at the edges
        ax.set_xlabel("Tflops")
        ax.set_ylabel(f"ensemble {g.tests[0].quality_name}")
        ax.set_title(f"Sys_scale {g.scale}: {g.name}", fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
        points += len(g.tests)
    for ax in list(axes.flat)[len(groups):]:
        ax.set_visible(False)
    fig.suptitle("Quality vs speed at a fixed scale (M x P)")
    _save(fig, path)
    return points


BAND_ABOVE = 8   # base models: up to this many, a line each; above, a min/mean/max band


def quality_curve(test: TestResult, path: str) -> int:
    """One test's quality along training: the ensemble's and the base models' quality at
    each evaluation against the wall seconds since the start of training, and the target.
    Where the ensemble line rises above the base models' is what bagging buys. Up to
    BAND_ABOVE base models, a line each; more (M is in the thousands on a large machine),
    their min-max band and mean line, so the chart's artists do not grow with M. The
    ensemble is drawn on top. Returns the points drawn, evaluations x (1 + base-model
    series: M, or 3 for min, mean, max); 0 and no file without an evaluation."""
    ev = test.evaluations
    if not ev:
        return 0
    fig, ax = plt.subplots(figsize=(7, 4.5))
    secs = [e["seconds"] for e in ev]
    models = len(ev[0]["base_quality"])
    # a base model lost to a fault (harness/elastic.py) has None from then on: a gap in its line
    kept = [[q for q in e["base_quality"] if q is not None] for e in ev]
    if models <= BAND_ABOVE:
        for j in range(models):   # one colour, one legend entry
            ax.plot(secs, [float("nan") if e["base_quality"][j] is None else e["base_quality"][j] for e in ev], ".--",
                    color="tab:grey", alpha=0.6, linewidth=0.8, label=f"base models ({models})" if j == 0 else None)
        series = models
    else:
        lo, hi = [min(k) for k in kept], [max(k) for k in kept]
        mean = [sum(k) / len(k) for k in kept]
        ax.fill_between(secs, lo, hi, color="tab:grey", alpha=0.25, linewidth=0,
                        label=f"base models ({models}): min-max")
        ax.plot(secs, mean, ".--", color="tab:grey", linewidth=0.8, label="base models: mean")
        series = 3
    ax.plot(secs, [e["quality"] for e in ev], "o-", color="tab:blue", label="ensemble", zorder=3)
    ax.axhline(test.target_quality, linestyle=":", color="tab:red", label=f"target {test.target_quality:g}")
    ax.set_xlabel("seconds since the start of training (evaluations included)")
    ax.set_ylabel(test.quality_name)
    ax.set_title(f"Test {test.index}: {test.workload} M={test.M} P={test.P} B={test.B} {test.precision}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    _save(fig, path)
    return len(ev) * (1 + series)


def _save(fig, path: str) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def tuning(rows: list[dict], path: str) -> int:
    """A tuning run's chart (--tune): VFLOPS against trial, each stage its marker, and FLOPS
    against quality; the finalists circled, the tuned file's starred. Faulted trials are left
    out. Returns the trials drawn."""
    drawn = [r for r in rows if not r.get("fault") and r.get("vflops") is not None]
    if not drawn:
        return 0
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    stages = list(dict.fromkeys(r["stage"] for r in drawn))
    for i, stage in enumerate(stages):
        mine = [r for r in drawn if r["stage"] == stage]
        marker = "os^vD<>p"[i % 8]
        left.plot([r["number"] for r in mine], [r["vflops"] / 1e12 for r in mine], marker, linestyle="", label=stage)
        right.plot([r["quality"] for r in mine], [r["flops"] / 1e12 for r in mine], marker, linestyle="", label=stage)
    for ax, x, y in ((left, "number", "vflops"), (right, "quality", "flops")):
        final = [r for r in drawn if r["stage"] == "final"]
        ax.plot([r[x] for r in final], [r[y] / 1e12 for r in final], "o", markersize=14, markerfacecolor="none",
                color="black", label="finalists")
        best = [r for r in drawn if r["outcome"].startswith("best")]
        ax.plot([r[x] for r in best], [r[y] / 1e12 for r in best], "*", markersize=16, color="gold",
                markeredgecolor="black", label="tuned file's")
        ax.grid(True, alpha=0.3)
    left.set_xlabel("trial")
    left.set_ylabel("VTflops (short trials: estimates)")
    right.set_xlabel("quality")
    right.set_ylabel("Tflops")
    left.set_title("VFLOPS by trial")
    right.set_title("FLOPS against quality")
    left.legend(fontsize=7)
    fig.suptitle("HPC AI500 V3.0 tuning (--tune)")
    _save(fig, path)
    return len(drawn)
