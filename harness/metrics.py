"""FLOPS, VFLOPS and summaries: the paper's Eq. 4-8 as pure functions.

Every comparison of qualities lives here, aware of its direction: a workload's quality
is higher-is-better (Top-1, mAP) or, HIGHER_IS_BETTER = False, an error (cosmoflow's
MAE). `reaches`, `best`, `gain`, `penalty`, `first_reaching` and `repeats` take the
direction; the report, the run's stop decision and --verify call these, never `>=`.
"""
from __future__ import annotations

from dataclasses import dataclass


REPLICA_TOLERANCE = 1e-6   # replica consistency: max |w - w_root| allowed (the residual check's bound)


def consistency(max_diff: float) -> dict:
    """The replica consistency verdict of a test: its largest weight difference against
    the bound (results.json's `consistency`)."""
    return {"max_diff": max_diff, "tolerance": REPLICA_TOLERANCE, "passed": bool(max_diff <= REPLICA_TOLERANCE)}


def utilisation(flops_value: float, ceilings: dict | None, ranks: list[int]) -> dict | None:
    """FLOPS against the roofline ceilings of the ranks that trained: the sums of their
    measured GEMM and convolution FLOPS, and their theoretical peak (None if unknown).
    None without roofline figures (line 30 at 0)."""
    if not ceilings:
        return None
    per_rank = ceilings["per_rank"]
    gemm = sum(per_rank[r]["gemm"]["flops"] for r in ranks)
    conv = sum(per_rank[r]["conv"]["flops"] for r in ranks)
    peak = ceilings["peak"]["flops"]
    return {"gemm": flops_value / gemm, "conv": flops_value / conv,
            "peak": flops_value / (peak * len(ranks)) if peak else None}


# A timed span shorter than this (s) gives FLOPS that repeat only loosely: on a quiet
# 2-core machine the shipped test's FLOPS spread 5 % over 4 runs at 0.9 s and at most
# 2.4 % from 2.4 s on (bench/span.py); other load widens both. The report says so.
SHORT_SPAN = 2.0


def short_span(seconds: float) -> str | None:
    """The warning a test whose timed span is `seconds` carries, or None."""
    if seconds >= SHORT_SPAN:
        return None
    return (f"timed span {seconds:.2f} s, under {SHORT_SPAN:g} s: its FLOPS repeat only within about 5 % "
            "on a quiet machine (more epochs or data lengthen it)")


def total_flops(samples_per_job: list[int], training_flops_per_sample: float) -> float:
    """Eq. 4 summed over the N/|B| iterations of Eq. 6: the analytic FLOPs of every
    sample every base model trained on (all jobs, all epochs)."""
    return float(sum(samples_per_job)) * training_flops_per_sample


def flops(total: float, seconds: float) -> float:
    """Eq. 6: total FLOPs / training time (the slowest rank's, all jobs run at once)."""
    if seconds <= 0:
        raise ValueError(f"training time must be positive, got {seconds}")
    return total / seconds


def penalty(achieved: float, target: float, n: float, higher_is_better: bool = True) -> float:
    """Eq. 8: (achieved / target)^n; for an error (lower is better) (target / achieved)^n,
    the same ratio turned round, so that in both directions a quality r times better
    than the target earns r^n and one r times worse costs r^-n. Not capped: the paper
    penalises *or awards*. An error of 0 has no finite penalty: refused."""
    if target <= 0:
        raise ValueError(f"target quality must be positive, got {target}")
    if higher_is_better:
        return (max(achieved, 0.0) / target) ** n
    if achieved <= 0:
        raise ValueError(f"an error (lower is better) of {achieved} has no finite penalty (target / error)^n")
    return (target / achieved) ** n


def vflops(flops_value: float, achieved: float, target: float, n: float, higher_is_better: bool = True) -> float:
    """Eq. 7: Valid FLOPS."""
    return flops_value * penalty(achieved, target, n, higher_is_better)


def reaches(achieved: float, target: float, higher_is_better: bool = True) -> bool:
    """The quality meets the target: at or above it, or for an error at or below it."""
    return achieved >= target if higher_is_better else achieved <= target


def best(values, higher_is_better: bool = True):
    """The best of some qualities: the highest, or for an error the lowest."""
    return max(values) if higher_is_better else min(values)


def gain(ensemble: float, base: float, higher_is_better: bool = True) -> float:
    """How much better the ensemble's quality is than `base` (e.g. the base models'
    mean): positive = better, in the quality's own units, whatever the direction."""
    return ensemble - base if higher_is_better else base - ensemble


def intensity(forward_flops: float, activations: float, weights: float, batch: int,
              bytes_per_element: int = 4) -> float:
    """Arithmetic intensity (FLOP/byte) of one training step, for the roofline chart.

    Estimate: 3 x forward FLOPs per sample over the memory traffic of a step when every
    tensor is touched once per pass and nothing stays in cache between layers: weights
    read in the forward and backward passes and their gradients written (3 W), every
    activation written, read back and its gradient written (3 A B). Hence
    3 F B / (s (3 W + 3 A B)) = F B / (s (W + A B)).
    """
    return forward_flops * batch / (bytes_per_element * (weights + activations * batch))


@dataclass(frozen=True)
class Scaling:
    scale_from: int
    scale_to: int
    speedup: float
    efficiency: float


def weak_scaling(points: list[tuple[int, float]]) -> Scaling | None:
    """Bagging scales by adding base models: from the smallest to the largest Sys_scale,
    FLOPS ratio and efficiency = ratio / (scale ratio). None with fewer than 2 scales."""
    by_scale: dict[int, list[float]] = {}
    for scale, value in points:   # repeated runs at one scale: their mean
        by_scale.setdefault(scale, []).append(value)
    if len(by_scale) < 2:
        return None
    s0, s1 = min(by_scale), max(by_scale)
    f0, f1 = (sum(by_scale[s]) / len(by_scale[s]) for s in (s0, s1))
    speedup = f1 / f0
    return Scaling(s0, s1, speedup, speedup / (s1 / s0))


def first_reaching(curve: list[dict], target: float, higher_is_better: bool = True) -> dict | None:
    """The first evaluation (curve point: epoch, seconds, quality) whose ensemble quality
    reaches the target (`reaches`): its seconds are the time to quality, its epoch the
    epochs to quality (HPC AI500 V2.0, MLPerf's time to train). None: never reached."""
    return next((p for p in curve if reaches(p["quality"], target, higher_is_better)), None)


def counted(curve: list[dict]) -> list[dict]:
    """The points of an evaluation curve whose ensemble holds as many models as its last (the
    one the test measures; a point's models: its base qualities not null). After a lost base
    model (harness/elastic.py) the ensemble is smaller until a wave of `retrain` trains it
    again: its reaching the target then is not the test's. Under `drop` no point has fewer."""
    models = [sum(q is not None for q in p["base_quality"]) for p in curve]
    return [p for p, m in zip(curve, models) if m >= models[-1]]


def chunk_mean(parts: list[tuple[int, float]]) -> float:
    """A quality from its chunks' (rows, quality): one chunk's own (the whole set, any
    quality), else the mean weighted by rows (a mean over samples, chunk by chunk)."""
    if len(parts) == 1:
        return parts[0][1]
    return sum(n * q for n, q in parts) / sum(n for n, _ in parts)


@dataclass(frozen=True)
class Repeats:
    index: int           # the test's position in the sweep
    runs: int
    kept: int            # runs summarised (olympic: all but the fastest and the slowest)
    ordered_by: str      # the time that decides fastest and slowest
    flops: float         # FLOP/s: the kept runs' total FLOPs / their total training time
    vflops: float        # FLOP/s: Eq. 7-8 of `flops` and `quality`
    quality: float       # mean of the kept runs' ensemble quality
    cv_flops: float      # coefficient of variation over all runs (HPC AI500 V2.0)
    cv_quality: float
    reached: int         # runs whose ensemble reached the target at some evaluation
    time_to_quality: float | None       # s, olympic mean by time to quality; None unless every run reached
    cv_epochs_to_quality: float | None  # V2.0's repeatability measure; None unless every run reached


def repeats(runs: list) -> Repeats:
    """MLPerf HPC's olympic summary of the repeated runs of one test (results.TestResult;
    target, exponent, quality direction and staging are the first run's: one test's
    runs share them). With 3 or more, drop the fastest and the slowest and summarise
    the rest; with fewer, all. Fastest by training time, or by
    time to solution when staging is on (times, so the quality's direction plays no
    part in the order; it prices the mean quality in VFLOPS) (staging is part of MLPerf's time to train).
    The kept runs' FLOPS is their total work over their total time (a mean of rates would
    weigh a short run as much as a long one), and their VFLOPS follows from that FLOPS
    and their mean quality by Eq. 7-8, so the summary row is consistent with itself.
    The coefficients of variation (sample std / mean) use every run. Time to quality
    has its own olympic mean, runs ordered by it (MLPerf's time to train), when every
    run reached the target; a run that never did has no time to average."""
    first = runs[0]
    key = "time_to_solution" if first.staging else "train_seconds"
    ordered = sorted(runs, key=lambda r: getattr(r, key))
    kept = ordered[1:-1] if len(ordered) >= 3 else ordered
    mean = lambda key, rs: sum(getattr(r, key) for r in rs) / len(rs)  # noqa: E731

    def cv(key):
        if len(runs) < 2:
            return 0.0
        m = mean(key, runs)
        var = sum((getattr(r, key) - m) ** 2 for r in runs) / (len(runs) - 1)
        return var ** 0.5 / m if m else 0.0
    fl = flops(sum(r.total_flops for r in kept), sum(r.train_seconds for r in kept))
    quality = mean("quality", kept)
    reached = sum(r.time_to_quality is not None for r in runs)
    ttq = cv_epochs = None
    if reached == len(runs):
        by_ttq = sorted(runs, key=lambda r: r.time_to_quality)
        ttq = mean("time_to_quality", by_ttq[1:-1] if len(by_ttq) >= 3 else by_ttq)
        cv_epochs = cv("epochs_to_quality")
    return Repeats(first.index, len(runs), len(kept), key, fl,
                   vflops(fl, quality, first.target_quality, first.penalty_n, first.higher_is_better), quality,
                   cv("flops"), cv("quality"), reached, ttq, cv_epochs)
