"""The whole run's residual check, like HPL's: `python hpcai500.py --verify runs/<id>`.

A reader of a report must be able to tell that every figure in it follows from what
was measured, by the stated rules, and that nothing was edited afterwards. This module
re-derives every figure of report.txt from results.json and the MLLOG files, without
MPI and without TensorFlow, and prints one line per check, PASSED or FAILED with the
figure and both values (the recorded one and the re-derived one), then the counts.

    input        the recorded text's SHA-256; the input file, if still there, the same;
                 the recorded configuration = the text parsed again; the settings valid
    FLOPs        forward FLOPs per sample = sum of flops.rule over the recorded layer
                 records (`model_layers`), training = 3 x forward, by operator
    figures      per test: samples, total FLOPs, FLOPS, penalty, VFLOPS, utilisation,
                 time to solution, VFLOPS per watt, intensity, consistency verdict:
                 the arithmetic of run.measure again (relative tolerance 1e-9)
    repetitions  the summaries (metrics.repeats) and the scaling lines
    report.txt   re-rendered with report.py's own functions, compared line by line
    MLLOG        every base model's file exists and passes the MLPerf HPC checker
                 (harness.mllog.check); its seed, batch and qualities are results.json's
    division     each test judged again (harness/division.judge) from the recorded
                 configuration, settings, model deviations and data facts; the data
                 facts are the test's sample counts and its workload's conventions line
    exchange     each job's gradient exchange: lines 21-22 and the torus's grid drawn
                 again from the recorded node map (harness/communication.py)
    test runs    finished = planned for a complete run (<= for one that stopped early)

Pure functions over a loaded run (`Run`); the file reading (and the MLLOG checker,
which reads its files) is in `load`, the printing in `main`. Exit status (EXIT): 0 only
if every check passes on a complete run; 1 a check failed (or not a run); 2 every check
passed, but the run is not complete (running, interrupted, stopped on an error, dead):
its finished test runs verify, but they are not a whole result to submit.
"""
from __future__ import annotations

import json
import math
import os
import statistics
import sys
from collections import Counter
from dataclasses import dataclass, replace

from harness import (communication, dat, division, elastic, flops, frameworks, heartbeat, metrics, mllog, parallelism,
                     relaunch, report, results, settings, telemetry, topology, train, tune, workloads)
from harness.errors import say

REL = 1e-9   # the same arithmetic on the same numbers: only the order of additions may differ
MAX_DIFFS = 5  # report.txt lines shown per block that differs
MLLOG_TOKEN = ":::MLLOG "
# the exit status per outcome (README): a failed check wins over an incomplete run, which is
# still checked as far as it got; 1 is also every command's error (not a run)
EXIT = {"PASSED": 0, "FAILED": 1, "INCOMPLETE": 2}


class NotARun(ValueError):
    """The folder is not a run this version can verify; the message says why."""


@dataclass(frozen=True)
class Check:
    """One check: what was compared, whether it holds, the recorded and re-derived values."""
    what: str
    ok: bool
    recorded: object = None
    derived: object = None
    note: str = ""

    def line(self) -> str:
        values = "" if self.recorded is None and self.derived is None else \
            f"recorded {_show(self.recorded)}, re-derived {_show(self.derived)}"
        body = "; ".join(p for p in (values, self.note) if p)
        return f"{self.what}{': ' + body if body else ''} ...... {'PASSED' if self.ok else 'FAILED'}"


@dataclass(frozen=True)
class Run:
    """A run folder as read from disk: everything the checks need, no file handles."""
    dir: str
    res: results.Record             # results.json
    report: str | None              # report.txt (None: missing)
    input_file: dict                # path, found (bool), text or error
    mllogs: dict                    # file name -> {"messages": [...], "lines": [...]} or None if missing
    tuned: dict | None = None       # a tuning run's written files (tune.TUNED, tune.TABLE): name -> text (None: missing)


# -- reading (the I/O edge) --------------------------------------------------------------
def load(run_dir: str, checker=None) -> Run:
    """Read a run folder; NotARun if it is not one. `checker(path) -> [messages]` checks
    one MLLOG file (default harness.mllog.check)."""
    try:
        res = results.load_run(run_dir)
    except ValueError as e:   # not a run folder, another major schema, not a results record: it names what
        raise NotARun(str(e)) from None
    try:
        with open(os.path.join(run_dir, "report.txt"), encoding="utf-8") as f:
            text = f.read()
    except OSError:
        text = None
    checker = checker or mllog.check
    mllogs = {}
    for name in expected_mllogs(res):
        p = os.path.join(run_dir, "mllog", name)
        if not os.path.isfile(p):
            mllogs[name] = None
            continue
        try:
            with open(p, encoding="utf-8") as f:
                lines = f.read().splitlines()
            messages = list(checker(p))
        except Exception as e:  # noqa: BLE001 - an unreadable log or a checker crash fails the check
            lines, messages = [], [f"{type(e).__name__}: {e}"]
        mllogs[name] = {"messages": messages, "lines": lines}
    tuned = None
    if res.tuning is not None:
        tuned = {name: _text(os.path.join(run_dir, name)) for name in (res.tuning.get("tuned"), tune.TABLE) if name}
    return Run(run_dir, res, text, _read_input(res.input.get("path")), mllogs, tuned)


def _text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return None


def _read_input(path) -> dict:
    """The input file at the recorded path (relative: from the current directory), as the
    driver reads it (UTF-8, without a byte-order mark)."""
    if not path or not os.path.isfile(path):
        return {"path": path, "found": False}
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8").removeprefix("\ufeff")
    except (OSError, UnicodeDecodeError) as e:
        return {"path": path, "found": True, "error": str(e)}
    return {"path": path, "found": True, "text": text}


def expected_mllogs(res: results.Record) -> list[str]:
    """The MLLOG file of every base model of every finished test and repetition."""
    return [mllog.filename(t.index, t.repetition, j) for t in res.tests for j in range(t.M)]


# -- the checks (pure) ----------------------------------------------------------------------
def verify(run: Run) -> list[Check]:
    """Every check of the run, in order: input, configuration, each test, repetitions,
    scaling, report.txt, MLLOG."""
    res = run.res
    checks = input_checks(res.input, run.input_file)
    cfg, more = configuration(res)
    checks += more
    checks += _guarded("settings", lambda: (settings_checks(res.settings), None))[0]
    checks += _guarded("roofline", lambda: (roofline_checks(res.roofline), None))[0]
    checks += _guarded("conventions", lambda: (conventions_checks(res.conventions, cfg, res.roofline, res.schema),
                                               None))[0]
    derived = []
    for t in res.tests:
        c, d = _guarded(_name(t), lambda t=t: test_checks(t, cfg, res))
        checks += c
        derived.append(d)
    checks.append(count_check(res))
    if res.tuning is not None:
        checks += _guarded("tuning", lambda: (tuning_checks(res, cfg, run.tuned or {}), None))[0]
    checks += _guarded("repetition summaries", lambda: (repeats_checks(res, cfg), None))[0]
    checks += _guarded("scaling", lambda: (scaling_checks(res.tests, derived, run.report, res.schema), None))[0]
    checks += _guarded("report.txt", lambda: (report_checks(res, cfg, run.report), None))[0]
    for t in res.tests:
        checks += _guarded(f"MLLOG of {_name(t)}", lambda t=t: (mllog_checks([t], run.mllogs), None))[0]
    return checks


def _guarded(what, fn):
    """fn() -> (checks, value); a record missing a key or of the wrong type is a failed
    check naming it, not a crash of the verifier."""
    try:
        return fn()
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, ZeroDivisionError) as e:
        detail = f"missing key {e}" if isinstance(e, KeyError) else f"{type(e).__name__}: {e}"
        return [Check(what, False, note=f"cannot be re-derived from results.json ({detail})")], None


def input_checks(recorded: dict, found: dict) -> list[Check]:
    text, sha = recorded.get("text"), recorded.get("sha256")
    digest = results.sha256(text) if isinstance(text, str) else None
    out = [Check("input: SHA-256 of the recorded input text", digest is not None and digest == sha, sha, digest)]
    path = found["path"]
    if not found["found"]:
        out.append(Check(f"input file {path}", True, note="not found from here: its text is the recorded one"
                                                          " only (not compared)"))
    elif "error" in found:
        out.append(Check(f"input file {path}", False, note=f"unreadable: {found['error']}"))
    else:
        now = results.sha256(found["text"])
        out.append(Check(f"input file {path}: SHA-256", now == sha, sha, now,
                         note="" if now == sha else "the input file changed since the run"))
    return out


def configuration(res: results.Record):
    """(cfg, checks): the configuration parsed again from the recorded input text, and
    whether it is the recorded one. If the text does not parse, the recorded one."""
    text, path = res.input.get("text", ""), res.input.get("path", "HPCAI500.dat")
    recorded = res.config
    try:
        cfg = dat.parse_text(text, path, tune=res.tuning is not None)
    except dat.DatError as e:
        try:
            cfg = dat.from_record(text, recorded)
        except (TypeError, ValueError) as te:
            raise NotARun(f"results.json: neither the input text ({e}) nor the recorded configuration ({te})"
                          " can be read") from None
        return cfg, [Check("configuration: the recorded input parses", False, note=str(e))]
    mine = dat.record(cfg)
    diff = sorted(k for k in set(mine) | set(recorded) if mine.get(k) != recorded.get(k))
    return cfg, [Check("configuration = the recorded input parsed again", not diff,
                       {k: recorded.get(k) for k in diff} or None, {k: mine.get(k) for k in diff} or None,
                       note=f"{len(mine)} parameters" if not diff else "differs: " + ", ".join(diff))]


def settings_checks(values: dict) -> list[Check]:
    try:
        settings.read(dict(values))
    except (settings.SettingError, TypeError, AttributeError) as e:
        return [Check("settings: each recorded HPCAI500_* setting is known and valid", False, note=str(e))]
    return [Check("settings: each recorded HPCAI500_* setting is known and valid", True,
                  note=", ".join(f"{k}={v}" for k, v in values.items()) or "none set")]


def roofline_checks(roofline: dict) -> list[Check]:
    """The conventions' roofline ceilings are the medians over ranks of the per-rank figures."""
    out = []
    for prec, c in roofline.items():
        per_rank = [r for r in c["per_rank"] if r is not None]   # None: a rank lost in the roofline
        for key, fig in (("gemm_flops", lambda r: r["gemm"]["flops"]), ("conv_flops", lambda r: r["conv"]["flops"]),
                         ("bandwidth", lambda r: r["stream"]["bandwidth"])):
            out.append(_num(f"roofline {prec}: {key} (median over {len(per_rank)} ranks)", c[key],
                            statistics.median(fig(r) for r in per_rank)))
    return out


def conventions_checks(conv: list, cfg, roofline: dict, schema: str) -> list[Check]:
    """The conventions block states the FLOP rules, the options of this input and the
    roofline figures that the run recorded (the device and FLOP-note lines are facts of
    the run that results.json holds only there), as results schema `schema` stated them."""
    want = [flops.CONVENTION, *[ln for c in roofline.values() for ln in report.roofline_lines(c)],
            *report.run_lines(cfg)]
    missing = [ln for ln in want if ln not in conv]
    for name in cfg.frameworks:   # each framework's lines, as stated for one of the builds it may have had
        stated = frameworks.facts(name).stated(cfg, results.minor(schema))
        if not any(all(ln in conv for ln in lines) for lines in stated):
            missing += [ln for ln in stated[0] if ln not in conv]
    return [Check("conventions: the FLOP rule, the options and the roofline lines", not missing,
                  note="all stated" if not missing else "missing: " + " | ".join(missing))]


def _name(t: results.TestResult) -> str:
    return f"test {t.index} rep {t.repetition}"


def test_checks(t: results.TestResult, cfg, res: results.Record) -> tuple[list[Check], dict | None]:
    """Every figure of one test (one repetition) re-derived: (checks, derived figures).
    Each group is guarded apart, so that a missing key fails its group only."""
    name = _name(t)
    if t.trial:   # a tuning run's trial: the input with its setting and length (tune.configure)
        cfg = tune.configure(cfg, tune.choice_of(t.trial), t.trial["epochs"])
    out = _guarded(f"{name}: sweep", lambda: ([_sweep_check(t, cfg)], None))[0]
    more, training = _guarded(f"{name}: FLOPs per sample", lambda: flops_checks(t))
    out += more
    if training is None:   # still check the rest, from the recorded figure
        training = t.training_flops_per_sample
    more, derived = _guarded(f"{name}: figures", lambda: figure_checks(t, cfg, res, training))
    out += more
    resumed = bool(res.resumed)
    out += _guarded(f"{name}: division",
                    lambda: ([division_check(t, cfg, res.settings, resumed, res.schema)], None))[0]
    out += _guarded(f"{name}: data facts", lambda: ([data_facts_check(t, res.conventions, res.schema)], None))[0]
    out += _guarded(f"{name}: exchange", lambda: ([exchange_check(t, cfg, res)], None))[0]
    out += _guarded(f"{name}: pipeline", lambda: ([pipeline_check(t)], None))[0]
    out += _guarded(f"{name}: other load", lambda: (other_load_checks(t, res), None))[0]
    return out, derived


def other_load_checks(t: results.TestResult, res: results.Record) -> list[Check]:
    """Per machine, the other processes' cores = its busy cores - the ranks' (telemetry.
    other_cores), its ranks those of the recorded node map there; the test carries the
    warning of every machine over the limit (telemetry.other_load_warnings)."""
    name = _name(t)
    if not t.other_load and results.minor(res.schema) < (2, 5):
        return [Check(f"{name}: other load", True, note=f"not recorded: results schema {res.schema}")]
    out = [_num(f"{name}: other load on {', '.join(m['hosts'])} (busy cores - the ranks' cores)", m["other_cores"],
                telemetry.other_cores(m["busy_cores"], m["ranks_cores"])) for m in t.other_load]
    env = results.node_map(res.environment, res.node_maps, t.invocation)
    machine_of_node = topology.machine_of_each_node(env.get("machine_of_node") or (), len(env.get("hosts") or []))
    recorded = sorted(m["ranks"] for m in t.other_load)
    node_of_rank = env.get("node_of_rank") or []
    # no record came from them (harness/elastic.py); one lost in a wave of retrain gave the test's
    lost = {r for x in t.losses if not x.get("wave") for r in x["ranks"]}
    derived = sorted(Counter(machine_of_node[node_of_rank[r]] for r in _launch_ranks(t)
                             if r not in lost).values())
    out.append(Check(f"{name}: ranks counted per machine (the node map)", recorded == derived, recorded, derived))
    want = telemetry.other_load_warnings(t.other_load)
    out.append(Check(f"{name}: other-load warnings ({len(want)}, over {telemetry.OTHER_LOAD_LIMIT:g} core a rank)",
                     all(w in t.warnings for w in want)
                     and not [w for w in t.warnings if w.startswith(telemetry.OTHER_LOAD_WARNING) and w not in want],
                     None, None))
    return out


def _launch_ranks(t: results.TestResult) -> list[int]:
    """The launch rank of each rank of the test's world (its jobs' ranks and its idle ones):
    the node map (its invocation's node_of_rank: results.node_map) numbers the launch's ranks, a test after a loss of
    ranks its survivors (harness/elastic.py); recorded only then, the launch's own otherwise."""
    if t.launch_ranks is not None:
        return t.launch_ranks
    return list(range(sum(len(job) for job in t.jobs) + len(t.idle_ranks)))


def _trained_by(t: results.TestResult) -> dict[int, list[int]]:
    """The launch ranks that trained each base model kept, by job: its job's in the test's
    world, or the wave's that trained it again (TestResult.retrained)."""
    launch, again = _launch_ranks(t), {r["job"]: r["ranks"] for r in t.retrained}
    return {j: again.get(j) or [launch[r] for r in ranks] for j, ranks in enumerate(t.jobs) if j not in t.jobs_lost}


def _passes(t: results.TestResult) -> list[list[dict]]:
    """The evaluation curve by pass: the test as laid out, then each wave of retrain."""
    waves = max((p.get("wave", 0) for p in t.evaluations), default=0)
    return [[p for p in t.evaluations if p.get("wave", 0) == w] for w in range(waves + 1)]


def _epochs_by_job(t: results.TestResult) -> list[int]:
    """The epochs each kept model trained, in job order: its pass's last evaluation's (every
    pass evaluates after its last epoch, train.evaluation_epochs)."""
    passes, wave = _passes(t), {r["job"]: r["wave"] for r in t.retrained}
    return [passes[wave.get(j, 0)][-1]["epoch"] for j in range(t.M) if j not in t.jobs_lost]


def pipeline_check(t: results.TestResult) -> Check:
    """A split mode's pipeline figures that follow from the mode and the recorded cut: the
    resolved mode, the schedule's theoretical bubble, the bytes between stages; a test of
    data parallelism records none."""
    what = f"{_name(t)}: pipeline (line 37: the mode resolved, the bubble's theory, bytes between stages of the cut)"
    if t.mode == "data":
        return Check(what, t.pipeline is None, t.pipeline, None, note="data parallelism: none")
    r = parallelism.resolve(parallelism.parse(t.mode), t.P, t.B)
    p = t.pipeline or {}
    cut = [parallelism.Stage.of(c) for c in p.get("cut", [])]
    want = {"stages": r.stages, "replicas": r.replicas, "microbatches": r.microbatches, "schedule": r.schedule,
            "microbatch": r.microbatch, "bubble_theory": parallelism.bubble(r.stages, r.microbatches),
            "bytes_between_stages": parallelism.step_bytes(cut, r)}
    diff = {k: v for k, v in want.items() if p.get(k) != v}
    return Check(what, not diff and len(cut) == r.stages, {k: p.get(k) for k in diff} or None, diff or None)


def exchange_check(t: results.TestResult, cfg, res: results.Record) -> Check:
    """Each job's recorded exchange is what lines 21-22 make of a job of P ranks, its torus
    grid drawn again from the recorded node of each rank (communication.grid), carried by
    one of the libraries its framework can report (its facts' carriers)."""
    what = f"{_name(t)}: each job's exchange (lines 21-22 and 37, the torus grid from the node map)"
    if not t.exchange and results.minor(res.schema) < (2, 4):
        return Check(what, True, note=f"not recorded: results schema {res.schema}")
    nodes = results.node_map(res.environment, res.node_maps, t.invocation).get("node_of_rank")
    derived, split = [], t.mode != "data" and parallelism.resolve(parallelism.parse(t.mode), t.P, t.B)
    fw = frameworks.facts(t.framework)
    for ranks in _trained_by(t).values():
        grid = communication.job_grid(ranks, nodes) if cfg.allreduce == "torus" else None
        derived.append(sorted({communication.split_exchange(cfg.comm_precision, cfg.allreduce, split.stages,
                                                            split.replicas, carrier) if split else
                               communication.exchange(cfg.comm_precision, cfg.allreduce, len(ranks), grid, carrier,
                                                      fw.RING)
                               for carrier in fw.carriers(cfg.allreduce)}))
    ok = len(t.exchange) == len(derived) and all(e in d for e, d in zip(t.exchange, derived))
    return Check(what, ok, None if ok else t.exchange, None if ok else derived,
                 note=f"{len(derived)} job(s)" if ok else "")


def flops_checks(t: results.TestResult) -> tuple[list[Check], int]:
    """FLOPs per sample from the recorded layer records and Table 3's rules (flops.rule)."""
    name = _name(t)
    if not t.model_layers:   # a 2.0 file: no layer records to re-derive from
        raise KeyError("model_layers")
    by_op = flops.by_operator(t.model_layers)
    forward = sum(by_op.values())
    training = (1 + flops.BACKWARD_FACTOR) * forward
    return [_num(f"{name}: forward FLOPs per sample (sum of flops.rule over {len(t.model_layers)} layer"
                 " records)", t.forward_flops_per_sample, forward),
            _num(f"{name}: training FLOPs per sample (3 x forward)", t.training_flops_per_sample, training),
            Check(f"{name}: FLOPs per sample by operator", t.flops_by_operator == by_op,
                  t.flops_by_operator, by_op),
            _num(f"{name}: arithmetic intensity", t.intensity,
                 metrics.intensity(forward, t.activations_per_sample, t.weights, t.B,
                                   4 if t.precision == "fp32" else 2))], training


def figure_checks(t: results.TestResult, cfg, res: results.Record, training) -> tuple[list[Check], dict]:
    """The test's figures as run.measure derives them (Eq. 4-8 and the rest)."""
    name = _name(t)
    per_job = [s * e * t.B * t.P for s, e in zip(t.steps_per_epoch, _epochs_by_job(t))]
    samples = sum(per_job)
    total = metrics.total_flops(per_job, training)
    fl = metrics.flops(total, t.train_seconds)
    wl = workloads.get(t.workload)
    target, n = workloads.target_and_n(wl, cfg)
    higher = wl.HIGHER_IS_BETTER   # the workload's rule; the recorded direction is checked against it
    penalty = metrics.penalty(t.quality, target, n, higher)
    vfl = metrics.vflops(fl, t.quality, target, n, higher)
    tts = (t.staging or {}).get("seconds", 0.0) + t.evaluations[-1]["seconds"]
    out = _curve_checks(t, name, target, higher) + [
        _num(f"{name}: samples trained (steps x epochs trained x B x P, all jobs)", t.samples_trained, samples),
        _num(f"{name}: total FLOPs (samples x training FLOPs per sample)", t.total_flops, total),
        _num(f"{name}: FLOPS (total FLOPs / train_seconds)", t.flops, fl),
        _num(f"{name}: target quality (line 25)", t.target_quality, target),
        _num(f"{name}: penalty exponent n (line 26)", t.penalty_n, n),
        Check(f"{name}: quality direction ({wl.QUALITY}: {'higher' if higher else 'lower'} is better)",
              t.higher_is_better == higher, t.higher_is_better, higher),
        _num(f"{name}: penalty ({'quality / target' if higher else 'target / quality'})^n", t.penalty, penalty),
        _num(f"{name}: VFLOPS (FLOPS x penalty)", t.vflops, vfl),
        _num(f"{name}: time to solution (staging + wall to the end of the last evaluation)",
             t.time_to_solution, tts)]
    return out + _resumed_checks(t, name) + _device_checks(t, name, fl, vfl, res), {"flops": fl, "vflops": vfl}


def _resumed_checks(t: results.TestResult, name: str) -> list[Check]:
    """A test gone on from its base models' checkpoints (TestResult.resumed): the samples
    before them are the epochs through theirs, every model's kept (one a wave of retrain
    trained again counts its wave's alone); Time holds the training before them and the
    span lost."""
    if not t.resumed:
        return []
    r, again = t.resumed, {x["job"] for x in t.retrained}
    kept = [j for j in range(t.M) if j not in t.jobs_lost]   # steps_per_epoch's jobs, in order
    before = sum(s * r["epoch"] * t.B * t.P for j, s in zip(kept, t.steps_per_epoch) if j not in again)
    held = r["seconds_before"] + r["lost_seconds"]
    return [_num(f"{name}: samples before the checkpoints (steps x their epoch x B x P, all jobs)",
                 r["samples_before"], before),
            Check(f"{name}: Time holds the training before the checkpoints and the span lost ({held:.2f} s)",
                  t.train_seconds >= held >= 0, t.train_seconds, f">= {held:.2f}")]


def _curve_checks(t: results.TestResult, name: str, target: float, higher: bool) -> list[Check]:
    """Steps, the evaluations along the way (lines 31-32) of each pass (a wave of retrain
    trains and evaluates as the test does, stopping where its ensemble reaches the target),
    the epochs trained, and the qualities and time to quality read from them."""
    curve = t.evaluations
    steps = [r["size"] // (t.P * t.B) for r in t.resample]
    due = train.evaluation_epochs(t.epochs, t.eval_every)
    passes = _passes(t)
    recorded = [[p["epoch"] for p in points] for points in passes]
    evaluated = []
    for points in passes:
        stop = metrics.first_reaching(points, target, higher)
        evaluated.append([e for e in due if e <= (stop["epoch"] if t.stop_at_target and stop else t.epochs)])
    epochs_trained = evaluated[0][-1]
    reached = metrics.first_reaching(metrics.counted(curve), target, higher)
    ttq = (reached["seconds"], reached["epoch"]) if reached else (None, None)
    kept = [q for j, q in enumerate(curve[-1]["base_quality"]) if j not in t.jobs_lost]   # harness/elastic.py
    return [Check(f"{name}: steps per epoch = resample size // (P x B), per job", t.steps_per_epoch == steps,
                  t.steps_per_epoch, steps),
            Check(f"{name}: evaluated after epochs {due} (line 31), or up to the first reaching the target"
                  " (line 32), each pass", recorded == evaluated, recorded, evaluated),
            Check(f"{name}: epochs trained (line 15, or the epoch the target stopped training)",
                  t.epochs_trained == epochs_trained, t.epochs_trained, epochs_trained),
            _num(f"{name}: ensemble quality = the last evaluation's", t.quality, curve[-1]["quality"]),
            Check(f"{name}: base-model qualities = the last evaluation's",
                  t.base_quality == kept, t.base_quality, kept),
            Check(f"{name}: time to quality = the first evaluation reaching the target, of as many models as the last",
                  (t.time_to_quality, t.epochs_to_quality) == ttq, (t.time_to_quality, t.epochs_to_quality),
                  ttq)]


def _device_checks(t: results.TestResult, name: str, fl: float, vfl: float, res: results.Record) -> list[Check]:
    """Utilisation against the ranks' roofline, VFLOPS per watt, the consistency verdict."""
    ranks = sorted({r for ranks in _trained_by(t).values() for r in ranks})   # as run.measure's
    util = metrics.utilisation(fl, res.roofline.get(frameworks.roofline_key(t.framework, t.precision)), ranks)
    rec_util = t.utilisation
    if rec_util is None or util is None:
        out = [Check(f"{name}: utilisation", rec_util == util, rec_util, util,
                     note="no roofline figures" if rec_util == util else
                     "recorded for a run without roofline figures, or missing")]
    else:
        out = [_num(f"{name}: utilisation of the {k.upper() + ' roofline' if k != 'peak' else 'theoretical peak'}"
                    f" (ranks {ranks})", rec_util.get(k), util[k]) for k in ("gemm", "conv", "peak")]
    per_watt = telemetry.per_joule(vfl, t.train_seconds, t.telemetry or {})
    out.append(_num(f"{name}: VFLOPS per watt (GPU boards)", t.vflops_per_watt, per_watt))
    cons = t.consistency
    again = metrics.consistency(cons["max_diff"])
    out.append(Check(f"{name}: replica consistency verdict (max diff {cons['max_diff']:g} <= {again['tolerance']:g})",
                     cons == again, cons["passed"], again["passed"]))
    return out


def _sweep_check(t: results.TestResult, cfg) -> Check:
    """The test is the sweep's test of its index, run with the input's parameters (a trial
    of a tuning run: its own test, `cfg` its configuration)."""
    tests = [tune.test_of(cfg, tune.choice_of(t.trial), t.index)] * t.index if t.trial else dat.expand(cfg)
    if not 1 <= t.index <= len(tests):
        return Check(f"{_name(t)}: a test of the input's sweep", False, t.index, len(tests),
                     note="no such test in the sweep")
    s = tests[t.index - 1]
    want = {"workload": s.workload, "framework": s.framework, "mode": s.mode, "P": s.P, "B": s.batch, "precision": s.precision,
            "tv": s.tv(cfg),
            "sampler": cfg.sampler, "aggregation": cfg.aggregation, "epochs": cfg.epochs,
            "eval_every": cfg.eval_every, "stop_at_target": cfg.stop_at_target,
            "seed": cfg.seed + t.repetition, "M": s.M or t.M}
    diff = {k: v for k, v in want.items() if getattr(t, k) != v}
    return Check(f"{_name(t)}: test {s.index} of the input's sweep, with its parameters", not diff,
                 {k: getattr(t, k) for k in diff} or None, diff or None,
                 note="" if diff else f"{s.workload} {s.framework} M {t.M} P {s.P} B {s.batch} {s.precision}"
                                      f" seed {want['seed']}")


def division_check(t: results.TestResult, cfg, values: dict, resumed: bool = False,
                   schema: str = results.SCHEMA) -> Check:
    """The test judged again by the run's own rule (division.judge, then with_losses) from
    what results.json records: the configuration, the settings, the model deviations and
    the data facts (data_facts_check holds those to the rest of the record); a file of
    schema < 2.17 has no data facts, and is judged without them, as it was."""
    wl = workloads.get(t.workload)
    known = {k: v for k, v in values.items() if k in settings.TABLE}
    verdict, reasons = division.judge(
        workload=t.workload, dataset_kind=cfg.dataset.kind, deviations=t.model_deviations,
        test_only=settings.test_only(known), target=cfg.target_quality, default_target=wl.TARGET_QUALITY,
        n=cfg.penalty_n, default_n=wl.PENALTY_N, repetitions=cfg.repetitions,
        data_facts=t.data_facts, published=wl.PUBLISHED)
    verdict, reasons = division.with_losses(verdict, reasons, len(t.jobs_lost), t.M)
    recorded = [t.division, list(t.open_reasons)]
    ok = recorded == [verdict, reasons]
    note = ""
    if not ok and t.division == "closed" and verdict == "open":
        note = "claimed closed, but the rules make it open: " + "; ".join(reasons)
    if t.data_facts is None:
        note = "; ".join(n for n in (note, f"no data facts recorded (results schema {schema}): judged without them")
                         if n)
    if not ok and resumed:
        note = "; ".join(n for n in (note, "the run was resumed: results.json's settings are the last invocation's,"
                                           " and a test of an earlier one may have run with others") if n)
    return Check(f"{_name(t)}: division (harness/division.judge)", ok, recorded[0] if ok else recorded,
                 verdict if ok else [verdict, reasons], note)


def data_facts_check(t: results.TestResult, conventions: list, schema: str) -> Check:
    """The facts the division rests on agree with where the record holds them too: the
    test's train_samples and val_samples, and its workload's conventions line (division.
    facts_line, which report.txt's header holds as well), so that an edit of one place
    fails. A file of schema < 2.17 holds none; one of 2.17 on must."""
    what = f"{_name(t)}: data facts = the test's sample counts and the conventions' data line"
    facts = t.data_facts
    if facts is None:
        old = results.minor(schema) < (2, 17)
        return Check(what, old, note=f"not recorded: results schema {schema}" if old else
                     f"missing: results schema {schema} records them (from 2.17)")
    line = f"{t.workload}: {division.facts_line(facts)}"
    recorded = {"train_samples": t.train_samples, "val_samples": t.val_samples, "conventions": line in conventions}
    derived = {"train_samples": facts.get("train_samples"), "val_samples": facts.get("val_samples"),
               "conventions": True}
    diff = [k for k in recorded if recorded[k] != derived[k]]
    return Check(what, not diff, {k: recorded[k] for k in diff} or None, {k: derived[k] for k in diff} or None,
                 note=line if not diff else f"differs: {', '.join(diff)}"
                 + (f"; the conventions hold no line `{line}`" if "conventions" in diff else ""))


def count_check(res: results.Record) -> Check:
    """The test runs finished against those planned (heartbeat.planned_runs: the sweep's
    tests that fit the world x the repetitions): all of them for a complete run (a test run
    dropped from results.json and report.txt alike changes no other figure), at most all
    for one that stopped early."""
    finished, planned = len(res.tests), heartbeat.planned_runs(res)
    complete = res.status == "complete"
    ok = planned is not None and (finished == planned if complete else finished <= planned)
    return Check(f"test runs finished {'=' if complete else '<='} those planned (the sweep's tests that fit the"
                 " world x the repetitions)", ok,
                 note=f"{finished} of {'?' if planned is None else planned}"
                      + ("" if complete else f", the run `{res.status}`"))


def tuning_checks(res: results.Record, cfg, written: dict) -> list[Check]:
    """A tuning run's table re-derived from its trials' records (harness/tune.py): each row's
    figures its test's, each setting one of the input's space, each stage's promotions its best
    by VFLOPS, the best finalist, and the files it wrote as tune renders them."""
    tg, tests, out = res.tuning, {t.index: t for t in res.tests if t.trial}, []
    for r in tg["trials"]:
        t, what = tests.get(r["number"]), f"tuning trial {r['number']}"
        if t is None:   # a trial whose ranks were all lost records no test, only its fault
            out.append(Check(f"{what}: a test of the run", bool(r.get("fault")), note=r.get("fault") or "no test"))
            continue
        mine = {"flops": t.flops, "quality": t.quality, "vflops": t.vflops, "train_seconds": t.train_seconds,
                "epochs_trained": t.epochs_trained, **t.trial}
        diff = sorted(k for k in mine if r.get(k) != mine[k])
        out.append(Check(f"{what}: the table's row = its test's record", not diff,
                         {k: r.get(k) for k in diff} or None, {k: mine[k] for k in diff} or None))
        away = tune.outside(cfg, tune.choice_of(r))
        out.append(Check(f"{what}: its setting is one of the input's space", not away, note="; ".join(away)))
    names = [s["name"] for s in tg["plan"]]
    for i, name in enumerate(names):
        if not name.startswith("stage") or i + 1 >= len(names):
            continue
        rows = [r for r in tg["trials"] if r["stage"] == name and not r.get("fault")]
        recorded = sorted(r["number"] for r in rows if r["outcome"] != f"pruned after {name}")   # or a finalist since
        derived = sorted(r["number"] for r in tune.promoted(rows, tg["plan"][i + 1]["trials"]))
        out.append(Check(f"tuning {name}: promoted = the best {tg['plan'][i + 1]['trials']} by VFLOPS", recorded == derived,
                         recorded, derived))
    best = results.best_trial([r for r in tg["trials"] if r["outcome"].startswith(("finalist", "best"))])
    out.append(Check("tuning: the best finalist by VFLOPS measured at the full length", tg.get("best") ==
                     (best and best["number"]) and (best is None or best["epochs"] == cfg.epochs),
                     tg.get("best"), best and best["number"]))
    if tg.get("tuned") and best:
        text = written.get(tg["tuned"])
        again = text and tune.tuned_text(cfg, best, "\n".join(text.split("\n")[:2]))
        out.append(Check(f"tuning: {tg['tuned']} = the input with the best finalist's setting", bool(text) and
                         text == again, note="missing" if not text else ""))
        try:
            dat.parse_text(text or "", tg["tuned"])
            out.append(Check(f"tuning: {tg['tuned']} is an ordinary input file", bool(text)))
        except dat.DatError as e:
            out.append(Check(f"tuning: {tg['tuned']} is an ordinary input file", False, note=str(e)))
    if tg.get("tuned"):
        out.append(Check(f"tuning: {tune.TABLE} = the table rendered from results.json",
                         written.get(tune.TABLE) == tune.table_text(cfg, tg["trials"]),
                         note="missing" if written.get(tune.TABLE) is None else ""))
    return out


def repeats_checks(res: results.Record, cfg) -> list[Check]:
    """Each repetition summary recomputed (metrics.repeats); every test whose repetitions
    all finished has exactly one."""
    tests, out = res.tests, []
    by_index = {}
    for t in tests:
        by_index.setdefault(t.index, []).append(t)
    summaries = res.repeats
    for s in summaries:
        runs = by_index.get(s.index, [])
        what = f"test {s.index}: repetition summary"
        if not runs:
            out.append(Check(what, False, note="a summary of a test with no finished repetition"))
            continue
        again = metrics.repeats(runs)
        for key, value in vars(again).items():
            mine = getattr(s, key)
            out.append(_num(f"{what}: {key}", mine, value) if isinstance(value, float) else
                       Check(f"{what}: {key}", mine == value, mine, value))
    if cfg.repetitions > 1:
        for index, runs in by_index.items():
            done = sorted(t.repetition for t in runs) == list(range(cfg.repetitions))
            count = sum(s.index == index for s in summaries)
            if done or count:
                out.append(Check(f"test {index}: one repetition summary once all {cfg.repetitions} runs finished",
                                 count == int(done), count, int(done)))
    return out


def scaling_checks(tests: list, derived: list, report_text: str | None, schema: str = results.SCHEMA) -> list[Check]:
    """The report's Scaling lines, recomputed (report.scaling_lines, metrics.weak_scaling)
    from the re-derived FLOPS of every test, as results schema `schema` wrote them."""
    if report_text is None:
        return []
    version = results.minor(schema)
    mine = report.scaling_lines([replace(t, flops=d["flops"]) if d else t for t, d in zip(tests, derived)],
                                metrics.weak_scaling, version >= (2, 3), version >= (2, 9))
    theirs = [ln for ln in report_text.splitlines() if ln.startswith("Scaling (")]
    out = [Check(f"scaling: {m.split(':')[0]}", m in theirs, _find(theirs, m), m) for m in mine]
    out += [Check("scaling: a Scaling line of report.txt", False, ln, None, note="no group of tests gives it")
            for ln in theirs if ln not in mine]
    return out


def _find(lines, line):
    head = line.split(":")[0]
    return next((ln for ln in lines if ln.split(":")[0] == head), None)


def report_segments(res: results.Record, cfg) -> list[tuple[str, str, bool]]:
    """report.txt as the report's own rendering functions make it from results.json:
    (label, text, optional) in order. A resumed run's report repeats the earlier rows
    without their repetition summaries, so after a resume a summary is optional."""
    tests = res.tests
    params = (dat.describe(cfg, results.minor(res.schema)) + settings.describe(res.settings)
              + settings.describe_library(res.environment)
              + (elastic.lines(res.fault_tolerance, results.minor(res.schema)) if res.fault_tolerance else [])
              + relaunch.lines(res.relaunches) + (tune.param_lines(res.tuning) if res.tuning else []))
    segs = [("header", report.header(res.hpcai500, res.tv_legend or dat.TV_LEGEND_BEFORE_2_13, params,
                                     res.conventions), False)]
    # a test skipped at the start, after the header; one left out after a loss of ranks, after
    # the test blocks finished before it (its `after`)
    later: dict[int, list] = {}
    for s in res.skipped:
        later.setdefault(s.get("after", -1), []).append(
            (f"test {s['index']} skipped", report.skipped_entry(s, cfg.repetitions), False))
    segs += later.pop(-1, [])
    summaries = {s.index: s for s in res.repeats}
    for n, t in enumerate(tests):
        segs += later.pop(n, [])
        segs.append((f"{_name(t)} block", report.row(t, cfg.repetitions, len(res.resumed) + 1, res.schema), False))
        s = summaries.get(t.index)
        if s and t.repetition == cfg.repetitions - 1 and t.repetition > 0:
            first = next(r for r in tests if r.index == t.index)
            segs.append((f"test {t.index} repetition summary", report.repeats_block(first, s, res.schema),
                         bool(res.resumed)))
    segs += [seg for n in sorted(later) for seg in later[n]]   # after the last block
    status, stop = res.status, res.interrupted or {}
    if status == "interrupted":
        test = stop.get("test")
        segs.append(("interruption", f"\nInterrupted: {stop.get('reason')}" +
                     (f" during test {test}; its result is lost, the finished tests' stand.\n" if test else ".\n"),
                     False))
    if status in ("complete", "interrupted") and res.tuning is not None:
        segs.append(("tuning", report.tuning_block(cfg, res.tuning), False))
    if status in ("complete", "interrupted"):
        segs.append(("footer", report.footer(tests, res.skipped,
                                             report.summary_lines(tests, res.repeats, res.schema),
                                             status == "interrupted",
                                             res.fault_losses, res.schema), False))
    return segs


def report_checks(res: results.Record, cfg, text: str | None) -> list[Check]:
    """report.txt line by line against its re-rendering: one check per block; a line that
    differs fails, naming its number and both texts."""
    if text is None:
        return [Check("report.txt", False, note="missing")]
    actual = text.splitlines()
    out, p = [], 0
    for label, seg, optional in report_segments(res, cfg):
        want = seg.splitlines()
        if optional and actual[p:p + 1] != want[:1]:
            continue
        got = actual[p:p + len(want)] + [None] * max(0, p + len(want) - len(actual))
        diffs = [(p + i + 1, a, w) for i, (a, w) in enumerate(zip(got, want)) if a != w]
        span = f"line {p + 1}" if len(want) == 1 else f"lines {p + 1}-{p + len(want)}"
        if not diffs:
            out.append(Check(f"report.txt {span}: {label}", True, note="as rendered from results.json"))
        for n, a, w in diffs[:MAX_DIFFS]:
            out.append(Check(f"report.txt line {n} ({label})", False, a, w,
                             note="the line is missing" if a is None else ""))
        if len(diffs) > MAX_DIFFS:
            out.append(Check(f"report.txt {span}: {label}", False,
                             note=f"{len(diffs) - MAX_DIFFS} more lines differ"))
        p += len(want)
    if p < len(actual):
        out.append(Check(f"report.txt line {p + 1}", False, actual[p], None,
                         note=f"{len(actual) - p} line(s) after the end rendered from results.json"))
    return out


def mllog_checks(tests: list, mllogs: dict) -> list[Check]:
    """Every base model's MLLOG file: there, passes the MLPerf HPC checker, and says what
    results.json says (seed, global batch, train samples, the base model's last
    eval_accuracy, the ensemble's quality, the division), for the keys it has."""
    out = []
    for t in tests:
        for j in range(t.M):
            name = mllog.filename(t.index, t.repetition, j)
            what = f"MLLOG mllog/{name}"
            log = mllogs.get(name)
            if log is None:
                lost = j in t.jobs_lost   # its root may have been the rank lost (harness/elastic.py)
                out.append(Check(what, lost, note=f"base model {j} of {_name(t)} was lost, its log with its root"
                                 if lost else f"missing: base model {j} of {_name(t)} has no log"))
                continue
            msgs = log["messages"]
            if j in t.jobs_lost:   # an aborted run's log may lack what a whole one has (harness/elastic.py)
                out.append(Check(f"{what}: base model {j} lost, its log ends aborted", True,
                                 note=("the checker passes" if not msgs else f"the checker's {len(msgs)} message(s): "
                                       + " | ".join(msgs[:3]))))
            else:
                out.append(Check(f"{what}: MLPerf HPC compliance checker", not msgs,
                                 note="passes" if not msgs else f"{len(msgs)} message(s): " + " | ".join(msgs[:3])))
            out += _guarded(f"{what}: figures", lambda t=t, j=j, log=log, what=what:
                            ([_mllog_figures(what, t, j, log["lines"])], None))[0]
    return out


def _mllog_figures(what: str, t: results.TestResult, job: int, lines: list[str]) -> Check:
    events = [json.loads(ln.split(MLLOG_TOKEN, 1)[1]) for ln in lines if MLLOG_TOKEN in ln]
    last = {e["key"]: e["value"] for e in events}   # the last value of each key
    want = {"seed": t.seed, "global_batch_size": t.P * t.B, "eval_samples": t.val_samples,
            "hpcai500_ensemble_quality": t.quality, "submission_division": t.division}
    kept = [j for j in range(t.M) if j not in t.jobs_lost]   # the per-model lists hold these, in order
    if job in kept:
        want |= {"train_samples": t.resample[kept.index(job)]["size"],
                 mllog.eval_key(t.higher_is_better): t.base_quality[kept.index(job)]}
    want = {k: v for k, v in want.items() if k in last}
    stops = [e.get("metadata", {}).get("status") for e in events if e["key"] == "run_stop"]
    if stops:   # MLPerf's success: the target reached (by the ensemble, harness/run.py)
        last["run_stop status"] = stops[-1]
        # success: the target reached at some evaluation (harness/run.py), as the time to quality says
        want["run_stop status"] = "success" if t.time_to_quality is not None and job in kept else "aborted"
    diff = {k: last[k] for k, v in want.items() if not _close(last[k], v)}
    wrong = mllog.eval_key(not t.higher_is_better)   # an error logged as an accuracy, or the reverse
    if wrong in last:
        diff[wrong] = last[wrong]
        want[wrong] = f"no {wrong}: the quality is {'an accuracy' if t.higher_is_better else 'an error'}"
    return Check(f"{what}: figures = results.json's", bool(events) and not diff,
                 diff or None, {k: want[k] for k in diff} or None,
                 note=("no MLLOG events" if not events else "" if diff else ", ".join(want)))


def _close(a, b) -> bool:
    if isinstance(a, bool) or isinstance(b, bool) or not all(isinstance(v, (int, float)) for v in (a, b)):
        return a == b
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return math.isclose(a, b, rel_tol=REL, abs_tol=0.0)


def _num(what: str, recorded, derived) -> Check:
    if recorded is None and derived is None:
        return Check(what, True, note="none recorded, none derivable (not measured in this run)")
    return Check(what, _close(recorded, derived), recorded, derived)


def _show(v) -> str:
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):
        return repr(v)
    if isinstance(v, (dict, list)):
        return json.dumps(v, separators=(",", ":"))
    return str(v)


def outcome(checks: list[Check], status: str, whole: bool = True) -> str:
    """EXIT's key for checks of a run whose results.json says `status`: a failed check
    FAILED; else a run that is not `complete`, or whose faults dropped base models or left
    test runs out (`whole` False: heartbeat.Tally.whole), INCOMPLETE: what it finished
    verifies, but a submitter must not take it for a whole result. As --status's exit: 0
    for both or neither."""
    return ("FAILED" if not all(c.ok for c in checks) else "PASSED" if status == "complete" and whole
            else "INCOMPLETE")


def incomplete_line(status: str, whole: bool = True) -> str | None:
    """Why the checks do not make a result, for a run whose results.json says `status`
    (None: complete and whole). The state and the counts are the summary line's (heartbeat.State)."""
    if status != "complete":
        return (f"Incomplete run: results.json says `{status}`, not `complete`: the checks cover its finished test"
                " runs only; not a result to submit")
    return None if whole else ("Incomplete result: faults dropped base models or left test runs out (--on-fault"
                               " drop): its ensembles are not the ones the input asked for; not a result to submit")


# -- the command line ------------------------------------------------------------------------
def main(path: str, out=None) -> int:
    """Print every check and the counts; the exit status is EXIT's (1 also: not a run). `path`
    may be a results directory (line 5): its newest run is verified, and named first, as
    --status judges it (heartbeat.newest_run: a batch script knows line 5, not the run's name)."""
    out = out or sys.stdout
    runs = heartbeat.run_folders(path)
    run_dir = runs[-1]
    if run_dir != path:
        print(f"{path}: a results directory of {len(runs)} run(s); verifying its newest, {run_dir}", file=out)
    try:
        run = load(run_dir)
        checks = verify(run)
    except NotARun as e:
        say(f"error: --verify: {e}")
        return 1
    for c in checks:
        print(c.line(), file=out)
    whole = heartbeat.of_record(run.res).whole
    incomplete = incomplete_line(run.res.status, whole)
    if incomplete:
        print(incomplete, file=out)
    failed = sum(not c.ok for c in checks)
    state = heartbeat.status(run_dir, run.res)   # a `running` run: live, or dead with its status left so
    verdict = outcome(checks, run.res.status, whole)
    print(f"Verified {run_dir} ({state.line()}): {len(checks)}"
          f" checks, {len(checks) - failed} passed, {failed} failed ...... {verdict}", file=out, flush=True)
    return EXIT[verdict]
