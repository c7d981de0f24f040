"""The report and --summarize at 4,096 ranks: per-rank and per-model detail stays in
results.json, the report summarises it (min/mean/max, one row a test), so its size does
not grow with M. A real run's test (conftest's bagging_run) is blown up to M = 4,096 jobs
of one rank and fed to the report's own rendering functions."""
import json

import pytest

from harness import report
from harness.results import TestResult as Result   # not "Test...": pytest would collect it
from tests.conftest import results

RANKS = 4096


def _at_scale(t: dict, M: int, P: int) -> dict:
    """Test `t` as if run with M jobs of P ranks: every per-job and per-rank list that
    long, the figures as they were."""
    def per_job(values):
        return [values[j % len(values)] for j in range(M)]
    return {**t, "M": M, "P": P, "jobs": [list(range(j * P, (j + 1) * P)) for j in range(M)], "idle_ranks": [],
            "base_quality": per_job(t["base_quality"]), "final_loss": per_job(t["final_loss"]),
            "steps_per_epoch": per_job(t["steps_per_epoch"]), "resample": per_job(t["resample"]),
            "exchange": per_job(t["exchange"]),
            "weights_digest": [[d[0]] * P for d in per_job(t["weights_digest"])],
            "evaluations": [{**e, "base_quality": per_job(e["base_quality"])} for e in t["evaluations"]]}


@pytest.mark.mpi
def test_report_and_summarize_do_not_grow_with_the_ranks(bagging_run, tmp_path):
    folder, p = bagging_run
    assert p.returncode == 0, p.stderr[-2000:]
    record = results(folder / "runs")
    small = record["tests"][0]
    big = Result(**_at_scale(small, RANKS, 1))
    # one test's block: the same lines, each at most a few digits longer
    a, b = report.row(Result(**small)).splitlines(), report.row(big).splitlines()
    assert len(a) == len(b)
    assert all(len(y) <= len(x) + 8 for x, y in zip(a, b)), [y for x, y in zip(a, b) if len(y) > len(x) + 8]
    assert f"{small['aggregation']} of {RANKS} model(s)" in report.row(big)
    # the footer of a sweep of 4,096-rank layouts: the paper's experiments, a line a layout
    sweep = [{**_at_scale(small, m, RANKS // m), "index": i} for i, m in enumerate((RANKS, 64, 1), 1)]
    lines = report.summary_lines([Result(**t) for t in sweep], [])
    assert any(f"Sys_scale {RANKS}" in ln for ln in lines) and len(lines) <= 2 * (3 + 3) + 2, lines
    assert max(map(len, lines)) <= 100
    # --summarize: one row a test, as wide as a 4-rank run's
    for name, tests in (("run-4", [small]), ("run-4096", sweep)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps({**record, "tests": tests}))
    text = report.summarize([str(tmp_path / "run-4"), str(tmp_path / "run-4096")])
    rows = [ln for ln in text.splitlines() if ln.startswith("run-") and ln.endswith(("PASSED", "FAILED"))]
    assert len(rows) == 4 and len({len(r) for r in rows}) == 1, rows
    assert max(map(len, text.splitlines())) <= len(rows[0])
    # and each run's state after its rows, one line however many tests
    assert [ln.split()[:2] for ln in text.splitlines() if ln.startswith("run-") and ln not in rows] == \
        [["run-4", "complete:"], ["run-4096", "complete:"]]
