"""Fault injection, for the reliability tests only.

HPCAI500_FAULT="RANK:STEP[:kill|hang]" makes world rank RANK raise (or SIGKILL itself,
or stop making progress forever) at global training step STEP of every test. Unset,
training pays nothing for it.
"""
from __future__ import annotations

import os
import signal
import time


def injector(world_rank: int):
    """A callable(step) for this rank, or None when no fault is armed here."""
    spec = os.environ.get("HPCAI500_FAULT")
    if not spec:
        return None
    parts = spec.split(":")
    try:
        rank, at = int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        raise ValueError(f"HPCAI500_FAULT={spec!r}: expected RANK:STEP[:kill|hang]") from None
    if rank != world_rank:
        return None
    kind = parts[2] if len(parts) > 2 else "raise"
    if kind not in ("raise", "kill", "hang"):
        raise ValueError(f"HPCAI500_FAULT={spec!r}: kind must be raise, kill or hang")

    def fire(step: int) -> None:
        if step == at:
            if kind == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            while kind == "hang":  # alive but stuck, as a rank in a deadlock is
                time.sleep(60)
            raise RuntimeError(f"fault injected by HPCAI500_FAULT at step {step}")
    return fire
