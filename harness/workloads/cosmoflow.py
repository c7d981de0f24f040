"""cosmoflow: CosmoFlow, a 3D CNN regressing 4 cosmological parameters (MLPerf HPC).

MLPerf HPC's most run workload, bagged: each base model regresses the 4 parameters of a
universe from its 3D dark-matter histogram; the ensemble is the mean of the M models'
predicted parameters, its quality the mean absolute error (MAE) on the validation set,
**lower is better** (HIGHER_IS_BETTER = False); MLPerf HPC's target is MAE <= 0.124.

Data, MLPerf HPC's layout (mlcommons/hpc, cosmoflow/data/cosmo.py): `<dir>/train/*.tfrecord`
and `<dir>/validation/*.tfrecord`, each record one tf.train.Example: `x` the raw bytes of
int16 [S, S, S, 4] (channels last; S = 128 in the published sets), `y` 4 float32 (the
parameters, about [-1, 1]); decoded as log(x + 1) in float32. Each file's compression
(GZIP in `cosmoUniverse_2019_05_4parE_tf_v2`, none in the older small set) is read from
its first bytes (tfrecord.is_gzip), not assumed. Any S that is a multiple of 32 is
accepted when every record agrees (5 poolings of 2 need S / 32 >= 1).

Index: built once a data set (cached as `cosmoflow-index-<key>.npz` in the cache
directory, key: names, sizes, mtimes): an uncompressed file's record headers (tfrecord.scan,
no payload read), a GZIP file decompressed once (no random access into gzip), its records
walked. Every record must have the first record's length (one side, one layout), every
validation record and every record of a GZIP file is parsed on the way (their `y`:
validation's are kept for the quality), and the first training record too: a bad file
(another side, a truncated stream, no `y`) stops the load naming the file. That pass reads
a GZIP set whole once, as long as one epoch's reading; the cache spares the next loads.
A training record is parsed again when it is fed, and a bad one stops there, named too.

Feed: numpy, like ewa's: a Python generator reads a batch's records (one pread each, or
from the decompressed file), parses them (tfrecord.parse_example: plain Python, no TensorFlow) and takes
log1p in float32. No augmentation (the reference has none).

`synthetic[:SAMPLES[:SIDE]]` (default 320 universes of 32^3): cosmoflow_synthetic.py
writes them in the published layout (GZIP, int16, one sample a file) and they are read
back through the same reader. There is no embedded data set.

Model: the reference's (cosmoflow/models/cosmoflow.py), built in Keras by
harness/frameworks/tensorflow/cosmoflow.py and in PyTorch by harness/frameworks/pytorch/
cosmoflow.py from the numbers here: 5 x [Conv3D k3 same, filters 32, 64, 128, 256, 512;
LeakyReLU 0.3; MaxPool3D 2], Flatten, Dense 128 + LeakyReLU + Dropout
0.5, Dense 64 + LeakyReLU + Dropout 0.5, Dense 4 tanh x 1.2; loss MSE. Recipe:
SGD momentum 0.9 (the harness's default). The reference's LR (0.001 x global batch / 64,
4 warm-up epochs, x0.25 from epoch 32, x0.125 from 64) is line 19 and 20's business here,
with the harness's warm-up + cosine decay (DESIGN.md §9).

Ensemble and VFLOPS: each framework's `predict` gives each validation universe's 4
predicted parameters; the harness sums the M models' (ENSEMBLE "sum") and `quality` gets
their mean. The penalty of Eq. 8 for an error is (target / achieved)^n (harness/metrics.py); n = 5 (PENALTY_N):
see there and docs/workloads.md, "cosmoflow".
"""
from __future__ import annotations

import glob
import os
import shutil
from dataclasses import dataclass

import numpy as np

from harness import settings
from harness.workloads import DataError, Dataset, cosmoflow_synthetic, facts, staging_folders, synthetic_once, tfrecord

NAME = "cosmoflow"
QUALITY = "MAE"
HIGHER_IS_BETTER = False       # an error: lower is better
TARGET_QUALITY = 0.124         # MLPerf HPC's CosmoFlow target, MAE on the validation set
PENALTY_N = 5                  # ours (no paper defines one): as ic's, see harness/metrics.penalty
AGGREGATIONS = ("mean",)       # the ensemble is the mean of the predicted parameters; no vote
PARAMETERS = 4                 # y: the 4 cosmological parameters
CHANNELS = 4                   # x: 4 redshifts, channels last
SIDE_MULTIPLE = 32             # 5 max-poolings of 2
REFERENCE_SIDE = 128
FILTERS = (32, 64, 128, 256, 512)
DENSE = (128, 64)
LEAKY_ALPHA = 0.3
DROPOUT = 0.5
OUTPUT_SCALE = 1.2             # tanh x 1.2 covers targets in [-1, 1] with room
SYNTHETIC_DEFAULT = (320, 32)  # universes, side
EVAL_BATCH = 8
SPLITS = cosmoflow_synthetic.SPLITS
X_KEY, Y_KEY = "x", "y"
# MLPerf HPC's CosmoFlow data, two published versions (mlcommons/hpc cosmoflow/README.md):
# cosmoUniverse_2019_05_4parE_tf_v2 (v1.0, GZIP) 524,288 training and 65,536 validation
# samples; cosmoUniverse_2019_05_4parE_tf (v0.7) 262,144 and 65,536 (so paper 004 §2.1, and
# the reference's configs/cosmo.yaml n_train/n_valid). Each 128^3 x 4 (REFERENCE_SIDE: the
# model's deviation where not)
PUBLISHED = {"name": "MLPerf HPC's CosmoFlow data", "train_samples": (524_288, 262_144), "val_samples": 65_536}


@dataclass(frozen=True)
class CosmoData(tfrecord.Splits):
    path: str
    source: str                # what was read, for the report and results.json
    train: tfrecord.Index
    val: tfrecord.Index
    y_val: np.ndarray          # (n_val, 4) float32: the validation targets
    side: int                  # voxels a side
    compression: str           # what the files' first bytes said, for the report


# ---- reading --------------------------------------------------------------------------

def load(dataset: Dataset, cache_dir: str, node_rank: int = 0, node_barrier=lambda: None) -> CosmoData:
    """Every rank's data set; the node's rank 0 writes synthetic data and builds the
    index first, the others read after it (files.node_once)."""
    kind = dataset.kind
    if kind == "embedded":
        raise DataError("cosmoflow: there is no embedded data set; give 'synthetic[:SAMPLES[:SIDE]]' or the "
                        "path of a directory with train/*.tfrecord and validation/*.tfrecord (MLPerf HPC's layout)")
    path = dataset.text
    if kind == "synthetic":
        samples, side = dataset.size(SYNTHETIC_DEFAULT)
        if side % SIDE_MULTIPLE:
            raise DataError(f"cosmoflow {dataset.text!r}: SIDE {side} is not a multiple of {SIDE_MULTIPLE} "
                            "(the model's 5 max-poolings of 2)")
        path = os.path.join(cache_dir, cosmoflow_synthetic.directory_name(samples, side))
    write = (lambda: cosmoflow_synthetic.write_synthetic(path, samples, side)) if kind == "synthetic" else None
    return synthetic_once(path, write, lambda: read(path, cache_dir=cache_dir, source=dataset.text), node_rank,
                          node_barrier)


def list_files(path: str, split: str) -> list[str]:
    """The sorted `<path>/<split>/*.tfrecord`; DataError if there are none."""
    files = sorted(glob.glob(os.path.join(path, split, "*.tfrecord")))
    if not files:
        raise DataError(f"{os.path.join(path, split)}: no *.tfrecord files (MLPerf HPC's CosmoFlow layout: "
                        f"<dir>/train/*.tfrecord and <dir>/validation/*.tfrecord)")
    return files


def read(path: str, cache_dir: str | None = None, source: str | None = None) -> CosmoData:
    """The one reader of published, synthetic and staged data. The index is cached in
    cache_dir (default: the directory itself if writable, else not cached)."""
    if not os.path.isdir(path):
        raise DataError(f"cosmoflow dataset {path!r}: not a directory with train/ and validation/ "
                        "*.tfrecord files")
    train_files, val_files = list_files(path, "train"), list_files(path, "validation")
    if cache_dir is None and os.access(path, os.W_OK):
        cache_dir = path
    key = tfrecord.cache_key(train_files + val_files)
    file = os.path.join(cache_dir, f"cosmoflow-index-{key}.npz") if cache_dir else None
    z = tfrecord.load_npz(file) if file else None
    if z is not None and set(z) == set(_INDEX_KEYS):
        train = tfrecord.Index(tuple(train_files), z["train_shard"], z["train_offset"], z["train_length"],
                               tuple(bool(g) for g in z["train_gzip"]))
        val = tfrecord.Index(tuple(val_files), z["val_shard"], z["val_offset"], z["val_length"],
                             tuple(bool(g) for g in z["val_gzip"]))
        y_val, side = z["y_val"], int(z["side"])
    else:
        train, val, y_val, side = _build_index(train_files, val_files)
        if file:
            try:
                os.makedirs(cache_dir, exist_ok=True)
                tfrecord.save_npz(file, train_shard=train.shard, train_offset=train.offset,
                                  train_length=train.length, train_gzip=np.array(train.gzip, bool),
                                  val_shard=val.shard, val_offset=val.offset, val_length=val.length,
                                  val_gzip=np.array(val.gzip, bool), y_val=y_val, side=side)
            except OSError:  # a read-only cache costs a re-scan next time, not the run
                pass
    flags = train.gzip + val.gzip
    compression = ("GZIP" if all(flags) else "none" if not any(flags) else
                   f"GZIP in {sum(flags)} of {len(flags)} files")
    return CosmoData(path, source or path, train, val, y_val, side, compression)


_INDEX_KEYS = ("train_shard", "train_offset", "train_length", "train_gzip", "val_shard", "val_offset",
               "val_length", "val_gzip", "y_val", "side")


def _build_index(train_files, val_files):
    """(train index, validation index, validation y, side), every record checked as the
    module docstring says."""
    train, train_first = _index(train_files, keep_y=False)
    val, y_val = _index(val_files, keep_y=True)
    side = decoded_side(*train_first)
    # one length for every record: one side and one layout, the first training record's
    want = int(train.length[0])
    for index in (train, val):
        bad = np.flatnonzero(index.length != want)
        if len(bad):
            k = int(bad[0])
            raise DataError(f"{index.files[index.shard[k]]}: record {_record_in_file(index, k)} is "
                            f"{int(index.length[k])} bytes, expected {want} like the first training record "
                            f"({train.files[0]}): every record holds one {side}^3 x {CHANNELS} int16 volume "
                            f"and {PARAMETERS} float32 parameters")
    return train, val, y_val, side


def _index(files, keep_y: bool):
    """One split's index and, keep_y: the y of every record (parsed, so checked);
    else: (the first record, its file, 0), for the side. A GZIP file is decompressed
    anyway to find its records: each is parsed on the way."""
    parts, gz, ys, first = [], [], [], None
    for f in files:
        stream = tfrecord.read_gzip(f) if tfrecord.is_gzip(f) else None
        offsets, lengths = tfrecord.scan(f) if stream is None else tfrecord.scan_stream(stream, f)
        if len(offsets) == 0:
            raise DataError(f"{f}: no records (an empty TFRecord file)")
        parts.append((offsets, lengths))
        gz.append(stream is not None)
        wanted = range(len(offsets)) if keep_y or stream is not None else range(1 if first is None else 0)
        with open(f, "rb") as h:
            for k in wanted:
                o, n = int(offsets[k]), int(lengths[k])
                rec = stream[o:o + n] if stream is not None else os.pread(h.fileno(), n, o)
                y = parse(rec, f, k)[1]
                if keep_y:
                    ys.append(y)
                if first is None:
                    first = (rec, f, 0)
    shard = np.concatenate([np.full(len(o), i, np.uint32) for i, (o, _) in enumerate(parts)])
    index = tfrecord.Index(tuple(files), shard, np.concatenate([o for o, _ in parts]),
                           np.concatenate([n for _, n in parts]), tuple(gz))
    return (index, np.array(ys, np.float32).reshape(-1, PARAMETERS)) if keep_y else (index, first)


def parse(record: bytes, file: str, k: int) -> tuple[bytes, np.ndarray]:
    """(x bytes, y float32 (4,)) of a record, or DataError naming the file and record."""
    try:
        feats = tfrecord.parse_example(record)
    except ValueError:
        raise DataError(f"{file}: record {k} is not a tf.train.Example") from None
    x, y = feats.get(X_KEY), feats.get(Y_KEY)
    if not isinstance(x, list) or len(x) != 1:
        raise DataError(f"{file}: record {k}: found no '{X_KEY}' bytes feature, expected the raw bytes of an "
                        f"int16 [S, S, S, {CHANNELS}] volume")
    if not isinstance(y, np.ndarray) or y.dtype != np.float32 or len(y) != PARAMETERS:
        found = len(y) if isinstance(y, np.ndarray) and y.dtype == np.float32 else "no"
        raise DataError(f"{file}: record {k}: found {found} '{Y_KEY}' float(s), expected {PARAMETERS} "
                        "(the cosmological parameters)")
    return x[0], y


def decoded_side(record: bytes, file: str, k: int) -> int:
    """The side S of a record's volume: its x holds S^3 x 4 int16, S a multiple of 32."""
    x = parse(record, file, k)[0]
    voxels = len(x) // (2 * CHANNELS)
    side = round(voxels ** (1 / 3))
    if len(x) != 2 * CHANNELS * side ** 3 or side % SIDE_MULTIPLE or side == 0:
        raise DataError(f"{file}: record {k}: found an '{X_KEY}' of {len(x)} bytes, expected S^3 x {CHANNELS} "
                        f"int16 (2 x {CHANNELS} x S^3 bytes) with S a multiple of {SIDE_MULTIPLE}, e.g. "
                        f"{2 * CHANNELS * REFERENCE_SIDE ** 3} for {REFERENCE_SIDE}^3")
    return side


def decode(record: bytes, file: str, k: int, side: int) -> tuple[np.ndarray, np.ndarray]:
    """(log(x + 1) float32 (S, S, S, 4), y float32 (4,)) of one record, as the reference."""
    x, y = parse(record, file, k)
    if len(x) != 2 * CHANNELS * side ** 3:
        raise DataError(f"{file}: record {k}: found an '{X_KEY}' of {len(x)} bytes, expected "
                        f"{2 * CHANNELS * side ** 3} ({side}^3 x {CHANNELS} int16, as the other records)")
    vol = np.frombuffer(x, "<i2").astype(np.float32).reshape(side, side, side, CHANNELS)
    return np.log(vol + np.float32(1.0)), y   # the reference's log(x + 1), in float32


def data_facts(data: CosmoData) -> dict:
    """The division's facts of the data read (the Workload contract): the marker and the sizes."""
    return facts(data, NAME)


def describe_data(data: CosmoData) -> list[str]:
    """The report's line on what the reader found in the files."""
    return [f"{data.n_train} training and {data.n_val} validation universes of {data.side}^3 x {CHANNELS} int16,"
            f" one tf.train.Example a record (x raw bytes, y {PARAMETERS} float32), decoded log(x + 1);"
            f" compression {data.compression} (detected from each file's first bytes)"]


# ---- staging (the Data Duplicator's copy) ----------------------------------------------

def stage(data: CosmoData, rows, path: str, progress=None) -> int:
    """Training records `rows` (sorted, unique), one file each, and the validation files
    whole, into `path` in the same layout and compression. A source file holding one
    record (the published sets) is copied byte for byte; a record of a larger file is
    framed alone (its header and CRCs kept) and GZIP-compressed again if its file was.
    In the copy, training sample k is rows[k]. Returns the bytes written; `progress()`
    after each file."""
    import gzip
    rows, progress = staging_folders("cosmoflow", rows, data.n_train, path, SPLITS, progress)
    idx = data.train
    per_file = np.bincount(idx.shard, minlength=len(idx.files))
    written = 0
    with tfrecord.Reader(idx) as r:
        for k, row in enumerate(rows):
            shard = int(idx.shard[row])
            src = idx.files[shard]
            out = os.path.join(path, "train", f"{k:09d}_{os.path.basename(src)}")
            if per_file[shard] == 1:
                shutil.copyfile(src, out)
            else:
                framed = r.framed(row)
                with open(out, "wb") as f:
                    f.write(gzip.compress(framed) if idx.gzip and idx.gzip[shard] else framed)
            written += os.path.getsize(out)
            progress()
    for f in data.val.files:
        shutil.copyfile(f, os.path.join(path, "validation", os.path.basename(f)))
        written += os.path.getsize(f)
        progress()
    return written


# ---- the model and the recipe ---------------------------------------------------------

def filters() -> tuple[int, ...]:
    """The convolution blocks' filters: the reference's FILTERS, or with the test-only
    HPCAI500_COSMO_WIDTH first-block width w: w, 2w, 4w, 8w, 16w (a test trains in
    seconds what the reference trains in minutes on a CPU)."""
    width = settings.value("HPCAI500_COSMO_WIDTH") or FILTERS[0]
    return tuple(width * 2 ** i for i in range(len(FILTERS)))


def forward_flops(side: int) -> int:
    """Table 3 FLOPs of one forward pass of the model at side^3, by hand (3D rules:
    convolution 2 x 27 x Cin x D x H x W x Cout at the output size, + bias and LeakyReLU
    1 each per output element; max-pooling 1 per output element; dense 2 x in x out +
    bias (+ LeakyReLU); the tanh output counts 1 per element, the x 1.2 (a Lambda)
    none). The Keras walker's count (frameworks/tensorflow/flops.count) of the
    built model must agree (tests/test_cosmoflow.py)."""
    total, cin, s = 0, CHANNELS, side
    for f in filters():
        out = s ** 3 * f
        total += 2 * 27 * cin * out + 2 * out     # conv, bias + LeakyReLU
        s //= 2
        total += s ** 3 * f                        # pooling: its output elements
        cin = f
    fin = s ** 3 * cin
    for n in DENSE:
        total += 2 * fin * n + 2 * n               # dense, bias + LeakyReLU
        fin = n
    return total + 2 * fin * PARAMETERS + 2 * PARAMETERS   # dense, bias + tanh


def describe_model(data: CosmoData) -> tuple[str, list[str]]:
    """The FLOP note of the model built, and how it differs from the reference at 128^3."""
    fwd = forward_flops(data.side)
    width = filters()
    note = (f"the {'reference ' if width == FILTERS else ''}3D CNN at {data.side}^3: {fwd / 1e9:.3f} GFLOPs forward, {3 * fwd / 1e9:.3f} per"
            f" training sample (Table 3 in 3D: convolution 2 x 27 x Cin x D x H x W x Cout at the output size,"
            f" 3D max-pooling 1 per output element); decoding log(x + 1) is not counted."
            f" VFLOPS of an error: FLOPS x (target / MAE)^n")
    deviations = [] if data.side == REFERENCE_SIDE else [f"{data.side}^3 volumes, not {REFERENCE_SIDE}^3"]
    if width != FILTERS:
        deviations.append(f"filters {', '.join(map(str, width))} (HPCAI500_COSMO_WIDTH), not"
                          f" {', '.join(map(str, FILTERS))}")
    return note, deviations


def _volumes(data: CosmoData, index: tfrecord.Index, rows, batch: int, drop_remainder: bool):
    """Batches (x, y) of records `rows` of `index`, in order, decoded."""
    rows = np.asarray(rows, np.int64)
    if len(rows) and (rows.min() < 0 or rows.max() >= len(index)):
        raise IndexError(f"cosmoflow: rows {rows.min()}..{rows.max()} outside 0..{len(index) - 1}")
    stop = len(rows) // batch * batch if drop_remainder else len(rows)
    with tfrecord.Reader(index) as r:
        for a in range(0, stop, batch):
            part = rows[a:min(a + batch, stop)]
            out = [decode(r.record(k), index.files[index.shard[k]], _record_in_file(index, k), data.side)
                   for k in part]
            yield np.stack([x for x, _ in out]), np.stack([y for _, y in out])


def _record_in_file(index: tfrecord.Index, k: int) -> int:
    """The record's number within its file (records are in file order), for messages."""
    shard = index.shard[k]
    return int(k - np.searchsorted(index.shard, shard))


def batches(data: CosmoData, rows, batch: int, *, training: bool = True, seed: int = 0):
    """len(rows) // batch batches (x, y) of training samples `rows`, in that order (the
    reference does not augment: `training` and `seed` change nothing)."""
    return _volumes(data, data.train, rows, batch, drop_remainder=True)


# ---- evaluation -----------------------------------------------------------------------

def score_width(data: CosmoData) -> int:
    return PARAMETERS


def validation_volumes(data: CosmoData, rows: slice):
    """The decoded volumes x of validation rows `rows`, EVAL_BATCH at a time, in order:
    what each framework's predict() feeds its model."""
    idx = np.arange(data.n_val)[rows]
    return (x for x, _ in _volumes(data, data.val, idx, EVAL_BATCH, drop_remainder=False))


def quality(scores: np.ndarray, data: CosmoData) -> float:
    """Mean absolute error of the predicted parameters against the validation targets,
    over every parameter of every universe (Keras' mean_absolute_error, the reference's
    metric). Lower is better."""
    scores = np.asarray(scores, np.float64)
    if scores.shape != (data.n_val, PARAMETERS):
        raise ValueError(f"cosmoflow.quality: scores of shape {scores.shape}, expected ({data.n_val}, {PARAMETERS})")
    return float(np.mean(np.abs(scores - data.y_val)))


def trivial_error(y_train_mean: np.ndarray, data: CosmoData) -> float:
    """The MAE of predicting the training targets' mean for every universe: the baseline
    a model must beat to have learnt anything."""
    return quality(np.broadcast_to(np.asarray(y_train_mean, np.float64), (data.n_val, PARAMETERS)), data)


def train_targets(data: CosmoData) -> np.ndarray:
    """The y of every training record (reads them all: for tests and small sets)."""
    out = np.zeros((data.n_train, PARAMETERS), np.float32)
    with tfrecord.Reader(data.train) as r:
        for k in range(data.n_train):
            out[k] = parse(r.record(k), data.train.files[data.train.shard[k]], _record_in_file(data.train, k))[1]
    return out

