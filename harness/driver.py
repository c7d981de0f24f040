"""Driver (HPL_pddriver): the command line, start-up, and the sweep of tests.

    read input (plan.read) -> nodes -> validate and load data (plan.make, before
    TensorFlow loads) -> devices -> [--check: print the plan] -> roofline micro-kernels
    -> inventory
    -> for each test and repetition: run.test -> report.Output.add -> finish

The data flows one way, dat -> topology -> sampler -> staging -> train -> ensemble ->
metrics -> report. Every failure that can be known before training is agreed on by all
ranks (harness/errors.py) and ends the run with exit status 1 and one message from rank
0; `--check` goes through the same checks. A lost rank costs the base models it touched
under `--on-fault drop` (harness/elastic.py: the sweep goes on with the survivors, the
later tests laid out anew on them); any other failure during a test calls MPI_Abort, so
no rank is left blocked in a collective.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, replace

import numpy as np

from harness.errors import RunError, crash, first_failure, native_stderr_captured, say
from harness.watchdog import DEFAULT_SECONDS, Watchdog
from harness import (checkpoint, dat, division, elastic, fault, files, frameworks, gpus, heartbeat, relaunch, report,
                     results, run, settings, signals, telemetry, topology, tune, verify, workloads)
from harness import plan as planning   # `plan` names the validated plan in _run

VERSION = "0.2"
_ARMED: dict = {}   # the detector's parameters this rank armed (main), {} none


def launcher_rank() -> int:
    """This process's rank as the launcher tells it, before MPI starts (0 if unknown)."""
    for var in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


class _Parser(argparse.ArgumentParser):
    """Command-line misuse is input misuse: one message (from rank 0), exit status 1 on
    every rank, before MPI or TensorFlow start."""

    def print_help(self, file=None):
        if launcher_rank() == 0:
            super().print_help(file)

    def error(self, message):
        if launcher_rank() == 0:
            self.print_usage(sys.stderr)
            say(f"error: {message}")
        _quiet_exit(1)


def end(status: int) -> None:
    """This process's exit with `status` once main() has returned: Python's exit handlers run
    (Horovod's shutdown among them), then MPI_Finalize (mpi4py's own is a C-level exit
    handler, which os._exit would skip: under srun a rank ended without it was reported
    exit code 14), what is buffered is written (Python's streams, and C's: a library's printf
    to a pipe is block-buffered), then the process ends without the interpreter's teardown
    of every module and the frameworks' C++ destructors: 1.3 s of CPU a process for
    TensorFlow with Horovod, 0.5 s for PyTorch, measured 2026-11-29 (import, then exit,
    against import, then os._exit), at every rank's end, where ranks share cores (8 PyTorch
    ranks on 2 cores: 3.5 s from the last rank's MPI_Finalize to mpirun's exit, 0.2 s
    without it). Nothing of the run's is left to it: every file is written and closed
    before main() returns. A run that lost ranks ends in elastic.leave instead; a rank that
    armed ULFM's heartbeat detector (main: under mpirun with ULFM) skips MPI_Finalize, which
    the detector hangs (elastic.DETECTOR_SETTING's comment): mpirun then ends the job with
    the ranks' status."""
    import atexit
    import ctypes
    atexit._run_exitfuncs()
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized() and not _ARMED:
        mpi.Finalize()
    sys.stdout.flush()
    sys.stderr.flush()
    ctypes.CDLL(None).fflush(None)   # C's too here (nothing is stuck: the run is over)
    signals.exit_now(status)


def _quiet_exit(status: int) -> None:
    """Exit every rank after rank 0 has printed (every rank takes this path alike)."""
    from mpi4py import MPI
    MPI.COMM_WORLD.Barrier()
    sys.exit(status)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, found {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected seconds >= 0, found {text!r}")
    return value


# The modes that read earlier runs' folders (no MPI, no input file, no training): one at a time,
# and never with what plans or starts a run (RUN_OPTIONS, the input file), which they would ignore.
READERS = ("--verify", "--status", "--summarize")
RUN_OPTIONS = ("--check", "--resume", "--on-fault", "--tune", "--relaunch")


def mode_conflict(args, dat_given: bool) -> str | None:
    """Why the command line's modes cannot go together, or None (pure): two readers, or a reader
    with an option of a run or an input file. --check with --resume checks that resume."""
    readers = [r for r in READERS if getattr(args, r[2:])]
    if not readers:
        return None
    if len(readers) > 1:
        return (f"argument {readers[1]}: not allowed with argument {readers[0]}: each reads earlier runs on its own;"
                " give one")
    others = [f"argument {o}" for o in RUN_OPTIONS if getattr(args, o[2:].replace("-", "_")) not in (None, False)]
    others += [f"an input file ({args.dat})"] * dat_given
    if others:
        return (f"argument {readers[0]}: not allowed with {others[0]}: {readers[0]} reads earlier runs (their"
                " results.json), it plans and starts none")
    return None


def _minutes(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a budget in minutes, found {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected minutes > 0, found {text!r}")
    return value


def parse_args(argv):
    p = _Parser(prog="hpcai500.py", description="HPC AI500 V3.0 bagging benchmark")
    p.add_argument("dat", nargs="?", help="input file (default HPCAI500.dat)")
    p.add_argument("--check", action="store_true",
                   help="validate the input and print the tests and the job-to-rank-to-node map, without training")
    p.add_argument("--watchdog", type=_seconds, metavar="SECONDS",
                   default=os.environ.get("HPCAI500_WATCHDOG", str(DEFAULT_SECONDS)),
                   help="abort the job when a rank makes no progress (no training step, no phase change)"
                        f" for this long; 0 = off (default: $HPCAI500_WATCHDOG or {DEFAULT_SECONDS:g})")
    p.add_argument("--on-fault", choices=elastic.POLICIES, metavar="POLICY",
                   help="what a lost rank (a dead process, node or a hung rank's watchdog) costs: 'retrain' the base"
                        " models it touched on the survivors once the others finish, 'drop' them, the test and the"
                        " sweep going on with the survivors either way, or 'abort' the run"
                        f" (default: ${elastic.SETTING} or {elastic.DEFAULT}); needs ULFM at launch"
                        " (docs/install.md, 'ULFM')")
    p.add_argument("--resume", metavar="RUN",
                   help="continue the interrupted invocation whose folder is RUN (runs/<id>; not a results"
                        " directory: the run to write into is named, never guessed): its finished tests are kept"
                        " and skipped; the input file must be the one it ran")
    p.add_argument("--tune", nargs="?", type=_minutes, const=tune.DEFAULT_MINUTES, metavar="MINUTES",
                   help="tune the input file for this machine within MINUTES of machine time (default"
                        f" {tune.DEFAULT_MINUTES:g}): its lines listing several values are the search space; writes"
                        f" the tuning table, a chart and the tuned input file ({tune.TUNED}) in the run's folder"
                        " (docs/tuning.md, 'Tuning with --tune')")
    p.add_argument("--relaunch", nargs="?", type=int, const=relaunch.DEFAULT_TIMES, metavar="TIMES",
                   help="run mpirun on --hosts (not under mpirun: this process is the launcher) and, when the run"
                        " ends with a node lost (PRRTE names it), --resume it on the hosts left, up to TIMES times"
                        f" (default {relaunch.DEFAULT_TIMES}); each launch is recorded in the run folder"
                        " (docs/running.md, 'A lost node, a cut link')")
    p.add_argument("--hosts", metavar="HOSTS",
                   help="with --relaunch: a hostfile, or n1:2,n2:2 (host:ranks); default: the Slurm allocation")
    p.add_argument("--mpirun", metavar="OPTIONS",
                   help="with --relaunch: options for every mpirun it runs, one quoted string (e.g."
                        " \"-x HPCAI500_ON_FAULT -x HPCAI500_HEARTBEAT\")")
    p.add_argument("--summarize", nargs="+", metavar="RUN",
                   help="reprint the result tables of earlier runs (runs/<id> folders; a results directory: every"
                        " run in it) side by side")
    p.add_argument("--verify", metavar="RUN",
                   help="re-derive every figure of the run RUN (runs/<id>; a results directory: its newest run,"
                        " named) from results.json and its MLLOG files"
                        " and print one PASSED/FAILED line per check; exit status 0 only if all pass on a complete"
                        " run, 1 a check failed (or not a run), 2 all passed but the run is incomplete")
    p.add_argument("--status", metavar="RUN",
                   help="one line on the run RUN (runs/<id>; a results directory: its newest run): its state, the test"
                        " runs finished of those planned, why, its last heartbeat; exit status 0 only for a run"
                        " complete with every test PASSED, "
                        + ", ".join(f"{c} {n}" for n, c in heartbeat.EXIT.items() if c) + ", 1 not a run")
    args = p.parse_args(argv)
    if (args.hosts or args.mpirun) and args.relaunch is None:
        p.error(f"argument {'--hosts' if args.hosts else '--mpirun'}: only with --relaunch (the launcher's own)")
    if args.relaunch is not None and (args.relaunch < 0 or args.check):
        p.error(f"argument --relaunch: found {'--check' if args.check else args.relaunch}, expected a count of"
                " relaunches >= 0 for a run (--check starts no run)")
    conflict = mode_conflict(args, args.dat is not None)
    if conflict:
        p.error(conflict)
    args.dat = args.dat or "HPCAI500.dat"
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.verify:  # reads the run folder only: no MPI, no TensorFlow
        return verify.main(args.verify)
    if args.status:  # likewise
        return heartbeat.main(args.status)
    if args.summarize:  # reads results.json files only: no MPI, no TensorFlow
        try:
            print(report.summarize(args.summarize), end="")
        except (OSError, ValueError, KeyError) as e:
            say(f"error: --summarize: {e}")
            return 1
        return 0
    if args.relaunch is not None:   # the launcher: no MPI here, each launch's ranks run the rest
        return relaunch.main(args, _program(args))
    if args.on_fault:   # a setting like the others: read once, recorded, echoed
        os.environ[elastic.SETTING] = args.on_fault
    armed = elastic.detector_params(os.environ, elastic.mpi_etc(os.environ), _detector_seconds())
    os.environ.update(armed)
    _ARMED.update(armed)   # end() skips MPI_Finalize
    from mpi4py import MPI
    if armed:   # the heartbeats go out as MPI progresses
        elastic.Pulse(float(armed["OMPI_MCA_mpi_ft_detector_period"]) / 2)
    world = elastic.World(MPI.COMM_WORLD, "abort")   # its policy once the settings are agreed (_run)
    watchdog = Watchdog(args.watchdog, world.rank, lambda: _give_up(world), lambda: _giving_up(world)).start()
    status = _guarded(args, world, watchdog)
    if world.losses:
        if world.rank == 0 and (far := elastic.unreached(world)):
            say(f"the run has ended; lost rank(s) {', '.join(map(str, far))} had no rank left on their node to end"
                " them: should one live on silent (stopped, frozen), mpirun waits for it; its results are whole"
                " (--status says so): end mpirun (Ctrl-C, scancel)")
        elastic.leave(status)
    return status


def _detector_seconds() -> float:
    """HPCAI500_FT_DETECTOR before MPI starts; a bad value arms nothing here and is refused,
    named, once MPI runs (settings.read, on every rank alike)."""
    try:
        return settings.value(elastic.DETECTOR_SETTING)
    except settings.SettingError:
        return 0.0


def _program(args) -> list[str]:
    """The ranks' command line under the relauncher: this program, the input, and the run
    options given (--resume is the relauncher's to add)."""
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "hpcai500.py")
    return [sys.executable, here, args.dat, "--watchdog", f"{args.watchdog:g}",
            *(["--on-fault", args.on_fault] if args.on_fault else []),
            *(["--tune", f"{args.tune:g}"] if args.tune is not None else [])]


def _guarded(args, world, watchdog) -> int:
    """The run, its exit status, and every way it can fail, on this rank."""
    try:
        return _run(args, world, watchdog)
    except RunError as e:
        if world.rank == 0:
            say(f"error: {e}")
        world.Barrier()  # a rank exiting early makes mpirun kill rank 0 before it has spoken
        return 1
    except elastic.Aborted as e:   # --on-fault abort before any record (the roofline): one survivor says it
        if world.rank == 0:
            say(f"error: {e}; no test had started, nothing written")
        return 1
    except elastic.CoordinatorLost as e:   # outside a test (the sweep takes over inside one): one survivor says it
        if world.rank == 0:
            say(f"error: {e}; outside a test no new coordinator takes over: the run ends, its results as last"
                " written")
        return 1
    except BaseException as e:  # noqa: BLE001 - any other failure must not leave ranks hanging
        print(crash(world.origin, watchdog.phase, e), file=sys.stderr, flush=True)
        _end_job(world)
        return 1
    finally:
        watchdog.stop()  # the run is over: MPI_Finalize may wait for slower ranks' output


# Where the launch keeps a job whose rank died (ULFM: the venv's mpirun), MPI_Abort ends only
# its caller, and two ranks calling it at once can leave mpirun hung for good with every rank
# gone. Measured 2026-11-28, the venv's Open MPI 5 (mpi4py, ranks blocked in a barrier or
# asleep): one rank's MPI_Abort of 4 ended that rank alone and mpirun never exited (20 of 20;
# 2 ranks: the other was ended); every rank calling MPI_Abort within 3 ms: mpirun hung with no
# rank left in 6 of 50 launches of 2 ranks and 3 of 20 of 4 (without ULFM: 0 of 30); every rank
# ending itself with exit status 1 instead: mpirun exited 1 every time (30 of 30 on 2 ranks,
# 20 of 20 on 4). A watchdog fires on every stuck rank within one look, so there it is the
# exit: each stuck rank ends itself, the others learn it from ULFM in their next collective
# (or their own watchdog ends them), and mpirun's exit status is 1. A failure raised on
# several ranks at once (the crash path) would race the same way.
def _end_job(world) -> None:
    """This rank's end of the whole job with a non-zero status (mpirun exits 0 when every
    rank was SIGKILLed under ULFM): its exit status 1 where the launch has ULFM (above),
    else MPI_Abort, which there ends every rank."""
    if world.ulfm:
        signals.exit_now(1)
    world.Abort(1)


def _give_up(world) -> None:
    """The watchdog's end of a rank without progress: the job's (_end_job) under `abort`
    and for world rank 0 (the coordinator: a hung one holds the results); else this
    process alone, SIGKILLed, so that ULFM tells its partners (harness/elastic.py)."""
    if world.policy == "abort" or world.rank == 0:
        _end_job(world)
    os.kill(os.getpid(), signal.SIGKILL)


def _giving_up(world) -> str:
    if world.policy == "abort":
        return "aborting the job"
    if world.rank == 0:
        return "aborting the job (world rank 0, the coordinator: where every rank is stuck, the run's exit says so)"
    return (f"ending this rank (--on-fault {world.policy}): its base models are lost"
            f"{', to be trained again' if world.policy == 'retrain' else ''}, the other jobs go on")


def _run(args, world, watchdog) -> int:

    # [rank 0's report.Output] once the results exist (a new coordinator's after a takeover,
    # _sweep); the signal handler then records the interruption
    output = [None]

    def stop(signum):
        if world.rank != 0:
            time.sleep(1.0)  # let rank 0 write before mpirun, seeing us gone, kills it
        elif output[0] is None:
            say(f"{signals.reason(signum)} during {watchdog.phase}; no test had finished, nothing written")
        else:
            output[0].finish(interrupted=signals.reason(signum))
    signals.on_signal(stop)

    watchdog.beat("input")
    tuning = args.tune is not None
    given = planning.read(world, args.dat, args.resume, args.tune)
    if tuning and (why := tune.space_problem(given.cfg)):   # before the data: the same input on every rank
        raise RunError(why)
    tolerance = _agreed_tolerance(world)
    nodes = topology.discover(world)
    world.place([nodes.hosts[n] for n in nodes.node_of_rank])
    # Validate and load before TensorFlow is imported (~3 s a rank): a refused input stops
    # at once, and the loaders run no TensorFlow op, so the pinning below still works.
    plan = planning.make(world, given, nodes, watchdog)
    cfg = plan.cfg
    devices = _devices(world, plan, nodes, watchdog)
    refused = _precision_problems(world, cfg)
    plan = planning.device_skipped(plan, refused)
    budget = (args.tune or 0) * 60.0   # s
    stages = _tuning_plan(world, plan, budget, args.check, tolerance) if tuning else None
    if args.check:
        if world.rank == 0 and not tuning:
            print("\n".join(planning.describe(plan, world.size) + elastic.lines(tolerance)), flush=True)
        return 0

    ceilings = _roofline(world, cfg.frameworks, cfg.precisions, watchdog, refused) if cfg.roofline else None
    watchdog.beat("inventory")
    environment, nodes = _inventory(world, nodes, devices, cfg.frameworks)
    run_dir = args.resume if args.resume else _make_run_dir(world, cfg.results_dir)
    ctx = run.Context(cfg, world, nodes, devices, os.path.basename(os.path.normpath(run_dir)), ceilings or {},
                      tune.planned_trials(stages) if tuning else plan.n_tests, _submission(world, environment),
                      None if tuning else run_dir)   # a trial writes no checkpoint: --resume of a tuning run redoes it
    if world.rank == 0:
        # stamped before results.json first says `running`: a reader never finds that status without a heartbeat
        heartbeat.Heartbeat(run_dir, settings.value(heartbeat.SETTING)).start()
        output[0] = _output(cfg, plan, run_dir, environment, devices, nodes, ceilings or {}, tolerance,
                            stages and tune.start(budget, stages))
        # said at the start: a Ctrl-C of mpirun can end its forwarding of our output before the
        # report's end reaches the terminal, while report.txt still gets it whole
        print(f"hpcai500: results in {run_dir}/ (report.txt, results.json: rewritten after each test)",
              file=sys.stderr, flush=True)
    _tune(ctx, plan, output, watchdog, run_dir, budget) if tuning else _sweep(ctx, plan, output, watchdog, run_dir)
    watchdog.beat("the summary and charts")
    if output[0]:
        output[0].finish()
    _wait_for_the_summary(world, watchdog)
    return 0


def _devices(world, plan, nodes, watchdog) -> dict:
    """Each framework the sweep names set up on this rank: {name: its setup_devices record}
    (each test reads its own framework's: a sweep of a GPU framework and a CPU one charges
    neither the other's device), agreed: GPUs shared as the plan allows on every node."""
    watchdog.beat("device set-up")
    cfg = plan.cfg
    with native_stderr_captured() as native, _collector_off(), watchdog.beating_on_imports():
        devices = {name: frameworks.get(name).setup_devices(nodes.local_rank, nodes.ranks_sharing_cores)
                   for name in cfg.frameworks}
    # asleep: a framework's import takes seconds, longer where ranks share cores, and a rank
    # done first would keep a core busy in the blocking gather below while others import
    watchdog.wait(world.Ibarrier(), "device set-up: waiting for the other ranks")
    blind = [name for name, d in devices.items() if frameworks.facts(name).USES_GPUS and not d["gpus_on_node"]]
    if blind and telemetry.gpu_inventory():
        say(f"rank {world.rank}: NVML sees GPUs on {nodes.hosts[nodes.node_of_rank[world.rank]]} but"
            f" {', '.join(blind)} found none; start-up messages:\n{native[0]}")
    # the identity of the GPU each rank's frameworks pinned (None: sharing allowed), not its index: under a
    # per-rank CUDA_VISIBLE_DEVICES every rank's GPU is its framework's "GPU 0"
    pinned = world.allgather({name: gpus.nccl_identity(d) for name, d in devices.items()})
    first_failure(world, planning.shared_gpu_problem(cfg, plan.tests, nodes.node_of_rank, pinned, nodes.hosts))
    first_failure(world, planning.gpu_memory_problem(cfg, max((d["gpus_on_node"] for d in devices.values()),
                                                              default=0)))
    return devices


@contextlib.contextmanager
def _collector_off():
    """The frameworks' imports with the cyclic garbage collector off, then everything made so far
    frozen. An import makes objects by the hundred thousand, next to none of them garbage, and
    each full collection it sets off scans them all again: `import tensorflow` with Horovod took
    3.4-4.3 s here with the collector on, 2.8-3.0 s off; torch with torch._dynamo 3.2-3.8 s against
    2.6-2.7 (2-vCPU AMD EPYC, 2026-12-06), on every rank; a 1-rank run of digits takes 12-15 %
    less CPU (bench/startup.py). The modules live to the process's end: frozen, out of the
    collector's sight, a full collection (the interpreter's own, or a job's close in
    harness/frameworks/pytorch/interface.py) scans only what the sweep makes; with PyTorch loaded
    one took 0.08-0.37 s (4 ranks on 2 cores the latter), after freezing ~0. The imports' own
    garbage is frozen with them, kept to the end: 1,576 objects, 0.2 MB, in TensorFlow with
    Horovod; 8,856, 7 MB, in PyTorch with torch._dynamo (its peak resident memory 398 MB against
    391-393). A collection before the freeze would reclaim it for ~0.37 s a rank, most of the gain."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was:
            gc.enable()


def _wait_for_the_summary(world, watchdog) -> None:
    """Every rank waits, asleep, for the coordinator's summary and charts before MPI_Finalize:
    Open MPI 5's finalize polls, so a rank that reached it first kept a core busy for as long
    as the coordinator wrote (measured: 4.1 s of CPU over a 4 s wait, 2 ranks), the core the
    coordinator needs where ranks share cores. A peer lost here changes nothing written:
    its error is left to MPI_Finalize, as before this wait."""
    try:
        watchdog.wait(world.Ibarrier(), "waiting for the coordinator's summary and charts")
    except Exception as e:  # noqa: BLE001 - an MPI error only; anything else goes on up
        if not elastic.is_mpi_error(e):
            raise


def _sweep(ctx, plan, cell, watchdog, run_dir) -> None:
    """Every test of the plan, each repetition, on every rank; rank 0's output (`cell[0]`,
    None elsewhere) records each as it finishes. An error all ranks agree on mid-sweep
    (staging) ends the sweep with the finished tests standing. After a loss of ranks (in
    the roofline or a test) the tests left are laid out anew on the survivors
    (planning.relaid); those that no longer fit are skipped, as is a test whose every base
    model was lost, and a test during which world rank 0 was lost: a new coordinator takes
    over the run's folder (_take_over). Each test starts with a world step, which finds a
    rank lost since the last one ended: the test is then laid out anew before it runs."""
    world = ctx.world
    runs, seen = list(plan.runs), 0
    try:
        while runs or len(world.losses) > seen:   # the last test's losses are recorded too
            # rank 0's output is cell[0] throughout: a take-over (_take_over) replaces it
            if len(world.losses) > seen:   # ranks lost in the roofline or the last test
                seen = len(world.losses)
                watchdog.beat("laying out the tests left on the ranks that remain")
                ctx = replace(ctx, nodes=topology.discover(world))
                runs, gone = planning.relaid(plan.cfg, runs, world.size, ctx.nodes.node_of_rank,
                                             elastic.describe(world.losses))
                if cell[0]:
                    cell[0].lost([elastic.entry(x) for x in world.losses])
                    for s, r in gone:
                        cell[0].skip(s.test.index, r, s.reason, s.cause)
                continue
            p, rep = runs.pop(0)
            t = p.test
            watchdog.beat(f"test {t.index} (M={t.M}, P={t.P}, B={t.batch})")
            if cell[0]:   # under way from its start step on: a signal there is recorded as during it
                cell[0].begin(t.index, rep)
            try:   # a rank lost since the last test's end (rank 0 wrote it meanwhile): laid out anew first
                fault.point(world.origin, "start", t.index)
                world.step(f"the start of test {t.index}", lambda: watchdog.wait(
                    world.Ibarrier(), f"test {t.index}: waiting for every rank to start it"))
            except elastic.CoordinatorLost as e:   # nothing under way is lost
                ctx = _take_over(ctx, cell, plan.cfg, run_dir, e)
            if len(world.losses) > seen:
                runs.insert(0, (p, rep))
                continue
            try:
                done = run.test(ctx, p, plan.datas[t.workload], watchdog, rep)
                if cell[0]:
                    cell[0].add(*done)
                    checkpoint.discard(run_dir, t.index, rep)   # its result is written: nothing goes on from them
            except (elastic.AllLost, elastic.CoordinatorLost) as e:
                why = str(e)
                if isinstance(e, elastic.CoordinatorLost):
                    ctx = _take_over(ctx, cell, plan.cfg, run_dir, e)
                    why += (f"; the test's evaluations and records were gathered there and went with it; rank"
                            f" {world.origin} took over as the coordinator")
                if cell[0]:
                    cell[0].skip(t.index, rep, why, "lost", [elastic.entry(x) for x in world.losses])
                    checkpoint.discard(run_dir, t.index, rep)   # recorded as skipped: nothing goes on from them
    except elastic.Aborted as e:
        _aborted(ctx, cell, plan.cfg, run_dir, e)
    except RunError as e:
        if cell[0]:
            cell[0].finish(interrupted=f"{results.ERROR_PREFIX}{e}")
        raise


def _tuning_plan(world, plan, budget: float, check: bool, tolerance: dict) -> tuple:
    """A tuning run's stages (tune.make_plan: pure, the same on every rank; RunError for a
    space or budget it refuses); under --check printed by rank 0 with the input and the space."""
    cfg = plan.cfg
    try:
        stages, cannot = tune.make_plan(cfg, world.size, plan.datas[cfg.workloads[0]].n_train, budget)
    except tune.TuneError as e:
        raise RunError(str(e)) from None
    if check and world.rank == 0:
        print("\n".join(planning.describe_input(plan, f"a --tune search space on {world.size} rank(s)")
                        + tune.plan_lines(cfg, stages, budget, cannot) + elastic.lines(tolerance)), flush=True)
    elif world.rank == 0:
        for line in tune.plan_lines(cfg, stages, budget, cannot):   # the space, what stays fixed, the plan
            say(f"tune: {line}")
    return stages


def _tune(ctx, plan, cell, watchdog, run_dir: str, budget: float) -> None:
    """A tuning run (--tune, harness/tune.py): world rank 0 holds the study and sends each
    trial's settings; every rank runs the trial as a test of the sweep (_trial). At the end
    rank 0 writes the tuning table and the tuned input file; the report's block and chart
    come with the summary (report.Output.finish)."""
    world, cfg = ctx.world, plan.cfg
    data = plan.datas[cfg.workloads[0]]
    state = {"ctx": ctx, "seen": len(world.losses)}

    def send(spec):
        return world.step("tuning: the next trial's settings", lambda: world.bcast(spec, root=0))

    try:
        if world.rank != 0:   # a trial's settings, until None (the end) or a string (rank 0's TuneError)
            while (spec := send(None)) is not None:
                if isinstance(spec, str):
                    raise RunError(spec)
                _trial(state, plan, spec, watchdog, cell, data, run_dir)
            return
        tuner = tune.Tuning(cfg, budget, world.size, data.n_train, execute=None,
                            study=tune.studies(run_dir, cfg.seed), said=lambda line: say(line),
                            saved=cell[0].tuned, done=tune.done(plan.previous))

        def execute(spec):
            got = _trial(state, plan, send(spec), watchdog, cell, data, run_dir)
            tuner.world_size = world.size   # a loss shrinks what later trials may lay out
            return got
        tuner.execute = execute
        try:
            best = tuner.run()
        except tune.TuneError as e:   # the calibration showed the budget short: every rank says so
            send(str(e))
            raise RunError(str(e)) from None
        send(None)
    except elastic.Aborted as e:
        _aborted(state["ctx"], cell, cfg, run_dir, e)
    except RunError as e:
        if cell[0]:
            cell[0].finish(interrupted=f"{results.ERROR_PREFIX}{e}")
        raise
    if best is None:
        why = f"--tune: no finalist finished (see {run_dir}/report.txt's tuning table): no tuned file"
        cell[0].finish(interrupted=f"{results.ERROR_PREFIX}{why}")
        raise RunError(why)
    how = (f"HPC AI500 V3.0 input file tuned by hpcai500 --tune (run {os.path.basename(os.path.normpath(run_dir))},"
           f" {time.strftime('%Y-%m-%d')})\nbest of {len(tuner.rows)} trials: trial {best['number']}, VFLOPS"
           f" {best['vflops'] / 1e12:.3e} T measured at the full length; the search: {tune.TABLE} beside this file")
    text = tune.tuned_text(cfg, best, how)
    dat.parse_text(text, tune.TUNED)   # an ordinary input file, or a bug here: DatError
    files.atomic_write(os.path.join(run_dir, tune.TUNED), text)
    files.atomic_write(os.path.join(run_dir, tune.TABLE), tune.table_text(cfg, tuner.rows))
    cell[0].tuned({"tuned": tune.TUNED})


def _trial(state, plan, spec, watchdog, cell, data, run_dir: str) -> dict | None:
    """One trial of a tuning run on every rank: a test of the trial's configuration
    (tune.configure) laid out on the world as it stands, run by run.test and recorded by rank
    0's output as any test; rank 0 returns its figures for the table (a trial that lost ranks
    marked `fault`, as it is not compared), the others None."""
    world, ctx = state["ctx"].world, state["ctx"]
    if len(world.losses) > state["seen"]:   # ranks lost in the trial before: the nodes anew
        state["seen"] = len(world.losses)
        ctx = state["ctx"] = replace(ctx, nodes=topology.discover(world))
        if cell[0]:
            cell[0].lost([elastic.entry(x) for x in world.losses])
    cfg = tune.configure(plan.cfg, spec.choice, spec.epochs)
    t = tune.test_of(cfg, spec.choice, spec.number)
    t0 = time.perf_counter()
    try:
        M, warnings = topology.resolve(world.size, t.M, t.P)
    except topology.TopologyError as e:   # the same on every rank: the world as it stands
        return _left_out(cell, t.index, planning.too_large(cfg, t, world.size, e), t0, world)
    planned = planning.judged(cfg, planning.Planned(t, topology.map_jobs(ctx.nodes.node_of_rank, M, t.P, cfg.pmap),
                                                    tuple(warnings)),
                              data, plan.settings, plan.facts[t.workload])
    watchdog.beat(f"tuning trial {t.index} ({spec.stage}: M={t.M}, P={t.P}, B={t.batch}, {spec.epochs} epochs)")
    if cell[0]:
        cell[0].begin(t.index, 0)
    try:
        fault.point(world.origin, "start", t.index)
        world.step(f"the start of test {t.index}", lambda: watchdog.wait(
            world.Ibarrier(), f"test {t.index}: waiting for every rank to start it"))
        if len(world.losses) > state["seen"]:   # laid out on ranks since lost: the tuner runs it again
            return _left_out(cell, t.index, f"ranks lost at its start ({elastic.describe(world.losses[state['seen']:])})",
                             t0, world)
        done = run.test(replace(ctx, cfg=cfg), planned, data, watchdog, 0)
    except elastic.AllLost as e:
        return _left_out(cell, t.index, str(e), t0, world)
    except elastic.CoordinatorLost as e:
        raise RunError(f"{e}; the tuning's study was world rank 0's: --resume {run_dir} with --tune continues it"
                       " from its journal") from None
    if world.rank != 0:
        return None
    result = replace(done[0], trial=spec.trial())
    cell[0].add(result, done[1])
    lost = (f"{len(result.losses)} loss(es) of ranks during it ({report.fault_cost(result) or 'its Losses line'})"
            if result.losses or result.jobs_lost else None)
    return {"flops": result.flops, "quality": result.quality, "vflops": result.vflops,
            "train_seconds": result.train_seconds, "epochs_trained": result.epochs_trained,
            "wall_seconds": time.perf_counter() - t0, "fault": lost}


def _left_out(cell, index: int, why: str, t0: float, world) -> dict:
    """A trial that recorded no test (its ranks lost, or its layout too large for those left):
    skipped as lost in the output with every loss so far, and its fault for the tuner (rank
    0's row; the same on all)."""
    if cell[0]:
        cell[0].skip(index, 0, why, "lost", [elastic.entry(x) for x in world.losses])
    return {"fault": why, "wall_seconds": time.perf_counter() - t0}


def _aborted(ctx, cell, cfg, run_dir: str, e: elastic.Aborted) -> None:
    """--on-fault abort after an agreed loss: the run ends failed, what it lost on record
    (a lost coordinator's successor takes its output over first); RunError on every survivor."""
    if e.coordinator_lost:
        _take_over(ctx, cell, cfg, run_dir, e)
    if cell[0]:
        cell[0].lost([elastic.entry(x) for x in ctx.world.losses])
        cell[0].finish(interrupted=f"{results.ERROR_PREFIX}{e}")
    raise RunError(f"{e}; recorded failed in {run_dir}/ (--status exits 4)") from None


def _take_over(ctx, cell, cfg, run_dir: str, lost: elastic.CoordinatorLost):
    """The sweep's context once world rank 0 was lost, whose output (`cell[0]`) the new
    coordinator (world rank 0 of the shrunk world, the lowest launch rank left) takes over:
    the run's folder as the lost one last wrote it, its roofline figures, a heartbeat of its
    own. Where that folder cannot be read from here (a results directory the nodes do not
    share) every survivor raises RunError saying so: the run ends, its results as last
    written on the lost node."""
    world = ctx.world
    output, err = None, None
    if world.rank == 0:
        here = f"rank {world.origin} on {socket.gethostname()}"
        try:
            if not os.path.isfile(os.path.join(run_dir, "results.json")):
                raise ValueError(f"{run_dir}/results.json is not there from {here} (line 5's results directory"
                                 " is not one the nodes share)")
            output = report.Output.taken_over(cfg, run_dir)
        except (OSError, ValueError) as e:
            err = (f"{lost}; {here} cannot take over as the coordinator: {e}; the run ends, its results as world"
                   " rank 0 last wrote them")
    err = world.step("the new coordinator's take-over", lambda: world.bcast(err, root=0))
    if err:
        raise RunError(err)
    if world.rank == 0:
        heartbeat.Heartbeat(run_dir, settings.value(heartbeat.SETTING)).start()
        print(f"hpcai500: rank {world.origin} takes over as the coordinator: {run_dir}/ goes on",
              file=sys.stderr, flush=True)
    cell[0] = output
    return replace(ctx, ceilings=output.record.roofline if output else {})


def _inventory(world, nodes, devices, names) -> tuple[dict, object]:
    """(telemetry.environment, nodes): collective, every rank. After a loss in the roofline,
    on the survivors (the sweep lays its tests anew on them too), with the node map by launch
    rank, as a test's launch_ranks number them."""
    if world.losses:
        nodes = topology.discover(world)
    environment = telemetry.environment(world, nodes, devices, names)
    if world.rank == 0 and world.losses:
        environment["node_of_rank"] = elastic.by_launch(environment["node_of_rank"], world.launch_ranks,
                                                        world.launched)
    return environment, nodes


def _submission(world, environment: dict) -> dict:
    """MLLOG's submission keys: the settings, or for the platform, the nodes and the
    accelerator (or CPU) model of rank 0's node, the same string on every rank."""
    platform = settings.value("HPCAI500_SUBMITTER_PLATFORM")
    if platform is None and world.rank == 0:
        node = (environment.get("node_inventory") or [{}])[0]
        gpus = node.get("gpus") or []
        platform = (f"{environment['nodes']} x {gpus[0]['name']}" if gpus and gpus[0].get("name") else
                    f"{environment['nodes']} x {node.get('cpu_model') or environment['machine']}")
    return {"org": settings.value("HPCAI500_SUBMITTER_ORG"), "platform": world.bcast(platform, root=0),
            "status": settings.value("HPCAI500_SUBMISSION_STATUS")}


def _agreed_tolerance(world) -> dict:
    """COLLECTIVE: rank 0's _fault_tolerance on every rank, and the world's policy and
    ULFM flag set from it (how the watchdog ends the job: _give_up)."""
    world.policy = settings.value(elastic.SETTING)
    tolerance = world.bcast(_fault_tolerance(world.policy) if world.rank == 0 else None, root=0)
    world.ulfm = tolerance["ulfm"]
    return tolerance


def _fault_tolerance(policy: str) -> dict:
    """results.json's fault_tolerance: the policy, whether this launch keeps a job whose
    rank died (the MPI's MCA parameter files: its prefix's etc/, OPAL_PREFIX or the venv's),
    and ULFM's heartbeat detector as that MPI reads it here (its ompi_info; None: not known)."""
    etc = elastic.mpi_etc(os.environ)
    survives, how = elastic.launch_survives(os.environ, etc)
    prefix = os.path.dirname(etc)
    try:
        # the rank's environment less its PMIx identity: the tool must not pass for this rank
        asked = subprocess.run([os.path.join(prefix, "bin", "ompi_info"), "--param", "mpi", "ft", "--level", "9",
                                "--parsable"], capture_output=True, text=True, timeout=60,
                               env={**{k: v for k, v in os.environ.items() if not k.startswith("PMIX_")},
                                    "OPAL_PREFIX": prefix})
        found = elastic.detector(asked.stdout)
    except (OSError, subprocess.SubprocessError):
        found = None   # not Open MPI (make venv MPI=site), or no ompi_info there
    return {"policy": policy, "ulfm": survives, "how": how, "detector": found and asdict(found)}


def _output(cfg, plan, run_dir, environment, devices, nodes, ceilings, tolerance, tuning=None):
    """Rank 0's writer of the report and results.json, with the run's conventions; `tuning`:
    a tuning run's results.json `tuning` at its start (tune.start)."""
    notes = [f"{w}: {note}" for w in cfg.workloads if (note := workloads.get(w).describe_model(plan.datas[w])[0])]
    notes += [f"{w}: {line}" for w in cfg.workloads for line in workloads.get(w).describe_data(plan.datas[w])]
    notes += [f"{w}: {division.facts_line(plan.facts[w])}" for w in cfg.workloads]   # as each test's data_facts
    placement = telemetry.node_lines(environment["node_inventory"]) + topology.sharing(nodes)
    record = results.Record(
        hpcai500=VERSION, run_dir=run_dir, input={"path": cfg.path, "sha256": results.sha256(cfg.text), "text": cfg.text},
        config=dat.record(cfg), settings=plan.settings, environment=environment, roofline=ceilings,
        conventions=report.conventions(cfg, devices, notes, placement, ceilings,
                                       [line for name in cfg.frameworks
                                        for line in frameworks.facts(name).conventions(
                                            cfg, environment, results.minor(results.SCHEMA))]),
        skipped=[{"index": s.test.index, "reason": s.reason, "cause": s.cause} for s in plan.skipped],
        fault_tolerance=tolerance, tv_legend=dat.TV_LEGEND, tuning=tuning,
        relaunches=({"launches": launches, "started": time.time()}
                    if plan.previous and (launches := results.launches(run_dir)) else None))
    params = (dat.describe(cfg) + settings.describe(plan.settings) + settings.describe_library(environment)
              + elastic.lines(tolerance) + relaunch.lines(record.relaunches)
              + (tune.param_lines(tuning) if tuning else []))
    return report.Output(cfg, record, params, plan.previous)


def _precision_problems(world, cfg) -> dict:
    """COLLECTIVE: {(framework, precision): (world rank, why)}, the lowest rank whose device
    cannot train a precision of line 17 in a framework of line 35 (Framework.precision_problem),
    the same on every rank (plan.device_skipped)."""
    mine = {(n, p): why for n in cfg.frameworks for p in cfg.precisions
            if (why := frameworks.get(n).precision_problem(p))}
    found = {}
    for rank, theirs in enumerate(world.allgather(mine)):
        for key, why in theirs.items():
            found.setdefault(key, (rank, why))
    return found


def _roofline(world, names, precisions, watchdog, refused=()) -> dict | None:
    """GEMM, convolution and triad on every rank at once (they share the node's memory
    and power, as training does), in each framework of the sweep (`names`: a test's
    utilisation is measured against the library that trained it) and each precision;
    per-rank figures on rank 0, keyed by frameworks.roofline_key, indexed by launch rank
    (None for a rank lost before its figures were gathered: under `drop` the barriers and the
    gather are world steps, harness/elastic.py, and no later test runs on a lost rank). The
    barriers wait asleep (Watchdog.wait): a rank done first must not keep a core busy while
    others still measure on it."""
    out = {}
    for name in names:
        for prec in precisions:
            if (name, prec) in refused:   # a precision a rank's device cannot run (_precision_problems)
                continue
            key = frameworks.roofline_key(name, prec)
            world.step(f"the roofline ({key}): its start",   # the world as it stands
                       lambda: watchdog.wait(world.Ibarrier(), "roofline micro-kernels: waiting for the other ranks"))
            watchdog.beat("roofline micro-kernels")
            fault.point(world.origin, "roofline")
            with native_stderr_captured():  # the triad's first XLA compilation prints banners
                mine = frameworks.get(name).roofline(prec, settings.value("HPCAI500_ROOFLINE_QUICK") == "1")
            world.step(f"the roofline ({key}): its end",
                       lambda: watchdog.wait(world.Ibarrier(), "roofline micro-kernels: waiting for the other ranks"))
            per_rank = world.step(f"the roofline ({key}): the gather of its figures",
                                  lambda: world.gather(mine, root=0))
            if world.rank == 0:
                out[key] = _ceilings(name, prec, elastic.by_launch(per_rank, world.launch_ranks, world.launched))
    return out if world.rank == 0 else None


def _ceilings(framework: str, prec: str, per_rank: list[dict | None]) -> dict:
    med = lambda xs: float(np.median(xs))  # noqa: E731 - a median over ranks, the chart's ceiling
    ran = [r for r in per_rank if r is not None]
    return {"precision": prec, "framework": framework, "per_rank": per_rank,
            "gemm_flops": med([r["gemm"]["flops"] for r in ran]),
            "conv_flops": med([r["conv"]["flops"] for r in ran]),
            "bandwidth": med([r["stream"]["bandwidth"] for r in ran]),
            "peak": per_rank[0]["peak"]}


def _make_run_dir(world, results_dir: str) -> str:
    """runs/<date>-<time>-<random>: created by rank 0 only; exclusive creation, so two
    jobs started in the same second never share a folder."""
    path, err = None, None
    if world.rank == 0:
        try:
            os.makedirs(results_dir, exist_ok=True)
            while path is None:
                candidate = os.path.join(results_dir, time.strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3))
                try:
                    os.mkdir(candidate)
                    path = candidate
                except FileExistsError:
                    continue
        except OSError as e:
            err = f"results directory {results_dir!r}: {e}"
    path, err = world.bcast((path, err), root=0)
    if err:
        raise RunError(err)
    return path
