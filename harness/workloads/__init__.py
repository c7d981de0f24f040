"""Workloads: one module each, behind one small interface.

A workload module provides:
  NAME, ALIASES, QUALITY ("Top-1", "mAP@0.5", ...), TARGET_QUALITY, PENALTY_N
  load(dataset: str, cache_dir: str, node_rank: int, node_barrier) -> Data
  build_model(data: Data) -> tf.keras.Model          (outputs logits)
  loss(labels, logits) -> per-sample loss tensor
  predict(model, x) -> np.ndarray (N, C) scores that can be averaged across models
  quality(scores, labels) -> float in [0, 1]
The harness knows nothing else about a workload.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass

import numpy as np

_MODULES = {"digits": "harness.workloads.digits"}


class DataError(ValueError):
    """Bad or missing data: the message names the file and what is wrong."""


@dataclass(frozen=True)
class Data:
    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    num_classes: int
    source: str            # what was read, for the report and results.json

    @property
    def n_train(self) -> int:
        return len(self.y_train)


def get(name: str):
    """The workload module for a name from HPCAI500.dat's workloads line."""
    if name not in _MODULES:
        raise KeyError(f"unknown workload {name!r} (built: {', '.join(sorted(_MODULES))})")
    return importlib.import_module(_MODULES[name])
