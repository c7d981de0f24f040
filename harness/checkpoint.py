"""Checkpoints along a test (issue 70): a base model's state at an evaluation, whole or absent.

A lost node costs the run a relaunch on the nodes left (harness/relaunch.py); what the test
under way had trained is kept only where its base models wrote their state down. A
checkpoint holds one base model's state after an evaluation epoch: the framework's bytes
(its weights, its optimizer's slots, its step number and random streams:
Trainer.state) and a header of what the harness knows (the epoch, the figures so far). It
lives in the run folder, which is on the file system the nodes share, as on any cluster:
`checkpoints/test-T-rep-R/job-J-epoch-E.ckpt`.

Whole or absent: a file is written under a temporary name beside its own, flushed to disk
and renamed (files.atomic_write), so a writer killed mid-way leaves no file of that name.
A file a failing disk or file system tore anyway is caught at reading: its header holds the
payload's length and SHA-256, checked again, and a file that fails is refused, named, and
the one before it read instead. The two newest of a base model are kept for that reason.

The run writes them (harness/run.py): each base model's root after every HPCAI500_CHECKPOINT-th
evaluation but the last, world rank 0 its record of the test beside them (save_test), and
--resume goes on from the newest epoch every model has one at (resume_epoch). A framework's
state is its own bytes (PyTorch's torch.save) or its arrays by pack. Pure functions but
`save`, `save_test`, `load_test`, `epochs`, `load`, `readable`, `latest` and `discard` (files); no
framework imported.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil

import numpy as np

from harness import files

SETTING = "HPCAI500_CHECKPOINT"      # evaluations between a base model's checkpoints (harness/settings.py)
FORMAT = "hpcai500-checkpoint 1"     # the first line of every checkpoint: what it is, its layout's version
KEEP = 2                             # checkpoints kept of a base model: the newest may be torn
FOLDER = "checkpoints"               # in the run folder
TEST_STATE = "test.json"             # world rank 0's record of the test beside its checkpoints (save_test)
_NAME = re.compile(r"job-(\d+)-epoch-(\d+)\.ckpt")


class CheckpointError(ValueError):
    """A checkpoint that cannot be read: its message is `FILE: found ..., expected ...`."""


def folder(run_dir: str, test: int, rep: int) -> str:
    """Where one test run's checkpoints live (a test of several repetitions: each its own)."""
    return os.path.join(run_dir, FOLDER, f"test-{test}-rep-{rep}")


def name(job: int, epoch: int) -> str:
    return f"job-{job}-epoch-{epoch}.ckpt"


def due(epoch: int, evaluations: list[int], every: int) -> bool:
    """Whether a base model writes its checkpoint after the evaluation of `epoch` (pure):
    after every `every`-th of the test's `evaluations` (train.evaluation_epochs) but the
    last, which ends training (every 0: never). due(4, [2, 4, 6], 2) is True."""
    if every < 1 or epoch not in evaluations[:-1]:
        return False
    return (evaluations.index(epoch) + 1) % every == 0


def encode(header: dict, payload: bytes) -> bytes:
    """A checkpoint's bytes (pure): FORMAT, the header as one JSON line with the payload's
    length and SHA-256 added, then the payload."""
    return _head(header, payload) + payload


def _head(header: dict, payload: bytes) -> bytes:
    """encode's bytes before the payload (pure)."""
    head = {**header, "payload_bytes": len(payload), "payload_sha256": hashlib.sha256(payload).hexdigest()}
    return f"{FORMAT}\n{json.dumps(head, sort_keys=True)}\n".encode()


def decode(blob: bytes, where: str) -> tuple[dict, bytes]:
    """(the header, the payload) of a checkpoint's bytes (pure); CheckpointError naming
    `where` and what is wrong where they are not a whole checkpoint."""
    first, _, rest = blob.partition(b"\n")
    if first.decode(errors="replace") != FORMAT:
        raise CheckpointError(f"{where}: found {first[:40]!r} on its first line, expected {FORMAT!r}")
    line, newline, payload = rest.partition(b"\n")
    try:
        head = json.loads(line) if newline else None
    except ValueError:
        head = None
    if not isinstance(head, dict) or not isinstance(head.get("payload_bytes"), int):
        raise CheckpointError(f"{where}: found no whole header line, expected one JSON object (a torn file)")
    if len(payload) != head["payload_bytes"]:
        raise CheckpointError(f"{where}: found {len(payload)} bytes of state, expected {head['payload_bytes']}"
                              " (a torn file)")
    if hashlib.sha256(payload).hexdigest() != head.get("payload_sha256"):
        raise CheckpointError(f"{where}: found a state whose SHA-256 differs from its header's (a damaged file)")
    return head, payload


def pack(arrays: list[tuple[str, np.ndarray]], extra: dict | None = None) -> bytes:
    """A framework's training state as a checkpoint's payload (pure): its named arrays in
    order (np.savez, no pickle: a file is read as data, never run) and JSON-able extras (a
    random generator's state, a loss scale). TensorFlow's and MindSpore's Trainer.state."""
    buf = io.BytesIO()
    np.savez(buf, names=np.array([n for n, _ in arrays], dtype=str),
             extra=np.frombuffer(json.dumps(extra or {}).encode(), dtype=np.uint8),
             **{f"a{i}": np.asarray(a) for i, (_, a) in enumerate(arrays)})
    return buf.getvalue()


def unpack(payload: bytes, shapes: list[tuple]) -> tuple[list[np.ndarray], dict]:
    """pack's arrays and extras (pure), the arrays held to `shapes`, the model's in its
    order: CheckpointError naming the first that differs (the state of another model).
    By place and shape, not name: Keras numbers its layers' names by the models a process
    built before (conv2d, conv2d_1), which a relaunch need not repeat."""
    with np.load(io.BytesIO(payload), allow_pickle=False) as z:
        names = [str(n) for n in z["names"]]
        arrays = [z[f"a{i}"] for i in range(len(names))]
        extra = json.loads(bytes(z["extra"]).decode())
    found = [tuple(a.shape) for a in arrays]
    if found != [tuple(x) for x in shapes]:
        odd = next((i for i, (a, b) in enumerate(zip(found, shapes)) if a != tuple(b)), min(len(found), len(shapes)))
        at = lambda xs: f"{tuple(xs[odd])} at {odd}" if odd < len(xs) else f"none at {odd}"  # noqa: E731
        raise CheckpointError(f"checkpoint state: found {len(found)} arrays, {at(found)}"
                              f"{f' ({names[odd]})' if odd < len(names) else ''} (another model's), expected this"
                              f" model's {len(shapes)}, {at(shapes)}")
    return arrays, extra


def save(run_dir: str, test: int, rep: int, job: int, epoch: int, header: dict, payload: bytes) -> int:
    """Write base model `job`'s checkpoint after `epoch`, whole or not at all, then remove
    its checkpoints older than the KEEP newest; the bytes written."""
    where = folder(run_dir, test, rep)
    os.makedirs(where, exist_ok=True)
    head = _head({**header, "test": test, "rep": rep, "job": job, "epoch": epoch}, payload)
    files.atomic_write(os.path.join(where, name(job, epoch)), (head, payload))   # the state not copied behind its head
    # the checkpoints past the KEEP newest, and what a writer of this job killed mid-write left
    # (files.temporary_name's `.NAME.tmp-HOST-PID`: one writer a job, so none is under way)
    names = os.listdir(where)
    stale = [name(job, old) for old in _epochs(names, job)[KEEP:]] + [
        n for n in names if n.startswith(f".job-{job}-epoch-") and ".ckpt.tmp-" in n]
    for n in stale:
        try:
            os.unlink(os.path.join(where, n))
        except FileNotFoundError:
            pass
    return len(head) + len(payload)


def epochs(where: str, job: int) -> list[int]:
    """The epochs of base model `job`'s checkpoints in folder `where`, newest first (a
    temporary file of a write under way, or killed, is not one)."""
    try:
        return _epochs(os.listdir(where), job)
    except FileNotFoundError:
        return []


def _epochs(names: list[str], job: int) -> list[int]:
    """epochs' answer from a folder's file names (pure)."""
    found = [_NAME.fullmatch(n) for n in names]
    return sorted((int(m.group(2)) for m in found if m and int(m.group(1)) == job), reverse=True)


def load(path: str) -> tuple[dict, bytes]:
    """A checkpoint file's (header, payload); CheckpointError where it is not whole."""
    with open(path, "rb") as f:
        return decode(f.read(), path)


def readable(run_dir: str, test: int, rep: int, job: int):
    """Base model `job`'s checkpoints, newest first, each read through: (its epoch, its
    header, its payload, None) where it is whole, (its epoch, None, None, the
    CheckpointError's message) where it is not. A generator: one payload held at a time."""
    where = folder(run_dir, test, rep)
    for epoch in epochs(where, job):
        try:
            head, payload = load(os.path.join(where, name(job, epoch)))
        except (CheckpointError, OSError) as e:
            yield epoch, None, None, str(e)
            continue
        yield epoch, head, payload, None


def latest(run_dir: str, test: int, rep: int, job: int) -> tuple[dict | None, bytes | None, list[str]]:
    """Base model `job`'s newest whole checkpoint: (its header, its payload, the newer ones
    refused, each CheckpointError's message); (None, None, refused) where it has none."""
    refused = []
    for _, head, payload, why in readable(run_dir, test, rep, job):
        if why is None:
            return head, payload, refused
        refused.append(why)
    return None, None, refused


def save_test(run_dir: str, test: int, rep: int, state: dict) -> None:
    """World rank 0's record of the test run beside its base models' checkpoints, rewritten
    whole at each evaluation they are due: its M, the curve so far and the wall clock of the
    start of its training (what --resume needs of the test that no base model knows)."""
    where = folder(run_dir, test, rep)
    os.makedirs(where, exist_ok=True)
    files.write_json(os.path.join(where, TEST_STATE), state)


def load_test(run_dir: str, test: int, rep: int) -> dict | None:
    """save_test's record, or None where there is none whole (a run that wrote none: the
    file is replaced whole, so one that is there parses)."""
    try:
        with open(os.path.join(folder(run_dir, test, rep), TEST_STATE)) as f:
            state = json.load(f)
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) and isinstance(state.get("curve"), list) else None


def resume_epoch(whole: dict[int, list[int]], M: int, evaluated: list[int]) -> int:
    """The epoch an interrupted test goes on from (pure): the newest at which every one of
    its M base models has a whole checkpoint (`whole`: job -> its epochs) and the test's
    record has the evaluation (`evaluated`: its curve's epochs); 0, from the start, where
    there is none. Every model writes after the same evaluations, so a fault leaves each one
    at the newest or the one before (KEEP): one model's torn newest costs every model that
    evaluation, never a model trained behind the others. resume_epoch({0: [4, 2], 1: [2]},
    2, [1, 2, 3, 4]) == 2."""
    common = set(evaluated)
    for job in range(M):
        common &= set(whole.get(job, ()))
    return max(common, default=0)


def discard(run_dir: str, test: int, rep: int) -> None:
    """A test run's checkpoints, once its result is written: nothing goes on from them."""
    shutil.rmtree(folder(run_dir, test, rep), ignore_errors=True)
