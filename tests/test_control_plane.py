"""The control plane's own figures (issue 15, bench/scale.py reads them): what rank 0
spends gathering, reducing and writing, its peak memory and the ranks' start-up, in
results.json; and the per-job digests grouped in one pass."""
from harness import run, telemetry
from tests.conftest import results


def test_digests_grouped_by_job_in_rank_order():
    # PMAP round-robin, M = 2 jobs of 2 ranks: job 0 = ranks 0, 2; job 1 = ranks 1, 3; records unordered
    workers = [run.RankRecord(3, 1, weights="d"), run.RankRecord(0, 0, weights="a"),
               run.RankRecord(2, 0, weights="c"), run.RankRecord(1, 1, weights="b")]
    assert run.digests_by_job(workers, 2) == [["a", "c"], ["b", "d"]]
    assert run.digests_by_job([], 3) == [[], [], []]


def test_startup_summary_names_the_slowest_rank_and_rank_0():
    s = telemetry.startup_summary([4.0, 6.0, 5.0])
    assert s == {"min": 4.0, "mean": 5.0, "max": 6.0, "rank0": 4.0, "ranks": 3}
    assert 0 < telemetry.startup_seconds() < 24 * 3600   # this process: created before now


def test_a_real_run_records_the_control_planes_figures(bagging_run):
    """conftest's shared 4-rank run (M = 2 x P = 2, 2 epochs evaluated at the end, staged)."""
    folder, p = bagging_run
    assert p.returncode == 0, p.stderr[-3000:]
    res = results(folder / "runs")
    (t,) = res["tests"]
    assert 0 < t["reduce_seconds"] < t["eval_seconds"]            # the reduction is part of the evaluation
    assert 0 < t["gather_seconds"] < 60                            # a hang bound: a gather of 4 records takes ms
    assert 200 * 2**20 < t["rank0_peak_rss_bytes"] < 8 * 2**30   # TensorFlow is loaded on rank 0
    assert len(res["write_seconds"]) == len(res["tests"]) and res["write_seconds"][0] > 0
    s = res["environment"]["startup_seconds"]
    assert s["ranks"] == 4 and 0 < s["min"] <= s["rank0"] <= s["max"]
    assert s["min"] <= s["mean"] <= s["max"]
