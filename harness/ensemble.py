"""Job Controller (Bagging Management): the base models' predictions -> the ensemble.

Both aggregations are a sum over models of a per-model score matrix, so the world
needs one reduction, never a gather of all M models' predictions on one rank:
  mean: scores = class probabilities; ensemble = argmax of their average;
  vote: scores = one-hot of each model's predicted class; ensemble = majority class
        (ties go to the lowest class index). A row may hold many predictions (deepcam:
        a class per pixel): the workload's VOTE_GROUP says how many adjacent columns
        one vote chooses among (default: the whole row).
A detection workload (ENSEMBLE = "stack") fuses the models' detections itself: each
model writes into its own columns of the reduced array, so the sum is their union.
"""
from __future__ import annotations

import tempfile

import numpy as np

# Line 24's choices: name -> (T/V code (none), meaning). harness/dat.py reads them here.
AGGREGATIONS = {"mean": ("", "mean of the models' probabilities"), "vote": ("", "majority vote")}
_REDUCE_ROWS_ELEMENTS = 1 << 22   # reduce in slices of ~32 MB (float64) to bound memory
EVAL_CHUNK_BYTES = 1 << 28        # a chunked evaluation's float64 scores a chunk (256 MB), on a job root and rank 0


def model_scores(probs: np.ndarray, method: str, group: int | None = None) -> np.ndarray:
    """One base model's contribution to the ensemble sum; `group`: the columns a vote
    chooses among (None: the whole row)."""
    if method == "mean":
        return probs.astype(np.float64)
    if method == "vote":
        choices = probs.reshape(-1, group or probs.shape[1])
        votes = np.zeros(choices.shape, np.float64)
        votes[np.arange(len(choices)), np.argmax(choices, axis=1)] = 1.0
        return votes.reshape(probs.shape)
    raise ValueError(f"unknown aggregation {method!r} (expected one of {', '.join(AGGREGATIONS)})")


def stacks(workload) -> bool:
    """The workload fuses the M models' outputs itself (detection) instead of summing them."""
    return workload.ENSEMBLE == "stack"


def reduced_shape(n: int, width: int, M: int, stack: bool) -> tuple[int, int]:
    """The shape of the world-reduced array: (n, width) summed, or M slots of width."""
    return (n, M * width) if stack else (n, width)


def contribution(scores: np.ndarray, method: str, job: int, M: int, stack: bool,
                 group: int | None = None) -> np.ndarray:
    """Base model `job`'s term of the world sum (zeros outside its own slot if `stack`);
    `group` as model_scores'."""
    if not stack:
        return model_scores(scores, method, group)
    width = scores.shape[1]
    out = np.zeros(reduced_shape(len(scores), width, M, True), np.float64)
    out[:, job * width:(job + 1) * width] = scores
    return out


def ensemble_scores(total: np.ndarray, M: int, stack: bool, kept: int | None = None) -> np.ndarray:
    """What the workload's quality() gets: the mean score matrix over the `kept` models
    that contributed (M unless base models were lost: harness/elastic.py), or (n, M,
    width), a lost model's slot all zeros (no detections)."""
    return total.reshape(total.shape[0], M, -1) if stack else total / (M if kept is None else kept)


class Kept:
    """World rank 0's summed scores of one evaluation, chunk by chunk, kept for a wave of
    `--on-fault retrain` (harness/run.py), whose evaluations add them to the retrained
    models' terms. In a temporary file (deleted once closed or collected), so that rank 0's
    memory stays a chunk's whatever the validation set (deepcam: 21 MB a sample)."""

    def __init__(self):
        self._file = tempfile.TemporaryFile()
        self._at = []   # (byte offset, shape) of each chunk

    def add(self, total: np.ndarray) -> None:
        self._at.append((self._file.seek(0, 2), total.shape))
        np.ascontiguousarray(total, np.float64).tofile(self._file)

    def chunk(self, i: int) -> np.ndarray:
        offset, shape = self._at[i]
        self._file.seek(offset)
        return np.fromfile(self._file, np.float64, int(np.prod(shape))).reshape(shape)


def chunks(n: int, width: int, per_sample: bool, rows: int | None = None) -> list[slice]:
    """The validation rows an evaluation scores together: all n at once, unless the
    quality is a mean over samples; then `rows` at a time (HPCAI500_EVAL_CHUNK, for
    tests), by default as many as EVAL_CHUNK_BYTES of float64 scores of `width` columns
    hold (at least one)."""
    step = (rows or max(1, EVAL_CHUNK_BYTES // (8 * max(1, width)))) if per_sample else max(1, n)
    return [slice(lo, min(n, lo + step)) for lo in range(0, n, step)]


def my_rows(n: int, rank: int, size: int) -> slice:
    """The contiguous block of the validation set that rank `rank` of a job predicts."""
    bounds = np.linspace(0, n, size + 1).astype(int)
    return slice(bounds[rank], bounds[rank + 1])


def gather_job(job_comm, local: np.ndarray, n: int) -> np.ndarray | None:
    """The job's full prediction matrix on the job's root (None elsewhere)."""
    from mpi4py import MPI
    counts = [(my_rows(n, r, job_comm.size).stop - my_rows(n, r, job_comm.size).start) * local.shape[1]
              for r in range(job_comm.size)]
    full = np.empty((n, local.shape[1]), np.float64) if job_comm.rank == 0 else None
    job_comm.Gatherv(np.ascontiguousarray(local, np.float64),
                     [full, counts, None, MPI.DOUBLE] if full is not None else None, root=0)
    return full


def reduce_scores(world, scores: np.ndarray | None, shape: tuple[int, int]) -> np.ndarray | None:
    """Sum of every job root's score matrix, on world rank 0, in bounded slices.
    Ranks that are not job roots (and idle ranks) contribute zeros."""
    from mpi4py import MPI
    mine = np.zeros(shape, np.float64) if scores is None else np.ascontiguousarray(scores, np.float64)
    total = np.empty(shape, np.float64) if world.rank == 0 else None
    step = max(1, _REDUCE_ROWS_ELEMENTS // max(1, shape[1]))
    for lo in range(0, shape[0], step):
        hi = min(shape[0], lo + step)
        world.Reduce(mine[lo:hi], None if total is None else total[lo:hi], op=MPI.SUM, root=0)
    return total
