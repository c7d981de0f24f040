"""deepcam: DeepCAM, MLPerf HPC's climate segmentation (DeepLabv3+ on CAM5 data), bagged.

Each base model segments every pixel of a 16-channel climate snapshot into background,
tropical cyclone and atmospheric river (MLPerf HPC, mlcommons/hpc `deepcam/`); the
ensemble's quality is the IoU the reference scores (`utils/metric.py`): per validation
sample, the mean over the 3 classes of |prediction & label| / |prediction | label|, a
class absent from both scoring 1; then the mean over samples. Target 0.82 (MLPerf HPC).

Data: harness/workloads/climate.py (the reference's HDF5 layout, one sample a file, a
stats.h5 for the min-max normalisation), `synthetic[:SAMPLES[:HEIGHT]]` written by
climate_synthetic.py in that layout and read back by the same reader; no embedded set.
Model: the reference's DeepLabv3+ with an Xception encoder, ported layer for layer
(Keras: harness/frameworks/tensorflow/deeplab.py; PyTorch: harness/frameworks/pytorch/
deepcam.py), both built from the design's numbers below; HPCAI500_DEEPCAM_WIDTH and
HPCAI500_DEEPCAM_MIDDLE (test-only) shrink it.

Loss: the reference's per-pixel cross entropy weighted by class, w_c = f_c^-0.125 with
f_c the classes' pixel frequencies in the published training set (CLASS_WEIGHTS), and
its reduction: the plain mean of the weighted per-pixel losses (PyTorch's
CrossEntropyLoss(weight, reduction='none') then torch.mean), not a mean normalised by
the weights.

Ensemble: each framework's `predict` gives each validation sample's per-pixel class
probabilities (softmax in FP32), H x W x 3 a row; the quality being a mean over samples
(QUALITY_PER_SAMPLE), the harness evaluates a chunk of samples at a time. mean: the M
models' probabilities averaged, the class their argmax; vote: each model's per-pixel
class one-hot (VOTE_GROUP = 3 columns a vote), the class with most votes (ties to the
lowest class index).

VFLOPS: (IoU / 0.82)^n with n = 5 (PENALTY_N): no paper defines n for DeepCAM; IoU is
a higher-is-better fraction as Top-1 is, so the n of HPC AI500 V2.0's image
classification (an IoU r times the target prices FLOPS at r^5).
"""
from __future__ import annotations

import os

import numpy as np

from harness import settings
from harness.workloads import DataError, Dataset, climate, climate_synthetic, facts, synthetic_once

NAME = "deepcam"
QUALITY = "IoU"
TARGET_QUALITY = 0.82          # MLPerf HPC's DeepCAM target
PENALTY_N = 5                  # ours (no paper defines one): as image classification's, see the docstring
AGGREGATIONS = ("mean", "vote")
QUALITY_PER_SAMPLE = True      # a mean over samples: evaluated in chunks (harness/run.Evaluation)
VOTE_GROUP = climate.CLASSES   # a vote chooses among each pixel's 3 class columns
REFERENCE_SIZE = (768, 1152)   # the published samples' height and width
SYNTHETIC_DEFAULT = (128, 64)  # samples, height in pixels (width = 1.5 x height)
# MLPerf HPC's DeepCAM data: 121,266 training and 15,158 validation samples of 768 x 1152 x 16
# (paper 004 §2.2; the reference's DALI loader, global_size 121266 / 15158). Its 3 classes are
# the reader's (labels 0..2 enforced): not a fact of the data
PUBLISHED = {"name": "MLPerf HPC's DeepCAM data", "train_samples": 121_266, "val_samples": 15_158}
# The reference's class weights (train.py): pixel frequencies of background, cyclone and
# river in the published training set, to the power -0.125.
CLASS_FREQUENCIES = (0.986267818390377, 0.0004578708870701058, 0.01327431072255291)
CLASS_WEIGHTS = tuple(f ** -0.125 for f in CLASS_FREQUENCIES)
# The reference's optimizers (utils/optimizer_helpers.py, run_training.sh): apex's FusedLAMB
# with weight decay 1e-2, eps 1e-6 and its default gradient-norm clipping at 1; Adam with
# eps 1e-6, here with decoupled weight decay 1e-2 (AdamW, MLPerf HPC's other choice).
OPTIMIZER_OPTIONS = {"lamb": {"weight_decay": 1e-2, "epsilon": 1e-6, "global_clipnorm": 1.0},
                     "adam": {"weight_decay": 1e-2, "epsilon": 1e-6}}
EVAL_PIXELS = 1 << 22          # pixels a prediction step holds, at most (4 M: ~270 MB of logits and features)
WIDTH_ENV, MIDDLE_ENV = "HPCAI500_DEEPCAM_WIDTH", "HPCAI500_DEEPCAM_MIDDLE"

# The model's design (the reference's DeepLabv3+, scale 1), which both frameworks' ports
# build from: harness/frameworks/tensorflow/deeplab.py's docstring describes it.
OUTPUT_STRIDE = 16
MIDDLE_BLOCKS = 16
ASPP_RATES = (1, 6, 12, 18)       # output stride 16
EXIT_RATES = (1, 2)               # block 20's dilation, then the exit convolutions'
BN_MOMENTUM, BN_EPSILON = 0.9, 1e-5   # PyTorch's momentum 0.1, eps 1e-5
# The reference's channel counts (scale 1)
ENTRY = (32, 64)
BLOCKS = (128, 256, 728)
EXIT = (1024, 1536, 1536, 2048)
ASPP, LOW_LEVEL, DECODER = 256, 48, 256


def channels(count: int, scale: float) -> int:
    """A reference channel count at width `scale` (at least 1)."""
    return max(1, round(count * scale))


def block_rep(cin: int, cout: int, reps: int, stride: int = 1, dilation: int = 1, grow_first: bool = True,
              is_last: bool = False) -> list[tuple]:
    """The reference Block's residual branch, layer by layer, as every framework's port builds
    it (the position is the reference's `rep.{i}`): ("separable", in, out, stride, dilation),
    ("bn", channels), ("relu",). A separable conv + BN `reps` times, a ReLU between them but
    never after the last, the channels grown at the first (`grow_first`) or the last; then a
    stride-2 separable conv (no BN) when the block strides, or a stride-1 one when it is the
    last of its flow."""
    widths = [cout] * reps if grow_first else [cin] * (reps - 1) + [cout]
    rep, c = [], cin
    for i, f in enumerate(widths):
        rep += [("separable", c, f, 1, dilation), ("bn", f)]
        if i < len(widths) - 1:   # the reference drops the ReLU after the last
            rep.append(("relu",))
        c = f
    if stride != 1 or is_last:
        rep.append(("separable", cout, cout, stride, 1))
    return rep


# ---- data ---------------------------------------------------------------------------

def load(dataset: Dataset, cache_dir: str, node_rank: int = 0, node_barrier=lambda: None) -> climate.Data:
    """Every rank's data set; the node's rank 0 writes synthetic data first (a directory
    there is a whole set, renamed into place), the others read after it."""
    kind = dataset.kind
    if kind == "embedded":
        raise DataError("deepcam: there is no embedded data set; give 'synthetic[:SAMPLES[:HEIGHT]]' or the path of"
                        " a directory with train/*.h5, validation/*.h5 and stats.h5 (MLPerf HPC's DeepCAM layout)")
    path = dataset.text
    if kind == "synthetic":
        samples, height = dataset.size(SYNTHETIC_DEFAULT)
        if height % climate_synthetic.HEIGHT_MULTIPLE:   # the writer's own rule, said as a data error
            raise DataError(f"deepcam {dataset.text!r}: HEIGHT {height} is not a multiple of"
                            f" {climate_synthetic.HEIGHT_MULTIPLE}"
                            f" (the width, 1.5 x the height, must be a multiple of the model's output stride"
                            f" {climate.SIDE_MULTIPLE})")
        path = os.path.join(cache_dir, climate_synthetic.directory_name(samples, height))
    write = (lambda: climate_synthetic.write_synthetic(path, samples, height)) if kind == "synthetic" else None
    return synthetic_once(path, write, lambda: climate.read(path, source=dataset.text), node_rank, node_barrier)


def read(path: str, source: str | None = None) -> climate.Data:
    return climate.read(path, source=source)


def stage(data: climate.Data, rows, path: str, progress=None) -> int:
    """The Data Duplicator's copy, in the published layout (climate.stage)."""
    return climate.stage(data, rows, path, progress)


def data_facts(data: climate.Data) -> dict:
    """The division's facts of the data read (the Workload contract): the marker and the sizes."""
    return facts(data, NAME)


def describe_data(data: climate.Data) -> list[str]:
    return [f"{data.n_train} training and {data.n_val} validation samples of {data.height} x {data.width} x"
            f" {climate.CHANNELS}, one HDF5 file a sample ({climate.DATA_KEY}, {climate.LABEL_KEY});"
            f" min-max normalisation from stats.h5, as the reference"]


# ---- model and training ----------------------------------------------------------

def shape() -> tuple[float, int]:
    """(channel scale, middle-flow blocks) of the model built: the reference's (1, 16)
    unless the test-only settings shrink it."""
    width = settings.value(WIDTH_ENV)
    middle = settings.value(MIDDLE_ENV)
    return ((width or ENTRY[0]) / ENTRY[0],
            MIDDLE_BLOCKS if middle is None else middle)


def describe_model(data: climate.Data) -> tuple[str, list[str]]:
    """The FLOP note of the model built, and how it differs from the reference."""
    scale, middle = shape()
    deviations = []
    if (data.height, data.width) != REFERENCE_SIZE:
        deviations.append(f"{data.height} x {data.width} samples, not {REFERENCE_SIZE[0]} x {REFERENCE_SIZE[1]}")
    if scale != 1:
        deviations.append(f"channels x {scale:g} ({WIDTH_ENV}), entry convolution"
                          f" {channels(ENTRY[0], scale)} filters, not {ENTRY[0]}")
    if middle != MIDDLE_BLOCKS:
        deviations.append(f"{middle} middle-flow blocks ({MIDDLE_ENV}), not {MIDDLE_BLOCKS}")
    note = ("DeepLabv3+ (Xception encoder, ASPP, transposed-convolution decoder) by Table 3's rules: separable"
            " convolutions as depthwise 2 x 9 x C x H x W + pointwise, dilated ones as undilated (the taps"
            " multiplied are the same), transposed ones per input pixel (TensorFlow's convention); the"
            " softmax and the loss are not counted. Recipe, the reference's: lamb with weight decay 1e-2"
            " (not on biases and batch norm), eps 1e-6, gradient-norm clipping at 1; adam as AdamW (weight"
            " decay 1e-2, eps 1e-6); other optimizers as the harness makes them")
    return note, deviations


def batches(data: climate.Data, rows, batch: int, *, training: bool = True, seed: int = 0):
    """len(rows) // batch batches (x, y) of training samples `rows`, in that order, read
    and normalised (the reference does not augment: `training` and `seed` change
    nothing)."""
    order = np.asarray(rows, np.int64)
    for s in range(len(order) // batch):
        yield climate.samples(data, "train", order[s * batch:(s + 1) * batch])


# ---- prediction and quality ------------------------------------------------------

def score_width(data: climate.Data) -> int:
    return data.height * data.width * climate.CLASSES


def validation_samples(data: climate.Data, rows: slice):
    """The normalised inputs x of validation samples `rows`, in order, EVAL_PIXELS pixels
    a batch at most: what each framework's predict() feeds its model."""
    index = np.arange(data.n_val)[rows]
    batch = max(1, EVAL_PIXELS // (data.height * data.width))
    return (climate.samples(data, "validation", index[lo:lo + batch])[0] for lo in range(0, len(index), batch))


def iou(predicted: np.ndarray, labels: np.ndarray, classes: int = climate.CLASSES) -> np.ndarray:
    """Each sample's IoU as the reference's utils/metric.compute_score: the mean over
    classes of TP / (TP + FP + FN), a class absent from both prediction and label
    scoring 1. predicted, labels: (n, H, W) class indices; returns (n,)."""
    n = len(labels)
    p, t = predicted.reshape(n, -1), labels.reshape(n, -1)
    out = np.zeros(n)
    for c in range(classes):
        pc, tc = p == c, t == c
        tp = np.sum(pc & tc, axis=1)
        union = tp + np.sum(pc & ~tc, axis=1) + np.sum(~pc & tc, axis=1)
        out += np.where(union > 0, tp / np.maximum(union, 1), 1.0)
    return out / classes


def quality(scores: np.ndarray, data: climate.Data, rows: slice = slice(None)) -> float:
    """The IoU of the (ensemble's) per-pixel scores of validation samples `rows` (all by
    default): the mean of each sample's IoU (iou), the class of a pixel the argmax of its
    3 scores (ties to the lowest class index)."""
    index = np.arange(data.n_val)[rows]
    scores = np.asarray(scores)
    if scores.shape != (len(index), score_width(data)):
        raise ValueError(f"deepcam.quality: scores of shape {scores.shape}, expected"
                         f" ({len(index)}, {score_width(data)})")
    predicted = np.argmax(scores.reshape(len(index), data.height, data.width, climate.CLASSES), axis=-1)
    return float(np.mean(iou(predicted, climate.labels(data, index))))
