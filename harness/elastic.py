"""Elastic bagging: a lost rank costs the base models it touched, not the run.

Bagging's base models are independent (V3.0), so a rank that dies need not end the
others' work. Open MPI's ULFM (User-Level Failure Mitigation) lets the survivors go on:
an operation that involves a dead process raises MPI_ERR_PROC_FAILED (or, once a
survivor has revoked the communicator, MPI_ERR_REVOKED) instead of hanging, and the
survivors can agree (MPI_Comm_agree) and shrink the communicator to themselves.

Per the policy (`--on-fault`, HPCAI500_ON_FAULT):

* `abort`: a lost rank ends the run. Where the launch has ULFM the survivors first find it
  as `drop` does (below: the world step that fails is agreed and the world shrunk, so the
  lost ranks, their hosts and the step are known), then every survivor raises `Aborted`:
  world rank 0 (or the rank that takes over from a lost one) records the run `failed` with
  the loss, and each survivor exits with status 1 (harness/driver.py). Without ULFM the
  launch ends the job itself at the death (MPI_Abort, or mpirun's own kill), and nothing
  can be recorded.
* `drop`: every world-level step of the run (the roofline's barrier and gather; in each
  test, its start, the end of the sampler's sends, staging, the start barrier of
  training, each evaluation, the end) runs through `World.step`: each rank tries the step, a rank that
  saw an MPI error revokes the world, and all agree whether every rank succeeded; if
  not, they shrink the world to the survivors and redo the step, leaving out the base
  models that lost a rank (`lost_jobs`); a shrink that loses nobody was an error, not a
  fault (StepFailed). A job whose group lost a member learns it in its own collective
  (Horovod's or torch.distributed's error, `job_failed` confirms it on the job's
  communicator); its survivors leave training and follow the remaining world steps as
  idle ranks do. The later tests run on the ranks that remain (the driver re-plans), and
  a process of a run that lost ranks ends without MPI_Finalize (`leave`).
* `retrain` (the default): as `drop`, and then the survivors train the test's lost base
  models again on their own resamples, in waves, until the ensemble is whole
  (harness/run._waves); a test's division stays what it was, its Time carries the cost.

ULFM must be on at launch: `launch_survives` says whether it is, from what Open MPI reads
(the environment, its MCA parameter files).

A silent rank (SIGSTOPped, a frozen node, a process stuck in the kernel: alive, its sockets
open, its own watchdog stopped with it) raises no error in anyone: the survivors would wait
for it at the next world step for ever. ULFM's heartbeat detector takes a rank for dead
after `timeout` s without a heartbeat; from then on it is lost as a dead one is, at the next
world step. Each rank of the harness arms it for itself before MPI starts
(`detector_params`, HPCAI500_FT_DETECTOR), under mpirun with ULFM (`mpirun_ulfm`), and
then ends without MPI_Finalize, which the detector hangs. `detector` reads the detector's
settings as Open MPI reads them (ompi_info's answer in the ranks' environment: a misspelt
value or a variable `-x` never forwarded shows there as off, where a look at the
environment would take it for on). A lost rank that lives on (silent, or cut off) is then SIGKILLed by a survivor on its
node (`end_strays`): it holds its node's memory and devices, and mpirun waits for it.

Pure functions but for `World`, `job_failed` and `end_strays`, which are MPI (and the
process table) at the edges.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass

from harness import signals

POLICIES = ("abort", "drop", "retrain")
SETTING = "HPCAI500_ON_FAULT"
DEFAULT = "retrain"   # a ranking run ends whole, so its tests keep their division (docs/running.md)
AGREE_TRIES = 3         # agreements a world step asks before it believes a "no" (World._agree)
DETECT_SECONDS = 10.0   # s a job survivor waits for ULFM to name the failed member (seen: 0.5 s)

# The MCA parameters that make a plain mpirun survive a rank's death: Open MPI's (in the
# ranks) and PRTE's (in mpirun and its daemons: keep the job, and tell the survivors).
OMPI_PARAMS = {"mpi_ft_enable": "1"}
PRTE_PARAMS = {"state_base_recoverable": "1", "state_base_notify_errors": "1"}
# ULFM's heartbeat failure detector, armed in each rank of the harness (not in the venv's
# parameter files, which every MPI program of the venv reads). Open MPI 5.0.8's detector hangs
# MPI_Finalize, ranks spinning in ompi_comm_failure_detector_finalize: with its thread of its
# own, 5 of 5 launches of 2-4 ranks of a bare mpi4py program; without it, none of 7 bare ones
# but 2 of 2 4-rank runs of the harness (some ranks spun there while the others waited further
# on). So a rank that armed it ends without MPI_Finalize (driver.end; mpirun then exits
# with the ranks' status). The thread (mpi_ft_detector_thread) also segfaulted a rank at its
# start now and then (5 of 34 4-rank runs of the harness; 0 of 18 with the thread off, 0 of 8
# without the detector), so it is off: the heartbeats then go out only while the rank drives
# MPI's progress, which each rank's `Pulse` does twice a period. Opt-in while it has few runs
# behind it and its cost when nothing fails is not resolved at 2 % (bench/README.md, ulfm.py).
# (A suite with it on by default failed a test whose ranks were lost in device set-up, as often
# with it off: their watchdog, since fixed to count a framework's imports as progress.)
DETECTOR_SETTING = "HPCAI500_FT_DETECTOR"   # s without a heartbeat before a rank is taken for lost; 0: off
DETECTOR_PARAMS = ("mpi_ft_detector", "mpi_ft_detector_thread", "mpi_ft_detector_period", "mpi_ft_detector_timeout")


class Lost(Exception):
    """Raised in a job's survivor whose job lost a rank: it leaves training."""


class CoordinatorLost(Exception):
    """World rank 0 (the run's results, report and curve) was lost: every survivor raises it
    at once; the test under way is lost, and a new coordinator takes over (harness/driver.py)."""


class StepFailed(RuntimeError):
    """A world step failed on some rank with no rank lost: an error, which ends the run."""


class Aborted(Exception):
    """`--on-fault abort`: ranks were lost, found at a world step (every survivor raises it
    at once); the run ends, recorded failed with the loss. `coordinator_lost`: world rank 0
    was among them, so the rank that now has rank 0 takes over the run's records first."""

    def __init__(self, message: str, coordinator_lost: bool = False):
        super().__init__(message)
        self.coordinator_lost = coordinator_lost


class AllLost(Exception):
    """Every base model of a test lost a rank: the test has no result (every survivor raises it)."""


@dataclass(frozen=True)
class Loss:
    """Ranks found dead at one world-level step."""
    ranks: tuple[int, ...]      # their ranks in the launch's MPI_COMM_WORLD
    phase: str                  # the step that found them (e.g. "test 1: the evaluation after epoch 2")
    seconds: float              # s since the start of the invocation (each survivor's own clock)
    time: float = 0.0           # s since the epoch (time.time()) when the survivors had shrunk the world
    hosts: tuple[str, ...] = ()  # the hosts of the ranks lost, as at launch (World.hosts; () where unknown)


def fault_classes() -> tuple[int, ...]:
    from mpi4py import MPI
    return (MPI.ERR_PROC_FAILED, MPI.ERR_PROC_FAILED_PENDING, MPI.ERR_REVOKED)


def is_fault(error: BaseException) -> bool:
    """An MPI error that says a process of the communicator failed (or that a survivor revoked it)."""
    from mpi4py import MPI
    return isinstance(error, MPI.Exception) and error.Get_error_class() in fault_classes()


def is_mpi_error(error: BaseException) -> bool:
    from mpi4py import MPI
    return isinstance(error, MPI.Exception)


def lost_jobs(jobs, launch_of, lost) -> list[int]:
    """The jobs (indices into `jobs`, each a list of test ranks) with a rank whose launch
    rank (`launch_of[test rank]`) is in `lost`."""
    lost = set(lost)
    return [j for j, ranks in enumerate(jobs) if any(launch_of[r] in lost for r in ranks)]


def by_launch(values, launch_ranks, launched: int) -> list:
    """A value per rank of a shrunk world (`values[i]` of the rank whose launch rank is
    `launch_ranks[i]`) as a list by launch rank, None for each of the `launched` ranks lost."""
    out = [None] * launched
    for launch, value in zip(launch_ranks, values):
        out[launch] = value
    return out


def read_params(path: str) -> dict:
    """`name = value` lines of an MCA parameter file ({} if none); comments and blanks skipped."""
    out = {}
    try:
        with open(path) as f:
            for line in f:
                name, eq, value = line.split("#", 1)[0].partition("=")
                if eq:
                    out[name.strip()] = value.strip()
    except OSError:
        pass
    return out


def mpi_etc(environ) -> str:
    """The folder of the MCA parameter files of the MPI this process runs: its prefix's etc/
    (OPAL_PREFIX, which mpirun sets for its ranks, or the venv's)."""
    return os.path.join(environ.get("OPAL_PREFIX", sys.prefix), "etc")


def mpirun_ulfm(environ, etc: str) -> bool:
    """Whether this rank was started by mpirun (PRRTE sets PRTE_LAUNCHED) with ULFM on: the
    ranks that may arm the detector and then end without MPI_Finalize (driver.end). Not under srun,
    whose ranks must finalize (one that did not was reported exit code 14: driver.end) and
    which keeps no job whose rank died, nor a singleton."""
    return environ.get("PRTE_LAUNCHED") == "1" and launch_survives(environ, etc)[0]


def detector_params(environ, etc: str, seconds: float) -> dict:
    """The OMPI_MCA_ variables that arm ULFM's heartbeat detector in this rank, read by its
    Open MPI at MPI_Init: a heartbeat every tenth of the timeout (sent while MPI progresses:
    `Pulse`), a rank taken for lost after `seconds` without one, no thread of its own
    (DETECTOR_SETTING's comment). None but under mpirun with ULFM (`mpirun_ulfm`), where
    `seconds` is 0, or where the launch sets a detector parameter itself (`environ`,
    `etc`/openmpi-mca-params.conf): the site's choice stands, and the report says what Open
    MPI read (`detector`)."""
    given = {**read_params(os.path.join(etc, "openmpi-mca-params.conf")),
             **{k[len("OMPI_MCA_"):]: v for k, v in environ.items() if k.startswith("OMPI_MCA_")}}
    if not mpirun_ulfm(environ, etc) or seconds <= 0 or any(p in given for p in DETECTOR_PARAMS):
        return {}
    return {"OMPI_MCA_mpi_ft_detector": "true", "OMPI_MCA_mpi_ft_detector_thread": "false",
            "OMPI_MCA_mpi_ft_detector_period": f"{seconds / 10:g}", "OMPI_MCA_mpi_ft_detector_timeout": f"{seconds:g}"}


class Pulse:
    """A daemon thread that drives MPI's progress every `seconds` (an Iprobe on COMM_SELF,
    which MPI_THREAD_MULTIPLE allows beside the main thread's calls), so that ULFM's
    detector sends and reads heartbeats while the main thread computes outside MPI (a
    PyTorch base model of one rank calls no MPI in a whole epoch). It needs the GIL a few
    microseconds at a time: a rank whose main thread held the GIL for the detector's whole
    timeout would be taken for lost. MPI at the edge."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        threading.Thread(target=self._run, name="hpcai500-pulse", daemon=True).start()

    def _run(self) -> None:
        from mpi4py import MPI
        while True:
            time.sleep(self.seconds)
            try:
                MPI.COMM_SELF.Iprobe()
            except Exception:  # noqa: BLE001 - a failure is the main thread's to find, in its own call
                pass


def launch_survives(environ, etc: str) -> tuple[bool, str]:
    """(whether this launch keeps the job when a rank dies, how it is known). Open MPI
    takes a parameter from the environment (OMPI_MCA_x; mpirun --with-ft ulfm sets
    OMPI_MCA_mpi_ft_enable for the ranks) or from `etc`/openmpi-mca-params.conf, PRTE from
    `etc`/prte-mca-params.conf (mpirun's PRTE_MCA_x does not reach the ranks: a launch that
    sets them so is taken at its word only with mpi_ft_enable in the environment)."""
    if environ.get("OMPI_MCA_mpi_ft_enable") == "1":
        return True, "OMPI_MCA_mpi_ft_enable=1 in the ranks' environment (mpirun --with-ft ulfm, or set by hand)"
    if "OMPI_MCA_mpi_ft_enable" in environ:   # it outranks the files
        return False, (f"ULFM is off: OMPI_MCA_mpi_ft_enable={environ['OMPI_MCA_mpi_ft_enable']} in the ranks'"
                       " environment; a lost rank ends the run")
    ompi = read_params(os.path.join(etc, "openmpi-mca-params.conf"))
    prte = read_params(os.path.join(etc, "prte-mca-params.conf"))
    missing = [f"{k} = {v} ({name})" for params, found, name in
               ((OMPI_PARAMS, ompi, "openmpi-mca-params.conf"), (PRTE_PARAMS, prte, "prte-mca-params.conf"))
               for k, v in params.items() if found.get(k) != v]
    if missing:
        return False, (f"ULFM is off: {', '.join(missing)} missing in {etc}; a lost rank ends the run"
                       " (launch with mpirun --with-ft ulfm, or make venv)")
    return True, f"ULFM on by {etc}/openmpi-mca-params.conf and prte-mca-params.conf"


@dataclass(frozen=True)
class Detector:
    """ULFM's heartbeat failure detector as the ranks' Open MPI reads it (results.json's
    fault_tolerance.detector from schema 2.22)."""
    on: bool          # mpi_ft_detector
    thread: bool      # mpi_ft_detector_thread: heartbeats from a thread of their own (else only while in MPI)
    period: float     # s between heartbeats (mpi_ft_detector_period)
    timeout: float    # s without a heartbeat before the observed rank is taken for dead (mpi_ft_detector_timeout)
    source: str       # where mpi_ft_detector was read, in ompi_info's words ("default", "environment", "file (...)")


def detector(parsable: str) -> Detector | None:
    """The detector from `ompi_info --param mpi ft --level 9 --parsable`'s output (lines
    `mca:mpi:ft:param:NAME:value:V` and `...:source:S`); None where it names no detector."""
    found = {}
    for line in parsable.splitlines():
        parts = line.split(":", 6)
        if len(parts) == 7 and parts[:4] == ["mca", "mpi", "ft", "param"] and parts[5] in ("value", "source"):
            found[(parts[4], parts[5])] = parts[6]
    try:
        return Detector(found[("mpi_ft_detector", "value")] == "true",
                        found[("mpi_ft_detector_thread", "value")] == "true",
                        float(found[("mpi_ft_detector_period", "value")]),
                        float(found[("mpi_ft_detector_timeout", "value")]), found[("mpi_ft_detector", "source")])
    except (KeyError, ValueError):
        return None


def detector_lines(found: dict | None) -> list[str]:
    """The report's FAULTS lines on a silent rank, for fault_tolerance.detector (a
    Detector's fields; None: not known)."""
    if found is None:
        return ["FAULTS  : a silent rank (stopped, frozen): ULFM's heartbeat detector not known (no Open MPI"
                " ompi_info to ask): if off, the survivors wait for such a rank at the next world step"]
    if not found["on"]:
        return [f"FAULTS  : warning: ULFM's heartbeat detector is off (mpi_ft_detector false, from {found['source']}):"
                " a silent rank (stopped, frozen) is never found lost, the survivors wait for it at the next world"
                f" step ({DETECTOR_SETTING}=30 arms it under mpirun with ULFM)"]
    out = [f"FAULTS  : a silent rank (stopped, frozen) is taken for lost after {found['timeout']:g} s without a"
           f" heartbeat (ULFM's detector, one every {found['period']:g} s"
           f"{', from a thread of its own' if found['thread'] else ', sent as each rank drives MPI every half period'};"
           f" mpi_ft_detector from {found['source']}), then found at the next world step as a dead one is;"
           " a survivor on its node ends it"]
    if found["thread"]:
        out.append("FAULTS  : warning: mpi_ft_detector_thread is true: Open MPI 5.0.8 then hangs MPI_Finalize and"
                   " can crash a rank at its start (docs/running.md, 'A silent rank')")
    return out


def strays(lost, hosts, pids, me: int) -> list[tuple[int, int]]:
    """(launch rank, pid) of each lost rank on launch rank `me`'s host (`hosts`, `pids`: by
    launch rank; [] where the hosts are not known): those `me` can end."""
    if not hosts or not pids:
        return []
    return [(r, pids[r]) for r in sorted(lost) if r != me and hosts[r] == hosts[me]]


def end_strays(world) -> list[int]:
    """SIGKILL each lost rank of this rank's host that still lives (a silent one: SIGSTOPped,
    frozen), once its /proc entry shows it is that rank of this job (PMIX_NAMESPACE and
    PMIX_RANK in its environment: a dead rank's pid may be another process's by now); the
    launch ranks ended. A rank ended twice (two survivors on its host) is no harm."""
    import signal
    mine = os.environ.get("PMIX_NAMESPACE")
    ended = []
    for rank, pid in strays(world.lost, world.hosts, world.pids, world.origin):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = set(f.read().split(b"\0"))
        except OSError:
            continue   # gone: dead, as most lost ranks are
        if mine and {f"PMIX_NAMESPACE={mine}".encode(), f"PMIX_RANK={rank}".encode()} <= env:
            try:
                os.kill(pid, signal.SIGKILL)
                ended.append(rank)
            except OSError:
                pass
    return ended


def unreached(world) -> list[int]:
    """The lost launch ranks with no survivor on their host (none can end them should they
    live on silent; mpirun then waits for them); all of them where the hosts are not known."""
    if not world.hosts:
        return sorted(world.lost)
    left = {world.hosts[r] for r in world.launch_ranks}
    return sorted(r for r in world.lost if world.hosts[r] not in left)


def job_failed(comm, seconds: float = DETECT_SECONDS) -> bool:
    """Whether a member of the job's communicator is dead, waiting up to `seconds` for
    ULFM's detector to name it (a survivor's own collective may fail first). The failure's
    notice reaches the process only through MPI's progress engine, which Get_failed does
    not drive: an Iprobe on COMM_SELF does (without it, 0 of 2 survivors of 2 runs saw a
    killed rank within 10 s, where with it both did in 0.2-0.5 s; Horovod's thread, when
    there is one, drives it too)."""
    from mpi4py import MPI
    end = time.monotonic() + seconds
    while True:
        if comm.Get_failed().Get_size() > 0:
            return True
        if time.monotonic() > end:
            return False
        MPI.COMM_SELF.Iprobe()
        time.sleep(0.1)


class World:
    """The world of the run as it stands: MPI_COMM_WORLD, then each shrunk world after a
    loss. Reads as the communicator it holds (rank, size, collectives); `origin` is this
    rank's rank at launch, `losses` every loss so far (the same on every survivor)."""

    def __init__(self, comm, policy: str, clock=time.perf_counter):
        # plain attributes: only a name missing here reaches the communicator (__getattr__)
        self.comm, self.policy, self.origin, self.losses = comm, policy, comm.rank, []
        self.ulfm = False   # the launch keeps a job whose rank died (launch_survives), once the run has agreed it
        self._clock, self._t0 = clock, clock()
        self._launch = list(range(comm.size))   # launch rank of each rank of `comm`
        self.launched = comm.size               # ranks at launch
        self.hosts: list[str] = []              # the host of each launch rank (the driver sets it; [] unknown)
        self.pids: list[int] = []               # the pid of each launch rank (likewise: end_strays)

    def __getattr__(self, name):
        return getattr(self.comm, name)

    def place(self, hosts: list[str]) -> None:
        """COLLECTIVE: the host of each launch rank (a loss names its hosts) and each one's pid
        (a survivor ends a silent lost rank on its own host: end_strays)."""
        self.hosts, self.pids = hosts, self.comm.allgather(os.getpid())

    @property
    def launch_ranks(self) -> list[int]:
        """The launch rank of each rank of the world as it stands."""
        return list(self._launch)

    @property
    def lost(self) -> set[int]:
        return {r for loss in self.losses for r in loss.ranks}

    @property
    def detects(self) -> bool:
        """Whether a lost rank is found and agreed on (the world shrunk to the survivors):
        under `drop` and `retrain`, and under `abort` where the launch has ULFM, so that the
        run ends recorded with what it lost (`Aborted`). Without ULFM under `abort` a step is
        the bare call: the launch ends the job at a death, and nothing is left to agree."""
        return self.policy != "abort" or self.ulfm

    def step(self, phase: str, fn):
        """fn() on every rank as one world-level step; under `drop`, redone on the
        survivors (fn reads `lost` to leave the lost base models out) until every rank of
        the world as it then stands has succeeded; under `abort`, once the survivors have
        found who was lost, `Aborted` on every survivor."""
        if not self.detects:
            return fn()
        while True:
            ok, error = 1, None
            try:
                out = fn()
            except Exception as e:  # noqa: BLE001 - an MPI error is ours to agree on; anything else goes on up
                if not is_mpi_error(e):
                    raise
                error = e
                # Any MPI error: a dead peer does not always show as PROC_FAILED (an Ibarrier's
                # schedule over a broken TCP link gave MPI_ERR_OTHER, seen 3 in 3 on two
                # simulated nodes); the shrink below tells a loss from an error
                ok = 0
                self.comm.Revoke()   # a rank still waiting in fn for this one learns it at once
            ok, error = self._agree(ok, error)
            if ok:
                return out
            if not self._shrink(phase):
                # the rank that saw the error names it: the agreement carries one bit, not the text
                raise StepFailed(f"{phase}: an MPI operation failed on "
                                 f"{f'this rank ({error})' if error else 'another rank'}, and no rank was lost")

    def _agree(self, ok: int, error):
        """Whether every rank's try succeeded (the same on every rank), and this rank's error.
        Open MPI 5.0.8's agreement (ERA) now and then says "no" where every rank said "yes":
        2 of 5,000 and 1 of 7,000 agreements of two ranks with no fault (Horovod's thread
        busy on a job's communicator, the cores oversubscribed 3 x; both ranks got 0, each
        time), which ended a run with no rank lost (test_cosmoflow's and test_options' runs,
        in about half of the fresh suites of 2026-11-27/28). Each rank asks again with its
        own flag: the answer is uniform, so every rank asks as often; a real "no" stays one
        (the erring rank says 0 again, a dead one never says 1), a spurious one came back 1
        at the first retry, each time seen."""
        for _ in range(AGREE_TRIES):
            try:
                if self.comm.Agree(ok):
                    return 1, error
            except Exception as e:  # noqa: BLE001 - an unacknowledged failure: the agreement says "no" uniformly
                if not is_fault(e):
                    raise
                error = error or f"the agreement itself raised {e}"
        return 0, error

    def _shrink(self, phase: str) -> tuple[int, ...]:
        """The world shrunk to the survivors; the launch ranks it lost (none: an error, not a loss)."""
        from mpi4py import MPI
        old = self.comm
        old.Revoke()
        new = old.Shrink()
        kept = MPI.Group.Translate_ranks(new.Get_group(), list(range(new.size)), old.Get_group())
        launch = [self._launch[r] for r in kept]
        gone = tuple(r for r in self._launch if r not in set(launch))
        coordinator_lost = launch[0] != self._launch[0]   # world rank 0: the lowest launch rank left takes over
        self.comm, self._launch = new, launch
        if gone:
            hosts = tuple(sorted({self.hosts[r] for r in gone})) if self.hosts else ()
            self.losses.append(Loss(gone, phase, self._clock() - self._t0, time.time(), hosts))
            end_strays(self)   # under every policy: a silent one would hold mpirun past the run's end
            if self.policy == "abort":   # its one line is the run's error (driver._aborted)
                raise Aborted(f"--on-fault abort: {describe(self.losses[-1:])}; the run ends", coordinator_lost)
            if self.comm.rank == 0:
                print(announce(self.losses[-1], self.policy, self.comm.size), file=sys.stderr, flush=True)
        if coordinator_lost:
            raise CoordinatorLost(f"world rank 0, the coordinator, was lost ({describe(self.losses[-1:])})")
        return gone


def entry(loss: Loss) -> dict:
    """results.json's entry for a loss of the run (fault_tolerance.losses); `hosts` from
    results schema 2.18."""
    return {"ranks": list(loss.ranks), "hosts": list(loss.hosts), "phase": loss.phase, "seconds": loss.seconds,
            "time": loss.time}


def record(loss: Loss, launch_of, nodes, jobs) -> dict:
    """results.json's entry for one loss in a test: the launch ranks lost, their hosts (of
    the test's `nodes`), the step that found them, when, and the test's jobs they cost
    (`jobs`: each a list of test ranks, `launch_of` their launch ranks)."""
    test_rank = {launch: r for r, launch in enumerate(launch_of)}
    return {"ranks": list(loss.ranks),
            "hosts": sorted({nodes.hosts[nodes.node_of_rank[test_rank[r]]] for r in loss.ranks if r in test_rank}),
            "phase": loss.phase, "seconds": loss.seconds, "time": loss.time,
            "jobs": lost_jobs(jobs, launch_of, loss.ranks)}


def describe(losses) -> str:
    """Losses (Loss objects or results.json's entries) in words: 'rank 3 (on n2) lost,
    found at test 1: the evaluation after epoch 2; ...' (the hosts where known)."""
    out = []
    for loss in losses:
        ranks, phase, hosts = ((loss["ranks"], loss["phase"], loss.get("hosts") or ()) if isinstance(loss, dict)
                               else (loss.ranks, loss.phase, loss.hosts))
        on = f" (on {', '.join(hosts)})" if hosts else ""
        out.append(f"{'rank' if len(ranks) == 1 else 'ranks'} {', '.join(map(str, ranks))}{on} lost, found at {phase}")
    return "; ".join(out)


# What a loss costs under each policy, as the console's line says it the moment it is agreed
COSTS = {"drop": "the base models it touched leave the ensemble",
         "retrain": "the base models it touched are trained again once the others finish"}


def announce(loss: Loss, policy: str, left: int) -> str:
    """The console's one line on a loss, printed by world rank 0 as soon as the survivors
    have agreed on it (World._shrink): who, where, found at which step, what it costs."""
    return (f"hpcai500: {describe([loss])}; --on-fault {policy}: {COSTS[policy]}, the run goes on with the"
            f" {left} rank(s) left (docs/running.md, 'When a rank dies')")


def lines(tolerance: dict, schema: tuple[int, int] | None = None) -> list[str]:
    """The report's parameter lines (and --check's) for results.json's fault_tolerance, as
    results schema `schema` wrote them (None: today's; --verify passes an earlier run's:
    before 2.14 `abort` said MPI_Abort whatever the launch)."""
    ends = "MPI_Abort" if not tolerance["ulfm"] or (schema and schema < (2, 14)) else \
        "each rank's exit status 1: under ULFM MPI_Abort ends only its caller"   # harness/driver._end_job
    what = {"abort": f"a lost rank ends the run ({ends})",
            "drop": "a lost rank costs the base models it touched; the test and the sweep go on with the survivors",
            "retrain": "a lost rank's base models are trained again on the survivors once the others finish (the"
                       " ensemble whole, Time carrying the cost); the sweep goes on with the survivors"}
    out = [f"FAULTS  : --on-fault {tolerance['policy']}: {what[tolerance['policy']]}",
           f"FAULTS  : {tolerance['how']}"]
    if tolerance["policy"] != "abort" and not tolerance["ulfm"]:
        out.append(f"FAULTS  : warning: --on-fault {tolerance['policy']} asked, but this launch cannot keep a job"
                   " whose rank died: a fault ends the run")
    if tolerance["ulfm"] and "detector" in tolerance:   # schema 2.22 on: the detector as the ranks' MPI read it
        out += detector_lines(tolerance["detector"])
    return out


def leave(status: int) -> None:
    """End a process of a run that lost ranks, without MPI_Finalize: its fence over the
    launch's processes waited forever for a dead one in 2 of 2 PyTorch runs under load (the
    ranks stuck in ompi_mpi_finalize's wait after the report was whole), while leaving so
    lets mpirun end the job and exit 0 (seen with ULFM on; a rank's status 1 is mpirun's:
    2-4 ranks of mpi4py, 3 of 3, as a ULFM job outlives a process that ends unfinalized)."""
    signals.exit_now(status)
