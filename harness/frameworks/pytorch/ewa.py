"""The ewa workload's detector in PyTorch: the Faster-RCNN harness/frameworks/tensorflow/
faster_rcnn.py builds in Keras, layer for layer, from the same design (workloads/detector.py: Config,
the anchors, the sampling constants) and the same box math (workloads/detection.py,
its formulas run on tensors through `TORCH`).

    images (N, 16, H, W) -> backbone (ResNet-50's conv1-conv4, or the small one) -> features
    features -> RPN: objectness logit and box deltas of every anchor (in FP32)
    RPN -> proposals: decode, the best pre_nms, greedy NMS, the best R boxes an image
           (training: the ground truth in the last max_boxes slots)
    features, proposals -> bilinear crop to 2 pool (crop_and_resize's sampling), max pool
           to pool -> fc6, fc7 -> class logits (background + 4) and box deltas per ROI

torchvision's detection code is not used (it pins one torch build each, and the one for
this torch is not on PyPI for every platform): its two operators this model needs are
here, each in a few lines. NMS: the IoU matrix on the device, the greedy loop on the host
(detection.greedy_keep, TensorFlow's rule: suppressed above the threshold). The ROI crop:
grid_sample at crop_and_resize's sampling points (feature pixel i at image (i + 0.5) x
stride), zero outside the map as TensorFlow's extrapolation value is.

Keras' initial weights (Glorot-uniform kernels, zero biases) and batch norm (eps 1e-3,
momentum 0.99); Keras' "same" padding becomes PyTorch's symmetric kernel // 2 (the same
output sizes). The same Table 3 count and weights as the Keras model (tests/test_ewa.py
counts both): the box math, which Keras runs in layers without a rule, is skipped
(flops.uncounted). The loss is faster_rcnn.loss_terms' four terms with the same targets
and sampling; the sampling's uniform draws come from PyTorch's generator (the warm-up
puts its state back).

The data, feed and quality are harness/workloads/ewa.py's; the feed is its numpy
generator (ewa.batches: HPCAI500_EWA_PREFETCH's tf.data prefetch is TensorFlow's).
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from harness.frameworks.pytorch import feed, flops, models, train
from harness.workloads import detection as det
from harness.workloads import detector, ewa


class _Torch:
    """The numpy functions detection.py's box formulas use, as torch ops."""
    maximum = staticmethod(lambda a, b: torch.clamp(a, min=b) if isinstance(b, float) else torch.maximum(a, b))
    minimum = staticmethod(lambda a, b: torch.clamp(a, max=b) if isinstance(b, float) else torch.minimum(a, b))
    log, exp, stack = staticmethod(torch.log), staticmethod(torch.exp), staticmethod(torch.stack)


TORCH = _Torch()


def _conv_bn(cin: int, cout: int, kernel: int, stride: int = 1, relu: bool = True) -> nn.Sequential:
    layers = [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, bias=False), nn.BatchNorm2d(cout, 1e-3, 0.01)]
    return nn.Sequential(*layers, nn.ReLU()) if relu else nn.Sequential(*layers)


class _Residual(nn.Module):
    """relu(shortcut(x) + branch(x)); the shortcut a projection where the shape changes."""

    def __init__(self, cin: int, cout: int, stride: int, branch: list):
        super().__init__()
        self.shortcut = None if (stride == 1 and cin == cout) else _conv_bn(cin, cout, 1, stride, relu=False)
        self.branch = nn.Sequential(*branch)

    def forward(self, x):
        return F.relu((x if self.shortcut is None else self.shortcut(x)) + self.branch(x))


def backbone(cfg: detector.Config) -> tuple[nn.Sequential, int]:
    """(the trunk, its output channels): detector.trunk's layers, ResNet-50's conv1 to conv4
    or the narrow basic-block backbone."""
    stem, pool, blocks = detector.trunk(cfg)
    layers = [_conv_bn(cfg.channels, *stem), *([nn.MaxPool2d(3, 2, 1)] if pool else [])]
    layers += [_Residual(cin, cout, stride, [_conv_bn(*c) for c in branch]) for cin, cout, stride, branch in blocks]
    return nn.Sequential(*layers), blocks[-1][1]


class FasterRCNN(nn.Module):
    """forward((images, gt_boxes)) -> faster_rcnn.build's outputs, by the same names:
    rpn_logits (N, A), rpn_deltas (N, A, 4), anchors (1, A, 4), rois (N, R, 4),
    cls_logits (N, R, 5), box_deltas (N, R, 4), rpn_noise, roi_noise (the loss's draws;
    zeros in eval mode). gt_boxes (N, G, 5) is read in training only."""

    def __init__(self, cfg: detector.Config):
        super().__init__()
        self.cfg = detector.checked(cfg)
        self.backbone, c = backbone(cfg)
        k = len(cfg.anchor_sizes) * len(cfg.anchor_ratios)
        self.rpn_conv = nn.Conv2d(c, cfg.rpn_channels, 3, padding=1)
        self.rpn_cls, self.rpn_box = nn.Conv2d(cfg.rpn_channels, k, 1), nn.Conv2d(cfg.rpn_channels, 4 * k, 1)
        self.register_buffer("anchors", torch.as_tensor(cfg.anchors()), persistent=False)
        self.roi_pool = nn.MaxPool2d(2)
        self.fc6, self.fc7 = nn.Linear(cfg.pool * cfg.pool * c, cfg.fc), nn.Linear(cfg.fc, cfg.fc)
        self.cls_logits, self.box_deltas = nn.Linear(cfg.fc, cfg.classes + 1), nn.Linear(cfg.fc, 4)
        models.keras_init(self)

    def forward(self, inputs):
        images, gt = inputs
        cfg, n = self.cfg, images.shape[0]
        features = self.backbone(images)
        r = F.relu(self.rpn_conv(features))
        with _without_autocast(images):   # Keras' float32 RPN outputs
            logits = self.rpn_cls(r.float()).permute(0, 2, 3, 1).reshape(n, -1)          # anchor order:
            deltas = self.rpn_box(r.float()).permute(0, 2, 3, 1).reshape(n, -1, 4)     # position-major
            with flops.uncounted():
                with torch.no_grad():       # boxes are chosen, not learnt through (faster_rcnn's stop_gradient)
                    rois = self.proposals(logits.detach(), deltas.detach(), gt)
                # the head's gradient reaches the backbone through the crop, as crop_and_resize's does
                crops = roi_crop(features.float(), rois, cfg.stride, 2 * cfg.pool)
        # each ROI's 2 pool rows pool apart from the next ROI's: max pool on (N, C, R 2 pool, 2 pool)
        pooled = self.roi_pool(crops.flatten(2, 3)).unflatten(2, (cfg.rois, cfg.pool))   # (N, C, R, pool, pool)
        h = pooled.transpose(1, 2).flatten(0, 1).flatten(1)      # (N R, C pool pool)
        h = F.relu(self.fc7(F.relu(self.fc6(h))))
        with _without_autocast(images):
            cls_logits = self.cls_logits(h.float()).reshape(n, cfg.rois, -1)
            box_deltas = self.box_deltas(h.float()).reshape(n, cfg.rois, 4)
        draw = torch.rand if self.training else torch.zeros
        return {"rpn_logits": logits, "rpn_deltas": deltas, "anchors": self.anchors[None], "rois": rois,
                "cls_logits": cls_logits, "box_deltas": box_deltas,
                "rpn_noise": draw(logits.shape, device=logits.device),
                "roi_noise": draw(cls_logits.shape[:2], device=logits.device)}

    def proposals(self, logits, deltas, gt):
        """The R best boxes an image after NMS (zero rows where fewer survive); in
        training the ground truth replaces the last max_boxes (faster_rcnn.Proposals)."""
        cfg = self.cfg
        if logits.is_meta:   # the FLOP count's pass (flops.count_built): shapes only, no boxes to choose
            return torch.zeros(logits.shape[0], cfg.rois, 4, device=logits.device)
        boxes = clip(det.decode(deltas, self.anchors, TORCH, det.RPN_SCALE), cfg.height, cfg.width)
        scores, idx = torch.topk(logits, min(cfg.pre_nms, logits.shape[1]), dim=1)
        boxes = torch.gather(boxes, 1, idx[..., None].expand(-1, -1, 4))
        kept = nms_each(boxes, torch.sigmoid(scores), cfg.rois, cfg.rpn_nms_iou)
        if self.training:
            truth = torch.where(gt[..., :1] >= 0, gt[..., 1:5], 0.0)
            kept = torch.cat([kept[:, :cfg.rois - cfg.max_boxes], truth.to(kept.dtype)], dim=1)
        return kept


def _without_autocast(like):
    """A region out of autocast (line 17's fp16 and bf16) on `like`'s device: what Keras
    computes in float32 layers under a mixed policy. (The FLOP count's meta device has
    no autocast: the CPU's stands in.)"""
    return torch.autocast("cuda" if like.is_cuda else "cpu", enabled=False)


def clip(boxes, height: int, width: int):
    return torch.minimum(boxes.clamp(min=0.0), boxes.new_tensor([height, width, height, width]))


def nms(boxes, scores, max_out: int, iou_threshold: float, score_threshold: float | None = None):
    """Indices of the boxes greedy NMS keeps, best score first, at most max_out (TensorFlow's
    non_max_suppression: above the threshold suppressed; scores at or below
    `score_threshold` dropped first)."""
    order = torch.argsort(scores, descending=True, stable=True)
    if score_threshold is not None:
        order = order[scores[order] > score_threshold]
    b = boxes[order]
    over = host_bool(det.iou(b, b, TORCH) > iou_threshold)
    return order[torch.from_numpy(det.greedy_keep(over, max_out)).to(order.device)]


def nms_each(boxes, scores, max_out: int, iou_threshold: float):
    """(N, max_out, 4): each image's boxes of (N, k, 4) that greedy NMS keeps by its scores
    (N, k), best first, zero rows where fewer survive: `nms` of each image, with one IoU
    tensor for the batch, one copy of it to the host and one of the kept indices back (a
    copy an image, each a wait for the device, before issue 67)."""
    order = torch.argsort(scores, dim=1, descending=True, stable=True)
    b = torch.gather(boxes, 1, order[..., None].expand(-1, -1, 4))
    over = host_bool(det.iou(b, b, TORCH) > iou_threshold)
    index = np.full((len(over), max_out), -1, np.int64)      # -1: no box kept there
    for i, o in enumerate(over):
        keep = det.greedy_keep(o, max_out)
        index[i, :len(keep)] = keep
    at = feed.to_device(index, b.device)
    picked = torch.gather(b, 1, at.clamp(min=0)[..., None].expand(-1, -1, 4))
    return torch.where((at >= 0)[..., None], picked, 0.0)


def pack_bits(over):
    """A boolean tensor (..., k) as (..., ceil(k / 8)) uint8 on its device, eight to a byte
    in numpy's packbits order (the first element the high bit)."""
    k = over.shape[-1]
    x = F.pad(over.to(torch.uint8), (0, -k % 8)).unflatten(-1, (-1, 8))
    shifts = torch.arange(7, -1, -1, dtype=torch.uint8, device=over.device)   # made there: no host copy
    return (x << shifts).sum(-1, dtype=torch.uint8)


def host_bool(over) -> np.ndarray:
    """A boolean tensor on the host, as numpy: from a GPU packed eight to a byte first (an
    eighth of the bytes cross: the RPN's 2000 x 2000 IoU verdicts an image are 4 MB as
    bools, issue 67, item 9), from a CPU as it is."""
    if not over.is_cuda:
        return over.cpu().numpy()
    return np.unpackbits(pack_bits(over).cpu().numpy(), axis=-1, count=over.shape[-1]).astype(bool)


def _padded(rows, n: int):
    """`rows` (k, ...) with zero rows after them up to n."""
    return torch.cat([rows, rows.new_zeros(n - len(rows), *rows.shape[1:])]) if len(rows) < n else rows


def roi_crop(features, rois, stride: int, size: int):
    """(N, C, R, size, size): each ROI's features sampled bilinearly on a size x size grid
    spanning the box, as tf.image.crop_and_resize samples (image y -> feature y / stride -
    0.5; a point outside the map gives 0). Channels before ROIs: grid_sample's own layout,
    so that pooling runs on it without a copy of the crops."""
    n, c, fh, fw = features.shape
    r = rois.shape[1]
    t = torch.linspace(0.0, 1.0, size, device=rois.device)
    y0, x0, y1, x1 = (rois / stride - 0.5).unbind(-1)                      # (N, R) in feature pixels
    ys = y0[..., None] + (y1 - y0)[..., None] * t                          # (N, R, size)
    xs = x0[..., None] + (x1 - x0)[..., None] * t
    gy = (2 * ys / (fh - 1) - 1)[..., :, None].expand(-1, -1, -1, size)    # (N, R, size, size)
    gx = (2 * xs / (fw - 1) - 1)[..., None, :].expand(-1, -1, size, -1)
    inside = (((ys >= 0) & (ys <= fh - 1))[..., :, None] & ((xs >= 0) & (xs <= fw - 1))[..., None, :])
    # a point outside the map moves 1.5 maps away, where all four neighbours are zero padding: 0 exactly,
    # as TensorFlow's extrapolation value; inside, zero padding's bilinear weights are crop_and_resize's
    grid = torch.where(inside[..., None], torch.stack([gx, gy], -1), -4.0).reshape(n, r * size, size, 2)
    out = F.grid_sample(features, grid, mode="bilinear", padding_mode="zeros", align_corners=True)
    return out.reshape(n, c, r, size, size)


# ---- training loss (faster_rcnn.loss_terms) --------------------------------------

def _random_subset(mask, k, noise):
    """mask restricted to at most k (per row) of its elements, chosen by `noise`."""
    key = torch.where(mask, noise, -1.0)
    rank = torch.argsort(torch.argsort(key, dim=1, descending=True, stable=True), dim=1, stable=True)
    return mask & (rank < k)


def _sample(pos, neg, total: int, pos_fraction: float, noise):
    """Faster-RCNN's minibatch: up to total x pos_fraction random positives, the rest
    random negatives. Returns the (positives, negatives) masks."""
    pos = _random_subset(pos, int(total * pos_fraction), noise)
    return pos, _random_subset(neg, total - pos.sum(1, keepdim=True), noise)


def _smooth_l1(diff, beta: float = 1.0 / 9):
    a = diff.abs()
    return torch.where(a < beta, 0.5 * a * a / beta, a - 0.5 * beta).sum(-1)


def _match(boxes, gt):
    """IoU of boxes (N or 1, A, 4) with the valid ground truth (N, G, 5): best IoU (N, A),
    the matched ground-truth rows (N, A, 5), the IoU matrix (N, A, G)."""
    overlaps = torch.where((gt[..., 0] >= 0)[:, None, :], det.iou(boxes, gt[..., 1:5], TORCH), -1.0)
    best, which = overlaps.max(2)
    return best, torch.gather(gt, 1, which[..., None].expand(-1, -1, 5)), overlaps


def _per_image(values, mask, chosen):
    """Each image's sum of `values` where `mask`, over its sampled count (box terms too:
    an image with few positives must not turn the regression's step size up)."""
    return (values * mask).sum(1) / chosen.sum(1).clamp(min=1.0)


def loss_terms(gt, outputs: dict) -> dict:
    """The four per-image terms, as faster_rcnn.loss_terms computes them (its comments say why)."""
    gt = gt.float()
    anchors, rois = outputs["anchors"], outputs["rois"]
    best, matched, overlaps = _match(anchors, gt)
    per_box_best = overlaps.max(1, keepdim=True).values
    pos = (best >= detector.RPN_POS_IOU) | ((overlaps == per_box_best) & (per_box_best > 0)).any(2)
    pos, neg = _sample(pos, (best < detector.RPN_NEG_IOU) & ~pos, detector.RPN_BATCH, detector.RPN_POS_FRACTION,
                       outputs["rpn_noise"])
    chosen = (pos | neg).float()
    bce = F.binary_cross_entropy_with_logits(outputs["rpn_logits"], pos.float(), reduction="none")
    target = det.encode(matched[..., 1:5], anchors, TORCH, det.RPN_SCALE)
    terms = {"rpn_cls": _per_image(bce, chosen, chosen),
             "rpn_box": _per_image(_smooth_l1(outputs["rpn_deltas"] - target), pos.float(), chosen)}
    best, matched, _ = _match(rois, gt)
    valid = det.area(rois, TORCH) > 0
    fg, bg = _sample(valid & (best >= detector.ROI_POS_IOU), valid & (best < detector.ROI_POS_IOU),
                     min(detector.ROI_BATCH, rois.shape[1]), detector.ROI_POS_FRACTION, outputs["roi_noise"])
    chosen = (fg | bg).float()
    labels = torch.where(fg, matched[..., 0].long() + 1, 0)
    ce = F.cross_entropy(outputs["cls_logits"].transpose(1, 2), labels, reduction="none")
    target = det.encode(matched[..., 1:5], rois, TORCH)
    terms["head_cls"] = _per_image(ce, chosen, chosen)
    terms["head_box"] = _per_image(_smooth_l1(outputs["box_deltas"] - target), fg.float(), chosen)
    return terms


# ---- inference (faster_rcnn.detections) ---------------------------------------------

def detections(outputs: dict, cfg: detector.Config, score_threshold: float = 0.01):
    """(N, K, 6) detections (class, score, ymin, xmin, ymax, xmax), zero-padded: the head's
    boxes, class-wise NMS at IoU 0.5 (K a class at most), the K best over all classes, as
    tf.image.combined_non_max_suppression picks them."""
    rois = outputs["rois"].float()
    boxes = clip(det.decode(outputs["box_deltas"].float(), rois, TORCH), cfg.height, cfg.width)
    probs = torch.softmax(outputs["cls_logits"].float(), -1)[..., 1:]
    probs = probs * (det.area(rois, TORCH) > 0)[..., None]   # empty ROIs detect nothing
    k, out = cfg.detections, []
    for b, p in zip(boxes, probs):
        found = [torch.cat([torch.full((len(i), 1), c, device=b.device), p[i, c, None], b[i]], 1)
                 for c in range(p.shape[1]) for i in [nms(b, p[:, c], k, 0.5, score_threshold)]]
        rows = torch.cat(found)
        out.append(_padded(rows[torch.argsort(rows[:, 1], descending=True, stable=True)][:k], k))
    return torch.stack(out)


# ---- the workload's PyTorch interface (harness/frameworks/pytorch/models.py) --------

def build_model(data) -> nn.Module:
    return FasterRCNN(ewa.config(data))


def sample(data):
    empty = torch.full((1, data.max_boxes, 5), -1.0)
    return torch.zeros(1, ewa.CHANNELS, data.height, data.width), empty


def inputs(x, device):
    images, boxes = x
    return models.channels_first(images, device), feed.to_device(np.asarray(boxes, np.float32), device)


def targets(y, device):
    return feed.to_device(np.asarray(y, np.float32), device)


def loss(outputs: dict, gt) -> torch.Tensor:
    """Per-image loss: RPN objectness + RPN box + head classification + head box."""
    return sum(loss_terms(gt, outputs).values())


def predict(model: nn.Module, data, rows: slice, device) -> np.ndarray:
    """Each validation image's top K detections, packed (K x 6), as tensorflow/ewa.predict gives them."""
    cfg = ewa.config(data)
    index = np.arange(data.n_val)[rows]
    batch = int(max(1, min(32, (1 << 22) // (data.height * data.width))))  # ~4 M pixels a step
    empty = torch.full((batch, data.max_boxes, 5), -1.0, device=device)

    feed = ((x, empty[:len(x)]) for x in (models.channels_first(data.normalised("val", index[lo:lo + batch]), device)
                                          for lo in range(0, len(index), batch)))
    out = train.outputs(model, feed, lambda outputs: detections(outputs, cfg))
    return out.reshape(len(index), -1) if len(out) else np.zeros((0, ewa.score_width(data)))
