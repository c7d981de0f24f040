"""Divisions: which tests are ranking (closed) results, and why the others are open.

As MLPerf's closed and open divisions. A closed result is comparable across machines:
  * a ranking workload (ic, ewa: HPC AI500 V2.0's; digits is a demonstration and
    cosmoflow and deepcam MLPerf HPC's workloads bagged, all three always open),
  * on its real data read from a path (not `synthetic`, not `embedded`),
  * with the workload's reference model (no test-only setting; the workload's own
    `describe_model` lists any other deviation, e.g. a reduced ResNet or ewa's small
    backbone),
  * at the workload's default target quality and penalty exponent n (lines 25-26),
  * with enough repetitions for the olympic summary: 5, MLPerf HPC's minimum.
Everything Table 2 of the V3.0 paper leaves to the user (M, P, B, epochs, optimizer,
precision, communication, staging) is free in both divisions: VFLOPS prices quality.
Anything else is open, with every reason listed. Pure functions.
"""
from __future__ import annotations

RANKING_WORKLOADS = ("ic", "ewa")
# why another workload is open: name -> what it is
NOT_RANKING = {"digits": "a demonstration workload",
               "cosmoflow": "MLPerf HPC's workload, bagged here, not an HPC AI500 V2.0 ranking workload",
               "deepcam": "MLPerf HPC's workload, bagged here, not an HPC AI500 V2.0 ranking workload"}
MIN_REPETITIONS = 5   # MLPerf HPC's minimum for the olympic summary (seed paper 004)


def judge(*, workload: str, dataset_kind: str, deviations: list[str], test_only: list[str],
          target: float, default_target: float, n: float, default_n: float,
          repetitions: int) -> tuple[str, list[str]]:
    """("closed", []) or ("open", reasons). `dataset_kind`: embedded | synthetic | path;
    `target`/`n`: lines 25-26 (-1 = the workload's default)."""
    reasons = []
    if workload not in RANKING_WORKLOADS:
        what = NOT_RANKING.get(workload, "not a ranking workload")
        reasons.append(f"{workload} is {what} (ranking: {', '.join(RANKING_WORKLOADS)})")
    if dataset_kind != "path":
        reasons.append(f"{dataset_kind} data (a ranking result reads the real data set from a path)")
    reasons += [f"not the reference model: {d}" for d in deviations]
    reasons += [f"test-only setting {s}" for s in test_only]
    if target not in (-1, default_target):
        reasons.append(f"target quality {target:g}, not the workload's {default_target:g} (line 25)")
    if n not in (-1, default_n):
        reasons.append(f"penalty exponent n {n:g}, not the workload's {default_n:g} (line 26)")
    if repetitions < MIN_REPETITIONS:
        reasons.append(f"{repetitions} repetition(s), fewer than the {MIN_REPETITIONS} of the olympic summary"
                       " (line 27)")
    return ("open", reasons) if reasons else ("closed", [])


def with_losses(verdict: str, reasons: list[str], lost: int, models: int) -> tuple[str, list[str]]:
    """A test's division once `lost` of its `models` base models were dropped to faults
    (harness/elastic.py): open, since the ensemble measured is not the one the input asked
    for (fewer models, and which ones is chance, not the sweep); unchanged without losses."""
    if not lost:
        return verdict, reasons
    return "open", [*reasons, f"{lost} of {models} base models lost to faults and dropped (--on-fault drop):"
                               " the ensemble measured is not the one the input asked for"]
