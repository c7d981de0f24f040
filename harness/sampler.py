"""Data Sampler (Bagging Management): one resample of the training set per base model.

The math is pure numpy; `distribute` is the MPI edge. World rank 0 draws every
job's indices (one seeded generator per job, so a job's resample does not depend on
M) and sends each job's array to that job's root only, which broadcasts it inside
the job: no rank ever holds another job's indices.
"""
from __future__ import annotations

import collections
import hashlib

import numpy as np

from harness import watchdog

# Line 23's choices: name -> (T/V code, meaning). harness/dat.py reads them from here.
METHODS = {"bootstrap": ("B", "N draws with replacement"),
           "poisson": ("P", "each sample Poisson(1) times"),
           "none": ("N", "the whole set, shuffled per job")}


def rng_for(seed: int, job: int, *stream: int) -> np.random.Generator:
    """Independent, reproducible stream per (seed, job[, epoch...]) via SeedSequence."""
    return np.random.default_rng([seed, job, *stream])


def resample(n: int, method: str, seed: int, job: int) -> np.ndarray:
    """Indices (int64) of job `job`'s training resample of a training set of n samples.

    bootstrap: n draws with replacement (each sample appears Binomial(n, 1/n) ~ Poisson(1)
               times; a fraction (1-1/n)^n ~ 36.8 % is out of bag).
    poisson:   each sample kept Poisson(1) times independently (online bagging, as the
               BenchCouncil reference does); the resample size varies around n.
    none:      the whole training set, shuffled per job (pure data parallelism baseline).
    """
    if n < 1:
        raise ValueError(f"cannot resample an empty training set (n={n})")
    rng = rng_for(seed, job)
    if method == "bootstrap":
        return rng.integers(0, n, size=n, dtype=np.int64)
    if method == "poisson":
        idx = np.repeat(np.arange(n, dtype=np.int64), rng.poisson(1.0, size=n))
        rng.shuffle(idx)
        return idx
    if method == "none":
        return rng.permutation(n).astype(np.int64)
    raise ValueError(f"unknown sampler {method!r} (expected one of {', '.join(METHODS)})")


def out_of_bag_fraction(indices: np.ndarray, n: int) -> float:
    """Fraction of the n training samples that the resample never uses."""
    return 1.0 - np.unique(indices).size / n


def digest(indices: np.ndarray) -> str:
    """Short content hash of a resample, recorded in results.json for reproducibility."""
    return hashlib.sha256(np.ascontiguousarray(indices, dtype="<i8").tobytes()).hexdigest()[:16]


def epoch_shard(indices: np.ndarray, seed: int, job: int, epoch: int,
                rank: int, size: int, batch: int) -> np.ndarray:
    """The sample indices rank `rank` of a job of `size` ranks trains on in `epoch`.

    Every rank of the job shuffles the job's resample with the same (seed, job, epoch)
    stream, then takes every size-th sample. The shard is cut to steps*batch where
    steps = len(indices) // (size*batch) is the same on every rank: Horovod's
    all-reduce needs the same number of steps everywhere, or the job hangs.
    """
    steps = len(indices) // (size * batch)
    order = rng_for(seed, job, 1 + epoch).permutation(len(indices))
    return indices[order[rank::size][: steps * batch]]


IN_FLIGHT = 4   # resamples rank 0 keeps while their sends complete, whatever M


class _Arrival:
    """A message's arrival as a request (Test, Wait), so that a rank can wait for its
    resample beating the watchdog (watchdog.wait) before it knows the message's size."""

    def __init__(self, comm, source: int, tag: int):
        from mpi4py import MPI
        self.comm, self.source, self.tag, self.status = comm, source, tag, MPI.Status()

    def Test(self) -> bool:  # noqa: N802 (MPI's name, as watchdog.wait calls it)
        return self.comm.Iprobe(source=self.source, tag=self.tag, status=self.status)

    def Wait(self) -> None:  # noqa: N802
        self.comm.Probe(source=self.source, tag=self.tag, status=self.status)


def never(error: BaseException) -> bool:
    """No error is passed over (distribute's default)."""
    return False


def distribute(world, jobs: list[list[int]], n: int, method: str, seed: int,
               job_comm, my_job: int | None, wait=watchdog.block, passed=never) -> np.ndarray | None:
    """Rank 0 draws each job's resample and sends it to the job's root (world rank
    jobs[j][0]); the root broadcasts it on the job's communicator. Ranks outside
    any job (idle) return None.

    Rank 0's memory is bounded whatever M: at most IN_FLIGHT resamples wait for their
    sends (a send's buffer must live until it completes), plus its own job's, so
    (IN_FLIGHT + 1) x N x 8 bytes, not M x N x 8 (10.5 GB for ImageNet at M = 1,024).
    The resamples are those of `resample(n, method, seed, j)`, drawn in job order.

    Drawing is serial on rank 0 (minutes for thousands of jobs with poisson): every wait
    here goes through `wait(request, phase)`, the watchdog's (harness/watchdog.py; the
    default, watchdog.block, blocks), so that the last jobs' ranks are not taken for hung ones.

    `passed(error)`: whether rank 0 goes on past a send that failed with `error` (a job's
    root that died: its job is lost, which the caller's next world step finds; the other
    jobs still get theirs). Rank 0's other errors, and every error elsewhere, raise."""
    from mpi4py import MPI
    tag = 0x5A3
    mine = None
    if world.rank == 0:
        def settle(send, *args):
            try:
                return send(*args)
            except Exception as e:  # noqa: BLE001 - `passed` says which errors a lost root explains
                if not passed(e):
                    raise
                return None

        pending = collections.deque()   # (request, buffer) of the sends under way, oldest first
        for j, ranks in enumerate(jobs):
            if not ranks:   # a job this pass does not train (a wave of --on-fault retrain: harness/run.py)
                continue
            idx = resample(n, method, seed, j)
            if ranks[0] == 0:
                mine = idx
                continue
            if len(pending) == IN_FLIGHT:
                # its root posts its receive at once: no deadlock
                settle(wait, pending.popleft()[0], f"sending job {j - IN_FLIGHT}'s resample")
            req = settle(world.Isend, [idx, MPI.INT64_T], ranks[0], tag)
            if req is not None:
                pending.append((req, idx))
        for req, _ in pending:
            settle(wait, req, "sending the last resamples")
    elif my_job is not None and jobs[my_job][0] == world.rank:
        arrival = _Arrival(world, 0, tag)
        wait(arrival, f"waiting for job {my_job}'s resample from rank 0")
        mine = np.empty(arrival.status.Get_count(MPI.INT64_T), dtype=np.int64)
        world.Recv([mine, MPI.INT64_T], source=0, tag=tag)
    if my_job is None:
        return None
    wait(job_comm.Ibarrier(), f"waiting for job {my_job}'s resample from its root")
    count = job_comm.bcast(None if mine is None else len(mine), root=0)
    if mine is None:
        mine = np.empty(count, dtype=np.int64)
    job_comm.Bcast([mine, MPI.INT64_T], root=0)
    return mine
