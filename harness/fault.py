"""Fault injection, for the reliability tests only.

HPCAI500_FAULT="RANK:STEP[:kill]" makes world rank RANK raise (or SIGKILL itself) at
global training step STEP of every test. Unset, training pays one `is None` test a step.
"""
from __future__ import annotations

import os
import signal


def injector(world_rank: int):
    """A callable(step) for this rank, or None when no fault is armed here."""
    spec = os.environ.get("HPCAI500_FAULT")
    if not spec:
        return None
    parts = spec.split(":")
    try:
        rank, at = int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        raise ValueError(f"HPCAI500_FAULT={spec!r}: expected RANK:STEP[:kill]") from None
    if rank != world_rank:
        return None
    kill = len(parts) > 2 and parts[2] == "kill"

    def fire(step: int) -> None:
        if step == at:
            if kill:
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError(f"fault injected by HPCAI500_FAULT at step {step}")
    return fire
