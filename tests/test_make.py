"""The Makefile: its venv recipe for one framework or both (make -n: printed, not run), and
the environment its mpiruns get."""
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _recipe(tmp_path, *args) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-n", "venv", f"VENV={tmp_path / 'v'}", *args], cwd=ROOT, capture_output=True,
                          text=True)


def test_one_framework_installs_only_its_packages(tmp_path):
    both = _recipe(tmp_path).stdout
    assert "horovod==0.28.1" in both and "requirements-pytorch.txt" in both and "tensorflow|" not in both
    torch_only = _recipe(tmp_path, "FRAMEWORKS=pytorch").stdout
    assert "horovod" not in torch_only and "requirements-pytorch.txt" in torch_only
    assert "grep -v -E '^(tensorflow|tf-keras|ml-dtypes|#)' requirements.txt" in torch_only   # TensorFlow's pins left out
    tf_only = _recipe(tmp_path, "FRAMEWORKS=tensorflow").stdout
    assert "horovod==0.28.1" in tf_only and "requirements-pytorch.txt" not in tf_only


def test_an_unknown_framework_is_refused_by_name(tmp_path):
    p = _recipe(tmp_path, "FRAMEWORKS=pytorch jax")
    assert p.returncode != 0 and "FRAMEWORKS: found 'jax', expected tensorflow, pytorch and/or mindspore" in p.stderr


def test_mindspore_gets_a_venv_of_its_own(tmp_path):
    """MindSpore's venv: requirements.txt without TensorFlow and its NumPy pin, with
    requirements-mindspore.txt in the same pip call, no Horovod; beside TensorFlow it is
    refused, naming the protobufs; `make test` builds it for the suite."""
    ms = _recipe(tmp_path, "FRAMEWORKS=mindspore").stdout
    assert "grep -v -E '^(tensorflow|tf-keras|ml-dtypes|numpy=|#)' requirements.txt" in ms
    assert f"-m pip install --no-cache-dir -r {tmp_path / 'v'}/requirements.txt -r requirements-mindspore.txt" in ms
    assert "horovod" not in ms and "requirements-pytorch.txt" not in ms
    both = _recipe(tmp_path, "FRAMEWORKS=tensorflow mindspore")
    assert both.returncode != 0 and "MindSpore 2.10 needs protobuf >= 7.34, TensorFlow 2.18 < 6" in both.stderr
    test = subprocess.run(["make", "-n", "test", f"VENV={tmp_path / 'v'}", f"MSVENV={tmp_path / 'm'}"], cwd=ROOT,
                          capture_output=True, text=True).stdout
    assert f"venv VENV={tmp_path / 'm'} FRAMEWORKS=mindspore" in test
    assert f"--mindspore-venv={tmp_path / 'm'} tests" in test


def test_a_gpu_venv_holds_one_framework_and_every_venv_is_pip_checked(tmp_path):
    """Issue 67 item 4: TensorFlow's and torch's CUDA builds pin their own NCCL and cuDNN;
    one venv cannot hold both, so GPU=1 with both is refused naming the two venvs to make;
    with one it builds, and every venv's install ends with pip check."""
    both = _recipe(tmp_path, "GPU=1")
    assert both.returncode != 0 and "GPU=1: found FRAMEWORKS 'tensorflow pytorch', expected one" in both.stderr
    torch_gpu = _recipe(tmp_path, "GPU=1", "FRAMEWORKS=pytorch")
    assert torch_gpu.returncode == 0 and "requirements-pytorch.txt" in torch_gpu.stdout
    tf_gpu = _recipe(tmp_path, "GPU=1", "FRAMEWORKS=tensorflow").stdout
    assert "HOROVOD_GPU_OPERATIONS=NCCL" in tf_gpu and "requirements-pytorch.txt" not in tf_gpu
    for out in (_recipe(tmp_path).stdout, torch_gpu.stdout, tf_gpu, _recipe(tmp_path, "FRAMEWORKS=mindspore").stdout):
        lines = out.splitlines()
        check = lines.index(f"{tmp_path / 'v'}/bin/python -m pip check")
        assert lines[check + 1] == f"touch {tmp_path / 'v'}/.installed"   # the last step before the stamp


def test_the_venvs_frameworks_are_the_default(tmp_path):
    """A venv made for PyTorch alone stays so when `make run` names no frameworks."""
    (tmp_path / "v").mkdir()
    (tmp_path / "v" / "frameworks").write_text("pytorch\n")
    assert "horovod" not in _recipe(tmp_path).stdout


def test_make_launches_with_pmixs_hash_job_store():
    """Every mpirun that `make` starts (run, check, test, bench) gets PMIX_MCA_gds=hash: PMIx
    5.0.8's shared-memory job store sometimes fails a rank's start (docs/troubleshooting.md,
    "PMIX_ERR_OUT_OF_RESOURCE at start"). A recipe's shell shows what the Makefile exports."""
    env = {k: v for k, v in os.environ.items() if k != "PMIX_MCA_gds"}
    p = subprocess.run(["make", "-s", "--eval", 'pmixcheck: ; @echo "$$PMIX_MCA_gds"', "pmixcheck"], cwd=ROOT,
                       env=env, capture_output=True, text=True)
    assert (p.returncode, p.stdout) == (0, "hash\n"), p.stderr


def test_the_venv_turns_ulfm_on_for_its_own_mpi_only(tmp_path):
    """make venv writes ULFM's parameters into the venv's Open MPI files (scripts/ulfm.sh:
    a plain mpirun then survives a rank's death, harness/elastic.py); a site MPI's files
    are the site's (MPI=site)."""
    assert f"bash scripts/ulfm.sh {tmp_path / 'v'}/etc" in _recipe(tmp_path).stdout
    assert "scripts/ulfm.sh" not in _recipe(tmp_path, "MPI=site").stdout


def test_a_new_venv_is_refused_beforehand_where_its_disk_has_no_room(tmp_path):
    """A venv made anew first asks scripts/room.sh for room (pip, out of room, stops inside an
    800 MB wheel with Errno 28): the sum of its parts, by framework; the script, run for real,
    names the free and the needed megabytes and the disk, and passes where there is room."""
    assert f'scripts/room.sh {tmp_path / "v"} 4700 "tensorflow pytorch"' in _recipe(tmp_path).stdout
    assert f'scripts/room.sh {tmp_path / "v"} 4500 "mindspore"' in _recipe(tmp_path, "FRAMEWORKS=mindspore").stdout
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize // 2**20
    short = subprocess.run(["bash", "scripts/room.sh", str(tmp_path / "v"), str(free + 10**6), "mindspore"], cwd=ROOT,
                           capture_output=True, text=True)
    assert short.returncode == 1 and f"expected at least {free + 10**6} MB: a venv with mindspore" in short.stderr
    assert short.stderr.startswith("scripts/room.sh: found ") and f"(for {tmp_path / 'v'})" in short.stderr
    room = subprocess.run(["bash", "scripts/room.sh", str(tmp_path / "v"), "1", "mindspore"], cwd=ROOT,
                          capture_output=True, text=True)
    assert (room.returncode, room.stderr) == (0, "")


def test_pips_temporary_folder_on_another_disk_needs_room_for_the_wheel(tmp_path):
    """Where $TMPDIR is another file system than the venv's (a small /tmp on a login node),
    it must hold the largest wheel pip downloads there; one that does not exist is left to pip."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or not os.access(shm, os.W_OK) or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no second file system here (/dev/shm) to put TMPDIR on")
    tmp = Path(tempfile.mkdtemp(dir=shm))
    try:
        def room(tmpdir, download):
            return subprocess.run(["bash", "scripts/room.sh", str(tmp_path / "v"), "1", "mindspore", str(download)],
                                  cwd=ROOT, capture_output=True, text=True, env={**os.environ, "TMPDIR": str(tmpdir)})
        short = room(tmp, 10**9)
        assert short.returncode == 1 and f"(pip's temporary folder {tmp}), expected at least {10**9} MB" in short.stderr
        for tmpdir, download in ((tmp, 1), (tmp_path / "none", 10**9)):
            ok = room(tmpdir, download)
            assert (ok.returncode, ok.stderr) == (0, ""), (tmpdir, ok.stderr)
    finally:
        tmp.rmdir()
