"""A node's cache writer that fails never hangs the run.

harness/files.py in process: `node_once` passes the node barrier on every rank and
raises the writer's error only after it; `atomic_path` leaves nothing behind on failure
and keeps a directory another writer renamed into place first. Then each workload for
real under mpirun on 2 ranks, with a cache directory that cannot be written (a regular
file at `<results>/.data`: we run as root, so permissions would not stop a write): one
agreed error naming the cache, exit status 1, well before any watchdog."""
import os
import socket
from pathlib import Path

import pytest

from harness import files


# ---- node_once -------------------------------------------------------------------

def test_node_once_failing_writer_passes_the_barrier_then_raises():
    events = []
    boom = OSError("cannot write the cache")

    def prepare():
        events.append("prepare")
        raise boom

    with pytest.raises(OSError) as err:
        files.node_once(0, lambda: events.append("barrier"), prepare)
    assert err.value is boom                      # the writer's own error, unchanged
    assert events == ["prepare", "barrier"]       # raised after the one barrier


def test_node_once_other_ranks_wait_and_do_not_prepare():
    events = []
    for rank in (1, 3):
        files.node_once(rank, lambda: events.append("barrier"), lambda: events.append("prepare"))
    assert events == ["barrier", "barrier"]
    files.node_once(0, lambda: events.append("barrier"), lambda: events.append("prepare"))
    assert events[2:] == ["prepare", "barrier"]


# ---- atomic_path and atomic_write ------------------------------------------------

def test_temporary_name_is_beside_the_target_and_unique_to_host_and_pid(tmp_path):
    tmp = files.temporary_name(str(tmp_path / "cache.npz"))
    assert os.path.dirname(tmp) == str(tmp_path)
    assert socket.gethostname() in os.path.basename(tmp) and str(os.getpid()) in os.path.basename(tmp)
    assert os.path.basename(tmp).startswith(".")  # hidden from readers listing the folder


@pytest.mark.parametrize("kind", ["file", "directory"])
def test_atomic_path_failure_leaves_neither_target_nor_temporary(tmp_path, kind):
    target = tmp_path / "data"
    with pytest.raises(RuntimeError, match="writer died"):
        with files.atomic_path(str(target)) as tmp:
            if kind == "file":
                with open(tmp, "w") as f:
                    f.write("half")
            else:
                os.makedirs(os.path.join(tmp, "inner"))
                open(os.path.join(tmp, "inner", "x.h5"), "w").close()
            assert os.path.exists(tmp)
            raise RuntimeError("writer died")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("kind", ["file", "directory"])
def test_atomic_path_success_renames_into_place(tmp_path, kind):
    target = tmp_path / "data"
    with files.atomic_path(str(target)) as tmp:
        if kind == "file":
            Path(tmp).write_text("whole")
        else:
            os.makedirs(tmp)
            (Path(tmp) / "x").write_text("whole")
        assert not target.exists()                # readers see nothing until the rename
    assert (target if kind == "file" else target / "x").read_text() == "whole"
    assert os.listdir(tmp_path) == ["data"]


def test_atomic_path_keeps_a_directory_another_writer_renamed_first(tmp_path):
    target = tmp_path / "synthetic"
    with files.atomic_path(str(target)) as tmp:
        os.makedirs(tmp)
        (Path(tmp) / "ours").write_text("ours")
        target.mkdir()                            # the other node's writer finished first
        (target / "theirs").write_text("theirs")
    assert os.listdir(target) == ["theirs"]
    assert os.listdir(tmp_path) == ["synthetic"]  # ours dropped


@pytest.mark.parametrize("data", ["text é\n", b"\x00bytes\xff"])
def test_atomic_write_text_and_bytes(tmp_path, data):
    target = tmp_path / "out"
    target.write_text("old")
    files.atomic_write(str(target), data)
    assert (target.read_bytes() if isinstance(data, bytes) else target.read_text()) == data
    assert os.listdir(tmp_path) == ["out"]


# ---- every workload under mpirun, its cache unwritable ---------------------------

@pytest.mark.mpi
@pytest.mark.parametrize("workload,dataset", [
    ("digits", "synthetic:64:8"),
    ("ic", "synthetic:16:16"),
    ("ewa", "synthetic:10:64"),
])
def test_unwritable_cache_is_one_agreed_error_not_a_hang(run_dat, tmp_path, workload, dataset):
    runs = tmp_path / "runs"
    runs.mkdir()
    cache = runs / ".data"
    cache.write_text("a regular file where the cache directory goes\n")
    p = run_dat(2, l7=workload, l8=dataset, l9=1, l10=1, l11=1, l30=0, timeout=60)
    errors = [line for line in p.stderr.splitlines() if "hpcai500: error:" in line]
    assert p.returncode == 1, p.stderr[-3000:]
    assert len(errors) == 1, p.stderr[-3000:]
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    assert str(cache) in errors[0]
    assert cache.read_text().startswith("a regular file")   # nothing written over it
