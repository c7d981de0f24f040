"""Quality along the way (lines 31-32): evaluations every K epochs, time to quality,
stop at target, and the paper's two experiments in the report (bagging against data
parallelism, quality against speed at a fixed scale), under a real mpirun; the pure
parts (metrics.first_reaching, train.evaluation_epochs, the repetition summary) are
tests/test_ensemble_metrics.py's, the experiments' lines tests/test_experiments.py's."""
import json

import pytest

from harness import verify
from tests.conftest import results


@pytest.fixture(scope="module")
def stop_run(tmp_path_factory):
    """2 ranks, bagging (M=2, P=1) and data parallelism (M=1, P=2) at Sys_scale 2, up to
    4 epochs, an evaluation after every epoch, stop at a target of 0.5 (the bagged pair
    measured 0.955 after epoch 1: it stops there)."""
    from tests.conftest import dat_text, mpirun
    folder = tmp_path_factory.mktemp("ttq")
    (folder / "t.dat").write_text(dat_text(l5=folder / "runs", l9=2, l10="2 1", l11="1 2", l15=4, l25=0.5,
                                           l30=0, l31=1, l32=1))
    return folder, mpirun(2, [str(folder / "t.dat")], folder)


@pytest.mark.mpi
def test_training_stops_at_the_first_evaluation_that_reaches_the_target(stop_run):
    folder, p = stop_run
    assert p.returncode == 0, p.stderr[-3000:]
    res = results(folder / "runs")
    bagged, dp = res["tests"]
    for t in (bagged, dp):
        ev = t["evaluations"]
        assert [e["epoch"] for e in ev] == list(range(1, t["epochs_trained"] + 1))   # every epoch, then stopped
        assert t["epochs_to_quality"] == t["epochs_trained"] and t["time_to_quality"] == ev[-1]["seconds"]
        assert all(e["quality"] < 0.5 for e in ev[:-1]) and ev[-1]["quality"] >= 0.5 == t["target_quality"]
        assert t["quality"] == ev[-1]["quality"] and t["base_quality"] == ev[-1]["base_quality"]
        assert len(ev[-1]["base_quality"]) == t["M"]
        assert [e["seconds"] for e in ev] == sorted(e["seconds"] for e in ev)
        assert ev[-1]["seconds"] >= t["train_seconds"]          # the wall holds the training time
        steps = t["steps_per_epoch"]
        assert t["samples_trained"] == sum(steps) * t["epochs_trained"] * t["B"] * t["P"]   # the epochs trained only
        assert f"Time to Q   : {t['time_to_quality']:.2f} s, epoch {t['epochs_to_quality']} of 4" in p.stdout
    assert bagged["epochs_trained"] < 4                       # stopped early: 0.955 after epoch 1 when measured
    assert "training stops at the first evaluation that reaches the target (line 32)" in p.stdout
    assert p.stderr.count("reached: stopping") == 2
    # one MLLOG evaluation per epoch trained, numbered, in every base model's log
    (run,) = [d for d in (folder / "runs").iterdir() if not d.name.startswith(".")]
    for t in (bagged, dp):
        for job in range(t["M"]):
            log = (run / "mllog" / f"test{t['index']:03d}_rep00_model{job:04d}.log").read_text()
            evs = [json.loads(ln.split(":::MLLOG ", 1)[1]) for ln in log.splitlines()]
            acc = [e for e in evs if e["key"] == "eval_accuracy"]
            assert [e["metadata"]["epoch_num"] for e in acc] == list(range(1, t["epochs_trained"] + 1))
            assert evs[-1]["key"] == "run_stop" and evs[-1]["metadata"]["status"] == "success"


@pytest.mark.mpi
def test_the_report_compares_bagging_with_data_parallelism_and_lays_out_the_trade_off(stop_run):
    """M=2, P=1 and M=1, P=2 share Sys_scale 2: one Fig. 9 comparison, one Fig. 7 table,
    their figures the tests' own; the charts in the run folder."""
    folder, p = stop_run
    assert p.returncode == 0, p.stderr[-3000:]
    res = results(folder / "runs")
    bagged, dp = res["tests"]
    out = p.stdout.splitlines()
    i = out.index("Bagging vs data parallelism (digits, B 32, fp32, Sys_scale 2):")
    dp_row, bag_row = out[i + 2].split(), out[i + 3].split()
    assert dp_row[:4] == ["DP", "2", "1", "2"] and bag_row[:4] == ["bagging", "1", "2", "1"]
    assert bag_row[7] == f"x{bagged['flops'] / dp['flops']:.2f}" and bag_row[8] == f"x{bagged['vflops'] / dp['vflops']:.2f}"
    assert bag_row[9] == f"x{bagged['time_to_quality'] / dp['time_to_quality']:.2f}"
    j = out.index("Quality vs speed at Sys_scale 2 (digits, B 32, fp32):")
    rows = [out[j + 2].split(), out[j + 3].split()]
    assert [r[:3] for r in rows] == [["1", "2", "1"], ["2", "1", "2"]]          # M descending
    assert [float(r[3]) for r in rows] == [round(bagged["quality"], 4), round(dp["quality"], 4)]
    run = next(d for d in (folder / "runs").iterdir() if not d.name.startswith("."))
    assert res["charts"] == ["tradeoff.png", "quality-test001.png", "quality-test002.png"]   # one scale: no scaling.png
    assert all((run / c).read_bytes()[:4] == b"\x89PNG" for c in res["charts"])


@pytest.mark.mpi
def test_the_stopped_run_verifies(stop_run):
    """--verify re-derives the evaluation epochs, the epochs trained, the time to quality."""
    import io
    folder, p = stop_run
    assert p.returncode == 0, p.stderr[-3000:]
    (run,) = [d for d in (folder / "runs").iterdir() if not d.name.startswith(".")]
    out = io.StringIO()
    assert verify.main(str(run), out=out) == 0, out.getvalue()
    text = out.getvalue()
    for what in ("evaluated after epochs [1, 2, 3, 4] (line 31)", "epochs trained", "time to quality = the first"):
        assert what in text, what
