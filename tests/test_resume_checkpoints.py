"""An interrupted test goes on from its base models' checkpoints (issue 70), for real: PyTorch
and TensorFlow under mpirun, 2 ranks, M = 2 base models of P = 1 on digits, 16 epochs evaluated
after each, and PyTorch's one model cut into 2 stages (line 37's pipeline: each stage's own state).
The run writes a checkpoint of each model after every evaluation but the last, says what they
cost, and removes them once the test's result is written; SIGUSR1 to mpirun once both models
have written theirs after epoch 2 interrupts the run; `--resume` goes on from the newest
epoch both have, trains the epochs after it alone and ends with the weights an uninterrupted
run has (P = 1 on a CPU, one thread a rank: deterministic), every sample counted once, each model's MLLOG one
log with each epoch once, and --verify passes."""
import io
import json
import signal
import time

import pytest

from harness import checkpoint, verify
from tests.conftest import (HANG, dat_text, mllog_events, mpirun, mpirun_ended, mpirun_says, mpirun_started,
                            results, run_dir)

# M = 2 of P = 1, 16 epochs: the signal after epoch 2 comes with 14 left (a digits epoch: ~0.3 s here)
LINES = dict(l9=1, l10="2", l11="1", l15=16, l30=0, l31=1)


def _epochs_logged(run, job: int) -> list[int]:
    """The epoch_start epochs of base model `job`'s MLLOG in test 1."""
    events = mllog_events(run / "mllog" / f"test001_rep00_model{job:04d}.log")
    return [e["metadata"]["epoch_num"] for e in events if e["key"] == "epoch_start"]


def _verified(run) -> None:
    out = io.StringIO()
    assert verify.main(str(run), out=out) == 0, out.getvalue()


@pytest.mark.slow
@pytest.mark.parametrize("framework,mode", [("pytorch", {}), ("tensorflow", {}),
                                            # one model of 2 stages, one a rank: each stage's own state
                                            ("pytorch", {"l10": "1", "l11": "2", "l37": "pipeline"})],
                         ids=["pytorch", "tensorflow", "pytorch-pipeline"])
def test_an_interrupted_test_goes_on_from_its_checkpoints_to_the_uninterrupted_weights(tmp_path, framework, mode):
    pytest.importorskip({"pytorch": "torch", "tensorflow": "tensorflow"}[framework])
    lines = {**LINES, "l35": framework, **mode}
    M = int(lines["l10"])
    whole = tmp_path / "whole"
    whole.mkdir()
    (whole / "t.dat").write_text(dat_text(l5=whole / "runs", **lines))
    p = mpirun(2, [whole / "t.dat"], whole)
    assert p.returncode == 0, p.stderr[-3000:]
    plain = results(whole / "runs")["tests"][0]
    # M models x the evaluations after epochs 1-15: the 16th ends training
    assert plain["checkpoints"]["written"] == 15 * M and plain["checkpoints"]["refused"] == [], plain["checkpoints"]
    assert plain["resumed"] is None
    assert not (run_dir(whole / "runs") / checkpoint.FOLDER / "test-1-rep-0").exists()   # gone with the result
    assert f"Checkpoints : {15 * M} written" in (run_dir(whole / "runs") / "report.txt").read_text()

    p = mpirun_started(tmp_path, 2, [], **lines)
    mpirun_says(p, tmp_path, "evaluation after epoch 2")
    run = run_dir(tmp_path / "runs")
    where = checkpoint.folder(str(run), 1, 0)
    deadline = time.monotonic() + HANG
    while not all((checkpoint.epochs(where, job) or [0])[0] >= 2 for job in range(M)):   # each model's newest
        assert p.poll() is None and time.monotonic() < deadline, (tmp_path / "err.txt").read_text()[-3000:]
        time.sleep(0.05)
    p.send_signal(signal.SIGUSR1)
    assert mpirun_ended(p, tmp_path).returncode != 0
    before = json.loads((run / "results.json").read_text())
    assert before["status"] == "interrupted" and before["tests"] == [], before["interrupted"]
    assert checkpoint.load_test(str(run), 1, 0)["curve"][0]["epoch"] == 1

    p = mpirun(2, ["--resume", run, tmp_path / "t.dat"], tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    t = json.loads((run / "results.json").read_text())["tests"][0]
    epoch = t["resumed"]["epoch"]
    assert 2 <= epoch <= 15 and f"going on from its {M} base models' checkpoints after epoch {epoch}" in p.stderr
    assert t["weights_digest"] == plain["weights_digest"]                  # the uninterrupted weights
    assert t["samples_trained"] == plain["samples_trained"]                 # each sample once
    assert [x["epoch"] for x in t["evaluations"]] == list(range(1, 17))   # one curve, its clock on
    assert t["evaluations"][epoch]["seconds"] > t["evaluations"][epoch - 1]["seconds"] + t["resumed"]["lost_seconds"]
    assert t["train_seconds"] > t["resumed"]["seconds_before"] + t["resumed"]["lost_seconds"] > 0
    assert t["checkpoints"]["written"] == M * (15 - epoch)                 # this invocation's
    for job in range(M):
        assert _epochs_logged(run, job) == list(range(1, 17))               # not trained again, one log
    assert "Resumed     : from its base models' checkpoints after epoch" in (run / "report.txt").read_text()
    assert not (run / checkpoint.FOLDER / "test-1-rep-0").exists()
    _verified(run)
