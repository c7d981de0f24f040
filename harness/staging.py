"""Data Duplicator (Multi-Process Management): one node-local copy per node of the samples its jobs train on.

When line 28 names a directory, each node stages once per test. One rank of each job on
the node (the job's lowest rank there) sends the node's writer (its lowest world rank,
node rank 0) the job's distinct resampled indices; the writer merges them one job at a
time into their sorted union and writes those samples (each distinct sample once: a
bootstrap's repeats are repeated indices, not copies, and a sample two jobs drew is one
sample) and the validation set into <dir>/hpcai500-<run>-t<test>-r<rep>-n<node>/, in the
workload's own on-disk format. Every rank with a job then reads the copy through the
workload's reader and trains from it, its job's resample renumbered into the copy: the
same samples in the same order as without staging. So a node holds one copy, at most N
training samples however many jobs it serves, and the shared file system is read once per
node, not once per job (bench/README.md, scale.py: 387 TB a test at 4,096 ranks otherwise).

Pure math (`union`, `renumber`, `senders`, `folder`), MPI at the edge (`stage`, over the
node's communicator, every rank of the node taking part, idle ranks included). A copy can
take longer than the watchdog's limit: the writer beats after each file (or block) written,
and the ranks waiting for it wait in non-blocking barriers, beating.

Timed like MLPerf HPC's staging: from a barrier of the node's ranks before the copy to the
end of the read, max over ranks; reported apart and added to training time as "time to
solution". The writer removes the copy after the test unless kept.
"""
from __future__ import annotations

import errno
import os
import shutil
import socket
import time
from dataclasses import dataclass

import numpy as np

from harness import watchdog

TAG = 0x57A   # the node-local messages of a job's indices to the writer


class StagingError(OSError):
    """The staging directory cannot take the copy; the message names it and why."""


# ---- pure -----------------------------------------------------------------------------

def union(parts) -> np.ndarray:
    """The sorted distinct samples of several resamples (any iterable of index arrays,
    repeats allowed), merged one at a time: `parts` may be a generator that receives them,
    so that no more than the union so far and one part are held."""
    rows = np.empty(0, np.int64)
    for part in parts:
        rows = np.union1d(rows, np.asarray(part, np.int64))
    return rows


def renumber(rows: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """A resample's indices renumbered into the copy of `rows` (sorted, distinct, holding
    every index): rows[renumber(rows, indices)] == indices, repeats and order kept."""
    return np.searchsorted(rows, indices).astype(np.int64)


def senders(jobs) -> dict[int, int]:
    """job -> the node rank that sends the job's distinct indices to the writer: the job's
    lowest rank on the node. `jobs`: the job of each node rank, None for an idle rank."""
    out: dict[int, int] = {}
    for rank, job in enumerate(jobs):
        if job is not None and job not in out:
            out[job] = rank
    return out


def folder(root: str, run_id: str, test: int, rep: int, node: int, wave: int = 0) -> str:
    """A node's copy of a test's repetition; of a wave of `--on-fault retrain` its own (kept apart with line 28's keep)."""
    return os.path.join(root, f"hpcai500-{run_id}-t{test}-r{rep}-n{node}" + (f"-w{wave}" if wave else ""))


# ---- checks ---------------------------------------------------------------------------

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


# ---- the copy (MPI edge) ----------------------------------------------------------------

@dataclass(frozen=True)
class Staged:
    """One rank's part in its node's copy."""
    data: object            # the workload's data read from the copy; None on a writer without a job
    indices: np.ndarray | None  # this rank's job's resample renumbered into the copy; None without a job
    path: str               # the node's copy
    writer: bool            # this rank wrote the copy (and removes it after the test)
    samples: int            # distinct training samples in the node's copy: the union of its jobs' resamples
    copy_bytes: int         # bytes of the node's copy (the writer's count, on every rank: the MLLOG's)
    seconds: float          # s, the node's barrier to the end of this rank's read (writer without a job: write)
    wall: tuple[float, float]  # (start, stop) as time.time(), for the MLLOG

    @property
    def bytes(self) -> int:
        """Bytes this rank wrote: the copy's on the writer, 0 elsewhere."""
        return self.copy_bytes if self.writer else 0


def _no_beat(phase: str | None = None) -> None:
    pass


def stage(workload, data, indices: np.ndarray | None, job: int | None, node, root: str, path: str,
          beat=_no_beat, wait=watchdog.block) -> Staged | None:
    """The node's copy of the union of its jobs' resamples at `path` (under `root`), read
    back by every rank with a job. Collective over `node`, this node's ranks, all of them
    (`job` and `indices` None on an idle rank). `beat(phase=None)` and `wait(request, phase)`
    are the watchdog's (harness/watchdog.py; defaults: no watchdog): the writer beats after
    each file written, the others wait for it in a non-blocking barrier.

    Returns this rank's Staged; None on a rank that neither trains nor wrote (and on every
    rank of a node that serves no job: nothing to copy). Raises StagingError on every rank
    of the node with the writer's message if the writer failed (nothing half-written is
    left), and on a rank that cannot read the copy (DataError, a ValueError, as read raises it)."""
    from mpi4py import MPI
    where = f"staging {os.path.basename(path)}"
    wait(node.Ibarrier(), f"{where}: waiting for the node's ranks")
    t0, wall0 = time.perf_counter(), time.time()
    send = senders(node.allgather(job))
    # this job's distinct indices, on the one rank of the job that hands them to the writer
    mine = np.unique(np.asarray(indices, np.int64)) if job is not None and send[job] == node.rank else None
    writer = node.rank == 0
    err, rows, written = None, None, 0
    if writer:
        beat(f"{where}: merging the node's resamples")
        rows, mine = union(_received(node, send, mine, beat)), None
        if len(rows):
            beat(f"{where}: writing the node's copy")
            shutil.rmtree(path, ignore_errors=True)   # a copy begun by a writer lost in a try redone (elastic.py)
            try:
                written = workload.stage(data, rows, path, progress=lambda: beat())
            except (OSError, ValueError) as e:  # ValueError: the workload's DataError (a source changed)
                shutil.rmtree(path, ignore_errors=True)
                err = _explain(e, root) if isinstance(e, OSError) else f"staging to {path}: {e}"
    elif mine is not None:
        wait(node.Isend([mine, MPI.INT64_T], dest=0, tag=TAG), f"{where}: sending job {job}'s samples")
        mine = None
    wait(node.Ibarrier(), f"{where}: waiting for the node's copy to be written")
    err, n, copy_bytes = node.bcast((err, len(rows), written) if writer else None, root=0)
    if err:
        raise StagingError(err)
    if n == 0:
        return None
    if not writer:
        rows = np.empty(n, np.int64)
    node.Bcast([rows, MPI.INT64_T], root=0)
    if job is None:
        return Staged(None, None, path, True, n, copy_bytes, time.perf_counter() - t0,
                      (wall0, time.time())) if writer else None
    try:
        copy = workload.read(path)
        if copy.n_train != n:
            raise StagingError(f"staged copy {path} holds {copy.n_train} training samples, "
                               f"the node's resamples have {n} distinct ones")
    except (OSError, ValueError):
        if writer:  # no Staged comes back to remove it after the test
            shutil.rmtree(path, ignore_errors=True)
        raise
    local = renumber(rows, indices)
    return Staged(copy, local, path, writer, n, copy_bytes, time.perf_counter() - t0, (wall0, time.time()))


def _received(node, send: dict, mine, beat):
    """The writer's view of each job's distinct indices, one job at a time in job order:
    its own job's, or received from the job's sender on the node."""
    from mpi4py import MPI
    for job, src in sorted(send.items()):
        if src == node.rank:
            yield mine
            continue
        status = MPI.Status()
        node.Probe(source=src, tag=TAG, status=status)
        part = np.empty(status.Get_count(MPI.INT64_T), np.int64)
        node.Recv([part, MPI.INT64_T], source=src, tag=TAG)
        beat()
        yield part


def _explain(e: OSError, root: str) -> str:
    host = socket.gethostname()
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        free = shutil.disk_usage(root).free if os.path.isdir(root) else 0
        return (f"staging directory {root!r} on {host}: disk full while copying the resamples "
                f"({free / 2**20:.1f} MiB free); use a larger node-local directory or less data")
    return f"staging directory {root!r} on {host}: cannot write the copy ({e.strerror or e})"


def cleanup(staged: Staged | None, keep: bool) -> None:
    """Remove the node's copy after the test (the writer's job), unless asked to keep it."""
    if staged is not None and staged.writer and not keep:
        shutil.rmtree(staged.path, ignore_errors=True)
