"""The ewa detector's design, written once for every framework: its configuration
(`Config`: image size, backbone, anchors, RPN, ROIs, head) as `config_for` picks it for an
image size, and the training's sampling constants. Each framework builds the same network
from it: harness/frameworks/tensorflow/faster_rcnn.py in Keras, harness/frameworks/pytorch/
ewa.py in PyTorch. The box math both use is detection.py's. Pure; no framework imported.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from harness import settings
from harness.workloads import detection as det

RPN_BATCH, RPN_POS_FRACTION = 256, 0.5      # anchors sampled per image for the RPN loss
RPN_POS_IOU, RPN_NEG_IOU = 0.7, 0.3
ROI_BATCH, ROI_POS_FRACTION = 128, 0.25     # ROIs sampled per image (capped at `rois`)
ROI_POS_IOU = 0.5


@dataclass(frozen=True)
class Config:
    height: int
    width: int
    max_boxes: int                 # G: ground-truth rows per image (padded)
    channels: int = 16
    classes: int = 4               # foreground classes; the head adds background
    backbone: str = "resnet50"     # or "small": basic blocks of `widths`, `blocks`
    widths: tuple = (32, 64)       # small backbone: stages, each halving the resolution
    blocks: tuple = (1, 1)         # small backbone: residual blocks per stage
    anchor_sizes: tuple = (0.0625, 0.125, 0.25, 0.5)   # fractions of the image height
    anchor_ratios: tuple = (0.25, 0.5, 1.0, 2.0, 4.0)  # height / width
    rpn_channels: int = 256
    pre_nms: int = 2000
    rpn_nms_iou: float = 0.7
    rois: int = 128                # R: proposals per image, training and inference
    pool: int = 7
    fc: int = 1024
    detections: int = 32           # K: detections per image returned by `predict`

    @property
    def stride(self) -> int:
        return 16 if self.backbone == "resnet50" else 2 ** (1 + len(self.widths))

    @property
    def feature_hw(self) -> tuple[int, int]:
        return math.ceil(self.height / self.stride), math.ceil(self.width / self.stride)

    def anchors(self) -> np.ndarray:
        sizes = [s * self.height for s in self.anchor_sizes]
        return det.anchors(self.feature_hw, self.stride, sizes, self.anchor_ratios)


BACKBONE_ENV = "HPCAI500_EWA_BACKBONE"
RESNET50 = ((64, 3, 1), (128, 4, 2), (256, 6, 2))   # conv2..conv4: inner width, blocks, stride


def trunk(cfg: Config) -> tuple[tuple, bool, list[tuple]]:
    """The backbone as every port builds it: (stem, pool, blocks). The stem one conv-bn-ReLU
    (filters, kernel, stride) on the image's channels, then where `pool` a 3 x 3 max pool of
    stride 2; each residual block (cin, cout, stride, branch), relu(shortcut + branch), the
    shortcut a 1 x 1 conv-bn of that stride from cin to cout where stride > 1 or cin != cout
    (else the input), the branch conv-bns (cin, cout, kernel, stride, relu). ResNet-50's conv1
    to conv4 (v1.5 bottlenecks: the stride on the 3 x 3), or the narrow basic blocks of
    cfg.widths and cfg.blocks. Pure."""
    blocks = []
    if cfg.backbone == "resnet50":
        cin = 64
        for inner, count, stride in RESNET50:
            for b in range(count):
                s = stride if b == 0 else 1
                blocks.append((cin, 4 * inner, s, [(cin, inner, 1, 1, True), (inner, inner, 3, s, True),
                                                   (inner, 4 * inner, 1, 1, False)]))
                cin = 4 * inner
        return (64, 7, 2), True, blocks
    cin = cfg.widths[0]
    for width, count in zip(cfg.widths, cfg.blocks):
        for b in range(count):
            s = 2 if b == 0 else 1
            blocks.append((cin, width, s, [(cin, width, 3, s, True), (width, width, 3, 1, False)]))
            cin = width
    return (cfg.widths[0], 3, 2), False, blocks


def config_for(height: int, width: int, max_boxes: int, backbone: str | None = None) -> Config:
    """The ResNet-50 model at 384 pixels and above (the benchmark's 768 x 1152), the
    small one below (tests, laptops); `backbone` or HPCAI500_EWA_BACKBONE (resnet50,
    small, auto) chooses."""
    choice = (backbone or settings.value(BACKBONE_ENV)).lower()
    if choice == "auto":
        choice = "resnet50" if height >= 384 else "small"
    if choice == "resnet50":
        return Config(height, width, max_boxes)
    return Config(height, width, max_boxes, backbone="small", anchor_sizes=(0.125, 0.25, 0.5),
                  anchor_ratios=(0.25, 0.5, 1.0, 2.0), rpn_channels=64, pre_nms=600, rois=64, fc=128)


def checked(cfg: Config) -> Config:
    """`cfg`, or ValueError where no detector can be built from it: the training ROIs
    hold the ground truth's rows and at least one proposal, and the ROI crop interpolates
    between feature pixels (a map of 2 x 2 at least)."""
    if cfg.rois <= cfg.max_boxes or min(cfg.feature_hw) < 2:
        raise ValueError(f"faster_rcnn: need rois > max_boxes ({cfg.rois} vs {cfg.max_boxes}) "
                         f"and a feature map of at least 2 x 2 (got {cfg.feature_hw})")
    return cfg
