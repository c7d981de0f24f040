"""Tuning (--tune): the benchmark tunes HPCAI500.dat for the machine it runs on.

The input file states the search space: the sweep lines' lists (layouts, batch sizes,
precisions, frameworks, parallel modes) and, under --tune, several values on the lines of
dat.SINGLE (PMAP, optimizer, learning rate, warm-up, communication precision, all-reduce,
staging, compiler). Whether an option changes how fast the same training runs ("speed") or
what it learns ("quality") is dat.KNOBS' fact, stated where the lines are read.

The search, each step a trial, and each trial one test through the driver's own code
(run.test: the report block, results record, MLLOG, --verify's checks, fault handling):

1. Calibration: the first candidate for one epoch, to learn an epoch's seconds and what a
   trial costs beyond its training (set-up, warm-up, evaluation, records).
2. Speed probes (when a speed line lists several values): every combination of the speed
   knobs on one reference setting of the quality knobs (the layout with the most ranks a
   model, where the exchange weighs most), each trained at least PROBE_SECONDS, the span
   bench/span.py found long enough for FLOPS to repeat within 2.4 %. The highest FLOPS
   wins and stays fixed.
3. Successive halving over the quality knobs (Hyperband's bracket, rate ETA): every
   candidate that can run, in the seeded order Optuna's grid sampler proposes, for an
   equal share of training time; the best 1/ETA by VFLOPS go on, each training ETA times
   longer, until ETA or fewer are left: the finalists, each trained the full length of the
   input file (line 15), whose VFLOPS are measured, not estimated. The best finalist is
   the tuned file's.

Equal training time, not equal epochs: a stage's trials share its part of the budget, and
each candidate trains as many epochs as fit that time at its own epoch's seconds (measured
by its earlier trial; before that predicted from the calibration by its ranks a model, as
a rank's share of an epoch is 1/P of the resample). A short trial's quality, and so its
VFLOPS, is an estimate of the full training's; the table says which figures are.

Optuna (rank 0 only) proposes the candidates (GridSampler, seeded: the same input and seed
propose the same trials), records each as its study's trial (its intermediate VFLOPS a
stage, pruned or complete) and keeps the study in the run folder (tuning.journal), from
which --resume continues. Its pruners are not used: they decide inside a trial as it
reports, one training continued, where a stage here is a new training of its own length,
and they cannot give the plan --check --tune prints before anything runs.

Pure: the space, the plan, the fidelities, the promotions, the table and the tuned file
are functions of the input and the trials' records; `Tuning.run` drives a study through an
`execute(spec)` the driver gives it (harness/driver.py: MPI at the edges).
"""
from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field, replace

from harness import dat, results, topology
from harness import plan as planning
from harness.errors import RunError

ETA = 3                    # successive halving's rate: a stage keeps the best 1/ETA of its candidates
PROBE_SECONDS = 2.4        # s of training a speed probe needs: FLOPS repeat within 2.4 % from there (bench/span.py)
PROBE_MARGIN = 1.25        # the probes' epochs are for PROBE_SECONDS x this at the calibration's epoch: its one
#                            epoch runs slower than a warm one (probes of 1.8-2.0 s came of none, bench/tune.py)
MIN_TRIAL_SECONDS = 5.0    # s of machine time a planned trial needs at least, before anything has run: a span that
#                            repeats (PROBE_SECONDS) and a test's fixed costs (set-up, the warm-up step, evaluations,
#                            records: 1-3 s of a digits test on 2 cores); the calibration's measure checks it again
#                            (short_budget)
DEFAULT_MINUTES = 60.0     # --tune without MINUTES
JOURNAL = "tuning.journal"   # Optuna's study, in the run folder
TABLE = "tuning.txt"
CHART = "tuning.png"
TUNED = "HPCAI500-tuned.dat"


class TuneError(ValueError):
    """A space or budget a tuning run refuses; the message names the line."""


# -- the space -------------------------------------------------------------------------
@dataclass(frozen=True)
class Axis:
    """One knob of the space: a Config field and the values the input lists for it."""
    field: str      # dat.Config's
    line: int       # the line holding the values
    kind: str       # speed | quality (dat.KNOBS)
    values: tuple   # as the Config holds them; layouts: (M, P) pairs


def axes(cfg: dat.Config) -> list[Axis]:
    """Every knob of dat.KNOBS with the values the input gives it (one or several), by line."""
    alts = dict(cfg.alternatives)
    out = []
    for name, (line, kind) in sorted(dat.KNOBS.items(), key=lambda kv: kv[1][0]):
        values = alts.get(name) or (getattr(cfg, name) if name in _SWEEP else (getattr(cfg, name),))
        out.append(Axis(name, line, kind, tuple(values)))
    return out


_SWEEP = ("layouts", "batch_sizes", "precisions", "frameworks", "modes")   # the Config's tuples of a sweep line


def varied(cfg: dat.Config, kind: str | None = None) -> list[Axis]:
    """The axes listing several values (of one kind, or both)."""
    return [a for a in axes(cfg) if len(a.values) > 1 and kind in (None, a.kind)]


def choices(cfg: dat.Config, kind: str) -> list[dict]:
    """Every combination of the `kind` knobs' values, {field: value}, in the input's order."""
    of_kind = [a for a in axes(cfg) if a.kind == kind]
    return [dict(zip((a.field for a in of_kind), combo)) for combo in itertools.product(*(a.values for a in of_kind))]


def space_problem(cfg: dat.Config) -> str | None:
    """Why the input is not a space a tuning run can search, or None."""
    if len(cfg.workloads) > 1:
        return (f"{cfg.path}:6: found {len(cfg.workloads)} workloads, expected 1 under --tune: a tuning run tunes one"
                " workload's settings (its data, target and n stay fixed)")
    if not varied(cfg):
        lines = ", ".join(str(line) for line, _ in sorted(dat.KNOBS.values()))
        return (f"{cfg.path}: found no line listing several values, expected a search space under --tune: several"
                f" values on one of lines {lines}")
    return None


def fixed_lines(cfg: dat.Config) -> list[str]:
    """What a tuning run never varies, said before anything runs."""
    tgt = "the workload's" if cfg.target_quality < 0 else f"{cfg.target_quality:g}"
    n = "the workload's" if cfg.penalty_n < 0 else f"{cfg.penalty_n:g}"
    return [f"fixed: workload {cfg.workloads[0]} (line 7), data {cfg.dataset.text} (line 8), target {tgt} (line 25),"
            f" n {n} (line 26), epochs {cfg.epochs}: the full length (line 15), sampler {cfg.sampler} (line 23),"
            f" aggregation {cfg.aggregation} (line 24), seed {cfg.seed} (line 29)",
            f"fixed: repetitions {cfg.repetitions} (line 27) are the tuned file's ranking run's; a trial runs once,"
            " and is open: what the closed division fixes (the published data, the workload's target and n, 5"
            " repetitions or more: harness/division.py) the input fixes, and the tuned file keeps"]


def encode(name: str, value):
    """A knob's value as Optuna's grid holds it (str, int or float): a layout as 'MxP'."""
    return f"{value[0]}x{value[1]}" if name == "layouts" else value


def decode(name: str, value):
    """encode's inverse."""
    if name == "layouts":
        m, p = str(value).split("x")
        return int(m), int(p)
    return value


def label(choice: dict, fields=None) -> str:
    """A choice in words, its knobs in line order: 'M 2 x P 1, B 32, sgd, ...'."""
    out = []
    for name, (line, _) in sorted(dat.KNOBS.items(), key=lambda kv: kv[1][0]):
        if name not in choice or (fields is not None and name not in fields):
            continue
        v = choice[name]
        out.append(f"M {v[0]} x P {v[1]}" if name == "layouts" else f"B {v}" if name == "batch_sizes" else
                   f"PMAP {v}" if name == "pmap" else f"LR {v:g}" if name == "base_lr" else
                   f"warm-up {v:g}" if name == "warmup_epochs" else f"comm {v}" if name == "comm_precision" else
                   f"staging {v}" if name == "staging" else f"compiler {v}" if name == "compiler" else str(v))
    return ", ".join(out)


def configure(cfg: dat.Config, choice: dict, epochs: int) -> dat.Config:
    """A trial's configuration: the input with one value of each knob, `epochs` epochs (the
    warm-up scaled with them: a short trial is the recipe compressed), one repetition."""
    single = {name: choice[name] for name in dat.SINGLE if name in choice and name != "warmup_epochs"}
    warm = choice.get("warmup_epochs", cfg.warmup_epochs)
    return replace(cfg, **single, layouts=(choice["layouts"],), batch_sizes=(choice["batch_sizes"],),
                   precisions=(choice["precisions"],), frameworks=(choice["frameworks"],), modes=(choice["modes"],),
                   epochs=epochs, warmup_epochs=min(float(epochs), warm * epochs / cfg.epochs), repetitions=1,
                   alternatives=())


def test_of(cfg: dat.Config, choice: dict, index: int) -> dat.Test:
    """The trial's test (its index the trial's number)."""
    m, p = choice["layouts"]
    return dat.Test(index, cfg.workloads[0], m, p, choice["batch_sizes"], choice["precisions"], choice["frameworks"],
                    choice["modes"])


def problem(cfg: dat.Config, choice: dict, world_size: int, n_train: int) -> str | None:
    """Why a choice cannot run on this world and data, as the sweep would skip its test, or None."""
    trial_cfg = configure(cfg, choice, cfg.epochs)
    t = test_of(trial_cfg, choice, 1)
    found = planning.combination_problem(trial_cfg, t)
    if found:
        return found[1]
    try:
        planning.check_allreduce(trial_cfg)
    except RunError as e:
        return str(e)
    try:
        topology.resolve(world_size, t.M, t.P)
    except topology.TopologyError as e:
        return planning.too_large(cfg, t, world_size, e)
    return planning.batch_problem(cfg, t, n_train)


def survey(cfg: dat.Config, world_size: int, n_train: int) -> tuple[list, list, list]:
    """(the speed choices the probes try: those that can run on the reference setting, the
    quality choices that can run with one of the speed choices, [(choice, why not)] for the
    others: a quality choice with the first speed choice's reason, a speed choice on the
    reference)."""
    speed, runs, cannot = choices(cfg, "speed"), [], []
    for q in choices(cfg, "quality"):
        why = [problem(cfg, {**q, **s}, world_size, n_train) for s in speed]
        (runs.append(q) if None in why else cannot.append((q, why[0])))
    if not runs:
        return [], [], cannot
    ref = reference(runs)
    probes = []
    for s in speed:
        why = problem(cfg, {**ref, **s}, world_size, n_train)
        (cannot.append((s, why)) if why else probes.append(s))
    return probes, runs, cannot


def make_plan(cfg: dat.Config, world_size: int, n_train: int, budget: float) -> tuple[tuple, list]:
    """(the plan's stages, the choices left out as they cannot run), or TuneError: not a
    space, no choice can run, or the budget cannot hold the plan."""
    why = space_problem(cfg)
    if why:
        raise TuneError(why)
    speed, runs, cannot = survey(cfg, world_size, n_train)
    if not runs:
        raise TuneError("; ".join(dict.fromkeys(w for _, w in cannot)) + " (every candidate of the --tune space)")
    plan = stages(len(speed), len(runs), cfg.epochs)
    why = budget_problem(plan, budget)
    if why:
        raise TuneError(why)
    return plan, cannot


# -- the plan --------------------------------------------------------------------------
@dataclass(frozen=True)
class Stage:
    """One stage of the plan."""
    name: str          # "probes", "stage 1", ..., "final"
    trials: int        # trials planned
    fidelity: str      # how long each trial trains, in words


def stages(n_speed: int, n_quality: int, epochs: int, eta: int = ETA) -> tuple[Stage, ...]:
    """The plan: speed probes (n_speed > 1), then successive halving of n_quality candidates
    (keeping ceil(n / eta) a stage) until eta or fewer are left, the final stage."""
    sizes = [n_quality]
    while sizes[-1] > eta:
        sizes.append(math.ceil(sizes[-1] / eta))
    out = [Stage("probes", n_speed, f">= {PROBE_SECONDS:g} s of training each (bench/span.py)")] \
        if n_speed > 1 else []
    for r, n in enumerate(sizes[:-1], 1):
        out.append(Stage(f"stage {r}", n, "equal training time, as many epochs as fit its part of the budget"))
    out.append(Stage("final", sizes[-1], f"the full length, {epochs} epochs (line 15): VFLOPS measured"))
    return tuple(out)


def budget_problem(plan: tuple[Stage, ...], budget: float) -> str | None:
    """Why the budget cannot hold the plan, by how much, or None, before anything has run:
    every planned trial needs MIN_TRIAL_SECONDS at least."""
    need = planned_trials(plan) * MIN_TRIAL_SECONDS
    if budget >= need:
        return None
    return (f"--tune {budget / 60:g}: found a budget of {span(budget)}, expected at least {span(need)}"
            f" ({planned_trials(plan)} trials planned, {MIN_TRIAL_SECONDS:g} s of machine time each at least):"
            f" {span(need - budget)} more, or fewer values on the lines that list several")


def plan_lines(cfg: dat.Config, plan: tuple[Stage, ...], budget: float, excluded: list[tuple[dict, str]]) -> list[str]:
    """What --check --tune prints: the space, what stays fixed, the plan."""
    ax = varied(cfg)
    n = math.prod(len(a.values) for a in ax)
    lines = [f"tuning space: {n} combination(s) of {len(ax)} line(s) listing several values"]
    lines += [f"  line {a.line}: {a.field} ({a.kind}): {' '.join(str(encode(a.field, v)) for v in a.values)}"
              for a in ax]
    lines += fixed_lines(cfg)
    if excluded:
        lines.append(f"cannot run: {len(excluded)} candidate(s) (quality settings, or speed settings on the probes'"
                     " reference), left out of the search:")
        lines += [f"  {label(c)}: {why}" for c, why in excluded[:10]]
        lines += [f"  ... and {len(excluded) - 10} more"] if len(excluded) > 10 else []
    lines.append(f"plan: budget {budget / 60:g} min of machine time, successive halving at rate {ETA}:")
    lines.append("  calibration: 1 trial of 1 epoch (an epoch's seconds, a trial's fixed costs)")
    lines += [f"  {s.name}: {s.trials} trial(s); {s.fidelity}" for s in plan]
    lines.append("  budget: the final's full-length trainings set aside first (their cost from the calibration's"
                 " epoch), the probes what their short spans take, the rest in equal parts to the search stages, a"
                 " stage's part shared by its trials; each trial's fixed costs (set-up, evaluations, records) come out"
                 " of its part")
    return lines


# -- fidelities ------------------------------------------------------------------------
def epochs_for(seconds: float, epoch_seconds: float, full: int) -> int:
    """As many epochs as `seconds` of training hold at `epoch_seconds` an epoch: 1 to `full`."""
    if epoch_seconds <= 0:
        return full
    return max(1, min(full, int(seconds // epoch_seconds)))


def predicted_epoch(calibration: dict, choice: dict, rows: list[dict] = ()) -> float:
    """An epoch's seconds of a choice not yet trained: from the latest trial of `rows` that
    differs from it in the layout alone where there is one (B, precision, framework, the
    optimizer and the rest as its own), else from the calibration's; a rank's share of an
    epoch is 1/P of its resample, so P_that / P_choice of that trial's seconds."""
    others = {k: encode(k, v) for k, v in choice.items() if k != "layouts"}
    for r in reversed(rows):
        if not r.get("fault") and r.get("train_seconds") and \
                all(r["choice"].get(k) == v for k, v in others.items()):
            return _epoch(r) * decode("layouts", r["choice"]["layouts"])[1] / choice["layouts"][1]
    return calibration["epoch_seconds"] * calibration["choice"]["layouts"][1] / choice["layouts"][1]


def promoted(rows: list[dict], keep: int) -> list[dict]:
    """The `keep` best rows by VFLOPS (ties: the earlier trial); faulted rows are not compared."""
    fine = [r for r in rows if not r.get("fault")]
    return sorted(fine, key=lambda r: (-r["vflops"], r["number"]))[:keep]


def reference(candidates: list[dict]) -> dict:
    """The probes' setting of the quality knobs: the candidate with the most ranks a model
    (the exchange weighs most there), of those the most ranks in all, the first of those."""
    return max(candidates, key=lambda c: (c["layouts"][1], c["layouts"][0] * c["layouts"][1]))


# -- the run ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Spec:
    """A trial to run: what rank 0 sends every rank."""
    number: int          # its test index, from 1
    stage: str           # calibration | probes | stage r | final
    choice: dict         # one value of every knob
    epochs: int
    seconds: float | None = None   # the training time it was given (None: one epoch, or the full length)

    def trial(self) -> dict:
        """TestResult.trial: what --verify rebuilds the trial's configuration from."""
        return {"number": self.number, "stage": self.stage, "epochs": self.epochs,
                "choice": {k: encode(k, v) for k, v in self.choice.items()}}


def grid(axes_: list[Axis]) -> dict:
    """The axes as an Optuna grid sampler's search space: {field: [encoded values]}."""
    return {a.field: [encode(a.field, v) for v in a.values] for a in axes_}


def proposed(trial, axes_: list[Axis]) -> dict:
    """The values a study's trial proposes for the axes, decoded: {field: value}."""
    return {a.field: decode(a.field, trial.suggest_categorical(a.field, grid([a])[a.field])) for a in axes_}


def choice_of(trial: dict) -> dict:
    """TestResult.trial's choice, decoded."""
    return {k: decode(k, v) for k, v in trial["choice"].items()}


@dataclass
class Tuning:
    """The tuning run's decisions (rank 0). `execute(spec)` runs a trial on every rank and
    returns its row's figures ({flops, quality, vflops, train_seconds, epochs_trained,
    wall_seconds, fault}); `done` {trial number: those figures} holds the trials of an earlier
    invocation (--resume), reused in order; `study(name, space)` makes or loads an Optuna
    study (studies); `said(line)` prints progress; `saved(state)` records the table as it grows."""
    cfg: dat.Config
    budget: float                       # s of machine time
    world_size: int
    n_train: int
    execute: object
    study: object
    said: object = print
    saved: object = lambda state: None   # noqa: E731
    done: dict = field(default_factory=dict)
    rows: list = field(default_factory=list)
    picks: dict = field(default_factory=dict)   # the speed knobs' winning values
    best: dict | None = None
    planned: int = 0

    # the trials --------------------------------------------------------------------
    def _run(self, spec: Spec) -> dict:
        before = self.done.get(spec.number)
        if before is not None and any(before.get(k) != v for k, v in spec.trial().items() if k != "stage"):
            raise TuneError(f"--resume: trial {spec.number} was recorded as {label(choice_of(before))},"
                            f" {before.get('epochs')} epochs, the search now makes it {label(spec.choice)},"
                            f" {spec.epochs} epochs: the run's record is not this search's")
        got = before if before is not None else self.execute(spec)
        row = {**spec.trial(), "seconds": spec.seconds, "estimate": spec.epochs < self.cfg.epochs,
               "outcome": "", **{k: got.get(k) for k in ("flops", "quality", "vflops", "train_seconds",
                                                         "epochs_trained", "wall_seconds", "fault")}}
        self.rows.append(row)
        self.said(self.progress(row))
        self.saved(self.state())
        return row

    def _trial(self, stage: str, choice: dict, epochs: int, seconds: float | None = None) -> dict | None:
        """A trial's row; a faulted one is run once more as a new trial (None: that faulted too,
        left out). A faulted row is never compared (promoted)."""
        row = self._run(Spec(len(self.rows) + 1, stage, choice, epochs, seconds))
        if not row["fault"]:
            return row
        self.planned += 1
        again = self._run(Spec(len(self.rows) + 1, stage, choice, epochs, seconds))
        row["outcome"] = f"fault: run again as trial {again['number']}"
        if again["fault"]:
            again["outcome"] = "fault again: left out"
            return None
        return again

    def _stage(self, what: str) -> None:
        """A stage's progress line, as it begins."""
        self.said(f"tune: {what}; budget left {span(self.budget - self.spent())}")

    def spent(self) -> float:
        return sum(r["wall_seconds"] or 0.0 for r in self.rows)

    def progress(self, row: dict) -> str:
        """The progress line of a trial: k of n, its stage and length, the best so far, the budget left."""
        best = results.best_trial(self.rows)
        fig = "fault: " + row["fault"] if row["fault"] else f"VFLOPS {row['vflops'] / 1e12:.3e} T"
        return (f"tune: trial {row['number']} of {self.planned} ({row['stage']}, {row['epochs']} of"
                f" {self.cfg.epochs} epochs): {fig}; best so far"
                f" {'trial %d, %.3e T' % (best['number'], best['vflops'] / 1e12) if best else 'none'};"
                f" budget left {(self.budget - self.spent()) / 60:.1f} min")

    def state(self) -> dict:
        """results.json's `tuning` as it stands (the plan and budget tune.start recorded)."""
        return {"trials": self.rows, "picks": {k: encode(k, v) for k, v in self.picks.items()},
                "best": self.best and self.best["number"], "spent_seconds": self.spent(), "planned": self.planned}

    def _fits(self, choice: dict) -> bool:
        return problem(self.cfg, choice, self.world_size, self.n_train) is None

    # the search ---------------------------------------------------------------------
    def run(self) -> dict | None:
        """Calibration, probes, successive halving, the final: the best finalist's row (None
        when no finalist finished). TuneError when the calibration shows that the budget
        cannot hold the plan."""
        cfg = self.cfg
        speed, runnable_q, _ = survey(cfg, self.world_size, self.n_train)
        plan = stages(len(speed), len(runnable_q), cfg.epochs)
        self.planned = planned_trials(plan)
        ref = reference(runnable_q)
        calib = self._trial("calibration", {**ref, **speed[0]}, 1)   # survey: every probe's setting can run
        if calib is None:
            return None
        calib["outcome"] = "calibration"
        cal = {"choice": choice_of(calib), "epoch_seconds": _epoch(calib) or 0.0,
               "overhead": max(0.0, calib["wall_seconds"] - calib["train_seconds"])}
        search = [s for s in plan if s.name not in ("probes", "final")]
        why = short_budget(self.budget - self.spent(), plan, cal, [{**q, **speed[0]} for q in runnable_q], cfg.epochs)
        if why:
            raise TuneError(why)
        self.picks = self._probes(ref, speed, cal) if len(speed) > 1 else speed[0]
        candidates = [{**q, **self.picks} for q in runnable_q if self._fits({**q, **self.picks})]
        return self._halving(search, plan[-1], candidates, cal)

    def _probes(self, ref: dict, speed: list[dict], cal: dict) -> dict:
        """Every speed combination on the reference setting, each trained PROBE_SECONDS at
        least (as many epochs as the calibration says they take): the highest FLOPS."""
        epochs = max(1, min(self.cfg.epochs, math.ceil(PROBE_MARGIN * PROBE_SECONDS / max(cal["epoch_seconds"], 1e-9))))
        self._stage(f"probes: {len(speed)} speed settings on {label(ref, [a.field for a in varied(self.cfg, 'quality')])},"
                    f" {epochs} epoch(s) each (>= {PROBE_SECONDS:g} s of training at the calibration's epoch)")
        axes_ = varied(self.cfg, "speed")
        study = self.study("speed", grid(axes_))
        rows = []
        for _ in range(math.prod(len(a.values) for a in axes_)):   # in the order the study proposes them
            trial = study.ask()
            s = proposed(trial, axes_)
            s = next((x for x in speed if all(x[k] == v for k, v in s.items())), None)   # None: cannot run
            row = self._trial("probes", {**ref, **s}, epochs) if s and self._fits({**ref, **s}) else None
            if row is None:
                study.tell(trial, state=_failed())
                continue
            row["outcome"] = "probe"
            study.tell(trial, row["flops"])
            rows.append((row, s))
        if not rows:
            raise TuneError("--tune: no speed probe finished (see the tuning table): nothing to pick from")
        best_row, best = max(rows, key=lambda rs: (rs[0]["flops"], -rs[0]["number"]))
        best_row["outcome"] = "speed pick (highest FLOPS)"
        return best

    def _entrants(self, study, candidates: list[dict]) -> tuple[list[dict], dict]:
        """Stage 1's candidates in the order the study's seeded grid proposes them, and their
        study trials; the grid's combinations that cannot run (or repeat one) told failed."""
        axes_ = varied(self.cfg, "quality")
        runnable = {label(c): c for c in candidates}
        entrants, live = [], {}
        for _ in range(math.prod(len(a.values) for a in axes_)):
            if len(entrants) == len(candidates):
                break
            trial = study.ask()
            key = label({**candidates[0], **proposed(trial, axes_)})
            if key not in runnable or key in live:
                study.tell(trial, state=_failed())
                continue
            entrants.append(runnable[key])
            live[key] = trial
        return entrants, live

    def _halving(self, search: list[Stage], final: Stage, candidates: list[dict], cal: dict) -> dict | None:
        """Successive halving over `candidates`, then the final (the best finalist's row)."""
        study = self.study("quality", grid(varied(self.cfg, "quality")))
        entrants, live = self._entrants(study, candidates)
        last: dict[str, dict] = {}    # label -> the candidate's latest row
        full = self.cfg.epochs
        for r, stage in enumerate(search):
            seconds = self._per_trial(search[r:], len(entrants), final.trials, entrants, last, cal)
            going_on = search[r + 1].trials if r + 1 < len(search) else final.trials
            self._stage(f"{stage.name} of {len(search)}: {len(entrants)} candidate(s), {seconds:.1f} s of training"
                        f" each (equal training time), the best {going_on} go on")
            rows = []
            for c in entrants:
                epoch_s = _epoch(last.get(label(c))) or predicted_epoch(cal, c, self.rows)
                row = self._trial(stage.name, c, epochs_for(seconds, epoch_s, full), seconds)
                if row is None:
                    study.tell(live.pop(label(c)), state=_failed())
                    continue
                last[label(c)] = row
                live[label(c)].report(row["vflops"], r)
                rows.append((row, c))
            keep = {row["number"] for row in promoted([row for row, _ in rows], going_on)}
            entrants = []
            for row, c in rows:
                if row["number"] in keep:
                    row["outcome"] = "promoted"
                    entrants.append(c)
                else:
                    row["outcome"] = f"pruned after {stage.name}"
                    study.tell(live.pop(label(c)), state=_pruned())
            self.saved(self.state())
        return self._final(study, entrants, live, last)

    def _final(self, study, entrants: list[dict], live: dict, last: dict) -> dict | None:
        """The finalists the full length (a finalist whose last trial trained it already is not
        trained again: that trial's VFLOPS is measured); the best by measured VFLOPS."""
        self._stage(f"final: {len(entrants)} finalist(s) at the full length, {self.cfg.epochs} epochs (line 15)")
        rows = []
        for c in entrants:
            before = last.get(label(c))
            row = before if before and before["epochs"] == self.cfg.epochs else self._trial("final", c, self.cfg.epochs)
            if row is None:
                study.tell(live.pop(label(c)), state=_failed())
                continue
            study.tell(live.pop(label(c)), row["vflops"])
            row["outcome"] = "finalist" if row["stage"] == "final" else f"finalist (full length in {row['stage']})"
            rows.append(row)
        if not rows:
            return None
        self.best = results.best_trial(rows)
        self.best["outcome"] = "best: the tuned file's"
        self.planned = len(self.rows)   # the trials it made: a finalist not trained again, a fault run again
        self.saved(self.state())
        return self.best

    def _per_trial(self, stages_left: list[Stage], n: int, n_final: int, entrants: list[dict], last: dict,
                   cal: dict) -> float:
        """s of training each trial of this stage gets: the budget left, less the final's
        full-length trainings (the n_final slowest of the entrants), split equally among the
        search stages left, this stage's part among its n trials, less a trial's fixed costs."""
        final = final_cost(entrants, last, cal, self.cfg.epochs, n_final, self.rows)
        share = (self.budget - self.spent() - final) / len(stages_left)
        return max(0.0, share / max(1, n) - cal["overhead"])


def _epoch(row: dict | None) -> float | None:
    """An epoch's seconds measured by a row (None: none)."""
    return row["train_seconds"] / max(1, row["epochs_trained"]) if row and row.get("train_seconds") else None


def final_cost(entrants: list[dict], last: dict, cal: dict, epochs: int, n_final: int, rows: list[dict] = ()) -> float:
    """s the final may take: the n_final costliest full-length trainings among the entrants
    (an epoch's seconds measured where a candidate has trained, else predicted from `rows`),
    each with a trial's fixed costs."""
    cost = sorted(epochs * (_epoch(last.get(label(c))) or predicted_epoch(cal, c, rows)) + cal["overhead"]
                  for c in entrants)
    return sum(cost[-n_final:]) if n_final else 0.0


def short_budget(left: float, plan: tuple[Stage, ...], cal: dict, candidates: list[dict], epochs: int) -> str | None:
    """Why the budget left after the calibration cannot hold the plan, by how much, or None:
    the final's full-length trainings and every other planned trial of one epoch (a probe:
    PROBE_SECONDS), each with a trial's fixed costs, as the calibration measured them."""
    final = final_cost(candidates, {}, cal, epochs, plan[-1].trials)
    one = sorted(predicted_epoch(cal, c) for c in candidates)
    probes = sum(s.trials for s in plan if s.name == "probes") * (max(PROBE_SECONDS, cal["epoch_seconds"])
                                                                   + cal["overhead"])
    search = sum(s.trials for s in plan if s.name.startswith("stage")) * (one[len(one) // 2] + cal["overhead"])
    need = final + probes + search
    if left >= need:
        return None
    return (f"--tune: found {span(left)} of the budget left after the calibration, expected at least"
            f" {span(need)}: the final's {plan[-1].trials} full-length training(s) {span(final)}, the probes"
            f" {span(probes)}, the search stages' trials of one epoch {span(search)} (the calibration's"
            f" {cal['epoch_seconds']:.2f} s an epoch, {cal['overhead']:.1f} s a trial's fixed costs): {span(need - left)}"
            " more, or fewer values on the lines that list several")


def span(seconds: float) -> str:
    """Machine time in words: seconds, and minutes from one on (two close figures must read apart)."""
    return f"{seconds / 60:.1f} min ({seconds:.0f} s)" if seconds >= 60 else f"{seconds:.0f} s"


def _failed():
    import optuna
    return optuna.trial.TrialState.FAIL


def _pruned():
    import optuna
    return optuna.trial.TrialState.PRUNED


# -- Optuna, rank 0 ----------------------------------------------------------------------
class Study:
    """An Optuna study as the search asks it: where the study was stored by an invocation
    before (--resume), its trials are handed out again in their order, those finished as
    they ended (their report and tell do nothing), a running one to go on; then new ones."""

    def __init__(self, study):
        self.study = study
        self.stored = sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)
        self.at = 0

    def ask(self):
        import optuna
        if self.at < len(self.stored):
            frozen = self.stored[self.at]
            self.at += 1
            if frozen.state == optuna.trial.TrialState.RUNNING:
                return _Going(optuna.trial.Trial(self.study, frozen._trial_id), set(frozen.intermediate_values))
            return _Ended(frozen)
        return self.study.ask()

    def tell(self, trial, value=None, state=None):
        if isinstance(trial, _Going):
            trial = trial.trial
        if not isinstance(trial, _Ended):
            self.study.tell(trial, value, state=state)


@dataclass(frozen=True)
class _Going:
    """A stored trial still running when its invocation stopped: it goes on; the stages it
    reported then are not reported again (Optuna would warn)."""
    trial: object
    reported: set

    def suggest_categorical(self, name, choices):
        return self.trial.suggest_categorical(name, choices)

    def report(self, value, step):
        if step not in self.reported:
            self.trial.report(value, step)


@dataclass(frozen=True)
class _Ended:
    """A stored trial that had ended: its parameters as proposed then."""
    frozen: object

    def suggest_categorical(self, name, choices):
        return self.frozen.params[name]

    def report(self, value, step):
        pass


def studies(run_dir: str, seed: int):
    """study(name, space) for Tuning: an Optuna study of the run folder's journal (made, or
    loaded to go on), maximising, its grid sampler seeded with line 29's seed."""
    import os

    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend
    optuna.logging.set_verbosity(optuna.logging.ERROR)   # its INFO line a trial would bury the report
    storage = JournalStorage(JournalFileBackend(os.path.join(run_dir, JOURNAL)))

    class Grid(optuna.samplers.GridSampler):
        """The grid sampler without its stop once every point was proposed: Study.stop ends an
        optimize loop, and raises where trials are asked and told, as here."""

        def after_trial(self, study, trial, state, values):
            pass

    def study(name: str, space: dict) -> Study:
        return Study(optuna.create_study(study_name=name, storage=storage, direction="maximize", load_if_exists=True,
                                         sampler=Grid(space, seed=seed)))
    return study


# -- what it writes ---------------------------------------------------------------------
def table_lines(cfg: dat.Config, rows: list[dict]) -> list[str]:
    """The tuning table: every trial, its stage, its training, its figures and what became of it."""
    fields = [a.field for a in varied(cfg)]
    head = (f"{'Trial':>5} {'Stage':<11} {'Epochs':>6} {'Train s':>8} {'Wall s':>7} {'Tflops':>11} {'Quality':>8}"
            f" {'VTflops':>10} {'VFLOPS is':<9} {'Outcome':<34} Settings")
    out = [head]
    for r in rows:
        fig = (lambda key, fmt: "-" if r.get(key) is None else format(r[key], fmt))  # noqa: E731
        tf = "-" if r.get("flops") is None else f"{r['flops'] / 1e12:.4e}"
        vt = "-" if r.get("vflops") is None else f"{r['vflops'] / 1e12:.3e}"
        kind = "-" if r.get("fault") else "estimate" if r["estimate"] else "measured"
        out.append(f"{r['number']:>5} {r['stage']:<11} {r['epochs']:>6} {fig('train_seconds', '.2f'):>8}"
                   f" {fig('wall_seconds', '.1f'):>7} {tf:>11} {fig('quality', '.4f'):>8} {vt:>10} {kind:<9}"
                   f" {r['outcome'] or '-':<34} {label(choice_of(r), fields)}")
    return out


def table_text(cfg: dat.Config, rows: list[dict]) -> str:
    """tuning.txt: the table and its legend (the driver writes it, --verify renders it again)."""
    return "\n".join(table_lines(cfg, rows) + [TABLE_LEGEND]) + "\n"


def pick(tuning: dict) -> dict | None:
    """A tuning record's best finalist's row, the tuned file's (None: none yet)."""
    return next((r for r in tuning["trials"] if r["number"] == tuning.get("best")), None)


TABLE_LEGEND = ("VFLOPS is: estimate, a trial shorter than the input's recipe (its quality that of a compressed"
                " schedule: an estimate of the full training's); measured, a trial of the full length. Pruned"
                f" after a stage: not among its best 1/{ETA} by VFLOPS; a fault: not compared, run again once."
                " Train s: the timed span; Wall s: the whole trial (set-up, warm-up, evaluations, records).")


def tuned_text(cfg: dat.Config, best: dict, how: str) -> str:
    """The input file with the best trial's values, one value a line, its two title lines
    saying how it was found (`how`): an ordinary HPCAI500.dat, ready for a ranking run with
    the input's repetitions (line 27)."""
    choice = choice_of(best)
    alts = dict(cfg.alternatives)
    lines = cfg.text.split("\n")

    def put(n: int, values: list[str], old: int) -> None:
        toks = lines[n - 1].split()
        lines[n - 1] = f"{' '.join(values):<13} {' '.join(toks[old:])}".rstrip()
    m, p = choice["layouts"]
    counts = {9: len(cfg.layouts), 13: len(cfg.batch_sizes), 16: len(cfg.precisions), 34: len(cfg.frameworks),
              36: len(cfg.modes)}
    for n, old in counts.items():
        put(n, ["1"], 1)
        put(n + 1, [str(m) if n == 9 else str({13: choice["batch_sizes"], 16: choice["precisions"],
                                                   34: choice["frameworks"], 36: choice["modes"]}.get(n, ""))],
            old)
    put(11, [str(p)], len(cfg.layouts))
    for name in dat.SINGLE:
        n = dat.KNOBS[name][0]
        old = len(alts.get(name, (None,)))
        value = choice.get(name, getattr(cfg, name))
        keep = name == "staging" and value != "none" and cfg.staging_keep
        old += name == "staging" and cfg.staging_keep
        put(n, [dat._token(value)] + (["keep"] if keep else []), old)
    lines[0], lines[1] = how.split("\n", 1)
    return "\n".join(lines)


# -- the record ---------------------------------------------------------------------------
def planned_trials(plan: tuple[Stage, ...]) -> int:
    """The trials the plan makes: the calibration and every stage's (faulted ones run again add to it)."""
    return 1 + sum(s.trials for s in plan)


def outside(cfg: dat.Config, choice: dict) -> list[str]:
    """The knobs of a choice whose value the input does not list (--verify): [] for one of its space."""
    listed = {a.field: a.values for a in axes(cfg)}
    return [f"{k} {encode(k, v)}" for k, v in choice.items() if v not in listed.get(k, ())]


def start(budget: float, plan: tuple[Stage, ...]) -> dict:
    """results.json's `tuning` as a tuning run begins."""
    return {"budget_seconds": budget, "eta": ETA, "probe_seconds": PROBE_SECONDS,
            "plan": [{"name": s.name, "trials": s.trials, "fidelity": s.fidelity}
                     for s in plan],
            "trials": [], "picks": {}, "best": None, "spent_seconds": 0.0, "planned": planned_trials(plan),
            "tuned": None}


def param_lines(tuning: dict) -> list[str]:
    """The report's parameter lines of a tuning run."""
    stages = "; ".join(f"{s['name']} {s['trials']}" for s in tuning["plan"])
    return [f"TUNE    : a tuning run (--tune {tuning['budget_seconds'] / 60:g}): its tests are trials, each a setting"
            f" of the input's search space; successive halving at rate {tuning['eta']}; trials: calibration 1;"
            f" {stages} (harness/tune.py)"]


def done(previous) -> dict:
    """{trial number: its row} of the run resumed (--resume): the trials it finished, each
    as its table recorded it (a trial recorded as a test but not yet in the table: its
    figures from the test, its wall time its training's)."""
    if previous is None or previous.tuning is None:
        return {}
    rows = {r["number"]: r for r in previous.tuning.get("trials", [])}
    for t in previous.tests:
        if t.trial and t.trial["number"] not in rows:
            rows[t.trial["number"]] = {**t.trial, "flops": t.flops, "quality": t.quality, "vflops": t.vflops,
                                       "train_seconds": t.train_seconds, "epochs_trained": t.epochs_trained,
                                       "wall_seconds": t.train_seconds, "fault": None}
    return rows
