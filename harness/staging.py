"""Data Duplicator (Multi-Process Management): each job's resample, copied to node-local storage.

When line 28 names a directory, the ranks of a job that share a node elect one
writer (the job's lowest rank on that node). It writes the job's resample (each
distinct sample once: a bootstrap's repeats are repeated indices, not copies) and the
validation set into <dir>/hpcai500-<run>-t<test>-r<rep>-j<job>-n<node>/, in the
workload's own on-disk format. Every rank of the job on that node then reads the copy
through the workload's reader and trains from it, the resample's indices renumbered
into the copy. So a node holds one copy per job it serves, never one per rank.

Timed like MLPerf HPC's staging: from a barrier of the job's ranks before the copy to
the end of the read, max over the job's ranks; reported apart and added to training
time as "time to solution". The copy is removed after the test unless kept.
"""
from __future__ import annotations

import errno
import os
import shutil
import socket
import time
from dataclasses import dataclass

import numpy as np


class StagingError(OSError):
    """The staging directory cannot take the copy; the message names it and why."""


def plan(indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rows, local): the distinct samples to copy, sorted, and the resample's indices
    renumbered into the copy, so that rows[local] == indices."""
    rows, local = np.unique(indices, return_inverse=True)
    return rows, local.astype(np.int64)


def folder(root: str, run_id: str, test: int, rep: int, job: int, node: int) -> str:
    return os.path.join(root, f"hpcai500-{run_id}-t{test}-r{rep}-j{job}-n{node}")


def probe(root: str) -> int:
    """Check before any test that `root` exists or can be made, and takes a file; the
    free bytes there. A full disk shows as an error when the copy is written."""
    try:
        os.makedirs(root, exist_ok=True)
        if not os.path.isdir(root):
            raise StagingError(f"staging directory {root!r} on {socket.gethostname()}: not a directory")
        test = os.path.join(root, f".hpcai500-probe-{os.getpid()}")
        with open(test, "wb") as f:
            f.write(b"\0" * 4096)
        os.unlink(test)
        return shutil.disk_usage(root).free
    except StagingError:
        raise
    except OSError as e:
        raise StagingError(f"staging directory {root!r} on {socket.gethostname()}: not writable "
                           f"({e.strerror or e})") from None


@dataclass
class Staged:
    data: object            # the workload's data, read from the copy
    indices: np.ndarray     # the resample renumbered into the copy
    path: str
    writer: bool            # this rank wrote the copy (and removes it)
    samples: int            # distinct training samples in the copy
    bytes: int              # bytes written (0 on readers)
    seconds: float          # barrier to the end of the read, this rank
    wall: tuple[float, float]  # (start, stop) as time.time(), for the MLLOG


def stage(workload, data, indices: np.ndarray, job_comm, root: str, path: str) -> Staged:
    """Copy this job's resample to `path` (under `root`) on this node, one writer per
    job per node, and read it back. Collective over `job_comm`; raises StagingError on
    every rank of the job on this node if the writer failed (nothing half-written is left)."""
    from harness.topology import node_comm
    local = node_comm(job_comm)          # this job's ranks on this node
    try:
        rows, renumbered = plan(indices)
        job_comm.Barrier()
        t0, wall0 = time.perf_counter(), time.time()
        err, written = None, 0
        if local.rank == 0:
            try:
                written = workload.stage(data, rows, path)
            except (OSError, ValueError) as e:  # ValueError: the workload's DataError (a source changed)
                shutil.rmtree(path, ignore_errors=True)
                err = _explain(e, root) if isinstance(e, OSError) else f"staging to {path}: {e}"
        err = local.bcast(err, root=0)
        if err:
            raise StagingError(err)
        staged = workload.read(path)
        seconds = time.perf_counter() - t0
        if staged.n_train != len(rows):
            raise StagingError(f"staged copy {path} holds {staged.n_train} training samples, "
                               f"the resample has {len(rows)} distinct ones")
        return Staged(staged, renumbered, path, local.rank == 0, len(rows), written, seconds,
                      (wall0, time.time()))
    finally:
        local.Free()


def _explain(e: OSError, root: str) -> str:
    host = socket.gethostname()
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        free = shutil.disk_usage(root).free if os.path.isdir(root) else 0
        return (f"staging directory {root!r} on {host}: disk full while copying the resample "
                f"({free / 2**20:.1f} MiB free); use a larger node-local directory or less data")
    return f"staging directory {root!r} on {host}: cannot write the copy ({e.strerror or e})"


def cleanup(staged: Staged | None, keep: bool) -> None:
    """Remove this rank's copy after the test (the writer's job), unless asked to keep it."""
    if staged is not None and staged.writer and not keep:
        shutil.rmtree(staged.path, ignore_errors=True)
