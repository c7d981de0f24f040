"""The benchmark for real: hpcai500.py under mpirun --oversubscribe, real Horovod, real TF."""
import json
import subprocess
import time

import numpy as np
import pytest

from harness import mllog, sampler
from harness.workloads import Dataset, digits
from tests.conftest import (ROOT, dat_text, forwarded, mpi_env, mpirun, mpirun_cmd, mpirun_ended,
                            mpirun_says, mpirun_started, results, without)


@pytest.mark.slow
def test_shipped_file_end_to_end(tmp_path):
    """The README's `make run`: HPCAI500.dat as shipped, 4 ranks, M = 1, 2, 4; with PyTorch
    unimportable (a TensorFlow run imports no PyTorch: a node with TensorFlow alone). The
    micro-kernels at test sizes: .ci/run's `make run` times them at full size."""
    text = (ROOT / "HPCAI500.dat").read_text().replace("runs          results", f"{str(tmp_path / 'r'):<13} results")
    (tmp_path / "HPCAI500.dat").write_text(text)
    p = mpirun(4, ["HPCAI500.dat"], tmp_path, program=without(tmp_path, "torch"))
    assert p.returncode == 0, p.stderr[-3000:]
    run_dir = tmp_path / "r" / next(d for d in (tmp_path / "r").iterdir() if not d.name.startswith(".")).name
    report = (run_dir / "report.txt").read_text()
    assert report.count("...... PASSED") == 3 and "FAILED" not in report
    assert "3 tests completed and passed consistency checks" in report
    assert "End of Tests." in report
    # device 6: the same report on stdout, as mpirun forwarded it (it lost bytes here once, 2026-11-28)
    assert forwarded(p.stdout, report), (len(p.stdout), len(report), p.stdout[-500:])
    # TensorFlow's native start-up chatter stays off a CPU-only machine's terminal
    assert not [ln for ln in p.stderr.splitlines() if "cuInit" in ln or "Unable to register" in ln
                or "absl::InitializeLog" in ln], p.stderr[:3000]
    epochs = int(text.splitlines()[14].split()[0])
    assert p.stderr.count(f"epoch {epochs}/{epochs}") == 3   # one progress line per epoch per test
    res = results(tmp_path / "r")
    assert res["status"] == "complete" and len(res["tests"]) == 3
    for t in res["tests"]:
        assert t["consistency"]["passed"] and t["consistency"]["max_diff"] == 0.0
        assert len(t["base_quality"]) == t["M"]
        assert t["quality"] > 0.5                        # 10 classes: chance is 0.1
        # bagging on real data: never below its worst model, and the 4 models' ensemble above their
        # mean (2 models at 98.3 and 99.2 % can average to half a sample under their mean: seed luck)
        assert t["quality"] >= min(t["base_quality"])
        assert t["quality"] >= np.mean(t["base_quality"]) or t["M"] < 4
        assert t["flops"] == pytest.approx(t["total_flops"] / t["train_seconds"])
        assert t["total_flops"] == t["samples_trained"] * t["training_flops_per_sample"]
        assert t["training_flops_per_sample"] == 3 * t["forward_flops_per_sample"]
        # the short-span rule, as timed: a warning in the record and the report iff under 2 s
        short = [w for w in t["warnings"] if w.startswith("timed span ")]
        assert len(short) == (t["train_seconds"] < 2.0), (t["train_seconds"], t["warnings"])
        assert all(f"Warning     : {w}" in report for w in short)
    assert [t["M"] for t in res["tests"]] == [1, 2, 4]
    scaling = next(ln for ln in report.splitlines() if ln.startswith("Scaling (digits, tensorflow, B 32, fp32, P 1)"))
    assert "Sys_scale 1 -> 4" in scaling
    assert scaling.endswith("(timed spans under 2 s: indicative)") == any(t["train_seconds"] < 2 for t in res["tests"])
    assert res["charts"] == ["scaling.png", "quality-test001.png", "quality-test002.png", "quality-test003.png",
                             "roofline.png"]   # no two layouts share a scale: no trade-off chart
    assert all((run_dir / c).read_bytes()[:4] == b"\x89PNG" for c in res["charts"])
    assert len(res["roofline"]["fp32"]["per_rank"]) == 4 and res["roofline"]["fp32"]["gemm_flops"] > 0
    for t in res["tests"]:   # FLOPS / sum of the used ranks' measured GEMM figures
        gemm = sum(res["roofline"]["fp32"]["per_rank"][r]["gemm"]["flops"] for j in t["jobs"] for r in j)
        assert t["utilisation"]["gemm"] == pytest.approx(t["flops"] / gemm)
    assert "Utilisation : " in report and "Roofline (fp32, per rank" in report
    _check_mllogs(tmp_path / "r", n_files=1 + 2 + 4, epochs=epochs, tests=res["tests"])


def test_jobs_of_two_ranks_keep_replicas_equal_and_models_different(bagging_run):
    """M = 2, P = 2: Horovod all-reduce inside each job; each job its own resample.
    (The shared run of tests/conftest.py; its staging: tests/test_staging.py.)"""
    folder, p = bagging_run
    assert p.returncode == 0, p.stderr[-3000:]
    assert "PASSED" not in p.stdout                       # device 8: the report goes to the file
    assert "...... PASSED" in (folder / "report.out").read_text()
    t = results(folder / "runs")["tests"][0]
    assert t["jobs"] == [[0, 1], [2, 3]]
    w = t["weights_digest"]
    assert w[0][0] == w[0][1] and w[1][0] == w[1][1]      # replicas identical inside a job
    assert w[0][0] != w[1][0]                             # base models differ across jobs
    n = digits.load(Dataset.parse("embedded"), "").n_train
    for job in (0, 1):                                    # rank 0 drew them; each job got its own
        expect = sampler.resample(n, "poisson", 42, job)
        assert t["resample"][job]["digest"] == sampler.digest(expect)
        assert t["resample"][job]["size"] == len(expect)
        assert t["steps_per_epoch"][job] == len(expect) // (2 * 32)
    assert t["resample"][0]["size"] != t["resample"][1]["size"]
    assert t["samples_trained"] == sum(s * 2 * 32 * 2 for s in t["steps_per_epoch"])
    _check_mllogs(folder / "runs", n_files=2, epochs=2, tests=[t])


def _check_mllogs(results_dir, n_files, epochs, tests):
    """One MLLOG file per base model, read back by mlperf-logging's own parser; run_stop
    says success exactly when the test's ensemble reached its target quality."""
    from mlperf_logging.compliance_checker.mlp_parser import parse_file
    run = next(d for d in results_dir.iterdir() if not d.name.startswith("."))
    files = sorted((run / "mllog").iterdir())
    assert len(files) == n_files
    for f in files:
        job = int(f.stem.split("model")[1])
        lines, errors = parse_file(str(f), ruleset="3.0.0")
        assert errors == []
        keys = [ln.key for ln in lines]
        for key in ("init_start", "init_stop", "run_start", "run_stop", "seed", "global_batch_size",
                    "train_samples", "eval_samples", "number_of_nodes", "accelerators_per_node", "eval_accuracy"):
            assert key in keys, (f.name, key)
        assert keys.count("epoch_start") == keys.count("epoch_stop") == epochs
        assert {ln.value["metadata"]["instance_id"] for ln in lines} == {job}
        stop = next(ln for ln in lines if ln.key == "run_stop")
        test = next(t for t in tests if t["index"] == int(f.stem.split("_")[0].removeprefix("test")))
        reached = test["quality"] >= test["target_quality"]
        assert stop.value["metadata"]["status"] == ("success" if reached else "aborted"), (f.name, test["quality"])
        assert mllog.check(str(f)) == [], f.name          # MLPerf HPC's checker, our rules


def test_check_prints_the_map_without_training(run_dat, tmp_path):
    p = run_dat(2, ["--check"], l9=3, l10="0 0 1", l11="1 2 1", l30=0)
    assert p.returncode == 0, p.stderr
    maps = p.stdout.split("\ntest ")[1:]
    assert len(maps) == 3, p.stdout
    assert maps[0].startswith("1: B32C32SR digits M=2 P=1 B=32 fp32")                 # M=0: world / P jobs
    assert "job    0 : ranks 0 on" in maps[0] and "job    1 : ranks 1 on" in maps[0]
    assert "job    0 : ranks 0-1 on" in maps[1] and "job    1" not in maps[1]          # M=0, P=2: one job
    assert "idle     : ranks 1" in maps[2]                                             # M=1, P=1 on 2 ranks
    assert "idle" not in maps[0] + maps[1]
    assert not (tmp_path / "runs").exists()


def test_no_layout_that_fits_stops_every_rank_with_one_message(run_dat, tmp_path):
    """A refusal by the plan every rank agrees on. The other refusals before training,
    each with a real run: a parser error, a file-level error, a bad setting, command-line
    misuse (tests/test_bad_input.py); data, aggregation, staging, batch, with --check and
    a run (tests/test_plan.py); an agreed data error on every workload
    (tests/test_workload_cache.py)."""
    p = run_dat(2, l9=1, l10=3, l11=2, l30=0)
    assert p.returncode == 1, (p.returncode, p.stderr[-2000:])
    assert p.stderr.count("hpcai500: error:") == 1, p.stderr[-2000:]  # printed once, by rank 0
    assert "test.dat:10-11: found '3 x 2', expected M x P <= 2: M x P = 3 x 2 = 6 exceeds the world size 2 (test 1)" \
        in p.stderr and "error: rank" not in p.stderr, p.stderr[-2000:]
    assert "Traceback" not in p.stderr
    assert not (tmp_path / "runs").exists()


# Failures during a run, one run a kind: a raise (rank 1, not the rank that writes the results), in
# training, in evaluation, before the run folder exists (a raise is a bug, not a fault: it ends the run
# under --on-fault drop too; a SIGKILLed rank, world rank 0's included: tests/test_elastic.py). The
# fault specs themselves: tests/test_reliability_units.py.
FAILURES = [("1:5", "rank 1 failed during training, test 1: RuntimeError", "tensorflow"),
            ("1:eval", "rank 1 failed during evaluation, test 1: RuntimeError", "pytorch"),
            ("1:roofline", "rank 1 failed during roofline micro-kernels", "tensorflow")]


@pytest.fixture(scope="module")
def failing_runs(tmp_path_factory):
    """The three runs of FAILURES at once, {fault: (folder, CompletedProcess)}: a raise in a
    test waits up to elastic.DETECT_SECONDS (10 s) for ULFM to name a dead partner before it
    is taken for a bug, asleep, and no watchdog limit or timing is asserted here, so the runs
    share the cores without changing what they show (16 + 18 + 5 s one after the other)."""
    started = {}
    for fault, _, framework in FAILURES:
        folder = tmp_path_factory.mktemp("fault")
        started[fault] = folder, mpirun_started(folder, 2, [], {"HPCAI500_FAULT": fault}, l9=1, l10=1, l11=2,
                                                l15=1, l30=int(fault.endswith("roofline")), l35=framework)
    return {fault: (folder, mpirun_ended(p, folder)) for fault, (folder, p) in started.items()}


@pytest.mark.parametrize("fault,expect,framework", FAILURES)
def test_a_failing_rank_ends_the_whole_job(failing_runs, fault, expect, framework):
    """No rank may be left blocked in a collective when its partner dies: Horovod's
    all-reduce (a rank raising or killed in training), the harness's evaluation reduction
    (PyTorch's job), the micro-kernels' barrier."""
    folder, p = failing_runs[fault]
    assert p.returncode != 0
    if expect:   # a raise: where it was raised, in the failing rank's traceback
        assert 'rank 1:   File "' in p.stderr and "harness/fault.py" in p.stderr, p.stderr[-2000:]
        assert "rank 1: RuntimeError: fault injected by HPCAI500_FAULT" in p.stderr, p.stderr[-2000:]
    if fault.endswith("roofline"):   # before the run folder exists: nothing written
        assert expect in p.stderr, p.stderr[-2000:]
        assert not (folder / "runs").exists() or not any(
            d for d in (folder / "runs").iterdir() if not d.name.startswith("."))
        return
    assert expect in p.stderr, p.stderr[-2000:]
    t = results(folder / "runs")  # parses: nothing half-written
    # MPI_Abort makes mpirun SIGTERM the other ranks: rank 0 may record the interruption
    assert t["status"] in ("running", "interrupted") and t["tests"] == []


@pytest.mark.parametrize("launcher,sig,received,framework", [
    ("mpirun", "SIGUSR1", "SIGUSR1", "tensorflow"),
    ("mpirun", "SIGINT", "SIGTERM", "pytorch"),        # Ctrl-C: mpirun passes it on as SIGTERM
    pytest.param("singleton", "SIGTERM", "SIGTERM", "tensorflow", marks=pytest.mark.slow)])
def test_a_signal_keeps_finished_tests_and_records_the_interrupted_one(tmp_path, launcher, sig, received, framework):
    """A batch system's time limit, or a Ctrl-C of mpirun: the finished test stands, the
    current one is recorded, with the signal that reached the ranks and where such a one
    comes from. Test 2 (B 16, 8 epochs: a few seconds) is still training when the signal,
    sent once test 1's consistency line is read and test 2 has said its first epoch, arrives
    (sent at the consistency line alone, it reached a singleton before test 2 had begun, in
    1 of 3 fresh-clone suites: recorded as between the tests, test None). The run folder is
    named on stderr at the start: after a Ctrl-C mpirun forwards no more of the ranks' output."""
    import signal
    import threading
    from harness import signals
    (tmp_path / "t.dat").write_text(dat_text(l5=tmp_path / "runs", l9=1, l10=1, l11=1, l13=2, l14="32 16", l15=8,
                                             l30=0, l35=framework))
    env = mpi_env()
    # Open MPI forwards SIGUSR1 to the ranks (it kills them on SIGTERM); singleton: no mpirun
    cmd = mpirun_cmd(2 if launcher == "mpirun" else None, [tmp_path / "t.dat"])
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    said, begun = [], threading.Event()

    def read_stderr():   # rank 0's progress lines: test 2 under way once it has said an epoch
        for line in p.stderr:
            said.append(line)
            if "test 2/2 " in line and " : epoch " in line:
                begun.set()
    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    for line in p.stdout:        # wait for test 1's consistency line, then stop test 2
        if "...... PASSED" in line:
            break
    assert begun.wait(120), "".join(said)[-3000:]
    p.send_signal(getattr(signal, sig))
    out = p.stdout.read()
    p.wait(timeout=120)
    reader.join(timeout=30)
    err = "".join(said)
    assert p.returncode != 0
    res = results(tmp_path / "runs")
    assert res["status"] == "interrupted" and len(res["tests"]) == 1
    reason = signals.reason(getattr(signal, received))
    assert res["interrupted"] == {"reason": reason, "test": 2}
    assert reason.startswith(f"{received} received (") and (sig != "SIGINT" or "Ctrl-C" in reason)
    run = next(d for d in (tmp_path / "runs").iterdir() if not d.name.startswith("."))
    assert f"hpcai500: results in {run}/ (report.txt" in err
    report = (run / "report.txt").read_text()
    assert f"Interrupted: {reason} during test 2" in report and report.rstrip().endswith("=" * 80)
    assert "Tests interrupted." in report
    # what it finished verifies, but it is no result to submit: --verify's own exit status
    code, out = _status("--verify", run)
    last = out.rstrip().splitlines()[-1]
    assert code == 2 and "...... FAILED" not in out, out[-3000:]
    assert f"(interrupted: {reason} during test 2; 1 of 2 test run(s) finished): " in last, last
    assert last.endswith(" 0 failed ...... INCOMPLETE"), last


# What a test proves is the harness's (heartbeat, resume, telemetry, idle ranks), the same
# code for every framework: PyTorch trains it, its ranks starting in a fraction of
# TensorFlow's time. TensorFlow keeps the runs where Horovod is part of what is proven
# (a rank failing or hanging in its all-reduce, the signals) and the other-load test (its
# one rank keeps one core busy; PyTorch's takes both cores' threads).
HARNESS_ONLY = {"l35": "pytorch"}


def _status(*args):
    """`hpcai500.py ARGS` (--status, --summarize: no MPI): (exit status, stdout)."""
    import sys
    p = subprocess.run([sys.executable, str(ROOT / "hpcai500.py"), *map(str, args)], capture_output=True, text=True,
                       timeout=60)
    return p.returncode, p.stdout


def _finished(runs) -> int:
    """Test runs results.json records as finished (0 before it exists)."""
    try:
        return len(results(runs)["tests"])
    except (AssertionError, FileNotFoundError, ValueError):
        return 0


def test_a_job_killed_at_once_is_told_dead_and_resumes(tmp_path):
    """Every process of the job SIGKILLed at once once test 1 has passed (a batch system's
    hard kill, a node losing power): nobody records anything, results.json stays
    `running`. Its heartbeat's process is gone, so --status says dead (5) at once and
    --summarize says so beside the rows; --resume finishes the run, and --status then
    exits 0. Trained by PyTorch (HARNESS_ONLY)."""
    import signal

    import psutil
    (tmp_path / "t.dat").write_text(dat_text(l5=tmp_path / "runs", l9=1, l10=1, l11=1, l13=2, l14="32 16", l15=4,
                                             l30=0, **HARNESS_ONLY))
    env = mpi_env()
    cmd = mpirun_cmd(2, [tmp_path / "t.dat"])
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=tmp_path)
    for line in p.stdout:
        if "...... PASSED" in line:
            break
    deadline = time.monotonic() + 60      # the report's block is printed before results.json is rewritten
    while not _finished(tmp_path / "runs") and time.monotonic() < deadline:
        time.sleep(0.05)
    job = psutil.Process(p.pid).children(recursive=True) + [psutil.Process(p.pid)]
    for proc in job:          # the ranks first: mpirun must not see one die and stop the others itself
        proc.send_signal(signal.SIGKILL)
    p.wait(timeout=60)
    res = results(tmp_path / "runs")
    assert res["status"] == "running" and [t["index"] for t in res["tests"]] == [1]
    run = next(d for d in (tmp_path / "runs").iterdir() if not d.name.startswith("."))
    code, out = _status("--status", tmp_path / "runs")       # the results directory: its newest run
    assert code == 5, out
    assert out.startswith(f"{run}: dead: not running: last heartbeat at ") and \
        "that process is gone; status left `running`; 1 of 2 test run(s) finished; to resume it: mpirun --host " in out
    # the command that resumes it on the run's host with its 2 ranks: a site that runs mpirun itself
    assert out.rstrip().endswith(f" -np 2 python hpcai500.py {tmp_path / 't.dat'} --resume {run} (no lost host on"
                                 " record: leave out any that is down)"), out
    code, out = _status("--summarize", run)
    assert code == 0 and f"{run.name:<24} dead: not running: last heartbeat at " in out, out
    code, out = _status("--verify", run)        # test 1 verifies; the run is no result to submit
    assert code == 2 and "...... FAILED" not in out and "Incomplete run: results.json says `running`" in out, out
    _resume(cmd, env, tmp_path, run, res)
    assert _status("--status", run) == (0, f"{run}: complete: every test PASSED; 2 of 2 test run(s) finished\n")


def test_other_load_is_reported_warned_and_verified(tmp_path):
    """One rank trains while another process spins on the machine's other core: the
    report's Telemetry line shows that core of other load (the suite's other worker may
    add up to the rest of its own core), the test warns, --verify re-derives it.
    bench/common.py's noise gauge, the same counter over the whole run, agrees with it
    on a quiet machine: bench/telemetry.py --other-load measures that."""
    import os
    import sys
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 cores: one for the rank, one for the spinner")
    from harness import verify
    (tmp_path / "t.dat").write_text(dat_text(l5=tmp_path / "runs", l9=1, l10=1, l11=1, l15=10, l30=0, l31=0))
    cores = sorted(os.sched_getaffinity(0))
    spin = subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cores[-1]}}})\n"
                             "while True: pass"])
    try:
        p = mpirun(1, [tmp_path / "t.dat"], tmp_path)
    finally:
        spin.kill()
        spin.wait()
    assert p.returncode == 0, p.stderr[-3000:]
    out = p.stdout
    (t,) = results(tmp_path / "runs")["tests"]
    (machine,) = t["other_load"]
    assert machine["ranks"] == 1 and 0.75 < machine["other_cores"] < 2.05, machine
    assert f"other processes {machine['other_cores']:.2f} cores ({machine['hosts'][0]})" in out, out
    assert "a little below 0 on a quiet machine" in out    # the convention says why -0.02 cores is no fault
    assert [w for w in t["warnings"] if w.startswith("processes other than the run kept")], t["warnings"]
    assert "Warning     : processes other than the run kept" in out
    run = next(d for d in (tmp_path / "runs").iterdir() if not d.name.startswith("."))
    assert verify.main(str(run), out=open(os.devnull, "w")) == 0


def _resume(cmd, env, tmp_path, run, before):
    """--resume runs only what is missing, in the same folder, with the same input. Its
    refusals (every test finished, another input file) are checked on the same folder
    in-process: a refusal's exit on every rank is tests/test_bad_input.py's."""
    from harness import dat, plan
    from harness.errors import RunError
    p = subprocess.run(cmd[:-1] + ["--resume", str(run), cmd[-1]], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    after = json.loads((run / "results.json").read_text())
    assert after["status"] == "complete" and [t["index"] for t in after["tests"]] == [1, 2]
    assert after["tests"][0] == before["tests"][0]          # the finished test stands as it was
    assert (run / "report.txt").read_text().count("...... PASSED") == 2 and len(after["resumed"]) == 1
    # the report says which test the earlier invocation timed (results.json: tests[].invocation)
    assert [t["invocation"] for t in after["tests"]] == [0, 1]
    fw = after["tests"][0]["framework"]
    report = (run / "report.txt").read_text()    # not stdout: mpirun's forwarding can lose bytes
    assert f"Test 1 : {fw} ; timed by invocation 1 of 2 (before --resume), as recorded then\n" in report
    assert f"Test 2 : {fw}\n" in report
    same = dat.parse(cmd[-1])
    other = dat.parse_text(same.text.replace("42 ", "43 "), str(tmp_path / "other.dat"))
    with pytest.raises(RunError, match="nothing to resume, all 2 tests finished"):   # with that run's settings
        plan.resumed(str(run), same, 2, after["settings"])
    with pytest.raises(RunError, match="other.dat is not the input file that run used"):
        plan.resumed(str(run), other, 2, after["settings"])


# The watchdog's limit in the two runs below must exceed the longest legitimate gap
# between two beats (an idle rank waiting for its partner's start and model build, the
# first step). Measured 2026-11-28 over a whole suite (-n 2, an Intel Xeon where `make
# run` takes 12.7 s), each rank logging its longest gap: PyTorch's runs of 2-5 ranks at
# most 4.6 s (1.95 s in the run below that spares), TensorFlow's 8.8 s in this file's
# runs of the digits (its import, in `device set-up`; 18.7 s for ic's first build and
# tracing). The hang is TensorFlow's (rank 0 stuck in Horovod's all-reduce: the watchdog's
# thread must run while Horovod's op blocks the main one; no other test hangs Horovod),
# under 30 s, 3.4 x its gap; the spared idle rank is the harness's, PyTorch's, under 15 s,
# 3 x PyTorch's gap, 2 x on a machine 1.6 x slower. Each second of limit is a second of the
# suite spent waiting. The watchdog's own logic: tests/test_reliability_units.py.
WATCHDOG = 15
WATCHDOG_TENSORFLOW = 30


@pytest.fixture(scope="module")
def watchdog_runs(tmp_path_factory):
    """The two runs below, overlapped: each spends most of its time asleep (a hung rank's
    30 s, a slowed rank's 22 s of sleeps), so the second starts once the first has hung,
    after its import and model build, whose CPU would otherwise stretch the second's gaps
    between beats (its limit's margin). Returns {"hang": ..., "idle": ...}, each (folder,
    CompletedProcess). 41 + 29 s of the suite one after the other, ~42 s so."""
    hang, idle = tmp_path_factory.mktemp("hang"), tmp_path_factory.mktemp("idle")
    # rank 1 stops making progress at step 5; TensorFlow's: Horovod's all-reduce holds rank 0
    first = mpirun_started(hang, 2, ["--watchdog", WATCHDOG_TENSORFLOW, "--on-fault", "abort"],
                           {"HPCAI500_FAULT": "1:5:hang"}, l9=1, l10=1, l11=2, l15=2, l30=0)
    mpirun_says(first, hang, "HPCAI500_FAULT fires: hang")
    # rank 0 trains 1 epoch of 90 steps of 16, sleeping fault.SLOW_STEP s before each (~22 s at no CPU
    # cost, whatever the machine's speed); rank 1, idle (M = 1, P = 1), waits for the job in one go
    second = mpirun_started(idle, 2, ["--watchdog", WATCHDOG], {"HPCAI500_FAULT": "0:0:slow"}, l9=1, l10=1, l11=1,
                            l14=16, l15=1, l30=0, l31=0, **HARNESS_ONLY)
    return {"hang": (hang, mpirun_ended(first, hang)), "idle": (idle, mpirun_ended(second, idle))}


def test_watchdog_aborts_a_job_stuck_in_a_collective(watchdog_runs):
    """Rank 1 stops making progress (alive, not dead): rank 0 waits in Horovod's
    all-reduce; the watchdog turns that silent hang into an abort naming the phase.
    Under `--on-fault abort`: under drop a hung rank ends alone (tests/test_elastic.py)."""
    _, p = watchdog_runs["hang"]
    assert p.returncode != 0
    assert "no progress for" in p.stderr and "during training, test 1" in p.stderr, p.stderr[-2000:]
    assert f"(watchdog limit {WATCHDOG_TENSORFLOW} s); aborting the job" in p.stderr


def test_watchdog_spares_ranks_that_wait_for_other_jobs(watchdog_runs):
    """An idle rank waits a whole test for the job to finish: that is not a hang. The
    job's rank trains longer than the limit, slowly and at no CPU cost (HPCAI500_FAULT's
    `slow`). Trained by PyTorch (HARNESS_ONLY): an idle rank is the harness's, whatever
    the framework."""
    from harness import fault
    folder, p = watchdog_runs["idle"]
    enough = WATCHDOG * 1.25     # past the limit and the watchdog's next look (every limit / 4 at most)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "no progress" not in p.stderr
    t = results(folder / "runs")["tests"][0]
    assert t["idle_ranks"] == [1]
    assert t["train_seconds"] > max(enough, fault.SLOW_STEP * t["epochs"] * sum(t["steps_per_epoch"]))   # idle wait
    # the idle rank's wait is the job's training, not evaluation time: eval_seconds is the job's. Counted as
    # evaluation, that wait (the whole training, then the job's evaluation) would put eval_seconds above
    # train_seconds; the job's own evaluation of the digits is a fraction of its ~22 s of sleeps
    assert t["eval_seconds"] < t["train_seconds"]


def test_run_folders_never_collide(tmp_path):
    """Two invocations in the same second get two folders (exclusive creation)."""
    from mpi4py import MPI
    from harness.driver import _make_run_dir
    made = {_make_run_dir(MPI.COMM_SELF, str(tmp_path)) for _ in range(50)}
    assert len(made) == 50 and all(p.startswith(str(tmp_path)) for p in made)


@pytest.mark.parametrize("framework,expect", [("pytorch", {"index": 3, "visible": "3"}), ("mindspore", None)])
def test_a_test_samples_the_gpu_its_own_framework_pinned_at_set_up(monkeypatch, framework, expect):
    """Issue 67, items 6 and 7, without MPI: a sweep of PyTorch (GPU 3, pinned at set-up as
    local rank 3 of 4) and MindSpore (its CPU build). After a loss renumbered this rank local
    rank 1, a PyTorch test still samples GPU 3, and a MindSpore test samples no GPU (it is
    charged none): each test reads its own framework's record, never the local rank."""
    from types import SimpleNamespace as NS
    from harness import frameworks, run, telemetry
    opened, sampled = [], []

    class Stop(Exception):
        pass

    def sampler(interval=1.0, gpu=None):
        sampled.append(gpu)
        raise Stop
    monkeypatch.setattr(telemetry, "Sampler", sampler)
    job = NS(build=lambda *a: "model", abandon=lambda: None)
    monkeypatch.setattr(frameworks, "get", lambda name: NS(open_job=lambda spec: opened.append(spec) or job))
    devices = {"pytorch": {"device": "GPU 3 of 4", "gpus_on_node": 4, "nccl": True, "gpu": {"index": 3, "visible": "3"}},
               "mindspore": {"device": "CPU", "gpus_on_node": 0, "nccl": False, "gpu": None}}
    ctx = run.Context(NS(comm_precision="fp32", allreduce="ring"), NS(detects=False), NS(local_rank=1,
                      node_of_rank=(0, 0)), devices, "run", {}, 1, {})
    test = NS(framework=framework, P=2, batch=8, mode="data", index=1, precision="fp32")
    part = run.Part(ctx, NS(test=test, layout=NS(jobs=((0, 1),))), 0, 1, None, None, NS(beat=lambda *a: None, seconds=0.0),
                    job=0)
    with pytest.raises(Stop):
        run._base_model(part, None, None)
    assert sampled == [expect] and opened[0].gpus_on_node == devices[framework]["gpus_on_node"]
