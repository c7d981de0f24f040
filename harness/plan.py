"""User Configuration, second half (HPL_pdinfo's job): read, validate, broadcast, plan.

One step that `--check` and a run share, so that `--check` refuses every input a run
would refuse before training, with the same message: the input file, the resumed run,
the layouts against the world, each workload's aggregation, the staging directory,
the results directory, the data (loaded here; a run trains from what this step
loaded) and each test's batch against its data. World rank 0 reads the file and the
others receive the Config, so no rank runs with its own reading of it.

One rule for the tests the sweep's cross product makes: a test that cannot run for a
reason of its own values (its layout larger than the run, as HPL skips a process grid
larger than its world; a split mode (line 37) with P = 1, with a framework or workload
that cannot cut a model, with fp16 or line 33's compiler, or with a P or B the mode
cannot take; a framework that lacks the workload or a choice of lines 22 or 33; Adasum
with a P not a power of 2; line 24's aggregation with a workload that lacks it; P x B
beyond the training set) is skipped, with its reason, by --check and the report. A user
who sweeps `tensorflow pytorch` x `data pipeline` or Ps `1 2` x `data pipeline` cannot
leave out the combinations that do not run, so they must not stop the ones that do. An
input is refused only when no test can run (each reason once, with its tests), or for
what no combination escapes: two single-valued lines that exclude each other (int8 with
Adasum or the torus), a framework not installed on a node, the staging or results
directory, the data.

MPI at the edges only (`make`); the checks themselves are plain functions.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field, replace

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
    data_facts: dict | None = None          # the data read, as the division judges it (the workload's data_facts)


@dataclass(frozen=True)
class Skipped:
    """A test of the sweep that cannot run, and why."""
    test: dat.Test
    reason: str     # `FILE:LINE: found 'X' with ..., expected Y: why`, as a refusal of that test alone would say
    cause: str      # a key of results.SKIP_CAUSES: what the report's footer counts it under


@dataclass(frozen=True)
class Plan:
    cfg: dat.Config
    settings: dict                           # HPCAI500_* settings in force (rank 0's, on all)
    tests: tuple[Planned, ...]               # the tests that fit, in sweep order
    skipped: tuple[Skipped, ...]             # the tests that cannot run, in sweep order
    runs: tuple[tuple[Planned, int], ...]    # (test, repetition) still to run
    nodes: topology.Nodes
    datas: dict                              # workload name -> its data, as the tests read it
    previous: dict | None                    # rank 0: results.json of the run resumed
    facts: dict = field(default_factory=dict)   # workload name -> its data_facts (rank 0's, on all)

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


def read(world, path: str, resume: str | None, tune: float | None = None) -> Input:
    """Rank 0 parses the file, reads the environment settings (and the run to resume);
    every rank gets the result or the same error, and installs rank 0's settings. No
    TensorFlow, no data: a bad file or setting is refused at once."""
    cfg, tests, values, err, previous = None, None, None, None, None
    if world.rank == 0:
        try:
            values = settings.read()
            cfg = dat.parse(path, tune is not None)
            tests = dat.expand(cfg)
            if resume:
                previous = resumed(resume, cfg, len(tests), values, tune)
        except (dat.DatError, settings.SettingError, RunError) as e:
            err = str(e)
    done = {(t.index, t.repetition) for t in previous.tests} if previous and tune is None else set()
    cfg, tests, values, err, done = world.bcast((cfg, tests, values, err, done), root=0)
    if err:
        raise RunError(err)
    settings.install(values)
    return Input(cfg, tuple(tests), values, frozenset(done), previous)


def make(world, given: Input, nodes: topology.Nodes, watchdog) -> Plan:
    """Every other check a run makes before training, agreed by all ranks (RunError)."""
    cfg = given.cfg
    check_allreduce(cfg)
    planned, skipped = layouts(cfg, given.tests, world.size, nodes.node_of_rank)
    first_failure(world, framework_problem(cfg))   # each rank of its own node: installs differ between nodes
    if cfg.staging != "none":
        watchdog.beat("staging directory check")
        agree(world, lambda: staging.probe(cfg.staging),
              f"{cfg.path}:28: found {cfg.staging!r}, expected a node-local directory every rank can write")
    problem = world.bcast(results_dir_problem(cfg) if world.rank == 0 else None, root=0)   # rank 0 writes there
    if problem:
        raise RunError(problem)
    watchdog.beat("data loading")
    datas = load(world, cfg, watchdog.wait)
    planned, skipped = batches(cfg, planned, skipped, datas)
    # rank 0's facts on every rank: the division (MLLOG's, on each job's root) is one verdict
    facts = world.bcast({name: workloads.get(name).data_facts(data) for name, data in datas.items()}
                        if world.rank == 0 else None, root=0)
    planned = tuple(judged(cfg, p, datas[p.test.workload], given.settings, facts[p.test.workload]) for p in planned)
    runs = tuple((p, rep) for p in planned for rep in range(cfg.repetitions) if (p.test.index, rep) not in given.done)
    return Plan(cfg, given.settings, planned, skipped, runs, nodes, datas, given.previous, facts)


def layouts(cfg: dat.Config, tests: list[dat.Test], world_size: int, node_of_rank) -> tuple[tuple, tuple]:
    """(planned, skipped): each test's layout on this world, or why it cannot run (combination_problem,
    then a layout larger than the world); RunError when none can (runnable)."""
    planned, skipped = [], []
    for t in tests:
        found = combination_problem(cfg, t)
        if found:
            skipped.append(Skipped(t, found[1], found[0]))
            continue
        try:
            M, warnings = topology.resolve(world_size, t.M, t.P)
        except topology.TopologyError as e:
            skipped.append(Skipped(t, too_large(cfg, t, world_size, e), "ranks"))
            continue
        planned.append(Planned(t, topology.map_jobs(node_of_rank, M, t.P, cfg.pmap), tuple(warnings)))
    runnable(planned, skipped)
    return tuple(planned), tuple(skipped)


def too_large(cfg: dat.Config, t: dat.Test, world_size: int, e: topology.TopologyError) -> str:
    """A test's layout larger than the world of `world_size` ranks, as its skip says it."""
    return f"{cfg.path}:10-11: found '{t.M} x {t.P}', expected M x P <= {world_size}: {e}"


def batch_problem(cfg: dat.Config, t: dat.Test, n: int) -> str | None:
    """Why a job's step (P x B samples) of test t exceeds its training set of n samples, or None."""
    if n >= t.P * t.batch:
        return None
    return (f"{cfg.path}:14: found '{t.batch}' with P = {t.P} (line 11), expected at most {n // t.P}: {t.workload} has"
            f" {n} training samples and a job's step takes P x B")


def relaid(cfg: dat.Config, runs, world_size: int, node_of_rank, why: str) -> tuple[list, list]:
    """(runs, gone): the (Planned, repetition) runs left, laid out anew on a world shrunk to
    `world_size` ranks by a loss (harness/elastic.py; `why` says which), and the (Skipped,
    repetition) of those that no longer fit, cause "lost". Pure."""
    kept, gone = [], []
    for p, rep in runs:
        t = p.test
        try:
            M, warnings = topology.resolve(world_size, t.M, t.P)
        except topology.TopologyError as e:
            gone.append((Skipped(t, f"{cfg.path}:10-11: found '{t.M} x {t.P}', expected M x P <= {world_size},"
                                    f" the ranks left after {why}: {e}", "lost"), rep))
            continue
        kept.append((replace(p, layout=topology.map_jobs(node_of_rank, M, t.P, cfg.pmap),
                             warnings=tuple(warnings)), rep))
    return kept, gone


def runnable(planned, skipped) -> None:
    """Refuse a sweep none of whose tests can run, with each distinct reason once and the
    tests it stops (a sweep of thousands of tests stays a line a reason); every reason
    begins with its own FILE:LINE, which sets the reasons apart."""
    if planned:
        return
    stopped: dict[str, list[int]] = {}
    for s in skipped:
        stopped.setdefault(s.reason, []).append(s.test.index)
    raise RunError("; ".join(f"{reason} ({'test' if len(ix) == 1 else 'tests'} {topology.ranges(ix)})"
                             for reason, ix in stopped.items()))


def combination_problem(cfg: dat.Config, t: dat.Test) -> tuple[str, str] | None:
    """(cause, message): why test t cannot run on any world, or None. The first of its
    framework's, its parallel mode's, Adasum's and its aggregation's problems."""
    for check in (framework_choice_problem, mode_problem, adasum_problem, aggregation_problem):
        found = check(cfg, t)
        if found:
            return found
    return None


def _one_of(names) -> str:
    """The accepted choices of a line, as a message's `expected` says them."""
    names = list(names)
    return names[0] if len(names) == 1 else "one of " + ", ".join(names)


# The Table 2 choices a framework may refuse (its REFUSES) that each test of a sweep makes for itself
TEST_FIELDS = ("precision",)


def framework_choice_problem(cfg: dat.Config, t: dat.Test) -> tuple[str, str] | None:
    """("framework", message) when t's framework lacks its workload's model
    (frameworks.builds) or cannot carry a Table 2 choice of the input
    (its facts' REFUSES), or None."""
    fw = t.framework
    if not frameworks.builds(fw, t.workload):
        built = [w for w in dat.KNOWN["workload"] if frameworks.builds(fw, w)]
        return "framework", (f"{cfg.path}:7: found {t.workload!r} with framework {fw} (line 35), expected"
                             f" {_one_of(built)}: the workloads whose model is built in {fw}")
    refused = frameworks.facts(fw).REFUSES
    for (field, value), why in refused.items():
        # a sweep's choice (line 17's precision) is the test's, the others the input's
        if getattr(t if field in TEST_FIELDS else cfg, field) == value:
            accepted = [v for v in dat.KNOWN[field] if (field, v) not in refused]
            return "framework", (f"{cfg.path}:{dat.LINE_OF[field]}: found {value!r} with framework {fw} (line 35),"
                                 f" expected {_one_of(accepted)}: {why}")
    return None


def mode_problem(cfg: dat.Config, t: dat.Test) -> tuple[str, str] | None:
    """Why t's parallel mode (line 37) cannot run, or None: ("mode", ...) on P = 1, first, as
    schema 2.8 counted it; else ("split", ...): a mode other than data needs a framework with
    pipeline machinery and a model that is a chain of blocks in it (frameworks.split_problem),
    no fp16, no compiler on line 33 (not built with stages), and a P and B it can take
    (parallelism.resolve: mixed's STAGES dividing P, the micro-batches cutting B x S evenly),
    each message naming the lines whose values meet in it."""
    if t.mode == "data":
        return None
    found = f"{cfg.path}:37: found {t.mode!r} with"
    try:
        parallelism.resolve(parallelism.parse(t.mode), t.P, t.batch)
        unfit = None
    except parallelism.Unfit as e:
        unfit = e
    if unfit and t.P == 1:
        return "mode", f"{found} P = 1 (line 11), expected {unfit.expected}: {unfit.why}"
    why = frameworks.split_problem(t.framework, t.workload)
    if why:
        other = (f"framework {t.framework} (line 35)" if frameworks.facts(t.framework).NO_PIPELINE
                 else f"workload {t.workload} (line 7)")
        return "split", f"{found} {other}, expected data: {why}"
    if t.precision == "fp16":
        return "split", (f"{found} precision fp16 (line 17), expected data, or fp32 or bf16 on line 17: fp16's dynamic"
                         " loss scaling is not yet carried through a pipeline's schedule")
    if cfg.compiler != "none":
        return "split", (f"{found} compiler {cfg.compiler} (line 33), expected data, or none on line 33: the compiler"
                         " is not yet applied to a model cut into stages")
    if unfit:
        values = f"P = {t.P} (line 11)" + (f" and B = {t.batch} (line 14)" if unfit.batch else "")
        return "split", f"{found} {values}, expected {unfit.expected}: {unfit.why}"
    return None


def adasum_problem(cfg: dat.Config, t: dat.Test) -> tuple[str, str] | None:
    """("adasum", ...) when line 22 is Adasum and t's P is not a power of 2: Horovod's
    Adasum reduces a job's ranks in pairs (it raises NotImplementedError at the first step)."""
    if cfg.allreduce != "adasum" or not t.P & (t.P - 1):
        return None
    others = [a for a in dat.KNOWN["allreduce"] if a != "adasum"]
    return "adasum", (f"{cfg.path}:22: found 'adasum' with P = {t.P} (line 11), expected {_one_of(others)}, or P a"
                      " power of 2: Horovod's Adasum reduces a job's ranks in pairs")


def aggregation_problem(cfg: dat.Config, t: dat.Test) -> tuple[str, str] | None:
    """("aggregation", ...) when t's workload does not define line 24's aggregation."""
    supported = workloads.get(t.workload).AGGREGATIONS
    if cfg.aggregation in supported:
        return None
    return "aggregation", (f"{cfg.path}:24: found {cfg.aggregation!r} with workload {t.workload} (line 7), expected"
                           f" {_one_of(supported)}: the aggregations {t.workload} defines")


def framework_problem(cfg: dat.Config) -> str | None:
    """Why a framework of line 35 cannot train on this rank's node, or None: its packages
    not installed here (frameworks.missing: found without importing them, so that a refused
    input costs no framework's start-up), line 33's compiler without the C++ compiler it
    builds with (frameworks.compiler_missing). What a framework cannot carry on any node is
    each test's (framework_choice_problem)."""
    for name in cfg.frameworks:
        gone = frameworks.missing(name)
        if gone:
            hint = frameworks.own_venv_hint(name, cfg.path)   # a framework of a venv of its own: run with that one
            where = f"by this Python ({sys.executable}) on this rank's node; {hint}" if hint else "on this rank's node"
            return (f"{cfg.path}:35: found {name!r}, expected a framework installed on every node:"
                    f" {', '.join(gone)} cannot be imported {where} (docs/install.md, 'Frameworks')")
        needs = frameworks.compiler_missing(name, cfg.compiler)
        if needs:
            return (f"{cfg.path}:33: found {cfg.compiler!r} with framework {name} (line 35), expected none, or a"
                    f" node that can compile: {needs} is not on PATH on this rank's node")
    return None


def gpu_memory_problem(cfg: dat.Config, gpus_on_node: int) -> str | None:
    """Why line 35's frameworks cannot share this node's GPUs in one run, or None (pure). A
    framework whose allocator keeps the GPU memory it grew to the process's end (its facts'
    KEEPS_GPU_MEMORY: TensorFlow) leaves another that computes on the GPUs (USES_GPUS) too
    little; PyTorch gives its cache back after each job, MindSpore trains on CPUs here. One
    framework a run on GPUs, as the GPU venvs hold one (Makefile)."""
    keeps = [n for n in cfg.frameworks if frameworks.facts(n).KEEPS_GPU_MEMORY]
    others = [n for n in cfg.frameworks if frameworks.facts(n).USES_GPUS and n not in keeps[:1]]
    if gpus_on_node and keeps and others:
        return (f"{cfg.path}:35: found {' '.join(cfg.frameworks)!r} on a node with {gpus_on_node} GPU(s), expected"
                f" {keeps[0]} alone on GPUs in a run: {frameworks.facts(keeps[0]).TITLE} keeps the GPU memory it grew"
                f" until its process ends, so {', '.join(others)}'s tests would run out of it; run each framework in"
                " its own invocation (docs/install.md, 'GPU builds')")
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
        return (f"{cfg.path}:5: found {cfg.results_dir!r}, expected a results directory that can be made and"
                f" written: {e.strerror or e}")
    return None


def load(world, cfg: dat.Config, wait) -> dict:
    """Each workload's data on every rank; synthetic data is written once per node
    under <results>/.data (harness/files.node_once), the node's other ranks waiting asleep
    (`wait`: Watchdog.wait): in a blocking barrier each would keep a core busy while the
    writer needs one."""
    datas = {}
    for name in cfg.workloads:
        wl = workloads.get(name)
        node = topology.node_comm(world)
        writer = lambda: wait(node.Ibarrier(), "data loading: waiting for the node's writer")  # noqa: E731
        try:
            datas[name] = agree(world, lambda: wl.load(cfg.dataset, os.path.join(cfg.results_dir, ".data"), node.rank,
                                                       writer),
                               f"{cfg.path}:8: found {cfg.dataset.text!r} with workload {name} (line 7), expected a"
                               f" dataset {name} can read")
        finally:
            node.Free()
    return datas


def judged(cfg: dat.Config, p: Planned, data, values: dict, facts: dict) -> Planned:
    """The test with its division: closed (a ranking result) or open, with the reasons.
    `facts`: its workload's data_facts of `data` (what results.json records, --verify's)."""
    wl = workloads.get(p.test.workload)
    deviations = tuple(wl.describe_model(data)[1])
    verdict, reasons = division.judge(
        workload=p.test.workload, dataset_kind=cfg.dataset.kind,
        deviations=list(deviations), test_only=settings.test_only(values),
        target=cfg.target_quality, default_target=wl.TARGET_QUALITY, n=cfg.penalty_n, default_n=wl.PENALTY_N,
        repetitions=cfg.repetitions, data_facts=facts, published=wl.PUBLISHED)
    return replace(p, division=verdict, open_reasons=tuple(reasons), model_deviations=deviations, data_facts=facts)


def check_allreduce(cfg: dat.Config) -> None:
    """Line 21 against line 22, before any data is read. Adasum and the torus are
    reductions of their own, which int8 communication (an all-gather, then the average)
    replaces: one or the other. Both lines hold one value, so every test has both: the
    input is refused whole (Adasum's P, a value of the sweep, is each test's: adasum_problem)."""
    if cfg.allreduce in ("adasum", "torus") and cfg.comm_precision == "int8":
        others = [c for c in dat.KNOWN["comm_precision"] if c != "int8"]
        raise RunError(f"{cfg.path}:21: found 'int8' with all-reduce {cfg.allreduce} (line 22), expected"
                       f" {_one_of(others)}: int8's exchange all-gathers and averages, {cfg.allreduce} is a"
                       " reduction of its own")


def shared_gpu_problem(cfg: dat.Config, planned, node_of_rank, gpu_of_rank, hosts) -> str | None:
    """Why a job cannot start with two of its ranks on one GPU where its exchange goes
    through NCCL (which refuses a communicator with two of its ranks on one GPU: "Duplicate
    GPU detected", the same host and PCI bus id), or None. Base models of one rank share a
    GPU freely (each job is its own group).
    `gpu_of_rank`: per world rank, framework name -> the GPU that rank's framework pinned
    (harness/gpus.nccl_identity of its set-up record: its PCI bus id; None where sharing is
    allowed: a CPU, or a build whose exchange is not NCCL's). Compared as (node, GPU): every
    rank may call its own GPU "0" (Slurm's --gpus-per-task=1, a CUDA_VISIBLE_DEVICES a rank).
    Pure: every rank passes the same lists and gets the same answer."""
    for p in planned:
        if p.layout.P < 2:
            continue
        name = p.test.framework
        for j, ranks in enumerate(p.layout.jobs):
            seen = {}
            for r in ranks:
                gpu = gpu_of_rank[r].get(name)
                if gpu is None:
                    continue
                key = (node_of_rank[r], gpu)
                if key in seen:
                    return _shared_gpu(cfg, p, j, (seen[key], r), gpu, node_of_rank, gpu_of_rank, hosts)
                seen[key] = r
    return None


def _shared_gpu(cfg: dat.Config, p, job: int, pair: tuple[int, int], gpu: str, node_of_rank, gpu_of_rank,
                hosts) -> str:
    """shared_gpu_problem's message: the two ranks, the GPU, what the node's ranks pinned."""
    node = node_of_rank[pair[1]]
    here = [r for r, n in enumerate(node_of_rank) if n == node]
    distinct = len({gpu_of_rank[r].get(p.test.framework) for r in here} - {None})
    return (f"{cfg.path}:11: found '{p.layout.P}' (test {p.test.index}'s P) with world ranks {pair[0]} and {pair[1]}"
            f" of job {job} both on GPU {gpu} of {hosts[node]} ({distinct} GPU(s) pinned there by its {len(here)}"
            f" ranks), expected each rank of a {frameworks.facts(p.test.framework).TITLE} job on a GPU of its own:"
            f" NCCL refuses two ranks of one communicator on one GPU; start at most one rank a GPU on"
            f" {hosts[node]}, each bound to a different one (its index among the node's ranks, or"
            f" CUDA_VISIBLE_DEVICES / Slurm's --gpus-per-task=1 a rank), or P = 1 there")


def batches(cfg: dat.Config, planned, skipped, datas: dict) -> tuple[tuple, tuple]:
    """(planned, skipped) with the tests whose job's step (P x B samples) exceeds their
    workload's training set moved to skipped ("batch"); RunError when none is left (runnable)."""
    fits, more = [], []
    for p in planned:
        why = batch_problem(cfg, p.test, datas[p.test.workload].n_train)
        (more.append(Skipped(p.test, why, "batch")) if why else fits.append(p))
    runnable(fits, [*skipped, *more])
    return tuple(fits), tuple(sorted([*skipped, *more], key=lambda s: s.test.index))


def device_skipped(plan: Plan, problems: dict) -> Plan:
    """The plan with the tests whose framework cannot train their precision on a rank's device
    skipped ("device"): `problems` {(framework, precision): (world rank, why)}, the first rank
    whose framework said so (Framework.precision_problem, once the devices are set up: bf16
    on a GPU without bf16 tensor cores); RunError when none is left (runnable). Pure."""
    if not problems:
        return plan
    cfg, kept, more = plan.cfg, [], []
    for p in plan.tests:
        t = p.test
        if (t.framework, t.precision) not in problems:
            kept.append(p)
            continue
        rank, why = problems[(t.framework, t.precision)]
        others = [v for v in dat.KNOWN["precision"] if (t.framework, v) not in problems]
        more.append(Skipped(t, f"{cfg.path}:17: found {t.precision!r} with framework {t.framework} (line 35) on"
                               f" world rank {rank}, expected {_one_of(others)}: {why}", "device"))
    runnable(kept, [*plan.skipped, *more])
    gone = {s.test.index for s in more}
    return replace(plan, tests=tuple(kept), runs=tuple((p, r) for p, r in plan.runs if p.test.index not in gone),
                   skipped=tuple(sorted([*plan.skipped, *more], key=lambda s: s.test.index)))


def resumed(run_dir: str, cfg: dat.Config, n_tests: int, values: dict, tune: float | None = None) -> results.Record:
    """The results of the invocation to resume, checked against the input file and the
    settings in force now (`values`, as settings.read gives them). A results directory (line
    5) is refused, naming its newest run: --resume writes into the folder it is given, so the
    run it continues is named, never guessed (--status and --verify, which only read, take
    the newest)."""
    runs = heartbeat.run_folders(run_dir)
    if runs != [run_dir]:
        newest = runs[-1]
        try:
            state = heartbeat.status(newest, results.load_run(newest))
            said, stopped = state.line(), state.name in ("interrupted", "failed", "dead")
        except ValueError as e:
            said, stopped = f"unreadable: {e}", False
        raise RunError(f"--resume {run_dir}: found a results directory of {len(runs)} run(s), expected the run folder"
                       f" to continue (runs/<id>); its newest is {newest} ({said})"
                       + (f": --resume {newest}" if stopped else ""))   # a run that stopped early is one to continue
    try:
        previous = results.load_run(run_dir)
    except ValueError as e:   # not a folder, no results.json, unreadable: it names which
        raise RunError(f"--resume {e}") from None
    if previous.input.get("sha256") != results.sha256(cfg.text):
        raise RunError(f"--resume {run_dir}: {cfg.path} is not the input file that run used "
                       f"(SHA-256 differs); resume with the same file, or start a new run")
    differ = settings.resume_differences(previous.settings, values)
    if differ:
        raise RunError(f"--resume {run_dir}: found {'; '.join(differ)}, expected the settings that run's finished"
                       " tests had: resume with them, or start a new run")
    if (tune is not None) != (previous.tuning is not None):   # a tuning run resumes as one, a sweep as a sweep
        raise RunError(f"--resume {run_dir}: found a {'tuning run' if previous.tuning is not None else 'sweep'},"
                       f" expected {'a tuning run (--tune)' if tune is not None else 'a sweep'}: resume it as it ran"
                       f"{' (with --tune)' if previous.tuning is not None else ' (without --tune)'}")
    if tune is not None and tune * 60 != previous.tuning["budget_seconds"]:   # the budget sets every trial's length
        raise RunError(f"--resume {run_dir}: found --tune {tune:g}, expected --tune {previous.tuning['budget_seconds'] / 60:g},"
                       " the budget that run was planned with (each trial's length follows from it)")
    if tune is not None and previous.tuning.get("best") is not None:
        raise RunError(f"--resume {run_dir}: nothing to resume, its tuning finished (trial"
                       f" {previous.tuning['best']} the best)")
    if tune is None and len(previous.tests) >= n_tests * cfg.repetitions:
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


def describe_input(plan: Plan, what: str) -> list[str]:
    """--check's first lines: the input valid for `what`, its parameters, settings and data."""
    cfg = plan.cfg
    lines = [f"{cfg.path}: valid. {what}, {len(plan.nodes.hosts)} node(s):"]
    lines += [f"  {line}" for line in dat.describe(cfg) + settings.describe(plan.settings)]
    for name, data in plan.datas.items():
        lines.append(f"data {name}: {data.source}, {data.n_train} training / {data.n_val} validation samples")
        lines += [f"  {line}" for line in workloads.get(name).describe_data(data)]
        if name in plan.facts:
            lines.append(f"  {division.facts_line(plan.facts[name])}")
    return lines


def describe(plan: Plan, world_size: int) -> list[str]:
    """What --check prints: the parameters, each test's map, the skipped tests."""
    cfg = plan.cfg
    lines = describe_input(plan, f"{len(plan.tests)} test(s) on {world_size} rank(s)")
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

