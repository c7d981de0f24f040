"""Fault injection, for the reliability tests only.

HPCAI500_FAULT="RANK:WHERE[:kill|hang|slow|stop][,RANK:WHERE[:KIND]...]" makes world rank
RANK (its rank at launch) raise (or SIGKILL itself, or stop making progress forever, or sleep
SLOW_STEP s there and before every later step: a rank that trains slowly but surely, at
no CPU cost; or SIGSTOP itself: alive and silent, its MPI library's threads too, as a frozen
node or a process stuck in the kernel is) at WHERE: a global training step (an integer) of every test, or the start of
a phase (`eval`, `roofline`, `sampler`, `staging`, `start`: a test's, before its first
world step), of every test or, as `PHASE@N`, of test N only. Several faults,
comma-separated, hit several ranks (or phases) in one run. Unset, it costs nothing.
"""
from __future__ import annotations

import os
import signal
import sys
import time

PHASES = ("eval", "roofline", "sampler", "staging", "start")
KINDS = ("raise", "kill", "hang", "slow", "stop")
SLOW_STEP = 0.25   # s a `slow` rank sleeps before each step (its watchdog beaten first: alive)
USAGE = f"RANK:STEP|{'|'.join(PHASES)}[@TEST][:{'|'.join(KINDS[1:])}][,...]"


def _where(text: str) -> int | str | None:
    """A step (int), a phase, or PHASE@TEST; None if none of them."""
    if text.isdigit():
        return int(text)
    phase, at, test = text.partition("@")
    if phase in PHASES and (not at or (test.isdigit() and int(test) > 0)):
        return text
    return None


def parse(spec: str) -> list[tuple[int, int | str, str]]:
    """'RANK:WHERE[:KIND],...' -> [(rank, step or phase, kind)]; ValueError saying what is expected."""
    out = []
    for one in spec.split(","):
        parts = one.split(":")
        where = _where(parts[1]) if len(parts) > 1 else None
        kind = parts[2] if len(parts) > 2 else "raise"
        if not 2 <= len(parts) <= 3 or not parts[0].isdigit() or where is None or kind not in KINDS:
            raise ValueError(USAGE)
        out.append((int(parts[0]), where, kind))
    return out


def _armed(world_rank: int) -> list[tuple[int | str, str]]:
    """(where, kind) of each fault armed on this rank (launch rank)."""
    spec = os.environ.get("HPCAI500_FAULT")
    if not spec:
        return []
    try:
        faults = parse(spec)
    except ValueError as e:
        raise ValueError(f"HPCAI500_FAULT={spec!r}: expected {e}") from None
    return [(where, kind) for rank, where, kind in faults if rank == world_rank]


def _fire(kind: str, where) -> None:
    if kind in ("kill", "hang", "stop"):   # when, on this rank's clock: bench/elastic.py times the recovery from it
        print(f"hpcai500: rank {os.environ.get('OMPI_COMM_WORLD_RANK', '?')}: HPCAI500_FAULT fires: {kind} at {where}"
              f" (t={time.time():.3f})", file=sys.stderr, flush=True)
    if kind == "slow":
        time.sleep(SLOW_STEP)
        return
    if kind in ("kill", "stop"):   # a stopped process runs again only if continued: then it raises
        os.kill(os.getpid(), signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
    while kind == "hang":  # alive but stuck, as a rank in a deadlock is
        time.sleep(60)
    raise RuntimeError(f"fault injected by HPCAI500_FAULT at {where}")


def injector(world_rank: int):
    """A callable(step) for the training loop, or None when no step fault is armed here."""
    steps = [(where, kind) for where, kind in _armed(world_rank) if isinstance(where, int)]
    if not steps:
        return None
    at, kind = steps[0]

    def fire(step: int) -> None:
        if step == at or (kind == "slow" and step > at):
            _fire(kind, f"step {step}")
    return fire


def point(world_rank: int, phase: str, test: int | None = None) -> None:
    """Fire here if a fault is armed for this rank at the start of `phase` (of test `test`)."""
    for where, kind in _armed(world_rank):
        if where == phase or (test is not None and where == f"{phase}@{test}"):
            _fire(kind, where)
