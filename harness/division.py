"""Divisions: which tests are ranking (closed) results, and why the others are open.

As MLPerf's closed and open divisions. A closed result is comparable across machines:
  * a ranking workload (ic, ewa: HPC AI500 V2.0's; digits is a demonstration and
    cosmoflow and deepcam MLPerf HPC's workloads bagged, all three always open),
  * on its published data set read from a path (not `synthetic`, not `embedded`): the
    harness's marker is not there (it wrote the data, `workloads.marker`: a path to
    generated data is still generated data), and every fact of the set the workload's
    PUBLISHED states (ImageNet's 1,000 classes, 1,281,167 training and 50,000 validation
    images; ewa's 1,460 images a year file) is the data's (`data_reasons`, from the facts
    the workload's data_facts gives, which results.json records so that --verify judges
    them again),
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


# Facts a workload's data_facts always gives (harness/workloads/__init__.py), and the words of
# each fact PUBLISHED may state: (what the number counts, what the published set has)
FACT_KEYS = ("marker", "train_samples", "val_samples")
WORDS = {"classes": ("classes", "{name} has {want}"),
         "train_samples": ("training samples", "{name}'s training set has {want}"),
         "val_samples": ("validation samples", "{name}'s validation set has {want}"),
         "images_per_file": ("images a file", "{name}'s files hold {want} each")}


def judge(*, workload: str, dataset_kind: str, deviations: list[str], test_only: list[str],
          target: float, default_target: float, n: float, default_n: float,
          repetitions: int, data_facts: dict | None, published: dict) -> tuple[str, list[str]]:
    """("closed", []) or ("open", reasons). `dataset_kind`: embedded | synthetic | path;
    `target`/`n`: lines 25-26 (-1 = the workload's default); `data_facts`/`published`: the
    workload's data_facts of the data read and its PUBLISHED (data_reasons)."""
    reasons = []
    if workload not in RANKING_WORKLOADS:
        what = NOT_RANKING.get(workload, "not a ranking workload")
        reasons.append(f"{workload} is {what} (ranking: {', '.join(RANKING_WORKLOADS)})")
    if dataset_kind != "path":   # the one reason: what it holds is the harness's (or the embedded set)
        reasons.append(f"{dataset_kind} data (a ranking result reads the real data set from a path)")
    else:
        reasons += data_reasons(data_facts, published)
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


def data_reasons(facts: dict | None, published: dict) -> list[str]:
    """Why the data read from a path is not the workload's published set, [] where it is:
    the harness's marker found with it (hpcai500 wrote it: synthetic data, or a staged
    copy), a fact data_facts gives always missing, or a fact `published` states that the
    data's is not (a tuple there: the published versions' values; a list of the data's, as
    ewa's images a file: each must be one of them). `facts` None: a record of results
    schema < 2.17, which holds none: judged without them."""
    if facts is None:
        return []
    name = published["name"]
    out = [f"data facts without {key} (harness/workloads data_facts gives it)" for key in FACT_KEYS
           if key not in facts]
    if facts.get("marker"):
        out.append(f"data written by hpcai500 ({facts['marker']}), not the published {name}")
    for key, want in published.items():
        if key == "name":
            continue
        got = facts.get(key)
        if not _matches(got, want):
            what, has = WORDS.get(key, (key, "{name} has {want}"))
            shown = "unknown" if got is None else _count(got)
            out.append(f"{shown} {what}, {has.format(name=name, want=_count(want))}")
    return out


def _matches(got, want) -> bool:
    wants = want if isinstance(want, tuple) else (want,)
    values = got if isinstance(got, list) else [got]
    return got is not None and bool(values) and all(v in wants for v in values)


def _count(value) -> str:
    """A fact's value in words: 1,000; a list or tuple of them joined (64 or 65)."""
    if isinstance(value, (list, tuple)):
        return " or ".join(_count(v) for v in value)
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)


def facts_line(facts: dict) -> str:
    """The report's conventions line of a workload's data facts (`<workload>: ` before it):
    results.json's conventions hold them beside each test's data_facts, so that --verify
    finds an edit of either (harness/verify.py)."""
    shown = "; ".join(f"{k} {'none' if v is None else _count(v)}" for k, v in sorted(facts.items()))
    return f"data facts (the division's, harness/division.py): {shown}"


def with_losses(verdict: str, reasons: list[str], lost: int, models: int) -> tuple[str, list[str]]:
    """A test's division once `lost` of its `models` base models were dropped to faults
    (harness/elastic.py): open, since the ensemble measured is not the one the input asked
    for (fewer models, and which ones is chance, not the sweep); unchanged without losses."""
    if not lost:
        return verdict, reasons
    return "open", [*reasons, f"{lost} of {models} base models lost to faults and dropped (--on-fault drop):"
                               " the ensemble measured is not the one the input asked for"]
