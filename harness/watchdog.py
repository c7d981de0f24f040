"""Watchdog: a rank that makes no progress for too long ends the job, or itself.

A collective whose partner is stuck (not dead: ULFM tells the survivors of a dead one)
blocks forever; the batch system would kill the job hours later with nothing said.
The main thread calls `beat(phase)` at every training step and phase change; a daemon
thread checks the age of the last beat and, past the limit, prints the rank and the
phase and calls `abort`: the job's end (harness/driver._end_job), or under `--on-fault drop`
the rank's own end, which makes it a lost rank like a dead one (harness/elastic.py):
its job's ranks, stuck with it, learn it in their collective, the other jobs go on.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import time

DEFAULT_SECONDS = 1800.0   # generous: a step or an evaluation never legitimately takes this long


def block(request, phase: str) -> None:
    """Watchdog.wait's stand-in where no watchdog runs (tests, tools): wait for the MPI
    request without beating; `phase` is unused."""
    request.Wait()


class Watchdog:
    def __init__(self, seconds: float, rank: int, abort, ends=lambda: "aborting the job"):
        """`ends()`: what `abort` does, in words, when it fires."""
        self.seconds, self.rank, self.abort, self.ends = seconds, rank, abort, ends
        self.phase = "start-up"
        self.last = time.monotonic()
        self._stop = threading.Event()
        self._thread = None

    def beat(self, phase: str | None = None) -> None:
        """Cheap enough for every step: two attribute stores."""
        if phase is not None:
            self.phase = phase
        self.last = time.monotonic()

    def wait(self, request, phase: str) -> None:
        """Wait for a non-blocking MPI request while beating: waiting for other jobs to
        finish (idle ranks wait a whole test) is not a lack of progress of this rank."""
        self.beat(phase)
        pause = 0.0005   # s; doubled up to 20 ms: a quick completion (a send whose receiver
        while not request.Test():  # polls too) is not held up, a long wait costs no CPU
            time.sleep(pause)
            pause = min(0.02, 2 * pause)
            self.beat()

    @contextlib.contextmanager
    def beating_on_imports(self):
        """A beat at each module imported meanwhile. A framework's import (device set-up) is
        one call of the main thread that takes seconds, tens of them where ranks share cores or
        read a shared file system, and cannot beat; an import that moves from module to module
        is progress, one stuck inside a single call (a driver's initialisation that never
        returns) is not, and the watchdog still ends it."""
        finder = _Beating(self)
        sys.meta_path.insert(0, finder)
        try:
            yield
        finally:
            sys.meta_path.remove(finder)

    def start(self) -> "Watchdog":
        if self.seconds > 0:
            # its own copy of the standard error: device set-up and the roofline's first
            # compilations capture file descriptor 2 (errors.native_stderr_captured), and a
            # rank its watchdog ends there must still say why (it ends without the capture's
            # replay)
            self._stderr = os.dup(2)
            self._thread = threading.Thread(target=self._watch, name="hpcai500-watchdog", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        # a look a second at most: a hang is said within a second of the limit (5 s, as this
        # looked before, added up to 5 s to every watchdog's verdict); the look is one clock read
        period = min(1.0, self.seconds / 4)
        while not self._stop.wait(period):
            idle = time.monotonic() - self.last
            if idle > self.seconds:
                sys.stderr.flush()
                os.write(self._stderr, (f"hpcai500: rank {self.rank}: no progress for {idle:.0f} s during"
                                        f" {self.phase} (watchdog limit {self.seconds:g} s); {self.ends()}\n").encode())
                self.abort()
                return
        os.close(self._stderr)


class _Beating:
    """A finder of modules that finds none: asked first for each module not yet imported
    (sys.meta_path), it beats the watchdog and leaves the finding to the finders after it."""

    def __init__(self, dog: Watchdog):
        self.dog = dog

    def find_spec(self, name, path=None, target=None):
        self.dog.beat()
        return None
