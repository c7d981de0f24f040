"""ic: Image Classification, ResNet-50 v1.5 on ImageNet (HPC AI500 V2.0's IC workload).

Data: a directory of ImageNet TFRecord shards in the common layout (`train-00000-of-01024`
..., `validation-00000-of-00128` ...; each record a tf.train.Example with the JPEG in
`image/encoded` and the class in `image/class/label`). tensorflow/models'
build_imagenet_data.py writes labels 1..1000 (0 unused), other converters 0..999: the
label base (the offset subtracted) is decided from the labels read at load time (every
validation label and the first record of each training shard, `_label_base`): a 0 means
0-based, the top label (1000, or the classes of hpcai500-ic.json) 1-based, both an
error; when neither occurs (a subset) it falls back to 1 (LABEL_OFFSET, the converter's
convention) and says so. HPCAI500_IC_LABEL_OFFSET, set, overrides the detection. A
label outside the chosen range is refused naming its shard: at load time for the
labels read, in the input pipeline for every other training record. A directory
written by this module also holds `hpcai500-ic.json` (image side, classes, label
offset), which then wins over the defaults (side 224, classes from the labels read,
the offset above). `describe_data` states the base and how it was decided in the
report's conventions (and so in results.json's `conventions`).

Training sample i (i = 0..n_train-1) is the i-th record over the sorted train shards.
The harness's bootstrap indices are read without loading the data set: an index of
every record (shard, byte offset, length: 16 bytes a record, ~20 MB at 1.28 M images)
is built once by reading only the 12-byte TFRecord headers and seeking over the JPEGs
(see tfrecord.py), cached as `ic-index-<key>.npz` in the cache directory (key: shard
names, sizes and mtimes), and a record is then one os.pread. The validation labels
(needed in memory for the quality) are parsed once and cached in the same file.

Batches: each framework feeds its own. TensorFlow's is a tf.data pipeline
(harness/frameworks/tensorflow/ic.py): a Python generator preads the given rows in
chunks, then parse + JPEG decode + augmentation run in parallel (AUTOTUNE), then batch
and prefetch. Training: random resized crop (area 8-100 %, aspect 3/4-4/3) to side x side
and a horizontal flip, drawn by stateless ops from (seed, position in the stream), so a
run is reproducible whatever the parallelism. Validation: the central 87.5 % square,
resized to side x side. Both normalised with ImageNet's mean and std. The numpy feed
here (`numpy_batches`, PyTorch's) reads the same records and transforms them the same
way with Pillow (its section below says how the two differ).

`synthetic[:SAMPLES[:SIDE]]` (default 640 images of 32 px, 10 classes) writes JPEG shards
in the same layout, labels 1-based like the converter, 20 % for validation, and reads
them back through the same reader. There is no embedded data set.

Model: ResNet-50 v1.5 (Keras: harness/frameworks/tensorflow/resnet.py; PyTorch:
harness/frameworks/pytorch/ic.py), classes and image side from the data. For tests on
small CPUs only, env HPCAI500_IC_WIDTH (stem channels, default 64) and
HPCAI500_IC_STAGES (bottlenecks per stage, default 3,4,6,3) shrink it; unset, the model
is ResNet-50.

Recipe (NVIDIA's ResNet-50 v1.5 reference): SGD momentum 0.875 (MOMENTUM), weight decay
3.0517578125e-05 as L2 kernel regularizers (the harness adds sum(model.losses)), label
smoothing 0.1; batch 128 a GPU, LR 0.256 for 256 with warm-up and cosine, 90 epochs.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass

import numpy as np

from harness import settings
from harness.files import atomic_path, node_once
from harness.workloads import DataError, Dataset, facts, marker_name, progress_or_nothing, staged_rows, tfrecord, top1

NAME = "ic"
QUALITY = "Top-1"
TARGET_QUALITY = 0.763
PENALTY_N = 5
AGGREGATIONS = ("mean", "vote")
MOMENTUM = 0.875
WEIGHT_DECAY = 3.0517578125e-05
REFERENCE_NOTE = ("ResNet-50 v1.5 (stride on the 3x3 conv) counts 24.61 GFLOPs a training sample at"
                  " 224x224, 7 % above the paper's 23.0 (APC 11 776 GFLOPs at |B| = 512), which is"
                  " ResNet-50 v1's count; JPEG decoding and augmentation are not counted")
LABEL_SMOOTHING = 0.1
LABEL_OFFSET = 1               # tensorflow/models' converter writes 1..1000: the fallback base
IMAGENET_CLASSES = 1000        # the top label of a 1-based set, when hpcai500-ic.json gives no classes
OFFSET_ENV = "HPCAI500_IC_LABEL_OFFSET"
IMAGE_SIDE = 224               # training crop of real ImageNet
CENTER_FRACTION = 0.875        # validation: central crop (224 of 256)
MEAN = (0.485, 0.456, 0.406)   # ImageNet RGB mean and std, on [0, 1] pixels
STD = (0.229, 0.224, 0.225)
SYNTHETIC_DEFAULT = (640, 32)
SYNTHETIC_CLASSES = 10
VAL_FRACTION = 0.2
RECORDS_PER_SHARD = 128        # synthetic shards
STAGE_SHARD_BYTES = 128 << 20  # staged train shards
EVAL_BATCH = 64
CHUNK = 64                     # records a generator step hands to tf.data
META = marker_name(NAME)       # hpcai500-ic.json: written with synthetic and staged data, the harness's marker
# ImageNet-1k (ILSVRC2012): 1,000 classes, 1,281,167 training and 50,000 validation images
# (Russakovsky et al., IJCV 2015; the ILSVRC2012 page: "a random subset of 50,000 of the images
# with labels will be released as validation data ... 1000 categories")
PUBLISHED = {"name": "ImageNet", "classes": IMAGENET_CLASSES, "train_samples": 1_281_167, "val_samples": 50_000}
# The model's design, ResNet-50 v1.5, which both frameworks build from (Keras:
# harness/frameworks/tensorflow/resnet.py, whose docstring describes it; PyTorch:
# harness/frameworks/pytorch/ic.py)
STAGES = (3, 4, 6, 3)          # bottlenecks per stage: ResNet-50
WIDTH = 64                     # channels of the stem; stage s has WIDTH * 2**s inner channels
EXPANSION = 4                  # bottleneck output = 4 x inner channels
BN_MOMENTUM, BN_EPSILON = 0.9, 1e-5


@dataclass(frozen=True)
class ICData(tfrecord.Splits):
    path: str
    source: str
    train: tfrecord.Index
    val: tfrecord.Index
    y_val: np.ndarray          # int64, 0-based
    num_classes: int
    side: int
    label_offset: int
    label_how: str = ""        # how the label base was decided, for the report
    labels_read: str = ""      # which labels it was decided from


# ---- reading --------------------------------------------------------------------------

def load(dataset: Dataset, cache_dir: str, node_rank: int = 0, node_barrier=lambda: None) -> ICData:
    kind = dataset.kind
    if kind == "embedded":
        raise DataError("ic: there is no embedded data set (ImageNet is not bundled); give "
                        "'synthetic[:SAMPLES[:SIDE]]' or the path of a directory of ImageNet "
                        "TFRecord shards (train-00000-of-01024 ..., validation-00000-of-00128 ...)")
    if kind == "synthetic":
        samples, side = dataset.size(SYNTHETIC_DEFAULT)
        path = os.path.join(cache_dir, f"ic-synthetic-{samples}-{side}")
        prepare = lambda: os.path.isdir(path) or write_synthetic(path, samples, side)  # noqa: E731
        index_dir = path
    else:
        path, index_dir, prepare = dataset.text, cache_dir, lambda: None
    # One writer a node (data, index cache); the others wait and read what it wrote.
    def prepare_and_index():
        prepare()
        read(path, cache_dir=index_dir)
    node_once(node_rank, node_barrier, prepare_and_index)
    return read(path, cache_dir=index_dir, source=dataset.text)


def read(path: str, cache_dir: str | None = None, source: str | None = None) -> ICData:
    """Read a directory of shards; the index is cached in cache_dir (default: the
    directory itself if writable, else not cached)."""
    if not os.path.isdir(path):
        raise DataError(f"ic dataset {path!r}: not a directory of ImageNet TFRecord shards")
    meta = _meta(path)
    train_files = tfrecord.list_shards(path, "train")
    val_files = tfrecord.list_shards(path, "validation")
    if cache_dir is None and os.access(path, os.W_OK):
        cache_dir = path
    train, val, raw, sample, sample_raw = _index(train_files, val_files, cache_dir)
    if len(val) == 0 or len(train) == 0:
        raise DataError(f"{path}: no records in the {'train' if len(train) == 0 else 'validation'} shards")
    # every label read, with its shard: the validation set's, then the training sample's
    labels = np.concatenate([raw, sample_raw])
    shards = [val.files[i] for i in val.shard] + [train.files[i] for i in train.shard[sample]]
    top = meta.get("classes", IMAGENET_CLASSES)
    offset, how = _label_base(meta, labels, shards, top)
    y = labels - offset
    bad = np.flatnonzero((y < 0) | (y >= top))
    if len(bad):
        k = bad[0]
        raise DataError(f"{shards[k]}: label {labels[k]} lies outside {offset}..{offset + top - 1}, the "
                        f"labels of {top} classes {offset}-based ({how}); {OFFSET_ENV} sets the base")
    classes = int(meta.get("classes", y.max() + 1))
    read_from = (f"{len(raw)} validation labels and the first record of each of {len(sample)} training "
                 f"shard{'s' if len(sample) != 1 else ''}")
    return ICData(path, source or path, train, val, (raw - offset).astype(np.int64), classes,
                  int(meta.get("side", IMAGE_SIDE)), offset, how, read_from)


def _label_base(meta: dict, labels: np.ndarray, shards: list, top: int) -> tuple[int, str]:
    """(offset, how): what to subtract from the stored labels, and why. Our own files
    record it; the setting overrides the data; else a 0 label means 0-based, the top
    label 1-based, neither the converter's 1 (said as an assumption)."""
    if "label_offset" in meta:
        return meta["label_offset"], f"recorded in {META}, written with the data by hpcai500"
    offset = settings.value(OFFSET_ENV)
    if offset is not None:
        return offset, f"set by {OFFSET_ENV}={offset}"
    zero, highest = np.flatnonzero(labels == 0), np.flatnonzero(labels >= top)
    if len(zero) and len(highest):
        raise DataError(f"the labels read run {labels.min()}..{labels.max()}: label 0 ({shards[zero[0]]}) "
                        f"means 0-based, label {labels[highest[0]]} ({shards[highest[0]]}) 1-based for "
                        f"{top} classes; set {OFFSET_ENV} to the data's base")
    if len(zero):
        return 0, f"detected: label 0 occurs ({os.path.basename(shards[zero[0]])})"
    if len(highest):
        return 1, f"detected: label {top} occurs ({os.path.basename(shards[highest[0]])})"
    return LABEL_OFFSET, (f"assumed: neither 0 nor {top} among the labels read ({labels.min()}..{labels.max()}), "
                          f"so tensorflow/models' convention (1..{top}, 0 unused) is taken; "
                          f"set {OFFSET_ENV}=0 if the data is 0-based")


def describe_data(data: ICData) -> list[str]:
    """The report's line on the labels: the base, how it was decided, from what."""
    return [f"labels {data.label_offset}-based ({data.label_how}): {data.label_offset} subtracted, "
            f"{data.num_classes} classes; decided from the {data.labels_read}"]


def data_facts(data: ICData) -> dict:
    """The division's facts of the data read (the Workload contract): the marker, the sizes,
    and the classes the labels were read as (hpcai500-ic.json's, else the top label's)."""
    return facts(data, NAME, classes=int(data.num_classes))


def _meta(path: str) -> dict:
    file = os.path.join(path, META)
    if not os.path.exists(file):
        return {}
    try:
        with open(file) as f:
            meta = json.load(f)
        if not all(isinstance(meta.get(k), int) and meta[k] >= (k != "label_offset")
                   for k in ("side", "classes", "label_offset")):
            raise ValueError("needs integer side >= 1, classes >= 1, label_offset >= 0")
        return meta
    except (OSError, ValueError) as e:
        raise DataError(f"{file}: {e}") from None


_INDEX_KEYS = ("train_shard", "train_offset", "train_length", "val_shard", "val_offset",
               "val_length", "val_label", "train_sample", "train_sample_label")


def _index(train_files, val_files, cache_dir):
    """(train index, validation index, raw validation labels, the training sample's
    record numbers (the first record of each shard) and raw labels), from the cache or built."""
    key = tfrecord.cache_key(train_files + val_files)
    file = os.path.join(cache_dir, f"ic-index-{key}.npz") if cache_dir else None
    z = tfrecord.load_npz(file) if file else None
    if (z is not None and set(z) == set(_INDEX_KEYS) and len(z["val_label"]) == len(z["val_offset"])
            and len(z["train_sample"]) == len(z["train_sample_label"])):
        return (tfrecord.Index(tuple(train_files), z["train_shard"], z["train_offset"], z["train_length"]),
                tfrecord.Index(tuple(val_files), z["val_shard"], z["val_offset"], z["val_length"]),
                z["val_label"], z["train_sample"], z["train_sample_label"])
    train, val = tfrecord.build_index(train_files), tfrecord.build_index(val_files)
    raw = _labels(val)
    sample = _first_of_each_shard(train)
    sample_raw = _labels(_subset(train, sample))
    if file:
        try:
            os.makedirs(cache_dir, exist_ok=True)
            _save_index(file, train, val, raw, sample, sample_raw)
        except OSError:  # a read-only cache costs a re-scan next time, not the run
            pass
    return train, val, raw, sample, sample_raw


def _save_index(file, train, val, raw, sample, sample_raw) -> None:
    tfrecord.save_npz(file, train_shard=train.shard, train_offset=train.offset, train_length=train.length,
                      val_shard=val.shard, val_offset=val.offset, val_length=val.length, val_label=raw,
                      train_sample=sample, train_sample_label=sample_raw)


def _first_of_each_shard(index: tfrecord.Index) -> np.ndarray:
    """The record numbers of each non-empty shard's first record (records are in shard order)."""
    return np.flatnonzero(np.diff(index.shard.astype(np.int64), prepend=-1) != 0).astype(np.int64)


def _subset(index: tfrecord.Index, rows) -> tfrecord.Index:
    return tfrecord.Index(index.files, index.shard[rows], index.offset[rows], index.length[rows])


def _labels(index: tfrecord.Index) -> np.ndarray:
    """The raw labels of every record of an index, parsed as protobufs (no JPEG decode,
    and no TensorFlow op: data is loaded before the harness pins TensorFlow's threads,
    which it can only do before the runtime starts)."""
    out = np.zeros(len(index), np.int64)
    with tfrecord.Reader(index) as r:
        for k in range(len(index)):
            try:
                out[k] = tfrecord.parse_example(r.record(k))[tfrecord.LABEL_KEY][0]
            except (ValueError, KeyError, IndexError, TypeError):
                raise DataError(f"{index.files[index.shard[k]]}: record at byte {int(index.offset[k])} "
                                f"is not a tf.train.Example with an int64 '{tfrecord.LABEL_KEY}'") from None
    return out


# ---- synthetic data -------------------------------------------------------------------

def write_synthetic(path: str, samples: int, side: int, seed: int = 2024) -> None:
    """ImageNet-layout shards of synthetic JPEGs in `path`, written in a temporary
    directory and renamed into place: readers never see a half-written data set."""
    n_val = max(1, int(round(VAL_FRACTION * samples)))
    if samples - n_val < 1:
        raise DataError(f"ic synthetic: {samples} samples leave none for training")
    records = (tfrecord.example(tfrecord.encode_jpeg(img), label + LABEL_OFFSET, side, side)
               for img, label in tfrecord.synthetic_images(samples, side, SYNTHETIC_CLASSES, seed))
    with atomic_path(path) as tmp:
        os.makedirs(tmp)
        for split, n in (("validation", n_val), ("train", samples - n_val)):
            tfrecord.write_split(tmp, split, records, n, -(-n // RECORDS_PER_SHARD))
        _write_meta(tmp, side, SYNTHETIC_CLASSES, LABEL_OFFSET)


def _write_meta(path: str, side: int, classes: int, label_offset: int) -> None:
    with open(os.path.join(path, META), "w") as f:
        json.dump({"side": side, "classes": classes, "label_offset": label_offset}, f)


# ---- the model and the recipe ---------------------------------------------------------

def shape() -> tuple[int, tuple[int, ...]]:
    """(stem width, bottlenecks per stage): ResNet-50's unless the test-only settings shrink it."""
    return settings.value("HPCAI500_IC_WIDTH") or WIDTH, settings.value("HPCAI500_IC_STAGES") or STAGES


def describe_model(data: ICData) -> tuple[str, list[str]]:
    """The FLOP note of the model built, and how it differs from ResNet-50 v1.5 at 224 px."""
    width, stages = shape()
    deviations = []
    if (width, tuple(stages)) != (WIDTH, tuple(STAGES)):
        deviations.append(f"a reduced ResNet (stem width {width}, stages {','.join(map(str, stages))}; "
                          "HPCAI500_IC_WIDTH/HPCAI500_IC_STAGES), not ResNet-50")
    if data.side != IMAGE_SIDE:
        deviations.append(f"{data.side} px images, not {IMAGE_SIDE}")
    if deviations:
        return (f"the model built is not the reference ({'; '.join(deviations)}): its FLOPs are counted as"
                " built by the Table 3 rules; the ResNet-50 figures (24.61 GFLOPs a training sample, the"
                " paper's 23.0) do not apply"), deviations
    return REFERENCE_NOTE, []


# ---- the feeds (TensorFlow's tf.data pipeline: harness/frameworks/tensorflow/ic.py) -----

def checked_rows(index: tfrecord.Index, rows, batch: int, drop_remainder: bool) -> np.ndarray:
    """`rows` checked against the index, cut to whole batches if `drop_remainder` (no
    record that would be dropped is read): both feeds' rows."""
    rows = np.asarray(rows, np.int64)
    if len(rows) and (rows.min() < 0 or rows.max() >= len(index)):
        raise IndexError(f"ic: rows {rows.min()}..{rows.max()} outside 0..{len(index) - 1}")
    return rows[:len(rows) // batch * batch] if drop_remainder else rows


def outside(offset: int, classes: int) -> str:
    """The end of the error for a training label outside the range, in both feeds."""
    return (f"lies outside {offset}..{offset + classes - 1} ({classes} classes, labels {offset}-based: see the"
            f" report's conventions; {OFFSET_ENV} sets the base)")


# ---- the numpy feed (a framework without tf.data: PyTorch) ------------------------------
# The same records, labels and transforms as TensorFlow's tf.data pipeline, decoded with
# Pillow: random resized crop (TF's sampling: area 8-100 %, aspect 3/4-4/3 uniform, 10
# attempts, else the whole image) and a flip, or the central square, resized bilinearly
# to side x side, normalised. Pillow's resize filters when it shrinks (antialiased), TF's
# does not, and the random draws are numpy's from (seed, position): the same distribution
# of crops, not the same crops, which a test in the other framework does not need.

def numpy_batches(data: ICData, index: tfrecord.Index, rows, batch: int, *, augment: bool, seed: int = 0,
                  drop_remainder: bool = True, workers: int = 1):
    """Batches (x float32 (n, side, side, 3), y int64 (n,)) of records `rows` of `index`, in
    order: the records read here (one pread each), decoded and transformed in `workers`
    threads (Pillow lets go of the GIL while it decodes and resizes), `workers` batches
    ahead. Training sample i of the feed is drawn from numpy's generator (seed, i)."""
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor
    rows = checked_rows(index, rows, batch, drop_remainder)
    ahead = deque()
    with tfrecord.Reader(index) as reader, ThreadPoolExecutor(max(1, workers)) as pool:
        for a in range(0, len(rows), batch):
            part = rows[a:a + batch]
            ahead.append(pool.submit(_decode_batch, data, index, part, reader.records(part), augment, seed, a))
            if len(ahead) > max(1, workers):
                yield ahead.popleft().result()
        while ahead:
            yield ahead.popleft().result()


def batches(data: ICData, rows, batch: int, *, training: bool, seed: int):
    """len(rows) // batch batches (x, y) of training samples `rows`, in that order, as numpy
    arrays (numpy_batches, decoded on this thread); augmented if `training`, else the
    deterministic validation transform. Each framework feeds its own instead: TensorFlow its
    tf.data pipeline (harness/frameworks/tensorflow/ic.py), PyTorch this feed in its threads
    (harness/frameworks/pytorch/ic.py)."""
    return numpy_batches(data, data.train, rows, batch, augment=training, seed=seed)


def _decode_batch(data: ICData, index: tfrecord.Index, part, records, augment: bool, seed: int, first: int):
    x = np.empty((len(part), data.side, data.side, 3), np.float32)
    y = np.empty(len(part), np.int64)
    for j, (k, record) in enumerate(zip(part, records)):
        jpeg, y[j] = _example_of(data, index, k, record)
        rng = np.random.default_rng((seed % 2**63, first + j)) if augment else None
        x[j] = _pil_image(jpeg, data.side, rng)
    return x, y


def _example_of(data: ICData, index: tfrecord.Index, k: int, record: bytes) -> tuple[bytes, int]:
    """(JPEG bytes, 0-based label) of record k; DataError naming its shard otherwise."""
    file = index.files[index.shard[k]]
    try:
        feats = tfrecord.parse_example(record)
        jpeg, raw = feats[tfrecord.IMAGE_KEY][0], int(feats[tfrecord.LABEL_KEY][0])
    except (ValueError, KeyError, IndexError, TypeError):
        raise DataError(f"{file}: record at byte {int(index.offset[k])} is not a tf.train.Example with"
                        f" '{tfrecord.IMAGE_KEY}' bytes and an int64 '{tfrecord.LABEL_KEY}'") from None
    label = raw - data.label_offset
    if not 0 <= label < data.num_classes:
        raise DataError(f"{file}: label {raw} {outside(data.label_offset, data.num_classes)}")
    return jpeg, label


def _pil_image(jpeg: bytes, side: int, rng) -> np.ndarray:
    """One image decoded, cropped (random resized crop and flip where `rng` is given, else
    the central CENTER_FRACTION square), resized to side x side, normalised."""
    import io

    from PIL import Image
    image = Image.open(io.BytesIO(jpeg)).convert("RGB")
    w, h = image.size
    if rng is None:
        crop = max(1, int(CENTER_FRACTION * min(w, h)))
        box = ((w - crop) // 2, (h - crop) // 2, (w - crop) // 2 + crop, (h - crop) // 2 + crop)
    else:
        box = _random_crop(rng, w, h)
    image = image.resize((side, side), Image.BILINEAR, box=box)
    if rng is not None and rng.random() < 0.5:
        image = image.transpose(Image.FLIP_LEFT_RIGHT)
    return (np.asarray(image, np.float32) - 255 * np.asarray(MEAN, np.float32)) / (255 * np.asarray(STD, np.float32))


def _random_crop(rng, w: int, h: int) -> tuple[int, int, int, int]:
    """TF's sample_distorted_bounding_box as train_image asks it: up to 10 draws of an area
    fraction in [0.08, 1] and an aspect ratio in [3/4, 4/3], the first that fits placed
    uniformly; none fits: the whole image. (left, top, right, bottom)."""
    for _ in range(10):
        area, aspect = rng.uniform(0.08, 1.0) * w * h, rng.uniform(3 / 4, 4 / 3)
        cw, ch = int(round(np.sqrt(area * aspect))), int(round(np.sqrt(area / aspect)))
        if 0 < cw <= w and 0 < ch <= h:
            left, top = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
            return left, top, left + cw, top + ch
    return 0, 0, w, h


# ---- evaluation -----------------------------------------------------------------------

def score_width(data: ICData) -> int:
    return data.num_classes


def quality(scores: np.ndarray, data: ICData) -> float:
    """Top-1 accuracy against the validation labels."""
    return top1(scores, data.y_val)


# ---- staging (the Data Duplicator's copy) ----------------------------------------------

def stage(data: ICData, rows, path: str, progress=None) -> int:
    """Copy training records `rows` (sorted, unique) as train shards, and the validation
    shards whole, into `path` in the same layout, byte for byte (no re-encoding).
    In the copy, training sample k is rows[k]. Returns the bytes written; `progress()`
    after each shard."""
    progress = progress_or_nothing(progress)
    rows = staged_rows("ic", rows, data.n_train)
    os.makedirs(path, exist_ok=True)
    for name in os.listdir(path):  # an earlier copy's shards would mix with this one's
        if name.startswith(tfrecord.SPLITS) or name.startswith("ic-index-"):
            os.remove(os.path.join(path, name))
    framed = data.train.length[rows].astype(np.int64) + tfrecord.HEADER + tfrecord.FOOTER
    shards = int(max(1, min(len(rows), -(-int(framed.sum()) // STAGE_SHARD_BYTES))))
    written, files, parts = 0, [], []
    for i, part in enumerate(np.array_split(rows, shards)):
        files.append(os.path.join(path, tfrecord.shard_name("train", i, shards)))
        offsets, lengths, n = tfrecord.copy_records(data.train, part, files[-1])
        parts.append((np.full(len(part), i, np.uint32), offsets, lengths))
        written += n
        progress()
    for f in data.val.files:
        shutil.copyfile(f, os.path.join(path, os.path.basename(f)))
        written += os.path.getsize(f)
        progress()
    _write_meta(path, data.side, data.num_classes, data.label_offset)
    # the index of the copy is known without a scan: save it where read(path) looks
    val_files = [os.path.join(path, os.path.basename(f)) for f in data.val.files]
    key = tfrecord.cache_key(files + val_files)
    train = tfrecord.Index(tuple(files), np.concatenate([p[0] for p in parts]),
                           np.concatenate([p[1] for p in parts]), np.concatenate([p[2] for p in parts]))
    sample = _first_of_each_shard(train)   # copy k is rows[k]: their labels are the source's
    _save_index(os.path.join(path, f"ic-index-{key}.npz"), train, data.val, data.y_val + data.label_offset,
                sample, _labels(_subset(data.train, rows[sample])))
    return written
