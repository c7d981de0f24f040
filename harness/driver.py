"""Driver (HPL_pddriver / HPL_pdtest): the data flows one way,
dat -> topology -> sampler -> staging -> train -> ensemble -> metrics -> report.

Every failure that can be known before training (input, layout, data) is agreed on by
all ranks and ends the run with exit status 1 and one message from rank 0. A failure
during a test calls MPI_Abort, so no rank is left blocked in a collective.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import platform
import secrets
import sys
import time

import numpy as np

from harness.errors import RunError, agree, say

VERSION = "0.1"


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


def parse_args(argv):
    p = _Parser(prog="hpcai500.py", description="HPC AI500 V3.0 bagging benchmark")
    p.add_argument("dat", nargs="?", default="HPCAI500.dat", help="input file (default HPCAI500.dat)")
    p.add_argument("--check", action="store_true",
                   help="validate the input and print the tests and the job-to-rank-to-node map, without training")
    p.add_argument("--watchdog", type=_seconds, metavar="SECONDS",
                   default=os.environ.get("HPCAI500_WATCHDOG", "1800"),
                   help="abort the job when a rank makes no progress (no training step, no phase change)"
                        " for this long; 0 = off (default: $HPCAI500_WATCHDOG or 1800)")
    p.add_argument("--resume", metavar="RUN",
                   help="continue the interrupted invocation whose folder is RUN (runs/<id>): its finished"
                        " tests are kept and skipped; the input file must be the one it ran")
    p.add_argument("--summarize", nargs="+", metavar="RUN",
                   help="reprint the result tables of earlier runs (runs/<id> folders) side by side")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.summarize:  # reads results.json files only: no MPI, no TensorFlow
        from harness import report
        try:
            print(report.summarize(args.summarize), end="")
        except (OSError, ValueError, KeyError) as e:
            say(f"error: {e}")
            return 1
        return 0
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    from harness.watchdog import Watchdog
    watchdog = Watchdog(args.watchdog, world.rank, lambda: world.Abort(1)).start()
    try:
        return _run(args, world, watchdog)
    except RunError as e:
        if world.rank == 0:
            say(f"error: {e}")
        world.Barrier()  # a rank exiting early makes mpirun kill rank 0 before it has spoken
        return 1
    except BaseException as e:  # noqa: BLE001 - any other failure must not leave ranks hanging
        say(f"rank {world.rank} failed during {watchdog.phase}: {type(e).__name__}: {e}")
        sys.stderr.flush()
        world.Abort(1)
        return 1


def _run(args, world, watchdog) -> int:
    from harness import dat, signals, topology

    run = None  # set once the results exist; the signal handler then records the interruption

    def stop(signum):
        if world.rank != 0:
            time.sleep(1.0)  # let rank 0 write before mpirun, seeing us gone, kills it
        elif run is None:
            say(f"{_signame(signum)} received during {watchdog.phase}; no test had finished, nothing written")
        else:
            run.finish(interrupted=f"{_signame(signum)} received")
    signals.on_signal(stop)

    watchdog.beat("input")
    cfg, tests, err, previous = None, None, None, None
    if world.rank == 0:
        try:
            cfg = dat.parse(args.dat)
            tests = dat.expand(cfg)
            if args.resume:
                previous = _previous(args.resume, cfg, len(tests))
        except (dat.DatError, RunError) as e:
            err = str(e)
    done = {(t["index"], t.get("repetition", 0)) for t in previous["tests"]} if previous else set()
    cfg, tests, err, done = world.bcast((cfg, tests, err, done), root=0)
    if err:
        raise RunError(err)
    runs = [(t, rep) for t in tests for rep in range(cfg.repetitions) if (t.index, rep) not in done]
    tests_to_run = list({t.index: t for t, _ in runs}.values())

    nodes = topology.discover(world)
    layouts = {}
    for t in tests:
        try:
            M, warnings = topology.resolve(world.size, t.M, t.P)
            layouts[(t.M, t.P)] = (topology.map_jobs(nodes.node_of_rank, M, t.P, cfg.pmap), warnings)
        except topology.TopologyError as e:
            raise RunError(f"{cfg.path}:10-11: layout M={t.M}, P={t.P} on {world.size} ranks: {e}")

    if args.check:
        if world.rank == 0:
            _print_check(cfg, tests, layouts, nodes, world.size)
        return 0

    from harness import workloads
    watchdog.beat("data loading")
    datas = {}
    for name in cfg.workloads:
        wl = workloads.get(name)
        node_comm = topology.node_comm(world)
        datas[name] = agree(world, lambda: wl.load(cfg.dataset, os.path.join(cfg.results_dir, ".data"),
                                                   node_comm.rank, node_comm.Barrier), f"workload {name}")
        node_comm.Free()
    for name in cfg.workloads:
        if cfg.aggregation not in workloads.get(name).AGGREGATIONS:
            raise RunError(f"{cfg.path}:24: aggregation {cfg.aggregation!r} is not defined for workload {name} "
                           f"(it supports: {', '.join(workloads.get(name).AGGREGATIONS)})")
    if cfg.staging != "none":
        from harness import staging
        watchdog.beat("staging directory check")
        agree(world, lambda: staging.probe(cfg.staging), f"{cfg.path}:28")
    for t in tests_to_run:
        small = datas[t.workload].n_train < t.P * t.batch
        if small:
            raise RunError(f"{cfg.path}:14: B={t.batch} with P={t.P} needs at least {t.P * t.batch} "
                           f"training samples, {t.workload} has {datas[t.workload].n_train}")

    from harness import train as training
    watchdog.beat("device set-up")
    devices = training.setup_devices(nodes.local_rank, nodes.local_size)
    ceilings = None
    if cfg.roofline:
        watchdog.beat("roofline micro-kernels")
        ceilings = _roofline(world, cfg.precisions)
    run_dir = args.resume if args.resume else _make_run_dir(world, cfg.results_dir)
    from harness.run import Run
    run = Run(cfg, tests, nodes, devices, run_dir, world, VERSION, previous, ceilings)
    try:
        for t, rep in runs:
            watchdog.beat(f"test {t.index} (M={t.M}, P={t.P}, B={t.batch})")
            layout, warnings = layouts[(t.M, t.P)]
            run.test(t, layout, warnings, datas[t.workload], watchdog, rep)
    except RunError as e:  # agreed by all ranks mid-sweep (staging): the finished tests stand
        run.finish(interrupted=f"error: {e}")
        raise
    run.finish()
    return 0


def _roofline(world, precisions) -> dict | None:
    """GEMM, convolution and triad on every rank at once (they share the node's memory
    and power, as training does), once per precision; per-rank figures on rank 0."""
    import kernels
    from harness import fault
    out = {}
    for prec in precisions:
        world.Barrier()
        fault.point(world.rank, "roofline")
        mine = kernels.roofline(prec, quick=os.environ.get("HPCAI500_ROOFLINE_QUICK") == "1")
        per_rank = world.gather(mine, root=0)
        if world.rank == 0:
            out[prec] = _ceilings(prec, per_rank)
    return out if world.rank == 0 else None


def _ceilings(prec: str, per_rank: list[dict]) -> dict:
    med = lambda xs: float(np.median(xs))  # noqa: E731 - a median over ranks, the chart's ceiling
    return {"precision": prec, "per_rank": per_rank,
            "gemm_flops": med([r["gemm"]["flops"] for r in per_rank]),
            "conv_flops": med([r["conv"]["flops"] for r in per_rank]),
            "bandwidth": med([r["stream"]["bandwidth"] for r in per_rank]),
            "peak": per_rank[0]["peak"]}


def _previous(run_dir: str, cfg, n_tests: int) -> dict:
    """The results of the invocation to resume, checked against the input file."""
    import json
    path = os.path.join(run_dir, "results.json")
    try:
        with open(path) as f:
            previous = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise RunError(f"--resume {run_dir}: cannot read {path} ({e})") from None
    if previous.get("input", {}).get("sha256") != sha256(cfg.text):
        raise RunError(f"--resume {run_dir}: {cfg.path} is not the input file that run used "
                       f"(SHA-256 differs); resume with the same file, or start a new run")
    if len(previous.get("tests", [])) >= n_tests * cfg.repetitions:
        raise RunError(f"--resume {run_dir}: nothing to resume, all {n_tests} tests finished")
    return previous


def _signame(signum: int) -> str:
    import signal
    return signal.Signals(signum).name


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


def _print_check(cfg, tests, layouts, nodes, world_size) -> None:
    from harness import dat, topology
    print(f"{cfg.path}: valid. {len(tests)} test(s) on {world_size} rank(s), {len(nodes.hosts)} node(s):")
    for line in dat.describe(cfg):
        print(f"  {line}")
    for t in tests:
        layout, warnings = layouts[(t.M, t.P)]
        print(f"test {t.index}: {t.tv(cfg)} {t.workload} M={layout.M} P={layout.P} B={t.batch} {t.precision}")
        for line in topology.describe(layout, nodes):
            print(f"  {line}")
        for w in warnings:
            print(f"  warning: {w}")
    sys.stdout.flush()


def environment(world, nodes, devices) -> dict:
    """Versions and inventory recorded in results.json."""
    import horovod
    import mpi4py
    import tensorflow as tf
    from mpi4py import MPI
    return {
        "python": platform.python_version(), "numpy": np.__version__, "tensorflow": tf.__version__,
        "horovod": horovod.__version__, "mpi4py": mpi4py.__version__,
        "mpi_library": MPI.Get_library_version().strip("\x00 \n").splitlines()[0],
        "world_size": world.size, "nodes": len(nodes.hosts), "hosts": list(nodes.hosts),
        "machine": platform.machine(), "cpu_count": os.cpu_count(), "rank0_devices": devices,
        "node_inventory": [n for n in world.gather(_node_inventory(nodes)) or [] if n],
    }


def _node_inventory(nodes) -> dict | None:
    """Host and GPU inventory, from the first rank of each node only."""
    if nodes.local_rank != 0:
        return None
    from harness import telemetry
    return {**telemetry.host_inventory(), "ranks": nodes.local_size, "gpus": telemetry.gpu_inventory()}


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
