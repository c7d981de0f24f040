"""Workloads: one module each, behind one small interface (`Workload`, below).

`get(name)` returns the workload's module after checking that it provides every
member of the interface, with the optional constants filled in from DEFAULTS: the one
place their defaults live. The harness knows nothing else about a workload.

A workload is written once for every framework and imports none: its data (reading,
synthetic writers, staging), its numpy feed, its quality, its model's design in numbers.
Each framework builds the model, its loss and its predictions in its own package, one
module a workload (harness/frameworks/<framework>/models.py).
"""
from __future__ import annotations

import importlib
import itertools
import json
import os
import shutil
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from harness.files import node_once

# Line 7's choices: name (the module harness/workloads/<name>.py) -> (T/V code (none), meaning)
CHOICES = {"digits": ("", "small CNN on handwritten digits (demonstration)"),
           "ic": ("", "Image Classification: ResNet-50 v1.5 on ImageNet"),
           "ewa": ("", "Extreme Weather Analytics: Faster-RCNN on Extreme Weather"),
           "cosmoflow": ("", "CosmoFlow: 3D CNN regressing 4 cosmological parameters (MLPerf HPC)"),
           "deepcam": ("", "DeepCAM: DeepLabv3+ segmenting cyclones and rivers in climate data (MLPerf HPC)")}


class DataError(ValueError):
    """Bad or missing data: the message names the file and what is wrong."""


DATASET_FORM = "embedded, synthetic[:SAMPLES[:SIDE]] with SAMPLES >= 2 and SIDE >= 4, or a path"


@dataclass(frozen=True)
class Dataset:
    """Line 8 of the input file, parsed once (harness/dat.py): what every workload's
    `load` takes. `text` is what results.json records and the report echoes."""
    text: str                    # embedded | synthetic[:SAMPLES[:SIDE]] (canonical) | the path as given
    kind: str                    # embedded | synthetic | path
    samples: int | None = None   # synthetic: SAMPLES as given (None: the workload's default)
    side: int | None = None      # synthetic: SIDE as given, pixels (voxels for cosmoflow); None: default

    @classmethod
    def parse(cls, text: str) -> "Dataset":
        """The dataset a line 8 token names; ValueError (saying DATASET_FORM) for a
        malformed synthetic spec. Anything not embedded or synthetic is a path, which
        the workload checks when it loads it."""
        low = text.lower()
        if low == "embedded":
            return cls("embedded", "embedded")
        if low != "synthetic" and not low.startswith("synthetic:"):
            return cls(text, "path")
        parts = text.split(":")[1:]
        if len(parts) > 2 or not all(p.lstrip("+").isdigit() for p in parts):
            raise ValueError(DATASET_FORM)
        nums = [int(p) for p in parts]
        if (nums and nums[0] < 2) or (len(nums) == 2 and nums[1] < 4):
            raise ValueError(DATASET_FORM)
        nums += [None] * (2 - len(nums))
        return cls(":".join(["synthetic"] + [str(v) for v in nums if v is not None]), "synthetic", *nums)

    def size(self, default: tuple[int, int]) -> tuple[int, int]:
        """synthetic's (SAMPLES, SIDE), the workload's `default` for what was not given."""
        return self.samples or default[0], self.side or default[1]

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class Data:
    """A data set small enough to hold in memory (the digits workload)."""
    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    num_classes: int
    source: str            # what was read, for the report and results.json
    path: str = ""         # the folder read ("": the embedded set)

    @property
    def n_train(self) -> int:
        return len(self.y_train)

    @property
    def n_val(self) -> int:
        return len(self.y_val)

    def batches(self, rows: np.ndarray, batch: int):
        """Fancy-indexed numpy batches: nothing to decode, so no pipeline to hide (a
        tf.data pipeline here ran 4-8 % slower and stalled one epoch at 2 ranks on 2
        cores: bench/README.md, peers.py)."""
        for s in range(len(rows) // batch):
            idx = rows[s * batch:(s + 1) * batch]
            yield self.x_train[idx], self.y_train[idx]


def marker_name(workload: str) -> str:
    """The file the harness writes into every data set it generates (`hpcai500-<workload>.json`):
    what makes generated data recognisable whatever its path (data_facts' `marker`), so that
    a path to it is not taken for the published set (harness/division.py). Each reader
    ignores it (ic's reads its image side, classes and label base from it)."""
    return f"hpcai500-{workload}.json"


def write_marker(folder: str, workload: str, **what) -> None:
    """The marker of a data set the harness wrote into `folder`, saying what it holds."""
    with open(os.path.join(folder, marker_name(workload)), "w") as f:
        json.dump({"written_by": "hpcai500", **what}, f)


def marker(path: str, workload: str) -> str | None:
    """The harness's marker of the data set at `path` (a folder, or a file in one: ewa reads
    one HDF5 file too), as `path` was given; None where there is none."""
    if not path:   # the embedded set: nothing on disk
        return None
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    file = os.path.join(folder, marker_name(workload))
    return file if os.path.isfile(file) else None


def facts(data, workload: str, **more) -> dict:
    """data_facts' common part: the harness's marker (None: none found) and the split's sizes,
    with the workload's own facts `more` (harness/division.py compares them with PUBLISHED)."""
    return {"marker": marker(data.path, workload), "train_samples": int(data.n_train), "val_samples": int(data.n_val),
            **more}


def progress_or_nothing(progress):
    """A stage() function's `progress` callback, or one that does nothing when none is given."""
    return progress if progress is not None else _nothing


def _nothing() -> None:
    pass


def synthetic_once(path: str, write, read, node_rank: int, node_barrier):
    """A workload's data set on every rank of a node: the node's rank 0 first runs
    `write()` if `write` is given and `path` is not there yet (synthetic data: a
    directory there is a whole set, renamed into place), then `read()`; the node's
    other ranks read after it (files.node_once). The writer's own read is not repeated."""
    first = {}

    def prepare():
        if write is not None and not os.path.isdir(path):
            write()
        first["data"] = read()

    node_once(node_rank, node_barrier, prepare)
    return first["data"] if first else read()


def staging_folders(workload: str, rows, n_train: int, path: str, splits, progress):
    """The start of a stage(): (rows checked by staged_rows, progress or a no-op), and
    `path` emptied with one folder a split: an earlier copy's files would mix with
    this one's."""
    rows = staged_rows(workload, rows, n_train)
    shutil.rmtree(path, ignore_errors=True)
    for split in splits:
        os.makedirs(os.path.join(path, split))
    return rows, progress_or_nothing(progress)


def staged_rows(workload: str, rows, n_train: int) -> np.ndarray:
    """A stage() function's `rows` as int64, checked: sorted, unique, non-empty, each a
    training sample (0..n_train-1); ValueError naming the workload otherwise."""
    rows = np.asarray(rows, np.int64)
    if len(rows) == 0 or np.any(np.diff(rows) <= 0) or rows[0] < 0 or rows[-1] >= n_train:
        raise ValueError(f"{workload}.stage: rows must be sorted, unique, non-empty and in 0..{n_train - 1}")
    return rows


def top1(scores: np.ndarray, labels: np.ndarray) -> float:
    """Top-1 accuracy; ties in the scores go to the lowest class index."""
    return float(np.mean(np.argmax(scores, axis=1) == labels))


class Workload(Protocol):
    """What a workload module provides. `data` is the workload's own object; the
    harness reads only its attributes n_train, n_val (ints) and source (str, what was
    read, for the report)."""
    NAME: str
    QUALITY: str                 # "Top-1", "mAP@0.5", "MAE", ...
    TARGET_QUALITY: float        # the default of line 25
    PENALTY_N: float             # the default of line 26
    AGGREGATIONS: tuple          # the ensemble aggregations it supports (harness/ensemble.py)
    # Optional (DEFAULTS): "stack": each model's predictions keep their own columns in the
    # world reduction and quality() gets (n_val, M, width) to fuse (detection); "sum":
    # the models' score matrices are summed and quality() gets their mean.
    ENSEMBLE: str
    MOMENTUM: float              # SGD/LARS momentum of the workload's reference recipe
    # Optional (DEFAULTS: none): line 18's optimizer -> the reference recipe's options for
    # it (optimizers.make's weight_decay, epsilon, global_clipnorm), e.g. deepcam's LAMB.
    OPTIMIZER_OPTIONS: dict
    # Optional (DEFAULTS): False for an error (cosmoflow's MAE): the target is reached at or
    # below it, and every comparison of qualities (harness/metrics.py) turns round.
    HIGHER_IS_BETTER: bool
    # Optional (DEFAULTS: False): the quality is a mean over validation samples of a
    # per-sample figure, and quality(scores, data, rows) scores rows `rows` alone: the
    # harness then evaluates in chunks of rows (harness/run.Evaluation, deepcam).
    QUALITY_PER_SAMPLE: bool
    # Optional (DEFAULTS: None, the whole row): the adjacent score columns one vote chooses
    # among, when a row holds many predictions (deepcam: 3 classes a pixel).
    VOTE_GROUP: int | None

    # The published data set a closed result must read (harness/division.py): its "name" and
    # the facts of it that data_facts can state, e.g. "classes", "train_samples", "val_samples"
    # (an int, or a tuple of the published versions' values), each with its source in a comment.
    PUBLISHED: dict

    def load(self, dataset: Dataset, cache_dir: str, node_rank: int, node_barrier): ...
    def read(self, path: str): ...    # the one reader of real, synthetic and staged data

    def stage(self, data, rows, path: str, progress=None) -> int:
        """Bytes written: training samples `rows` (unique, sorted) and the validation set,
        in the workload's own on-disk format, into directory `path` (the Data Duplicator).
        `progress()` (optional; `progress_or_nothing`) is called after each file or shard
        written, and every block of a large one: the writer beats the watchdog with it, so
        that a long copy is not taken for a hang (harness/staging.py)."""

    def batches(self, data, rows, batch: int, *, training: bool, seed: int):
        """len(rows) // batch batches (x, y) of training samples `rows`, in that order, as
        numpy arrays (the harness shuffles and shards; the workload reads, decodes,
        augments): every framework's feed unless its model module gives its own
        (harness/frameworks/<framework>/models.py: ic's tf.data pipeline, for one)."""

    def score_width(self, data) -> int:
        """The columns of a validation row's scores, as every framework's predict() gives
        them (averageable over models)."""

    def quality(self, scores, data) -> float: ...  # scores of the whole validation set; see HIGHER_IS_BETTER

    def describe_model(self, data) -> tuple:
        """Optional (DEFAULTS): (note, deviations) for the model this data gets. `note`:
        what the analytic FLOP count of the model actually built covers and leaves out,
        printed in the report (or None); `deviations`: how that model differs from the
        workload's reference model (a ranking result has none, harness/division.py)."""

    def data_facts(self, data) -> dict:
        """What the division's data rule rests on (harness/division.data_reasons), as JSON
        values: `marker` (the harness's marker file found with the data, `workloads.marker`:
        it wrote the data; None: none), `train_samples`, `val_samples`, and a value for
        every other fact PUBLISHED states (None: not known). results.json records them per
        test and --verify judges the division again from them."""

    def describe_data(self, data) -> list:
        """Optional (DEFAULTS): lines for the report's conventions (and results.json's
        `conventions`) on what the reader decided about the data and how: e.g. ewa's box
        column order and validation years, ic's label base. Default: no lines."""


DEFAULTS = {"ENSEMBLE": "sum", "MOMENTUM": 0.9, "HIGHER_IS_BETTER": True, "VOTE_GROUP": None,
            "OPTIMIZER_OPTIONS": {}, "QUALITY_PER_SAMPLE": False,
            "describe_model": lambda data: (None, []), "describe_data": lambda data: []}


def required_members(protocol, defaults: dict) -> tuple:
    """The members of an interface `protocol` a module must give itself: every public
    annotation and method but the optional ones of `defaults`."""
    return tuple(n for n in (*protocol.__annotations__, *vars(protocol)) if not n.startswith("_") and n not in defaults)


def checked_module(path: str, required: tuple, defaults: dict, what: str = ""):
    """Module `path`, imported, checked to give every member of `required` (TypeError naming
    it, `what` before its name, and what it lacks), with the optional members of `defaults`
    it does not give filled in: the one check of every interface of modules (the workloads,
    a framework's workload models)."""
    module = importlib.import_module(path)
    missing = [n for n in required if not hasattr(module, n)]
    if missing:
        raise TypeError(f"{what}{module.__name__} lacks {', '.join(missing)}")
    for key, value in defaults.items():
        if not hasattr(module, key):
            setattr(module, key, value)
    return module


REQUIRED = required_members(Workload, DEFAULTS)


def training_feed(batches, stream, data, shards, epochs: int, batch: int, seed: int):
    """The training loop's one iterator of batches over all epochs, from a framework's
    feed of the workload: `stream(data, shards, epochs, batch, *, seed)` if it is given
    (one pipeline for every epoch), else `batches` (the Workload.batches contract) of each
    epoch's rows `shards(e)` in turn (each_epoch)."""
    if stream is not None:
        return stream(data, shards, epochs, batch, seed=seed)
    return each_epoch(lambda rows, s: batches(data, rows, batch, training=True, seed=s), shards, epochs, seed)


def each_epoch(batches_of, shards, epochs: int, seed: int):
    """The batches `batches_of(shards(e), seed + e)` of epoch e = 0 .. epochs-1 in turn: a
    training feed made of per-epoch feeds, epoch e augmented from seed + e. Lazy: epoch
    e's rows are drawn when the chain reaches them."""
    return itertools.chain.from_iterable(batches_of(shards(e), seed + e) for e in range(epochs))


def score(workload, scores, data, rows: slice) -> float:
    """The quality of validation rows `rows` from their scores: the workload's quality
    of that chunk (QUALITY_PER_SAMPLE), else of the whole set, which `rows` then is."""
    if workload.QUALITY_PER_SAMPLE:
        return workload.quality(scores, data, rows)
    return workload.quality(scores, data)


def target_and_n(workload, cfg) -> tuple[float, float]:
    """The target quality and penalty exponent n of a test (lines 25-26; -1 = the
    workload's default): what the run measures against and --verify re-derives."""
    return (workload.TARGET_QUALITY if cfg.target_quality < 0 else cfg.target_quality,
            workload.PENALTY_N if cfg.penalty_n < 0 else cfg.penalty_n)


def get(name: str) -> Workload:
    """The workload module for a name from HPCAI500.dat's workloads line, checked
    against the interface, with the optional constants' defaults filled in."""
    if name not in CHOICES:
        raise KeyError(f"unknown workload {name!r} (built: {', '.join(CHOICES)})")
    return checked_module(f"harness.workloads.{name}", REQUIRED, DEFAULTS, "workload module ")
