"""weather_synthetic: weather-like scenes written in ExtremeWeather's published layout.

The ewa workload's `synthetic[:SAMPLES[:SIDE]]` data set, for machines without the real
data and for tests: YEARS files `climo_1979.h5`, ... (the last year the validation set)
in the published layout (extreme_weather.py), box rows in HPCAI500_EWA_BOX_ORDER (unset:
the page's `yxyxc`), so that it is read back by the one reader of real data, and beside
them `hpcai500-ewa.json`, the harness's marker (workloads.write_marker: a path to the set
is still generated data, harness/division.py). Each image
holds 16 channels of smooth noise with their own offsets and scales (as physical
variables have) and 1-3 objects whose class decides their shape, size and the channels
they show in: a detector has something to learn, and mAP means something. About 1.5 s
and 57 MB an image at the full 768 x 1152.

The reader detects the box order from the rows (extreme_weather.detect_order), and a
few small boxes can fit several readings. So, by construction, the first image of every
file holds a witness: an atmospheric river low in the image (x_min < y_min) reaching
past x = height (x_max > height). Its value > height can only be x_max, and the other
three values then fit one candidate order only, whichever of the four the set is
written in: the set is never ambiguous, and write_synthetic checks that it is not.
"""
from __future__ import annotations

import math
import os

import numpy as np

from harness.files import atomic_path
from harness.workloads import DataError, write_marker
from harness.workloads import detection as det
from harness.workloads import extreme_weather as ew

FORMAT_VERSION = 4          # part of the cache directory's name: bump when the generator changes
# 3: a directory is complete once it exists (renamed into place whole), no `done` marker:
# a half-written v2 directory of a killed writer must not be taken for a complete one
# (hpcai500-ewa.json, written inside before the rename, says who wrote it, not that it is whole)
# 4: a witness object in each file's first image makes the box order detectable
YEARS = 5                   # files of a set; the last is the validation set
MAX_BOXES = 3               # objects an image, at most (G of the boxes dataset)
FIRST_YEAR = 1979

# class -> (channels, sign): which variables an event shows in
SIGNATURE = {0: ((0, 1, 2), (1, 1, -1)), 1: ((0, 1, 3, 4), (1, 1, 1, 1)),
             2: ((5, 6, 7, 2), (1, 1, 1, -1)), 3: ((8, 9, 10, 11), (1, 1, 1, 1))}


def directory_name(samples: int, side: int, order: str) -> str:
    """The cache directory of a set: what decides its content is in the name."""
    return f"ewa-synthetic-v{FORMAT_VERSION}-{samples}-{side}-{order}"


def write_synthetic(path: str, samples: int, side: int, seed: int = 2024,
                    order: str = ew.PAGE_ORDER) -> None:
    """`samples` images of side x 1.5 side pixels (as 768 x 1152) in the published
    layout, written image by image (memory stays at one image whatever the size) into a
    temporary directory renamed to `path`: a directory at `path` is a whole set."""
    height, width = side, int(round(side * 1.5))
    years = min(YEARS, samples)
    if years < 2:
        raise DataError(f"ewa synthetic: {samples} samples leave no training images")
    rng = np.random.default_rng(seed)
    offsets, scales = np.arange(ew.CHANNELS) * 10.0, 1.0 + np.arange(ew.CHANNELS) * 0.5
    with atomic_path(path) as tmp:
        os.makedirs(tmp)
        for k, count in enumerate(len(a) for a in np.array_split(np.arange(samples), years)):
            scenes = [_scene(rng, height, width, witness=i == 0) for i in range(count)]
            rows = np.full((count, MAX_BOXES, 5), [-1, 0, 0, 0, 0], np.float32)
            for i, objects in enumerate(scenes):
                rows[i, :len(objects)] = [(c, *box) for c, box, _ in objects]
            _check_detectable(rows, order, (height, width))
            # rendered lazily, in scene order: one image in memory, one stream of draws
            images = ((_render(rng, height, width, objects) * scales + offsets).transpose(2, 0, 1)
                      for objects in scenes)
            ew.write_published(os.path.join(tmp, f"climo_{FIRST_YEAR + k}.h5"), images, rows, order)
        write_marker(tmp, "ewa", samples=samples, side=side, order=order, seed=seed, format_version=FORMAT_VERSION)


def _check_detectable(rows: np.ndarray, order: str, hw) -> None:
    """The rows (class, ymin, xmin, ymax, xmax) of a file, as written in `order`, fit
    that candidate reading and no other (the witness's doing; see the module docstring)."""
    if order.strip().lower() not in ew.CANDIDATE_ORDERS:
        return  # an order outside the candidates is read only with the setting: no detection
    raw = ew.from_rows(rows, order)
    fits = ew.fitting_orders(raw[raw[..., 4] >= 0], hw)
    if fits != [order.strip().lower()]:
        raise AssertionError(f"ewa synthetic: box rows written in {order} fit the readings {fits}")


def _witness(rng, height, width):
    """An atmospheric river low in the image, nearly level, from x < 0.41 height to
    x > 1.08 height (see the module docstring): (class, box, shape parameters)."""
    thick, angle = 0.04 * height, rng.uniform(-0.08, 0.08)
    length = rng.uniform(0.6, 0.7) * width
    cy, cx = rng.uniform(0.72, 0.88) * height, rng.uniform(0.6, 0.9) * height
    half_y, half_x = 0.5 * length * abs(math.sin(angle)) + thick, 0.5 * length * math.cos(angle) + thick
    box = (max(cy - half_y, 0), max(cx - half_x, 0), min(cy + half_y, height), min(cx + half_x, width))
    return 3, box, (cy, cx, (thick, angle, length))


def _scene(rng, height, width, witness=False):
    """1-3 objects (class, box, shape parameters), overlapping little; the first a
    witness (`_witness`) if asked."""
    objects = [_witness(rng, height, width)] if witness else []
    for _ in range(rng.integers(1, MAX_BOXES + 1) - len(objects)):
        for _attempt in range(20):
            c = int(rng.integers(ew.CLASSES))
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


def _render(rng, height, width, objects, amplitude=2.5):
    """Smooth unit-variance noise in every channel plus the objects' signatures, (H, W, 16)."""
    coarse = rng.standard_normal((max(2, height // 8), max(2, width // 8), ew.CHANNELS))
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
        channels, signs = SIGNATURE[c]
        for ch, sign in zip(channels, signs):
            x[..., ch] += sign * amplitude * field
        if c == 1:  # the cyclone's eye wall: a ring in channel 4
            x[..., 4] += amplitude * np.exp(-0.5 * ((np.sqrt(d2) - 0.5) / 0.12) ** 2)
    return x


def _interpolation(n_out: int, n_in: int) -> np.ndarray:
    """(n_out, n_in) linear interpolation matrix: smooth fields from a coarse grid."""
    pos = np.linspace(0, n_in - 1, n_out)
    return np.stack([np.interp(pos, np.arange(n_in), np.eye(n_in)[j]) for j in range(n_in)], 1)
