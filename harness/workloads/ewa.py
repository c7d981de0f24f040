"""ewa: Extreme Weather Analytics, Faster-RCNN on 16-channel climate images.

HPC AI500 V2.0's scientific workload: detect tropical depressions (class 0), tropical
cyclones (1), extratropical cyclones (2) and atmospheric rivers (3) in 768 x 1152
images of 16 climate variables; target mAP@[IoU=0.5] 0.35, n = 10, 50 epochs.

On-disk layout (read by `read`, written by the synthetic generator and by `stage`):
a directory holding `train.h5` and `val.h5`, each with
    images  (N, H, W, 16) float16 or float32, channels-last, raw physical values
    boxes   (N, G, 5) float32 rows (class, ymin, xmin, ymax, xmax) in pixels,
            continuous coordinates; unused rows have class -1 (G = most boxes of an image)
and train.h5 optionally `channel_mean`, `channel_std` (16,) float32: the per-channel
statistics of the training images used to normalise every image. Without them they
are computed at load from (up to) 256 evenly spaced training images. The published
ExtremeWeather files (one per year) are, to our knowledge, channels-first with the
class last in a box row: convert them to this layout first (no converter here yet).

`synthetic[:SAMPLES[:SIDE]]` (default 320 images of 96 x 144; SIDE is the height, the
width 1.5 x SIDE as in 768 x 1152) writes such a directory once per node and reads it
back through the same reader; about 1.5 s and 28 MB per image at full size.

Memory: boxes are held in memory (20 bytes per row); images are read per batch by
h5py (one HDF5 chunk per image), so a rank holds a batch, not the data set. At
768 x 1152 an image is 28 MB in float16 (57 MB as FP32 model input): a per-rank batch
of 4 is ~0.2 GB of input before activations. The model (faster_rcnn.py) is a
ResNet-18-like three-stage backbone at full size, a narrow two-stage one below 384 px.

Ensemble: `predict` returns each image's top K detections, packed (K x 6 floats);
the harness stacks the M models' arrays (ENSEMBLE = "stack") and `quality` fuses
them class-wise (weighted box fusion, scores averaged over M: see detection.fuse)
before computing mAP@0.5.
"""
from __future__ import annotations

import math
import os

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
VAL_FRACTION = 0.2
SYNTHETIC_DEFAULT = (320, 96)   # samples, image height (width = 1.5 x height, as 768 x 1152)
SYNTHETIC_MAX_BOXES = 3
MIN_SIDE = 32
STATS_SAMPLE = 256
FLOPS_NOTE = ("FLOPs count the backbone, RPN and the ROI head once per ROI (Table 3 rules);"
              " anchor decoding, NMS and crop-and-resize sampling have no Table 3 rule and are not counted")
FORMAT_VERSION = 1          # part of the synthetic cache name: bump when the generator changes


class Data:
    """An opened ewa data directory: boxes and statistics in memory, images on disk."""

    def __init__(self, path: str, source: str, train_boxes: np.ndarray, val_boxes: np.ndarray,
                 image_hw: tuple[int, int], mean: np.ndarray, std: np.ndarray):
        self.path, self.source = path, source
        self.train_boxes, self.val_boxes = train_boxes, val_boxes
        self.height, self.width = image_hw
        self.mean, self.std = mean.astype(np.float32), std.astype(np.float32)
        self._files = {}

    n_train = property(lambda self: len(self.train_boxes))
    n_val = property(lambda self: len(self.val_boxes))
    max_boxes = property(lambda self: self.train_boxes.shape[1])

    def images(self, split: str, index) -> np.ndarray:
        """Raw images of `split` at a slice or at integer indices (any order, repeats
        allowed: h5py reads increasing unique indices, numpy restores the order)."""
        if split not in self._files:
            # no HDF5 file locks: the files are never written in place (written to a
            # temporary name, then renamed), and locks fail on some parallel file systems
            self._files[split] = h5py.File(os.path.join(self.path, f"{split}.h5"), "r", locking=False)
        ds = self._files[split]["images"]
        try:
            if isinstance(index, slice):
                return ds[index]
            unique, inverse = np.unique(np.asarray(index), return_inverse=True)
            return ds[unique][inverse]
        except OSError as e:
            raise DataError(f"{os.path.join(self.path, split + '.h5')}: cannot read images ({e})") from None

    def normalised(self, images: np.ndarray) -> np.ndarray:
        return (images.astype(np.float32) - self.mean) / self.std

    @property
    def config(self):
        from harness.workloads import faster_rcnn
        return faster_rcnn.config_for(self.height, self.width, self.max_boxes)


# ---- data ------------------------------------------------------------------------

def load(dataset: str, cache_dir: str, node_rank: int = 0, node_barrier=lambda: None) -> Data:
    from harness.dat import dataset_spec
    kind, samples, side = dataset_spec(dataset)
    if kind == "embedded":
        raise DataError("ewa: there is no embedded data set for Extreme Weather Analytics; "
                        "use synthetic[:SAMPLES[:SIDE]] or a directory with train.h5 and val.h5")
    if kind == "synthetic":
        samples, side = samples or SYNTHETIC_DEFAULT[0], side or SYNTHETIC_DEFAULT[1]
        if side < MIN_SIDE:
            raise DataError(f"ewa {dataset!r}: SIDE (image height) must be at least {MIN_SIDE}: "
                            "the detector's feature map is 1/8 of the image and needs 4 x 6 cells")
        path = os.path.join(cache_dir, f"ewa-synthetic-v{FORMAT_VERSION}-{samples}-{side}")
        if node_rank == 0 and not os.path.exists(os.path.join(path, "val.h5")):
            write_synthetic(path, samples, side)
        node_barrier()  # one writer per node; the others read what it wrote
        return read(path, source=dataset)
    return read(dataset, source=dataset)


def read(path: str, source: str | None = None) -> Data:
    if not os.path.isdir(path):
        raise DataError(f"ewa dataset {path!r}: not a directory holding train.h5 and val.h5")
    train_file, val_file = (os.path.join(path, f) for f in ("train.h5", "val.h5"))
    train_hw, train_boxes, stats = _check(train_file)
    val_hw, val_boxes, _ = _check(val_file)
    if train_hw != val_hw:
        raise DataError(f"{path}: train images are {train_hw}, val images {val_hw}")
    if not (val_boxes[..., 0] >= 0).any():
        raise DataError(f"{val_file}: no boxes: mAP needs ground truth to measure against")
    g = max(train_boxes.shape[1], val_boxes.shape[1])  # one G for both: one model input shape
    data = Data(path, source or path, _pad(train_boxes, g), _pad(val_boxes, g), train_hw,
                np.zeros(CHANNELS), np.ones(CHANNELS))
    mean, std = stats if stats is not None else _statistics(data)
    data.mean, data.std = mean.astype(np.float32), std.astype(np.float32)
    return data


def _check(file: str):
    """Shapes, class ids and box geometry of one file; its boxes and stored statistics.
    Reads the last image too: a truncated file fails here, not in the middle of training."""
    if not os.path.exists(file):
        raise DataError(f"{file}: missing (an ewa directory holds train.h5 and val.h5)")
    try:
        with h5py.File(file, "r", locking=False) as f:
            for name in ("images", "boxes"):
                if name not in f:
                    raise DataError(f"{file}: no dataset '{name}'")
            images, boxes = f["images"], f["boxes"][...]
            if images.ndim != 4 or images.shape[-1] != CHANNELS or len(images) == 0:
                raise DataError(f"{file}: images must be (N, H, W, {CHANNELS}) with N > 0, found {images.shape}")
            if boxes.ndim != 3 or boxes.shape[-1] != 5 or len(boxes) != len(images):
                raise DataError(f"{file}: boxes must be (N, G, 5) with N = {len(images)} images, "
                                f"found {boxes.shape}")
            images[-1]
            hw = tuple(images.shape[1:3])
            stats = None
            if "channel_mean" in f and "channel_std" in f:
                stats = f["channel_mean"][...], f["channel_std"][...]
                if (stats[0].shape != (CHANNELS,) or stats[1].shape != (CHANNELS,)
                        or not np.isfinite(stats).all() or (stats[1] <= 0).any()):
                    raise DataError(f"{file}: channel_mean/channel_std must be {CHANNELS} finite "
                                    "values (std > 0)")
    except OSError as e:
        raise DataError(f"{file}: cannot read HDF5 ({e})") from None
    boxes = boxes.astype(np.float32)
    cls = boxes[..., 0]
    if not np.isfinite(boxes).all():
        raise DataError(f"{file}: boxes contain NaN or infinity")
    bad = (cls != np.round(cls)) | (cls < -1) | (cls >= CLASSES)
    if bad.any():
        raise DataError(f"{file}: box classes must be -1 (padding) or integers in [0, {CLASSES}), "
                        f"found {cls[bad][0]:g} (image {np.argwhere(bad)[0][0]})")
    real = cls >= 0
    flat = (boxes[..., 3] <= boxes[..., 1]) | (boxes[..., 4] <= boxes[..., 2])
    if (real & flat).any():
        i, j = np.argwhere(real & flat)[0]
        raise DataError(f"{file}: image {i} box {j} {boxes[i, j, 1:].tolist()} is empty "
                        "(rows are class, ymin, xmin, ymax, xmax with ymin < ymax, xmin < xmax)")
    # Boxes reaching past the image are clipped to it: the detector cannot see beyond.
    h, w = hw
    boxes[..., 1:5] = np.clip(boxes[..., 1:5], 0, [h, w, h, w])
    outside = real & ((boxes[..., 3] <= boxes[..., 1]) | (boxes[..., 4] <= boxes[..., 2]))
    if outside.any():
        i, j = np.argwhere(outside)[0]
        raise DataError(f"{file}: image {i} box {j} lies outside the {h} x {w} image")
    boxes[~real] = [-1, 0, 0, 0, 0]
    return hw, boxes, stats


def _pad(boxes: np.ndarray, g: int) -> np.ndarray:
    pad = np.tile(np.array([-1, 0, 0, 0, 0], np.float32), (len(boxes), g - boxes.shape[1], 1))
    return np.concatenate([boxes, pad], axis=1)


def _statistics(data: Data) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and standard deviation over evenly spaced training images."""
    total, total_sq, count = np.zeros(CHANNELS), np.zeros(CHANNELS), 0
    for i in np.unique(np.linspace(0, data.n_train - 1, min(STATS_SAMPLE, data.n_train)).astype(int)):
        x = data.images("train", slice(i, i + 1)).astype(np.float64).reshape(-1, CHANNELS)
        total, total_sq, count = total + x.sum(0), total_sq + (x * x).sum(0), count + len(x)
    mean = total / count
    return mean, np.sqrt(np.maximum(total_sq / count - mean * mean, 1e-12))


# ---- synthetic data --------------------------------------------------------------

def write_synthetic(path: str, samples: int, side: int, seed: int = 2024) -> None:
    """Weather-like data in the on-disk format: 16 channels of smooth noise with their
    own offsets and scales (as physical variables have), and 1-3 objects per image whose
    class decides shape, size and the channels it shows in. Written image by image:
    memory stays at one image whatever the size."""
    height, width = side, int(round(side * 1.5))
    n_val = max(1, int(round(VAL_FRACTION * samples)))
    if samples - n_val < 1:
        raise DataError(f"ewa synthetic: {samples} samples leave no training images")
    rng = np.random.default_rng(seed)
    os.makedirs(path, exist_ok=True)
    # train.h5 first: val.h5's existence is what `load` checks for a finished cache.
    scenes = [_scene(rng, height, width) for _ in range(samples)]
    offsets, scales = np.arange(CHANNELS) * 10.0, 1.0 + np.arange(CHANNELS) * 0.5
    for name, part in (("train.h5", scenes[n_val:]), ("val.h5", scenes[:n_val])):
        _write_scenes(os.path.join(path, name), part, height, width, offsets, scales, rng,
                      with_stats=name == "train.h5")


def _write_scenes(file, scenes, height, width, offsets, scales, rng, with_stats):
    tmp = f"{file}.tmp{os.getpid()}"
    total, total_sq = np.zeros(CHANNELS), np.zeros(CHANNELS)
    with h5py.File(tmp, "w") as f:
        images = f.create_dataset("images", (len(scenes), height, width, CHANNELS), np.float16,
                                  chunks=(1, height, width, CHANNELS))
        boxes = np.full((len(scenes), SYNTHETIC_MAX_BOXES, 5), [-1, 0, 0, 0, 0], np.float32)
        for i, objects in enumerate(scenes):
            x = _render(rng, height, width, objects) * scales + offsets
            images[i] = x.astype(np.float16)
            x = images[i].astype(np.float64).reshape(-1, CHANNELS)  # stats of what is stored
            total, total_sq = total + x.sum(0), total_sq + (x * x).sum(0)
            boxes[i, :len(objects)] = [(c, *box) for c, box, _ in objects]
        f.create_dataset("boxes", data=boxes)
        if with_stats:
            n = len(scenes) * height * width
            mean = total / n
            f.create_dataset("channel_mean", data=mean.astype(np.float32))
            f.create_dataset("channel_std", data=np.sqrt(np.maximum(total_sq / n - mean ** 2, 1e-12)).astype(np.float32))
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
    validation set in the on-disk format, with the source's normalisation statistics
    (a resample is normalised as the full set is). Copied in blocks of images."""
    os.makedirs(path, exist_ok=True)
    rows = np.asarray(rows, np.int64)
    written = 0
    for split, index, boxes in (("train", rows, data.train_boxes[rows]),
                                ("val", np.arange(data.n_val), data.val_boxes)):
        file = os.path.join(path, f"{split}.h5")
        tmp = f"{file}.tmp{os.getpid()}"
        with h5py.File(tmp, "w") as f:
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
    east-west orientation in a box detector's eyes, and it doubles the data."""
    rows = np.asarray(rows)
    rng = np.random.default_rng(seed)
    for s in range(len(rows) // batch):
        idx = rows[s * batch:(s + 1) * batch]
        x, boxes = data.normalised(data.images("train", idx)), data.train_boxes[idx].copy()
        if training:
            flip = rng.random(batch) < 0.5
            x[flip] = x[flip, :, ::-1]
            real = flip[:, None] & (boxes[..., 0] >= 0)
            xmin = boxes[..., 2].copy()
            boxes[..., 2] = np.where(real, data.width - boxes[..., 4], boxes[..., 2])
            boxes[..., 4] = np.where(real, data.width - xmin, boxes[..., 4])
        yield (x, boxes), boxes


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
