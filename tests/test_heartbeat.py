"""harness/heartbeat.py: the judgment of a run's state (pure, by hand), the writer thread,
the process check, and `--status` on hand-made run folders (no MPI: the real runs that
reach these paths are tests/test_run.py's SIGKILLed job and tests/test_multinode.py's
node death)."""
import json
import os
import subprocess
import sys
import time
from dataclasses import replace

import pytest

from harness import dat, heartbeat, plan, results
from harness.errors import RunError
from tests.conftest import ROOT, dat_text, record, result

NOW = 1_800_000_000.0   # s since the epoch, the reader's clock in the pure cases


def beat(age, interval=5.0, **more):
    return {"time": NOW - age, "interval": interval, "host": "n1", "pid": 4242, **more}


def test_a_complete_run_with_every_test_passed_is_the_only_success():
    done = [result(index=1), result(index=1, repetition=1), result(index=2), result(index=2, repetition=1)]
    s = heartbeat.judge(record("complete", done), None, NOW, None)
    assert (s.name, s.code, s.alive) == ("complete", 0, False)
    assert s.line() == "complete: every test PASSED; 4 of 4 test run(s) finished"
    bad = done[:3] + [replace(done[3], consistency={"max_diff": 1.0, "tolerance": 1e-6, "passed": False})]
    s = heartbeat.judge(record("complete", bad), None, NOW, None)
    assert (s.name, s.code) == ("failed", 4)
    assert s.detail == "complete, but test 2 rep 1 failed the replica consistency check"


def test_an_interruption_and_an_error_are_told_apart():
    s = heartbeat.judge(record("interrupted", [result()], {"reason": "SIGTERM received", "test": 2}), None, NOW, None)
    assert (s.name, s.code) == ("interrupted", 3)
    assert s.line() == "interrupted: SIGTERM received during test 2; 1 of 4 test run(s) finished"
    why = {"reason": results.ERROR_PREFIX + "staging: disk full", "test": 1}
    s = heartbeat.judge(record("interrupted", [], why), None, NOW, None)
    assert (s.name, s.code, s.detail) == ("failed", 4, "error: staging: disk full during test 1")


def test_a_running_run_is_alive_while_its_heartbeat_is_fresh_and_dead_after():
    rec = record("running", [result()])
    # another node: the age decides; 12 intervals of 5 s = 60 s
    live = heartbeat.judge(rec, beat(59.0), NOW, None)
    assert (live.name, live.code, live.alive) == ("running", 2, True)
    assert live.detail.endswith("(59 s ago, n1 pid 4242)")
    dead = heartbeat.judge(rec, beat(61.0), NOW, None)
    assert (dead.name, dead.code, dead.alive) == ("dead", 5, False)
    assert dead.detail.startswith("not running: last heartbeat at ")
    assert dead.detail.endswith("(61 s ago, n1 pid 4242), none for 12 intervals of 5 s; status left `running`")
    assert heartbeat.judge(rec, beat(13.0, interval=1.0), NOW, None).name == "dead"   # the file's own interval
    # this machine: the process table decides at once, whatever the age
    gone = heartbeat.judge(rec, beat(1.0), NOW, False)
    assert gone.name == "dead" and "that process is gone; status left `running`" in gone.detail
    assert heartbeat.judge(rec, beat(600.0), NOW, True).name == "running"
    # no heartbeat file at all: cannot be told, and not refused by --resume (alive None)
    unknown = heartbeat.judge(rec, None, NOW, None)
    assert (unknown.name, unknown.alive) == ("running", None) and "cannot be told" in unknown.detail


def test_planned_runs_are_the_fitting_tests_times_the_repetitions():
    assert heartbeat.planned_runs(record(reps=2, skipped=1)) == 4
    assert heartbeat.planned_runs(record(reps=3, skipped=0)) == 9
    assert heartbeat.planned_runs(results.Record("x", "d", {}, {}, {}, {}, [], {})) is None   # no configuration
    assert heartbeat.judge(results.Record("x", "d", {}, {}, {}, {}, [], {}), None, NOW, None).line().endswith(
        "; 0 test run(s) finished")


def test_the_writer_stamps_and_the_process_check_knows_this_process(tmp_path):
    h = heartbeat.Heartbeat(str(tmp_path), 0.05).start()
    first = heartbeat.read(str(tmp_path))
    time.sleep(0.3)
    h.stop()
    later = heartbeat.read(str(tmp_path))
    assert first["pid"] == os.getpid() and first["interval"] == 0.05 and later["time"] > first["time"]
    assert heartbeat.process_alive(later) is True
    assert heartbeat.process_alive({**later, "started": later["started"] - 100}) is False   # a pid reused
    assert heartbeat.process_alive({**later, "pid_ns": -1}) is None                        # another namespace
    assert not [n for n in os.listdir(tmp_path) if n != heartbeat.NAME]                    # no temporary left
    (tmp_path / heartbeat.NAME).write_text("{half")
    assert heartbeat.read(str(tmp_path)) is None


def _folder(tmp_path, rec, stamp=None):
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    (run / "results.json").write_text(json.dumps(rec.json()))
    if stamp:
        (run / heartbeat.NAME).write_text(json.dumps(stamp))
    return run


def test_status_command_line_and_exit_codes(tmp_path):
    """--status in a process of its own (no MPI): one line, EXIT's status; 1 for a folder
    that is not a run."""
    def status(folder):
        p = subprocess.run([sys.executable, str(ROOT / "hpcai500.py"), "--status", str(folder)], capture_output=True,
                           text=True, timeout=60)
        return p.returncode, p.stdout.strip(), p.stderr.strip()
    gone = {**heartbeat.identity(), "time": time.time() - 3, "interval": 5.0, "pid": 2**22 + 7}   # no such pid
    run = _folder(tmp_path, record("running", [result()]), gone)
    code, out, _ = status(run)
    assert code == 5 and out.startswith(f"{run}: dead: not running: last heartbeat at ") and \
        out.endswith("that process is gone; status left `running`; 1 of 4 test run(s) finished"), out
    assert status(tmp_path / "nowhere")[0:2] == (1, "")
    assert status(tmp_path / "nowhere")[2] == f"hpcai500: error: --status: {tmp_path / 'nowhere'}: not a folder;" \
                                              " give a runs/<id> folder"


def test_resume_refuses_a_live_run_and_takes_a_dead_one(tmp_path):
    text = dat_text(l27=2)
    cfg = dat.parse_text(text, str(tmp_path / "x.dat"))
    rec = record("running", [result()])
    live = _folder(tmp_path, rec, {**heartbeat.identity(), "time": time.time(), "interval": 5.0})
    with pytest.raises(RunError, match=r"--resume .*run: found a live run \(last heartbeat at .* s ago, .*\),"
                                       r" expected one that has stopped"):
        plan.resumed(str(live), cfg, 3, {})
    (live / heartbeat.NAME).write_text(json.dumps({**heartbeat.identity(), "time": time.time(), "pid": 2**22 + 7}))
    assert plan.resumed(str(live), cfg, 3, {}).tests == rec.tests


def test_status_of_a_results_directory_judges_its_newest_run(tmp_path):
    """A batch script knows line 5, not the run's name: the newest folder by name."""
    for name, status in (("20261126-090000-aaaaaa", "complete"), ("20261126-091500-bbbbbb", "interrupted"),
                         (".data", None)):
        (tmp_path / name).mkdir()
        if status:
            rec = record(status, interrupted={"reason": "SIGUSR1 received", "test": 1} if status != "complete" else None)
            (tmp_path / name / "results.json").write_text(json.dumps(rec.json()))
    assert heartbeat.newest_run(str(tmp_path)) == str(tmp_path / "20261126-091500-bbbbbb")
    assert heartbeat.newest_run(str(tmp_path / "20261126-090000-aaaaaa")) == str(tmp_path / "20261126-090000-aaaaaa")
    assert heartbeat.newest_run(str(tmp_path / ".data")) == str(tmp_path / ".data")   # no run inside: itself
