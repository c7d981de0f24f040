"""bench/gpu_check.sh's choice of mpirun (bench/gpu_mpirun.sh): the one beside the python
(its venv's, the MPI mpi4py was built against) before PATH's, and a check that the pick
starts one world of 2 ranks, not 2 worlds of 1 (issue 67 item 12). Real bash, fake mpiruns."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import mpi_env

ROOT = Path(__file__).resolve().parent.parent


def _bash(script: str, path: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", f". bench/gpu_mpirun.sh; {script}"], cwd=ROOT, capture_output=True,
                          text=True, env={**mpi_env(), "PATH": path}, timeout=120)


def _exe(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/bash\n" + text)
    path.chmod(0o755)
    return path


def test_the_mpirun_beside_the_python_wins_over_paths(tmp_path):
    venv, site = tmp_path / "venv" / "bin", tmp_path / "site" / "bin"
    _exe(venv / "python", "exit 0\n")
    _exe(venv / "mpirun", "exit 0\n")
    _exe(site / "mpirun", "exit 0\n")
    path = f"{site}:/usr/bin:/bin"
    assert _bash(f"pick_mpirun {venv / 'python'}", path).stdout.strip() == str(venv / "mpirun")
    (venv / "mpirun").unlink()
    assert _bash(f"pick_mpirun {venv / 'python'}", path).stdout.strip() == str(site / "mpirun")
    assert _bash(f"pick_mpirun {venv / 'python'}", "/usr/bin:/bin").stdout.strip() in ("", "/usr/bin/mpirun")


@pytest.mark.mpi
def test_an_mpirun_of_another_mpi_is_refused_by_its_two_worlds_of_one(tmp_path):
    """A PATH mpirun of another MPI starts each rank as a singleton: each sees a world of 1."""
    singletons = _exe(tmp_path / "other" / "mpirun",   # --oversubscribe -np 2 PY -c CODE: 2 singleton runs
                      'shift 3; "$@" & "$@"; s=$?; wait $! || exit 1; exit $s\n')
    p = _bash(f"one_world {singletons} {sys.executable}", os.environ["PATH"])
    assert p.returncode != 0 and "a world of 1: this mpirun is not the MPI of mpi4py" in p.stderr
    venv_mpirun = Path(sys.executable).parent / "mpirun"   # the venv's Open MPI: one world of 2
    p = _bash(f"one_world {venv_mpirun} {sys.executable}", os.environ["PATH"])
    assert (p.returncode, p.stdout) == (0, "one world of 2\n"), p.stderr[-2000:]
