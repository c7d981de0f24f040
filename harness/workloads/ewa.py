"""ewa: Extreme Weather Analytics, Faster-RCNN on 16-channel climate images.

HPC AI500 V2.0's scientific workload: detect tropical depressions (class 0), tropical
cyclones (1), extratropical cyclones (2) and atmospheric rivers (3) in 768 x 1152
images of 16 climate variables; target mAP@[IoU=0.5] 0.35, n = 10, 50 epochs.

Data set (`read`, the one reader of real, synthetic and staged data). A path is a
directory of HDF5 files (`*.h5`, `*.hdf5`, sorted by name) or one such file. Two
layouts, told apart by content (a root attribute), never by file name:

* Published (ExtremeWeather, extremeweatherdataset.github.io: one file per year,
  `climo_YYYY.h5`), every file without our attribute:
      images  (N, 16, H, W) float32, channels first, raw physical values
      boxes   (N, G, 5): four pixel coordinates and a class id; rows of -1 pad
  The column order of a box row is HPCAI500_EWA_BOX_ORDER: the four coordinates as
  letters, the first y/x the minimum, the second the maximum, and `c` where the class
  is (last when left out). Default `yxyxc` = (ymin, xmin, ymax, xmax, class), which is
  what we believe the published files use; we could not verify it here (no copy of
  the data; the site's text lists "5 elements" per row). `xyxyc`, `cyxyx`, ... if not.
  Split: the files named in HPCAI500_EWA_VAL (comma-separated file names) are the
  validation set; by default the last file by name (the last year). A single file is
  split by images instead: its last VAL_FRACTION are validation.
  Normalisation: per-channel mean and standard deviation over (up to) STATS_SAMPLE
  evenly spaced training images, computed once and cached beside the data as
  `ewa-stats-<key>.npz` (key: the training files' names, sizes and ranges), or in the
  run's cache directory if the data directory is read-only.
* Ours (written by `stage`, the Data Duplicator's node-local copy): files with the
  root attribute `hpcai500_ewa` = "channels_last", each holding one split (attribute
  `split`): images (N, H, W, 16) channels last (what the model takes: no transpose
  per read), boxes (N, G, 5) rows (class, ymin, xmin, ymax, xmax), and in the training
  file `channel_mean`, `channel_std`: the source's statistics.

Boxes are clipped to the image; after reading, every box row is (class, ymin, xmin,
ymax, xmax) in pixels, continuous coordinates, class -1 for padding.

`synthetic[:SAMPLES[:SIDE]]` (default 320 images of 96 x 144; SIDE is the height, the
width 1.5 x SIDE as in 768 x 1152) writes the published layout once per node (5 year
files `climo_1979.h5` ... in HPCAI500_EWA_BOX_ORDER, the last year the validation set)
and reads it back through the same reader; about 1.5 s and 57 MB per image at full size.

Reading: boxes are held in memory (20 bytes per row); images are read per batch by
h5py, one image per read (h5py's multi-row fancy reads cost ~6 ms per image against
~0.1 ms at 96 x 144: they made the feed 12x slower), transposed to channels last and
normalised in numpy. A rank reads only its job's resample share and holds a batch,
not the data set. At 768 x 1152 an image is 57 MB in float32: a per-rank batch of 2
is ~0.11 GB of input before activations and takes ~0.15 s to read and normalise here.
`batches` yields numpy arrays by default. HPCAI500_EWA_PREFETCH=N (> 0) feeds the same
generator through tf.data.Dataset.from_generator + prefetch(N), so that reading
overlaps the step on a tf.data thread. Off by default: measured by bench/ewa.py at
96 x 144, B = 4, P = 2 on 2 cores, the feed is ~13 ms of a ~53 ms step, yet the
prefetching loop ran at 0.99x the plain one: with one rank per core there is no idle
core to read on (bench/README.md). On GPU nodes, where the CPU idles during a step,
set it to 2.

The model (faster_rcnn.py): a ResNet-50 trunk (conv1 to conv4, stride 16) by default,
a narrow two-stage backbone for images below 384 pixels or with
HPCAI500_EWA_BACKBONE=small (HPCAI500_EWA_BACKBONE=resnet50 forces the full one).

Ensemble: `predict` returns each image's top K detections, packed (K x 6 floats);
the harness stacks the M models' arrays (ENSEMBLE = "stack") and `quality` fuses
them class-wise (weighted box fusion, scores averaged over M: see detection.fuse)
before computing mAP@0.5.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from typing import NamedTuple

import h5py
import numpy as np

from harness.workloads import DataError
from harness.workloads import detection as det

NAME = "ewa"
QUALITY = "mAP@0.5"
TARGET_QUALITY = 0.35      # HPC AI500 V2.0, Table 3
PENALTY_N = 10
AGGREGATIONS = ("mean",)   # detections are fused, not voted
ENSEMBLE = "stack"         # each model keeps its own columns in the reduced score array
CHANNELS, CLASSES = 16, 4
CLASS_NAMES = ("tropical depression", "tropical cyclone", "extratropical cyclone", "atmospheric river")
VAL_FRACTION = 0.2         # of a single file's images, when the data set is one file
SYNTHETIC_DEFAULT = (320, 96)   # samples, image height (width = 1.5 x height, as 768 x 1152)
SYNTHETIC_MAX_BOXES = 3
SYNTHETIC_YEARS = 5        # files of the synthetic set; the last is the validation set
MIN_SIDE = 32
STATS_SAMPLE = 256
FLOPS_NOTE = ("FLOPs count the backbone, RPN and the ROI head once per ROI, with a fixed R ROIs"
              " per image (R = 128 with the ResNet-50 backbone, 64 with the small one; training and"
              " inference alike, whatever the image holds)"
              " (Table 3 rules); anchor decoding, NMS and crop-and-resize sampling have no"
              " Table 3 rule and are not counted")
FORMAT_VERSION = 2          # part of the synthetic cache name: bump when the generator changes
BOX_ORDER_ENV, VAL_ENV, DEFAULT_BOX_ORDER = "HPCAI500_EWA_BOX_ORDER", "HPCAI500_EWA_VAL", "yxyxc"
PREFETCH_ENV = "HPCAI500_EWA_PREFETCH"   # > 0: batches through tf.data with this prefetch depth
OURS = ("hpcai500_ewa", "channels_last")   # root attribute of the files `stage` writes
OUR_ORDER = "cyxyx"


class Part(NamedTuple):
    """A run of images of one file: rows start .. start + count of its datasets."""
    file: str
    start: int
    count: int
    channels_first: bool


class Data:
    """An opened ewa data set: boxes and statistics in memory, images on disk."""

    def __init__(self, path: str, source: str, parts: dict, boxes: dict,
                 image_hw: tuple[int, int], mean: np.ndarray, std: np.ndarray):
        self.path, self.source = path, source
        self.parts = parts                                  # split -> [Part]
        self.train_boxes, self.val_boxes = boxes["train"], boxes["val"]
        self.height, self.width = image_hw
        self.mean, self.std = mean.astype(np.float32), std.astype(np.float32)
        self._offsets = {s: np.cumsum([0] + [p.count for p in ps]) for s, ps in parts.items()}
        self._files = {}

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
        """Raw images (n, H, W, 16), channels last, of `split` at a slice or at integer
        indices (any order, repeats allowed). Each needed image is read once, on its
        own: h5py's fancy-index reads of several rows are ~50x slower per image than
        single-row reads (6 ms against 0.1 ms at 96 x 144, measured here)."""
        parts, offsets = self.parts[split], self._offsets[split]
        idx = np.arange(offsets[-1])[index] if isinstance(index, slice) else np.asarray(index, np.int64)
        which = np.searchsorted(offsets, idx, side="right") - 1
        out, buf = None, None
        for p in np.unique(which):
            part, at = parts[p], np.flatnonzero(which == p)
            ds = self._dataset(part.file)
            if buf is None or buf.dtype != ds.dtype:
                buf = np.empty(ds.shape[1:], ds.dtype)
            if out is None:
                out = np.empty((len(idx), self.height, self.width, CHANNELS), ds.dtype)
            local = idx[at] - offsets[p] + part.start
            for row in np.unique(local):
                try:
                    ds.read_direct(buf, np.s_[int(row)])
                except (OSError, ValueError) as e:
                    raise DataError(f"{part.file}: dataset 'images': cannot read image {row} ({e})") from None
                for k in at[local == row]:  # once per occurrence: bootstrap rows repeat
                    out[k] = buf.transpose(1, 2, 0) if part.channels_first else buf
        return out if out is not None else np.zeros((0, self.height, self.width, CHANNELS), np.float32)

    def normalised(self, images: np.ndarray) -> np.ndarray:
        """(images - mean) / std per channel, FP32, computed in place on one copy."""
        x = images.astype(np.float32, copy=True)
        x -= self.mean
        x *= 1.0 / self.std
        return x

    @property
    def config(self):
        from harness.workloads import faster_rcnn
        return faster_rcnn.config_for(self.height, self.width, self.max_boxes)


# ---- box rows ----------------------------------------------------------------------

def box_columns(order: str) -> list[int]:
    """The columns of (class, ymin, xmin, ymax, xmax) in a box row described by `order`:
    two y and two x letters, the first of each the minimum, and `c` for the class
    (appended when left out). box_columns('xyxyc') == [4, 1, 0, 3, 2]."""
    o = order.strip().lower()
    o = o if "c" in o else o + "c"
    if sorted(o) != sorted("cxxyy"):
        raise DataError(f"{BOX_ORDER_ENV}={order!r}: expected two y, two x and at most one c "
                        f"(e.g. yxyxc, xyxyc, cyxyx)")
    ys, xs = [i for i, ch in enumerate(o) if ch == "y"], [i for i, ch in enumerate(o) if ch == "x"]
    return [o.index("c"), ys[0], xs[0], ys[1], xs[1]]


def to_rows(raw: np.ndarray, order: str) -> np.ndarray:
    """Box rows in `order` -> (class, ymin, xmin, ymax, xmax); rows with a negative class
    (the -1 padding) become (-1, 0, 0, 0, 0)."""
    rows = np.asarray(raw, np.float32)[..., box_columns(order)]
    rows[rows[..., 0] < 0] = [-1, 0, 0, 0, 0]
    return rows


def from_rows(rows: np.ndarray, order: str) -> np.ndarray:
    """The inverse of `to_rows`: padding rows become all -1, as in the published files."""
    out = np.empty_like(np.asarray(rows, np.float32))
    out[..., box_columns(order)] = rows
    out[rows[..., 0] < 0] = -1
    return out


def box_order() -> str:
    order = os.environ.get(BOX_ORDER_ENV, DEFAULT_BOX_ORDER)
    box_columns(order)  # validated here: a bad value fails before any file is opened
    return order


# ---- reading -----------------------------------------------------------------------

def load(dataset: str, cache_dir: str, node_rank: int = 0, node_barrier=lambda: None) -> Data:
    """Every rank's data set. One rank per node writes synthetic data and reads first
    (computing and caching the statistics if needed); the others then read."""
    from harness.dat import dataset_spec
    kind, samples, side = dataset_spec(dataset)
    if kind == "embedded":
        raise DataError("ewa: there is no embedded data set for Extreme Weather Analytics; "
                        "use synthetic[:SAMPLES[:SIDE]] or a directory of HDF5 files (one per year)")
    path = dataset
    if kind == "synthetic":
        samples, side = samples or SYNTHETIC_DEFAULT[0], side or SYNTHETIC_DEFAULT[1]
        if side < MIN_SIDE:
            raise DataError(f"ewa {dataset!r}: SIDE (image height) must be at least {MIN_SIDE}: "
                            "the detector's feature map is 1/8 of the image and needs 4 x 6 cells")
        order = box_order()
        path = os.path.join(cache_dir, f"ewa-synthetic-v{FORMAT_VERSION}-{samples}-{side}-{order}")
    data = None
    try:
        if node_rank == 0:
            if kind == "synthetic" and not os.path.exists(os.path.join(path, "done")):
                write_synthetic(path, samples, side)
            data = read(path, source=dataset, cache_dir=cache_dir)
    finally:
        node_barrier()  # even after an error: the other ranks must not wait forever
    return data if data is not None else read(path, source=dataset, cache_dir=cache_dir)


def read(path: str, source: str | None = None, cache_dir: str | None = None) -> Data:
    """Open a data set (see the module docstring): check every file, split, load boxes
    and statistics. Reads the last value of every file's images: a truncated or
    corrupt file end fails here, not in the middle of training."""
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
    parts = _split(path, info) if not ours[0] else {
        s: [Part(i["file"], 0, i["n"], False) for i in info if i["split"] == s] for s in ("train", "val")}
    for s in ("train", "val"):
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
    data = Data(path, source or path, parts, boxes, hws.pop(), np.zeros(CHANNELS), np.ones(CHANNELS))
    stored = [i["stats"] for i in info if i["stats"] is not None and i["split"] == "train"]
    mean, std = stored[0] if stored else _cached_statistics(data, cache_dir)
    data.mean, data.std = mean.astype(np.float32), std.astype(np.float32)
    return data


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


def _split(path: str, info: list[dict]) -> dict:
    """Published layout: train and validation parts (see the module docstring)."""
    names = [os.path.basename(i["file"]) for i in info]
    chosen = [v.strip() for v in os.environ.get(VAL_ENV, "").split(",") if v.strip()]
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
            for s in ("train", "val")}


def _check(file: str) -> dict:
    """One file's layout, shapes, boxes (converted to our rows, checked) and stored statistics."""
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
        if ours and split not in ("train", "val"):
            raise DataError(f"{file}: attribute 'split' must be 'train' or 'val', found {split!r}")
        stats = None
        if "channel_mean" in f and "channel_std" in f:
            stats = f["channel_mean"][...], f["channel_std"][...]
            _check_stats(stats, f"{file}: datasets 'channel_mean'/'channel_std'")
        n = len(images)
    order = OUR_ORDER if ours else box_order()
    return {"file": file, "ours": ours, "hw": hw, "n": n, "split": split, "stats": stats,
            "boxes": _check_boxes(file, raw, order, hw)}


def _check_stats(stats, where: str) -> None:
    mean, std = stats
    if (np.shape(mean) != (CHANNELS,) or np.shape(std) != (CHANNELS,)
            or not np.isfinite(mean).all() or not np.isfinite(std).all() or (std <= 0).any()):
        raise DataError(f"{where} must be {CHANNELS} finite values each (std > 0)")


def _check_boxes(file: str, raw: np.ndarray, order: str, hw) -> np.ndarray:
    if not np.isfinite(raw).all():
        raise DataError(f"{file}: dataset 'boxes' contains NaN or infinity")
    boxes = to_rows(raw, order)
    cls = boxes[..., 0]
    bad = (cls != np.round(cls)) | (cls >= CLASSES)
    if bad.any():
        i, j = np.argwhere(bad)[0]
        raise DataError(f"{file}: dataset 'boxes': image {i} box {j}: class must be -1 (padding) or "
                        f"an integer in [0, {CLASSES}), found {cls[i, j]:g} (box order {order})")
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
        tmp = os.path.join(place, f".{name}.tmp{os.getpid()}.npz")
        try:
            os.makedirs(place, exist_ok=True)
            np.savez(tmp, mean=stats[0], std=stats[1])
            os.replace(tmp, os.path.join(place, name))  # readers never see half a file
            break
        except OSError:
            if os.path.exists(tmp):
                os.remove(tmp)
    return stats


# ---- synthetic data --------------------------------------------------------------

def write_synthetic(path: str, samples: int, side: int, seed: int = 2024) -> None:
    """Weather-like data in the published layout: SYNTHETIC_YEARS files `climo_1979.h5`,
    ... (the last one the validation set), channels first, box rows in the
    HPCAI500_EWA_BOX_ORDER order, float32. 16 channels of smooth noise with their own
    offsets and scales (as physical variables have), and 1-3 objects per image whose class
    decides shape, size and the channels it shows in. Written image by image: memory
    stays at one image whatever the size. A file `done` marks a finished set."""
    height, width = side, int(round(side * 1.5))
    years = min(SYNTHETIC_YEARS, samples)
    if years < 2:
        raise DataError(f"ewa synthetic: {samples} samples leave no training images")
    rng = np.random.default_rng(seed)
    os.makedirs(path, exist_ok=True)
    order = box_order()
    offsets, scales = np.arange(CHANNELS) * 10.0, 1.0 + np.arange(CHANNELS) * 0.5
    for k, count in enumerate(len(a) for a in np.array_split(np.arange(samples), years)):
        scenes = [_scene(rng, height, width) for _ in range(count)]
        _write_year(os.path.join(path, f"climo_{1979 + k}.h5"), scenes, height, width,
                    offsets, scales, rng, order)
    open(os.path.join(path, "done"), "w").close()


def _write_year(file, scenes, height, width, offsets, scales, rng, order):
    tmp = f"{file}.tmp{os.getpid()}"
    with h5py.File(tmp, "w") as f:
        images = f.create_dataset("images", (len(scenes), CHANNELS, height, width), np.float32,
                                  chunks=(1, CHANNELS, height, width))
        rows = np.full((len(scenes), SYNTHETIC_MAX_BOXES, 5), [-1, 0, 0, 0, 0], np.float32)
        for i, objects in enumerate(scenes):
            x = _render(rng, height, width, objects) * scales + offsets
            images[i] = x.transpose(2, 0, 1)
            rows[i, :len(objects)] = [(c, *box) for c, box, _ in objects]
        f.create_dataset("boxes", data=from_rows(rows, order))
    os.replace(tmp, file)  # readers never see a half-written file


def _scene(rng, height, width):
    """1-3 objects (class, box, shape parameters), overlapping little."""
    objects = []
    for _ in range(rng.integers(1, SYNTHETIC_MAX_BOXES + 1)):
        for _attempt in range(20):
            c = int(rng.integers(CLASSES))
            obj = _object(rng, c, height, width)
            if all(det.iou(np.array([obj[1]]), np.array([o[1]]))[0, 0] < 0.1 for o in objects):
                objects.append(obj)
                break
    return objects


def _object(rng, c, height, width):
    h = height
    if c == 3:  # atmospheric river: a long thin band, tilted up to 15 degrees
        length, thick = rng.uniform(0.45, 0.7) * width, rng.uniform(0.03, 0.05) * h
        angle = rng.uniform(-0.26, 0.26)
        half_y, half_x = 0.5 * length * abs(math.sin(angle)) + thick, 0.5 * length * math.cos(angle) + thick
        shape = (thick, angle, length)
    else:      # round-ish vortices: depressions small, cyclones larger with an eye ring,
        # extratropical cyclones large and wider than tall
        r = {0: (0.06, 0.09), 1: (0.10, 0.14), 2: (0.10, 0.15)}[c]
        half_y = rng.uniform(*r) * h
        half_x = half_y * (rng.uniform(1.6, 2.0) if c == 2 else 1.0)
        shape = (half_y, half_x)
    cy, cx = rng.uniform(half_y, h - half_y), rng.uniform(half_x, width - half_x)
    box = (max(cy - half_y, 0), max(cx - half_x, 0), min(cy + half_y, h), min(cx + half_x, width))
    return c, box, (cy, cx, shape)


# class -> (channels, sign): which variables an event shows in
_SIGNATURE = {0: ((0, 1, 2), (1, 1, -1)), 1: ((0, 1, 3, 4), (1, 1, 1, 1)),
              2: ((5, 6, 7, 2), (1, 1, 1, -1)), 3: ((8, 9, 10, 11), (1, 1, 1, 1))}


def _render(rng, height, width, objects, amplitude=2.5):
    """Smooth unit-variance noise in every channel plus the objects' signatures."""
    coarse = rng.standard_normal((max(2, height // 8), max(2, width // 8), CHANNELS))
    ry, rx = _interpolation(height, coarse.shape[0]), _interpolation(width, coarse.shape[1])
    # separable: two matrix products (BLAS), not one 4-index sum
    x = np.tensordot(ry, np.tensordot(rx, coarse, axes=([1], [1])), axes=([1], [1]))  # (H, W, C)
    x = x / x.std(axis=(0, 1)) + 0.1 * rng.standard_normal(x.shape)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float64) + 0.5
    for c, _, (cy, cx, shape) in objects:
        if c == 3:
            thick, angle, length = shape
            along = (xx - cx) * math.cos(angle) + (yy - cy) * math.sin(angle)
            across = -(xx - cx) * math.sin(angle) + (yy - cy) * math.cos(angle)
            field = np.exp(-0.5 * (across / (0.5 * thick)) ** 2) * (np.abs(along) <= 0.5 * length)
        else:
            ry_, rx_ = shape
            d2 = ((yy - cy) / ry_) ** 2 + ((xx - cx) / rx_) ** 2
            field = np.exp(-2.0 * d2)  # e^-2 at the box edge
        channels, signs = _SIGNATURE[c]
        for ch, sign in zip(channels, signs):
            x[..., ch] += sign * amplitude * field
        if c == 1:  # the cyclone's eye wall: a ring in channel 4
            x[..., 4] += amplitude * np.exp(-0.5 * ((np.sqrt(d2) - 0.5) / 0.12) ** 2)
    return x


def _interpolation(n_out: int, n_in: int) -> np.ndarray:
    """(n_out, n_in) linear interpolation matrix: smooth fields from a coarse grid."""
    pos = np.linspace(0, n_in - 1, n_out)
    return np.stack([np.interp(pos, np.arange(n_in), np.eye(n_in)[j]) for j in range(n_in)], 1)


# ---- staging ---------------------------------------------------------------------

def stage(data: Data, rows: np.ndarray, path: str) -> int:
    """The Data Duplicator's copy: training images `rows` (unique, sorted) and the
    validation set in our layout (channels last, class first: see the module
    docstring), with the source's normalisation statistics (a resample is normalised as
    the full set is). Copied in blocks of images."""
    os.makedirs(path, exist_ok=True)
    rows = np.asarray(rows, np.int64)
    written = 0
    for split, index, boxes in (("train", rows, data.train_boxes[rows]),
                                ("val", np.arange(data.n_val), data.val_boxes)):
        file = os.path.join(path, f"{split}.h5")
        tmp = f"{file}.tmp{os.getpid()}"
        with h5py.File(tmp, "w") as f:
            f.attrs[OURS[0]], f.attrs["split"] = OURS[1], split
            first = data.images(split, index[:1])
            images = f.create_dataset("images", (len(index), *first.shape[1:]), first.dtype,
                                      chunks=(1, *first.shape[1:]))
            block = max(1, (64 << 20) // max(1, first.nbytes))  # ~64 MB at a time
            for lo in range(0, len(index), block):
                images[lo:lo + block] = data.images(split, index[lo:lo + block])
            f.create_dataset("boxes", data=boxes)
            if split == "train":
                f.create_dataset("channel_mean", data=data.mean)
                f.create_dataset("channel_std", data=data.std)
        os.replace(tmp, file)
        written += os.path.getsize(file)
    return written


# ---- model and training ----------------------------------------------------------

def build_model(data: Data):
    from harness.workloads import faster_rcnn
    return faster_rcnn.build(data.config)


def loss(y, outputs):
    from harness.workloads import faster_rcnn
    return faster_rcnn.loss(y, outputs)


def input_signature(data: Data, batch: int):
    import tensorflow as tf
    boxes = tf.TensorSpec((batch, data.max_boxes, 5), tf.float32)
    return (tf.TensorSpec((batch, data.height, data.width, CHANNELS), tf.float32), boxes), boxes


def batches(data: Data, rows, batch: int, *, training: bool = True, seed: int = 0):
    """Normalised images and boxes of training rows `rows`, in order. Training
    batches are flipped left-right at random (seeded): weather has no preferred
    east-west orientation in a box detector's eyes, and it doubles the data.
    Numpy arrays by default; with HPCAI500_EWA_PREFETCH=N > 0, tensors from the same
    generator through tf.data.Dataset.from_generator + prefetch(N), which reads the
    next batches on a tf.data thread while the step runs (see the module docstring)."""
    def generate():
        rng = np.random.default_rng(seed)
        order = np.asarray(rows)
        for s in range(len(order) // batch):
            idx = order[s * batch:(s + 1) * batch]
            x, boxes = data.normalised(data.images("train", idx)), data.train_boxes[idx].copy()
            if training:
                flip = rng.random(batch) < 0.5
                x[flip] = x[flip, :, ::-1]
                real = flip[:, None] & (boxes[..., 0] >= 0)
                xmin = boxes[..., 2].copy()
                boxes[..., 2] = np.where(real, data.width - boxes[..., 4], boxes[..., 2])
                boxes[..., 4] = np.where(real, data.width - xmin, boxes[..., 4])
            yield (x, boxes), boxes

    depth = int(os.environ.get(PREFETCH_ENV, "0") or 0)
    if depth <= 0:
        return generate()
    import tensorflow as tf
    spec = input_signature(data, batch)
    return iter(tf.data.Dataset.from_generator(generate, output_signature=spec).prefetch(depth))


# ---- prediction and quality ------------------------------------------------------

def score_width(data: Data) -> int:
    return 6 * data.config.detections


def predict(model, data: Data, rows: slice) -> np.ndarray:
    """Each validation image's top K detections, packed (K x 6): (class, score, ymin,
    xmin, ymax, xmax) rows, best first, zero rows after the last detection."""
    import tensorflow as tf
    from harness.workloads import faster_rcnn
    cfg = data.config
    index = np.arange(data.n_val)[rows]
    batch = int(max(1, min(32, (1 << 22) // (data.height * data.width))))  # ~4 M pixels a step
    empty = np.zeros((batch, data.max_boxes, 5), np.float32)
    empty[..., 0] = -1

    @tf.function
    def run(x):
        return faster_rcnn.detections(model((x, empty), training=False), cfg)

    out = []
    for lo in range(0, len(index), batch):
        part = index[lo:lo + batch]
        x = data.normalised(data.images("val", part))
        x = np.concatenate([x, np.zeros((batch - len(x), *x.shape[1:]), np.float32)])  # one shape, one trace
        out.append(run(tf.constant(x)).numpy()[:len(part)].reshape(len(part), -1))
    return np.concatenate(out) if out else np.zeros((0, score_width(data)))


def quality(scores: np.ndarray, data: Data) -> float:
    """mAP@0.5 of the fused detections of M models: scores is (n_val, M, K x 6)
    (a 2-D array is one model)."""
    scores = np.asarray(scores)
    if scores.ndim == 2:
        scores = scores[:, None, :]
    if len(scores) != data.n_val:
        raise ValueError(f"ewa.quality: {len(scores)} rows of scores for {data.n_val} validation images")
    fused = [det.fuse([det.rows(m) for m in image]) for image in scores]
    truth = [b[b[:, 0] >= 0] for b in data.val_boxes]
    return det.mean_average_precision(fused, truth, CLASSES, iou_threshold=0.5)
