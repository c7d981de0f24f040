"""The relaunch (harness/relaunch.py, issue 70): a lost node costs a restart on the nodes
left, not the run. Pure logic in-process (the hosts, mpirun's command, when to relaunch,
launches.json and what --status makes of it); a real run on a simulated cluster of its own
(tests/test_multinode.py's machinery), a node killed whole mid-test under the launcher."""
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import heartbeat, hosts, relaunch, results
from harness.hosts import Host
from tests.conftest import MPIRUN_STDIN, ROOT, dat_text, mllog_events, mpi_env, record, simulated_cluster
from tests.conftest import results as read_results


def test_hosts_are_read_from_a_list_a_hostfile_or_slurms_words():
    assert hosts.parse_hosts("n1:2,n2:2,n3") == [Host("n1", 2), Host("n2", 2), Host("n3", 1)]
    text = "# the nodes\nn1 slots=2\nn2   slots = 4  # big\n\nn3\n"
    assert hosts.parse_hosts(text) == [Host("n1", 2), Host("n2", 4), Host("n3", 1)]
    with pytest.raises(ValueError, match=r"found 'n1:x', expected a host and its ranks"):
        hosts.parse_hosts("n1:x,n2:2")
    with pytest.raises(ValueError, match="found no host"):
        hosts.parse_hosts("# nothing\n")
    assert hosts.slurm_hosts(["a", "b", "c", "d"], "2(x3),1") == [Host("a", 2), Host("b", 2), Host("c", 2),
                                                                      Host("d", 1)]
    with pytest.raises(ValueError, match=r"found 3 node\(s\) in '2\(x3\)', expected 2"):
        hosts.slurm_hosts(["a", "b"], "2(x3)")


def test_each_launch_names_its_hosts_and_ranks_and_a_relaunch_resumes_the_run():
    two = [Host("n1", 2), Host("n3", 1)]
    assert hosts.command("mpirun", ["--mca", "x", "y"], two, ["py", "hpcai500.py", "t.dat"], None) == [
        "mpirun", "--mca", "x", "y", "--host", "n1:2,n3:1", "-np", "3", "py", "hpcai500.py", "t.dat"]
    assert hosts.command("mpirun", [], two, ["p"], "runs/x")[-3:] == ["p", "--resume", "runs/x"]


@pytest.mark.parametrize("state,lost,done,stopped,again,why", [
    ("interrupted", ["n4"], 0, False, True, "host(s) n4 lost: relaunch 1 of 2 on n1, n2"),
    ("running", ["n4"], 1, False, True, "host(s) n4 lost: relaunch 2 of 2 on n1, n2"),   # ranks gone at once
    ("interrupted", ["n4"], 2, False, False, "gave up after 2 relaunch(es), the limit (--relaunch 2)"),
    ("complete-with-losses", ["n4"], 0, False, False, "the run is complete-with-losses: no relaunch"),  # ULFM first
    ("failed", [], 0, False, False, "the run is failed: no relaunch"),
    ("interrupted", [], 0, False, False, "the run is interrupted and PRRTE named no lost node: no relaunch"),
    ("interrupted", ["n4"], 0, True, False, "the launcher was stopped (a signal): no relaunch"),
    ("interrupted", ["n1", "n2", "n4"], 0, False, False, "every host is lost (n1, n2, n4): no host left")])
def test_a_run_is_relaunched_only_for_a_lost_node_within_the_limit(state, lost, done, stopped, again, why):
    hosts = [Host("n1", 1), Host("n2", 1), Host("n4", 1)]
    decided = relaunch.decide(state, lost, hosts, done, 2, stopped)
    assert decided[0] is again and decided[1].startswith(why), decided


def test_a_run_stopped_on_an_error_is_not_relaunched_and_the_launcher_names_it():
    """A relaunch whose smaller world no test fits: rank 0 refuses the input, and a relaunch
    would say the same; a node lost in that launch still counts (the error may be its)."""
    hosts, err = [Host("n1", 1), Host("n2", 1)], "x.dat:10-11: found '4 x 1', expected M x P <= 3"
    assert relaunch.decide("interrupted", [], hosts, 1, 2, False, err) == (
        False, f"the run stopped on an error ({err}): no relaunch")
    assert relaunch.decide("interrupted", ["n2"], hosts, 1, 2, False, err)[0] is True


def test_prrtes_lost_daemon_and_the_run_folder_are_read_from_mpiruns_stderr():
    said = ("PRTE has lost communication with a remote daemon.\n\n  HNP daemon   : [prterun-vm-1@0,0] on node vm\n"
            "  Remote daemon: [prterun-vm-1@0,3] on node n4\n")
    assert relaunch.NODE_DIED.findall(said) == ["n4"]
    line = "hpcai500: results in /w/runs/20261207-1/ (report.txt, results.json: rewritten after each test)\n"
    assert relaunch.RUN_FOLDER.match(line).group(1) == "/w/runs/20261207-1"


def test_launches_are_appended_whole_and_a_stamp_before_mpiruns_end_is_dead(tmp_path):
    first = relaunch.Launch(1, ["n1:1", "n2:1"], 2, 100.0, 160.0, 0, ["n2"], 150.0)
    relaunch.record(str(tmp_path), first)
    done = relaunch.record(str(tmp_path), relaunch.Launch(2, ["n1:1"], 1, 170.0, 200.0, 0, [], None))
    assert [x["launch"] for x in done] == [1, 2] and results.launches(str(tmp_path)) == done
    assert not list(tmp_path.glob(".*tmp*"))    # written whole: no temporary left beside it
    (tmp_path / results.LAUNCHES).write_text("[{")   # torn (by hand): read as none, never half
    assert results.launches(str(tmp_path)) == []
    # a run on other nodes (its stamping process not in this PID namespace) whose last stamp is
    # older than its mpirun's end is not alive, however young the stamp: a relaunch may resume it
    relaunch.record(str(tmp_path), first)
    beat = {"time": 155.0, "interval": 5, "host": "n1", "pid": 1, "boot_id": "elsewhere"}
    (tmp_path / heartbeat.NAME).write_text(json.dumps(beat))
    rec = record("running")
    assert heartbeat.status(str(tmp_path), rec, now=161.0).name == "dead"
    (tmp_path / heartbeat.NAME).write_text(json.dumps({**beat, "time": 161.0}))   # stamped after: live
    assert heartbeat.status(str(tmp_path), rec, now=162.0).name == "running"


def test_the_report_and_status_say_each_launch_and_the_time_since_the_fault():
    launches = [relaunch.Launch(1, ["n1:1", "n2:1", "n3:1"], 3, 1796670000.0, 1796670040.0, 247, ["n3"],
                                1796670039.5).__dict__]
    got = relaunch.lines({"launches": launches, "started": 1796670041.6})
    assert got == ["RELAUNCH: launch 1 on n1:1,n2:1,n3:1 (3 ranks), 2026-12-07T19:00:00Z to 2026-12-07T19:00:40Z,"
                   " mpirun exit 247; n3 lost at 2026-12-07T19:00:39Z (PRRTE lost its daemon)",
                   "RELAUNCH: this invocation, launch 2, started 2026-12-07T19:00:41Z, 2.1 s after the last fault;"
                   " a test under way at a fault ran again from its start (no checkpoint inside a test yet), its Time its own"
                   " run's: the time the fault cost is not in it"]
    assert relaunch.lines(None) == []
    assert heartbeat.relaunched_words({"launches": launches}) == "; relaunched 1 time(s) after host(s) n3 lost"


def test_a_launch_has_ended_once_rank_0s_heartbeat_is_gone_or_silent_for_two_intervals():
    beat = {"time": 100.0, "interval": 5.0}
    assert not relaunch.went_quiet(beat, 109.0, True)      # stamped 9 s ago, 2 intervals not yet past
    assert not relaunch.went_quiet(beat, 109.0, None)      # another node's: its age alone
    assert relaunch.went_quiet(beat, 110.5, None)          # 10.5 s: silent for two intervals
    assert relaunch.went_quiet(beat, 101.0, False)         # its process is gone
    assert relaunch.went_quiet(None, 0.0, None)            # no heartbeat at all


def test_status_gives_a_stopped_run_the_command_that_resumes_it_on_the_hosts_left(tmp_path):
    """A site that runs mpirun itself: --status's one line ends with the command, the hosts of
    the run's last invocation with their ranks (n1 ran ranks 0-1, n2 rank 2, n3 rank 3), less
    those launches.json says a launch lost; a complete run, or one that never placed a rank,
    gets none."""
    from dataclasses import replace
    stopped = replace(record("interrupted", interrupted={"reason": "SIGTERM received", "test": 1}),
                      environment={"hosts": ["n1", "n2", "n3"], "node_of_rank": [0, 0, 1, 2]})
    state = heartbeat.judge(stopped, None, 0.0, None)
    run = str(tmp_path)
    assert heartbeat.resume_words(state, stopped, run) == (
        f"; to resume it: mpirun --host n1:2,n2:1,n3:1 -np 4 python hpcai500.py x.dat --resume {run}"
        " (no lost host on record: leave out any that is down)")
    relaunch.record(run, relaunch.Launch(1, ["n1:2", "n2:1", "n3:1"], 4, 1.0, 2.0, 247, ["n2"], 1.5))
    assert heartbeat.resume_words(state, stopped, run) == (
        f"; to resume it: mpirun --host n1:2,n3:1 -np 3 python hpcai500.py x.dat --resume {run} (n2 left out, lost)")
    relaunch.record(run, relaunch.Launch(2, ["n1:2", "n3:1"], 3, 3.0, 4.0, 247, ["n1", "n3"], 3.5))
    assert heartbeat.resume_words(state, stopped, run) == "; no host of the run is left to resume it on"
    done = replace(stopped, status="complete", interrupted=None)
    assert heartbeat.resume_words(heartbeat.judge(done, None, 0.0, None), done, run) == ""
    assert heartbeat.resume_words(state, replace(stopped, environment={}), run) == ""


def test_the_launcher_options_need_relaunch_and_a_run():
    for args, said in ((["--hosts", "n1:1", "t.dat"], "argument --hosts: only with --relaunch"),
                       (["--relaunch", "--check", "t.dat"], "argument --relaunch: found --check"),
                       (["--relaunch", "--status", "runs/x"], "argument --status: not allowed with argument"
                                                               " --relaunch")):
        q = subprocess.run([sys.executable, str(ROOT / "hpcai500.py"), *args], capture_output=True, text=True,
                           timeout=60)
        assert q.returncode == 1 and said in q.stderr, q.stderr


# ------------------------------------------------------------------ a real run on a simulated cluster
# Test 1 (B 32) short, test 2 (B 8) long; M = 0: as many base models of one rank as the world holds
RELAUNCH_DAT = dict(l9=1, l10=0, l11=1, l13=2, l14="32 8", l15=6, l30=0, l31=0, l35="pytorch")
PROGRESS_DEADLINE = 600   # s: a hang bound (as tests/test_multinode.py's), not a speed figure


def _when(p, err: Path, said, times: int = 1) -> None:
    """Wait until the launcher's stderr holds `said` `times` times (a hang bound: PROGRESS_DEADLINE)."""
    deadline = time.monotonic() + PROGRESS_DEADLINE
    while err.read_text(errors="replace").count(said) < times:
        assert p.poll() is None and time.monotonic() < deadline, err.read_text(errors="replace")[-3000:]
        time.sleep(0.2)


def _launcher(name: str, net: int, folder: Path, times: int, faults, settings: dict | None = None,
              dat: dict | None = None):
    """3 simulated nodes x 1 rank under `--relaunch TIMES`; `faults(p, err, cluster)` kills
    nodes as the run goes. Returns (folder, the launcher's exit status, its stderr, the first
    kill's time.time())."""
    c = simulated_cluster(name, 3, net)
    try:
        (folder / "x.dat").write_text(dat_text(l5=folder / "runs", **(dat or RELAUNCH_DAT)))
        env = mpi_env(True, {"HPCAI500_HEARTBEAT": "0.5", **(settings or {})})
        options = " ".join([*MPIRUN_STDIN, *c.mpirun_args(None, env)])
        err = folder / "err.txt"
        with open(folder / "out.txt", "w") as o, open(err, "w") as e:
            p = subprocess.Popen([sys.executable, str(ROOT / "hpcai500.py"), str(folder / "x.dat"), "--watchdog", "60",
                                  "--relaunch", str(times), "--hosts", "n1:1,n2:1,n3:1", "--mpirun", options],
                                 cwd=folder, env=env, stdout=o, stderr=e, text=True)
        killed = faults(p, err, c)
        p.wait(timeout=PROGRESS_DEADLINE)
    finally:
        c.down()
    return folder, p.returncode, err.read_text(errors="replace"), killed


def _kill_in_test_2(p, err, c, node: str = "n3", times: int = 1) -> float:
    """Once test 2 trains (the `times`-th time it is said: its first epoch's line, 5 of its 6
    epochs to go), kill `node` whole (its init: its daemon and rank at once, as a crash); when.
    At once: a wait of 2 s more outlasted test 2 on a quiet machine, the run complete first."""
    _when(p, err, "test 2/2", times)
    killed = time.time()
    c.kill(node)
    return killed


@pytest.fixture(scope="module")
def relaunched(tmp_path_factory):
    """n3 killed in test 2 under `--relaunch 2`: the run goes on on n1, n2."""
    return _launcher("relaunch", 245, tmp_path_factory.mktemp("relaunch"), 2, _kill_in_test_2)


@pytest.mark.mpi   # its launcher starts mpirun (on a simulated cluster)
def test_a_node_killed_mid_test_is_left_out_and_the_run_completes_through_the_launcher(relaunched):
    folder, code, err, killed = relaunched
    (run,) = [p for p in (folder / "runs").iterdir() if not p.name.startswith(".")]
    first, second = results.launches(str(run))
    assert (first["hosts"], first["lost"], second["hosts"], second["lost"]) == (
        ["n1:1", "n2:1", "n3:1"], ["n3"], ["n1:1", "n2:1"], []), (first, second, err[-3000:])
    assert first["fault"] >= killed and second["started"] >= first["ended"]
    assert "--relaunch: launch 1 ended (mpirun exit " in err and "host(s) n3 lost: relaunch 1 of 2 on n1, n2" in err
    assert "--relaunch: launch 2 ended (mpirun exit 0, the run complete): the run is complete: no relaunch" in err
    res = read_results(folder / "runs")
    # test 1 stands as the first launch wrote it (3 base models); test 2 ran anew on the 2 nodes left
    assert [(t["index"], t["M"]) for t in res["tests"]] == [(1, 3), (2, 2)], res["tests"]
    assert res["status"] == "complete" and len(res["resumed"]) == 1 and code == 0, err[-3000:]
    assert [m["hosts"] for m in res["node_maps"]] == [["n1", "n2", "n3"]]   # test 1's ranks, placed as they ran
    report = (run / "report.txt").read_text()
    assert "RELAUNCH: launch 1 on n1:1,n2:1,n3:1 (3 ranks), " in report and " n3 lost at " in report
    assert "RELAUNCH: this invocation, launch 2, started " in report
    status = subprocess.run([sys.executable, str(ROOT / "hpcai500.py"), "--status", str(run)], capture_output=True,
                            text=True, timeout=60)
    assert status.returncode == 0 and "; relaunched 1 time(s) after host(s) n3 lost" in status.stdout, status.stdout
    verified = subprocess.run([sys.executable, str(ROOT / "hpcai500.py"), "--verify", str(run)], capture_output=True,
                              text=True, timeout=120)
    assert verified.returncode == 0, [x for x in verified.stdout.splitlines() if "FAILED" in x]


@pytest.mark.mpi
def test_a_node_killed_mid_test_costs_the_work_since_the_checkpoints_and_the_relaunch_goes_on_from_them(tmp_path):
    """One test of M = 2 base models of P = 1 on 3 nodes (n3's rank idle), 12 epochs each
    evaluated; n2, job 1's node, killed whole once the evaluation after epoch 3 is said (both
    models have written their checkpoints after epoch 1 by then: the one after epoch 2 may
    still be on its way to disk, behind training). The launcher relaunches on
    n1 and n3, where M = 2 still fits: the test goes on from the newest epoch both models
    have a checkpoint at, those epochs not trained again (each model's MLLOG has every epoch
    once), the span from the checkpoint to training again in its Time; --verify passes."""
    dat = dict(l9=1, l10="2", l11=1, l13=1, l14="8", l15=12, l30=0, l31=1, l35="pytorch")

    def kill(p, err, c):
        _when(p, err, "evaluation after epoch 3")
        killed = time.time()
        c.kill("n2")
        return killed
    folder, code, err, killed = _launcher("ckpt", 242, tmp_path, 1, kill, dat=dat)
    (run,) = [p for p in (folder / "runs").iterdir() if not p.name.startswith(".")]
    res = read_results(folder / "runs")
    assert res["status"] == "complete" and code == 0, err[-3000:]
    (t,) = res["tests"]
    assert 1 <= t["resumed"]["epoch"] <= 11 and t["resumed"]["lost_seconds"] > 0, t["resumed"]
    assert f"going on from its 2 base models' checkpoints after epoch {t['resumed']['epoch']}" in err
    assert [x["epoch"] for x in t["evaluations"]] == list(range(1, 13)) and t["train_seconds"] > (
        t["resumed"]["seconds_before"] + t["resumed"]["lost_seconds"])
    for job in (0, 1):
        events = mllog_events(run / "mllog" / f"test001_rep00_model{job:04d}.log")
        assert [e["metadata"]["epoch_num"] for e in events if e["key"] == "epoch_start"] == list(range(1, 13))
    assert not (run / "checkpoints" / "test-1-rep-0").exists()
    verified = subprocess.run([sys.executable, str(ROOT / "hpcai500.py"), "--verify", str(run)], capture_output=True,
                              text=True, timeout=120)
    assert verified.returncode == 0, [x for x in verified.stdout.splitlines() if "FAILED" in x]


@pytest.mark.mpi
def test_a_node_killed_during_the_relaunch_is_left_out_too_and_the_launcher_gives_up_at_its_limit(tmp_path):
    """n3 killed in test 2, then n2 killed in test 2 of the relaunch, under `--relaunch 1`:
    the second loss finds the limit spent. The launcher says so, names the run and the
    hosts left to resume it on, and exits non-zero; both launches are on record."""
    def twice(p, err, c):
        killed = _kill_in_test_2(p, err, c)
        _kill_in_test_2(p, err, c, "n2", times=2)   # test 2 said again: by the relaunch
        return killed
    folder, code, err, _ = _launcher("giveup", 244, tmp_path, 1, twice)
    (run,) = [p for p in (folder / "runs").iterdir() if not p.name.startswith(".")]
    assert [(x["hosts"], x["lost"]) for x in results.launches(str(run))] == [
        (["n1:1", "n2:1", "n3:1"], ["n3"]), (["n1:1", "n2:1"], ["n2"])], err[-3000:]
    assert "host(s) n3 lost: relaunch 1 of 1 on n1, n2" in err
    assert (f"the run stands in {run}: to resume it on the hosts left, mpirun --host n1:1 -np 1 python hpcai500.py"
            f" {folder / 'x.dat'} --resume {run}") in err
    assert "gave up after 1 relaunch(es), the limit (--relaunch 1)" in err and code != 0, err[-3000:]
    res = read_results(folder / "runs")
    assert [t["index"] for t in res["tests"]] == [1] and res["status"] != "complete"


@pytest.mark.mpi
def test_a_node_frozen_whole_costs_its_base_model_and_the_launcher_ends_the_mpirun_that_waits_for_it(tmp_path):
    """n3 frozen whole in test 2 (every process SIGSTOPped, its daemon too) under `--on-fault
    drop` with ULFM's detector at 10 s: the survivors take its rank for lost and finish the
    run; mpirun then waits for the frozen daemon for good, and the launcher, seeing the run
    written, ends it END_GRACE s later; its exit is --status's (complete with losses), and
    nothing is relaunched (no node was lost to PRRTE)."""
    def freeze(p, err, c):
        _when(p, err, "test 2/2")    # its first epoch's line: at once, as _kill_in_test_2
        c.freeze("n3")
        return time.time()
    folder, code, err, frozen = _launcher("frozen", 243, tmp_path, 1, freeze,
                                          {"HPCAI500_FT_DETECTOR": "10", "HPCAI500_ON_FAULT": "drop"})
    assert "had no rank left on their node to end them" in err, err[-3000:]     # rank 0's word on rank 2
    assert "but mpirun has not exited 30 s later: it waits for a process that cannot answer" in err
    (run,) = [x for x in (folder / "runs").iterdir() if not x.name.startswith(".")]
    (launch,) = results.launches(str(run))
    assert launch["lost"] == [] and launch["exit"] != 0
    assert "the run is complete-with-losses: no relaunch" in err and code == 6, err[-3000:]
    res = read_results(folder / "runs")
    assert [(t["index"], t["jobs_lost"]) for t in res["tests"]] == [(1, []), (2, [2])]


@pytest.mark.mpi
def test_a_signal_to_the_launcher_stops_the_run_cleanly_and_nothing_is_relaunched(tmp_path):
    """SIGUSR1 to the launcher (one host, 2 ranks): it goes on to mpirun, which passes it to
    the ranks (the run's clean stop: rank 0 records it interrupted); the launcher records
    the launch, relaunches nothing and exits non-zero. hpcai500.py blocks these signals for
    its ranks: the launcher takes them again, and mpirun is not left unkillable."""
    (tmp_path / "x.dat").write_text(dat_text(l5=tmp_path / "runs", **RELAUNCH_DAT))
    err = tmp_path / "err.txt"
    with open(tmp_path / "out.txt", "w") as o, open(err, "w") as e:
        p = subprocess.Popen([sys.executable, str(ROOT / "hpcai500.py"), str(tmp_path / "x.dat"), "--relaunch",
                              "--hosts", "localhost:2", "--mpirun", " ".join([*MPIRUN_STDIN, "--oversubscribe"])],
                             cwd=tmp_path, env=mpi_env(True, {}), stdout=o, stderr=e, text=True)
    _when(p, err, "epoch 1/")
    p.send_signal(signal.SIGUSR1)
    p.wait(timeout=PROGRESS_DEADLINE)
    said = err.read_text(errors="replace")
    assert "the launcher was stopped (a signal): no relaunch" in said and p.returncode != 0, said[-3000:]
    (run,) = [x for x in (tmp_path / "runs").iterdir() if not x.name.startswith(".")]
    (launch,) = results.launches(str(run))
    assert launch["hosts"] == ["localhost:2"] and launch["lost"] == []
    res = read_results(tmp_path / "runs")
    assert res["status"] == "interrupted" and res["interrupted"]["reason"].startswith("SIGUSR1 received"), res
