"""Fault injection, for the reliability tests only.

HPCAI500_FAULT="RANK:WHERE[:kill|hang|slow]" makes world rank RANK raise (or SIGKILL
itself, or stop making progress forever, or sleep SLOW_STEP s there and before every
later step: a rank that trains slowly but surely, at no CPU cost) at WHERE: a global
training step (an integer) of every test, or the start of a phase, `eval` or
`roofline`. Unset, it costs nothing.
"""
from __future__ import annotations

import os
import signal
import sys
import time

PHASES = ("eval", "roofline")
KINDS = ("raise", "kill", "hang", "slow")
SLOW_STEP = 0.25   # s a `slow` rank sleeps before each step (its watchdog beaten first: alive)


def parse(spec: str) -> tuple[int, int | str, str]:
    """RANK:WHERE[:KIND] -> (rank, step or phase, kind); ValueError saying what is expected."""
    parts = spec.split(":")
    usage = f"RANK:STEP|{'|'.join(PHASES)}[:{'|'.join(KINDS[1:])}]"
    if not 2 <= len(parts) <= 3 or not parts[0].isdigit() or not (parts[1].isdigit() or parts[1] in PHASES):
        raise ValueError(usage)
    kind = parts[2] if len(parts) > 2 else "raise"
    if kind not in KINDS:
        raise ValueError(usage)
    return int(parts[0]), (int(parts[1]) if parts[1].isdigit() else parts[1]), kind


def _armed(world_rank: int):
    """(where, kind) when a fault is armed on this rank, else None."""
    spec = os.environ.get("HPCAI500_FAULT")
    if not spec:
        return None
    try:
        rank, where, kind = parse(spec)
    except ValueError as e:
        raise ValueError(f"HPCAI500_FAULT={spec!r}: expected {e}") from None
    return (where, kind) if rank == world_rank else None


def _fire(kind: str, where) -> None:
    if kind in ("kill", "hang"):   # when, on this rank's clock: bench/elastic.py times the recovery from it
        print(f"hpcai500: rank {os.environ.get('OMPI_COMM_WORLD_RANK', '?')}: HPCAI500_FAULT fires: {kind} at {where}"
              f" (t={time.time():.3f})", file=sys.stderr, flush=True)
    if kind == "slow":
        time.sleep(SLOW_STEP)
        return
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    while kind == "hang":  # alive but stuck, as a rank in a deadlock is
        time.sleep(60)
    raise RuntimeError(f"fault injected by HPCAI500_FAULT at {where}")


def injector(world_rank: int):
    """A callable(step) for the training loop, or None when no step fault is armed here."""
    armed = _armed(world_rank)
    if armed is None or not isinstance(armed[0], int):
        return None
    at, kind = armed

    def fire(step: int) -> None:
        if step == at or (kind == "slow" and step > at):
            _fire(kind, f"step {step}")
    return fire


def point(world_rank: int, phase: str) -> None:
    """Fire here if a fault is armed for this rank at the start of `phase`."""
    armed = _armed(world_rank)
    if armed is not None and armed[0] == phase:
        _fire(armed[1], phase)
