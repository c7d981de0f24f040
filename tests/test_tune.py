"""--tune (harness/tune.py): the search space read from the input, the plan, the fidelities,
the promotions, the tuned file; the search's mechanics with a stand-in for the trials (in
process, Optuna's real study); and real tuning runs under mpirun: its stages, the tuned file
that runs and verifies, a resume, a refused space, a lost rank.

The tests assert mechanics, never that a pick is the fastest: that is bench/tune.py's."""
from __future__ import annotations

import json
import re
import subprocess
from dataclasses import replace

import pytest

from harness import dat, heartbeat, tune
from tests.conftest import dat_text, mpi_env, mpirun, mpirun_cmd, run_dir

# A space of 2 speed x 4 quality candidates: layouts M 1 and 2 of P 1, B 16 and 32, the
# all-reduce ring or hierarchical; 4 epochs of digits, the roofline off.
SPACE = dict(l9=2, l10="1 2", l11="1 1", l13=2, l14="16 32", l15=4, l22="ring hierarchical", l30=0)


def _cfg(**lines) -> dat.Config:
    return dat.parse_text(dat_text(**{**SPACE, **lines}), "t.dat", tune=True)


# -- the space ---------------------------------------------------------------------------
def test_a_single_line_lists_a_space_under_tune_only():
    text = dat_text(l18="sgd adam", l19="0.05 0.1")
    with pytest.raises(dat.DatError) as e:
        dat.parse_text(text, "t.dat")
    assert str(e.value) == ("t.dat:18: found 'adam', expected an optimizer alone after 'sgd' (several values are a"
                            " search space, read by --tune only)")
    cfg = dat.parse_text(text, "t.dat", tune=True)
    assert (cfg.optimizer, cfg.base_lr) == ("sgd", 0.05)   # the first value, as a run of the file would read
    assert dict(cfg.alternatives) == {"optimizer": ("sgd", "adam"), "base_lr": (0.05, 0.1)}
    assert "OPTIM   : sgd (--tune also: adam)" in dat.describe(cfg)
    with pytest.raises(dat.DatError, match=r"t.dat:22: found 'ring', expected each an all-reduce once"):
        dat.parse_text(dat_text(l22="ring hierarchical ring"), "t.dat", tune=True)
    assert "alternatives" not in dat.record(dat.parse_text(dat_text(), "t.dat"))   # a sweep's record as before 2.21


def test_the_space_its_kinds_and_what_it_refuses():
    cfg = _cfg()
    assert [(a.field, a.kind, a.values) for a in tune.varied(cfg)] == [
        ("layouts", "quality", ((1, 1), (2, 1))), ("batch_sizes", "quality", (16, 32)),
        ("allreduce", "speed", ("ring", "hierarchical"))]
    speed, quality = tune.choices(cfg, "speed"), tune.choices(cfg, "quality")
    assert (len(speed), len(quality)) == (2, 4)      # 2 x 2 x 1 x ... quality; ring, hierarchical
    assert speed[1]["allreduce"] == "hierarchical" and quality[3]["layouts"] == (2, 1) and quality[3]["batch_sizes"] == 32
    assert tune.space_problem(cfg) is None
    assert tune.space_problem(dat.parse_text(dat_text(l9=1, l10=1, l11=1), "t.dat", tune=True)).startswith(
        "t.dat: found no line listing several values, expected a search space under --tune")
    two = dat.parse_text(dat_text(l6=2, l7="digits ic"), "t.dat", tune=True)
    assert tune.space_problem(two).startswith("t.dat:6: found 2 workloads, expected 1 under --tune")
    # a candidate the world cannot hold is left out, with the sweep's reason
    speed, runs, cannot = tune.survey(_cfg(l10="1 4"), 2, 1438)
    assert len(runs) == 2 and [c["layouts"] for c, _ in cannot] == [(4, 1), (4, 1)]
    assert cannot[0][1].startswith("t.dat:10-11: found '4 x 1', expected M x P <= 2")
    # a speed setting that cannot run on the probes' reference is no probe: PyTorch has no hierarchical all-reduce
    speed, runs, cannot = tune.survey(_cfg(l34=2, l35="tensorflow pytorch"), 2, 1438)
    assert [(s["allreduce"], s["frameworks"]) for s in speed] == [("ring", "tensorflow"), ("ring", "pytorch"),
                                                                 ("hierarchical", "tensorflow")]
    assert [c.get("frameworks") for c, _ in cannot] == ["pytorch"] and "pytorch" in cannot[0][1]


def test_a_trial_is_the_input_with_one_value_a_knob_its_warm_up_compressed():
    cfg = _cfg(l18="sgd adam", l20=2)
    choice = {**tune.choices(cfg, "quality")[-1], **tune.choices(cfg, "speed")[1]}
    t = tune.configure(cfg, choice, 2)
    assert (t.layouts, t.batch_sizes, t.optimizer, t.allreduce, t.epochs, t.repetitions, t.alternatives) == \
        (((2, 1),), (32,), "adam", "hierarchical", 2, 1, ())
    assert t.warmup_epochs == 1.0      # 2 warm-up epochs of 4, over 2 epochs: 1
    test = tune.test_of(t, choice, 7)
    assert (test.index, test.M, test.P, test.batch, test.tv(t)) == (7, 2, 1, 32, "B32C32AH")
    assert tune.outside(cfg, choice) == [] and tune.outside(cfg, {**choice, "batch_sizes": 64}) == ["batch_sizes 64"]


# -- the plan --------------------------------------------------------------------------------
def test_the_plan_halves_by_three_and_refuses_a_budget_too_small():
    plan = tune.stages(4, 16, 10)
    # 16 -> ceil(16/3) = 6 -> ceil(6/3) = 2 finalists; probes, 2 search stages, the final
    assert [(s.name, s.trials) for s in plan] == [("probes", 4), ("stage 1", 16), ("stage 2", 6), ("final", 2)]
    assert tune.planned_trials(plan) == 1 + 4 + 16 + 6 + 2
    assert [s.trials for s in tune.stages(1, 3, 4)] == [3]   # 3 candidates: all finalists, no search
    assert tune.budget_problem(plan, 29 * tune.MIN_TRIAL_SECONDS) is None
    why = tune.budget_problem(plan, 120.0)   # 29 trials x 5 s = 145 s needed
    assert why == ("--tune 2: found a budget of 2.0 min (120 s), expected at least 2.4 min (145 s) (29 trials planned,"
                   " 5 s of machine time each at least): 25 s more, or fewer values on the lines that list several")


def test_fidelities_promotions_and_the_final_budget():
    assert tune.epochs_for(10.0, 3.0, 20) == 3 and tune.epochs_for(1.0, 3.0, 20) == 1
    assert tune.epochs_for(100.0, 3.0, 20) == 20
    cal = {"choice": {"layouts": (1, 2)}, "epoch_seconds": 4.0, "overhead": 1.5}
    assert tune.predicted_epoch(cal, {"layouts": (2, 4)}) == 2.0   # 4 s x P 2 / P 4
    # a trial that differs in the layout alone predicts better than the calibration: 3 s at P 1, so 0.75 s at P 4
    rows = [{"choice": {"layouts": "1x1", "batch_sizes": 64}, "train_seconds": 6.0, "epochs_trained": 2, "fault": None},
            {"choice": {"layouts": "2x1", "batch_sizes": 32}, "train_seconds": 9.0, "epochs_trained": 1, "fault": None}]
    assert tune.predicted_epoch(cal, {"layouts": (1, 4), "batch_sizes": 64}, rows) == 0.75
    assert tune.predicted_epoch(cal, {"layouts": (1, 4), "batch_sizes": 16}, rows) == 2.0   # none alike
    rows = [{"number": 1, "vflops": 5.0, "fault": None}, {"number": 2, "vflops": 7.0, "fault": None},
            {"number": 3, "vflops": 9.0, "fault": "lost"}, {"number": 4, "vflops": 7.0, "fault": None}]
    assert [r["number"] for r in tune.promoted(rows, 2)] == [2, 4]   # the faulted 9 never compared; ties: earlier
    # the final's cost: the 2 costliest of 3 entrants' full trainings (10 epochs) plus a trial's fixed costs
    entrants = [{"layouts": (1, 1)}, {"layouts": (1, 2)}, {"layouts": (1, 4)}]
    last = {tune.label(entrants[0]): {"train_seconds": 30.0, "epochs_trained": 10}}   # measured: 3 s an epoch
    assert tune.final_cost(entrants, last, cal, 10, 2) == (40.0 + 1.5) + (30.0 + 1.5)   # P 2 predicted 4 s an epoch


def test_the_tuned_file_is_the_input_with_one_value_a_line():
    cfg = _cfg(l18="sgd adam", l28="none /tmp/x keep")
    pick = next(c for c in tune.choices(cfg, "quality") if c["layouts"] == (2, 1) and c["batch_sizes"] == 32
                and c["optimizer"] == "adam")
    best = {"choice": {**{k: tune.encode(k, v) for k, v in pick.items()},
                       **{k: tune.encode(k, v) for k, v in tune.choices(cfg, "speed")[-1].items()}}}
    text = tune.tuned_text(cfg, best, "tuned title\nhow it was found")
    out = dat.parse_text(text, "tuned.dat")   # an ordinary input: no --tune
    assert (out.layouts, out.batch_sizes, out.optimizer, out.allreduce, out.staging, out.staging_keep) == \
        (((2, 1),), (32,), "adam", "hierarchical", "/tmp/x", True)
    lines = text.split("\n")
    assert lines[:2] == ["tuned title", "how it was found"] and lines[8] == "1             # of ensemble layouts (M x P)"
    assert (out.epochs, out.seed, out.repetitions) == (cfg.epochs, cfg.seed, cfg.repetitions)


# -- the search, its trials stood in for --------------------------------------------------
def _figures(spec: tune.Spec) -> dict:
    """A stand-in trial: bagging (M 2) and B 32 faster; an epoch 0.5 s at P 1."""
    m, _ = spec.choice["layouts"]
    flops = 1e12 * m * (1.5 if spec.choice["batch_sizes"] == 32 else 1.0) * \
        (1.1 if spec.choice["allreduce"] == "ring" else 1.0)
    return {"flops": flops, "quality": 0.9, "vflops": flops * 0.8, "train_seconds": 0.5 * spec.epochs,
            "epochs_trained": spec.epochs, "wall_seconds": 0.5 * spec.epochs + 1.0, "fault": None}


def _tuning(tmp_path, execute, done=None, cfg=None) -> tune.Tuning:
    tmp_path.mkdir(exist_ok=True)
    return tune.Tuning(cfg or _cfg(l9=3, l10="1 2 4", l11="1 1 1"), 600.0, 4, 1438, execute,
                       tune.studies(str(tmp_path), 42), said=lambda line: None, done=done or {})


def test_the_search_calibrates_probes_halves_and_trains_the_finalists_the_full_length(tmp_path):
    ran = []
    tuner = _tuning(tmp_path, lambda spec: ran.append(spec) or _figures(spec))
    best = tuner.run()
    stages = [r["stage"] for r in tuner.rows]
    # 6 quality candidates (3 layouts x 2 B): stage 1 all 6, 2 finalists; 2 probes
    assert stages == ["calibration", "probes", "probes", *["stage 1"] * 6, "final", "final"] or \
        stages == ["calibration", "probes", "probes", *["stage 1"] * 6, "final"] or \
        stages == ["calibration", "probes", "probes", *["stage 1"] * 6]
    assert [r["outcome"] for r in tuner.rows[1:3]].count("speed pick (highest FLOPS)") == 1
    assert tune.choice_of(best)["allreduce"] == "ring" == tuner.picks["allreduce"]   # the probes' FLOPS
    pruned = [r for r in tuner.rows if r["outcome"] == "pruned after stage 1"]
    assert len(pruned) == 4   # pruned trials stop: none of them trains again
    assert not {tune.label(tune.choice_of(r)) for r in pruned} & \
        {tune.label(tune.choice_of(r)) for r in tuner.rows if r["stage"] == "final"}
    assert best["epochs"] == 4 and not best["estimate"] and best["outcome"] == "best: the tuned file's"
    assert tune.choice_of(best)["layouts"] == (4, 1) and tune.choice_of(best)["batch_sizes"] == 32
    assert tuner.planned == len(tuner.rows) == len(ran)
    assert tuner.state()["best"] == best["number"]


def test_the_same_input_and_seed_propose_the_same_trials_and_a_resume_replays_them(tmp_path):
    first = _tuning(tmp_path / "a", _figures)
    first.run()
    again = _tuning(tmp_path / "b", _figures)
    again.run()
    assert [(r["stage"], r["choice"]) for r in first.rows] == [(r["stage"], r["choice"]) for r in again.rows]
    # interrupted after trial 5: a resume from the same journal runs only what is left
    (tmp_path / "c").mkdir(exist_ok=True)
    stop = tune.Tuning(first.cfg, 600.0, 4, 1438, None, tune.studies(str(tmp_path / "c"), 42), said=lambda x: None)

    def until_five(spec):
        if spec.number > 5:
            raise KeyboardInterrupt
        return _figures(spec)
    stop.execute = until_five
    with pytest.raises(KeyboardInterrupt):
        stop.run()
    done = {r["number"]: r for r in stop.rows}
    ran = []
    resumed = _tuning(tmp_path / "c", lambda spec: ran.append(spec.number) or _figures(spec), done=done)
    resumed.run()
    assert ran == list(range(6, len(first.rows) + 1))
    assert [(r["number"], r["stage"], r["choice"], r["outcome"]) for r in resumed.rows] == \
        [(r["number"], r["stage"], r["choice"], r["outcome"]) for r in first.rows]


def test_a_faulted_trial_is_run_again_once_then_left_out(tmp_path):
    def faulty(spec):
        got = _figures(spec)
        return {**got, "fault": "rank 1 lost"} if spec.number in (4, 5, 6) else got
    tuner = _tuning(tmp_path, faulty)
    tuner.run()
    rows = {r["number"]: r for r in tuner.rows}
    assert rows[4]["outcome"] == "fault: run again as trial 5" and rows[5]["outcome"] == "fault again: left out"
    assert rows[6]["outcome"] == "fault: run again as trial 7" and rows[7]["choice"] == rows[6]["choice"]
    assert rows[7]["outcome"] in ("promoted", "pruned after stage 1", "finalist (full length in stage 1)",
                                  "best: the tuned file's")
    left_out = tune.label(tune.choice_of(rows[4]))
    assert all(tune.label(tune.choice_of(r)) != left_out for r in tuner.rows[5:])   # never compared again


def test_status_words_of_a_tuning_run():
    tuning = {"trials": [{"number": 1, "stage": "calibration", "epochs": 1, "vflops": 2e12, "fault": None},
                         {"number": 2, "stage": "stage 1", "epochs": 3, "vflops": 5e12, "fault": None},
                         {"number": 3, "stage": "stage 1", "epochs": 3, "vflops": None, "fault": "lost"}],
              "planned": 9, "budget_seconds": 600.0, "spent_seconds": 90.0, "tuned": None, "best": None}
    assert heartbeat.tuning_words(tuning) == ("tuning: trial 3 of 9 (stage 1, 3 epochs), best so far trial 2"
                                         " (5.000e+00 VTflops), budget left 8.5 min")
    ended = {**tuning, "tuned": "HPCAI500-tuned.dat", "best": 1}   # its pick, whatever estimate was higher
    assert heartbeat.tuning_words(ended) == ("tuning: trial 3 of 9 (stage 1, 3 epochs), 8.5 min of the budget left;"
                                             " tuned file HPCAI500-tuned.dat (trial 1)")


# -- real tuning runs ----------------------------------------------------------------------
def _tune_dat(folder, **lines):
    path = folder / "t.dat"
    path.write_text(dat_text(l5=folder / "runs", **{**SPACE, **lines}))
    return path


@pytest.mark.mpi
def test_a_tuning_run_runs_its_stages_and_its_tuned_file_runs_and_verifies(tmp_path):
    path = _tune_dat(tmp_path)
    check = mpirun(2, [path, "--check", "--tune", "10"], tmp_path)
    assert check.returncode == 0, check.stderr[-3000:]
    assert "tuning space: 8 combination(s) of 3 line(s) listing several values" in check.stdout
    assert "  probes: 2 trial(s); >= 2.4 s of training each (bench/span.py)" in check.stdout
    assert "  stage 1: 4 trial(s); equal training time" in check.stdout and "  final: 2 trial(s)" in check.stdout
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())   # --check trains nothing
    p = mpirun(2, [path, "--tune", "10"], tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    run = run_dir(tmp_path / "runs")
    res = json.loads((run / "results.json").read_text())
    rows = res["tuning"]["trials"]
    assert [r["stage"] for r in rows[:7]] == ["calibration", "probes", "probes", *["stage 1"] * 4]
    assert sum(r["outcome"] == "pruned after stage 1" for r in rows) == 2
    assert [t["index"] for t in res["tests"]] == [r["number"] for r in rows]   # one trial, one test
    assert all(t["trial"]["number"] == t["index"] for t in res["tests"])
    assert re.search(r"hpcai500: tune: trial 4 of \d+ \(stage 1, \d+ of 4 epochs\): VFLOPS .*; best so far trial"
                     r" \d+, .*; budget left [\d.]+ min", p.stderr)
    for name in ("tuning.txt", "tuning.png", "HPCAI500-tuned.dat", "tuning.journal"):
        assert (run / name).is_file(), name
    assert "Tuned input file: HPCAI500-tuned.dat (trial" in (run / "report.txt").read_text()
    v = subprocess.run(mpirun_cmd(None, ["--verify", run]), capture_output=True, text=True, env=mpi_env())
    assert v.returncode == 0 and "tuning: HPCAI500-tuned.dat = the input with the best finalist's setting ......" \
        " PASSED" in v.stdout, v.stdout[-3000:]
    s = subprocess.run(mpirun_cmd(None, ["--status", run]), capture_output=True, text=True, env=mpi_env())
    assert s.returncode == 0 and "; tuning: trial" in s.stdout and "tuned file HPCAI500-tuned.dat" in s.stdout
    s = subprocess.run(mpirun_cmd(None, ["--summarize", run]), capture_output=True, text=True, env=mpi_env())
    assert s.returncode == 0 and f"measured at the full length; {run}/HPCAI500-tuned.dat" in s.stdout, s.stdout
    _forged_tuning_fails(run, tmp_path / "forged")
    # the tuned file as a vendor takes it: an ordinary run, into a results directory of its own
    tuned = (run / "HPCAI500-tuned.dat").read_text().replace(str(tmp_path / "runs"), str(tmp_path / "ranked"))
    (tmp_path / "tuned.dat").write_text(tuned)
    r = mpirun(2, [tmp_path / "tuned.dat"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    ranked = run_dir(tmp_path / "ranked")
    v = subprocess.run(mpirun_cmd(None, ["--verify", ranked]), capture_output=True, text=True, env=mpi_env())
    assert v.returncode == 0, v.stdout[-3000:]
    assert len(json.loads((ranked / "results.json").read_text())["tests"]) == 1


def _forged_tuning_fails(run, copy):
    """--verify of a copy of the tuning run with its table or tuned file edited fails, naming the check."""
    import shutil

    from harness import verify
    shutil.copytree(run, copy)
    res = json.loads((copy / "results.json").read_text())
    best = next(r for r in res["tuning"]["trials"] if r["number"] == res["tuning"]["best"])
    pruned = next(r for r in res["tuning"]["trials"] if r["outcome"] == "pruned after stage 1")
    pruned["vflops"] = 10 * best["vflops"]       # a pruned trial's figure raised above the best's
    (copy / "results.json").write_text(json.dumps(res))
    tuned = (copy / "HPCAI500-tuned.dat").read_text().split("\n")
    tuned[13] = "64" + tuned[13][2:]              # line 14, B
    (copy / "HPCAI500-tuned.dat").write_text("\n".join(tuned))
    lines = [c.line() for c in verify.verify(verify.load(str(copy)))]
    failed = [ln.split(":")[0] for ln in lines if ln.endswith("FAILED")]
    assert f"tuning trial {pruned['number']}" in failed and "tuning stage 1" in failed, failed
    assert "tuning" in failed and any("HPCAI500-tuned.dat = the input" in ln and ln.endswith("FAILED") for ln in lines)


@pytest.mark.mpi
def test_a_bad_space_is_refused_on_every_rank_with_one_message(tmp_path):
    path = _tune_dat(tmp_path, l6=2, l7="digits ic")
    p = mpirun(2, [path, "--tune", "10"], tmp_path)
    assert p.returncode == 1 and p.stderr.count("hpcai500: error:") == 1, p.stderr[-3000:]
    assert f"error: {path}:6: found 2 workloads, expected 1 under --tune" in p.stderr
    p = mpirun(2, [_tune_dat(tmp_path), "--tune", "0.5"], tmp_path)
    assert p.returncode == 1 and p.stderr.count("hpcai500: error:") == 1, p.stderr[-3000:]
    # the calibration, 2 probes, stage 1's 4 trials and 2 finalists: 9 trials x 5 s = 45 s
    assert ("error: --tune 0.5: found a budget of 30 s, expected at least 45 s (9 trials planned, 5 s of machine time"
            " each at least): 15 s more") in p.stderr
    p = mpirun(2, [_tune_dat(tmp_path, l18="sgd adam")], tmp_path)   # a list outside --tune
    assert p.returncode == 1 and "t.dat:18: found 'adam', expected an optimizer alone after 'sgd'" in p.stderr


@pytest.mark.mpi
def test_an_interrupted_tuning_resumes_to_the_same_table(tmp_path):
    """Stopped (SIGUSR1 to mpirun) after trial 4, resumed from its journal: the trials it had
    finished stand as recorded, the others run, in the order the seeded study proposes."""
    import signal
    import time
    path = _tune_dat(tmp_path)
    cmd = mpirun_cmd(2, [path, "--tune", "10"])
    with open(tmp_path / "err.txt", "w") as err:
        p = subprocess.Popen(cmd, cwd=tmp_path, env=mpi_env(), stdout=subprocess.DEVNULL, stderr=err)
    deadline = time.monotonic() + 180
    while "tune: trial 4 of" not in (tmp_path / "err.txt").read_text():
        assert p.poll() is None and time.monotonic() < deadline, (tmp_path / "err.txt").read_text()[-3000:]
        time.sleep(0.05)
    p.send_signal(signal.SIGUSR1)
    p.wait(timeout=120)
    run = run_dir(tmp_path / "runs")
    before = json.loads((run / "results.json").read_text())
    assert before["status"] == "interrupted" and len(before["tuning"]["trials"]) >= 4
    r = mpirun(2, [path, "--tune", "11", "--resume", run], tmp_path)   # another budget: other trial lengths
    assert r.returncode == 1 and f"--resume {run}: found --tune 11, expected --tune 10, the budget" in r.stderr, r.stderr
    r = mpirun(2, [path, "--resume", run], tmp_path)   # without --tune the input's lists are refused first
    assert r.returncode == 1 and "t.dat:22: found 'hierarchical', expected an all-reduce alone" in r.stderr
    r = mpirun(2, [path, "--tune", "10", "--resume", run], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    after = json.loads((run / "results.json").read_text())
    kept = ("number", "stage", "choice", "epochs", "flops", "quality", "vflops", "train_seconds", "wall_seconds")
    assert [{k: x[k] for k in kept} for x in after["tuning"]["trials"][:4]] == \
        [{k: x[k] for k in kept} for x in before["tuning"]["trials"][:4]]
    fresh = _tuning(tmp_path / "fresh", _figures, cfg=dat.parse(str(path), tune=True))
    fresh.run()   # the study's order: stage 1's candidates as a fresh study of the same seed proposes them
    quality = [a.field for a in tune.varied(fresh.cfg, "quality")]   # the speed pick is the machine's
    order = lambda rows: [[r["choice"][k] for k in quality] for r in rows if r["stage"] == "stage 1"]  # noqa: E731
    assert order(after["tuning"]["trials"]) == order(fresh.rows)
    assert [t["index"] for t in after["tests"]] == [r["number"] for r in after["tuning"]["trials"]]
    v = subprocess.run(mpirun_cmd(None, ["--verify", run]), capture_output=True, text=True, env=mpi_env())
    assert v.returncode == 0, v.stdout[-3000:]


@pytest.mark.mpi
def test_a_rank_lost_during_tuning_costs_only_its_trial(tmp_path):
    """World rank 2 of 3 SIGKILLed at the start of trial 3 (a probe): that trial is marked and
    run again on the 2 ranks left, the search goes on and ends with a tuned file."""
    path = _tune_dat(tmp_path)
    p = mpirun(3, [path, "--tune", "10"], tmp_path, env={"HPCAI500_FAULT": "2:start@3:kill"})
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads((run_dir(tmp_path / "runs") / "results.json").read_text())
    rows = {r["number"]: r for r in res["tuning"]["trials"]}
    assert rows[3]["fault"] and rows[3]["outcome"] == "fault: run again as trial 4", rows[3]
    assert rows[4]["choice"] == rows[3]["choice"] and not rows[4]["fault"]
    assert res["tuning"]["best"] is not None and (run_dir(tmp_path / "runs") / "HPCAI500-tuned.dat").is_file()
    assert len(res["fault_tolerance"]["losses"]) == 1
    assert [s["index"] for s in res["skipped"]] == [3]   # laid out on the rank lost: no test recorded
    run = run_dir(tmp_path / "runs")
    v = subprocess.run(mpirun_cmd(None, ["--verify", run]), capture_output=True, text=True, env=mpi_env())
    assert "...... FAILED" not in v.stdout and "tuning trial 3: a test of the run" in v.stdout, v.stdout[-3000:]
    s = subprocess.run(mpirun_cmd(None, ["--status", run]), capture_output=True, text=True, env=mpi_env())
    assert f"{len(res['tests'])} of {len(res['tests'])} test run(s) finished" in s.stdout, s.stdout
