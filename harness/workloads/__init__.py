"""Workloads: one module each, behind one small interface.

A workload module provides:
  NAME, QUALITY ("Top-1", "mAP@0.5", ...), TARGET_QUALITY, PENALTY_N
  AGGREGATIONS        the ensemble aggregations it supports (mean, vote)
  load(dataset: str, cache_dir: str, node_rank: int, node_barrier) -> data
      `data` is the workload's own object; the harness reads only its attributes
      n_train, n_val (ints) and source (str, what was read, for the report).
  build_model(data) -> tf.keras.Model
  loss(y, outputs) -> per-sample loss tensor (outputs cast to FP32 by the harness)
  input_signature(data, batch) -> (x_spec, y_spec)   tf.TensorSpec (nests allowed)
  batches(data, rows, batch, *, training: bool, seed: int) -> iterator of (x, y)
      len(rows) // batch batches of the training samples `rows`, in that order
      (the harness shuffles and shards; the workload reads, decodes, augments)
  score_width(data) -> int
  predict(model, data, rows: slice) -> np.ndarray (rows, score_width) float
      scores of validation rows that can be averaged across base models
  quality(scores, data) -> float in [0, 1]  (scores: the whole validation set)
  stage(data, rows, path) -> int bytes written: the training samples `rows` (unique,
      sorted) and the validation set, written to directory `path` in the workload's
      own on-disk format (the Data Duplicator's copy)
  read(path) -> data   reads such a directory (the one reader of real and synthetic data)
Optional:
  ENSEMBLE = "stack"   each model's predictions keep their own columns in the world
      reduction and quality() gets (n_val, M, width) to fuse (detection); default
      "sum": the models' score matrices are summed and quality() gets their mean
  MOMENTUM             SGD/LARS momentum of the workload's reference recipe (default 0.9)
  FLOPS_NOTE           what the analytic FLOP count leaves out, printed in the report
The harness knows nothing else about a workload.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass

import numpy as np

_MODULES = {"digits": "harness.workloads.digits", "ic": "harness.workloads.ic", "ewa": "harness.workloads.ewa"}


class DataError(ValueError):
    """Bad or missing data: the message names the file and what is wrong."""


@dataclass(frozen=True)
class Data:
    """A data set small enough to hold in memory (the digits workload)."""
    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    num_classes: int
    source: str            # what was read, for the report and results.json

    @property
    def n_train(self) -> int:
        return len(self.y_train)

    @property
    def n_val(self) -> int:
        return len(self.y_val)

    def input_signature(self, batch: int):
        import tensorflow as tf
        return (tf.TensorSpec((batch, *self.x_train.shape[1:]), tf.as_dtype(self.x_train.dtype)),
                tf.TensorSpec((batch, *self.y_train.shape[1:]), tf.as_dtype(self.y_train.dtype)))

    def batches(self, rows: np.ndarray, batch: int):
        """Fancy-indexed numpy batches: nothing to decode, so no pipeline to hide."""
        for s in range(len(rows) // batch):
            idx = rows[s * batch:(s + 1) * batch]
            yield self.x_train[idx], self.y_train[idx]


def get(name: str):
    """The workload module for a name from HPCAI500.dat's workloads line."""
    if name not in _MODULES:
        raise KeyError(f"unknown workload {name!r} (built: {', '.join(sorted(_MODULES))})")
    return importlib.import_module(_MODULES[name])
