"""The relaunch: a lost node costs the run a restart on the nodes left, not the run.

ULFM keeps a job whose rank died (harness/elastic.py), but Open MPI 5.0.x's PRRTE ends the
whole job when it loses a node's daemon ("PRTE has lost communication with a remote
daemon ... on node n4 ... will terminate the job": its errmgr aborts on a daemon's comm
failure, whatever the job's recoverable flag; the fix is in PRRTE's master only). So, as
torchrun's elastic agent and Slurm's requeue do, something outside the MPI job notices and
starts it again: `hpcai500.py FILE --relaunch [TIMES] --hosts HOSTS` runs mpirun on the
hosts (a hostfile, `n1:2,n2:2`, or the Slurm allocation it runs in), and when the run ends
with a node lost it relaunches `--resume RUN` on the hosts left, up to TIMES times.

Which hosts are gone is read, never guessed: PRRTE names the node whose daemon it lost on
mpirun's stderr (its help text `node-died`, `Remote daemon: ... on node HOST`), which the
launcher copies to its own stderr as it reads it. A launch has ended once mpirun has and,
where its run still says `running`, rank 0's heartbeat is gone or silent (went_quiet):
mpirun can exit before its ranks. A run that ends any other way (complete,
failed, stopped by a signal, an input error) is not relaunched: the launcher exits with
mpirun's status and says why. Each launch (hosts, ranks, when it started and ended, its
exit status, the hosts it lost and when PRRTE said so) is appended to the run folder's
`launches.json`, written whole, before the next one starts; the run records it
(results.json `relaunches`).

Pure functions but for `main` and `_launch` (processes, signals, files).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass

from harness import files, heartbeat, results, signals
from harness.errors import say
from harness.hosts import Host, by_hand, command, parse_hosts, slurm_hosts, without

DEFAULT_TIMES = 3          # relaunches after the first launch
# PRRTE's help text `node-died` (share/prte/help-errmgr-base.txt): the node whose daemon it lost
NODE_DIED = re.compile(r"Remote daemon\s*:\s*\S+ on node (\S+)")
RUN_FOLDER = re.compile(r"^hpcai500: results in (.+?)/ \(")   # rank 0's first line on stderr (harness/driver.py)
RUN_ERROR = "hpcai500: error: "   # rank 0's one line for an error every rank agreed on (harness/driver.py)
RUN_WRITTEN = "(report.txt, results.json)\n"   # the end of rank 0's last line: the run's end written (report.Output)
END_GRACE = 30.0           # s from that line to mpirun's exit, past which it is taken for stuck and ended
ENDED = ("complete", "complete-with-losses", "failed")   # --status's states a relaunch cannot change


@dataclass(frozen=True)
class Launch:
    """One mpirun of the run, as launches.json records it."""
    launch: int              # 1 for the first
    hosts: list              # "name:slots" of each host it ran on
    ranks: int
    started: float           # s since the epoch, the launcher's clock
    ended: float             # likewise
    exit: int                # mpirun's exit status (negative: the signal that ended it)
    lost: list               # the hosts PRRTE said it lost
    fault: float | None      # when PRRTE said so first (s since the epoch); None: no host lost


def decide(state: str, lost: list[str], hosts: list[Host], done: int, times: int, stopped: bool,
           error: str | None = None) -> tuple[bool, str]:
    """(relaunch or not, why) once a launch has ended: its run's --status state, the hosts
    PRRTE said it lost, the hosts it ran on, the relaunches done so far of `times`, whether
    the launcher itself was asked to stop (a signal), and the error rank 0 stopped the run on,
    if any (a relaunch whose smaller world no test fits, an input refused: again would say
    the same)."""
    if stopped:
        return False, "the launcher was stopped (a signal): no relaunch"
    if state in ENDED:
        return False, f"the run is {state}: no relaunch"
    if error and not lost:
        return False, f"the run stopped on an error ({error}): no relaunch"
    if not lost:
        return False, (f"the run is {state} and PRRTE named no lost node: no relaunch (a relaunch is for a lost"
                       " node; resume by hand with --resume)")
    left = without(hosts, lost)
    if not left:
        return False, f"every host is lost ({', '.join(lost)}): no host left to relaunch on"
    if done >= times:
        return False, f"gave up after {done} relaunch(es), the limit (--relaunch {times})"
    return True, f"host(s) {', '.join(lost)} lost: relaunch {done + 1} of {times} on {', '.join(h.name for h in left)}"


def went_quiet(beat: dict | None, now: float, alive: bool | None) -> bool:
    """Whether a launch's ranks have gone (pure): rank 0's heartbeat (heartbeat.read; None: no
    file) is its process's, gone by the process table (`alive` False: heartbeat.process_alive)
    or silent for two of its intervals at `now`. mpirun can end before its ranks do: PRRTE
    ends a job whose daemon it lost by signalling the ranks, and exits without waiting for
    them (rank 0 was seen stamping 4 s after its mpirun exited, under Slurm), and a relaunch
    then would find its run live."""
    if beat is None or alive is False:
        return True
    return now - float(beat["time"]) > 2 * float(beat.get("interval") or 0)


def record(run_dir: str, launch: Launch) -> list[dict]:
    """The run folder's launches.json with `launch` appended, written whole; every launch so far."""
    done = results.launches(run_dir) + [asdict(launch)]
    files.atomic_write(os.path.join(run_dir, results.LAUNCHES), json.dumps(done, indent=1) + "\n")
    return done


def _utc(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def lines(relaunches: dict | None) -> list[str]:
    """The report's RELAUNCH lines for results.json's `relaunches` (None: launched once):
    each earlier launch, its hosts, span, exit and the hosts it lost, then this invocation's
    start and the time since the last fault."""
    if not relaunches:
        return []
    out, faults = [], []
    for x in relaunches["launches"]:
        lost = (f"; {', '.join(x['lost'])} lost at {_utc(x['fault'])} (PRRTE lost its daemon)" if x["lost"]
                else "; no host lost")
        out.append(f"RELAUNCH: launch {x['launch']} on {','.join(x['hosts'])} ({x['ranks']} ranks),"
                   f" {_utc(x['started'])} to {_utc(x['ended'])}, mpirun exit {x['exit']}{lost}")
        faults += [x["fault"]] if x["fault"] is not None else []
    since = f", {relaunches['started'] - faults[-1]:.1f} s after the last fault" if faults else ""
    return out + [f"RELAUNCH: this invocation, launch {len(relaunches['launches']) + 1}, started"
                  f" {_utc(relaunches['started'])}{since}; a test under way at a fault ran again from its start"
                  " (no checkpoint inside a test yet), its Time its own run's: the time the fault cost is not in it"]


def _launch(cmd: list[str], seen: dict, stop: threading.Event) -> int:
    """Run mpirun, copying its stderr line by line to ours while noting the run folder, the
    nodes PRRTE says it lost and rank 0's error (`seen`: run_dir, lost, fault, error); once
    rank 0 has written the run's end, _unstick watches mpirun's exit; a signal to the launcher
    goes on to mpirun (SIGINT, SIGTERM: it ends its ranks; SIGUSR1: it passes it on, the
    run's clean stop) and no relaunch follows. hpcai500.py blocked those signals in every
    thread for the ranks' sake (harness/signals.py): the main thread takes them again here,
    and mpirun, started from it, inherits that mask."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, signals.SIGNALS)
    p = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, errors="replace")

    def forward(signum, _frame):
        stop.set()
        p.send_signal(signum)
    old = {s: signal.signal(s, forward) for s in signals.SIGNALS}
    try:
        for line in p.stderr:
            sys.stderr.write(line)
            sys.stderr.flush()
            if (m := RUN_FOLDER.match(line)) and not seen.get("run_dir"):
                seen["run_dir"] = m.group(1)
            if (m := NODE_DIED.search(line)) and m.group(1) not in seen["lost"]:
                seen["lost"].append(m.group(1))
                seen["fault"] = seen["fault"] or time.time()
            if line.startswith(RUN_ERROR):
                seen["error"] = line[len(RUN_ERROR):].strip()
            if line.endswith(RUN_WRITTEN) and seen.get("run_dir"):
                threading.Thread(target=_unstick, args=(p, seen["run_dir"]), daemon=True).start()
        return p.wait()
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def _unstick(p: subprocess.Popen, run_dir: str) -> None:
    """Rank 0 has written the run's end: mpirun that has not exited END_GRACE s later, its run
    no longer `running`, waits for a rank or a daemon that cannot answer (a node frozen whole:
    no survivor there could end its lost ranks, harness/elastic.unreached) and would never
    exit: ended, SIGTERM then SIGKILL. The results are whole; nothing of the run is lost."""
    try:
        p.wait(timeout=END_GRACE)
        return
    except subprocess.TimeoutExpired:
        pass
    try:
        state = results.load_run(run_dir).status
    except ValueError:
        return
    if state == "running":
        return
    say(f"--relaunch: the run is {state} and its results written, but mpirun has not exited {END_GRACE:g} s later:"
        " it waits for a process that cannot answer (a node frozen whole); ending mpirun")
    p.terminate()
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        p.kill()


def main(args, program: list[str]) -> int:
    """The relauncher's loop (hpcai500.py --relaunch): launch, judge, relaunch on the hosts
    left; its exit status --status's for the run's state, else mpirun's."""
    try:
        hosts = _hosts(args.hosts)
    except (OSError, ValueError) as e:
        say(f"error: --hosts: {e}")
        return 1
    mpirun = os.path.join(os.path.dirname(sys.executable), "mpirun")
    options, run_dir, stop, done = shlex.split(args.mpirun or ""), args.resume, threading.Event(), 0
    while True:
        seen = {"run_dir": run_dir, "lost": [], "fault": None}
        started = time.time()
        status = _launch(command(mpirun, options, hosts, program, run_dir), seen, stop)
        run_dir = seen["run_dir"]
        if not run_dir:
            say(f"--relaunch: mpirun exited {status} before the run had a folder: no relaunch")
            return status or 1
        record(run_dir, Launch(done + 1, [h.spec for h in hosts], sum(h.slots for h in hosts),
                               started, _quiet(run_dir), status, seen["lost"], seen["fault"]))
        try:
            state = heartbeat.status(run_dir, results.load_run(run_dir)).name
        except ValueError as e:   # it died before its first results.json
            say(f"--relaunch: launch {done + 1} ended (mpirun exit {status}): {e}: no relaunch")
            return status or 1
        again, why = decide(state, seen["lost"], hosts, done, args.relaunch, stop.is_set(), seen.get("error"))
        left = without(hosts, seen["lost"])
        resume = (f"to resume it on the hosts left, {by_hand(left, args.dat, run_dir)}" if left
                  else "no host left to resume it on")
        more = f"; the run stands in {run_dir}: {resume}" if not again and state not in ENDED else ""
        say(f"--relaunch: launch {done + 1} ended (mpirun exit {status}, the run {state}): {why}{more}")
        if not again:
            return heartbeat.EXIT.get(state, status) if state in ENDED else (status or heartbeat.EXIT.get(state, 1))
        hosts, done = left, done + 1


def _quiet(run_dir: str) -> float:
    """When the launch ended: once mpirun has, and, where its run still says `running`, its
    ranks too (went_quiet), waited for at most heartbeat.STALE_INTERVALS of rank 0's
    heartbeat (after which --status calls its run dead anyway). The time is the later of the
    two: --status takes a heartbeat no later than a launch's end for a dead one
    (heartbeat.status)."""
    ended = time.time()
    while True:
        try:
            if results.load_run(run_dir).status != "running":   # rank 0 recorded its run's end
                return ended
        except ValueError:   # no results.json yet: main says so
            return ended
        beat = heartbeat.read(run_dir)
        now = time.time()
        if went_quiet(beat, now, beat and heartbeat.process_alive(beat)):
            return max(ended, float(beat["time"]) if beat else ended)
        interval = float(beat.get("interval") or 1.0)
        if now - ended > heartbeat.STALE_INTERVALS * interval:
            return now
        time.sleep(interval / 4)


def _hosts(given: str | None) -> list[Host]:
    """--hosts (a hostfile's path, or `n1:2,n2:2`), else the Slurm allocation this runs in."""
    if given:
        if not os.path.isfile(given):
            return parse_hosts(given)
        with open(given) as f:
            return parse_hosts(f.read())
    if "SLURM_JOB_NODELIST" not in os.environ:
        raise ValueError("found none, expected a hostfile or n1:2,n2:2 (outside a Slurm allocation)")
    names = subprocess.run(["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]], capture_output=True,
                           text=True, check=True).stdout.split()
    return slurm_hosts(names, os.environ.get("SLURM_TASKS_PER_NODE", ",".join(["1"] * len(names))))
