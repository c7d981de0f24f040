"""MLLOG: one `:::MLLOG {json}` log per base model, in MLPerf HPC's format.

Lines are produced by the `mlperf-logging` package's own MLLogger (so its parser
reads them back), kept in memory on the job's root and handed to world rank 0, which
writes each log whole at the end of the test: a crash never leaves half a log, and
the job roots need not see the results directory.
"""
from __future__ import annotations

import logging

from mlperf_logging.mllog.mllog import MLLogger
from mlperf_logging.mllog import constants as K


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


class BaseModelLog:
    """The log of base model `job` in test `test`; every event carries instance_id = job."""

    def __init__(self, test: int, job: int):
        logger = logging.getLogger(f"hpcai500.mllog.t{test}.j{job}")
        logger.propagate = False
        logger.setLevel(logging.INFO)
        logger.handlers = [_Lines()]
        self._sink = logger.handlers[0]
        self._log = MLLogger(logger=logger, default_namespace="")
        self.job = job

    def _meta(self, extra):
        return {"instance_id": self.job, **(extra or {})}

    def event(self, key, value=None, **meta):
        self._log.event(key=key, value=value, metadata=self._meta(meta), stack_offset=2)

    def start(self, key, value=None, time_ms=None, **meta):
        self._log.start(key=key, value=value, metadata=self._meta(meta), time_ms=time_ms, stack_offset=2)

    def end(self, key, value=None, time_ms=None, **meta):
        self._log.end(key=key, value=value, metadata=self._meta(meta), time_ms=time_ms, stack_offset=2)

    @property
    def lines(self) -> list[str]:
        return list(self._sink.lines)

    # the phases of a base model, in order ------------------------------------------
    def init(self, *, seed, global_batch, train_samples, eval_samples, nodes, per_node, workload):
        self.start(K.INIT_START)
        self.event(K.SUBMISSION_BENCHMARK, f"hpcai500-{workload}")
        self.event(K.SEED, seed)
        self.event(K.GLOBAL_BATCH_SIZE, global_batch)
        self.event(K.TRAIN_SAMPLES, train_samples)
        self.event(K.EVAL_SAMPLES, eval_samples)
        self.event("number_of_nodes", nodes)
        self.event("accelerators_per_node", per_node)

    def staging(self, start_s: float, stop_s: float, samples: int, nbytes: int):
        """The Data Duplicator's copy, stamped with its own wall-clock start and stop."""
        self.start(K.STAGING_START, time_ms=int(start_s * 1e3))
        self.end(K.STAGING_STOP, time_ms=int(stop_s * 1e3), staging_samples=samples, staging_bytes=nbytes)

    def run_start(self):
        self.end(K.INIT_STOP)
        self.start(K.RUN_START)

    def epoch_start(self, epoch: int):
        self.start(K.EPOCH_START, epoch_num=epoch)

    def epoch_stop(self, epoch: int):
        self.end(K.EPOCH_STOP, epoch_num=epoch)

    def finish(self, quality: float, epochs: int, ok: bool = True):
        self.event(K.EVAL_ACCURACY, quality, epoch_num=epochs)
        self.end(K.RUN_STOP, status=K.SUCCESS if ok else K.ABORTED)


def filename(test: int, rep: int, job: int) -> str:
    return f"test{test:03d}_rep{rep:02d}_model{job:04d}.log"
