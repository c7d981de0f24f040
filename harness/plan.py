"""User Configuration, second half (HPL_pdinfo's job): read, validate, broadcast, plan.

One step that `--check` and a run share, so that `--check` refuses every input a run
would refuse before training, with the same message: the input file, the resumed run,
the layouts against the world, each workload's aggregation, the staging directory,
the results directory, the data (loaded here; a run trains from what this step
loaded) and each test's batch against its data. World rank 0 reads the file and the
others receive the Config, so no rank runs with its own reading of it.

Tests whose layout needs more ranks than the run has are skipped, as HPL skips a
process grid larger than its world: the shipped file's sweep then fits any machine,
and the report counts them; so are the tests of a split mode (line 37) with P = 1, so
that one sweep can cross Ps and modes. A run in which no test fits is an error.

MPI at the edges only (`make`); the checks themselves are plain functions.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from harness import (communication, dat, division, files, frameworks, heartbeat, parallelism, results, settings, staging,
                     topology, workloads)
from harness.errors import RunError, agree, first_failure


@dataclass(frozen=True)
class Planned:
    """A test of the sweep that fits the world, with its job-to-rank map and division."""
    test: dat.Test
    layout: topology.Layout
    warnings: tuple[str, ...]
    division: str = "open"                  # closed | open (harness/division.py)
    open_reasons: tuple[str, ...] = ()
    model_deviations: tuple[str, ...] = ()  # the model built vs the workload's reference (describe_model)


@dataclass(frozen=True)
class Skipped:
    test: dat.Test
    reason: str
    cause: str = "ranks"    # "ranks": the layout is larger than the run; "mode": a split mode (line 37) on P = 1


@dataclass(frozen=True)
class Plan:
    cfg: dat.Config
    settings: dict                           # HPCAI500_* settings in force (rank 0's, on all)
    tests: tuple[Planned, ...]               # the tests that fit, in sweep order
    skipped: tuple[Skipped, ...]             # the tests that need more ranks
    runs: tuple[tuple[Planned, int], ...]    # (test, repetition) still to run
    nodes: topology.Nodes
    datas: dict                              # workload name -> its data, as the tests read it
    previous: dict | None                    # rank 0: results.json of the run resumed

    @property
    def n_tests(self) -> int:
        return len(self.tests) + len(self.skipped)


@dataclass(frozen=True)
class Input:
    """The input file as world rank 0 read it, on every rank."""
    cfg: dat.Config
    tests: tuple[dat.Test, ...]
    settings: dict             # HPCAI500_* environment settings as rank 0 read them
    done: frozenset            # (test, repetition) finished in the run resumed
    previous: dict | None      # rank 0: results.json of the run resumed


def read(world, path: str, resume: str | None) -> Input:
    """Rank 0 parses the file, reads the environment settings (and the run to resume);
    every rank gets the result or the same error, and installs rank 0's settings. No
    TensorFlow, no data: a bad file or setting is refused at once."""
    cfg, tests, values, err, previous = None, None, None, None, None
    if world.rank == 0:
        try:
            values = settings.read()
            cfg = dat.parse(path)
            tests = dat.expand(cfg)
            if resume:
                previous = resumed(resume, cfg, len(tests), values)
        except (dat.DatError, settings.SettingError, RunError) as e:
            err = str(e)
    done = {(t.index, t.repetition) for t in previous.tests} if previous else set()
    cfg, tests, values, err, done = world.bcast((cfg, tests, values, err, done), root=0)
    if err:
        raise RunError(err)
    settings.install(values)
    return Input(cfg, tuple(tests), values, frozenset(done), previous)


def make(world, given: Input, nodes: topology.Nodes, watchdog) -> Plan:
    """Every other check a run makes before training, agreed by all ranks (RunError)."""
    cfg = given.cfg
    planned, skipped = layouts(cfg, given.tests, world.size, nodes.node_of_rank)
    check_aggregations(cfg)
    check_allreduce(cfg, planned)
    problem = mode_problem(cfg, [p.test for p in planned])
    if problem:
        raise RunError(problem)
    first_failure(world, framework_problem(cfg))   # each rank of its own node: installs differ between nodes
    if cfg.staging != "none":
        watchdog.beat("staging directory check")
        agree(world, lambda: staging.probe(cfg.staging), f"{cfg.path}:28")
    first_failure(world, results_dir_problem(cfg) if world.rank == 0 else None)
    watchdog.beat("data loading")
    datas = load(world, cfg)
    check_batches(cfg, planned, datas)
    planned = tuple(judged(cfg, p, datas[p.test.workload], given.settings) for p in planned)
    runs = tuple((p, rep) for p in planned for rep in range(cfg.repetitions) if (p.test.index, rep) not in given.done)
    return Plan(cfg, given.settings, planned, skipped, runs, nodes, datas, given.previous)


def layouts(cfg: dat.Config, tests: list[dat.Test], world_size: int, node_of_rank) -> tuple[tuple, tuple]:
    """(planned, skipped): each test's layout on this world, or why it does not fit."""
    planned, skipped = [], []
    for t in tests:
        if t.mode != "data" and t.P == 1:   # as a layout too large: a sweep of Ps and modes runs what applies
            skipped.append(Skipped(t, f"P = 1 holds the whole model on one rank: line 37's {t.mode} needs P >= 2",
                                   "mode"))
            continue
        try:
            M, warnings = topology.resolve(world_size, t.M, t.P)
        except topology.TopologyError as e:
            skipped.append(Skipped(t, str(e)))
            continue
        planned.append(Planned(t, topology.map_jobs(node_of_rank, M, t.P, cfg.pmap), tuple(warnings)))
    if not planned:
        raise RunError(f"{cfg.path}:10-11: found no layout that fits {world_size} rank(s) "
                       f"({'; '.join(s.reason for s in skipped)}), expected M x P <= {world_size}")
    return tuple(planned), tuple(skipped)


def check_aggregations(cfg: dat.Config) -> None:
    for name in cfg.workloads:
        supported = workloads.get(name).AGGREGATIONS
        if cfg.aggregation not in supported:
            raise RunError(f"{cfg.path}:24: found {cfg.aggregation!r}, expected an aggregation that workload"
                           f" {name} defines ({', '.join(supported)})")


def framework_problem(cfg: dat.Config) -> str | None:
    """Why a framework of line 35 cannot train this input on this rank's node, or None:
    its packages not installed here (frameworks.missing: found without importing them, so
    that a refused input costs no framework's start-up), a workload whose model it lacks,
    a Table 2 choice it cannot carry (frameworks.UNSUPPORTED), line 33's compiler without
    the C++ compiler it builds with (frameworks.compiler_missing)."""
    for name in cfg.frameworks:
        gone = frameworks.missing(name)
        if gone:
            return (f"{cfg.path}:35: found {name}, expected a framework installed on this node:"
                    f" {', '.join(gone)} cannot be imported here (README.md, Frameworks)")
        for w in cfg.workloads:
            if not frameworks.builds(name, w):
                return (f"{cfg.path}:7: found workload {w} with framework {name} (line 35), expected a workload"
                        f" whose model is built in {name} ({frameworks.built_workloads(name)})")
        for (field, value), why in frameworks.UNSUPPORTED.get(name, {}).items():
            if getattr(cfg, field) == value:
                return (f"{cfg.path}:{dat.LINE_OF[field]}: found {value} with framework {name} (line 35),"
                        f" expected another choice: {why}")
        needs = frameworks.compiler_missing(name, cfg.compiler)
        if needs:
            return (f"{cfg.path}:33: found {cfg.compiler} with framework {name}, expected a node that can compile:"
                    f" {needs} is not on PATH here")
    return None


def mode_problem(cfg: dat.Config, tests) -> str | None:
    """Why line 37's parallel modes cannot run these tests, or None: a mode other than data
    needs a framework with pipeline machinery and a model that is a chain of blocks in it
    (frameworks.split_problem), no compiler on line 33 (not built with stages), and a
    layout it can take (parallelism.resolve: P >= 2, mixed's STAGES dividing P, the
    micro-batches cutting B x S evenly)."""
    for t in tests:
        if t.mode == "data":
            continue
        where = f"{cfg.path}:37: found {t.mode} (test {t.index}: {t.workload}, {t.framework}, P = {t.P}, B = {t.batch})"
        why = frameworks.split_problem(t.framework, t.workload)
        if why:
            return f"{where}, expected data: {why}"
        if t.precision == "fp16":
            return (f"{where} with fp16 (line 17), expected data, or fp32 or bf16 on line 17: fp16's dynamic loss"
                    " scaling is not yet carried through a pipeline's schedule")
        if cfg.compiler != "none":
            return (f"{where} with compiler {cfg.compiler} (line 33), expected data, or none on line 33: the"
                    " compiler is not yet applied to a model cut into stages")
        try:
            parallelism.resolve(parallelism.parse(t.mode), t.P, t.batch)
        except ValueError as e:
            return f"{where}, expected a mode this layout takes (lines 11 and 14): {e}"
    return None


def results_dir_problem(cfg: dat.Config) -> str | None:
    """Why the results directory (line 5) cannot take a run's folder, or None. Nothing is
    made and nothing is left: a probe file in the directory, or in its nearest existing
    ancestor when it does not exist yet (a run makes it)."""
    place = os.path.abspath(cfg.results_dir)
    while not os.path.lexists(place) and os.path.dirname(place) != place:
        place = os.path.dirname(place)
    probe = os.path.join(place, f".hpcai500-probe-{os.getpid()}")
    try:
        if not os.path.isdir(place):
            raise NotADirectoryError(f"{place} is not a directory")
        files.atomic_write(probe, "")
        os.unlink(probe)
    except OSError as e:
        return (f"{cfg.path}:5: found results directory {cfg.results_dir!r} ({e.strerror or e}), "
                "expected a directory that can be made and written")
    return None


def load(world, cfg: dat.Config) -> dict:
    """Each workload's data on every rank; synthetic data is written once per node
    under <results>/.data (harness/files.node_once)."""
    datas = {}
    for name in cfg.workloads:
        wl = workloads.get(name)
        node = topology.node_comm(world)
        try:
            datas[name] = agree(world, lambda: wl.load(cfg.dataset, os.path.join(cfg.results_dir, ".data"),
                                                       node.rank, node.Barrier), f"{cfg.path}:8: workload {name}")
        finally:
            node.Free()
    return datas


def judged(cfg: dat.Config, p: Planned, data, values: dict) -> Planned:
    """The test with its division: closed (a ranking result) or open, with the reasons."""
    from dataclasses import replace

    wl = workloads.get(p.test.workload)
    deviations = tuple(wl.describe_model(data)[1])
    verdict, reasons = division.judge(
        workload=p.test.workload, dataset_kind=cfg.dataset.kind,
        deviations=list(deviations), test_only=settings.test_only(values),
        target=cfg.target_quality, default_target=wl.TARGET_QUALITY, n=cfg.penalty_n, default_n=wl.PENALTY_N,
        repetitions=cfg.repetitions)
    return replace(p, division=verdict, open_reasons=tuple(reasons), model_deviations=deviations)


def check_allreduce(cfg: dat.Config, planned) -> None:
    """Line 22 against lines 11 and 21, before any data is read. Adasum and the torus are
    reductions of their own, which int8 communication (an all-gather, then the average)
    replaces: one or the other. Horovod's Adasum reduces ranks in pairs: a job's P must be
    a power of 2 (it raises NotImplementedError at the first step otherwise)."""
    if cfg.allreduce in ("adasum", "torus") and cfg.comm_precision == "int8":
        raise RunError(f"{cfg.path}:21-22: found int8 communication with {cfg.allreduce}, expected one of them:"
                       f" int8's exchange all-gathers and averages, {cfg.allreduce} is a reduction of its own")
    if cfg.allreduce != "adasum":
        return
    for p in planned:
        P = p.test.P
        if P & (P - 1):
            raise RunError(f"{cfg.path}:22: found adasum with P={P} (line 11), expected P a power of 2: Horovod's"
                           " Adasum reduces a job's ranks in pairs")


def shared_gpu_problem(cfg: dat.Config, planned, node_of_rank, gpus_of_rank, hosts) -> str | None:
    """Why a PyTorch job cannot start on these GPUs, or None: NCCL refuses a communicator
    with two of its ranks on one GPU, and each rank takes GPU local_rank % GPUs of its node
    (each framework's setup_devices). Base models of one rank share a GPU freely (each
    job is its own group). PyTorch's jobs only: TensorFlow's exchange is Horovod's, with checks of its own.
    `gpus_of_rank`: the GPUs each world rank's framework sees (0: a CPU node, no NCCL).
    Pure: every rank passes the same lists and gets the same answer."""
    local, seen_on = [], {}          # each world rank's index among its node's ranks: one pass (thousands of ranks)
    for node in node_of_rank:
        local.append(seen_on.get(node, 0))
        seen_on[node] = local[-1] + 1
    for p in planned:
        if p.test.framework != "pytorch" or p.layout.P < 2:
            continue
        for j, ranks in enumerate(p.layout.jobs):
            seen = {}
            for r in ranks:
                if not gpus_of_rank[r]:
                    continue
                key = (node_of_rank[r], local[r] % gpus_of_rank[r])
                if key in seen:
                    node = hosts[key[0]]
                    return (f"{cfg.path}:11: found P = {p.layout.P} (test {p.test.index}, job {j}) with world ranks"
                            f" {seen[key]} and {r} both on GPU {key[1]} of {node} ({gpus_of_rank[r]} GPU(s) there for"
                            f" its {node_of_rank.count(key[0])} ranks), expected each rank of a PyTorch job on a GPU"
                            f" of its own: NCCL refuses two ranks of one communicator on one GPU; start at most"
                            f" {gpus_of_rank[r]} rank(s) a node on {node}, or P = 1 there")
                seen[key] = r
    return None


def check_batches(cfg: dat.Config, planned, datas: dict) -> None:
    for p in planned:
        t, n = p.test, datas[p.test.workload].n_train
        if n < t.P * t.batch:
            raise RunError(f"{cfg.path}:14: found B={t.batch}, expected at most {n // t.P} with P={t.P}: "
                           f"{t.workload} has {n} training samples and a job's step takes P x B")


def resumed(run_dir: str, cfg: dat.Config, n_tests: int, values: dict) -> results.Record:
    """The results of the invocation to resume, checked against the input file and the
    settings in force now (`values`, as settings.read gives them)."""
    path = os.path.join(run_dir, "results.json")
    try:
        previous = results.load(path)
    except (OSError, ValueError) as e:
        raise RunError(f"--resume {run_dir}: cannot read {path} ({e})") from None
    if previous.input.get("sha256") != results.sha256(cfg.text):
        raise RunError(f"--resume {run_dir}: {cfg.path} is not the input file that run used "
                       f"(SHA-256 differs); resume with the same file, or start a new run")
    if previous.settings != values:
        raise RunError(f"--resume {run_dir}: the HPCAI500_* settings differ from that run's "
                       f"({previous.settings} there, {values} now); resume with the same "
                       "settings, or start a new run")
    if len(previous.tests) >= n_tests * cfg.repetitions:
        raise RunError(f"--resume {run_dir}: nothing to resume, all {n_tests} tests finished")
    state = heartbeat.status(run_dir, previous)
    if state.alive:   # two invocations writing one folder would lose results
        raise RunError(f"--resume {run_dir}: found a live run ({state.detail}), expected one that has stopped;"
                       " wait for it to end, or stop it (kill -USR1 <its mpirun's pid>)")
    return previous


def _stages(t: dat.Test, data) -> list[str]:
    """--check's lines on a split mode's test: the mode, each stage's blocks, share of the
    FLOPs, weights and sends, the bytes between stages (the framework profiles its model)."""
    r = parallelism.resolve(parallelism.parse(t.mode), t.P, t.batch)
    chain = frameworks.get(t.framework).blocks(workloads.get(t.workload), data)
    return [f"parallel mode {t.mode}: {parallelism.describe(r)}",
            *parallelism.describe_stages(parallelism.stages(chain, r.stages), r, sum(b.trainable for b in chain))]


def describe(plan: Plan, world_size: int) -> list[str]:
    """What --check prints: the parameters, each test's map, the skipped tests."""
    cfg = plan.cfg
    lines = [f"{cfg.path}: valid. {len(plan.tests)} test(s) on {world_size} rank(s), "
             f"{len(plan.nodes.hosts)} node(s):"]
    lines += [f"  {line}" for line in dat.describe(cfg) + settings.describe(plan.settings)]
    for name, data in plan.datas.items():
        lines.append(f"data {name}: {data.source}, {data.n_train} training / {data.n_val} validation samples")
        lines += [f"  {line}" for line in workloads.get(name).describe_data(data)]
    for p in plan.tests:
        t, layout = p.test, p.layout
        lines.append(f"test {t.index}: {t.tv(cfg)} {t.workload} M={layout.M} P={layout.P} B={t.batch} {t.precision}")
        lines.append(f"  division: {p.division}" + (f" ({'; '.join(p.open_reasons)})" if p.open_reasons else ""))
        lines += [f"  {line}" for line in topology.describe(layout, plan.nodes)]
        if t.mode != "data":
            lines += [f"  {line}" for line in _stages(t, plan.datas[t.workload])]
        if cfg.allreduce == "torus":    # the grid each job will use (communication.grid), distinct ones once
            grids = {communication.job_grid(ranks, plan.nodes.node_of_rank).describe(): None for ranks in layout.jobs}
            lines.append(f"  torus grid: {'; '.join(grids)}")
        lines += [f"  warning: {w}" for w in p.warnings]
    lines += [f"test {s.test.index}: skipped, {s.reason}" for s in plan.skipped]
    return lines

