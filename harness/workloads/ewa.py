"""ewa: Extreme Weather Analytics, Faster-RCNN on 16-channel climate images.

HPC AI500 V2.0's scientific workload: detect tropical depressions (class 0), tropical
cyclones (1), extratropical cyclones (2) and atmospheric rivers (3) in 768 x 1152
images of 16 climate variables; target mAP@[IoU=0.5] 0.35, n = 10, 50 epochs.

This module is the workload interface (harness/workloads/__init__.py); the data set's
on-disk layouts, its reader and our staged copy are extreme_weather.py, the synthetic
scenes weather_synthetic.py, the detector's design detector.py, the box math
detection.py; the model is each framework's (Keras: harness/frameworks/tensorflow/
faster_rcnn.py and ewa.py; PyTorch: harness/frameworks/pytorch/ewa.py).

Data: a path (a directory of per-year HDF5 files in the published layout, or one such
file), or `synthetic[:SAMPLES[:SIDE]]` (default 320 images of 96 x 144; SIDE is the
height, the width 1.5 x SIDE as in 768 x 1152), written once per node in the published
layout into the run's cache directory and read back through the same reader. The box
rows' column order is detected from the data unless HPCAI500_EWA_BOX_ORDER sets it
(extreme_weather.detect_order); `describe_data` states it, the channels and the split
in the report's conventions (and so in results.json's `conventions`).

Feed: a rank reads only its job's resample share and holds a batch, not the data set:
images are read per batch by h5py, one image per read, normalised, transposed to
channels last and mirrored in one pass (extreme_weather.Data.normalised). At 768 x
1152 an image is 57 MB in float32: a per-rank batch of 2 is ~0.11 GB of input before
activations and takes ~0.15 s to read and normalise here.
`batches` yields numpy arrays (both frameworks' feed). In TensorFlow,
HPCAI500_EWA_PREFETCH=N (> 0) feeds the same generator through
tf.data.Dataset.from_generator + prefetch(N) (harness/frameworks/tensorflow/ewa.py), so
that reading overlaps the step on a tf.data thread. Off by default: measured by bench/ewa.py at
96 x 144, B = 4, P = 2 on 2 cores, the feed is ~13 ms of a ~53 ms step, yet the
prefetching loop ran at 0.99x the plain one: with one rank per core there is no idle
core to read on (bench/README.md). On GPU nodes, where the CPU idles during a step,
set it to 2.

The model (detector.py's design): a ResNet-50 trunk (conv1 to conv4, stride 16) by
default, a narrow two-stage backbone for images below 384 pixels or with
HPCAI500_EWA_BACKBONE=small (HPCAI500_EWA_BACKBONE=resnet50 forces the full one).

Ensemble: each framework's `predict` returns each image's top K detections, packed (K x
6 floats); the harness stacks the M models' arrays (ENSEMBLE = "stack") and `quality` fuses
them class-wise (weighted box fusion, scores averaged over M: see detection.fuse)
before computing mAP@0.5.
"""
from __future__ import annotations

import os

import numpy as np

from harness import settings
from harness.workloads import DataError, Dataset, facts, synthetic_once
from harness.workloads import detection as det
from harness.workloads import detector
from harness.workloads import extreme_weather as ew
from harness.workloads import weather_synthetic
from harness.workloads.extreme_weather import CHANNELS, CLASSES, Data

NAME = "ewa"
QUALITY = "mAP@0.5"
TARGET_QUALITY = 0.35      # HPC AI500 V2.0, Table 3
PENALTY_N = 10
AGGREGATIONS = ("mean",)   # detections are fused, not voted
ENSEMBLE = "stack"         # each model keeps its own columns in the reduced score array
SYNTHETIC_DEFAULT = (320, 96)   # samples, image height in pixels (width = 1.5 x height, as 768 x 1152)
MIN_SIDE = 32              # pixels: the detector's feature map is 1/8 of the image and needs 4 x 6 cells
COUNTING_NOTE = ("FLOPs count the backbone, RPN and the ROI head once per ROI, with a fixed R ROIs"
              " per image (training and inference alike, whatever the image holds) (Table 3 rules);"
              " anchor decoding, NMS and crop-and-resize sampling have no Table 3 rule and are not counted")
REFERENCE_SIZE = (768, 1152)   # the published images' height and width
PREFETCH_ENV = "HPCAI500_EWA_PREFETCH"   # > 0: batches through tf.data with this prefetch depth
# ExtremeWeather: one HDF5 file a year of 1,460 images (4 a day, 365 days), 16 x 768 x 1152
# (extremeweatherdataset.github.io: climo_1979.h5's images (1460, 16, 768, 1152); paper 001,
# "EWA Dataset"). Its classes are 0-3 (the page), which the reader enforces, so they tell
# nothing; the split is the user's (no official one, HPCAI500_EWA_VAL) and the number of
# year files is stated as 25 here and 26 in paper 001: no sample count is compared. The image
# size is describe_model's (a deviation from the reference model).
PUBLISHED = {"name": "ExtremeWeather", "images_per_file": 1460}


def load(dataset: Dataset, cache_dir: str, node_rank: int = 0, node_barrier=lambda: None) -> Data:
    """Every rank's data set. The node's rank 0 writes synthetic data (once: a directory
    there is a whole set, renamed into place) and reads first, computing and caching the
    statistics if needed; the node's other ranks read after it (files.node_once)."""
    kind = dataset.kind
    if kind == "embedded":
        raise DataError("ewa: there is no embedded data set for Extreme Weather Analytics; "
                        "use synthetic[:SAMPLES[:SIDE]] or a directory of HDF5 files (one per year)")
    path = dataset.text
    if kind == "synthetic":
        samples, side = dataset.size(SYNTHETIC_DEFAULT)
        if side < MIN_SIDE:
            raise DataError(f"ewa {dataset.text!r}: SIDE (image height) must be at least {MIN_SIDE}: "
                            "the detector's feature map is 1/8 of the image and needs 4 x 6 cells")
        written = _order() or ew.PAGE_ORDER   # unset: the page's order, detected back on reading
        path = os.path.join(cache_dir, weather_synthetic.directory_name(samples, side, written))
    write = (lambda: weather_synthetic.write_synthetic(path, samples, side, order=written)) \
        if kind == "synthetic" else None
    return synthetic_once(path, write, lambda: read(path, source=dataset.text, cache_dir=cache_dir), node_rank,
                          node_barrier)


def read(path: str, source: str | None = None, cache_dir: str | None = None) -> Data:
    """The one reader of published, synthetic and staged data, with the box order and
    the validation years of the settings (HPCAI500_EWA_BOX_ORDER: unset, the order is
    detected from the rows; HPCAI500_EWA_VAL)."""
    return ew.read(path, source, cache_dir, order=_order(), val=settings.value(ew.VAL_ENV) or ())


def _order() -> str | None:
    return settings.value(ew.BOX_ORDER_ENV)


def describe_data(data: Data) -> list[str]:
    """The report's lines on what the reader decided about the files: the box rows'
    column order and how it was decided, the channels in the files' order, and which
    files are the validation set."""
    return [f"box rows read as {ew.order_names(data.box_order)} = {data.box_order}, {data.box_order_how}",
            f"channels in the files' order: {', '.join(data.channel_names)} ({data.channel_names_how})",
            f"split: {data.split_how}"]


def data_facts(data: Data) -> dict:
    """The division's facts of the data read (the Workload contract): the marker, the sizes,
    and the distinct numbers of images a file holds (a year file: 1,460)."""
    per_file = {}
    for part in (p for split in data.parts.values() for p in split):
        per_file[part.file] = per_file.get(part.file, 0) + part.count
    return facts(data, NAME, images_per_file=sorted(set(per_file.values())))


def stage(data: Data, rows: np.ndarray, path: str, progress=None) -> int:
    """The Data Duplicator's copy, in our staged layout (extreme_weather.write_staged)."""
    return ew.write_staged(data, rows, path, progress)


# ---- model and training ----------------------------------------------------------

def config(data: Data):
    """The detector's configuration for this data's image size and boxes an image."""
    return detector.config_for(data.height, data.width, data.max_boxes)


def describe_model(data: Data) -> tuple[str, list[str]]:
    """The FLOP note of the detector built, and how it differs from the reference
    (ResNet-50 trunk on 768 x 1152 images). The automatic switch to the small backbone
    below 384 px is said here, as a setting would be."""
    cfg = config(data)
    forced = settings.value(detector.BACKBONE_ENV) != "auto"
    how = f"{detector.BACKBONE_ENV}={cfg.backbone}" if forced else f"automatic for {data.height} px images"
    deviations = []
    if cfg.backbone != "resnet50":
        deviations.append(f"the small backbone ({how}), not the ResNet-50 trunk")
    if (data.height, data.width) != REFERENCE_SIZE:
        deviations.append(f"{data.height} x {data.width} images, not {REFERENCE_SIZE[0]} x {REFERENCE_SIZE[1]}")
    return f"backbone {cfg.backbone} ({how}), R = {cfg.rois} ROIs; " + COUNTING_NOTE, deviations


def batches(data: Data, rows, batch: int, *, training: bool = True, seed: int = 0):
    """Normalised images and boxes of training rows `rows`, in order, as numpy arrays
    (numpy_batches). Training batches are flipped left-right at random (seeded): weather
    has no preferred east-west orientation in a box detector's eyes, and it doubles the
    data. TensorFlow may read them ahead on a tf.data thread (HPCAI500_EWA_PREFETCH:
    harness/frameworks/tensorflow/ewa.py)."""
    return numpy_batches(data, rows, batch, training, seed)


def numpy_batches(data: Data, rows, batch: int, training: bool, seed: int):
    """The feed's batches as numpy arrays, ((images, boxes), boxes): images normalised, channels
    last; training batches flipped left-right at random from `seed` (`batches` says why).
    Both frameworks' feed (`batches`)."""
    rng = np.random.default_rng(seed)
    order = np.asarray(rows)
    for s in range(len(order) // batch):
        idx = order[s * batch:(s + 1) * batch]
        flip = rng.random(batch) < 0.5 if training else None
        x, boxes = data.normalised("train", idx, flip), data.train_boxes[idx].copy()
        if training:
            real = flip[:, None] & (boxes[..., 0] >= 0)
            xmin = boxes[..., 2].copy()
            boxes[..., 2] = np.where(real, data.width - boxes[..., 4], boxes[..., 2])
            boxes[..., 4] = np.where(real, data.width - xmin, boxes[..., 4])
        yield (x, boxes), boxes


# ---- prediction and quality ------------------------------------------------------

def score_width(data: Data) -> int:
    return 6 * config(data).detections


def quality(scores: np.ndarray, data: Data) -> float:
    """mAP@0.5 of the fused detections of M models: scores is (n_val, M, K x 6)
    (a 2-D array is one model). The fused list keeps at most K boxes an image, as many
    as each base model may report: an ensemble gain is not recall padding."""
    scores = np.asarray(scores)
    if scores.ndim == 2:
        scores = scores[:, None, :]
    if len(scores) != data.n_val:
        raise ValueError(f"ewa.quality: {len(scores)} rows of scores for {data.n_val} validation images")
    keep = scores.shape[2] // 6
    fused = [det.fuse([det.rows(m) for m in image], keep=keep) for image in scores]
    truth = [b[b[:, 0] >= 0] for b in data.val_boxes]
    return det.mean_average_precision(fused, truth, CLASSES, iou_threshold=0.5)
