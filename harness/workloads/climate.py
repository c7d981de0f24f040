"""climate: the DeepCAM climate data on disk (MLPerf HPC's layout), read and checked, and our staged copy.

`read` is the one reader of published, synthetic and staged data. The layout is the MLPerf
HPC reference's (mlcommons/hpc, deepcam/src/deepCam/data/cam_hdf5_dataset.py), from v0.7 on:

    <dir>/train/*.h5, <dir>/validation/*.h5   one sample a file, sorted by name
        climate/data      (H, W, 16), channels last (published: 768 x 1152 x 16 float32)
        climate/labels_0  (H, W), per pixel 0 background, 1 tropical cyclone, 2 atmospheric
                          river; any integer or float dtype holding whole values 0..2 (the
                          reference casts them with astype(int64))
    <dir>/stats.h5
        climate/minval, climate/maxval   16 values each: the normalisation
        climate/mean, climate/sqmean, climate/count   (written, not read)

Normalisation, the reference's, per channel in float32: x_norm = (x - minval) * (1 / (maxval
- minval)); `Data.shift` is minval and `Data.scale` 1 / (maxval - minval), the latter computed
in the stats file's own dtype as the reference does (so float32 stats give its float32 scale).

The 2019 version of the data names the labels `climate/labels`: such a file is refused, named.

What is checked when. The published training set is 121,266 files, so `read` opens only
stats.h5 and the FIRST file of each split: both folders hold *.h5 files; minval and maxval
are 16 finite values with maxval > minval in every channel; each first file has both
datasets, data (H, W, 16) and labels (H, W); H and W are multiples of SIDE_MULTIPLE (16, the
model's output stride); the two first files agree on (H, W). Every file (the first ones
again) is checked when `samples` or `labels` reads it: the same keys, the set's (H, W), and
every label value whole and in 0..2; a bad file stops the read with a DataError naming it.
Values of climate/data are not checked (NaN included): the reference does not, and it would
cost a pass over 57 MB a sample.

`stage` writes the Data Duplicator's node-local copy in the same layout, so that `read`
reads it back: the chosen training files copied byte for byte (named so that their sorted
order is the order chosen), the validation files and stats.h5 whole. `write_sample` and
`write_stats` write the layout (climate_synthetic.py writes the synthetic set with them).
"""
from __future__ import annotations

import glob
import os
import shutil
from dataclasses import dataclass

import h5py
import numpy as np

from harness.files import atomic_path
from harness.workloads import DataError, staging_folders

CHANNELS = 16
CLASSES = 3
CLASS_NAMES = ("background", "tropical cyclone", "atmospheric river")
DATA_KEY, LABEL_KEY, OLD_LABEL_KEY = "climate/data", "climate/labels_0", "climate/labels"
MIN_KEY, MAX_KEY = "climate/minval", "climate/maxval"
SPLITS = ("train", "validation")
STATS_FILE = "stats.h5"
SIDE_MULTIPLE = 16   # the model's output stride: H and W must be multiples of it
LAYOUT = ("MLPerf HPC's DeepCAM layout: <dir>/train/*.h5 and <dir>/validation/*.h5, one sample a file "
          f"('{DATA_KEY}' (H, W, {CHANNELS}), '{LABEL_KEY}' (H, W)), and <dir>/{STATS_FILE}")
LABEL_VALUES = f"whole values 0..{CLASSES - 1} ({', '.join(f'{k} {n}' for k, n in enumerate(CLASS_NAMES))})"


@dataclass(frozen=True, eq=False)
class Data:
    """An opened DeepCAM data set: file lists and the normalisation in memory, samples on disk."""
    path: str                  # the directory read
    source: str                # what was asked for, for the report (the dataset text or the path)
    train_files: tuple         # sorted paths, one sample each
    val_files: tuple           # sorted paths, one sample each
    height: int                # pixels (H: latitude)
    width: int                 # pixels (W: longitude)
    shift: np.ndarray          # (16,) float32: minval, in the data's physical units
    scale: np.ndarray          # (16,) float32: 1 / (maxval - minval), per those units

    n_train = property(lambda self: len(self.train_files))
    n_val = property(lambda self: len(self.val_files))


# ---- reading --------------------------------------------------------------------------

def read(path: str, source: str | None = None) -> Data:
    """The one reader of published, synthetic and staged data: file lists, statistics, and
    the first file of each split checked (see the module docstring for what, and when the
    others are)."""
    if not os.path.isdir(path):
        raise DataError(f"deepcam dataset {path!r}: not a directory ({LAYOUT})")
    train_files, val_files = list_files(path, "train"), list_files(path, "validation")
    shift, scale = _statistics(os.path.join(path, STATS_FILE))
    with _open(train_files[0]) as f:
        hw = _layout(train_files[0], f)
    with _open(val_files[0]) as f:
        val_hw = _layout(val_files[0], f)
    if val_hw != hw:
        raise DataError(f"{val_files[0]}: found samples of {val_hw[0]} x {val_hw[1]}, expected {hw[0]} x {hw[1]} "
                        f"like the first training file ({train_files[0]}): one size for the whole set")
    return Data(path, source or path, tuple(train_files), tuple(val_files), hw[0], hw[1], shift, scale)


def list_files(path: str, split: str) -> list[str]:
    """The sorted `<path>/<split>/*.h5` (glob skips the hidden temporary names of a writer);
    DataError if the folder is missing or holds none."""
    folder = os.path.join(path, split)
    if not os.path.isdir(folder):
        raise DataError(f"{folder}: no such directory ({LAYOUT})")
    files = sorted(glob.glob(os.path.join(folder, "*.h5")))
    if not files:
        raise DataError(f"{folder}: no *.h5 files ({LAYOUT})")
    return files


def _open(file: str) -> h5py.File:
    try:
        # no HDF5 file locks: nothing is written in place (temporary name, then rename), and
        # locks fail on some parallel file systems
        return h5py.File(file, "r", locking=False)
    except OSError as e:
        raise DataError(f"{file}: cannot open as HDF5 ({e})") from None


def _dataset(file: str, f: h5py.File, key: str, what: str) -> h5py.Dataset:
    """f[key], a numeric dataset, or DataError naming the file."""
    if key not in f or not isinstance(f[key], h5py.Dataset):
        raise DataError(f"{file}: found no dataset '{key}', expected {what} ({LAYOUT})")
    ds = f[key]
    if ds.dtype.kind not in "biuf":
        raise DataError(f"{file}: dataset '{key}': found dtype {ds.dtype}, expected numbers ({what})")
    return ds


def _statistics(file: str) -> tuple[np.ndarray, np.ndarray]:
    """(shift, scale), float32 (16,) each, of stats.h5's minval and maxval, checked."""
    if not os.path.isfile(file):
        raise DataError(f"{file}: no such file; it holds '{MIN_KEY}' and '{MAX_KEY}', {CHANNELS} values each, "
                        f"the normalisation ({LAYOUT})")
    values = []
    with _open(file) as f:
        for key in (MIN_KEY, MAX_KEY):
            v = _dataset(file, f, key, f"{CHANNELS} values, one a channel")[...]
            if v.shape != (CHANNELS,):
                raise DataError(f"{file}: dataset '{key}': found shape {v.shape}, expected ({CHANNELS},): one "
                                "value a channel")
            v = v if v.dtype.kind == "f" else v.astype(np.float64)
            bad = np.flatnonzero(~np.isfinite(v))
            if len(bad):
                raise DataError(f"{file}: dataset '{key}': channel {bad[0]}: found {v[bad[0]]}, expected a finite "
                                "value")
            values.append(v)
    lo, hi = values
    bad = np.flatnonzero(~(hi > lo))
    if len(bad):
        c = bad[0]
        raise DataError(f"{file}: channel {c}: found maxval {hi[c]} <= minval {lo[c]}, expected maxval > minval "
                        "(the normalisation divides by maxval - minval)")
    # in the file's dtype, as the reference's 1. / (maxval - minval), then float32
    scale = (1.0 / (hi - lo)).astype(np.float32)
    bad = np.flatnonzero(~np.isfinite(scale))
    if len(bad):
        c = bad[0]
        raise DataError(f"{file}: channel {c}: found maxval - minval = {hi[c] - lo[c]}, expected a difference "
                        "whose inverse is a finite float32")
    return lo.astype(np.float32), scale


def _layout(file: str, f: h5py.File, hw: tuple[int, int] | None = None, like: str = "") -> tuple[int, int]:
    """A sample file's (H, W), its datasets' presence and shapes checked: H and W multiples
    of SIDE_MULTIPLE (hw None: a split's first file), or equal to `hw` (the set's, from
    the file `like`)."""
    if LABEL_KEY not in f and OLD_LABEL_KEY in f:
        raise DataError(f"{file}: found '{OLD_LABEL_KEY}' and no '{LABEL_KEY}': the 2019 layout of the DeepCAM "
                        f"data; the MLPerf HPC data since v0.7 has '{LABEL_KEY}'")
    data = _dataset(file, f, DATA_KEY, f"(H, W, {CHANNELS}) values, channels last")
    labels = _dataset(file, f, LABEL_KEY, f"(H, W) classes, {LABEL_VALUES}")
    shape = data.shape
    if hw is not None:
        if shape != (*hw, CHANNELS):
            raise DataError(f"{file}: dataset '{DATA_KEY}': found shape {shape}, expected {(*hw, CHANNELS)} "
                            f"(H, W, {CHANNELS}) like the set's first training file ({like})")
    elif len(shape) != 3 or shape[2] != CHANNELS:
        raise DataError(f"{file}: dataset '{DATA_KEY}': found shape {shape}, expected (H, W, {CHANNELS}): "
                        f"{CHANNELS} channels, channels last")
    elif shape[0] % SIDE_MULTIPLE or shape[1] % SIDE_MULTIPLE or 0 in shape:
        raise DataError(f"{file}: dataset '{DATA_KEY}': found H x W = {shape[0]} x {shape[1]}, expected "
                        f"multiples of {SIDE_MULTIPLE} (the model's output stride {SIDE_MULTIPLE}: the encoder "
                        f"divides each side by {SIDE_MULTIPLE} and the decoder multiplies it back)")
    if labels.shape != shape[:2]:
        raise DataError(f"{file}: dataset '{LABEL_KEY}': found shape {labels.shape}, expected {shape[:2]}: "
                        f"(H, W) of its '{DATA_KEY}'")
    return shape[0], shape[1]


# ---- samples --------------------------------------------------------------------------

def samples(data: Data, split: str, rows) -> tuple[np.ndarray, np.ndarray]:
    """(x float32 (n, H, W, 16) normalised, channels last; y int32 (n, H, W) classes) of
    samples `rows` of `split`, in that order (repeats allowed: a repeated file is read
    once). Each file is checked as it is read (the module docstring)."""
    files, rows = _rows(data, split, rows)
    x = np.empty((len(rows), data.height, data.width, CHANNELS), np.float32)
    y = np.empty((len(rows), data.height, data.width), np.int32)
    seen = {}
    for k, row in enumerate(rows.tolist()):
        if row in seen:
            x[k], y[k] = x[seen[row]], y[seen[row]]
            continue
        seen[row] = k
        file = files[row]
        with _open(file) as f:
            _layout(file, f, (data.height, data.width), data.train_files[0])
            try:  # straight into the batch, converted to float32 by HDF5 if stored otherwise
                f[DATA_KEY].read_direct(x[k])
            except (OSError, ValueError) as e:
                raise DataError(f"{file}: dataset '{DATA_KEY}': cannot read ({e})") from None
            _labels(file, f[LABEL_KEY], y[k])
    x -= data.shift      # the reference's (x - minval) * (1 / (maxval - minval)), in float32
    x *= data.scale
    return x, y


def labels(data: Data, rows) -> np.ndarray:
    """int32 (n, H, W): the classes of validation samples `rows`, in that order, without
    reading climate/data (its presence and shape are checked, as samples() does)."""
    files, rows = _rows(data, "validation", rows)
    y = np.empty((len(rows), data.height, data.width), np.int32)
    for k, row in enumerate(rows.tolist()):
        file = files[row]
        with _open(file) as f:
            _layout(file, f, (data.height, data.width), data.train_files[0])
            _labels(file, f[LABEL_KEY], y[k])
    return y


def _rows(data: Data, split: str, rows) -> tuple[tuple, np.ndarray]:
    """(the split's files, rows as int64), rows checked against them."""
    if split not in SPLITS:
        raise ValueError(f"climate: split {split!r}, expected one of {SPLITS}")
    files = data.train_files if split == "train" else data.val_files
    rows = np.asarray(rows, np.int64).reshape(-1)
    if len(rows) and (rows.min() < 0 or rows.max() >= len(files)):
        raise IndexError(f"climate: {split} rows {rows.min()}..{rows.max()} outside 0..{len(files) - 1}")
    return files, rows


def _labels(file: str, ds: h5py.Dataset, out: np.ndarray) -> None:
    """A label map into `out` (int32), every value checked whole and in 0..2."""
    try:
        raw = ds[...]
    except (OSError, ValueError) as e:
        raise DataError(f"{file}: dataset '{LABEL_KEY}': cannot read ({e})") from None
    with np.errstate(invalid="ignore"):   # NaN or huge floats: the comparison below catches them
        out[...] = raw
    # a value that did not survive the cast (a fraction, NaN, out of int32) differs from it
    bad = (out != raw) | (out < 0) | (out >= CLASSES)
    if bad.any():
        at = int(np.argmax(bad))
        r, c = divmod(at, out.shape[1])
        raise DataError(f"{file}: dataset '{LABEL_KEY}': found {raw.flat[at].item()!r} at (row {r}, column {c}) "
                        f"and {int(bad.sum()) - 1} more bad pixel(s), expected {LABEL_VALUES}")


# ---- writing: a sample, the statistics, the staged copy -------------------------------

def write_sample(file: str, x: np.ndarray, y: np.ndarray) -> None:
    """One file of the published layout: x (H, W, 16) stored float32, y (H, W) stored in
    its own dtype (values are not checked: the reader does that). Written whole or not
    at all (a temporary name in the same folder, hidden from the reader's *.h5, then
    renamed)."""
    x, y = np.asarray(x), np.asarray(y)
    if x.ndim != 3 or x.shape[2] != CHANNELS or y.shape != x.shape[:2]:
        raise ValueError(f"climate.write_sample: x {x.shape} and y {y.shape}, expected (H, W, {CHANNELS}) "
                         "and (H, W)")
    with atomic_path(file) as tmp, h5py.File(tmp, "w") as f:
        f.create_dataset(DATA_KEY, data=x.astype(np.float32, copy=False))
        f.create_dataset(LABEL_KEY, data=y)


def write_stats(path: str, minval, maxval, mean, sqmean, count) -> None:
    """`<path>/stats.h5` as the reference's summarize_data.py writes it: minval, maxval,
    mean, sqmean (16 each, per channel over the training set, stored float32) and count
    (the training samples, an int64 scalar). Atomic as write_sample."""
    values = {k: np.asarray(v, np.float32) for k, v in
              (("minval", minval), ("maxval", maxval), ("mean", mean), ("sqmean", sqmean))}
    for key, v in values.items():
        if v.shape != (CHANNELS,):
            raise ValueError(f"climate.write_stats: {key} of shape {v.shape}, expected ({CHANNELS},)")
    with atomic_path(os.path.join(path, STATS_FILE)) as tmp, h5py.File(tmp, "w") as f:
        for key, v in values.items():
            f.create_dataset(f"climate/{key}", data=v)
        f.create_dataset("climate/count", data=np.int64(count))


def stage(data: Data, rows, path: str, progress=None) -> int:
    """The Data Duplicator's node-local copy in the published layout: training samples
    `rows` (sorted, unique), file k of the copy's train/ being rows[k] (named
    `<k, 9 digits>_<name>` so that the sorted order is rows' order), the validation files
    and stats.h5 whole, each copied byte for byte. Returns the bytes written; `progress()`
    after each file."""
    rows, progress = staging_folders("climate", rows, data.n_train, path, SPLITS, progress)
    sources = [data.train_files[row] for row in rows.tolist()]
    copies = [(f, os.path.join(path, "train", f"{k:09d}_{os.path.basename(f)}")) for k, f in enumerate(sources)]
    copies += [(f, os.path.join(path, "validation", os.path.basename(f))) for f in data.val_files]
    copies.append((os.path.join(data.path, STATS_FILE), os.path.join(path, STATS_FILE)))
    written = 0
    for src, dst in copies:
        shutil.copyfile(src, dst)
        written += os.path.getsize(dst)
        progress()
    return written
