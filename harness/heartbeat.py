"""Heartbeat: a live run told from a dead one, from its folder alone.

results.json says `running` from its first write until the run ends; a run whose ranks
all die at once (a SIGKILLed job, a node that takes world rank 0 with it, an mpirun that
ends its ranks without a signal they can answer) never rewrites it. So world rank 0
stamps `<run>/heartbeat` every HPCAI500_HEARTBEAT seconds (default 5) from a daemon
thread while the run lives: a small JSON file written whole (rank 0's wall clock, the
interval, its host and pid, the process's start time, the kernel's boot id and PID
namespace). A thread, not the training loop, stamps: one step may take minutes, and the
watchdog (harness/watchdog.py) already ends a rank that stops making progress. A reader
concludes, for a run whose results still say `running`:

* the stamp comes from a process of the reader's own kernel and PID namespace: the run is
  alive while that process (pid and start time) exists, dead at once when it is gone;
* else (another node, a container): alive while the stamp is younger than
  STALE_INTERVALS intervals, dead after (the nodes' clocks assumed within seconds of each
  other, as NTP keeps them).

`judge` turns a run's results and heartbeat into its state, one line and the exit
status of `--status` (EXIT): 0 only for a run that completed with every test PASSED and
every ensemble the one the input asked for (ranks lost, but every base model they cost
trained again, is such a run: it says what was recovered); 6 for one whose faults
dropped base models or left test runs out.
`--summarize`, `--verify` and `--resume` (which refuses a live run) use the same
judgment (`status`). Pure but for `Heartbeat` (the writer), `read` and `process_alive`
(the reader's look at the file and the process table) and `status`, which gathers them.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass, replace

import psutil

from harness import dat, files, hosts, results, settings
from harness.errors import say
from harness.topology import boot_id

NAME = "heartbeat"          # the file in the run folder
SETTING = "HPCAI500_HEARTBEAT"   # s between stamps (harness/settings.py; the file records the one in force)
STALE_INTERVALS = 12        # missed stamps after which a run on another kernel is taken for dead
# --status's exit status per state; 1 is every command's error (not a run, unreadable)
EXIT = {"complete": 0, "running": 2, "interrupted": 3, "failed": 4, "dead": 5, "complete-with-losses": 6}


@dataclass(frozen=True)
class State:
    """What a run folder says of its run."""
    name: str                 # complete | running | interrupted | failed | dead (EXIT's keys)
    alive: bool | None        # a process still runs it (None: cannot be told: no heartbeat file)
    detail: str               # why: the reason, the heartbeat's age
    finished: int             # test runs (test x repetition) finished
    planned: int | None       # test runs planned (None: the record does not say)
    tuning: str = ""          # a tuning run's progress (tuning_words); "" for a sweep

    @property
    def code(self) -> int:
        return EXIT[self.name]

    def line(self) -> str:
        of = f"{self.finished} of {self.planned}" if self.planned is not None else f"{self.finished}"
        return f"{self.name}: {self.detail}; {of} test run(s) finished" + (f"; {self.tuning}" if self.tuning else "")


# -- the writer (world rank 0) ----------------------------------------------------------------
def identity() -> dict:
    """This process as a reader will check it: host, pid, start time, kernel, PID namespace."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "started": psutil.Process().create_time(),
            "boot_id": boot_id(), "pid_ns": _pid_namespace()}


class Heartbeat:
    """Stamps `<run_dir>/heartbeat` now and every `interval` s on a daemon thread until
    the process ends (or stop()). A failed stamp (a full or vanished disk) is skipped:
    the run's figures matter more than its liveness."""

    def __init__(self, run_dir: str, interval: float):
        self.path, self.interval = os.path.join(run_dir, NAME), float(interval)
        self._me = identity()
        self._stop = threading.Event()

    def start(self) -> "Heartbeat":
        self.stamp()
        threading.Thread(target=self._run, name="hpcai500-heartbeat", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def stamp(self) -> None:
        try:
            # no fsync: a stamp lost to a crash only ages the file, which is what a reader reads
            with files.atomic_path(self.path) as tmp, open(tmp, "w") as f:
                json.dump({"time": time.time(), "interval": self.interval, **self._me}, f)
        except OSError:
            pass

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.stamp()


# -- the reader -------------------------------------------------------------------------------
def read(run_dir: str) -> dict | None:
    """The run's last stamp, or None (no file: a run of a version before heartbeats, or one
    that died before its first stamp; an unreadable one counts as none)."""
    try:
        with open(os.path.join(run_dir, NAME)) as f:
            beat = json.load(f)
        return beat if isinstance(beat, dict) and isinstance(beat.get("time"), (int, float)) else None
    except (OSError, ValueError):
        return None


def process_alive(beat: dict) -> bool | None:
    """Whether the stamping process still exists, where this reader can tell (the same
    kernel and PID namespace); None where it cannot (another node or container)."""
    if beat.get("boot_id") != boot_id() or beat.get("pid_ns") != _pid_namespace():
        return None
    try:
        proc = psutil.Process(int(beat["pid"]))
        # a killed process not yet reaped by its parent is a zombie: dead too
        return abs(proc.create_time() - float(beat["started"])) < 1.0 and proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except (psutil.Error, KeyError, TypeError, ValueError):
        return None


def status(run_dir: str, rec: results.Record, now: float | None = None) -> State:
    """The run's state as `judge` gives it, from its folder and this machine's processes."""
    beat = read(run_dir)
    alive = process_alive(beat) if beat else None
    ended = [x["ended"] for x in results.launches(run_dir)]
    if alive is None and beat and ended and float(beat["time"]) <= max(ended):
        alive = False   # its last stamp came before its relauncher saw mpirun end (harness/relaunch.py)
    state = judge(rec, beat, time.time() if now is None else now, alive)
    if rec.relaunches:
        state = replace(state, detail=state.detail + relaunched_words(rec.relaunches))
    return replace(state, tuning=tuning_words(rec.tuning)) if rec.tuning else state


def relaunched_words(relaunches: dict) -> str:
    """--status's words on a relaunched run (results.json's `relaunches`): how many times,
    and the hosts lost."""
    done = relaunches["launches"]
    lost = [h for x in done for h in x["lost"]]
    return f"; relaunched {len(done)} time(s)" + (f" after host(s) {', '.join(lost)} lost" if lost else "")


def tuning_words(tuning: dict) -> str:
    """--status's words on a tuning run: its last trial of those planned, its stage and
    length, the best so far, the budget left, and the tuned file once written."""
    rows = tuning.get("trials", [])
    left = (tuning["budget_seconds"] - tuning.get("spent_seconds", 0.0)) / 60
    last = rows[-1] if rows else None
    out = (f"tuning: trial {last['number']} of {tuning['planned']} ({last['stage']}, {last['epochs']} epochs)"
           if last else f"tuning: no trial yet of {tuning['planned']}")
    if tuning.get("tuned"):   # ended: its pick, the best finalist (an estimate may have been higher)
        return out + f", {left:.1f} min of the budget left; tuned file {tuning['tuned']} (trial {tuning['best']})"
    best = results.best_trial(rows)
    out += f", best so far trial {best['number']} ({best['vflops'] / 1e12:.3e} VTflops)" if best else ""
    return out + f", budget left {left:.1f} min"


def judge(rec: results.Record, beat: dict | None, now: float, alive: bool | None) -> State:
    """The state of a run (pure): its recorded status, and for a `running` one its
    heartbeat `beat` (None: no file) read at `now` (s since the epoch), `alive` being
    what the process table says of the stamping process (None: cannot tell)."""
    finished, planned = len(rec.tests), planned_runs(rec)
    failed = [t for t in rec.tests if not t.consistency.get("passed")]
    stop = rec.interrupted or {}
    during = f" during test {stop['test']}" if stop.get("test") else ""
    tally_ = of_record(rec)
    lost = losses(tally_)
    # a run that did not complete names its losses too: a test left out for lost ranks is
    # not among those planned, so its count alone ("1 of 1") would read as nothing missing
    also = f"; {lost}" if lost else ""
    if rec.status == "complete":
        if failed:
            names = ", ".join(f"test {t.index}" + (f" rep {t.repetition}" if t.repetition else "") for t in failed)
            return State("failed", False, f"complete, but {names} failed the replica consistency check",
                         finished, planned)
        if lost and not tally_.whole:   # ranks lost, and with them base models or test runs
            return State("complete-with-losses", False, f"every test PASSED, {lost}", finished, planned)
        if lost:   # retrain made every ensemble whole: a result as asked, its Time carrying the cost
            return State("complete", False, f"every test PASSED and whole; recovered {words(tally_)}",
                         finished, planned)
        return State("complete", False, "every test PASSED", finished, planned)
    if rec.status == "interrupted":
        reason = str(stop.get("reason", "no reason recorded"))
        name = "failed" if reason.startswith(results.ERROR_PREFIX) else "interrupted"
        return State(name, False, f"{reason}{during}{also}", finished, planned)
    if beat is None:
        return State("running", None, f"status `{rec.status}` and no heartbeat file: a live run cannot be told"
                     f" from a dead one (a run of a version before heartbeats?){also}", finished, planned)
    age, interval = now - float(beat["time"]), float(beat.get("interval") or settings.TABLE[SETTING].default)
    where = f"{beat.get('host', '?')} pid {beat.get('pid', '?')}"
    last = f"last heartbeat at {_clock(beat['time'])} ({age:.0f} s ago, {where})"
    if alive is False:
        return State("dead", False, f"not running: {last}, that process is gone; status left `running`{also}",
                     finished, planned)
    if alive is None and age > STALE_INTERVALS * interval:
        return State("dead", False, f"not running: {last}, none for {STALE_INTERVALS} intervals of {interval:g} s;"
                     f" status left `running`{also}", finished, planned)
    return State("running", True, f"{last}{also}", finished, planned)


@dataclass(frozen=True)
class Tally:
    """What a run lost to faults (harness/elastic.py), counted over its invocations."""
    ranks: tuple[int, ...]    # launch ranks lost (of any invocation: a resumed run's launches number alike)
    again: int                # base models lost and trained again (--on-fault retrain): the ensemble whole
    dropped: int              # base models dropped: every figure of their test is the others'
    left_out: int             # test runs left out for lost ranks

    @property
    def whole(self) -> bool:
        """Every ensemble measured is the one the input asked for: nothing dropped or left out."""
        return not (self.dropped or self.left_out)

    def __bool__(self) -> bool:
        return bool(self.ranks or self.again or self.dropped or self.left_out)


def tally(fault_losses: list[dict], tests: list, skipped: list[dict]) -> Tally:
    """The run's losses (pure): `fault_losses` results.json's fault_tolerance.losses, `tests`
    its TestResults, `skipped` its skipped entries."""
    ranks = sorted({r for x in [*fault_losses, *(x for t in tests for x in t.losses)] for r in x["ranks"]})
    return Tally(tuple(ranks), sum(len(t.retrained) for t in tests), sum(len(t.jobs_lost) for t in tests),
                 sum(s.get("cause") == "lost" for s in skipped))


def of_record(rec: results.Record) -> Tally:
    return tally(rec.fault_losses, rec.tests, rec.skipped)


def words(t: Tally) -> str:
    """A tally in words: 'rank(s) 3 lost, 1 base model(s) dropped, 0 test run(s) left out'."""
    return (f"rank(s) {', '.join(map(str, t.ranks)) or '?'} lost, {t.dropped} base model(s) dropped,"
            + (f" {t.again} trained again," if t.again else "") + f" {t.left_out} test run(s) left out")


def losses(t: Tally) -> str:
    """What a run lost to faults (its tally: of_record), in words; "" for none."""
    return f"with losses: {words(t)}" if t else ""


def planned_runs(rec: results.Record) -> int | None:
    """Test runs the invocation planned: the tests that fit the world x the repetitions
    (None where the record's configuration cannot be read back); a tuning run's, its trials
    (those planned while it runs, those made once it ended: tune.Tuning)."""
    if rec.tuning is not None:   # less the trials left out (their ranks lost), which record no test
        return rec.tuning.get("planned") - len(rec.skipped)
    try:
        cfg = dat.from_record(rec.input.get("text", ""), rec.config)
        # a test skipped at the start misses every repetition; one left out after a loss of
        # ranks (harness/elastic.py) the repetition its entry names
        whole = [s for s in rec.skipped if "repetition" not in s]
        return (len(dat.expand(cfg)) - len(whole)) * cfg.repetitions - (len(rec.skipped) - len(whole))
    except (TypeError, ValueError, AttributeError):
        return None


def _clock(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(seconds))


def _pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def run_folders(path: str) -> list[str]:
    """[path] when it is a run folder (or not a folder, or a folder holding no run: the
    reader names what is wrong); a results directory's (line 5) run folders, oldest first:
    the names begin with the start's date and time."""
    if not os.path.isdir(path) or os.path.isfile(os.path.join(path, "results.json")):
        return [path]
    runs = sorted(d for d in os.listdir(path)
                  if not d.startswith(".") and os.path.isfile(os.path.join(path, d, "results.json")))
    return [os.path.join(path, d) for d in runs] or [path]


def newest_run(path: str) -> str:
    """`path` when it is a run folder; in a results directory, its newest run folder (a
    batch script knows line 5, not the name)."""
    return run_folders(path)[-1]


def main(path: str, out=None) -> int:
    """`--status RUN`: the run's state in one line; the exit status is EXIT's (1: not a run).
    RUN may be a results directory: its newest run is judged, and named."""
    run_dir = newest_run(path)
    try:
        rec = results.load_run(run_dir)
    except ValueError as e:
        say(f"error: --status: {e}")
        return 1
    state = status(run_dir, rec)
    print(f"{run_dir}: {state.line()}{resume_words(state, rec, run_dir)}", file=out or sys.stdout, flush=True)
    return state.code


def resume_words(state: State, rec: results.Record, run_dir: str) -> str:
    """For a run that stopped short (interrupted, dead), the command that resumes it on the
    hosts left (a site that runs mpirun itself: harness/relaunch.py's launcher does it for
    the others), those a relaunch lost left out; "" for any other state."""
    if state.name not in ("interrupted", "dead") or not rec.environment.get("hosts"):   # hosts: once it started
        return ""
    left, lost = hosts.hosts_left(rec.environment, results.launches(run_dir))
    if not left:
        return "; no host of the run is left to resume it on"
    known = (f" ({', '.join(lost)} left out, lost)" if lost
             else " (no lost host on record: leave out any that is down)")
    return f"; to resume it: {hosts.by_hand(left, rec.input['path'], run_dir)}{known}"
