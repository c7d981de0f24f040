"""Box math of the ewa workload: anchors, IoU, box coding, NMS, fusion, mAP@0.5.

Boxes are (ymin, xmin, ymax, xmax) in pixels, continuous coordinates: a box's area is
(ymax - ymin) * (xmax - xmin), with no "+1" (that is a pixel-index convention of the
VOC devkit; our boxes are extents of fields, not pixel lists).

`iou`, `encode` and `decode` are written once for numpy and the frameworks: the models
run the same formulas the tests check by hand, on tensors (`xp`: the namespace of the
few numpy functions they use, harness/frameworks/tensorflow/faster_rcnn.TF and
harness/frameworks/pytorch/ewa.TORCH).
A detection is a row (class, score, ymin, xmin, ymax, xmax); score 0 marks padding.
"""
from __future__ import annotations

import math

import numpy as np

# A box row's column order (HPCAI500_EWA_BOX_ORDER) is parsed where the settings are, the
# layer below the workloads; extreme_weather reads the rule here
from harness.settings import BOX_ORDER_FORM, box_columns  # noqa: F401

# The head's box deltas are divided by these (the usual Faster-RCNN convention): its
# ROIs already overlap their boxes, so the raw offsets are small; scaled up, they train
# with the same step as the classifier. The RPN's anchors are further off: scale 1.
DELTA_SCALE = (0.1, 0.1, 0.2, 0.2)
RPN_SCALE = (1.0, 1.0, 1.0, 1.0)
MAX_LOG_RATIO = math.log(1000.0 / 16)  # a decoded box grows at most ~60x: exp() cannot overflow


def anchors(feature_hw: tuple[int, int], stride: int, sizes, ratios) -> np.ndarray:
    """(fh * fw * len(sizes) * len(ratios), 4) anchors, position-major: the order of a
    (fh, fw, k) convolution output reshaped to (fh * fw * k). Ratio = height / width;
    every anchor of a size has the same area, size**2."""
    fh, fw = feature_hw
    shapes = np.array([(s * math.sqrt(r), s / math.sqrt(r)) for s in sizes for r in ratios])
    cy, cx = np.meshgrid((np.arange(fh) + 0.5) * stride, (np.arange(fw) + 0.5) * stride, indexing="ij")
    centres = np.stack([cy, cx], -1).reshape(-1, 1, 2)
    half = shapes[None] / 2.0
    return np.concatenate([centres - half, centres + half], -1).reshape(-1, 4).astype(np.float32)


def area(boxes, xp=np):
    return xp.maximum(boxes[..., 2] - boxes[..., 0], 0.0) * xp.maximum(boxes[..., 3] - boxes[..., 1], 0.0)


def iou(a, b, xp=np):
    """IoU of every box of a (..., N, 4) with every box of b (..., M, 4): (..., N, M).
    Degenerate (zero-area) boxes have IoU 0 with everything."""
    a, b = a[..., :, None, :], b[..., None, :, :]
    h = xp.maximum(xp.minimum(a[..., 2], b[..., 2]) - xp.maximum(a[..., 0], b[..., 0]), 0.0)
    w = xp.maximum(xp.minimum(a[..., 3], b[..., 3]) - xp.maximum(a[..., 1], b[..., 1]), 0.0)
    inter = h * w
    union = area(a, xp) + area(b, xp) - inter
    return inter / xp.maximum(union, 1e-9)


def _centre_size(boxes, xp):
    h, w = boxes[..., 2] - boxes[..., 0], boxes[..., 3] - boxes[..., 1]
    return boxes[..., 0] + 0.5 * h, boxes[..., 1] + 0.5 * w, h, w


def encode(boxes, refs, xp=np, scale=DELTA_SCALE):
    """Regression targets that turn reference boxes `refs` into `boxes` (same shapes)."""
    by, bx, bh, bw = _centre_size(boxes, xp)
    ry, rx, rh, rw = _centre_size(refs, xp)
    rh, rw = xp.maximum(rh, 1e-3), xp.maximum(rw, 1e-3)
    bh, bw = xp.maximum(bh, 1e-3), xp.maximum(bw, 1e-3)
    sy, sx, sh, sw = scale
    return xp.stack([(by - ry) / rh / sy, (bx - rx) / rw / sx,
                     xp.log(bh / rh) / sh, xp.log(bw / rw) / sw], -1)


def decode(deltas, refs, xp=np, scale=DELTA_SCALE):
    """The inverse of `encode`: boxes from deltas relative to `refs`."""
    ry, rx, rh, rw = _centre_size(refs, xp)
    sy, sx, sh, sw = scale
    cy, cx = ry + deltas[..., 0] * sy * rh, rx + deltas[..., 1] * sx * rw
    h = rh * xp.exp(xp.minimum(deltas[..., 2] * sh, MAX_LOG_RATIO))
    w = rw * xp.exp(xp.minimum(deltas[..., 3] * sw, MAX_LOG_RATIO))
    return xp.stack([cy - 0.5 * h, cx - 0.5 * w, cy + 0.5 * h, cx + 0.5 * w], -1)


def greedy_keep(over: np.ndarray, max_out: int) -> np.ndarray:
    """Greedy non-maximum suppression on boxes already in order of score, best first:
    `over[i, j]` says box i overlaps box j beyond the threshold (TensorFlow's rule: IoU >
    threshold). Each box is kept unless a box kept before it overlaps it; at most
    `max_out`. Returns the kept positions, in order. The IoU is the caller's (in its
    framework, on its device); this loop is the part no framework op gives without
    torchvision."""
    suppressed, keep = np.zeros(len(over), bool), []
    for i in range(len(over)):
        if len(keep) == max_out:
            break
        if not suppressed[i]:
            keep.append(i)
            suppressed |= over[i]
    return np.asarray(keep, np.int64)


def _iou_one(b, boxes: np.ndarray) -> np.ndarray:
    """`iou` of one box with many, without the broadcasting machinery (fusion's inner loop)."""
    h = np.clip(np.minimum(b[2], boxes[:, 2]) - np.maximum(b[0], boxes[:, 0]), 0, None)
    w = np.clip(np.minimum(b[3], boxes[:, 3]) - np.maximum(b[1], boxes[:, 1]), 0, None)
    inter = h * w
    union = (b[2] - b[0]) * (b[3] - b[1]) + (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]) - inter
    return inter / np.maximum(union, 1e-9)


def rows(flat: np.ndarray) -> np.ndarray:
    """A model's packed, zero-padded detections (K * 6,) -> its real (n, 6) rows.
    Non-finite or non-positive scores are padding (or a diverged model): dropped."""
    d = np.asarray(flat, np.float64).reshape(-1, 6)
    return d[np.isfinite(d).all(1) & (d[:, 1] > 0)]


def fuse(per_model: list[np.ndarray], iou_threshold: float = 0.55, keep: int | None = None) -> np.ndarray:
    """Class-wise weighted box fusion of M models' detections of one image.

    In order of score, each detection joins the cluster of its class whose fused box
    overlaps it most (IoU >= threshold), or starts a new one. A cluster's box is the
    score-weighted mean of its members; its score is the sum over models of each
    model's best score in it, divided by M: the average over all M models, a model
    that did not find the object contributing 0 (so 1 of M models gives score / M).
    With M = 1 and detections already suppressed at IoU <= 0.5 by the model's own NMS,
    nothing merges: fusion returns the model's detections unchanged (reordered).
    `keep`: at most this many fused detections, the highest scores (ties: the earlier).
    The ensemble keeps as many boxes as one base model may, so that its mAP is not
    bought with the extra recall of M x K boxes against a base model's K.
    """
    m = len(per_model)
    tagged = [np.column_stack([d, np.full(len(d), k)]) for k, d in enumerate(per_model) if len(d)]
    if not tagged:
        return np.zeros((0, 6))
    dets = np.concatenate(tagged)
    out = []
    for c in np.unique(dets[:, 0]):
        d = dets[dets[:, 0] == c]
        d = d[np.argsort(-d[:, 1], kind="stable")]
        n = 0                                  # clusters so far
        fused = np.zeros((len(d), 4))          # their boxes
        weighted, weight = np.zeros((len(d), 4)), np.zeros(len(d))  # running sums
        best = np.zeros((len(d), m))           # each model's best score in each cluster
        for row in d:
            j = n
            if n:
                overlaps = _iou_one(row[2:6], fused[:n])
                if overlaps.max() >= iou_threshold:
                    j = int(np.argmax(overlaps))
            n += j == n
            weighted[j] += row[1] * row[2:6]
            weight[j] += row[1]
            fused[j] = weighted[j] / weight[j]
            best[j, int(row[6])] = max(best[j, int(row[6])], row[1])
        out.append(np.column_stack([np.full(n, c), best[:n].sum(1) / m, fused[:n]]))
    out = np.concatenate(out)
    return out if keep is None else out[np.argsort(-out[:, 1], kind="stable")[:keep]]


def average_precision(recall: np.ndarray, precision: np.ndarray) -> float:
    """VOC all-point interpolated AP: the area under the precision envelope (at each
    recall, the best precision at that recall or beyond)."""
    r = np.concatenate([[0.0], recall, [1.0]])
    p = np.concatenate([[0.0], precision, [0.0]])
    p = np.maximum.accumulate(p[::-1])[::-1]
    steps = np.flatnonzero(r[1:] != r[:-1])
    return float(np.sum((r[steps + 1] - r[steps]) * p[steps + 1]))


def mean_average_precision(dets: list[np.ndarray], gts: list[np.ndarray], num_classes: int,
                           iou_threshold: float = 0.5) -> float:
    """mAP@iou_threshold, VOC style, over the classes that appear in the ground truth.

    dets[i]: (n, 6) detections of image i; gts[i]: (g, 5) ground truth (class, box),
    rows with class < 0 are padding. In order of score over all images, a detection is
    a true positive if its best-overlapping ground-truth box of its class has IoU >=
    threshold and is not yet taken; otherwise (duplicates included) a false positive.
    Detections of a class absent from the ground truth do not count (as in VOC).
    """
    aps = []
    for c in range(num_classes):
        truth = [g[g[:, 0] == c, 1:5] for g in gts]
        n_pos = sum(len(t) for t in truth)
        if n_pos == 0:
            continue
        found = [(i, row[1], row[2:6]) for i, d in enumerate(dets) for row in d if row[0] == c]
        found.sort(key=lambda f: -f[1])  # stable: ties keep image order
        taken = [np.zeros(len(t), bool) for t in truth]
        tp = np.zeros(len(found))
        for k, (i, _, box) in enumerate(found):
            if len(truth[i]):
                overlaps = iou(box[None], truth[i])[0]
                j = int(np.argmax(overlaps))
                if overlaps[j] >= iou_threshold and not taken[i][j]:
                    taken[i][j] = True
                    tp[k] = 1
        hits = np.cumsum(tp)
        aps.append(average_precision(hits / n_pos, hits / np.arange(1, len(found) + 1)))
    if not aps:
        raise ValueError("mean_average_precision: the ground truth has no boxes")
    return float(np.mean(aps))
