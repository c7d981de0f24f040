"""extreme_weather: the ExtremeWeather data set on disk, read and checked, and our staged copy.

`read` is the one reader of real, synthetic and staged data. A path is a directory of
HDF5 files (`*.h5`, `*.hdf5`, sorted by name) or one such file. Two layouts, told apart
by content (a root attribute), never by file name:

* Published (extremeweatherdataset.github.io: one file per year, `climo_YYYY.h5`):
      images  (N, 16, H, W) float32, channels first, raw physical values
      boxes   (N, G, 5): four pixel coordinates and a class id; rows of -1 pad
  Channels: PRECT, PS, PSL, QREFHT, T200, T500, TMQ, TREFHT, TS, U850, UBOT, V850,
  VBOT, Z1000, Z200, ZBOT in that order (CHANNEL_NAMES), unless the file names them
  (a root or `images` attribute of CHANNEL_NAME_KEYS holding 16 names).
  Box order, detected (`detect_order`): the dataset's page says a row is (ymin, xmin,
  ymax, xmax, class), y on the 768 axis (`yxyxc`); the authors' converter writes
  (ymin, ymax, xmin, xmax, class) in the page's naming (`yyxxc`). Neither is verified
  against a real file, so the reader reads the box columns of every file and keeps
  the one reading of CANDIDATE_ORDERS (those two and their x-first twins `xyxyc`,
  `xxyyc`; the class last, as both sources say) that puts every real row inside the
  image (0 <= min < max <= the image's own height or width). Several readings that
  fit every row, or none, stop the read with a DataError showing sample rows and
  naming HPCAI500_EWA_BOX_ORDER, which decides it: set, there is no detection (its
  letters: the four coordinates, the first y/x the minimum, the second the maximum,
  `c` for the class, last when left out; e.g. `yxyxc`, `yyxxc`, `cyxyx`), boxes
  reaching past the image are clipped to it, and a row it leaves empty or wholly
  outside is an error.
  Split: the published set is 25 year files (1979-2005 without 1983 and 1999) with
  no official split. The files named in HPCAI500_EWA_VAL (comma-separated file names)
  are the validation set, by default the last file by name (the last year). A single
  file is split by images: its last VAL_FRACTION are the validation set.
  What was decided (box order, channel names, split, and how) is kept in the Data
  object and stated in the report (ewa.describe_data).
  Normalisation: per-channel mean and standard deviation over up to STATS_SAMPLE evenly
  spaced training images, computed once and cached as `ewa-stats-<key>.npz` (key: the
  training files' names, sizes and ranges) beside the data, or in the run's cache
  directory if the data's directory refuses it.
* Ours (`write_staged`, the Data Duplicator's node-local copy): files with the root
  attribute `hpcai500_ewa` = "channels_last", one split each (attribute `split`):
  images (N, H, W, 16) channels last (what the model takes: no transpose a read), boxes
  (N, G, 5) rows (class, ymin, xmin, ymax, xmax), and in the training file
  `channel_mean`, `channel_std`: the source's statistics.

After reading, every box row is (class, ymin, xmin, ymax, xmax) in pixels, continuous
coordinates clipped to the image, class -1 for padding. Boxes are held in memory (20
bytes a row); images stay on disk and are read a batch at a time (Data.images). Bad
data raises DataError naming the file and the dataset.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import h5py
import numpy as np

from harness.files import atomic_path
from harness.workloads import DataError, progress_or_nothing
from harness.workloads.detection import BOX_ORDER_FORM, box_columns

CHANNELS, CLASSES = 16, 4
CLASS_NAMES = ("tropical depression", "tropical cyclone", "extratropical cyclone", "atmospheric river")
VAL_FRACTION = 0.2         # of a single file's images, when the data set is one file
STATS_SAMPLE = 256         # training images the statistics are computed over, at most
BOX_ORDER_ENV, VAL_ENV = "HPCAI500_EWA_BOX_ORDER", "HPCAI500_EWA_VAL"
PAGE_ORDER, CONVERTER_ORDER = "yxyxc", "yyxxc"   # the dataset page's row order; the authors' converter's
CANDIDATE_ORDERS = (PAGE_ORDER, CONVERTER_ORDER, "xyxyc", "xxyyc")   # what detection tries; class last
CHANNEL_NAMES = ("PRECT", "PS", "PSL", "QREFHT", "T200", "T500", "TMQ", "TREFHT", "TS", "U850", "UBOT",
                 "V850", "VBOT", "Z1000", "Z200", "ZBOT")   # the published files' channel order
CHANNEL_NAME_KEYS = ("channels", "channel_names", "variables")   # attributes that may name them
SAMPLE_ROWS = 4            # rows an ambiguous-order error shows
OURS = ("hpcai500_ewa", "channels_last")   # root attribute of the files `write_staged` writes
OUR_ORDER = "cyxyx"
SPLITS = ("train", "val")


class Part(NamedTuple):
    """A run of images of one file: rows start .. start + count of its datasets."""
    file: str
    start: int
    count: int
    channels_first: bool


@dataclass(frozen=True, eq=False)
class Data:
    """An opened ewa data set: boxes and statistics in memory, images on disk."""
    path: str                  # the directory (or the one file) read
    source: str                # what was asked for, for the report
    parts: dict                # split -> [Part], in sample order
    train_boxes: np.ndarray    # (n_train, G, 5) float32 rows (class, ymin, xmin, ymax, xmax), pixels
    val_boxes: np.ndarray      # (n_val, G, 5), the same
    height: int                # pixels
    width: int                 # pixels
    mean: np.ndarray           # (16,) float32, per channel, in the data's physical units
    std: np.ndarray            # (16,) float32, per channel, > 0
    box_order: str = PAGE_ORDER    # the column order the box rows were read in
    box_order_how: str = ""        # how it was decided ("detected from ...", "set by ...")
    channel_names: tuple = CHANNEL_NAMES
    channel_names_how: str = "the published order; the files carry no names"
    split_how: str = ""            # which files (or images) are the validation set, and why
    _files: dict = field(default_factory=dict, init=False, repr=False)  # file -> open h5py.File

    n_train = property(lambda self: len(self.train_boxes))
    n_val = property(lambda self: len(self.val_boxes))
    max_boxes = property(lambda self: self.train_boxes.shape[1])

    def _dataset(self, file: str):
        if file not in self._files:
            # no HDF5 file locks: nothing is written in place (temporary name, then
            # rename), and locks fail on some parallel file systems
            self._files[file] = h5py.File(file, "r", locking=False)
        return self._files[file]["images"]

    def images(self, split: str, index) -> np.ndarray:
        """Raw images (n, H, W, 16), channels last, in the files' dtype, of `split` at a
        slice or at integer indices (any order, repeats allowed)."""
        idx = self._index(split, index)
        out = None
        for at, image, channels_first in self._read(split, idx):
            if out is None:
                out = np.empty((len(idx), self.height, self.width, CHANNELS), image.dtype)
            out[at] = image.transpose(1, 2, 0) if channels_first else image
        return out if out is not None else np.zeros((0, self.height, self.width, CHANNELS), np.float32)

    def normalised(self, split: str, index, flip=None) -> np.ndarray:
        """What the model takes: FP32 images (n, H, W, 16), channels last, (raw - mean) *
        (1 / std) per channel, of `split` at `index` (as images()), image k mirrored
        left-right where flip[k]. One pass per distinct image read: normalised in the
        files' layout, then transposed and mirrored on the copy into the batch. The
        values are those of normalising images() in float32 and flipping after (the
        same two float32 operations an element). ewa's feed of a batch of 4 at 96 x 144
        took 2.3 ms this way against 3.4 ms in separate passes (in-process, here): time
        taken from the step's own cores on a CPU-only node."""
        idx = self._index(split, index)
        flip = np.zeros(len(idx), bool) if flip is None else np.asarray(flip, bool)
        out = np.empty((len(idx), self.height, self.width, CHANNELS), np.float32)
        scale, x = np.float32(1.0) / self.std, None
        for at, image, channels_first in self._read(split, idx):
            if x is None or x.shape != image.shape:
                x = np.empty(image.shape, np.float32)
            shape = (CHANNELS, 1, 1) if channels_first else (CHANNELS,)  # the channel axis, either layout
            np.subtract(image if image.dtype == np.float32 else image.astype(np.float32), self.mean.reshape(shape),
                        out=x)
            x *= scale.reshape(shape)
            hwc = x.transpose(1, 2, 0) if channels_first else x
            for k in at:
                out[k] = hwc[:, ::-1] if flip[k] else hwc
        return out

    def _index(self, split: str, index) -> np.ndarray:
        count = sum(p.count for p in self.parts[split])
        return np.arange(count)[index] if isinstance(index, slice) else np.asarray(index, np.int64)

    def _read(self, split: str, idx: np.ndarray):
        """(positions in idx, the image as stored, whether it is channels first) for
        each distinct image of idx, each read once, on its own: h5py's fancy-index reads
        of several rows are ~50x slower per image than single-row reads (6 ms against
        0.1 ms at 96 x 144, measured here). The image is a buffer reused by the next."""
        parts = self.parts[split]
        offsets = np.cumsum([0] + [p.count for p in parts])
        which = np.searchsorted(offsets, idx, side="right") - 1
        for p in np.unique(which):
            part, at = parts[p], np.flatnonzero(which == p)
            ds = self._dataset(part.file)
            buf = np.empty(ds.shape[1:], ds.dtype)
            local = idx[at] - offsets[p] + part.start
            for row in np.unique(local):
                try:
                    ds.read_direct(buf, np.s_[int(row)])
                except (OSError, ValueError) as e:
                    raise DataError(f"{part.file}: dataset 'images': cannot read image {row} ({e})") from None
                yield at[local == row], buf, part.channels_first  # several positions: bootstrap rows repeat


# ---- box rows (the order's columns: detection.box_columns) ----------------------------

def to_rows(raw: np.ndarray, order: str) -> np.ndarray:
    """Box rows in `order` -> (class, ymin, xmin, ymax, xmax); rows with a negative class
    (the -1 padding) become (-1, 0, 0, 0, 0)."""
    rows = np.asarray(raw, np.float32)[..., box_columns(order)]
    rows[rows[..., 0] < 0] = [-1, 0, 0, 0, 0]
    return rows


def order_names(order: str) -> str:
    """A box order in words: order_names('yyxxc') == '(ymin, ymax, xmin, xmax, class)'."""
    cols = box_columns(order)
    names = ["class", "ymin", "xmin", "ymax", "xmax"]
    return "(" + ", ".join(names[cols.index(k)] for k in range(5)) + ")"


def inside(rows: np.ndarray, order: str, hw) -> np.ndarray:
    """(n,) bool: which raw box rows (n, 5), read in `order`, lie inside an image of
    height and width `hw` with min < max in both axes (0 <= min < max <= side)."""
    _, y0, x0, y1, x1 = np.asarray(rows, np.float64)[:, box_columns(order)].T
    h, w = hw
    return (0 <= y0) & (y0 < y1) & (y1 <= h) & (0 <= x0) & (x0 < x1) & (x1 <= w)


def fitting_orders(rows: np.ndarray, hw) -> list[str]:
    """The CANDIDATE_ORDERS in which every one of the real raw box rows (n, 5) fits
    the image (`inside`); the class column is the last in every candidate."""
    return [o for o in CANDIDATE_ORDERS if inside(rows, o, hw).all()]


def from_rows(rows: np.ndarray, order: str) -> np.ndarray:
    """The inverse of `to_rows`: padding rows become all -1, as in the published files."""
    out = np.empty_like(np.asarray(rows, np.float32))
    out[..., box_columns(order)] = rows
    out[rows[..., 0] < 0] = -1
    return out


# ---- reading -----------------------------------------------------------------------

def read(path: str, source: str | None = None, cache_dir: str | None = None,
         order: str | None = None, val: tuple[str, ...] = ()) -> Data:
    """Open a data set (see the module docstring): check every file, decide the box
    order, split, load boxes and statistics. `order`: the published box rows' column
    order (None: detected from the rows, `detect_order`); `val`: the file names of the
    validation years (default: the last file by name). Reads the last value of every
    file's images: a truncated or corrupt file end fails here, not in the middle of
    training."""
    files = _files(path)
    info = [_check(f) for f in files]
    ours = [i["ours"] for i in info]
    if any(ours) and not all(ours):
        raise DataError(f"{path}: mixes files written by stage() (channels last) with "
                        "published-layout files (channels first)")
    hws = {i["hw"] for i in info}
    if len(hws) > 1:
        raise DataError(f"{path}: files hold images of different sizes: "
                        + ", ".join(f"{os.path.basename(i['file'])} {i['hw']}" for i in info))
    (height, width), = hws
    if ours[0]:
        order, how = OUR_ORDER, "our staged layout (class first)"
    elif order:
        order, how = order.strip().lower(), f"set by {BOX_ORDER_ENV}"
    else:
        for i in info:  # the class column is the last in every candidate order
            _check_classes(i["file"], i["raw"][..., 4], "the class column, last in every candidate box order")
        order, how = detect_order(path, info, (height, width))
    for i in info:
        i["boxes"] = _check_boxes(i["file"], i["raw"], order, i["hw"])
    parts = _split(path, info, val) if not ours[0] else {
        s: [Part(i["file"], 0, i["n"], False) for i in info if i["split"] == s] for s in SPLITS}
    for s in SPLITS:
        if not parts[s] or sum(p.count for p in parts[s]) == 0:
            raise DataError(f"{path}: no {s} images (the validation files are those named in "
                            f"{VAL_ENV}, else the last file by name)")
    by_file = {i["file"]: i for i in info}
    g = max(i["boxes"].shape[1] for i in info)  # one G for all: one model input shape
    boxes = {s: np.concatenate([_pad(by_file[p.file]["boxes"][p.start:p.start + p.count], g)
                                for p in parts[s]]) for s in parts}
    if not (boxes["val"][..., 0] >= 0).any():
        names = ", ".join(sorted({os.path.basename(p.file) for p in parts["val"]}))
        raise DataError(f"{path}: the validation images ({names}) have no boxes: mAP needs "
                        "ground truth to measure against")
    named = {i["channels"] for i in info if i["channels"]}
    if len(named) > 1:
        raise DataError(f"{path}: files name their channels differently: "
                        + "; ".join(f"{os.path.basename(i['file'])} {', '.join(i['channels'])}"
                                    for i in info if i["channels"]))
    channels, channels_how = (named.pop(), "as the files name them") if named else (
        CHANNEL_NAMES, "the published order; the files carry no names")
    data = Data(path, source or path, parts, boxes["train"], boxes["val"], height, width,
                np.zeros(CHANNELS, np.float32), np.ones(CHANNELS, np.float32), order, how,
                channels, channels_how, _split_how(info, parts, val, ours[0]))
    stored = [i["stats"] for i in info if i["stats"] is not None and i["split"] == "train"]
    mean, std = stored[0] if stored else _cached_statistics(data, cache_dir)
    return replace(data, mean=mean.astype(np.float32), std=std.astype(np.float32))


def detect_order(path: str, info: list[dict], hw) -> tuple[str, str]:
    """(order, how): the one reading of CANDIDATE_ORDERS that keeps every real box row
    of every file inside the images (`inside`). DataError, with sample rows and the
    setting that decides it, when several readings fit every row or none does."""
    rows, where = [], []
    for k, i in enumerate(info):
        real = i["raw"][..., 4] >= 0
        rows.append(i["raw"][real])
        where.append(np.column_stack([np.full(int(real.sum()), k), np.argwhere(real)]))
    rows, where = np.concatenate(rows), np.concatenate(where)
    files = f"{len(info)} file{'s' if len(info) != 1 else ''}"
    if len(rows) == 0:  # nothing to decide from: the missing validation truth is the error
        return PAGE_ORDER, "no box rows to detect from"
    h, w = hw

    def show(n):
        k, image, j = where[n]
        return (f"{os.path.basename(info[k]['file'])} image {image} box {j} "
                f"[{', '.join(f'{v:g}' for v in rows[n])}]")

    fits = {o: inside(rows, o, hw) for o in CANDIDATE_ORDERS}
    ok = [o for o in CANDIDATE_ORDERS if fits[o].all()]
    if len(ok) == 1:
        return ok[0], (f"detected from {len(rows)} box rows of {files}: of the readings "
                       f"{', '.join(CANDIDATE_ORDERS)} only this one keeps every box inside the "
                       f"{h} x {w} images with min < max")
    decide = (f"set {BOX_ORDER_ENV} to the files' column order ({BOX_ORDER_FORM}; the dataset page's "
              f"order is {PAGE_ORDER}, the authors' converter's {CONVERTER_ORDER})")
    if ok:
        sample = np.unique(np.linspace(0, len(rows) - 1, min(SAMPLE_ROWS, len(rows))).astype(int))
        raise DataError(
            f"ewa dataset {path}: cannot tell the column order of the box rows: "
            f"{len(ok)} readings, {', '.join(f'{o} {order_names(o)}' for o in ok)}, keep every one of "
            f"the {len(rows)} box rows of {files} inside the {h} x {w} images with min < max. "
            f"Sample rows: {'; '.join(show(n) for n in sample)}. To decide, {decide}")
    fails = "; ".join(f"{o} {order_names(o)}: {int((~fits[o]).sum())} of {len(rows)} rows, e.g. "
                      f"{show(int(np.argmin(fits[o])))}" for o in CANDIDATE_ORDERS)
    raise DataError(
        f"ewa dataset {path}: no reading of the box rows keeps every box inside the {h} x {w} images "
        f"with min < max ({files}). Rows that do not fit: {fails}. If the files' order is none of these, "
        f"{decide}; set, boxes reaching past the image are clipped to it")


def _split_how(info: list[dict], parts: dict, val: tuple[str, ...], ours: bool) -> str:
    """Which files (or images) are the validation set, and why, for the report."""
    if ours:
        return "our staged copy (train.h5, val.h5)"
    if len(info) == 1 and not val:
        (t,), (v,) = parts["train"], parts["val"]
        return (f"validation = the last {VAL_FRACTION:.0%} of the images of {os.path.basename(t.file)} "
                f"({v.count} of {t.count + v.count}; one file)")
    names = {s: [os.path.basename(p.file) for p in parts[s]] for s in SPLITS}
    why = f"set by {VAL_ENV}" if val else f"the last file by name; {VAL_ENV} names others"
    train = names["train"]
    span = train[0] if len(train) == 1 else f"{train[0]} .. {train[-1]}"
    return (f"validation {', '.join(names['val'])} ({why}), training {len(train)} file"
            f"{'s' if len(train) != 1 else ''} ({span}); the published set has no official split")


def _files(path: str) -> list[str]:
    if os.path.isfile(path):
        return [path]
    if not os.path.isdir(path):
        raise DataError(f"ewa dataset {path!r}: no such file or directory (expected a directory "
                        "of HDF5 files, one per year, or one HDF5 file)")
    files = sorted(os.path.join(path, f) for f in os.listdir(path)
                   if f.endswith((".h5", ".hdf5")) and not f.startswith("."))
    if not files:
        raise DataError(f"ewa dataset {path!r}: no HDF5 files (*.h5, *.hdf5) in the directory")
    return files


def _split(path: str, info: list[dict], val: tuple[str, ...]) -> dict:
    """Published layout: train and validation parts (see the module docstring)."""
    names = [os.path.basename(i["file"]) for i in info]
    chosen = list(val)
    if chosen:
        missing = [v for v in chosen if v not in names]
        if missing:
            raise DataError(f"{VAL_ENV}={','.join(chosen)}: no file {missing[0]!r} in {path} "
                            f"(it holds {', '.join(names)})")
    elif len(info) > 1:
        chosen = names[-1:]
    else:  # one file: its last images are the validation set
        n = info[0]["n"]
        n_val = max(1, int(round(VAL_FRACTION * n)))
        if n - n_val < 1:
            raise DataError(f"{info[0]['file']}: {n} image(s) cannot be split into training and validation")
        f = info[0]["file"]
        return {"train": [Part(f, 0, n - n_val, True)], "val": [Part(f, n - n_val, n_val, True)]}
    return {s: [Part(i["file"], 0, i["n"], True) for i, name in zip(info, names) if (name in chosen) == (s == "val")]
            for s in SPLITS}


def _check(file: str) -> dict:
    """One file's layout, shapes, raw box rows (finite), channel names and stored statistics."""
    try:
        f = h5py.File(file, "r", locking=False)
    except OSError as e:
        raise DataError(f"{file}: cannot open as HDF5 ({e})") from None
    with f:
        ours = f.attrs.get(OURS[0]) in (OURS[1], OURS[1].encode())
        for name in ("images", "boxes"):
            if name not in f:
                raise DataError(f"{file}: no dataset '{name}'")
        images = f["images"]
        want = "(N, H, W, 16), channels last" if ours else "(N, 16, H, W), channels first"
        if images.ndim != 4 or images.shape[-1 if ours else 1] != CHANNELS or len(images) == 0:
            raise DataError(f"{file}: dataset 'images' must be {want} with N > 0, found {images.shape}")
        if images.dtype.kind != "f":
            raise DataError(f"{file}: dataset 'images' must hold floats, found {images.dtype}")
        try:
            raw = f["boxes"][...]
        except OSError as e:
            raise DataError(f"{file}: dataset 'boxes': cannot read ({e})") from None
        if raw.ndim != 3 or raw.shape[-1] != 5 or len(raw) != len(images):
            raise DataError(f"{file}: dataset 'boxes' must be (N, G, 5) with N = {len(images)} images, "
                            f"found {raw.shape}")
        try:  # the last value: the end of the data (a whole image would be 57 MB per file and rank)
            images[-1, -1, -1, -1]
        except OSError as e:
            raise DataError(f"{file}: dataset 'images': cannot read the last image (truncated? {e})") from None
        hw = tuple(images.shape[1:3] if ours else images.shape[2:4])
        split = f.attrs.get("split", b"")
        split = split.decode() if isinstance(split, bytes) else str(split)
        if ours and split not in SPLITS:
            raise DataError(f"{file}: attribute 'split' must be 'train' or 'val', found {split!r}")
        stats = None
        if "channel_mean" in f and "channel_std" in f:
            stats = f["channel_mean"][...], f["channel_std"][...]
            _check_stats(stats, f"{file}: datasets 'channel_mean'/'channel_std'")
        n = len(images)
        channels = _channel_names(f)
    if not np.isfinite(raw).all():
        raise DataError(f"{file}: dataset 'boxes' contains NaN or infinity")
    return {"file": file, "ours": ours, "hw": hw, "n": n, "split": split, "stats": stats,
            "raw": raw, "channels": channels}


def _channel_names(f) -> tuple | None:
    """The 16 channel names if the file gives them (a root or `images` attribute of
    CHANNEL_NAME_KEYS holding 16 strings), else None."""
    for attrs in (f.attrs, f["images"].attrs):
        for key in CHANNEL_NAME_KEYS:
            values = np.ravel(attrs[key]) if key in attrs else []
            if len(values) == CHANNELS and all(isinstance(v, (bytes, str)) for v in values):
                return tuple(v.decode() if isinstance(v, bytes) else v for v in values)
    return None


def _check_stats(stats, where: str) -> None:
    mean, std = stats
    if (np.shape(mean) != (CHANNELS,) or np.shape(std) != (CHANNELS,)
            or not np.isfinite(mean).all() or not np.isfinite(std).all() or (std <= 0).any()):
        raise DataError(f"{where} must be {CHANNELS} finite values each (std > 0)")


def _check_classes(file: str, cls: np.ndarray, where: str) -> None:
    bad = (cls != np.round(cls)) | (cls >= CLASSES)
    if bad.any():
        i, j = np.argwhere(bad)[0]
        raise DataError(f"{file}: dataset 'boxes': image {i} box {j}: class must be -1 (padding) or "
                        f"an integer in [0, {CLASSES}), found {cls[i, j]:g} ({where})")


def _check_boxes(file: str, raw: np.ndarray, order: str, hw) -> np.ndarray:
    """Raw rows in `order` -> our rows (class, ymin, xmin, ymax, xmax), checked and clipped."""
    boxes = to_rows(raw, order)
    cls = boxes[..., 0]
    _check_classes(file, cls, f"box order {order}")
    real = cls >= 0
    flat = (boxes[..., 3] <= boxes[..., 1]) | (boxes[..., 4] <= boxes[..., 2])
    if (real & flat).any():
        i, j = np.argwhere(real & flat)[0]
        raise DataError(f"{file}: dataset 'boxes': image {i} box {j} {raw[i, j].tolist()} is empty "
                        f"in box order {order} (min < max expected; see {BOX_ORDER_ENV})")
    # Boxes reaching past the image are clipped to it: the detector cannot see beyond.
    h, w = hw
    boxes[..., 1:5] = np.clip(boxes[..., 1:5], 0, [h, w, h, w])
    outside = real & ((boxes[..., 3] <= boxes[..., 1]) | (boxes[..., 4] <= boxes[..., 2]))
    if outside.any():
        i, j = np.argwhere(outside)[0]
        raise DataError(f"{file}: dataset 'boxes': image {i} box {j} {raw[i, j].tolist()} lies outside "
                        f"the {h} x {w} image in box order {order}")
    boxes[~real] = [-1, 0, 0, 0, 0]
    return boxes


def _pad(boxes: np.ndarray, g: int) -> np.ndarray:
    pad = np.tile(np.array([-1, 0, 0, 0, 0], np.float32), (len(boxes), g - boxes.shape[1], 1))
    return np.concatenate([boxes, pad], axis=1)


# ---- the statistics cache ----------------------------------------------------------

def _statistics(data: Data) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and standard deviation over evenly spaced training images."""
    total, total_sq, count = np.zeros(CHANNELS), np.zeros(CHANNELS), 0
    for i in np.unique(np.linspace(0, data.n_train - 1, min(STATS_SAMPLE, data.n_train)).astype(int)):
        x = data.images("train", [i]).astype(np.float64).reshape(-1, CHANNELS)
        total, total_sq, count = total + x.sum(0), total_sq + (x * x).sum(0), count + len(x)
    mean = total / count
    return mean, np.sqrt(np.maximum(total_sq / count - mean * mean, 1e-12))


def stats_name(data: Data) -> str:
    """The statistics cache's file name: a digest of what they are computed from."""
    key = [[os.path.basename(p.file), os.path.getsize(p.file), p.start, p.count] for p in data.parts["train"]]
    digest = hashlib.sha1(json.dumps([key, STATS_SAMPLE]).encode()).hexdigest()[:16]
    return f"ewa-stats-{digest}.npz"


def _cached_statistics(data: Data, cache_dir: str | None):
    """The training images' statistics from the cache beside the data (or in cache_dir),
    computed and written there on first use."""
    root = data.path if os.path.isdir(data.path) else os.path.dirname(os.path.abspath(data.path))
    places = [root, cache_dir or os.path.join(tempfile.gettempdir(), "hpcai500-ewa-stats")]
    name = stats_name(data)
    for place in places:
        file = os.path.join(place, name)
        if os.path.exists(file):
            try:
                with np.load(file) as z:
                    stats = z["mean"], z["std"]
                _check_stats(stats, f"{file}: 'mean'/'std'")
                return stats
            except (OSError, KeyError, ValueError):
                pass  # unreadable or bad: computed again and overwritten below
    stats = _statistics(data)
    for place in places:  # beside the data if writable, else the cache directory
        try:
            os.makedirs(place, exist_ok=True)
            # an open file: np.savez would append '.npz' to the temporary name
            with atomic_path(os.path.join(place, name)) as tmp, open(tmp, "wb") as f:
                np.savez(f, mean=stats[0], std=stats[1])
            break
        except OSError:
            pass  # not cached here: the next place, or computed again next time
    return stats


# ---- writing -----------------------------------------------------------------------

def write_published(file: str, images, boxes: np.ndarray, order: str) -> None:
    """One file of the published layout: `images` an iterable of len(boxes) images
    (16, H, W), channels first (written one at a time: memory stays at one image,
    whatever the size), `boxes` rows (class, ymin, xmin, ymax, xmax), written in box
    order `order` with all -1 padding rows."""
    with atomic_path(file) as tmp, h5py.File(tmp, "w") as f:
        ds = None
        for i, image in enumerate(images):
            if ds is None:
                ds = f.create_dataset("images", (len(boxes), *image.shape), np.float32, chunks=(1, *image.shape))
            ds[i] = image
        f.create_dataset("boxes", data=from_rows(boxes, order))


def write_staged(data: Data, rows: np.ndarray, path: str, progress=None) -> int:
    """The Data Duplicator's copy: training images `rows` (unique, sorted) and the
    validation set in our layout (channels last, class first: see the module
    docstring), with the source's normalisation statistics (a resample is normalised as
    the full set is). Copied in blocks of images, `progress()` after each block and
    each file; returns the bytes written."""
    progress = progress_or_nothing(progress)
    os.makedirs(path, exist_ok=True)
    rows = np.asarray(rows, np.int64)
    written = 0
    for split, index, boxes in (("train", rows, data.train_boxes[rows]),
                                ("val", np.arange(data.n_val), data.val_boxes)):
        file = os.path.join(path, f"{split}.h5")
        with atomic_path(file) as tmp, h5py.File(tmp, "w") as f:
            f.attrs[OURS[0]], f.attrs["split"] = OURS[1], split
            first = data.images(split, index[:1])
            images = f.create_dataset("images", (len(index), *first.shape[1:]), first.dtype,
                                      chunks=(1, *first.shape[1:]))
            block = max(1, (64 << 20) // max(1, first.nbytes))  # ~64 MB at a time
            for lo in range(0, len(index), block):
                images[lo:lo + block] = data.images(split, index[lo:lo + block])
                progress()
            f.create_dataset("boxes", data=boxes)
            if split == "train":
                f.create_dataset("channel_mean", data=data.mean)
                f.create_dataset("channel_std", data=data.std)
        written += os.path.getsize(file)
        progress()
    return written
