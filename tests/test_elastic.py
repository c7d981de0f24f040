"""Elastic bagging (harness/elastic.py, issue 46): a lost rank costs the base models it
touched, not the run. Pure logic in-process (the lost jobs, what the launch says of ULFM,
the re-laid sweep, the agreement loop of World.step over a scripted communicator); real
runs under mpirun with ULFM on (make venv's parameter files), a rank SIGKILLed in training
(by the fault injector, and from outside by pid), in an evaluation, in the roofline, the
sampler's sends and staging, world rank 0 between two tests, a hung rank, and
`--on-fault abort`."""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from harness import division, elastic, heartbeat, mllog, plan, report, results, verify
from tests.conftest import (ROOT, dat_text, mpirun, mpirun_ended, mpirun_says, mpirun_started, record, report_of,
                            result)
from tests.conftest import results as read_results

HOST = socket.gethostname()   # MPI_Get_processor_name of every rank here: the host a loss names

WATCHDOG = 15   # s, as tests/test_run.py's for PyTorch (its comment: gaps between beats of at most 4.6 s)


# ------------------------------------------------------------------ pure logic
def test_the_abort_line_names_how_the_job_ends():
    """Under ULFM MPI_Abort ends only its caller, so the job ends by each rank's exit status
    (harness/driver._end_job) and the report says so; without ULFM, MPI_Abort. A run of
    results schema 2.13 said MPI_Abort whatever the launch: --verify re-renders its words."""
    ulfm = {"policy": "abort", "ulfm": True, "how": "ULFM on"}
    exits = "FAULTS  : --on-fault abort: a lost rank ends the run (each rank's exit status 1: under ULFM" \
            " MPI_Abort ends only its caller)"
    assert elastic.lines(ulfm) == elastic.lines(ulfm, (2, 14)) == [exits, "FAULTS  : ULFM on"]
    assert elastic.lines(ulfm, (2, 13))[0] == "FAULTS  : --on-fault abort: a lost rank ends the run (MPI_Abort)"
    assert elastic.lines({**ulfm, "ulfm": False})[0] == elastic.lines(ulfm, (2, 13))[0]


def test_lost_jobs_are_those_with_a_lost_launch_rank():
    jobs = [(0, 1), (2, 3), (4, 5)]
    assert elastic.lost_jobs(jobs, [0, 1, 2, 3, 4, 5], {3}) == [1]
    assert elastic.lost_jobs(jobs, [0, 1, 2, 3, 4, 5], {0, 5}) == [0, 2]
    # a test laid out on survivors: test rank 2 is launch rank 4
    assert elastic.lost_jobs([(0, 1), (2,)], [0, 1, 4], {4}) == [1]
    assert elastic.lost_jobs(jobs, [0, 1, 2, 3, 4, 5], set()) == []


def _etc(tmp_path, ompi, prte):
    (tmp_path / "openmpi-mca-params.conf").write_text(ompi)
    (tmp_path / "prte-mca-params.conf").write_text(prte)
    return str(tmp_path)


def test_the_launch_survives_with_ulfm_in_the_parameter_files_or_the_environment(tmp_path):
    etc = _etc(tmp_path, "# comment\nmpi_ft_enable = 1\n",
               "state_base_recoverable=1  # trailing comment\nstate_base_notify_errors = 1\n")
    assert elastic.launch_survives({}, etc) == (True, f"ULFM on by {etc}/openmpi-mca-params.conf and"
                                                      " prte-mca-params.conf")
    # notify_errors missing: the survivors would hang, so it is off, naming what is missing
    etc = _etc(tmp_path, "mpi_ft_enable = 1\n", "state_base_recoverable = 1\n")
    ok, how = elastic.launch_survives({}, etc)
    assert not ok and "state_base_notify_errors = 1 (prte-mca-params.conf) missing" in how
    assert elastic.launch_survives({}, str(tmp_path / "absent"))[0] is False
    # mpirun --with-ft ulfm puts this into every rank's environment
    assert elastic.launch_survives({"OMPI_MCA_mpi_ft_enable": "1"}, str(tmp_path / "absent"))[0] is True
    # and it outranks the files: bench/ulfm.py's `off` (ULFM's files on, the environment 0)
    etc = _etc(tmp_path, "mpi_ft_enable = 1\n", "state_base_recoverable = 1\nstate_base_notify_errors = 1\n")
    assert elastic.launch_survives({"OMPI_MCA_mpi_ft_enable": "0"}, etc) == (
        False, "ULFM is off: OMPI_MCA_mpi_ft_enable=0 in the ranks' environment; a lost rank ends the run")


def test_fault_lines_warn_where_drop_is_asked_but_the_launch_cannot_give_it():
    off = {"policy": "drop", "ulfm": False, "how": "ULFM is off: ..."}
    assert elastic.lines(off)[-1].startswith("FAULTS  : warning: --on-fault drop asked, but this launch cannot")
    assert not any("warning" in x for x in elastic.lines({**off, "policy": "abort"}))
    assert not any("warning" in x for x in elastic.lines({**off, "ulfm": True}))


def test_make_venv_writes_the_three_ulfm_parameters_once_and_no_detector(tmp_path):
    (tmp_path / "prte-mca-params.conf").write_text("# shipped comments\nstate_base_recoverable = 0\n")
    for _ in range(2):   # idempotent: a rerun rewrites, never duplicates
        subprocess.run(["bash", str(ROOT / "scripts" / "ulfm.sh"), str(tmp_path)], check=True)
    assert elastic.launch_survives({}, str(tmp_path))[0]
    prte = (tmp_path / "prte-mca-params.conf").read_text()
    assert prte.count("state_base_recoverable") == 1 and "# shipped comments" in prte
    # the detector is the harness's own ranks' (elastic.detector_params): with its thread, every
    # MPI program of the venv would hang in MPI_Finalize
    assert elastic.read_params(str(tmp_path / "openmpi-mca-params.conf")) == {"mpi_ft_enable": "1"}


def test_the_detector_is_armed_under_mpirun_with_ulfm_unless_the_launch_sets_it(tmp_path):
    etc = _etc(tmp_path, "mpi_ft_enable = 1\n", "state_base_recoverable = 1\nstate_base_notify_errors = 1\n")
    mpirun = {"PRTE_LAUNCHED": "1"}
    assert elastic.detector_params(mpirun, etc, 10.0) == {
        "OMPI_MCA_mpi_ft_detector": "true", "OMPI_MCA_mpi_ft_detector_thread": "false",
        "OMPI_MCA_mpi_ft_detector_period": "1", "OMPI_MCA_mpi_ft_detector_timeout": "10"}
    assert elastic.detector_params(mpirun, etc, 30.0)["OMPI_MCA_mpi_ft_detector_period"] == "3"
    assert elastic.detector_params(mpirun, etc, 0.0) == {}                            # HPCAI500_FT_DETECTOR=0: off
    assert elastic.detector_params({}, etc, 10.0) == {}                               # srun, or a singleton
    assert elastic.detector_params({**mpirun, "OMPI_MCA_mpi_ft_detector": "false"}, etc, 10.0) == {}  # the site's
    assert elastic.mpirun_ulfm(mpirun, etc) and not elastic.mpirun_ulfm({}, etc)
    _etc(tmp_path, "mpi_ft_enable = 1\nmpi_ft_detector_timeout = 30\n", "state_base_recoverable = 1\n"
         "state_base_notify_errors = 1\n")
    assert elastic.detector_params(mpirun, etc, 10.0) == {}                           # its file's choice stands
    off = _etc(tmp_path, "", "")
    assert elastic.detector_params(mpirun, off, 10.0) == {} and not elastic.mpirun_ulfm(mpirun, off)  # no ULFM


def _ompi_info(**found) -> str:
    """ompi_info --param mpi ft --level 9 --parsable's lines for the detector (as 5.0.8 prints
    them, help and type lines among them)."""
    out = []
    for name, (value, source) in found.items():
        out += [f"mca:mpi:ft:param:{name}:value:{value}", f"mca:mpi:ft:param:{name}:source:{source}",
                f"mca:mpi:ft:param:{name}:help:Timeout: (s)", f"mca:mpi:ft:param:{name}:enumerator:value:1:true"]
    return "\n".join(out)


def test_the_detector_is_read_as_ompi_info_says_the_ranks_read_it():
    where = "file (/v/etc/openmpi-mca-params.conf:61)"   # a source with colons in it
    text = _ompi_info(mpi_ft_detector=("true", where), mpi_ft_detector_thread=("true", where),
                      mpi_ft_detector_period=("1.000000", where), mpi_ft_detector_timeout=("10.000000", where))
    found = elastic.detector(text)
    assert found == elastic.Detector(True, True, 1.0, 10.0, where)
    assert found.timeout > 3 * found.period   # Open MPI's own rule, which ulfm.sh's values keep
    # a value Open MPI does not take as true (`bogus`, read as false) is off, however it was spelt
    off = elastic.detector(text.replace("mpi_ft_detector:value:true", "mpi_ft_detector:value:false"))
    assert off.on is False and off.thread is True
    assert elastic.detector("") is None and elastic.detector(text.replace("timeout:value:10.000000", "")) is None


def test_the_fault_lines_say_how_a_silent_rank_is_found_or_warn_that_it_is_not():
    on = {"on": True, "thread": False, "period": 3.0, "timeout": 30.0, "source": "environment"}
    base = {"policy": "drop", "ulfm": True, "how": "ULFM on"}
    (line,) = elastic.lines({**base, "detector": on})[2:]
    assert line.startswith("FAULTS  : a silent rank (stopped, frozen) is taken for lost after 30 s without a"
                           " heartbeat (ULFM's detector, one every 3 s, sent as each rank drives MPI every half"
                           " period; mpi_ft_detector from environment)")
    warn = elastic.lines({**base, "detector": {**on, "thread": True}})[3]
    assert warn.startswith("FAULTS  : warning: mpi_ft_detector_thread is true: Open MPI 5.0.8 then hangs MPI_Finalize")
    off = elastic.lines({**base, "detector": {**on, "on": False, "source": "default"}})[2]
    assert off.startswith("FAULTS  : warning: ULFM's heartbeat detector is off (mpi_ft_detector false, from"
                          " default): a silent rank (stopped, frozen) is never found lost")
    assert "not known" in elastic.lines({**base, "detector": None})[2]
    # a file of schema < 2.22 (no key) and a launch without ULFM: no line on the detector
    assert len(elastic.lines(base)) == 2 and len(elastic.lines({**base, "ulfm": False, "detector": on})) == 3


def test_a_survivor_ends_the_lost_ranks_of_its_own_host_only():
    hosts, pids = ["n1", "n1", "n2", "n2"], [10, 11, 12, 13]
    assert elastic.strays({1, 2}, hosts, pids, 0) == [(1, 11)]
    assert elastic.strays({1, 2}, hosts, pids, 3) == [(2, 12)]
    assert elastic.strays({1}, [], [], 0) == []     # hosts not known: none
    world = elastic.World(_Comm(0, 4, []), "drop")
    world.hosts, world._launch = hosts, [0, 1]
    world.losses = [elastic.Loss((2, 3), "p", 1.0)]
    assert elastic.unreached(world) == [2, 3]        # n2 lost whole: nobody there to end them
    world._launch = [0, 1, 3]
    world.losses = [elastic.Loss((2,), "p", 1.0)]
    assert elastic.unreached(world) == []            # rank 3, on n2, ends rank 2


def test_the_tests_left_are_laid_out_anew_on_the_survivors():
    from harness import dat
    cfg = dat.parse_text(dat_text(l9=3, l10="2 0 4", l11="2 1 1"), "t.dat")
    tests = dat.expand(cfg)
    node_of_rank = (0, 0, 0, 0)
    planned, _ = plan.layouts(cfg, tests, 4, node_of_rank)
    runs = [(p, 0) for p in planned]
    kept, gone = plan.relaid(cfg, runs, 3, (0, 0, 0), "rank 3 lost")
    assert [(p.test.index, p.layout.M, p.layout.P) for p, _ in kept] == [(2, 3, 1)]   # M = 0: the smaller world
    assert [p.layout.jobs for p, _ in kept] == [((0,), (1,), (2,))]
    assert [(s.test.index, s.cause, r) for s, r in gone] == [(1, "lost", 0), (3, "lost", 0)]
    assert gone[0][0].reason == ("t.dat:10-11: found '2 x 2', expected M x P <= 3, the ranks left after rank 3"
                                 " lost: M x P = 2 x 2 = 4 exceeds the world size 3")


def test_a_test_with_dropped_base_models_is_open():
    assert division.with_losses("closed", [], 0, 4) == ("closed", [])
    verdict, reasons = division.with_losses("closed", [], 1, 4)
    assert verdict == "open" and reasons == ["1 of 4 base models lost to faults and dropped (--on-fault drop):"
                                             " the ensemble measured is not the one the input asked for"]


def test_status_tells_a_run_complete_with_losses_by_its_own_exit():
    lost = result(M=2, jobs_lost=[1], base_quality=[0.95],
                  losses=[{"ranks": [3], "hosts": ["n2"], "phase": "test 1: the evaluation after epoch 1",
                           "seconds": 4.0, "jobs": [1]}])
    rec = results.Record(hpcai500="0.2", run_dir="r", input={"text": dat_text(l27=2)}, config={}, settings={},
                         environment={}, conventions=[], roofline={}, status="complete", tests=[lost],
                         skipped=[{"index": 2, "reason": "x", "cause": "lost", "repetition": 1}])
    state = heartbeat.judge(rec, None, 0.0, None)
    assert (state.name, state.code) == ("complete-with-losses", 6)
    assert state.detail == ("every test PASSED, with losses: rank(s) 3 lost, 1 base model(s) dropped,"
                            " 1 test run(s) left out")
    rec.tests[0] = result()
    rec.skipped = []
    assert heartbeat.judge(rec, None, 0.0, None).name == "complete"


def test_status_of_an_interrupted_run_names_its_losses():
    """The shipped sweep on 2 ranks (test 3 skipped for want of ranks), ended by a signal after
    rank 1 was lost and test 2 left out: test 2 is no longer planned, so "1 of 1" alone would
    hide it; the line names the losses."""
    rec = record("interrupted", [result()], {"reason": "SIGTERM received", "test": None}, reps=1)
    rec.skipped.append({"index": 2, "reason": "x", "cause": "lost", "repetition": 0})
    rec.fault_tolerance = {"policy": "drop", "ulfm": True, "how": "x",
                           "losses": [elastic.entry(elastic.Loss((1,), "test 2", 3.0, 9.0))]}
    assert heartbeat.judge(rec, None, 0.0, None).line() == (
        "interrupted: SIGTERM received; with losses: rank(s) 1 lost, 0 base model(s) dropped, 1 test run(s) left"
        " out; 1 of 1 test run(s) finished")


def test_status_names_ranks_lost_outside_any_test():
    """A rank lost in the roofline, or a lost coordinator, is in no test's losses: the
    run's own list (fault_tolerance.losses) names it."""
    rec = results.Record(hpcai500="0.2", run_dir="r", input={"text": dat_text()}, config={}, settings={},
                         environment={}, conventions=[], roofline={}, status="complete", tests=[result()],
                         fault_tolerance={"policy": "drop", "ulfm": True, "how": "x",
                                          "losses": [elastic.entry(elastic.Loss((1,), "the roofline", 3.0, 9.0))]})
    state = heartbeat.judge(rec, None, 0.0, None)
    # nothing dropped, nothing left out: the ensembles are the ones asked for, so exit 0, saying so
    assert (state.code, state.detail) == (0, "every test PASSED and whole; recovered rank(s) 1 lost, 0 base"
                                             " model(s) dropped, 0 test run(s) left out")


def test_status_of_a_retrained_run_is_0_whole_and_6_once_a_model_is_dropped():
    """Issue 66: retrain made the ensemble whole, so the batch system must not mark the job
    failed; 6 stays for a run whose ensemble is not the one asked for. --verify agrees."""
    loss = {"ranks": [2], "hosts": ["n1"], "phase": "test 1: the evaluation after epoch 1", "seconds": 4.0,
            "jobs": [1]}
    again = result(M=2, losses=[loss], retrained=[{"job": 1, "wave": 1, "ranks": [0]}])
    rec = results.Record(hpcai500="0.2", run_dir="r", input={"text": dat_text()}, config={}, settings={},
                         environment={}, conventions=[], roofline={}, status="complete", tests=[again])
    state = heartbeat.judge(rec, None, 0.0, None)
    assert (state.name, state.code, state.detail) == (
        "complete", 0, "every test PASSED and whole; recovered rank(s) 2 lost, 0 base model(s) dropped, 1 trained"
                       " again, 0 test run(s) left out")
    ok = [verify.Check("a", True)]
    assert verify.outcome(ok, "complete", heartbeat.of_record(rec).whole) == "PASSED"
    rec.tests = [result(M=2, jobs_lost=[1], base_quality=[0.9], losses=[loss])]
    assert heartbeat.judge(rec, None, 0.0, None).code == 6
    assert verify.outcome(ok, "complete", heartbeat.of_record(rec).whole) == "INCOMPLETE"
    assert verify.incomplete_line("complete", False).startswith("Incomplete result: faults dropped base models")


def test_figures_of_a_shrunk_world_are_placed_by_launch_rank():
    assert elastic.by_launch(["a", "c", "d"], [0, 2, 3], 5) == ["a", None, "c", "d", None]
    assert elastic.by_launch([], [], 2) == [None, None]


def test_a_new_coordinator_takes_the_run_folder_as_last_written(tmp_path, capsys):
    from harness import dat
    cfg = dat.parse_text(dat_text(), "t.dat")
    rec = results.Record(hpcai500="0.2", run_dir=str(tmp_path), input={"text": dat_text()}, config={}, settings={},
                         environment={}, conventions=["a convention"], roofline={"tensorflow/fp32": {"peak": 1}},
                         fault_tolerance={"policy": "drop", "ulfm": True, "how": "x"}, tv_legend="legend")
    first = report.Output(cfg, rec, ["PARAM   : x"])
    first.add(result(), {})
    again = report.Output.taken_over(cfg, str(tmp_path))
    assert again.text == first.text and [t.index for t in again.record.tests] == [1]
    assert again.record.roofline == {"tensorflow/fp32": {"peak": 1}}   # utilisation goes on against them
    again.lost([{"ranks": [0], "phase": "p", "seconds": 1.0, "time": 2.0}])
    assert json.loads((tmp_path / "results.json").read_text())["fault_tolerance"]["losses"][0]["ranks"] == [0]
    with pytest.raises(ValueError, match="elsewhere: not a folder"):
        report.Output.taken_over(cfg, str(tmp_path / "elsewhere"))


def test_a_test_left_out_for_lost_ranks_is_written_with_its_losses_at_once(tmp_path):
    """mpirun's SIGTERM after a node's death can come between two writes of results.json (a
    suite, 2026-12-08: the test left out, no rank lost on record, --status "rank(s) ? lost"):
    the skip and the losses go in one write."""
    from harness import dat
    cfg = dat.parse_text(dat_text(), "t.dat")
    rec = results.Record(hpcai500="0.2", run_dir=str(tmp_path), input={"text": dat_text()}, config={}, settings={},
                         environment={}, conventions=[], roofline={},
                         fault_tolerance={"policy": "drop", "ulfm": True, "how": "x"}, tv_legend="legend")
    out, written = report.Output(cfg, rec, ["PARAM   : x"]), []
    save = out._save

    def counted():
        save()
        doc = json.loads((tmp_path / "results.json").read_text())
        written.append(([x["index"] for x in doc["skipped"]], [x["ranks"] for x in doc["fault_tolerance"]["losses"]]))
    out._save = counted
    out.skip(2, 0, "every base model of test 2 lost a rank", "lost",
             [{"ranks": [2, 3], "phase": "test 2: p", "seconds": 1.0, "time": 2.0}])
    assert written == [([2], [[2, 3]])]


def test_planned_runs_count_a_repetition_left_out_after_a_loss_once():
    from harness import dat
    text = dat_text(l9=2, l10="1 2", l11="1 1", l27=3)
    rec = results.Record(hpcai500="0.2", run_dir="r", input={"text": text},
                         config=dat.record(dat.parse_text(text)), settings={}, environment={}, conventions=[], roofline={},
                         skipped=[{"index": 1, "reason": "x", "cause": "ranks"},           # every repetition
                                  {"index": 2, "reason": "y", "cause": "lost", "repetition": 2}])
    assert heartbeat.planned_runs(rec) == (2 - 1) * 3 - 1


def test_the_losses_line_names_ranks_hosts_the_step_and_the_models_dropped():
    t = result(M=2, jobs_lost=[1], losses=[{"ranks": [3], "hosts": ["n2"], "seconds": 4.0, "jobs": [1],
                                            "phase": "test 1: the evaluation after epoch 1"}])
    assert report.losses_line(t, (2, 17)) == ("Losses      : 1 of 2 base models trained ; rank 3 on n2 found lost at"
                                              " test 1: the evaluation after epoch 1 ; job(s) 1 dropped: every figure"
                                              " is the 1 left's")
    # from results schema 2.18 it says what the loss cost the figures (issue 66)
    assert report.losses_line(t) == report.losses_line(t, (2, 17)) + (
        " ; Time is the survivors' alone: a fault-free run's is not comparable, and can be longer where the lost"
        " ranks shared cores with them (theirs from the loss on)")


def test_the_losses_line_names_the_models_trained_again_and_status_counts_them():
    t = result(M=3, losses=[{"ranks": [1, 2], "hosts": ["n1"], "seconds": 4.0, "jobs": [1, 2],
                             "phase": "test 1: the evaluation after epoch 1"}],
               retrained=[{"job": 1, "wave": 1, "ranks": [0]}, {"job": 2, "wave": 2, "ranks": [0, 3, 4]}])
    assert report.losses_line(t, (2, 17)) == (
        "Losses      : 3 of 3 base models trained ; ranks 1, 2 on n1 found lost at test 1: the evaluation after epoch 1"
        " ; job 1 trained again in wave 1 on rank(s) 0; job 2 trained again in wave 2 on rank(s) 0,3-4")
    # the waves' seconds from the evaluations' clock: the first pass ended at 5 s, the last wave at 12 s of a
    # time to solution of 12.5 s (0.5 s staging): 7 s of waves, 5.5 s without them
    t = replace(t, time_to_solution=12.5, train_seconds=9.0, evaluations=[
        {"epoch": 1, "seconds": 5.0, "quality": 0.9, "base_quality": [0.9, None, None]},
        {"epoch": 1, "seconds": 8.0, "quality": 0.9, "base_quality": [0.9, 0.9, None], "wave": 1},
        {"epoch": 1, "seconds": 12.0, "quality": 0.95, "base_quality": [0.9, 0.9, 0.9], "wave": 2}])
    assert report.losses_line(t) == report.losses_line(t, (2, 17)) + (
        " ; the retraining waves took 7.00 s of the time to solution 12.50 s (5.50 s without them), Time 9.00 s sums"
        " every pass")
    rec = results.Record("0.2", "r", {}, {}, {}, {}, [], {}, tests=[t])
    assert heartbeat.losses(heartbeat.of_record(rec)) == "with losses: rank(s) 1, 2 lost, 0 base model(s) dropped, 2 trained again, 0 test" \
        " run(s) left out"
    assert "trained again on the survivors" in elastic.lines({"policy": "retrain", "ulfm": True, "how": "h"})[0]


def test_the_console_line_of_a_loss_names_ranks_hosts_step_and_cost():
    """Issue 66: the moment the survivors agree, world rank 0 says who, where, when and what it costs."""
    loss = elastic.Loss((2, 3), "test 1: the evaluation after epoch 1", 4.0, 9.0, ("n2",))
    assert elastic.announce(loss, "drop", 2) == (
        "hpcai500: ranks 2, 3 (on n2) lost, found at test 1: the evaluation after epoch 1; --on-fault drop: the base"
        " models it touched leave the ensemble, the run goes on with the 2 rank(s) left (docs/running.md, 'When a rank dies')")
    assert "are trained again once the others finish" in elastic.announce(loss, "retrain", 2)
    assert elastic.entry(loss)["hosts"] == ["n2"]
    assert elastic.describe([elastic.entry(elastic.Loss((1,), "the roofline", 1.0))]) == \
        "rank 1 lost, found at the roofline"        # a loss of an older record, or hosts unknown: none named


def test_abort_finds_the_loss_only_where_the_launch_has_ulfm():
    world = elastic.World(_Comm(0, 2, []), "abort")
    assert not world.detects                 # without ULFM the launch ends the job: a step is the bare call
    world.ulfm = True
    assert world.detects and elastic.World(_Comm(0, 2, []), "drop").detects


def test_the_footer_counts_what_faults_cost_from_schema_2_18():
    loss = {"ranks": [3], "hosts": ["n2"], "phase": "test 1: the evaluation after epoch 1", "seconds": 4.0,
            "jobs": [1]}
    tests = [result(M=2, jobs_lost=[1], base_quality=[0.9], losses=[loss]),
             result(index=2, M=2, losses=[dict(loss, ranks=[1])], retrained=[{"job": 0, "wave": 1, "ranks": [0]}])]
    roofline = [{"ranks": [5], "phase": "the roofline", "seconds": 1.0, "time": 2.0}]
    text = report.footer(tests, [{"index": 3, "reason": "x", "cause": "lost", "repetition": 0}], [], False, roofline)
    assert "              3 ranks lost to faults: 1 base models trained again, 1 dropped (see the Losses lines).\n" \
        in text
    assert "ranks lost" not in report.footer(tests, [], [], False, roofline, "2.17")   # as 2.17 files rendered it
    assert "ranks lost" not in report.footer([result()], [], [], False, [])


def test_a_test_on_a_shrunk_world_says_so_in_its_block():
    t = result(M=2, launch_ranks=[0, 1, 3], jobs=[[0], [1]], idle_ranks=[2])
    block = report.row(t)
    assert ("World       : the 3 rank(s) left after ranks were lost before this test (launch ranks 0-1,3): laid out"
            " anew on them (--on-fault)") in block.splitlines()
    assert "World       :" not in report.row(t, schema="2.17")


def test_summarize_shows_the_models_measured_of_those_asked(tmp_path):
    loss = {"ranks": [3], "hosts": ["n2"], "phase": "p", "seconds": 4.0, "jobs": [1]}
    assert report.models(result(M=4, jobs_lost=[1], losses=[loss])) == "3/4"
    assert report.models(result(M=4)) == "4"


def test_a_resumed_run_keeps_the_losses_of_the_invocations_before(tmp_path):
    """Issue 66: --resume after a loss keeps its record; each marked with its invocation."""
    from harness import dat
    cfg = dat.parse_text(dat_text(), "t.dat")
    earlier = results.Record(hpcai500="0.2", run_dir=str(tmp_path), input={"text": dat_text()}, config={},
                             settings={}, environment={}, conventions=[], roofline={}, status="interrupted",
                             fault_tolerance={"policy": "abort", "ulfm": True, "how": "x",
                                              "losses": [{"ranks": [1], "hosts": ["n1"], "phase": "test 1: p",
                                                          "seconds": 3.0, "time": 9.0}]})
    now = results.Record(hpcai500="0.2", run_dir=str(tmp_path), input={"text": dat_text()}, config={}, settings={},
                         environment={}, conventions=[], roofline={},
                         fault_tolerance={"policy": "retrain", "ulfm": True, "how": "x"})
    out = report.Output(cfg, now, ["PARAM   : x"], earlier)
    assert out.record.fault_tolerance["losses"] == [{"ranks": [1], "hosts": ["n1"], "phase": "test 1: p",
                                                     "seconds": 3.0, "time": 9.0, "invocation": 0}]
    out.lost([{"ranks": [2], "hosts": ["n1"], "phase": "test 2: q", "seconds": 1.0, "time": 20.0}])
    saved = json.loads((tmp_path / "results.json").read_text())["fault_tolerance"]
    assert [x["ranks"] for x in saved["losses"]] == [[1], [2]] and saved["policy"] == "retrain"
    assert heartbeat.losses(heartbeat.of_record(results.load(str(tmp_path / "results.json")))).startswith("with losses: rank(s) 1, 2 lost")


def test_closing_a_lost_models_log_rewrites_its_division_and_aborts_it():
    log = mllog.BaseModelLog(1, 1)
    log.init(seed=1, global_batch=64, train_samples=10, eval_samples=5, nodes=1, per_node=4, workload="digits",
             division="closed", org="o", platform="p", status="onprem")
    lines = mllog.close(log.lines, ensemble_quality=0.5, reached=False, instance_id=1, division="open")
    events = [json.loads(x.split(":::MLLOG ", 1)[1]) for x in lines if ":::MLLOG " in x]
    assert [e["value"] for e in events if e["key"] == "submission_division"] == ["open"]
    assert events[-1]["key"] == "run_stop" and events[-1]["metadata"]["status"] == "aborted"


class _Comm:
    """A communicator whose operations follow a script: the pure agreement logic of
    World.step, without MPI (the real one runs under mpirun below)."""
    def __init__(self, rank, size, agree):
        self.rank, self.size, self.agreed, self.revoked = rank, size, list(agree), 0

    def Agree(self, flag):
        return self.agreed.pop(0) & flag

    def Revoke(self):
        self.revoked += 1


def test_a_step_without_faults_runs_once_and_agrees(monkeypatch):
    world = elastic.World(_Comm(0, 4, [1]), "drop")
    calls = []
    assert world.step("s", lambda: calls.append(1) or "out") == "out"
    assert calls == [1] and world.comm.revoked == 0 and world.losses == []


def test_a_spurious_no_of_the_agreement_is_asked_again_not_shrunk(monkeypatch):
    """Open MPI's agreement said 0 where every rank said 1 (elastic.World._agree): the
    step asks again, and a 1 then is the step's success, with nothing revoked or shrunk."""
    world = elastic.World(_Comm(0, 2, [0, 1]), "drop")
    monkeypatch.setattr(world, "_shrink", lambda phase: pytest.fail("shrunk"))
    calls = []
    assert world.step("s", lambda: calls.append(1) or "out") == "out"
    assert calls == [1] and world.comm.agreed == [] and world.comm.revoked == 0


def test_a_step_another_rank_failed_is_shrunk_and_redone(monkeypatch):
    comm = _Comm(0, 4, [0] * elastic.AGREE_TRIES)   # rank 3 saw the fault: each agreement says no
    world = elastic.World(comm, "drop")
    shrunk = _Comm(0, 3, [1])

    def shrink(phase):   # World._shrink's bookkeeping with the group translation done by MPI
        world.__dict__.update(comm=shrunk, _launch=[0, 1, 2])
        world.losses.append(elastic.Loss((3,), phase, 1.0))
        return (3,)
    monkeypatch.setattr(world, "_shrink", shrink)
    seen = []
    assert world.step("test 1: the evaluation after epoch 2", lambda: seen.append(sorted(world.lost)) or 7) == 7
    assert seen == [[], [3]]          # the retry reads the loss, to leave the lost job out
    assert world.launch_ranks == [0, 1, 2] and world.size == 3 and world.rank == 0


def test_a_failed_step_with_no_rank_lost_is_an_error(monkeypatch):
    """Another rank's MPI operation failed, yet the shrink keeps every rank: not a fault."""
    world = elastic.World(_Comm(0, 2, [0] * elastic.AGREE_TRIES), "drop")
    monkeypatch.setattr(world, "_shrink", lambda phase: ())
    with pytest.raises(elastic.StepFailed, match="^test 1: the start of training: an MPI operation failed on another"
                                                 " rank, and no rank was lost$"):
        world.step("test 1: the start of training", lambda: None)


def test_the_rank_whose_operation_failed_names_the_error(monkeypatch):
    """The agreement carries one bit: the rank that saw the MPI error says which it was."""
    from mpi4py import MPI
    world = elastic.World(_Comm(0, 2, [1, 1, 1]), "drop")   # this rank's 0 makes each agreement 0
    monkeypatch.setattr(world, "_shrink", lambda phase: ())

    def fail():
        raise MPI.Exception(MPI.ERR_TRUNCATE)
    with pytest.raises(elastic.StepFailed, match=r"^s: an MPI operation failed on this rank \(MPI_ERR_TRUNCATE: .*\), and"
                                                 r" no rank was lost$"):
        world.step("s", fail)
    assert world.comm.revoked == 1   # the others, waiting in their step, learn at once


def test_under_abort_a_step_is_the_bare_call():
    world = elastic.World(_Comm(0, 2, []), "abort")   # no agreement at all: nothing scripted
    assert world.step("s", lambda: 5) == 5


# ------------------------------------------------------------------ real runs
def _run(tmp_path, env, extra=(), **lines):
    path = tmp_path / "t.dat"
    path.write_text(dat_text(l5=tmp_path / "runs", **lines))
    return mpirun(4, [*extra, str(path)], tmp_path, env=env)


def _cli(*args):
    q = subprocess.run([sys.executable, str(ROOT / "hpcai500.py"), *map(str, args)], capture_output=True, text=True,
                       timeout=120)
    return q.returncode, q.stdout


def _run_folder(tmp_path):
    (run,) = [p for p in (tmp_path / "runs").iterdir() if not p.name.startswith(".")]
    return run


def _rank_pid(launcher: int, rank: int) -> int:
    """The pid of world rank `rank` among the descendants of the launcher's process `launcher`."""
    children = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            pid, rest = stat.read_text().split(" ", 1)
            children.setdefault(int(rest.rsplit(")", 1)[1].split()[1]), []).append(int(pid))
        except (OSError, IndexError, ValueError):
            continue
    todo = list(children.get(launcher, []))
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            if f"OMPI_COMM_WORLD_RANK={rank}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                return pid
        except OSError:
            continue
    raise AssertionError(f"no rank {rank} under process {launcher}")


def _killed_from_outside(tmp_path, framework, policy="drop", **lines):
    """The run below with world rank 3 SIGKILLed by pid from outside, as the OOM killer or an
    operator does, while job 1 trains its first epoch (slowed from step 5: 0.25 s a step);
    job 0, not slowed, has said its epoch 1 by then."""
    lines = {"l9": 3, "l10": "2 1 4", "l11": "2 2 1", **lines}
    p = mpirun_started(tmp_path, 4, ["--on-fault", policy], {"HPCAI500_FAULT": "3:5:slow"}, l15=3, l30=0,
                       l35=framework, **lines)
    mpirun_says(p, tmp_path, f"test 1/{lines['l9']} " + framework + " M=2 P=2 B=32 : epoch 1/3")
    os.kill(_rank_pid(p.pid, 3), signal.SIGKILL)
    return mpirun_ended(p, tmp_path)


@pytest.mark.parametrize("framework,fault,found", [
    ("pytorch", None, "the evaluation after epoch 1"),             # in training (Gloo's all-reduce), from outside
    ("pytorch", "3:eval:kill", "the evaluation after epoch 1")])   # in an evaluation (the job's gather)
def test_a_killed_rank_costs_its_base_model_and_the_sweep_goes_on(tmp_path, framework, fault, found):
    """4 ranks; test 1 is M = 2 x P = 2 and world rank 3 (job 1) is SIGKILLed: by the fault
    injector, or by pid from outside. Job 1's survivor (rank 2, its root) leaves the job;
    test 1 ends with job 0 alone; test 2 (1 x 2) runs on the 3 ranks left; test 3 (4 x 1)
    no longer fits and is skipped."""
    p = (_run(tmp_path, {"HPCAI500_FAULT": fault}, ["--on-fault", "drop"], l9=3, l10="2 1 4", l11="2 2 1", l15=3,
              l30=0, l35=framework)
         if fault else _killed_from_outside(tmp_path, framework))
    assert p.returncode == 0, p.stderr[-3000:]
    assert "hpcai500: rank 2: test 1: base model 1 lost a rank (" in p.stderr, p.stderr[-3000:]
    # one line the moment the survivors agree: who, where, which step, what it costs (issue 66)
    assert (f"hpcai500: rank 3 (on {HOST}) lost, found at test 1: {found}; --on-fault drop: the base models it touched"
            " leave the ensemble, the run goes on with the 3 rank(s) left") in p.stderr, p.stderr[-3000:]
    report = report_of(tmp_path / "runs")    # not stdout: mpirun's forwarding can lose bytes
    assert "Losses      : 1 of 2 base models trained ; rank 3 on " in report, report[-3000:]
    assert f"found lost at test 1: {found} ; job(s) 1 dropped: every figure is the 1 left's ; Time is the" \
        " survivors' alone" in report
    assert "World       : the 3 rank(s) left after ranks were lost before this test (launch ranks 0-2)" in report
    assert "              1 ranks lost to faults: 0 base models trained again, 1 dropped (see the Losses lines)." \
        in report
    res = read_results(tmp_path / "runs")
    t1, t2 = res["tests"]
    assert res["fault_tolerance"]["policy"] == "drop" and res["fault_tolerance"]["ulfm"] is True
    assert (t1["jobs_lost"], [x["ranks"] for x in t1["losses"]], t1["launch_ranks"]) == ([1], [[3]], None)
    assert len(t1["base_quality"]) == 1 and len(t1["resample"]) == 1 and t1["resample"][0]["job"] == 0
    # the figures are job 0's alone: its samples, its steps
    assert t1["samples_trained"] == t1["steps_per_epoch"][0] * t1["epochs_trained"] * t1["B"] * t1["P"]
    assert t1["division"] == "open" and t1["open_reasons"][-1].startswith("1 of 2 base models lost to faults")
    assert t1["evaluations"][-1]["base_quality"][1] is None
    assert (t2["index"], t2["M"], t2["P"], t2["launch_ranks"], t2["jobs_lost"]) == (2, 1, 2, [0, 1, 2], [])
    (gone,) = res["skipped"]
    assert (gone["index"], gone["cause"]) == (3, "lost")
    assert f"expected M x P <= 3, the ranks left after rank 3 (on {HOST}) lost" in gone["reason"]
    assert [x["hosts"] for x in res["fault_tolerance"]["losses"]] == [[HOST]]
    assert "Test 3 skipped: " in report
    run = _run_folder(tmp_path)
    lost_log = (run / "mllog" / mllog.filename(1, 0, 1)).read_text()
    assert '"status": "aborted"' in lost_log.splitlines()[-1]
    code, line = _cli("--status", run)
    assert code == 6 and "complete-with-losses: every test PASSED, with losses: rank(s) 3 lost" in line, line
    code, out = _cli("--verify", run)   # every figure re-derived, but not the ensembles asked for: 2, as --status's 6
    assert code == 2 and "Incomplete result: faults dropped base models" in out, \
        [x for x in out.splitlines() if "FAILED" in x] or out[-2000:]
    code, out = _cli("--summarize", run)
    assert code == 0 and re.search(r" digits +1/2 +2 ", out), out


def test_ranks_killed_in_the_roofline_the_sampler_and_staging_cost_only_their_base_models(tmp_path):
    """5 ranks, PyTorch, roofline and staging on. Launch rank 1 is SIGKILLed in the roofline:
    the sweep is laid out on ranks 0, 2, 3, 4. Test 1 (2 x 2: jobs of launch ranks 0, 2 and
    3, 4): job 1's root (3) is killed before rank 0's send of its resample reaches it, so
    job 1 is lost and its survivor (4) follows. Test 2 (3 x 1 on 0, 2, 4): launch rank 4
    is killed while its node's copy is staged; the copy is made anew without it, job 2 is
    lost. Test 3 (4 x 1) no longer fits the 2 ranks left."""
    stage = tmp_path / "stage"
    path = tmp_path / "t.dat"
    path.write_text(dat_text(l5=tmp_path / "runs", l9=3, l10="2 3 4", l11="2 1 1", l15=2, l28=stage, l30=1,
                             l35="pytorch"))
    p = mpirun(5, ["--watchdog", WATCHDOG, "--on-fault", "drop", path], tmp_path,
               env={"HPCAI500_FAULT": "1:roofline:kill,3:sampler@1:kill,4:staging@2:kill"})
    assert p.returncode == 0, p.stderr[-3000:]
    res = read_results(tmp_path / "runs")
    t1, t2 = res["tests"]
    assert [(x["ranks"], x["phase"], x["jobs"]) for x in t1["losses"]] == [([3], "test 1: the sampler's sends", [1])]
    assert (t1["launch_ranks"], t1["jobs_lost"], len(t1["base_quality"])) == ([0, 2, 3, 4], [1], 1)
    assert [(x["ranks"], x["phase"], x["jobs"]) for x in t2["losses"]] == [([4], "test 2: staging", [2])]
    assert (t2["launch_ranks"], t2["jobs_lost"], len(t2["base_quality"])) == ([0, 2, 4], [2], 2)
    assert t2["staging"]["copies"] == 1 and list(stage.iterdir()) == []   # made anew once, then removed
    # the roofline's figures of the 4 ranks that gave them, by launch rank; the node map likewise
    (ceilings,) = res["roofline"].values()
    assert [r is None for r in ceilings["per_rank"]] == [False, True, False, False, False]
    assert res["environment"]["node_of_rank"] == [0, None, 0, 0, 0]
    (gone,) = res["skipped"]
    assert gone["index"] == 3 and gone["cause"] == "lost" and f"the ranks left after rank 1 (on {HOST}) lost, found at" \
        " the roofline" in gone["reason"]
    assert "rank 4: test 1: base model 1 lost a rank (" in p.stderr
    run = _run_folder(tmp_path)
    assert _cli("--status", run)[0] == 6
    code, out = _cli("--verify", run)
    assert code == 2, [x for x in out.splitlines() if "FAILED" in x] or out[-2000:]


def test_retrain_trains_the_lost_base_models_again_in_waves_and_the_ensemble_is_whole(tmp_path):
    """4 ranks, PyTorch, `--on-fault retrain`. Test 1 (2 x 2): rank 3 (job 1) is killed at its
    first evaluation; job 0 finishes, then wave 1 trains job 1 again on ranks 0-1 of the 3 left,
    on the same resample. Test 2 (3 x 1 on launch ranks 0-2): ranks 1 and 2 are killed at their
    first evaluation; one rank is left, so wave 1 trains job 1 and wave 2 job 2, each on rank
    0, each wave's evaluations adding the models kept before it. Both ensembles end whole:
    nothing dropped, no open reason for losses, the time to quality from whole ensembles only."""
    p = _run(tmp_path, {"HPCAI500_FAULT": "3:eval@1:kill,1:eval@2:kill,2:eval@2:kill"}, ["--on-fault", "retrain"],
             l9=2, l10="2 3", l11="2 1", l15=2, l30=0, l35="pytorch")
    assert p.returncode == 0, p.stderr[-3000:]
    assert "hpcai500: test 1: retraining wave 1: base model(s) 1 trained again on 2 of the 3 ranks left" in p.stderr
    assert "a wave trains it again once the others finish" in p.stderr
    res = read_results(tmp_path / "runs")
    t1, t2 = res["tests"]
    assert t1["retrained"] == [{"job": 1, "wave": 1, "ranks": [0, 1]}] and t1["jobs_lost"] == []
    assert [(x["ranks"], x["jobs"]) for x in t1["losses"]] == [([3], [1])]
    assert t2["retrained"] == [{"job": 1, "wave": 1, "ranks": [0]}, {"job": 2, "wave": 2, "ranks": [0]}]
    assert (t2["launch_ranks"], t2["jobs_lost"]) == ([0, 1, 2], [])
    assert sorted(r for x in t2["losses"] for r in x["ranks"]) == [1, 2]
    for t, waves in ((t1, [0, 1]), (t2, [0, 1, 2])):
        curve = t["evaluations"]
        assert [e.get("wave", 0) for e in curve] == [w for w in waves for _ in range(2)]
        assert [e["epoch"] for e in curve] == [1, 2] * len(waves)
        # the models in each point's ensemble: the lost ones out from the first evaluation on
        assert [sum(q is not None for q in e["base_quality"]) for e in curve] == [w + 1 for w in waves for _ in range(2)]
        # a wave's points carry the kept models' last base qualities; the seconds run on
        assert all(e["base_quality"][0] == curve[1]["base_quality"][0] for e in curve[2:])
        assert all(a["seconds"] < b["seconds"] for a, b in zip(curve, curve[1:]))
        assert len(t["base_quality"]) == len(t["resample"]) == t["M"] and t["base_quality"] == curve[-1]["base_quality"]
        assert [r["job"] for r in t["resample"]] == list(range(t["M"]))
        assert not [r for r in t["open_reasons"] if "lost to faults" in r]
        whole = [e for e in curve if all(q is not None for q in e["base_quality"])]
        assert t["time_to_quality"] in [None] + [e["seconds"] for e in whole]
    report = report_of(tmp_path / "runs")    # not stdout: mpirun's forwarding can lose bytes
    assert "Losses      : 2 of 2 base models trained ; rank 3 on " in report
    assert "job 1 trained again in wave 1 on rank(s) 0-1 ; the retraining waves took " in report
    assert "              3 ranks lost to faults: 3 base models trained again, 0 dropped (see the Losses lines)." \
        in report
    assert "--on-fault retrain: the base models it touched are trained again once the others finish" in p.stderr
    run = _run_folder(tmp_path)
    code, line = _cli("--status", run)   # whole: a result as asked for, so the batch system sees success (issue 66)
    assert code == 0 and "complete: every test PASSED and whole; recovered rank(s) 1, 2, 3 lost, 0 base model(s)" \
        " dropped, 3 trained again" in line, line
    code, out = _cli("--verify", run)
    assert code == 0, [x for x in out.splitlines() if "FAILED" in x] or out[-2000:]


def test_a_rank_killed_from_outside_under_retrain_leaves_a_whole_run_status_0(tmp_path):
    """Issue 66: one test, 2 x 2, world rank 3 SIGKILLed from outside in training under the
    default policy: the console names the loss as it is agreed, wave 1 trains job 1 again,
    and --status and --verify both exit 0 (the batch system sees a good job), the line
    saying what was recovered; the footer counts it."""
    p = _killed_from_outside(tmp_path, "pytorch", "retrain", l9=1, l10=2, l11=2)
    assert p.returncode == 0, p.stderr[-3000:]
    assert (f"hpcai500: rank 3 (on {HOST}) lost, found at test 1: the evaluation after epoch 1; --on-fault retrain:"
            " the base models it touched are trained again once the others finish") in p.stderr, p.stderr[-3000:]
    report = report_of(tmp_path / "runs")
    assert "              1 ranks lost to faults: 1 base models trained again, 0 dropped" in report
    assert "; the retraining waves took " in report
    run = _run_folder(tmp_path)
    code, line = _cli("--status", run)
    assert code == 0 and line.endswith(": complete: every test PASSED and whole; recovered rank(s) 3 lost, 0 base"
                                       " model(s) dropped, 1 trained again, 0 test run(s) left out; 1 of 1 test"
                                       " run(s) finished\n"), line
    code, out = _cli("--verify", run)
    assert code == 0, [x for x in out.splitlines() if "FAILED" in x] or out[-2000:]


@pytest.mark.parametrize("policy", ["drop", "retrain", "abort"])
def test_a_silent_rank_costs_its_base_model_under_every_policy_and_mpirun_ends(tmp_path, policy):
    """Issue 70: world rank 3 (job 3 of 4 x 1) SIGSTOPs itself at step 12 of test 1: alive and
    silent, its watchdog and MPI threads stopped with it. ULFM's heartbeat detector (make
    venv's parameters) takes it for dead within its timeout; the survivors find it at the
    evaluation after the epoch, as a dead rank; a survivor on its node SIGKILLs it, so
    mpirun ends with the run (without the detector the survivors waited there for ever). The
    detector's timeout is 10 s here (HPCAI500_FT_DETECTOR; 30 by default)."""
    p = _run(tmp_path, {"HPCAI500_FAULT": "3:12:stop", "HPCAI500_FT_DETECTOR": "10"},
             ["--watchdog", WATCHDOG, "--on-fault", policy], l9=1, l10=4, l11=1, l15=3, l30=0, l35="pytorch")
    assert "hpcai500: rank 3: HPCAI500_FAULT fires: stop at step 12" in p.stderr, p.stderr[-3000:]
    assert "no rank left on their node" not in p.stderr   # rank 3's node had survivors: one ended it
    res = read_results(tmp_path / "runs")
    detector = res["fault_tolerance"]["detector"]
    assert (detector["on"], detector["thread"], detector["timeout"], detector["period"]) == (True, False, 10.0, 1.0)
    report = report_of(tmp_path / "runs")
    assert "FAULTS  : a silent rank (stopped, frozen) is taken for lost after 10 s without a heartbeat" in report
    (loss,) = res["fault_tolerance"]["losses"]
    assert loss["ranks"] == [3] and loss["phase"].startswith("test 1: the evaluation after epoch "), loss
    code = _cli("--status", _run_folder(tmp_path))[0]
    if policy == "abort":
        assert p.returncode != 0 and res["status"] == "interrupted" and res["tests"] == [] and code == 4
        return
    assert p.returncode == 0, p.stderr[-3000:]
    (t,) = res["tests"]
    assert t["consistency"]["passed"] and [x["jobs"] for x in t["losses"]] == [[3]], t
    if policy == "drop":
        assert (t["jobs_lost"], len(t["base_quality"]), code) == ([3], 3, 6)
    else:   # trained again in a wave: the ensemble whole, --status 0
        assert (t["jobs_lost"], len(t["base_quality"]), [r["job"] for r in t["retrained"]], code) == ([], 4, [3], 0)


def test_world_rank_0_killed_between_tests_costs_nothing_and_rank_1_takes_over(tmp_path):
    """4 ranks, PyTorch; world rank 0, the coordinator, is SIGKILLed once test 1 is written,
    as test 2 starts. Rank 1 takes over the run's folder (shared: one machine), test 2
    (4 x 1) no longer fits the 3 ranks left and is skipped, test 3 (1 x 2) runs on ranks 1-3,
    and the run ends complete with losses, as rank 1 writes it: test 1 stands. (World rank 0
    lost in a test, which costs that test: tests/test_multinode.py, across nodes.)"""
    p = _run(tmp_path, {"HPCAI500_FAULT": "0:start@2:kill"}, l9=3, l10="2 4 1", l11="2 1 2", l15=2, l30=0,
             l35="pytorch")
    assert p.returncode == 0, p.stderr[-3000:]
    assert "hpcai500: rank 1 takes over as the coordinator: " in p.stderr, p.stderr[-3000:]
    res = read_results(tmp_path / "runs")
    t1, t3 = res["tests"]
    assert (t1["index"], t1["launch_ranks"], t1["losses"]) == (1, None, [])
    assert (t3["index"], t3["launch_ranks"], t3["jobs_lost"], t3["losses"]) == (3, [1, 2, 3], [], [])
    (gone,) = res["skipped"]
    assert (gone["index"], gone["cause"], gone["after"]) == (2, "lost", 1)
    assert f"the ranks left after rank 0 (on {HOST}) lost, found at the start of test 2" in gone["reason"]
    assert [x["ranks"] for x in res["fault_tolerance"]["losses"]] == [[0]]
    run = _run_folder(tmp_path)
    # the heartbeat goes on, the new coordinator's: stamped after the kill
    killed = float(re.search(r"HPCAI500_FAULT fires: kill at start@2 \(t=([0-9.]+)\)", p.stderr).group(1))
    assert json.loads((run / "heartbeat").read_text())["time"] > killed
    code, line = _cli("--status", run)
    assert code == 6 and "rank(s) 0 lost" in line, line
    code, out = _cli("--verify", run)   # test 2 left out: not the run asked for, as --status's 6
    assert code == 2, [x for x in out.splitlines() if "FAILED" in x] or out[-2000:]


@pytest.fixture(scope="module")
def hung_and_abort_runs(tmp_path_factory):
    """The two runs below, overlapped: the hung rank's run spends the watchdog's 15 s with job 1
    asleep, so the abort run starts once the hang has fired (after the first run's imports,
    whose CPU could stretch job 0's gaps between beats, the margin of its limit). Returns
    {"hang": ..., "abort": ...}, each (folder, CompletedProcess)."""
    hang, abort = tmp_path_factory.mktemp("hang"), tmp_path_factory.mktemp("abort")
    lines = dict(l9=1, l10=2, l11=2, l15=3, l30=0, l35="pytorch")
    first = mpirun_started(hang, 4, ["--watchdog", WATCHDOG, "--on-fault", "drop"], {"HPCAI500_FAULT": "3:30:hang"},
                           **lines)
    mpirun_says(first, hang, "HPCAI500_FAULT fires: hang")
    second = mpirun_started(abort, 4, ["--on-fault", "abort"], {"HPCAI500_FAULT": "3:30:kill"}, **lines)
    return {"hang": (hang, mpirun_ended(first, hang)), "abort": (abort, mpirun_ended(second, abort))}


def test_a_hung_rank_costs_its_job_through_the_watchdog(hung_and_abort_runs):
    """Rank 3 stops making progress in training; rank 2, its partner, waits in Gloo's
    all-reduce (PyTorch: its ranks start in a fraction of TensorFlow's time). Under drop each one's watchdog ends that rank alone (not MPI_Abort): job
    1 is lost, job 0 finishes the test, the run completes."""
    folder, p = hung_and_abort_runs["hang"]
    assert p.returncode == 0, p.stderr[-3000:]
    assert "rank 3: no progress for" in p.stderr and "ending this rank (--on-fault drop)" in p.stderr
    (t,) = read_results(folder / "runs")["tests"]
    assert t["jobs_lost"] == [1] and sorted(r for x in t["losses"] for r in x["ranks"]) in ([2, 3], [3])
    assert _cli("--status", _run_folder(folder))[0] == 6


def test_on_fault_abort_ends_the_run_failed_with_the_loss_on_record(hung_and_abort_runs):
    """The same rank killed, not hung, under `--on-fault abort` (issue 66): the survivors agree
    on the loss (ULFM), world rank 0 records the run failed with the lost rank, its host and
    the step, one line says so on the console (no traceback), --status exits 4 and --verify 2
    (a plain --resume of it: tests/test_plan.py, the policy is not compared)."""
    folder, p = hung_and_abort_runs["abort"]
    assert p.returncode != 0
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    errors = [x[len("hpcai500: "):] for x in p.stderr.splitlines() if x.startswith("hpcai500: error: ")]
    assert len(errors) == 1 and errors[0].startswith(f"error: --on-fault abort: rank 3 (on {HOST}) lost, found at"
                                                     " test 1: "), p.stderr[-3000:]
    assert errors[0].endswith("; the run ends; recorded failed in " + str(_run_folder(folder)) + "/ (--status exits 4)")
    # the venv's launch has ULFM: the job ends by each rank's exit status (harness/driver._end_job)
    report = report_of(folder / "runs")    # not stdout: mpirun's forwarding can lose bytes
    assert "FAULTS  : --on-fault abort: a lost rank ends the run (each rank's exit status 1: under ULFM" in report
    assert "\nInterrupted: error: --on-fault abort: rank 3 " in report and "Tests interrupted." in report
    assert "              1 ranks lost to faults: 0 base models trained again, 0 dropped" in report
    res = read_results(folder / "runs")
    assert res["tests"] == [] and res["fault_tolerance"]["policy"] == "abort" and res["status"] == "interrupted"
    assert res["settings"]["HPCAI500_ON_FAULT"] == "abort"      # the command line's choice, on record
    (loss,) = res["fault_tolerance"]["losses"]
    assert (loss["ranks"], loss["hosts"], loss["phase"].startswith("test 1: ")) == ([3], [HOST], True)
    assert res["interrupted"]["test"] == 1 and res["interrupted"]["reason"].startswith("error: --on-fault abort: ")
    code, line = _cli("--status", _run_folder(folder))
    assert code == 4 and "failed: error: --on-fault abort: rank 3 " in line and "rank(s) 3 lost" in line, line
    code, out = _cli("--verify", _run_folder(folder))
    assert code == 2 and " 0 failed ...... INCOMPLETE" in out, [x for x in out.splitlines() if "FAILED" in x]