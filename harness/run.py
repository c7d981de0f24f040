"""One test of the sweep (HPL_pdtest): resample, stage, train, evaluate, measure.

Every rank of the world takes part: the ranks of each job train its base model, idle
ranks wait politely, all meet in the ensemble's reduction, and world rank 0 turns the
ranks' records into a `results.TestResult`. The driver (harness/driver.py) runs the
tests in order and hands each result to the output (harness/report.Output).

A failure during a test that every rank can see (staging) is agreed (RunError). A
lost rank (harness/elastic.py) under `--on-fault drop` or `retrain` costs the base models it touched:
the world-level steps of a test (the end of the sampler's sends, staging, the start
barrier of training, each evaluation, the end) run through `World.step`, which shrinks
the world to the survivors and redoes the step without the lost jobs, whose surviving
ranks follow as idle ranks do. Under `abort` with ULFM a loss is found the same way, and
the world step that finds it raises `elastic.Aborted` on every survivor: the driver records
the run failed with the loss. Any other failure (or a fault without ULFM, or one outside
those steps) ends the job through the driver (_end_job: MPI_Abort, or under ULFM each
rank's exit status 1), so no rank is left waiting. Under `retrain` the test then
goes on in waves that train its lost base models again on the survivors (_waves), each
wave a pass of the same steps (_pass), and its figures are over every pass (measure).
"""
from __future__ import annotations

import os
import resource
import sys
import threading
import time
from dataclasses import dataclass, replace

from harness import (checkpoint, division, elastic, ensemble, fault, frameworks, metrics, mllog, parallelism, sampler,
                     settings, staging, telemetry, topology, train, workloads)
from harness.errors import RunError, first_failure
from harness.results import TestResult


@dataclass(frozen=True)
class Context:
    """What every test of an invocation shares."""
    cfg: object             # harness/dat.Config
    world: object           # the world as it stands (harness/elastic.World: MPI_COMM_WORLD, shrunk after a loss)
    nodes: object           # harness/topology.Nodes
    devices: dict           # framework name -> its setup_devices record on this rank, made once (a test reads its own)
    run_id: str             # the run folder's name (names the staged copies)
    ceilings: dict          # precision -> roofline figures (rank 0; {} elsewhere)
    n_tests: int            # tests in the sweep, for progress lines
    submission: dict        # MLLOG's submission_org, _platform, _status (harness/settings.py)
    run_dir: str | None = None   # the run folder, where the base models' checkpoints go (None: none written, as in a
    #                              tuning run's trials)


@dataclass(frozen=True)
class Part:
    """This rank's part in one test: what resampling, staging, training and measuring share."""
    ctx: Context
    planned: object         # harness/plan.Planned: the test, its layout, division, warnings
    rep: int                # repetition, from 0
    seed: int               # line 29's seed + rep
    wl: object              # the workload's module (harness/workloads.get)
    data: object            # its loaded data set
    watchdog: object
    rank: int = 0           # this rank in the test's world (layout.jobs' numbering)
    launch_of: tuple = ()   # the launch rank (MPI_COMM_WORLD's) of each rank of the test's world
    job: int | None = None  # this rank's base model; None on an idle rank
    comm: object = None     # the job's communicator (None on an idle rank)
    indices: object = None  # the job's resample (numpy int array), every rank of the job
    log: object = None      # the job's MLLOG (harness/mllog.BaseModelLog), on its root only
    wave: int = 0           # 0: the test as laid out; k: the k-th wave of `--on-fault retrain` (_waves)
    resumed: object = None  # Resumed: the test goes on from its base models' checkpoints (None: from its start)

    @property
    def t(self):
        return self.planned.test

    @property
    def head(self) -> str:
        """The test, and the wave: what its steps' phases (and so its losses) begin with."""
        return f"test {self.t.index}" + (f", retraining wave {self.wave}" if self.wave else "")

    @property
    def M(self) -> int:
        return self.planned.layout.M

    def lost(self) -> list[int]:
        """The test's jobs that have lost a rank so far (the same on every survivor)."""
        return elastic.lost_jobs(self.planned.layout.jobs, self.launch_of, self.ctx.world.lost)


@dataclass(frozen=True)
class Resumed:
    """Where an interrupted test goes on from (_resumed): its base models' checkpoints after
    one evaluation epoch, every model's, and the test's record beside them."""
    epoch: int              # the evaluation epoch every base model's checkpoint had: training goes on after it
    figures: tuple          # per job: its checkpoint's seconds (s trained through the epoch), samples, wall
    #                         (time.time() at its write)
    start_wall: float       # time.time() at the start of the test's training, in the invocation that began it
    curve: tuple = ()       # world rank 0: the test's evaluations through the epoch
    header: dict | None = None   # a job's root: its own checkpoint's header (its MLLOG so far)

    def lost(self, started: float) -> float:
        """s from the last of the checkpoints written to training again at `started`
        (time.time()): the work lost, the fault, the relaunch."""
        return started - max(f["wall"] for f in self.figures)


@dataclass(frozen=True)
class RankRecord:
    """What one rank tells world rank 0 about a test (gathered once, at its end)."""
    rank: int
    job: int | None                 # None: an idle rank
    staging: dict | None = None     # the copy it trained from or wrote (staging.Staged's figures)
    eval_seconds: float = 0.0       # s in the job's evaluations (0 on an idle rank)
    seconds: float = 0.0            # s of training, evaluations excluded (0 on an idle rank)
    samples: int = 0                # samples its job trained, all its ranks
    steps_per_epoch: int = 0
    epochs: int = 0                 # epochs trained
    loss: float = 0.0               # the last epoch's mean loss
    diff: float = 0.0               # max |w - w_root| of its trainable weights
    weights: str = ""               # digest of its trainable weights
    flops: object = None            # the framework's count of the model (harness/flops.FlopCount)
    telemetry: dict | None = None   # its sampler's summary over training (an idle rank: its CPU window only)
    quality: float | None = None    # job root only: its model's quality at the last evaluation
    resample_size: int = 0          # job root only
    out_of_bag: float = 0.0         # job root only: fraction of the training set not drawn
    index_digest: str = ""          # job root only: digest of the resample
    exchange: str = ""              # job root only: its gradient exchange and library (communication.exchange)
    mllog: list | None = None       # job root only: its MLLOG lines
    stage: dict | None = None       # a split model (line 37): TrainResult.stage
    lost: str = ""                  # its job lost a rank (elastic.py): what this survivor saw
    checkpoint: dict | None = None  # job root only: the checkpoints it wrote (_Checkpoints.record); None: none due


@dataclass(frozen=True)
class Pass:
    """One training of some of a test's base models on the world as it then stood: the test
    as laid out (wave 0), or a wave of `--on-fault retrain` training the lost ones again."""
    part: Part
    evaluation: object          # its Evaluation: its curve, the jobs lost by its last evaluation
    records: list | None        # rank 0: every rank's RankRecord of the pass (None elsewhere)
    sampler_seconds: float      # s, rank 0's draw and sends of its resamples
    losses: list                # the elastic.Loss entries found during it
    gathered_from: float        # perf_counter() before its records' gather


def test(ctx: Context, planned, data, watchdog, rep: int = 0):
    """Repetition `rep` (seed + rep) of a test of the plan (harness/plan.Planned) on every
    rank: the test as laid out, then under `retrain` the waves that train its lost base
    models again (_waves). Rank 0 returns (TestResult, {job: MLLOG lines}); the other ranks None."""
    first = _pass(ctx, planned, data, watchdog, rep)
    passes = [first, *(_waves(ctx, planned, data, watchdog, rep, first) if ctx.world.policy == "retrain" else [])]
    if ctx.world.rank != 0:
        return None
    result = measure(passes)
    # Each log ends on rank 0, where the ensemble's quality is known: MLPerf's success
    # is the target reached (by the ensemble: the benchmark's result), not a clean exit.
    # A lost base model's log (its root survived) ends as MLPerf's aborted run; a model
    # trained again has its wave's log, which the later pass writes over the lost one's.
    reached = result.time_to_quality is not None
    return result, {r.job: mllog.close(r.mllog, ensemble_quality=result.quality, reached=reached and not r.lost,
                                       instance_id=r.job, division=result.division)
                    for p in passes for r in p.records if r.mllog is not None}


def _pass(ctx: Context, planned, data, watchdog, rep: int, after=None, wave: int = 0) -> Pass:
    """One pass of the test on every rank (harness/run.Pass): resample, stage, train and
    evaluate the jobs of `planned.layout` that have ranks, gather the records. `after`: the
    Evaluation of the pass before (a wave's evaluations add the models it kept)."""
    cfg, world = ctx.cfg, ctx.world
    t, layout = planned.test, planned.layout
    wl = workloads.get(t.workload)
    job, job_comm = topology.split(world, layout)
    losses_before = len(world.losses)
    # the pass's numbering of its ranks, whatever the world loses during it
    part = Part(ctx, planned, rep, cfg.seed + rep, wl, data, watchdog, world.rank, tuple(world.launch_ranks), job,
                job_comm, wave=wave)

    t0 = time.perf_counter()
    indices, seen = _resample(part)
    sampler_seconds = time.perf_counter() - t0
    part = replace(part, indices=indices)
    part = replace(part, resumed=_resumed(part))
    part = replace(part, log=_log(part))
    copy = _stage(part)
    evaluation = Evaluation(part, after)
    if not wave and len(evaluation.lost()) == layout.M:   # every job lost before training: the same on every survivor
        staging.cleanup(copy, cfg.staging_keep)
        raise _all_lost(t, world.losses[losses_before:], " before training")
    try:
        if job is None:
            record = _idle(part, copy, evaluation)
        elif job in evaluation.lost():   # lost in the sampler's sends or staging
            record = _abandoned(part, None, copy, evaluation, seen or elastic.Lost(
                f"a rank of base model {job} was lost before training"
                f" ({elastic.describe(world.losses[losses_before:])})"), None)
        else:
            record = _base_model(part, copy, evaluation)
    except (elastic.CoordinatorLost, elastic.Aborted):   # the test is lost: its node's copy goes now
        staging.cleanup(copy, cfg.staging_keep)
        raise
    if cfg.staging != "none":
        # The node's copy serves every job on the node, and a job's ranks leave the last
        # evaluation's reduction before the others have read their validation samples:
        # the writer removes the copy only once every rank is done.
        world.step(f"{part.head}: the end, before the staged copies go", lambda: watchdog.wait(
            world.Ibarrier(), f"{part.head}: every job done, before the staged copies go"))
        staging.cleanup(copy, cfg.staging_keep)
    t3 = time.perf_counter()
    records = world.step(f"{part.head}: the gather of the ranks' records", lambda: world.gather(record, root=0))
    if not wave and len(evaluation.final_lost) == layout.M:
        raise _all_lost(t, world.losses[losses_before:])
    return Pass(part, evaluation, records, sampler_seconds, world.losses[losses_before:], t3)


def _waves(ctx: Context, planned, data, watchdog, rep: int, first: Pass) -> list[Pass]:
    """`--on-fault retrain`: the jobs lost by the test's last evaluation trained again on the
    survivors, each on its own resample (sampler.resample depends on the seed and the job
    alone), in waves of as many jobs of P ranks as the world left holds (laid out by line
    12's map, topology.map_jobs). Each wave's evaluations add the sum of the models kept so
    far (Evaluation's `kept`), so its curve is the whole ensemble's; a job lost again goes
    back in the queue. Jobs left once the world cannot hold one job of P ranks stay dropped.
    The same on every survivor: the queue is the agreed lost jobs."""
    world, M, P = ctx.world, planned.layout.M, planned.layout.P
    queue, waves, prior = list(first.evaluation.final_lost), [], first
    while queue and world.size >= P:
        wave = len(waves) + 1
        watchdog.beat(f"test {planned.test.index}: laying out retraining wave {wave} on the ranks that remain")
        nodes = topology.discover(world)
        k = min(len(queue), world.size // P)
        laid = topology.map_jobs(nodes.node_of_rank, k, P, ctx.cfg.pmap)
        jobs = [()] * M
        for j, ranks in zip(queue, laid.jobs):
            jobs[j] = ranks
        if world.rank == 0:
            print(f"hpcai500: test {planned.test.index}: retraining wave {wave}: base model(s)"
                  f" {', '.join(map(str, queue[:k]))} trained again on {k * P} of the {world.size} ranks left"
                  " (--on-fault retrain)", file=sys.stderr, flush=True)
        prior = _pass(replace(ctx, nodes=nodes), replace(planned, layout=topology.Layout(M, P, tuple(jobs), laid.idle)),
                      data, watchdog, rep, after=prior.evaluation, wave=wave)
        queue = sorted(queue[k:] + prior.evaluation.final_lost)
        waves.append(prior)
    return waves


def _all_lost(t, losses, when: str = "") -> elastic.AllLost:
    return elastic.AllLost(f"every base model of test {t.index} lost a rank{when} ({elastic.describe(losses)})")


def _idle(part: Part, copy, evaluation) -> RankRecord:
    """An idle rank's test: the world steps of training, and its record."""
    probe = telemetry.Sampler()   # its CPU is the run's, not other load (telemetry.other_load)
    probe.start()
    evaluation.start_barrier()   # the one the jobs' ranks enter inside train()
    start = time.perf_counter()
    evaluation.begin()
    # the jobs' evaluations; an idle rank's eval_seconds stay 0, as its Time does: its
    # wait in them is the jobs' training, not evaluating
    evaluation.follow()
    return RankRecord(part.rank, None, staging=_staged(copy), telemetry=probe.stop(window=(start, time.perf_counter())))


def _log(part: Part):
    """The MLLOG of the rank's base model, kept by the job's root (None elsewhere); a model
    going on from its checkpoint goes on with the log it had then."""
    if part.job is None or part.comm.rank != 0:
        return None
    t, nodes, job = part.t, part.ctx.nodes, part.job
    # an error is logged as MLPerf logs CosmoFlow's MAE, eval_error (harness/mllog.py)
    log = mllog.BaseModelLog(t.index, job, higher_is_better=part.wl.HIGHER_IS_BETTER)
    if part.resumed:
        log.carry_on(part.resumed.header["mllog"])
        return log
    log.init(seed=part.seed, global_batch=t.P * t.batch, train_samples=len(part.indices),
             eval_samples=part.data.n_val, nodes=len({nodes.node_of_rank[r] for r in part.planned.layout.jobs[job]}),
             per_node=nodes.local_size, workload=t.workload, division=part.planned.division, **part.ctx.submission)
    return log


def _resample(part: Part):
    """(this rank's job's resample, the error its job's communicator gave): the sampler's
    sends (sampler.distribute), then the world step that ends them. Under `drop` a job
    whose rank died here is lost (its survivors get (None, the error) and follow the test,
    run.test); an error on a job whose ranks all live is an error, and raises."""
    ctx, t, watchdog = part.ctx, part.t, part.watchdog
    world, layout = ctx.world, part.planned.layout
    indices, seen = None, None
    try:
        fault.point(world.origin, "sampler", t.index)
        indices = sampler.distribute(world, [list(j) for j in layout.jobs], part.data.n_train, ctx.cfg.sampler,
                                     part.seed, part.comm, part.job, wait=watchdog.wait,
                                     passed=elastic.is_fault if world.detects else sampler.never)
    except Exception as e:  # noqa: BLE001 - a job's error is a fault only if the world step below loses its rank
        if not world.detects or part.comm is None or not elastic.is_mpi_error(e):
            raise
        part.comm.Revoke()   # the job's other ranks, still in its broadcast, learn it at once
        seen = e
    # Idle ranks come straight here, the jobs' ranks once their resample has arrived (rank 0
    # sends them one after another): wait for all beating the watchdog.
    world.step(f"{part.head}: the sampler's sends", lambda: watchdog.wait(
        world.Ibarrier(), f"test {t.index}: waiting for every job's resample"))
    if seen is not None and part.job not in part.lost():
        raise seen
    return indices, seen


def _resumed(part: Part) -> Resumed | None:
    """Whether the test goes on from its base models' checkpoints (harness/checkpoint.py),
    the same on every rank: each job's root reads its checkpoints through (a torn or foreign
    one is refused, named), world rank 0 picks the epoch every model has one at and the
    test's record has the evaluation of (checkpoint.resume_epoch) and tells every rank.
    None, from the start: a test never interrupted, one whose models wrote none, one laid
    out now with another M than it began with, one a model of which has no checkpoint at
    any epoch the others have (a job lost before training included), a wave of retrain, a
    tuning run's trial (Context.run_dir)."""
    ctx, t = part.ctx, part.t
    if ctx.run_dir is None or part.wave:
        return None
    world, state = ctx.world, None   # state: rank 0's record of the test (checkpoint.load_test)

    def recorded() -> bool:   # rank 0 reads the test's record first: a test never interrupted costs one bcast
        nonlocal state
        state = checkpoint.load_test(ctx.run_dir, t.index, part.rep) if world.rank == 0 else None
        if state is not None and state.get("M") != part.M:
            print(f"hpcai500: {part.head}: laid out with M = {part.M} base models now, its checkpoints are of the"
                  f" M = {state.get('M')} it began with (line 10's 0: as many as the ranks left hold): trained again"
                  " from its start", file=sys.stderr, flush=True)
            state = None
        return world.bcast(state is not None, root=0)
    if not world.step(f"{part.head}: the record of its checkpoints", recorded):
        return None
    mine = _whole(part) if part.job is not None and part.comm.rank == 0 else {}

    def decide():
        found = world.gather((part.job, {e: {k: h[k] for k in ("seconds", "samples", "wall")}
                                         for e, h in mine.items()}) if mine else None, root=0)
        return world.bcast(_choose(part, found, state) if world.rank == 0 else None, root=0)
    chosen = world.step(f"{part.head}: the checkpoints to go on from", decide)
    if chosen is None:
        return None
    return replace(chosen, curve=chosen.curve if world.rank == 0 else (), header=mine.get(chosen.epoch))


def _whole(part: Part) -> dict:
    """A job root's whole checkpoints of its base model in this test: {epoch: header}; one
    that is torn, or was written by another test (its workload, layout, seed or resample
    differ), is said and left out."""
    t, where = part.t, checkpoint.folder(part.ctx.run_dir, part.t.index, part.rep)
    ours = {"workload": t.workload, "framework": t.framework, "mode": t.mode, "M": part.M, "P": t.P, "B": t.batch,
            "seed": part.seed, "index_digest": sampler.digest(part.indices)}
    whole = {}
    for epoch, head, _, why in checkpoint.readable(part.ctx.run_dir, t.index, part.rep, part.job):
        differ = [f"{k} {head.get(k)!r}" for k in ours if head.get(k) != ours[k]] if why is None else []
        if differ:
            why = (f"{os.path.join(where, checkpoint.name(part.job, epoch))}: found {', '.join(differ)}, expected this"
                   f" test's {', '.join(f'{k} {v!r}' for k, v in ours.items())}")
        if why is not None:
            print(f"hpcai500: {part.head}: base model {part.job}'s checkpoint refused: {why}", file=sys.stderr,
                  flush=True)
            continue
        whole[epoch] = head
    return whole


def _choose(part: Part, found: list, state: dict) -> Resumed | None:
    """World rank 0: the Resumed every rank gets, from each job root's whole checkpoints
    (`found`: (job, {epoch: its figures}) or None) and the test's record `state`
    (checkpoint.load_test)."""
    t, by_job = part.t, dict(x for x in found if x is not None)
    if not by_job:
        return None
    curve = state["curve"]
    epoch = checkpoint.resume_epoch({j: list(e) for j, e in by_job.items()}, part.M, [p["epoch"] for p in curve])
    if not epoch:
        print(f"hpcai500: {part.head}: its base models' checkpoints have no evaluation in common with the test's"
              f" record ({checkpoint.folder(part.ctx.run_dir, t.index, part.rep)}): trained again from its start",
              file=sys.stderr, flush=True)
        return None
    print(f"hpcai500: {part.head}: going on from its {part.M} base models' checkpoints after epoch {epoch}: epochs"
          f" 1-{epoch} are not trained again", file=sys.stderr, flush=True)
    return Resumed(epoch, tuple(by_job[j][epoch] for j in range(part.M)), state["start_wall"],
                   tuple(p for p in curve if p["epoch"] <= epoch))


def _stage(part: Part):
    """The Data Duplicator (line 28): one node-local copy per node of the union of the
    resamples of the jobs it serves, every rank of the node taking part (idle ranks too:
    one of them may be the node's writer). Returns this rank's copy (None without
    staging, or on an idle rank that did not write one). A failure anywhere ends the run
    on every rank before training (RunError). Under `drop` the whole is one world step:
    a rank lost in it is left out and the copies are made anew on the survivors, a lost
    job's ranks taking part as idle ones (harness/elastic.py)."""
    ctx, t, watchdog = part.ctx, part.t, part.watchdog
    cfg, world = ctx.cfg, ctx.world
    if cfg.staging == "none":
        return None
    path = staging.folder(cfg.staging, ctx.run_id, t.index, part.rep, ctx.nodes.node_of_rank[part.rank], part.wave)
    copy = None

    def attempt():
        nonlocal copy
        staging.cleanup(copy, keep=False)   # a try that a loss undid: its copy is written anew
        copy, err = None, None
        job, indices = (None, None) if part.job in part.lost() else (part.job, part.indices)
        node = topology.node_comm(world)
        try:
            fault.point(world.origin, "staging", t.index)
            copy = staging.stage(part.wl, part.data, indices, job, node, cfg.staging, path, beat=watchdog.beat,
                                 wait=watchdog.wait)
        except (staging.StagingError, OSError, ValueError) as e:  # ValueError: a DataError reading the copy
            err = str(e)
        except Exception as e:  # noqa: BLE001 - the node's ranks still in its collectives must learn of an MPI error
            if elastic.is_mpi_error(e):
                node.Revoke()
            raise
        finally:
            node.Free()
        # the other nodes' copies may take longer: wait for them beating, not in the allgather
        watchdog.wait(world.Ibarrier(), f"staging, test {t.index}: waiting for the other nodes' copies")
        first_failure(world, err and f"test {t.index}: {err}")

    try:
        world.step(f"{part.head}: staging", attempt)
    except (RunError, elastic.CoordinatorLost, elastic.Aborted):
        staging.cleanup(copy, keep=False)
        if part.comm is not None:
            part.comm.Free()
        raise
    if part.log is not None and copy is not None and not part.resumed:   # the log went on past its init
        part.log.staging(*copy.wall, copy.samples, copy.copy_bytes)
    return copy


def _staged(copy) -> dict | None:
    """A rank's record of the copy it trained from or wrote (staging.Staged)."""
    if copy is None:
        return None
    return {"seconds": copy.seconds, "writer": copy.writer, "samples": copy.samples, "bytes": copy.bytes,
            "path": copy.path}


def _base_model(part: Part, copy, evaluation) -> RankRecord:
    """Train and evaluate this rank's share of base model `part.job` in the test's
    framework (its package's Job: the job's group, the model, the step); its record. With
    staging, the model trains and predicts from the node-local `copy`."""
    ctx, t, job, watchdog, data, wl = part.ctx, part.t, part.job, part.watchdog, part.data, part.wl
    cfg, world = ctx.cfg, ctx.world
    local, local_indices = (copy.data, copy.indices) if copy else (data, part.indices)
    fw = None
    try:
        probe = None
        fw = frameworks.get(t.framework).open_job(frameworks.JobSpec(
            part.comm, tuple(part.planned.layout.jobs[job]), tuple(ctx.nodes.node_of_rank), cfg.comm_precision,
            cfg.allreduce, t.mode, t.P, t.batch, ctx.devices[t.framework]["gpus_on_node"], watchdog.seconds))
        model = fw.build(wl, local, part.seed, job, t.precision)
        watchdog.beat(f"training, test {t.index}")
        # the GPU pinned at set-up, not one worked out from the local rank: a loss renumbers local ranks
        # (topology.discover on the survivors) while each rank's GPU stays where it was
        probe = telemetry.Sampler(gpu=ctx.devices[t.framework]["gpu"])
        probe.start()
        recipe = train.Recipe(t.batch, cfg.epochs, cfg.base_lr, cfg.warmup_epochs, cfg.optimizer,
                              t.precision, cfg.comm_precision, cfg.compiler, cfg.allreduce, t.mode)
        evaluate = _Evaluate(part, fw, model, local, evaluation)
        hooks = _Hooks(part, world.rank == 0, evaluation)
        saves = _Checkpoints(part, hooks, evaluate)
        res = fw.train(wl, local, model, local_indices, recipe, seed=part.seed, job=job,
                       world_barrier=evaluation.start_barrier, hooks=hooks,
                       on_step=_on_step(watchdog, fault.injector(world.origin)), evaluate=evaluate,
                       eval_every=cfg.eval_every, checkpoint=saves if saves.every else None, start=_start(part))
    except (elastic.CoordinatorLost, elastic.Aborted):   # the whole test is lost (harness/driver.py): leave without a collective
        if fw is not None:
            fw.abandon()
        raise
    except Exception as e:  # noqa: BLE001 - a lost partner shows as the framework's own error
        if not world.detects or not (isinstance(e, elastic.Lost) or elastic.job_failed(part.comm)):
            raise
        return _abandoned(part, fw, copy, evaluation, e, probe)
    record = RankRecord(part.rank, job, staging=_staged(copy), eval_seconds=evaluate.seconds, seconds=res.seconds,
                        samples=res.samples, steps_per_epoch=res.steps_per_epoch, epochs=res.epochs,
                        loss=res.final_loss, diff=res.weights_diff, weights=res.weights_digest,
                        flops=fw.count(wl, model, local), telemetry=probe.stop(window=res.clock), stage=res.stage)
    if part.comm.rank == 0:
        record = replace(record, quality=evaluate.quality, resample_size=int(len(part.indices)),
                         out_of_bag=sampler.out_of_bag_fraction(part.indices, data.n_train),
                         index_digest=sampler.digest(part.indices), mllog=part.log.lines, exchange=fw.exchange(),
                         checkpoint=saves.record())
    fw.close()
    part.comm.Free()
    return record


def _start(part: Part) -> train.Start | None:
    """Where this rank's base model goes on from (train.Start): its checkpoint at the epoch
    _resumed chose, which every rank of the job reads (its root read it through already)."""
    if not part.resumed:
        return None
    epoch = part.resumed.epoch
    _, state = checkpoint.load(os.path.join(checkpoint.folder(part.ctx.run_dir, part.t.index, part.rep),
                                            checkpoint.name(part.job, epoch)))
    return train.Start(epoch, state)


def _abandoned(part: Part, fw, copy, evaluation, error: Exception, probe) -> RankRecord:
    """A survivor of a job that lost a rank: it leaves the job's group without a collective,
    follows the test's remaining world steps as an idle rank, and records what it saw."""
    t, job = part.t, part.job
    said = [line.strip() for line in str(error).splitlines() if line.strip()] or [type(error).__name__]
    # TensorFlow's first line is "Graph execution error:"; the line that says what failed is further down
    seen = next((x for x in said if any(k in x for k in ("shut down", "Read error", "Connection", "PROC_FAILED",
                                                           "failed"))), said[0])[:200]
    part.watchdog.beat(f"test {t.index}: base model {job} lost a rank, following")
    policy = part.ctx.world.policy
    cost = {"abort": "the run ends at the next step every rank takes part in",
            "drop": "it leaves the ensemble", "retrain": "it leaves the ensemble: a wave trains it again once the"
                                                        " others finish"}[policy]
    print(f"hpcai500: rank {part.ctx.world.origin}: {part.head}: base model {job} lost a rank"
          f" ({type(error).__name__}: {seen}); {cost} (--on-fault {policy})", file=sys.stderr, flush=True)
    if fw is not None:
        fw.abandon()
    if probe is None:
        probe = telemetry.Sampler()
        probe.start()
    start = time.perf_counter()
    evaluation.follow()
    # its CPU from here is the run's, as an idle rank's is (telemetry.other_load)
    return RankRecord(part.rank, job, staging=_staged(copy), lost=f"{type(error).__name__}: {seen}",
                      mllog=part.log.lines if part.log is not None else None,
                      telemetry=probe.stop(window=(start, time.perf_counter())))


class _Evaluate:
    """One job's evaluation after an epoch (the framework's train's `evaluate`): the job's
    predictions, its root's quality and term of the ensemble, the world's reduction.
    Keeps the seconds it took and the root's last quality."""

    def __init__(self, part: Part, fw, model, local, evaluation):
        self.part, self.fw, self.model, self.local, self.evaluation = part, fw, model, local, evaluation
        self.seconds = 0.0              # s, all evaluations of the test
        self.quality = None             # job root: its model's quality at the last evaluation
        self.logged = None              # job root: the epoch whose quality MLLOG has (a step redone logs once)

    def __call__(self, epoch: int) -> bool:
        """True: the ensemble reached the target and line 32 says stop."""
        p = self.part
        p.watchdog.beat(f"evaluation, test {p.t.index}")
        fault.point(p.ctx.world.origin, "eval", p.t.index)
        t1, wall = time.perf_counter(), time.time()
        self._parts = []                # job root: (rows, its model's quality on them), this evaluation
        stop = self.evaluation.reduce(epoch, self._contribute, lambda: self._quality(epoch, wall), p.job)
        self.seconds += time.perf_counter() - t1
        if p.job in self.evaluation.lost():   # a partner died in this evaluation: the job's group is broken
            raise elastic.Lost(f"a rank of base model {p.job} was lost during the evaluation after epoch {epoch}")
        p.watchdog.beat(f"training, test {p.t.index}")
        return stop

    def _contribute(self, rows: slice):
        """The job's predictions of validation rows `rows`, split over its ranks and
        gathered on its root, which scores them and returns its term of the ensemble
        (None on the other ranks)."""
        p, comm = self.part, self.part.comm
        if rows.start == 0:
            self._parts = []            # a step redone after a loss starts over
        n = rows.stop - rows.start
        mine = ensemble.my_rows(n, comm.rank, comm.size)
        full = ensemble.gather_job(comm, self.fw.predict(p.wl, self.model, self.local, slice(
            rows.start + mine.start, rows.start + mine.stop)), n)
        if comm.rank != 0:
            return None
        self._parts.append((n, workloads.score(p.wl, full, p.data, rows)))
        return ensemble.contribution(full, p.ctx.cfg.aggregation, p.job, p.M, ensemble.stacks(p.wl),
                                     p.wl.VOTE_GROUP)

    def _quality(self, epoch: int, wall: float):
        """The job root's base quality once every chunk is scored (logged); None elsewhere."""
        if self.part.comm.rank != 0:
            return None
        self.quality = metrics.chunk_mean(self._parts)
        if self.logged != epoch:
            self.part.log.eval(epoch, self.quality, start_s=wall, stop_s=time.time())
            self.logged = epoch
        return self.quality


class Evaluation:
    """The ensemble's quality along the way (lines 31-32), on every rank of the world:
    after each evaluation epoch every job's root adds its model's term to one world
    reduction (idle ranks, and the survivors of a lost job, add nothing), world rank 0
    scores the ensemble, keeps the curve, and every rank learns whether the target stops
    training. The clock of the curve is world rank 0's, from the start barrier of training.
    Each of these world steps (and the start barrier) runs through `World.step`: after a
    loss it is redone on the survivors without the lost jobs (harness/elastic.py).

    A workload whose quality is a mean over samples (QUALITY_PER_SAMPLE) is evaluated in
    chunks of validation rows (ensemble.chunks: EVAL_CHUNK_BYTES of scores a chunk), one
    reduction a chunk, so that no rank ever holds the whole set's scores (deepcam: 21 MB
    a sample at 768 x 1152); the chunks' qualities are combined by metrics.chunk_mean.

    A wave of `--on-fault retrain` (harness/run._waves) evaluates its models with those the
    passes before it kept: rank 0 adds their summed scores of the last evaluation before
    (`kept`, ensemble.Kept; the base qualities too), and its curve goes on the test's clock,
    so that each of its points is the ensemble as it then stands."""

    def __init__(self, part: Part, after=None):
        self.ctx, self.t, self.M, self.wl, self.data, self.watchdog = (part.ctx, part.t, part.M, part.wl, part.data,
                                                                       part.watchdog)
        self.head, self.wave = part.head, part.wave
        self.lost = part.lost   # the pass's jobs lost so far
        self.active = sum(1 for ranks in part.planned.layout.jobs if ranks)   # the jobs this pass trains
        self.width = self.wl.score_width(self.data)
        self.chunks = ensemble.chunks(self.data.n_val, self.width, self.wl.QUALITY_PER_SAMPLE,
                                      settings.value("HPCAI500_EVAL_CHUNK"))
        self.target, self.n = workloads.target_and_n(self.wl, self.ctx.cfg)
        self.higher = self.wl.HIGHER_IS_BETTER
        self.resumed = part.resumed
        self.due = train.evaluation_epochs(self.ctx.cfg.epochs, self.ctx.cfg.eval_every)
        # those this pass evaluates: after its checkpoints' epoch, where it goes on from them
        self.epochs = [e for e in self.due if not self.resumed or e > self.resumed.epoch]
        self.started = False  # this rank has passed the start barrier
        self.done = 0         # evaluations this rank has taken part in (every rank's the same once each ends)
        self.stopped = False  # the target stopped training
        self.final_lost = []  # the jobs lost by the end of the last evaluation: the ones the figures leave out
        self.origin = after.start if after else None   # a wave's curve runs on the test's clock
        self.start = 0.0      # perf_counter() at the start barrier of the test's first pass (rank 0)
        # rank 0: {"epoch", "seconds" (s since start), "quality", "base_quality"[, "wave"]}; a test going on from
        # its checkpoints: the evaluations of the invocation that began it first
        self.curve = [dict(p) for p in part.resumed.curve] if part.resumed else []
        self.resumed_at = None   # time.time() at the start of training where the test goes on from its checkpoints
        self.reduce_seconds = 0.0   # rank 0: the world's reductions (scores, base qualities), all evaluations
        # rank 0: the models of the passes before, in every evaluation of this one (retrain):
        # their summed scores (ensemble.Kept), how many, their base qualities by job
        self.kept = after.saved if after else None
        self.kept_models = after.models if after else 0
        self.kept_bases = after.bases() if after else {}
        self.saved, self.models = None, 0   # the same of this pass's last evaluation, for the next wave
        # its record of the test beside the base models' checkpoints (rank 0), at the evaluations they are due
        self.every = _checkpoint_every(part)
        self.where = (self.ctx.run_dir, self.t.index, part.rep)

    def bases(self) -> dict:
        """rank 0: the base quality of each model in the last evaluation, by job."""
        return {j: q for j, q in enumerate(self.curve[-1]["base_quality"]) if q is not None} if self.curve else {}

    def begin(self) -> None:
        """The clock of the curve starts: the test's own, a wave's runs on from its test's,
        and a test going on from its checkpoints from the wall clock of its start then (so
        the time from the fault to training again is on it)."""
        self.start = time.perf_counter() if self.origin is None else self.origin
        if self.resumed:
            self.resumed_at = time.time()
            self.start -= self.resumed_at - self.resumed.start_wall

    def start_barrier(self) -> None:
        """The world barrier that starts training's clock: every job's ranks enter it inside
        train() once set up and warmed up, idle ranks at once, so some wait long. Non-blocking,
        waited beating the watchdog; MPI's blocking and non-blocking barriers do not match
        each other, so both sides call this one."""
        world, watchdog, t = self.ctx.world, self.watchdog, self.t
        phase = watchdog.phase
        world.step(f"{self.head}: the start of training", lambda: watchdog.wait(
            world.Ibarrier(), f"waiting for every job to start, {self.head}"))
        self.started = True
        watchdog.beat(phase)   # back to this rank's phase: training's steps beat without naming one

    def follow(self) -> None:
        """The world steps of training left to a rank that trains no base model (an idle
        rank, or a survivor of a lost job): the start barrier if it has not passed it, the
        evaluations it has not taken part in, until the target stops them."""
        if not self.started:
            self.start_barrier()
        for epoch in self.epochs[self.done:]:
            if self.stopped:
                break
            self.reduce(epoch, lambda rows: None, lambda: None, None)

    def reduce(self, epoch: int, contribute, quality, job: int | None) -> bool:
        """This rank's part of the evaluation after `epoch`, on every rank: for each chunk
        of rows, `contribute(rows)` gives this rank's term of the ensemble (a job's root:
        its model's; None elsewhere) and the world reduces it; then `quality()` gives the
        job root's base quality (None elsewhere). Returns the stop decision, the same on
        every rank."""
        world, t = self.ctx.world, self.t
        stop, q, bases, self.saved, self.models = world.step(f"{self.head}: the evaluation after epoch {epoch}",
                                                             lambda: self._reduce(contribute, quality, job))
        self.done += 1
        self.stopped = stop
        if stop or epoch == self.epochs[-1]:
            self.final_lost = self.lost()
        if world.rank == 0:
            by_job = {**self.kept_bases, **dict(x for x in bases if x is not None)}   # a lost job's entry: None
            self.curve.append({"epoch": epoch, "seconds": time.perf_counter() - self.start, "quality": q,
                               "base_quality": [by_job.get(j) for j in range(self.M)],
                               **({"wave": self.wave} if self.wave else {})})
            if checkpoint.due(epoch, self.due, self.every):   # rank 0's record of the test
                self._record()
            print(f"hpcai500: {progress_head(t, self.ctx.n_tests, self.wave)} :"
                  f" evaluation after epoch {epoch}: ensemble {self.wl.QUALITY} {q:.4f} (target {self.target:.4f})"
                  f"{f' of {self.models} of {self.M} base models' if self.models < self.M else ''}"
                  f"{', reached: stopping' if stop else ''}", file=sys.stderr, flush=True)
        return stop

    def _record(self) -> None:
        """rank 0: the curve so far, the wall clock at the start of its training and its M,
        beside the checkpoints: what a --resume of the test goes on from (its clock on the
        wall's; the same M: line 10's 0 lays out as many as the ranks left hold).
        A write that fails is said once; the run goes on (_Checkpoints)."""
        try:
            checkpoint.save_test(*self.where, {"M": self.M, "curve": self.curve,
                                               "start_wall": time.time() - (time.perf_counter() - self.start)})
        except OSError as e:
            self.every = 0
            print(f"hpcai500: {self.head}: the record of the test beside its checkpoints could not be written ({e});"
                  " training goes on, and --resume would start this test again", file=sys.stderr, flush=True)

    def _reduce(self, contribute, quality, job: int | None):
        """One try of the evaluation's world step: (stop, the ensemble's quality, the base
        qualities, the summed scores kept for a wave of `retrain` (ensemble.Kept, or None),
        the models in the ensemble) on rank 0, (stop, None, None, None, models) elsewhere.
        The jobs lost so far add nothing."""
        world, stack = self.ctx.world, ensemble.stacks(self.wl)
        lost = self.lost()
        mine = job is not None and job not in lost
        models = self.kept_models + self.active - len(lost)
        # a wave may follow: rank 0 keeps what the next one adds (a try undone by a loss: anew)
        keep = ensemble.Kept() if world.rank == 0 and world.policy == "retrain" and models < self.M else None
        # Jobs reach an evaluation at different times (resamples differ in size; idle
        # ranks have no job): wait for all of them politely, so the reduction is quick.
        self.watchdog.wait(world.Ibarrier(), f"waiting for the other jobs, test {self.t.index}")
        parts = []            # rank 0: (rows, the ensemble's quality on them)
        for i, rows in enumerate(self.chunks):
            scores = contribute(rows) if mine else None
            t0 = time.perf_counter()
            n = rows.stop - rows.start
            total = ensemble.reduce_scores(world, scores, ensemble.reduced_shape(n, self.width, self.M, stack))
            self.reduce_seconds += time.perf_counter() - t0
            if world.rank == 0:
                if self.kept is not None:
                    total += self.kept.chunk(i)
                if keep is not None:
                    keep.add(total)
                parts.append((n, workloads.score(self.wl, ensemble.ensemble_scores(
                    total, self.M, stack, models), self.data, rows)))
            self.watchdog.beat(f"evaluation, test {self.t.index}")
        base = quality() if mine else None
        t0 = time.perf_counter()
        bases = world.gather(None if base is None else (job, base), root=0)
        self.reduce_seconds += time.perf_counter() - t0
        stop, q = False, None
        if world.rank == 0:
            q = metrics.chunk_mean(parts)
            stop = self.ctx.cfg.stop_at_target and metrics.reaches(q, self.target, self.higher)
        return world.bcast(stop, root=0), q, bases, keep, models


def measure(passes: list[Pass]) -> TestResult:
    """The test's figures (rank 0) from its passes (the test as laid out, then any waves of
    `retrain`): Eq. 4-8 and the rest, over the base models kept (_kept), a fault's cost in
    Time (_timed), a lost model's partial work in no FLOPs. From the last pass's gather on:
    the result holds the control plane's cost (the gather and this), as bench/scale.py reads."""
    first = passes[0]
    part = first.part
    ctx, planned, wl, data = part.ctx, part.planned, part.wl, part.data
    cfg, t, layout = ctx.cfg, planned.test, planned.layout
    workers, launch, retrained, dropped = _kept(passes)
    again = {x["job"] for x in retrained}
    roots = sorted((r for r in workers if r.quality is not None), key=lambda r: r.job)
    fc = workers[0].flops
    curve = [point for p in passes for point in p.evaluation.curve]
    resumed, before, samples = _resumption(first, roots, again)
    timed = _timed(cfg, passes, curve, before)
    seconds = timed["train_seconds"]
    total_flops = metrics.total_flops(samples, fc.training)
    quality = curve[-1]["quality"]
    target, n, higher = first.evaluation.target, first.evaluation.n, first.evaluation.higher
    reached = metrics.first_reaching(metrics.counted(curve), target, higher)
    fl = metrics.flops(total_flops, seconds)
    vfl = metrics.vflops(fl, quality, target, n, higher)
    tele = telemetry.reduce([r.telemetry for r in workers])
    others = _other_load(first)
    return TestResult(
        index=t.index, tv=t.tv(cfg), workload=t.workload, framework=t.framework, mode=t.mode, M=layout.M, P=layout.P,
        B=t.batch, precision=t.precision, sampler=cfg.sampler, aggregation=cfg.aggregation, repetition=part.rep,
        seed=part.seed,
        epochs=cfg.epochs, eval_every=cfg.eval_every,
        epochs_trained=next(r.epochs for r in roots if r.job not in again),   # the test's own pass's
        stop_at_target=cfg.stop_at_target, jobs=[list(j) for j in layout.jobs], idle_ranks=list(layout.idle),
        warnings=list(planned.warnings) + [w for w in [metrics.short_span(seconds)] if w]
        + telemetry.other_load_warnings(others),
        data=data.source, train_samples=data.n_train, val_samples=int(data.n_val), data_facts=planned.data_facts,
        forward_flops_per_sample=fc.forward, training_flops_per_sample=fc.training,
        flops_by_operator=fc.by_operator, activations_per_sample=fc.activations, weights=fc.weights,
        intensity=metrics.intensity(fc.forward, fc.activations, fc.weights, t.batch,
                                    4 if t.precision == "fp32" else 2),
        steps_per_epoch=[r.steps_per_epoch for r in roots],
        samples_trained=int(sum(samples)), total_flops=total_flops,
        train_seconds_min=before + min(r.seconds for r in workers), **timed, evaluations=curve,
        time_to_quality=reached and reached["seconds"], epochs_to_quality=reached and reached["epoch"],
        flops=fl, vflops=vfl, quality_name=wl.QUALITY, quality=quality,
        base_quality=[r.quality for r in roots], target_quality=target, penalty_n=n,
        penalty=metrics.penalty(quality, target, n, higher), final_loss=[r.loss for r in roots],
        utilisation=metrics.utilisation(fl, ctx.ceilings.get(frameworks.roofline_key(t.framework, t.precision)),
                                        sorted(set(launch))),
        telemetry=tele, vflops_per_watt=telemetry.per_joule(vfl, seconds, tele),
        consistency=metrics.consistency(max(r.diff for r in workers)),
        resample=[{"job": r.job, "size": r.resample_size, "out_of_bag": r.out_of_bag, "digest": r.index_digest}
                  for r in roots],
        weights_digest=digests_by_job(workers, layout.M), **_losses(passes, dropped), retrained=retrained,
        exchange=[r.exchange for r in roots], other_load=others, pipeline=_pipeline(t, workers, roots),
        model_layers=list(fc.layers), model_deviations=list(planned.model_deviations), higher_is_better=higher,
        # the control plane's cost at scale: rank 0's gather of every rank's record and
        # this measure, and its peak memory so far (Linux: ru_maxrss in KiB)
        gather_seconds=time.perf_counter() - passes[-1].gathered_from,
        rank0_peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        checkpoints=_checkpoints(roots), resumed=resumed)


def _checkpoints(roots: list[RankRecord]) -> dict | None:
    """TestResult.checkpoints from the job roots' records (_Checkpoints.record); None where
    none was due (HPCAI500_CHECKPOINT 0, a tuning run)."""
    made = [r.checkpoint for r in roots if r.checkpoint is not None]
    if not made:
        return None
    each = [c["seconds"] / c["written"] for c in made if c["written"]]
    writes = [c["write_seconds"] / c["written"] for c in made if c["written"]]
    # the slowest root's: every job waits for it at the next evaluation
    return {"every": settings.value(checkpoint.SETTING), "written": sum(c["written"] for c in made),
            "seconds": max(c["seconds"] for c in made), "each_seconds": max(each, default=0.0),
            "write_seconds": max(writes, default=0.0), "bytes": sum(c["bytes"] for c in made),
            "refused": sorted({c["refused"] for c in made if c["refused"]})}


def _other_load(first: Pass) -> list:
    """TestResult.other_load over the test's own ranks, numbered as its world was laid out."""
    nodes = first.part.ctx.nodes
    return telemetry.other_load({r.rank: (r.telemetry or {}).get("cpu_window") for r in first.records},
                                nodes.node_of_rank, nodes.machine_of_node, nodes.hosts)


def _resumption(first: Pass, roots: list[RankRecord], again: set) -> tuple[dict | None, float, list[int]]:
    """(TestResult.resumed, the s of Time before the test's pass, each kept model's samples):
    a test gone on from its base models' checkpoints (Resumed) holds in Time the slowest
    model's training through their epoch and the span from the last of them written to
    training again (the work lost, the fault, the relaunch), and counts the samples before
    it once (a model trained again by a wave of retrain: its wave's alone)."""
    r = first.part.resumed
    if not r:
        return None, 0.0, [x.samples for x in roots]
    resumed = {"epoch": r.epoch, "seconds_before": max(f["seconds"] for f in r.figures),
               "lost_seconds": r.lost(first.evaluation.resumed_at)}
    before = {x.job: r.figures[x.job]["samples"] for x in roots if x.job not in again}
    resumed["samples_before"] = int(sum(before.values()))
    return (resumed, resumed["seconds_before"] + resumed["lost_seconds"],
            [x.samples + before.get(x.job, 0) for x in roots])


def _timed(cfg, passes: list[Pass], curve: list[dict], before: float) -> dict:
    """TestResult's timings over the test's passes: each pass's (max over its ranks, or rank
    0's) summed, so that a wave of retrain adds its time, and where the test went on from
    checkpoints `before`: the training before them and the span lost (_resumption). Staging is
    the test's own pass's: a wave's falls inside the curve's wall, which runs on from the
    first pass's clock."""
    first = passes[0].records
    return {"train_seconds": before + sum(max(r.seconds for r in p.records) for p in passes),
            "eval_seconds": sum(max(r.eval_seconds for r in p.records) for p in passes),
            "sampler_seconds": sum(p.sampler_seconds for p in passes),
            "reduce_seconds": sum(p.evaluation.reduce_seconds for p in passes),
            "staging": _staging_summary(cfg, first), "time_to_solution": _staging_seconds(first) + curve[-1]["seconds"]}


def _kept(passes: list[Pass]) -> tuple[list[RankRecord], list[int], list[dict], list[int]]:
    """(the records of the ranks that trained a base model kept, their launch ranks, the
    models a wave trained again (results.TestResult.retrained), the models dropped): a job
    lost in a pass (its evaluation's final_lost) is kept from the wave that trained it
    again, if one did; each kept job's records come from one pass."""
    workers, launch, retrained = [], [], []
    for wave, p in enumerate(passes):
        lost, jobs = set(p.evaluation.final_lost), p.part.planned.layout.jobs
        mine = [r for r in p.records if r.job is not None and r.job not in lost]
        workers += mine
        launch += [p.part.launch_of[r.rank] for r in mine]
        if wave:
            retrained += [{"job": j, "wave": wave, "ranks": [p.part.launch_of[r] for r in jobs[j]]}
                          for j in sorted({r.job for r in mine})]
    kept = {r.job for r in workers}
    return workers, launch, retrained, [j for j in range(passes[0].part.M) if j not in kept]


def _losses(passes: list[Pass], dropped: list[int]) -> dict:
    """TestResult's record of the ranks lost during the test (each against the jobs of the
    pass that found it, a wave's marked so) and the base models dropped, and the test's
    division with them (division.with_losses: a model trained again is not dropped)."""
    part = passes[0].part
    launch, planned = list(part.launch_of), part.planned
    verdict, reasons = division.with_losses(planned.division, list(planned.open_reasons), len(dropped), planned.layout.M)
    return {"division": verdict, "open_reasons": reasons,
            "launch_ranks": None if len(launch) == part.ctx.world.launched else launch,
            "losses": [{**elastic.record(x, p.part.launch_of, p.part.ctx.nodes, p.part.planned.layout.jobs),
                        **({"wave": wave} if wave else {})} for wave, p in enumerate(passes) for x in p.losses],
            "jobs_lost": dropped}


def _pipeline(t, workers: list[RankRecord], roots: list[RankRecord]) -> dict | None:
    """results.json's `pipeline` of a split mode's test (parallelism.summary), None for data."""
    if t.mode == "data":
        return None
    r = parallelism.resolve(parallelism.parse(t.mode), t.P, t.batch)
    return parallelism.summary(r, [w.stage for w in workers], roots[0].stage)


def digests_by_job(workers: list[RankRecord], M: int) -> list[list[str]]:
    """Each job's ranks' weight digests, in rank order: one pass over the records, not
    one per job (M x W grows to 16.8 M steps, and M sorts, at M = W = 4,096)."""
    out = [[] for _ in range(M)]
    for r in sorted(workers, key=lambda r: r.rank):
        out[r.job].append(r.weights)
    return out


def _staging_seconds(records) -> float:
    """Max over the ranks that trained from a copy or wrote one (staging.Staged.seconds)."""
    return max((r.staging["seconds"] for r in records if r.staging), default=0.0)


def _staging_summary(cfg, records) -> dict | None:
    """What the Data Duplicator did in a test: copies written (one per node serving a job;
    its writer may be an idle rank), their distinct samples and bytes, summed over nodes,
    and the time."""
    staged = [r.staging for r in records if r.staging]
    if not staged:
        return None
    writers = [s for s in staged if s["writer"]]
    return {"dir": cfg.staging, "kept": cfg.staging_keep, "seconds": _staging_seconds(records),
            "copies": len(writers), "samples": int(sum(s["samples"] for s in writers)),
            "bytes": int(sum(s["bytes"] for s in writers)),
            "paths": sorted(s["path"] for s in writers)}


class _Hooks:
    """Training-loop callbacks of one rank: MLLOG events on a job's root, progress
    lines on world rank 0 (stderr, so that stdout stays the pasteable report), the
    evaluation clock's start."""

    def __init__(self, part: Part, progress: bool, evaluation: Evaluation):
        self.part, self.log, self.progress, self.evaluation = part, part.log, progress, evaluation
        self.elapsed = 0.0   # s of training (the loop's clock) through the last epoch: a checkpoint's figures

    def recipe(self, name, config, peak_lr, warmup_steps, total_steps):
        """`config`: the optimizer's settings under Keras' names (get_config(); mllog.recipe).
        A model going on from its checkpoint has its recipe and run_start in its log already."""
        if self.log and not self.part.resumed:
            self.log.recipe(mllog.recipe(name, config, peak_lr, warmup_steps, total_steps))

    def run_start(self):
        self.evaluation.begin()
        if self.log and not self.part.resumed:
            self.log.run_start()

    def epoch_start(self, epoch):
        if self.log:
            self.log.epoch_start(epoch)

    def epoch_stop(self, epoch, epochs, loss, elapsed):
        self.elapsed = elapsed
        if self.log:
            self.log.epoch_stop(epoch)
        if self.progress:   # world rank 0's job: job 0, or in a wave of retrain the one it trains again
            p = self.part
            print(f"hpcai500: {progress_head(p.t, p.ctx.n_tests, p.wave)} : epoch {epoch}/{epochs}  job {p.job}"
                  f" loss {loss:.4f}  elapsed {elapsed:.1f} s", file=sys.stderr, flush=True)


def _checkpoint_every(part: Part) -> int:
    """Evaluations between a base model's checkpoints in this pass (HPCAI500_CHECKPOINT);
    0, none: a wave of retrain, a run without a folder for them (a tuning run's trials)."""
    return settings.value(checkpoint.SETTING) if part.ctx.run_dir is not None and not part.wave else 0


class _Checkpoints:
    """train.run's `checkpoint` hook on one rank of a job (harness/checkpoint.py): after each
    due evaluation the job's root takes its base model's state and writes it, whole, with
    the figures so far in its header (the epoch, the training seconds and samples through
    it, its quality, its resample's digest, its MLLOG). Every rank of the job takes part in
    taking the state (a split model's root gathers its stages'); the root alone writes.
    Training waits while the state is taken; a thread writes it behind training (hashing,
    the disk, the flush), one write at a time: the next checkpoint, and the end of
    training, wait for the one before. Where the
    framework cannot take its state (its Trainer raises NotImplementedError: the record
    says why) or a write fails (said on stderr too), the root writes no more in the test: a
    checkpoint is what a relaunch goes on from, not a figure, so the run goes on, and
    --resume starts that test again. Only the test as laid out writes (not a wave of
    `retrain`), and only where the run has a folder for them (Context.run_dir)."""

    def __init__(self, part: Part, hooks: _Hooks, evaluate: _Evaluate):
        self.part, self.hooks, self.evaluate, self.resumed = part, hooks, evaluate, part.resumed
        self.every = _checkpoint_every(part)   # evaluations between checkpoints
        self.due = evaluate.evaluation.due
        self.written, self.bytes, self.refused = 0, 0, ""   # bytes: the last one's; refused: why no more are
        self.unable = False   # the state cannot be taken: every rank of the job alike
        self.seconds, self.write_seconds = 0.0, 0.0   # s training waited; s the writes took behind it
        self.writer = None   # the thread writing the last one

    def __call__(self, epoch: int, state) -> None:
        p = self.part
        if self.unable or not checkpoint.due(epoch, self.due, self.every):
            return
        t, t0, root = p.t, time.perf_counter(), p.comm.rank == 0
        self._wait()
        try:
            payload = state()   # on every rank of the job, a root whose writes failed too: it may be collective
        except NotImplementedError as e:   # known before the run: the report's Checkpoints line says it
            self.unable, self.refused = True, f"{t.framework}: {e}"
        else:
            if root and not self.refused:
                steps = train.steps_per_epoch(len(p.indices), t.P, t.batch, p.job)
                header = {"workload": t.workload, "framework": t.framework, "mode": t.mode, "M": p.M, "P": t.P,
                          "B": t.batch, "seed": p.seed, "index_digest": sampler.digest(p.indices),
                          "seconds": self._before() + self.hooks.elapsed, "samples": steps * epoch * t.batch * t.P,
                          "quality": self.evaluate.quality, "wall": time.time(), "mllog": p.log.lines}
                self.writer = threading.Thread(target=self._write, args=(epoch, header, payload), daemon=True,
                                               name=f"hpcai500-checkpoint-{p.job}")
                self.writer.start()
        self.seconds += time.perf_counter() - t0

    def _write(self, epoch: int, header: dict, payload: bytes) -> None:
        """The writer thread: one checkpoint to disk, whole or not at all."""
        p, t0 = self.part, time.perf_counter()
        try:
            self.bytes = checkpoint.save(p.ctx.run_dir, p.t.index, p.rep, p.job, epoch, header, payload)
            self.written += 1
        except OSError as e:
            self.refused = f"writing it failed: {e}"
            print(f"hpcai500: rank {p.ctx.world.origin}: {p.head}: base model {p.job} writes no more checkpoints"
                  f" ({self.refused}); training goes on, and --resume would start this test again",
                  file=sys.stderr, flush=True)
        self.write_seconds += time.perf_counter() - t0

    def _wait(self) -> None:
        if self.writer is not None:
            self.writer.join()
            self.writer = None

    def _before(self) -> float:
        """s of the test's Time before this training: where it went on from checkpoints, the
        model's own before them and the span from the last one written to its start (so a
        second interruption keeps the first one's cost: _resumption)."""
        r = self.resumed
        if not r:
            return 0.0
        return r.figures[self.part.job]["seconds"] + r.lost(self.evaluate.evaluation.resumed_at)

    def record(self) -> dict | None:
        """RankRecord.checkpoint (the job's root; None elsewhere, or where none was due), once
        the last write has ended (training waited for it: counted)."""
        if self.part.comm.rank != 0 or not self.every:
            return None
        t0 = time.perf_counter()
        self._wait()
        self.seconds += time.perf_counter() - t0
        return {"written": self.written, "seconds": self.seconds, "write_seconds": self.write_seconds,
                "bytes": self.bytes, "refused": self.refused}


def progress_head(t, total: int, wave: int = 0) -> str:
    """Which test a progress line is about: its number, framework, mode (where not data)
    and layout (a sweep of several frameworks or modes repeats the same layouts), and the
    wave of `--on-fault retrain` (_waves) where it is one."""
    mode = "" if t.mode == "data" else f" {t.mode}"
    return f"test {t.index}/{total} {t.framework}{mode} M={t.M} P={t.P} B={t.batch}" + (f" wave {wave}" if wave else "")


def _on_step(watchdog, fire):
    """Per training step: tell the watchdog we progress; fire an injected fault if armed."""
    if fire is None:
        return lambda step: watchdog.beat()

    def on_step(step):
        watchdog.beat()
        fire(step)
    return on_step


