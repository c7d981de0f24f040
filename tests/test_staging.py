"""Data staging (the Data Duplicator): the union and renumbering math, the directory checks,
the workloads' progress beats, and real runs under mpirun that copy the union of a node's
jobs' resamples to a node-local directory once and train each job from it."""
import errno
import json
import subprocess
from pathlib import Path

import h5py
import numpy as np
import pytest

from harness import sampler, staging
from harness.workloads import Dataset
from tests.conftest import results

SYNTH = "synthetic:600:8"   # 480 training samples, small and quick
TRAIN = 480


# ------------------------------------------------------------------ pure parts
def test_union_and_renumbering_by_hand():
    a, b = np.array([3, 1, 3]), np.array([1, 4])
    rows = staging.union(iter([a, b]))               # a generator: merged one part at a time
    assert rows.tolist() == [1, 3, 4] and rows.dtype == np.int64
    assert staging.renumber(rows, a).tolist() == [1, 0, 1]
    assert staging.renumber(rows, b).tolist() == [0, 2]
    assert staging.union([]).tolist() == []          # a node serving no job copies nothing


@pytest.mark.parametrize("method", ["bootstrap", "poisson", "none"])
def test_union_copies_each_distinct_sample_once_and_renumbering_is_exact(method):
    jobs = [sampler.resample(1000, method, 7, j) for j in range(3)]
    rows = staging.union(jobs)
    assert np.all(np.diff(rows) > 0)                 # sorted, distinct
    assert np.array_equal(rows, np.unique(np.concatenate(jobs)))
    for idx in jobs:                                 # each job trains on its own samples, in its own order
        assert np.array_equal(rows[staging.renumber(rows, idx)], idx)
    if method == "bootstrap":                        # 1 - e^-3 of the samples: ~95 % for 3 jobs, not 3 x 63 %
        assert 0.93 < len(rows) / 1000 < 0.97
        assert 0.60 < len(staging.union(jobs[:1])) / 1000 < 0.67


def test_one_sender_per_job_on_the_node():
    # node ranks 0-6: job 0 on ranks 1, 2; job 1 on 3, 5; job 2 on 6; ranks 0 and 4 idle
    assert staging.senders([None, 0, 0, 1, None, 1, 2]) == {0: 1, 1: 3, 2: 6}
    assert staging.senders([None, None]) == {}


def test_folder_names_differ_per_run_test_rep_node_and_name_no_job():
    names = {staging.folder("/s", run, t, r, n)
             for run in ("a", "b") for t in (1, 2) for r in (0, 1) for n in (0, 1)}
    assert len(names) == 16 and all(p.startswith("/s/hpcai500-") for p in names)
    assert staging.folder("/s", "run", 3, 1, 7) == "/s/hpcai500-run-t3-r1-n7"


def test_probe_accepts_a_new_directory_and_leaves_nothing(tmp_path):
    root = tmp_path / "a" / "b"
    assert staging.probe(str(root)) > 0
    assert root.is_dir() and list(root.iterdir()) == []


def test_probe_names_an_unwritable_directory(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(staging.StagingError, match=r"staging directory .*file/sub.*: not writable"):
        staging.probe(str(blocker / "sub"))
    with pytest.raises(staging.StagingError, match="not a directory|not writable"):
        staging.probe(str(blocker))


def test_disk_full_message_names_the_directory(tmp_path):
    msg = staging._explain(OSError(errno.ENOSPC, "No space left on device"), str(tmp_path))
    assert str(tmp_path) in msg and "disk full" in msg and "MiB free" in msg


def test_digits_stage_writes_the_rows_in_its_own_format(tmp_path):
    from harness.workloads import digits
    data = digits.load(Dataset.parse("embedded"), str(tmp_path))
    rows = np.array([0, 3, 4, 10, 1000])
    nbytes = digits.stage(data, rows, str(tmp_path / "copy"))
    back = digits.read(str(tmp_path / "copy"))
    assert nbytes == sum(f.stat().st_size for f in (tmp_path / "copy").iterdir())
    assert np.array_equal(back.x_train, data.x_train[rows]) and np.array_equal(back.y_train, data.y_train[rows])
    assert np.array_equal(back.x_val, data.x_val) and np.array_equal(back.y_val, data.y_val)


@pytest.mark.parametrize("name, dataset", [("digits", "embedded"), ("ewa", "synthetic:20:32")])
def test_stage_beats_after_every_file_written(name, dataset, tmp_path):
    """The writer beats the watchdog through stage()'s progress: at least once a file, so
    that a copy longer than the watchdog's limit is not taken for a hang."""
    from harness import workloads
    wl = workloads.get(name)
    data = wl.load(Dataset.parse(dataset), str(tmp_path / "cache"))
    calls = []
    wl.stage(data, np.arange(0, data.n_train, 2), str(tmp_path / "copy"), progress=lambda: calls.append(1))
    files = [f for f in (tmp_path / "copy").rglob("*") if f.is_file()]
    assert files and len(calls) >= len(files)
    wl.stage(data, np.arange(3), str(tmp_path / "again"))   # progress is optional


# ------------------------------------------------------------------ real runs
def test_run_stages_the_union_of_the_jobs_resamples_once_per_node_and_trains_from_it(bagging_run):
    """M=2, P=2 on 4 ranks (one node): one copy, written once for both jobs, holding
    exactly the union of their distinct resampled samples; every rank read it and trained
    its own job's resample from it. (The shared run of tests/conftest.py: poisson
    resamples, the copy kept, the report in a file.)"""
    folder, r = bagging_run
    stage = folder / "stage"
    assert r.returncode == 0, r.stderr[-3000:]
    res = results(folder / "runs")
    test = res["tests"][0]
    st = test["staging"]
    assert st["copies"] == 1 and st["kept"] and st["dir"] == str(stage)
    from harness.workloads import digits
    n = digits.load(Dataset.parse("embedded"), "").n_train
    jobs = [np.unique(sampler.resample(n, "poisson", 42, j)) for j in range(2)]
    union = np.union1d(*jobs)
    assert max(map(len, jobs)) < len(union) < sum(map(len, jobs))   # the jobs share samples: copied once
    assert st["samples"] == len(union)
    (path,) = st["paths"]
    assert [p.name for p in stage.iterdir()] == [Path(path).name] and Path(path).parent == stage
    assert Path(path).name == f"hpcai500-{Path(res['run_dir']).name}-t1-r0-n0"   # one per node: no job in it
    with h5py.File(Path(path) / "train.h5") as f:
        assert len(f["labels"]) == len(union)
    assert st["bytes"] == sum(f.stat().st_size for f in Path(path).iterdir())
    # the results record each job's resample itself, not its renumbering into the copy
    drawn = [sampler.resample(n, "poisson", 42, j) for j in range(2)]
    assert [(x["size"], x["digest"]) for x in test["resample"]] == [(len(d), sampler.digest(d)) for d in drawn]
    wall = test["evaluations"][-1]["seconds"]      # rank 0: start of training to the end of the last evaluation
    assert test["time_to_solution"] == pytest.approx(st["seconds"] + wall) and wall >= test["train_seconds"]
    assert test["consistency"]["passed"] and test["quality"] > 0.2   # chance is 0.1
    report = (folder / "report.out").read_text()
    assert "Staging     : 1 copy (one per node)" in report and "time to solution" in report
    log = next((Path(res["run_dir"]) / "mllog").glob("*model0000.log")).read_text()
    events = [json.loads(line.split(":::MLLOG ", 1)[1])["key"] for line in log.splitlines()]
    assert events.index("staging_start") < events.index("staging_stop") < events.index("run_start")


def test_run_trains_from_the_copy(sweep_runs):
    """The node's copy holds the job's distinct samples (the union of one resample), the
    resample renumbered into it (staging.renumber, whatever the workload); without 'keep'
    it is gone after the test; the time to solution adds the copy's time. (ic, M=1, P=2,
    with and without staging: the shared runs of tests/conftest.py; tests/test_ic.py
    asserts the two trainings bit-identical.)"""
    folder, a, b = sweep_runs
    assert a.returncode == 0 and b.returncode == 0, (a.stderr[-2000:], b.stderr[-2000:])
    (with_staging,) = results(folder / "staged")["tests"]
    plain = next(t for t in results(folder / "runs")["tests"] if t["P"] == 2)
    assert (with_staging["workload"], with_staging["M"], with_staging["P"]) == ("ic", 1, 2)
    expected = np.unique(sampler.resample(with_staging["train_samples"], "bootstrap", 42, 0))
    st = with_staging["staging"]
    assert st["copies"] == 1 and st["samples"] == len(expected)
    (path,) = st["paths"]
    assert "-j" not in Path(path).name and Path(path).name.endswith("-t1-r0-n0")
    assert list((folder / "stage").iterdir()) == []            # removed after the test
    for t, copy_seconds in ((with_staging, st["seconds"]), (plain, 0.0)):   # staging + wall to the last evaluation
        wall = t["evaluations"][-1]["seconds"]
        assert t["time_to_solution"] == pytest.approx(copy_seconds + wall) and wall >= t["train_seconds"]
    assert plain["staging"] is None


def test_unwritable_staging_directory_fails_before_training(run_dat, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    r = run_dat(2, l8=SYNTH, l9="1", l10="1", l11="1", l28=str(blocker / "stage"), l30="0")
    assert r.returncode != 0
    assert ":28" in r.stderr and "not writable" in r.stderr and str(blocker) in r.stderr
    assert "Traceback" not in r.stderr
    runs = tmp_path / "runs"  # refused before the data is loaded: no run folder, no cache either
    assert not runs.exists() or [p for p in runs.iterdir() if not p.name.startswith(".")] == []


@pytest.fixture
def tiny_disk(tmp_path):
    """A real 64 KiB file system (tmpfs), so that the copy meets a real ENOSPC."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.decode().strip()})")
    yield mnt
    subprocess.run(["umount", str(mnt)], check=False)


def test_full_disk_fails_the_test_cleanly(run_dat, tmp_path, tiny_disk):
    r = run_dat(2, l8="synthetic:4000:8", l9="1", l10="2", l11="1", l15="1", l28=str(tiny_disk), l30="0")
    assert r.returncode != 0
    assert "disk full" in r.stderr and str(tiny_disk) in r.stderr and "Traceback" not in r.stderr
    assert list(tiny_disk.iterdir()) == []        # nothing half-written left behind
    res = results(tmp_path / "runs")
    assert res["status"] == "interrupted" and "disk full" in res["interrupted"]["reason"]
    assert res["tests"] == []
