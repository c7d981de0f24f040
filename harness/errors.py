"""Errors every rank agrees on.

A failure that one rank sees alone (a file it cannot read, a directory it cannot
write) must end the run on every rank, or the others wait forever in their next
collective. `agree` runs a step on every rank and turns any rank's failure into the
same `RunError` on all of them; rank 0 prints it once as `FILE:LINE: found 'X',
expected Y` (or the step's own message), the failing rank after it where ranks
differ, and every rank exits with status 1.
The communicator is passed in: any object with `allgather` and `size` serves, so the
logic is tested without MPI. A failure no rank can foresee (a bug) is not agreed:
the rank prints `crash`'s traceback and the driver aborts the job.
"""
from __future__ import annotations

import os
import sys
import tempfile
import traceback
from contextlib import contextmanager


class RunError(Exception):
    """An error every rank agreed on; printed once by rank 0."""


def say(msg: str) -> None:
    """A line for the user on stderr (stdout stays the pasteable report)."""
    print(f"hpcai500: {msg}", file=sys.stderr, flush=True)


def crash(rank: int, phase: str, exc: BaseException) -> str:
    """What a rank prints when it fails in a way the harness does not foresee (a bug, or a
    library's failure): the traceback, each line marked with the rank (under mpirun the
    ranks' stderr interleaves), then `hpcai500: rank R failed during PHASE: Type: message`
    last, where a reader of the output's tail looks. Without the traceback a bug report
    could name the exception but not where it was raised. Pure."""
    lines = "".join(traceback.format_exception(exc)).rstrip("\n").splitlines()
    return "\n".join([f"rank {rank}: {line}" for line in lines]
                     + [f"hpcai500: rank {rank} failed during {phase}: {type(exc).__name__}: {exc}"])


def agree(comm, fn, what: str):
    """Run fn on every rank; if it fails on any rank, raise RunError on all of them
    with the lowest failing rank's message (a lone failing rank would hang the rest)."""
    try:
        value, err = fn(), None
    except Exception as e:  # noqa: BLE001 - turned into an agreed error below
        value, err = None, f"{what}: {e}" if what else str(e)
    first_failure(comm, err)
    return value


def first_failure(comm, err: str | None, error: type[Exception] = RunError) -> None:
    """Exchange each rank's error (None for none); raise the lowest rank's on all, as
    `error` (RunError: printed once and exit 1; RuntimeError inside a test, where only
    some ranks take part and the driver must abort the rest). The rank is named after the
    message, and only where the ranks differ: a message every rank gave alike is no rank's
    own (the input's, or every node's), and a message about the input begins with its
    `FILE:LINE: found ...`, where a rank before it would hide the line a user looks for."""
    errors = comm.allgather(err)
    failed = [(r, e) for r, e in enumerate(errors) if e]
    if failed:
        r, e = failed[0]
        alike = all(other == e for other in errors)
        raise error(e if alike else f"{e} (rank {r}; {len(failed)} of {comm.size} ranks failed)")


@contextmanager
def native_stderr_captured():
    """Capture the process's native stderr (file descriptor 2) for the duration: at
    start-up and at its first XLA compilation TensorFlow's C++ runtime prints a dozen
    lines per rank (cuInit failures and cuDNN/cuBLAS factory registrations on a machine
    without a GPU, XLA service banners) that mean nothing to the user. Yields a list
    that receives the captured text at the end, for the caller to show when it matters;
    on an exception the text is printed before the exception goes on."""
    out: list[str] = []
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        failed = False
        try:
            yield out
        except BaseException:
            failed = True
            raise
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            out.append(sink.read().decode(errors="replace"))
            if failed:
                sys.stderr.write(out[0])
                sys.stderr.flush()
