"""Files written whole or not at all, and data prepared once per node.

Everything the harness writes that another process may read (results, reports, MLLOG
files, cached synthetic data, index and statistics caches, staged copies) goes through
`atomic_path`: the content is written under a temporary name in the same folder and
renamed into place, so a reader sees the old file or the whole new one, never half.
Temporary names carry the host and the process id: the results directory may be on a
file system that several nodes share.

`node_once` is the one protocol by which one rank of a node prepares data that the
node's other ranks then read. Its error is raised only after the node barrier, so a
failing writer never leaves its peers waiting in the barrier while it waits in the
agreed-error exchange (a hang until the watchdog fires). No MPI here: the caller
passes the node rank and the barrier.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
from contextlib import contextmanager


def temporary_name(path: str) -> str:
    """A name beside `path`, unique to this host and process."""
    folder, base = os.path.split(os.path.abspath(path))
    return os.path.join(folder, f".{base}.tmp-{socket.gethostname()}-{os.getpid()}")


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.unlink(path)


@contextmanager
def atomic_path(path: str):
    """Yield a temporary path to write a file (or a directory) at; on success it is
    renamed to `path`, on failure removed. A directory that another writer renamed into
    place first (two nodes preparing one shared cache) is kept, and ours dropped."""
    tmp = temporary_name(path)
    _remove(tmp)  # a leftover of a killed process with our pid
    try:
        yield tmp
        try:
            os.replace(tmp, path)
        except OSError:
            if not (os.path.isdir(tmp) and os.path.isdir(path)):
                raise
            _remove(tmp)  # the other writer's identical directory stands
    except BaseException:
        _remove(tmp)
        raise


def atomic_write(path: str, data: str | bytes | tuple) -> None:
    """Write text or bytes whole or not at all (flushed to disk before the rename); a tuple
    of bytes is written piece after piece (a checkpoint's header, then its state: not
    copied into one first)."""
    pieces = data if isinstance(data, tuple) else (data,)
    with atomic_path(path) as tmp:
        with open(tmp, "w" if isinstance(pieces[0], str) else "wb") as f:
            for piece in pieces:
                f.write(piece)
            f.flush()
            os.fsync(f.fileno())


def write_json(path: str, obj) -> None:
    atomic_write(path, json.dumps(obj, indent=1, sort_keys=False) + "\n")


def node_once(node_rank: int, node_barrier, prepare) -> None:
    """Run `prepare()` on the node's rank 0 while the node's other ranks wait; every
    rank passes the barrier, and only then is the writer's error raised (on the writer).
    The others go on to read and fail on their own if the data is not there, and the
    caller's agreed error names the lowest failing rank: the writer on the first node."""
    err = None
    if node_rank == 0:
        try:
            prepare()
        except Exception as e:  # noqa: BLE001 - re-raised after the barrier
            err = e
    node_barrier()
    if err is not None:
        raise err
