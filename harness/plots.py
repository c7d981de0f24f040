"""Charts users look at: scaling.png and roofline.png in runs/<id>/ (matplotlib, Agg).

Both are drawn from the results dictionaries alone, so `--summarize` or a user can
redraw them from results.json.
"""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # no display on compute nodes
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402


def scaling(tests: list[dict], path: str) -> int:
    """FLOPS and VFLOPS against Sys_scale, one series per (workload, B, precision, P):
    bagging scales M at a fixed P. The ideal line goes through the smallest scale.
    Returns the number of points drawn; draws nothing (returns 0) when no series spans
    two scales."""
    groups: dict[tuple, list[dict]] = {}
    for t in tests:
        groups.setdefault((t["workload"], t["B"], t["precision"], t["P"]), []).append(t)
    groups = {k: sorted(v, key=lambda t: t["M"] * t["P"]) for k, v in groups.items()
              if len({t["M"] * t["P"] for t in v}) > 1}
    if not groups:
        return 0
    fig, ax = plt.subplots(figsize=(7, 4.5))
    points = 0
    for (wl, b, prec, p), ts in groups.items():
        scale = [t["M"] * t["P"] for t in ts]
        label = f"{wl} B={b} {prec} P={p}"
        ax.plot(scale, [t["flops"] / 1e12 for t in ts], "o-", label=f"FLOPS {label}")
        ax.plot(scale, [t["vflops"] / 1e12 for t in ts], "s--", label=f"VFLOPS {label}")
        base = ts[0]["flops"] / 1e12 / scale[0]
        ax.plot(scale, [base * s for s in scale], ":", color="grey", label=f"ideal {label}")
        points += len(ts)
    ax.set_xlabel("Sys_scale = M x P (ranks)")
    ax.set_ylabel("Tflops")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({t["M"] * t["P"] for ts in groups.values() for t in ts}))
    ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_title("HPC AI500 V3.0 bagging scaling")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return points


def roofline(tests: list[dict], ceilings: dict, path: str) -> int:
    """Per-rank roofline: GEMM and convolution ceilings (median over ranks), the memory
    slope of the triad bandwidth, and each test at (its arithmetic intensity, FLOPS per
    rank used). Returns the number of tests placed."""
    gemm, conv, bw = ceilings["gemm_flops"], ceilings["conv_flops"], ceilings["bandwidth"]
    xs = [t["intensity"] for t in tests]
    lo, hi = min(xs + [gemm / bw]) / 4, max(xs + [gemm / bw]) * 4
    fig, ax = plt.subplots(figsize=(7, 4.5))
    grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    ax.plot(grid, [min(gemm, bw * x) / 1e12 for x in grid], "-", color="black", label="GEMM ceiling / triad bandwidth")
    ax.plot(grid, [min(conv, bw * x) / 1e12 for x in grid], "--", color="tab:blue", label="convolution ceiling")
    for t in tests:
        ax.plot(t["intensity"], t["flops"] / (t["M"] * t["P"]) / 1e12, "o",
                label=f"test {t['index']}: {t['workload']} M={t['M']} P={t['P']} B={t['B']}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP/byte, training step estimate)")
    ax.set_ylabel("Tflops per rank")
    ax.set_title(f"Roofline per rank ({ceilings['precision']})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return len(tests)
