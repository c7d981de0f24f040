"""Shared helpers: run hpcai500.py under a real mpirun, with an edited HPCAI500.dat."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # before any test imports TensorFlow


def dat_text(**lines) -> str:
    """The shipped HPCAI500.dat with some lines' values replaced: dat_text(l5='x', l10='2 2')."""
    rows = (ROOT / "HPCAI500.dat").read_text().splitlines()
    for key, value in lines.items():
        n = int(key[1:])
        free = rows[n - 1][14:]  # the shipped file keeps values in a 14-column field
        rows[n - 1] = f"{str(value):<13} {free}"
    return "\n".join(rows) + "\n"


def mpirun(np_: int, args: list[str], cwd: Path, timeout: int = 300, quick: bool = True) -> subprocess.CompletedProcess:
    """quick: the roofline micro-kernels at test sizes (the shipped-file test runs them full)."""
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", TF_CPP_MIN_LOG_LEVEL="2", TF_USE_LEGACY_KERAS="1",
               HPCAI500_ROOFLINE_QUICK="1" if quick else "0")
    cmd = [str(BIN / "mpirun"), "--oversubscribe", "-np", str(np_), sys.executable, str(ROOT / "hpcai500.py"), *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def results(results_dir: Path) -> dict:
    runs = sorted(p for p in results_dir.iterdir() if not p.name.startswith("."))
    assert len(runs) == 1, runs
    return json.loads((runs[0] / "results.json").read_text())


@pytest.fixture
def run_dat(tmp_path):
    """Write a dat file in tmp_path (results under tmp_path/runs) and run it."""
    def run(np_, extra_args=(), timeout=300, **lines):
        lines.setdefault("l5", str(tmp_path / "runs"))
        path = tmp_path / "test.dat"
        path.write_text(dat_text(**lines))
        return mpirun(np_, [*extra_args, str(path)], tmp_path, timeout)
    return run
