"""SIGTERM / SIGINT / SIGUSR1 (a batch system's time limit, a Ctrl-C) stop the run cleanly.

Which signal reaches the ranks depends on the launcher: srun and batch systems signal
every rank (SIGTERM at the time limit; `#SBATCH --signal=USR1@300` gives warning);
Open MPI's mpirun kills its ranks at once on SIGTERM/SIGINT but forwards SIGUSR1, so
`kill -USR1 <mpirun pid>` is the clean stop there. The finished tests' results are on
disk in every case: they are written as each test ends.

A Python signal handler runs only in the main thread, between bytecodes: a rank
blocked inside an MPI or Horovod collective would never run it. So the signals are
blocked in every thread (the mask is inherited, hence `block()` must run before
mpi4py starts MPI and before TensorFlow starts its thread pools) and one daemon thread
takes them with sigwait(), whatever the main thread is doing. That thread calls the
handler registered by the run (rank 0 records the interrupted test and rewrites its
results) and ends the process with status 128 + signal number.
"""
from __future__ import annotations

import os
import signal
import sys
import threading

SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGUSR1}
# What a signal that reached the ranks says of where it came from: the interruption's
# reason (results.json, the report's Interrupted line). mpirun turns a Ctrl-C into SIGTERM
# for its ranks, so SIGTERM does not mean the user sent SIGTERM; srun passes SIGINT on.
CAUSES = {signal.SIGTERM: "from the launcher or the batch system: a time limit, scancel, or mpirun passing on a"
                          " Ctrl-C or its own SIGTERM",
          signal.SIGINT: "a Ctrl-C, passed on by srun, or the rank's own",
          signal.SIGUSR1: "a clean stop: kill -USR1 of mpirun, or the batch system's warning (#SBATCH --signal)"}


def reason(signum: int) -> str:
    """The interruption's reason for a signal the ranks received: its name and CAUSES'."""
    return f"{signal.Signals(signum).name} received ({CAUSES[signum]})"
_handler = None


def block() -> None:
    """Call first thing, before `from mpi4py import MPI` and any thread is started."""
    signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    threading.Thread(target=_wait, name="hpcai500-signals", daemon=True).start()


def on_signal(handler) -> None:
    """Register handler(signum) to run (once, in the signal thread) before the exit."""
    global _handler
    _handler = handler


def exit_now(status: int) -> None:
    """End this process at once with `status`, what Python's streams hold written first:
    no exit handler, no MPI_Finalize, no interpreter teardown (each caller says why). Not
    C's buffers: a rank stuck inside a C write holds that stream's lock, and the watchdog's
    exit (harness/driver._end_job) must not wait for it."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _wait() -> None:
    signum = signal.sigwait(SIGNALS)
    try:
        if _handler is not None:
            _handler(signum)
    except BaseException as e:  # noqa: BLE001 - we are exiting anyway; say why not cleanly
        print(f"hpcai500: while stopping on {signal.Signals(signum).name}: {e}", file=sys.stderr, flush=True)
    finally:
        exit_now(128 + signum)
