"""MLLOG: one `:::MLLOG {json}` log per base model, in MLPerf HPC's format, and its check.

Lines are produced by the `mlperf-logging` package's own MLLogger (so its parser
reads them back), kept in memory on the job's root and handed to world rank 0, which
writes each log whole at the end of the test: a crash never leaves half a log, and
the job roots need not see the results directory.

A base model's log, in the order MLPerf HPC v3.0's rules expect:
  init_start, submission_* and cache_clear, the run's figures   BaseModelLog.init
  staging_start, staging_stop (the Data Duplicator's copy)      BaseModelLog.staging
  the recipe as built: opt_*, scheduler_*, ... (recipe())       BaseModelLog.recipe
  init_stop, run_start                                          BaseModelLog.run_start
  epoch_start, epoch_stop per epoch                             BaseModelLog.epoch_*
  eval_start, eval_accuracy (an error: eval_error), eval_stop   BaseModelLog.eval
  hpcai500_ensemble_quality, run_stop                           close (world rank 0)
The end is written by world rank 0 once the ensemble is evaluated, because MLPerf's
run_stop status "success" means the target quality was reached, and in HPC AI500 V3.0
it is the ensemble of the M base models that must reach it, not one base model.

check() runs the package's own ComplianceChecker over a log with our copy of its
hpc 3.0.0 rules (harness/mllog_rules/): the package's rules, but for the benchmark
name, which must be ours (hpcai500-<workload>) rather than one of MLPerf's.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import time

from mlperf_logging.mllog.mllog import MLLogger
from mlperf_logging.mllog import constants as K

RULES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mllog_rules")
RULESET = "3.0.0"  # the parser of MLPerf HPC v3.0, whose rules ours copy
DIVISIONS = ("closed", "open")
STATUSES = ("onprem", "cloud", "preview", "research")
ENSEMBLE_QUALITY = "hpcai500_ensemble_quality"  # our own key: the rules let unknown keys pass
# A base model's quality by its direction: MLPerf logs an accuracy as eval_accuracy and
# CosmoFlow's mean absolute error as eval_error (its rules check eval_error <= 0.124);
# the package has no constant for the latter.
EVAL_KEYS = {True: K.EVAL_ACCURACY, False: "eval_error"}


# Line 18's optimizers by MLPerf's names (MLPerf HPC's DeepCAM rules admit Adam, AdamW
# and LAMB; ours admit the others too, harness/mllog_rules/deepcam.yaml).
OPT_NAMES = {"sgd": "SGD", "adam": "Adam", "adagrad": "AdaGrad", "lars": "LARS", "lamb": "LAMB"}


def recipe(name: str, config: dict, peak_lr: float, warmup_steps: int, total_steps: int) -> dict:
    """The recipe of a base model as built, under the keys of MLPerf HPC's DeepCAM rules
    (closed_deepcam.yaml and its LAMB and scheduler files), for every workload: line 18's
    optimizer `name` with its Keras `config` (get_config(); fp16's loss-scale wrapper
    unwrapped), the peak LR (the base LR x train.lr_scale), the harness's schedule (linear warm-up over
    `warmup_steps` from peak / warmup_steps, MLPerf's warm-up factor 1, then cosine to 0
    over the remaining steps, MLPerf's cosine_annealing). Adam with weight decay is
    Keras' decoupled kind: AdamW. Pure."""
    config = config.get("inner_optimizer", {}).get("config", config)
    wd = float(config.get("weight_decay") or 0.0)
    keys = {"gradient_accumulation_frequency": 1,   # one batch a step, no accumulation
            "batchnorm_group_size": 1,              # each replica's own statistics in training
            "opt_name": "AdamW" if name == "adam" and wd else OPT_NAMES[name],
            "opt_lr": float(peak_lr), "opt_weight_decay": wd,
            "scheduler_type": "cosine_annealing", "scheduler_lr_warmup_steps": int(warmup_steps),
            "scheduler_lr_warmup_factor": 1.0, "scheduler_t_max": max(1, int(total_steps - warmup_steps)),
            "scheduler_eta_min": 0.0}
    if name in ("adam", "lamb"):
        keys.update(opt_betas=[float(config["beta_1"]), float(config["beta_2"])], opt_eps=float(config["epsilon"]))
    if name == "lamb":   # ours: Adam's bias-corrected moments (harness/optimizers.LAMB)
        keys.update(opt_bias_correction=True, opt_grad_averaging=True,
                    opt_max_grad_norm=float(config.get("global_clipnorm") or 0.0))
    if name in ("sgd", "lars"):
        keys["opt_momentum"] = float(config["momentum"])
    return keys


def eval_key(higher_is_better: bool) -> str:
    """The MLLOG key of a base model's quality: eval_accuracy, or eval_error for an error."""
    return EVAL_KEYS[bool(higher_is_better)]

# MLPerf's cache_clear says whether the system's caches (page cache, ...) were cleared
# before the run. The harness clears none: the data is read once per invocation and
# stays in memory (and the OS page cache) across tests, and a staged copy is fresh
# in the page cache when training reads it. So the honest value is False; the rules
# only require the key to carry a value. A launcher that does drop caches before each
# invocation could make this True.
CACHE_CLEAR = False

_TOKEN = ":::MLLOG "


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


class _Events:
    """An MLLogger writing into a list; every event carries instance_id."""

    def __init__(self, name: str, instance_id: int):
        # A Logger made directly, not by logging.getLogger: it is not kept in logging's
        # registry (with its lines) after the log is handed over, and reaches no
        # handler but ours.
        logger = logging.Logger(name, logging.INFO)
        logger.propagate = False
        self._sink = _Lines()
        logger.addHandler(self._sink)
        self._log = MLLogger(logger=logger, default_namespace="")
        self.instance_id = instance_id

    def _meta(self, extra):
        return {"instance_id": self.instance_id, **(extra or {})}

    # stack_offset 2: the file/lineno metadata names the caller of event/start/end
    def event(self, key, value=None, time_ms=None, **meta):
        self._log.event(key=key, value=value, metadata=self._meta(meta), time_ms=time_ms, stack_offset=2)

    def start(self, key, value=None, time_ms=None, **meta):
        self._log.start(key=key, value=value, metadata=self._meta(meta), time_ms=time_ms, stack_offset=2)

    def end(self, key, value=None, time_ms=None, **meta):
        self._log.end(key=key, value=value, metadata=self._meta(meta), time_ms=time_ms, stack_offset=2)

    @property
    def lines(self) -> list[str]:
        return list(self._sink.lines)


def _ms(seconds: float) -> int:
    """time.time() seconds -> MLLOG's time_ms."""
    return int(seconds * 1e3)


class BaseModelLog(_Events):
    """The log of base model `job` in test `test`; every event carries instance_id = job.
    `higher_is_better`: the quality's direction, which names its key (eval_key)."""

    def __init__(self, test: int, job: int, higher_is_better: bool = True):
        super().__init__(f"hpcai500.mllog.t{test}.j{job}", job)
        self.test, self.job, self.eval_key = test, job, eval_key(higher_is_better)

    def carry_on(self, lines: list[str]) -> None:
        """Go on with the log an earlier invocation wrote up to a checkpoint (harness/
        checkpoint.py): its lines first, then this invocation's epochs after them."""
        self._sink.lines[:0] = lines

    # the phases of a base model, in order ------------------------------------------
    def init(self, *, seed, global_batch, train_samples, eval_samples, nodes, per_node, workload,
             division: str, org: str, platform: str, status: str):
        """init_start and what the rules want inside init. `division`: closed | open (the
        test's, harness/division.py); `org`, `platform`, `status`: the submitter's
        settings (onprem | cloud | preview | research)."""
        if division not in DIVISIONS:
            raise ValueError(f"MLLOG division {division!r}: not one of {', '.join(DIVISIONS)}")
        if status not in STATUSES:
            raise ValueError(f"MLLOG status {status!r}: not one of {', '.join(STATUSES)}")
        for name, text in (("org", org), ("platform", platform)):
            if not text:
                raise ValueError(f"MLLOG {name} is empty")
        self.start(K.INIT_START)
        self.event(K.SUBMISSION_BENCHMARK, f"hpcai500-{workload}")
        self.event(K.SUBMISSION_ORG, org)
        self.event(K.SUBMISSION_PLATFORM, platform)
        self.event(K.SUBMISSION_DIVISION, division)
        self.event(K.SUBMISSION_STATUS, status)
        self.event(K.CACHE_CLEAR, CACHE_CLEAR)
        self.event(K.SEED, seed)
        self.event(K.GLOBAL_BATCH_SIZE, global_batch)
        self.event(K.TRAIN_SAMPLES, train_samples)
        self.event(K.EVAL_SAMPLES, eval_samples)
        self.event("number_of_nodes", nodes)
        self.event("accelerators_per_node", per_node)

    def staging(self, start_s: float, stop_s: float, samples: int, nbytes: int):
        """The Data Duplicator's copy, stamped with its own wall-clock start and stop.
        Between init_start and init_stop (called after init, before run_start): MLPerf
        HPC v3.0 leaves staging out of the timed run."""
        self.start(K.STAGING_START, time_ms=_ms(start_s))
        self.end(K.STAGING_STOP, time_ms=_ms(stop_s), staging_samples=samples, staging_bytes=nbytes)

    def recipe(self, keys: dict):
        """The recipe's keys (recipe()), inside init."""
        for key, value in keys.items():
            self.event(key, value)

    def run_start(self):
        self.end(K.INIT_STOP)
        self.start(K.RUN_START)

    def epoch_start(self, epoch: int):
        self.start(K.EPOCH_START, epoch_num=epoch)

    def epoch_stop(self, epoch: int):
        self.end(K.EPOCH_STOP, epoch_num=epoch)

    def eval(self, epoch: int, quality: float, start_s: float | None = None, stop_s: float | None = None):
        """One evaluation of this base model after epoch `epoch` (counted from 1, as the
        epochs), of quality `quality`; may come several times (every K epochs).
        `start_s`/`stop_s`: its wall-clock start and stop (time.time()); stop defaults
        to now, start to stop. The accuracy is stamped at the stop, when it is known."""
        stop_s = time.time() if stop_s is None else stop_s
        start_s = stop_s if start_s is None else start_s
        self.start(K.EVAL_START, time_ms=_ms(start_s), epoch_num=epoch)
        self.event(self.eval_key, quality, time_ms=_ms(stop_s), epoch_num=epoch)
        self.end(K.EVAL_STOP, time_ms=_ms(stop_s), epoch_num=epoch)


def close(lines: list[str], *, ensemble_quality: float, reached: bool, instance_id: int,
          time_s: float | None = None, division: str | None = None) -> list[str]:
    """`lines` (a BaseModelLog's) followed by its end: the ensemble's quality and run_stop,
    stamped `time_s` (time.time(); default now), when the ensemble's quality is known.
    run_stop's status is "success" only when `reached` (the ensemble reached the target
    quality: MLPerf's meaning of success), else "aborted". `division`: the test's as it
    ended, written into the init's submission_division (base models lost to faults make a
    closed test open: harness/division.with_losses). A pure function, for world rank 0,
    which holds every job's lines but not their BaseModelLog objects."""
    if division is not None:
        lines = [_with_value(ln, division) if _TOKEN in ln and json.loads(ln.split(_TOKEN, 1)[1])["key"]
                 == K.SUBMISSION_DIVISION else ln for ln in lines]
    if K.RUN_STOP in _keys(lines):
        raise ValueError(f"MLLOG of base model {instance_id} already has a run_stop")
    end = _Events(f"hpcai500.mllog.close.j{instance_id}", instance_id)
    time_ms = _ms(time.time() if time_s is None else time_s)
    end.event(ENSEMBLE_QUALITY, float(ensemble_quality), time_ms=time_ms,
              scope="the ensemble of this test's M base models (this base model's own: eval_accuracy)",
              target_reached=bool(reached))
    end.end(K.RUN_STOP, time_ms=time_ms, status=K.SUCCESS if reached else K.ABORTED)
    return list(lines) + end.lines


def _with_value(line: str, value) -> str:
    head, body = line.split(_TOKEN, 1)
    event = json.loads(body)
    event["value"] = value
    return f"{head}{_TOKEN}{json.dumps(event)}"


def _keys(lines):
    return [json.loads(ln.split(_TOKEN, 1)[1])["key"] for ln in lines if _TOKEN in ln]


def check(path) -> list[str]:
    """MLPerf HPC's compliance checker (mlperf-logging's ComplianceChecker, ruleset
    3.0.0's parser) over the log file `path`, with our rules (harness/mllog_rules/):
    its messages, [] when the log passes. Stricter than the package's command line in
    one way: its warnings (e.g. a key due once found twice with equal values) count
    as failures (werror), since our logs are written by code and a warning is a bug."""
    from mlperf_logging.compliance_checker import mlp_compliance, mlp_parser
    loglines, errors = mlp_parser.parse_file(os.fspath(path), ruleset=RULESET)
    messages = [f"line does not parse ({err}): {line}" for line, err in errors]
    checker = mlp_compliance.make_checker("hpc", RULESET, quiet=False, werror=True)
    # The package queues rule files in a module-level list; a failed check must not
    # leave files there for the next one.
    queue = mlp_compliance.enqueued_configs
    queue.clear()
    try:
        with _root_logger_untouched():
            checker.check_loglines(loglines, os.path.join(RULES, "common.yaml"))
    except Exception as e:  # e.g. a division file that does not exist (the package opens it anyway)
        messages.append(f"the compliance checker stopped: {type(e).__name__}: {e}")
    finally:
        queue.clear()
    return messages + [*checker.warnings.values(), *checker.overwritable.values(), *checker.not_overwritable]


@contextlib.contextmanager
def _root_logger_untouched():
    """The checker logs through logging.info(), which gives a root logger without
    handlers a stderr one (logging.basicConfig) for good: lend it a NullHandler for
    the check instead, so the process's logging is as it was. (The package's command
    line also writes compliance_checker.log; we never run it.)"""
    root = logging.getLogger()
    guard = None if root.handlers else logging.NullHandler()
    if guard:
        root.addHandler(guard)
    try:
        yield
    finally:
        if guard:
            root.removeHandler(guard)


def filename(test: int, rep: int, job: int) -> str:
    return f"test{test:03d}_rep{rep:02d}_model{job:04d}.log"
