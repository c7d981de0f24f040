"""The ewa workload's detector in MindSpore: the Faster-RCNN harness/frameworks/pytorch/ewa.py
builds in PyTorch (its twin here) and harness/frameworks/tensorflow/faster_rcnn.py in Keras,
layer for layer, from the same design (workloads/detector.py: Config, the anchors, the
sampling constants) and the same box math (workloads/detection.py).

    images (N, 16, H, W) -> backbone (ResNet-50's conv1-conv4, or the small one) -> features
    features -> RPN: objectness logit and box deltas of every anchor
    RPN -> proposals (on the host): decode, the best pre_nms, greedy NMS, the best R boxes an
           image (training: the ground truth in the last max_boxes slots)
    features, proposals -> bilinear crop to 2 pool (crop_and_resize's sampling), max pool
           to pool -> fc6, fc7 -> class logits (background + 4) and box deltas per ROI

Everything that chooses boxes rather than learns them runs on the host in numpy, with
detection.py's formulas: the proposals (decode, top-k, NMS: the other two ports' boxes,
which stop their gradient there too), and the loss's matching and sampling (which anchors
and ROIs count, and their box targets). The gradient flows through what the other ports'
does: the RPN's logits and deltas, the head's outputs, and the ROI crop into the features
(mindspore.ops.grid_sample at crop_and_resize's sampling points, zero outside the map).
So a step runs eagerly (PyNative, JIT = False: the Step does not compile it into one
mindspore.jit graph), the host's NMS inside it.

Keras' initial weights (Glorot-uniform kernels, zero biases) and batch norm (eps 1e-3,
momentum 0.99); "same" padding as symmetric kernel // 2 (the same output sizes). The same
Table 3 count and weights as the Keras model (tests/test_mindspore.py): the box math is
no cell with a Table 3 rule, as Keras runs it in layers without one. The sampling's
uniform draws come from the model's own numpy generator (`host_rng`, seeded from the job's
seed, which build() sets as MindSpore's global seed): MindSpore's eager random operators on
a CPU are not governed by its get/set_rng_state, so the Step could not put theirs back
after the warm-up; it puts this one back.

The data, feed and quality are harness/workloads/ewa.py's (its numpy feed).
"""
from __future__ import annotations

import numpy as np
import mindspore as ms
from mindspore import nn, ops

from harness.frameworks.mindspore import ic, models, train
from harness.workloads import detection as det
from harness.workloads import detector, ewa

JIT = False   # the proposals' NMS runs on the host inside the forward pass: eager steps


def _conv(cin: int, cout: int, kernel: int, stride: int = 1, bias: bool = False) -> nn.Conv2d:
    """Keras' Conv2D: Glorot-uniform kernel, zero bias, "same" as kernel // 2 on each side."""
    return nn.Conv2d(cin, cout, kernel, stride, pad_mode="pad", padding=kernel // 2, has_bias=bias,
                     weight_init="xavier_uniform", bias_init="zeros")


def _conv_bn(cin: int, cout: int, kernel: int, stride: int = 1, relu: bool = True) -> nn.SequentialCell:
    layers = [_conv(cin, cout, kernel, stride), nn.BatchNorm2d(cout, eps=1e-3, momentum=0.99)]
    return nn.SequentialCell(*layers, nn.ReLU()) if relu else nn.SequentialCell(*layers)


class _Residual(ic.Residual):
    """relu(shortcut(x) + branch(x)) (ic.Residual: its arithmetic for Table 3's count); the
    shortcut a projection where the shape changes."""

    def __init__(self, cin: int, cout: int, stride: int, branch: list):
        super().__init__()
        self.shortcut = nn.Identity() if (stride == 1 and cin == cout) else _conv_bn(cin, cout, 1, stride, relu=False)
        self.branch = nn.SequentialCell(*branch)


def backbone(cfg: detector.Config) -> tuple[nn.SequentialCell, int]:
    """(the trunk, its output channels): detector.trunk's layers, ResNet-50's conv1 to conv4
    or the narrow basic-block backbone."""
    stem, pool, blocks = detector.trunk(cfg)
    layers = [_conv_bn(cfg.channels, *stem), *([nn.MaxPool2d(3, 2, pad_mode="pad", padding=1)] if pool else [])]
    layers += [_Residual(cin, cout, stride, [_conv_bn(*c) for c in branch]) for cin, cout, stride, branch in blocks]
    return nn.SequentialCell(*layers), blocks[-1][1]


class FasterRCNN(nn.Cell):
    """construct((images, gt_boxes)) -> the other ports' outputs, by the same names:
    rpn_logits (N, A), rpn_deltas (N, A, 4), anchors (1, A, 4), rois (N, R, 4), cls_logits
    (N, R, 5), box_deltas (N, R, 4), rpn_noise, roi_noise (the loss's draws; zeros in eval
    mode); the anchors, ROIs and draws as numpy arrays (the host's: no gradient reaches
    them). gt_boxes (N, G, 5) is read in training only."""

    def __init__(self, cfg: detector.Config):
        super().__init__()
        self.cfg = detector.checked(cfg)
        self.backbone, c = backbone(cfg)
        k = len(cfg.anchor_sizes) * len(cfg.anchor_ratios)
        self.rpn_conv = _conv(c, cfg.rpn_channels, 3, bias=True)
        self.rpn_cls = _conv(cfg.rpn_channels, k, 1, bias=True)
        self.rpn_box = _conv(cfg.rpn_channels, 4 * k, 1, bias=True)
        self.relu = nn.ReLU()     # one cell, called after the RPN's conv, fc6 and fc7: a Table 3 record each call
        self.crop = RoiCrop(cfg)
        self.anchors = cfg.anchors()
        self.roi_pool = nn.MaxPool2d(2, 2)
        dense = {"weight_init": "xavier_uniform", "bias_init": "zeros"}
        self.fc6, self.fc7 = nn.Dense(cfg.pool * cfg.pool * c, cfg.fc, **dense), nn.Dense(cfg.fc, cfg.fc, **dense)
        self.cls_logits, self.box_deltas = nn.Dense(cfg.fc, cfg.classes + 1, **dense), nn.Dense(cfg.fc, 4, **dense)
        for head in (self.rpn_cls, self.rpn_box, self.cls_logits, self.box_deltas):
            head.FP32 = True      # in FP32 under line 17's fp16, as Keras' float32 output layers (train.build)
        self.host_rng = np.random.default_rng(ms.get_seed() or 0)    # the loss's draws (the docstring says why numpy)

    def construct(self, inputs):
        images, gt = inputs
        cfg, n = self.cfg, images.shape[0]
        features = self.backbone(images)
        r = self.relu(self.rpn_conv(features))
        logits = self.rpn_cls(r).astype(ms.float32).transpose(0, 2, 3, 1).reshape(n, -1)         # anchor order:
        deltas = self.rpn_box(r).astype(ms.float32).transpose(0, 2, 3, 1).reshape(n, -1, 4)      # position-major
        rois = self.proposals(logits.asnumpy(), deltas.asnumpy(), gt.asnumpy())
        crops = self.crop(features.astype(ms.float32), rois)     # (N, C, R, 2 pool, 2 pool)
        c = crops.shape[1]
        # each ROI's 2 pool rows pool apart from the next ROI's: max pool on (N, C, R 2 pool, 2 pool)
        pooled = self.roi_pool(crops.reshape(n, c, cfg.rois * 2 * cfg.pool, 2 * cfg.pool))
        h = pooled.reshape(n, c, cfg.rois, cfg.pool, cfg.pool).transpose(0, 2, 1, 3, 4).reshape(n * cfg.rois, -1)
        h = self.relu(self.fc7(self.relu(self.fc6(h.astype(features.dtype)))))
        cls_logits = self.cls_logits(h).astype(ms.float32).reshape(n, cfg.rois, -1)
        box_deltas = self.box_deltas(h).astype(ms.float32).reshape(n, cfg.rois, 4)
        draw = (lambda shape: self.host_rng.random(shape, np.float32)) if self.training else (
            lambda shape: np.zeros(shape, np.float32))
        return {"rpn_logits": logits, "rpn_deltas": deltas, "anchors": self.anchors[None], "rois": rois,
                "cls_logits": cls_logits, "box_deltas": box_deltas,
                "rpn_noise": draw(logits.shape), "roi_noise": draw(cls_logits.shape[:2])}

    def proposals(self, logits: np.ndarray, deltas: np.ndarray, gt: np.ndarray) -> np.ndarray:
        """The R best boxes an image after NMS (zero rows where fewer survive); in
        training the ground truth replaces the last max_boxes (faster_rcnn.Proposals)."""
        cfg = self.cfg
        boxes = clip(det.decode(deltas, self.anchors, np, det.RPN_SCALE), cfg.height, cfg.width)
        top = min(cfg.pre_nms, logits.shape[1])
        idx = np.argsort(-logits, axis=1, kind="stable")[:, :top]        # topk's order: ties by index
        scores = np.take_along_axis(logits, idx, 1)
        boxes = np.take_along_axis(boxes, idx[..., None], 1)
        with np.errstate(over="ignore"):   # a logit under -88 overflows exp in FP32: its sigmoid is 0, rightly
            probs = 1 / (1 + np.exp(-scores))
        kept = np.stack([_padded(b[nms(b, p, cfg.rois, cfg.rpn_nms_iou)], cfg.rois) for b, p in zip(boxes, probs)])
        if self.training:
            truth = np.where(gt[..., :1] >= 0, gt[..., 1:5], 0.0)
            kept = np.concatenate([kept[:, :cfg.rois - cfg.max_boxes], truth.astype(kept.dtype)], axis=1)
        return kept.astype(np.float32)

    @staticmethod
    def records(output) -> list[dict]:
        """Its construct's own operators: the box math, the crop, reshapes (no Table 3 rule,
        as Keras runs them in layers without one); its cells count themselves."""
        return []


def clip(boxes: np.ndarray, height: int, width: int) -> np.ndarray:
    return np.minimum(np.maximum(boxes, 0.0), np.array([height, width, height, width], boxes.dtype))


def nms(boxes: np.ndarray, scores: np.ndarray, max_out: int, iou_threshold: float,
        score_threshold: float | None = None) -> np.ndarray:
    """Indices of the boxes greedy NMS keeps, best score first, at most max_out (TensorFlow's
    non_max_suppression: above the threshold suppressed; scores at or below
    `score_threshold` dropped first)."""
    order = np.argsort(-scores, kind="stable")
    if score_threshold is not None:
        order = order[scores[order] > score_threshold]
    b = boxes[order]
    return order[det.greedy_keep(det.iou(b, b) > iou_threshold, max_out)]


def _padded(rows: np.ndarray, n: int) -> np.ndarray:
    """`rows` (k, ...) with zero rows after them up to n."""
    return np.concatenate([rows, np.zeros((n - len(rows), *rows.shape[1:]), rows.dtype)]) if len(rows) < n else rows


def crop_grid(rois: np.ndarray, stride: int, size: int, feature_hw: tuple[int, int]) -> np.ndarray:
    """(N, R size, size, 2): grid_sample's (x, y) in [-1, 1] for each ROI's size x size
    points spanning the box, as tf.image.crop_and_resize samples (image y -> feature y /
    stride - 0.5); a point outside the map moved 1.5 maps away, where all four neighbours
    are zero padding: 0 exactly, as TensorFlow's extrapolation value. Pure."""
    fh, fw = feature_hw
    n, r = rois.shape[:2]
    t = np.linspace(0.0, 1.0, size, dtype=np.float32)
    y0, x0, y1, x1 = np.moveaxis(rois / stride - 0.5, -1, 0)                # (N, R) in feature pixels
    ys = y0[..., None] + (y1 - y0)[..., None] * t                           # (N, R, size)
    xs = x0[..., None] + (x1 - x0)[..., None] * t
    gy = np.broadcast_to((2 * ys / (fh - 1) - 1)[..., :, None], (n, r, size, size))
    gx = np.broadcast_to((2 * xs / (fw - 1) - 1)[..., None, :], (n, r, size, size))
    inside = ((ys >= 0) & (ys <= fh - 1))[..., :, None] & ((xs >= 0) & (xs <= fw - 1))[..., None, :]
    grid = np.where(inside[..., None], np.stack([gx, gy], -1), -4.0)
    return grid.reshape(n, r * size, size, 2).astype(np.float32)


class RoiCrop(nn.Cell):
    """roi_crop as a cell: in FP32 under line 17's fp16 (FP32, train.build: MindSpore 2.10's
    CPU grid_sample did not finish in FP16 here), and no Table 3 operator (UNCOUNTED: the box
    math, as Keras runs it in a layer without a rule)."""
    FP32 = UNCOUNTED = True

    def __init__(self, cfg: detector.Config):
        super().__init__()
        self.stride, self.size = cfg.stride, 2 * cfg.pool

    def construct(self, features, rois):
        return roi_crop(features, rois, self.stride, self.size)


def roi_crop(features, rois: np.ndarray, stride: int, size: int):
    """(N, C, R, size, size): each ROI's features sampled bilinearly (crop_grid's points);
    the gradient reaches the features, as crop_and_resize's does."""
    n, c, fh, fw = features.shape
    grid = ms.Tensor(crop_grid(rois, stride, size, (fh, fw)))
    out = ops.grid_sample(features, grid, mode="bilinear", padding_mode="zeros", align_corners=True)
    return out.reshape(n, c, rois.shape[1], size, size)


# ---- training loss (faster_rcnn.loss_terms) --------------------------------------

def _random_subset(mask: np.ndarray, k, noise: np.ndarray) -> np.ndarray:
    """mask restricted to at most k (per row) of its elements, chosen by `noise`."""
    key = np.where(mask, noise, -1.0)
    rank = np.argsort(np.argsort(-key, axis=1, kind="stable"), axis=1, kind="stable")
    return mask & (rank < k)


def _sample(pos: np.ndarray, neg: np.ndarray, total: int, pos_fraction: float, noise: np.ndarray):
    """Faster-RCNN's minibatch: up to total x pos_fraction random positives, the rest
    random negatives. Returns the (positives, negatives) masks."""
    pos = _random_subset(pos, int(total * pos_fraction), noise)
    return pos, _random_subset(neg, total - pos.sum(1, keepdims=True), noise)


def _match(boxes: np.ndarray, gt: np.ndarray):
    """IoU of boxes (N or 1, A, 4) with the valid ground truth (N, G, 5): best IoU (N, A),
    the matched ground-truth rows (N, A, 5), the IoU matrix (N, A, G)."""
    overlaps = np.where((gt[..., 0] >= 0)[:, None, :], det.iou(boxes, gt[..., 1:5]), -1.0)
    which = overlaps.argmax(2)
    return overlaps.max(2), np.take_along_axis(gt, which[..., None], 1), overlaps


def targets_of(gt: np.ndarray, outputs: dict) -> dict:
    """The loss's host side: which anchors and ROIs count and what they are trained
    towards (faster_rcnn.loss_terms' matching and sampling, numpy): masks (N, A) and (N, R)
    as float32, the box targets, the head's labels."""
    anchors, rois = outputs["anchors"], outputs["rois"]
    best, matched, overlaps = _match(anchors, gt)
    per_box_best = overlaps.max(1, keepdims=True)
    pos = (best >= detector.RPN_POS_IOU) | ((overlaps == per_box_best) & (per_box_best > 0)).any(2)
    pos, neg = _sample(pos, (best < detector.RPN_NEG_IOU) & ~pos, detector.RPN_BATCH, detector.RPN_POS_FRACTION,
                       outputs["rpn_noise"])
    host = {"rpn_pos": pos, "rpn_chosen": pos | neg,
            "rpn_target": det.encode(matched[..., 1:5], anchors, np, det.RPN_SCALE)}
    best, matched, _ = _match(rois, gt)
    valid = det.area(rois) > 0
    fg, bg = _sample(valid & (best >= detector.ROI_POS_IOU), valid & (best < detector.ROI_POS_IOU),
                     min(detector.ROI_BATCH, rois.shape[1]), detector.ROI_POS_FRACTION, outputs["roi_noise"])
    host.update(roi_fg=fg, roi_chosen=fg | bg, labels=np.where(fg, matched[..., 0].astype(np.int64) + 1, 0),
                roi_target=det.encode(matched[..., 1:5], rois, np))
    return {k: ms.Tensor(np.asarray(v, np.int32 if k == "labels" else np.float32)) for k, v in host.items()}


def _smooth_l1(diff, beta: float = 1.0 / 9):
    a = ops.abs(diff)
    return ops.where(a < beta, 0.5 * a * a / beta, a - 0.5 * beta).sum(-1)


def _per_image(values, mask, chosen):
    """Each image's sum of `values` where `mask`, over its sampled count (box terms too:
    an image with few positives must not turn the regression's step size up)."""
    return (values * mask).sum(1) / ops.clamp(chosen.sum(1), min=1.0)


def loss_terms(gt, outputs: dict) -> dict:
    """The four per-image terms, as faster_rcnn.loss_terms computes them (its comments say
    why), the gradient through the outputs' Tensors."""
    t = targets_of(train.host(gt).astype(np.float32), outputs)
    bce = ops.binary_cross_entropy_with_logits(outputs["rpn_logits"], t["rpn_pos"], reduction="none")
    n, r = t["labels"].shape
    ce = ops.cross_entropy(outputs["cls_logits"].reshape(n * r, -1), t["labels"].reshape(-1),
                           reduction="none").reshape(n, r)
    return {"rpn_cls": _per_image(bce, t["rpn_chosen"], t["rpn_chosen"]),
            "rpn_box": _per_image(_smooth_l1(outputs["rpn_deltas"] - t["rpn_target"]), t["rpn_pos"], t["rpn_chosen"]),
            "head_cls": _per_image(ce, t["roi_chosen"], t["roi_chosen"]),
            "head_box": _per_image(_smooth_l1(outputs["box_deltas"] - t["roi_target"]), t["roi_fg"], t["roi_chosen"])}


# ---- inference (faster_rcnn.detections) ---------------------------------------------

def detections(outputs: dict, cfg: detector.Config, score_threshold: float = 0.01) -> np.ndarray:
    """(N, K, 6) detections (class, score, ymin, xmin, ymax, xmax), zero-padded: the head's
    boxes, class-wise NMS at IoU 0.5 (K a class at most), the K best over all classes, as
    tf.image.combined_non_max_suppression picks them. On the host."""
    rois = np.asarray(outputs["rois"], np.float32)
    boxes = clip(det.decode(train.host(outputs["box_deltas"]).astype(np.float32), rois, np), cfg.height, cfg.width)
    logits = train.host(outputs["cls_logits"]).astype(np.float32)
    e = np.exp(logits - logits.max(-1, keepdims=True))
    probs = (e / e.sum(-1, keepdims=True))[..., 1:] * (det.area(rois) > 0)[..., None]   # empty ROIs detect nothing
    k, out = cfg.detections, []
    for b, p in zip(boxes, probs):
        found = [np.concatenate([np.full((len(i), 1), c, np.float32), p[i, c, None], b[i]], 1)
                 for c in range(p.shape[1]) for i in [nms(b, p[:, c], k, 0.5, score_threshold)]]
        rows = np.concatenate(found)
        out.append(_padded(rows[np.argsort(-rows[:, 1], kind="stable")][:k], k))
    return np.stack(out).astype(np.float32)


# ---- the workload's MindSpore interface (harness/frameworks/mindspore/models.py) --------

def build_model(data) -> nn.Cell:
    return FasterRCNN(ewa.config(data))


def sample(data):
    return (ms.Tensor(np.zeros((1, ewa.CHANNELS, data.height, data.width), np.float32)),
            ms.Tensor(np.full((1, data.max_boxes, 5), -1.0, np.float32)))


def inputs(x):
    images, boxes = x
    return models.channels_first(images), ms.Tensor(np.asarray(boxes, np.float32))


def targets(y):
    return ms.Tensor(np.asarray(y, np.float32))


def loss(outputs: dict, gt):
    """Per-image loss: RPN objectness + RPN box + head classification + head box."""
    return sum(loss_terms(gt, outputs).values())


def predict(model: nn.Cell, data, rows: slice) -> np.ndarray:
    """Each validation image's top K detections, packed (K x 6), as the other ports give them."""
    cfg = ewa.config(data)
    index = np.arange(data.n_val)[rows]
    batch = int(max(1, min(32, (1 << 22) // (data.height * data.width))))  # ~4 M pixels a step
    empty = ms.Tensor(np.full((batch, data.max_boxes, 5), -1.0, np.float32))
    feed = ((x, empty[:x.shape[0]]) for x in (models.channels_first(data.normalised("val", index[lo:lo + batch]))
                                              for lo in range(0, len(index), batch)))
    out = train.outputs(model, feed, lambda outputs: detections(outputs, cfg))
    return out.reshape(len(index), -1) if len(out) else np.zeros((0, ewa.score_width(data)))
