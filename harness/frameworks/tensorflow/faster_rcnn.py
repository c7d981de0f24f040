"""Faster-RCNN (Ren et al. 2015) in Keras for 16-channel climate images.

    images (H, W, 16) -> backbone -> features
    features -> RPN: objectness logit and box deltas for every anchor
    RPN -> proposals: decode, top pre_nms, NMS, the best R = `rois` boxes per image
           (in training the last max_boxes slots hold the ground-truth boxes, so the
           head sees positives from the first step: the usual Faster-RCNN practice)
    features, proposals -> crop_and_resize to 2 pool, max pool to pool x pool -> MLP head ->
           class logits (background + 4) and class-agnostic box deltas per ROI

Backbones (Config.backbone; `config_for` picks one, HPCAI500_EWA_BACKBONE overrides):
* "resnet50" (default at 384 pixels and above): ResNet-50's conv1 to conv4 (stem,
  max pool, 3-4-6 bottleneck blocks of 256, 512, 1024 channels; v1.5 strides), taking
  the 16 channels in conv1; features at stride 16. This is the "C4" Faster-RCNN of
  the ResNet paper, with its per-ROI conv5 replaced by the two 1024-wide fully
  connected layers (the FPN-era head): conv5 on every ROI would be ~0.8 GFLOPs per
  ROI. At 768 x 1152: features 48 x 72 x 1024, 69 120 anchors (20 per cell); 63.4 M
  parameters (fc6 on 7 x 7 x 1024 pooled features holds 51 M of them); 164.0 GFLOPs
  forward per image (harness.flops: 150.1 convolution, 13.4 dense = the head at R =
  128), 492 GFLOPs per training sample.
* "small" (below 384 pixels: tests, laptops): a narrow two-stage residual backbone
  (basic blocks of 32 and 64 channels, stride 8).

Anchors: sizes are fractions of the image height; ratios (height / width) include
1:4 and 1:2 for the long, thin atmospheric rivers (and 4:1 at full size for rivers
running north-south).

The model takes (images, gt_boxes) so that training can put the ground truth among
the ROIs; at inference gt_boxes is ignored. Every output has a fixed shape: R ROIs
per image whatever the image holds, in training and in inference. `loss` computes
anchor and ROI targets in-graph from the outputs and the ground truth. The ROI head
is Dense layers on (batch, R, features) tensors, so the analytic FLOP count
(harness.flops: 2 x FLin x FLout per row) charges it once per ROI: R times per image.
"""
from __future__ import annotations

import random
import os

import numpy as np

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # Keras 2 API (tf-keras), before TensorFlow
import tensorflow as tf  # noqa: E402

from harness.workloads import detection as det  # noqa: E402
from harness.workloads.detector import (ROI_BATCH, ROI_POS_FRACTION, ROI_POS_IOU,  # noqa: E402
                                        RPN_BATCH, RPN_NEG_IOU, RPN_POS_FRACTION, RPN_POS_IOU, Config,
                                        checked, trunk)


class _TensorFlow:
    """The few numpy functions detection.py's box formulas use, as TensorFlow ops."""

    def __getattr__(self, name):
        return {"maximum": tf.maximum, "minimum": tf.minimum, "log": tf.math.log,
                "exp": tf.exp, "stack": tf.stack}[name]


TF = _TensorFlow()


def build(cfg: Config):
    L = tf.keras.layers
    cfg = checked(cfg)
    images = tf.keras.Input((cfg.height, cfg.width, cfg.channels), name="images")
    gt = tf.keras.Input((cfg.max_boxes, 5), name="gt_boxes")
    features = _backbone(images, cfg)

    k = len(cfg.anchor_sizes) * len(cfg.anchor_ratios)
    anchors = cfg.anchors()
    n_anchors = len(anchors)
    r = L.Conv2D(cfg.rpn_channels, 3, padding="same", activation="relu", name="rpn_conv")(features)
    rpn_logits = L.Reshape((n_anchors,), name="rpn_logits")(
        L.Conv2D(k, 1, name="rpn_cls", dtype="float32")(r))
    rpn_deltas = L.Reshape((n_anchors, 4), name="rpn_deltas")(
        L.Conv2D(4 * k, 1, name="rpn_box", dtype="float32")(r))

    rois = Proposals(anchors, cfg, name="rois")([rpn_logits, rpn_deltas, gt])
    # ROI pooling as in Detectron's RoIPool variant: bilinear samples on a 2p x 2p grid,
    # then 2 x 2 max pooling. TimeDistributed runs the pooling as one reshaped op and
    # makes the FLOP count charge it once per ROI (Table 3: pooling, output elements).
    crops = RoiCrop(cfg, name="roi_crop")([features, rois])
    pooled = L.TimeDistributed(L.MaxPooling2D(2), name="roi_pool")(crops)
    h = L.Reshape((cfg.rois, cfg.pool * cfg.pool * features.shape[-1]))(pooled)
    h = L.Dense(cfg.fc, activation="relu", name="fc6")(h)
    h = L.Dense(cfg.fc, activation="relu", name="fc7")(h)
    cls_logits = L.Dense(cfg.classes + 1, name="cls_logits", dtype="float32")(h)
    box_deltas = L.Dense(4, name="box_deltas", dtype="float32")(h)
    rpn_noise, roi_noise = SamplingNoise(name="sampling_noise")([rpn_logits, cls_logits[..., 0]])
    outputs = {"rpn_logits": rpn_logits, "rpn_deltas": rpn_deltas,
               "anchors": Anchors(anchors, name="anchors")(rpn_logits),
               "rois": rois, "cls_logits": cls_logits, "box_deltas": box_deltas,
               "rpn_noise": rpn_noise, "roi_noise": roi_noise}
    return tf.keras.Model([images, gt], outputs, name="faster_rcnn")


def _backbone(images, cfg: Config):
    """The feature map: detector.trunk's layers, ResNet-50's conv1 to conv4 (v1.5
    bottlenecks, stride 16), or the narrow basic-block backbone."""
    L = tf.keras.layers

    def conv_bn(x, filters, kernel, stride=1, relu=True):
        x = L.Conv2D(filters, kernel, stride, padding="same", use_bias=False)(x)
        x = L.BatchNormalization()(x)
        return L.ReLU()(x) if relu else x

    stem, pool, blocks = trunk(cfg)
    x = conv_bn(images, *stem)
    if pool:
        x = L.MaxPooling2D(3, 2, padding="same")(x)
    for cin, cout, stride, branch in blocks:
        short = x if (stride == 1 and cin == cout) else conv_bn(x, cout, 1, stride, relu=False)
        y = x
        for _, filters, kernel, s, relu in branch:
            y = conv_bn(y, filters, kernel, s, relu)
        x = L.ReLU()(L.Add()([short, y]))
    return x


class SamplingNoise(tf.keras.layers.Layer):
    """Uniform draws shaped like its inputs, for the loss's random minibatches of
    anchors and ROIs (`_sample`). They come from the layer's own tf.random.Generator,
    seeded with the model (frameworks/tensorflow/train.build): its state is a variable, so the harness's
    warm-up can undo it, and evaluation (training=False: zeros) draws nothing."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.generator = tf.random.Generator.from_seed(random.getrandbits(63))

    def call(self, inputs, training=None):
        if not training:
            return [tf.zeros_like(t, tf.float32) for t in inputs]
        return [self.generator.uniform(tf.shape(t)) for t in inputs]


class Proposals(tf.keras.layers.Layer):
    """RPN outputs -> `rois` boxes per image (FP32 box math under any precision policy)."""

    def __init__(self, anchors, cfg, **kw):
        super().__init__(dtype="float32", **kw)
        self.anchors, self.cfg = np.asarray(anchors, np.float32), cfg

    def call(self, inputs, training=None):
        logits, deltas, gt = (tf.stop_gradient(tf.cast(t, tf.float32)) for t in inputs)
        cfg = self.cfg
        boxes = clip(det.decode(deltas, tf.constant(self.anchors), TF, det.RPN_SCALE),
                     cfg.height, cfg.width)
        scores, idx = tf.math.top_k(logits, k=min(cfg.pre_nms, len(self.anchors)), sorted=False)
        boxes = tf.gather(boxes, idx, batch_dims=1)
        kept = tf.image.combined_non_max_suppression(
            boxes[:, :, None, :], tf.sigmoid(scores)[..., None], max_output_size_per_class=cfg.rois,
            max_total_size=cfg.rois, iou_threshold=cfg.rpn_nms_iou, clip_boxes=False).nmsed_boxes
        if training:  # the ground truth replaces the weakest proposals
            truth = tf.where(gt[..., :1] >= 0, gt[..., 1:5], 0.0)
            kept = tf.concat([kept[:, :cfg.rois - cfg.max_boxes], truth], axis=1)
        return tf.stop_gradient(kept)


class RoiCrop(tf.keras.layers.Layer):
    """Each ROI's features resampled bilinearly to a (2 pool) x (2 pool) grid."""

    def __init__(self, cfg, **kw):
        super().__init__(dtype="float32", **kw)
        self.cfg = cfg

    def call(self, inputs):
        features, rois = inputs
        cfg, p = self.cfg, 2 * self.cfg.pool
        fh, fw, c = features.shape[1:]
        # image y -> feature y / stride - 0.5 (feature pixel i is centred at (i + 0.5) stride);
        # crop_and_resize maps normalised 0..1 onto feature pixels 0..fh-1.
        norm = (rois / cfg.stride - 0.5) / tf.constant([fh - 1, fw - 1, fh - 1, fw - 1], tf.float32)
        index = tf.repeat(tf.range(tf.shape(rois)[0]), cfg.rois)
        crops = crop_and_resize(tf.cast(features, tf.float32), tf.reshape(norm, (-1, 4)), index, p)
        return tf.reshape(crops, (-1, cfg.rois, p, p, c))


def crop_and_resize(image, boxes, box_index, crop: int):
    """tf.image.crop_and_resize to crop x crop (bilinear, 0 outside the image), with a
    gradient of our own into the image and none into the boxes.

    TensorFlow's image gradient (CropAndResizeGradImage) shards the boxes over CPU threads
    that add into the same feature pixels unsynchronised, and loses updates: 30 repeats of
    one gradient (features 2 x 12 x 16 x 8, 80 boxes, 14 x 14 crops) differed by up to 2.3,
    11 repeats at ewa's shapes (1 x 48 x 72 x 1024, 128 boxes) by up to 2.4 of 19 on 2
    cores: the backbone lost part of the head's gradient at random. Ours is the same sum
    as a sparse matrix (pixels x crop samples, each sample's four bilinear weights) times
    the crops' gradient: sparse_dense_matmul's CPU kernel adds in one thread, in the order
    of the entries (box, row, column, tap: the kernel's own), so repeats are bit-identical;
    the crop's forward and backward at ewa's shapes took 1.06 x TensorFlow's on 2 cores.
    RoiCrop's boxes are the stop-gradient'ed proposals: TensorFlow's gradient into them was
    never used."""

    @tf.custom_gradient
    def crop_(image, boxes, box_index):
        def grad(dy):
            return _crop_image_gradient(dy, boxes, box_index, tf.shape(image)), None, None
        return tf.image.crop_and_resize(image, boxes, box_index, (crop, crop)), grad
    return crop_(image, boxes, box_index)


def _crop_image_gradient(dy, boxes, box_index, shape):
    """crop_and_resize's gradient into an image of `shape` (N, H, W, C): the sparse matrix
    S (N H W pixels x K p q samples) of the samples' bilinear weights times the crops'
    gradient dy (K, p, q, C); samples off the image have none, as in the kernel."""
    k, p, q = tf.shape(dy)[0], dy.shape[1], dy.shape[2]
    h, w = shape[1], shape[2]
    # Where the samples lie, from crop_and_resize itself: the crop of an image holding its
    # pixels' own (y, x) is each sample's position in the kernel's float32 arithmetic,
    # exactly (floor + frac), and -1 off the image (grappler's folding cannot shift it).
    grid = tf.cast(tf.stack(tf.meshgrid(tf.range(h), tf.range(w), indexing="ij"), -1), tf.float32)
    at = tf.image.crop_and_resize(grid[None], boxes, tf.zeros_like(box_index), (p, q), extrapolation_value=-1.0)
    low = tf.floor(at)
    tap = tf.cast(tf.stack([low, tf.math.ceil(at)], -1), tf.int32)      # (K, p, q, y|x, floor|ceil)
    frac = tf.stack([1 - (at - low), at - low], -1)
    # S's entries as (K, p, q, y tap, x tap), the kernel's order: pixel (row), sample (column), weight
    pixel = (box_index[:, None, None, None, None] * h + tap[..., 0, :, None]) * w + tap[..., 1, None, :]
    weight = frac[..., 0, :, None] * frac[..., 1, None, :]
    sample = tf.broadcast_to(tf.reshape(tf.range(k * p * q), (-1, p, q, 1, 1)), tf.shape(pixel))
    inside = tf.broadcast_to((at[..., 0] >= 0)[..., None, None], tf.shape(pixel))
    entries = tf.cast(tf.boolean_mask(tf.stack([pixel, sample], -1), inside), tf.int64)
    s = tf.sparse.SparseTensor(entries, tf.boolean_mask(weight, inside),
                               tf.cast(tf.stack([shape[0] * h * w, k * p * q]), tf.int64))
    return tf.reshape(tf.sparse.sparse_dense_matmul(s, tf.reshape(dy, (k * p * q, -1))), shape)


class Anchors(tf.keras.layers.Layer):
    """The anchors as an output, so that `loss` is a function of (y, outputs) alone."""

    def __init__(self, anchors, **kw):
        super().__init__(dtype="float32", **kw)
        self.anchors = np.asarray(anchors, np.float32)

    def call(self, like):
        return tf.broadcast_to(tf.constant(self.anchors), (tf.shape(like)[0], *self.anchors.shape))


def clip(boxes, height, width):
    limit = tf.constant([height, width, height, width], tf.float32)
    return tf.clip_by_value(boxes, 0.0, limit)


# ---- training loss ---------------------------------------------------------------

def _random_subset(mask, k, noise):
    """mask restricted to at most k (per row) of its elements, chosen by `noise`."""
    key = tf.where(mask, noise, -1.0)
    rank = tf.argsort(tf.argsort(key, axis=1, direction="DESCENDING", stable=True), axis=1, stable=True)
    return mask & (rank < tf.cast(k, rank.dtype))


def _sample(pos, neg, total, pos_fraction, noise):
    """Faster-RCNN's minibatch: up to total x pos_fraction random positives, the rest
    random negatives, chosen by `noise` (uniform, shaped like the masks). Returns
    (positives, negatives) masks."""
    pos = _random_subset(pos, int(total * pos_fraction), noise)
    n_pos = tf.reduce_sum(tf.cast(pos, tf.int32), axis=1, keepdims=True)
    return pos, _random_subset(neg, total - n_pos, noise)


def _smooth_l1(diff, beta=1.0 / 9):
    """Huber loss summed over the 4 coordinates; quadratic below beta (small errors
    still get gradient proportional to their size)."""
    a = tf.abs(diff)
    return tf.reduce_sum(tf.where(a < beta, 0.5 * a * a / beta, a - 0.5 * beta), axis=-1)


def _match(boxes, gt):
    """IoU of boxes (B, N, 4) [or (1, N, 4)] with the valid ground truth (B, G, 5):
    best IoU (B, N), the matched ground-truth rows (B, N, 5), and the IoU matrix."""
    valid = gt[..., 0] >= 0
    overlaps = tf.where(valid[:, None, :], det.iou(boxes, gt[..., 1:5], TF), -1.0)
    best = tf.reduce_max(overlaps, axis=2)
    matched = tf.gather(gt, tf.argmax(overlaps, axis=2, output_type=tf.int32), batch_dims=1)
    return best, matched, overlaps


def loss(gt, outputs):
    """Per-image loss: RPN objectness + RPN box + head classification + head box."""
    return tf.add_n(list(loss_terms(gt, outputs).values()))


def loss_terms(gt, outputs) -> dict:
    """The four per-image terms of the loss, by name."""
    gt = tf.cast(gt, tf.float32)
    anchors, rois = outputs["anchors"][:1], outputs["rois"]

    # RPN targets: IoU >= 0.7 with some box, or the best anchor of a box, is positive;
    # IoU < 0.3 with every box is negative; the rest do not train the RPN.
    best, matched, overlaps = _match(anchors, gt)
    per_box_best = tf.reduce_max(overlaps, axis=1, keepdims=True)
    is_best = tf.reduce_any((overlaps == per_box_best) & (per_box_best > 0), axis=2)
    pos = (best >= RPN_POS_IOU) | is_best
    pos, neg = _sample(pos, (best < RPN_NEG_IOU) & ~pos, RPN_BATCH, RPN_POS_FRACTION, outputs["rpn_noise"])
    chosen = tf.cast(pos | neg, tf.float32)
    bce = tf.nn.sigmoid_cross_entropy_with_logits(tf.cast(pos, tf.float32), outputs["rpn_logits"])
    rpn_cls = tf.reduce_sum(bce * chosen, 1) / tf.maximum(tf.reduce_sum(chosen, 1), 1.0)
    # Box losses are normalised by the sampled count, not the positives: an image with
    # few positives must not turn the box regression's step size up.
    target = det.encode(matched[..., 1:5], anchors, TF, det.RPN_SCALE)
    rpn_box = (tf.reduce_sum(_smooth_l1(outputs["rpn_deltas"] - target) * tf.cast(pos, tf.float32), 1)
               / tf.maximum(tf.reduce_sum(chosen, 1), 1.0))

    # Head targets: a ROI with IoU >= 0.5 takes its box's class, the rest background;
    # empty ROIs (NMS padding, padded ground truth) do not train the head.
    best, matched, _ = _match(rois, gt)
    valid = det.area(rois, TF) > 0
    fg, bg = _sample(valid & (best >= ROI_POS_IOU), valid & (best < ROI_POS_IOU),
                     min(ROI_BATCH, rois.shape[1]), ROI_POS_FRACTION, outputs["roi_noise"])
    chosen = tf.cast(fg | bg, tf.float32)
    labels = tf.where(fg, tf.cast(matched[..., 0], tf.int32) + 1, 0)
    ce = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, outputs["cls_logits"])
    head_cls = tf.reduce_sum(ce * chosen, 1) / tf.maximum(tf.reduce_sum(chosen, 1), 1.0)
    target = det.encode(matched[..., 1:5], rois, TF)
    head_box = (tf.reduce_sum(_smooth_l1(outputs["box_deltas"] - target) * tf.cast(fg, tf.float32), 1)
                / tf.maximum(tf.reduce_sum(chosen, 1), 1.0))
    return {"rpn_cls": rpn_cls, "rpn_box": rpn_box, "head_cls": head_cls, "head_box": head_box}


# ---- inference -------------------------------------------------------------------

def detections(outputs, cfg: Config, score_threshold: float = 0.01):
    """(B, K, 6) detections (class, score, ymin, xmin, ymax, xmax), zero-padded: the
    head's boxes, class-wise NMS at IoU 0.5, the K best over all classes."""
    rois = tf.cast(outputs["rois"], tf.float32)
    boxes = clip(det.decode(tf.cast(outputs["box_deltas"], tf.float32), rois, TF), cfg.height, cfg.width)
    probs = tf.nn.softmax(tf.cast(outputs["cls_logits"], tf.float32))[..., 1:]
    probs *= tf.cast(det.area(rois, TF) > 0, tf.float32)[..., None]  # empty ROIs detect nothing
    k = cfg.detections
    nms = tf.image.combined_non_max_suppression(
        boxes[:, :, None, :], probs, max_output_size_per_class=k, max_total_size=k,
        iou_threshold=0.5, score_threshold=score_threshold, clip_boxes=False)
    real = tf.cast(tf.range(k)[None, :] < nms.valid_detections[:, None], tf.float32)
    out = tf.concat([nms.nmsed_classes[..., None], nms.nmsed_scores[..., None], nms.nmsed_boxes], -1)
    return out * real[..., None]
