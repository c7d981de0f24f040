"""climate_synthetic: climate-like samples written in MLPerf HPC's DeepCAM layout.

The DeepCAM workload's synthetic data set, for machines without the real data (8.8 TB)
and for tests: `<dir>/train/data-NNNNNN.h5`, `<dir>/validation/data-NNNNNN.h5` (one
sample a file, the last VAL_FRACTION of the samples the validation set) and
`<dir>/stats.h5`, written by climate.write_sample and climate.write_stats, so that they
are read back by the one reader of real data (climate.read), and `<dir>/hpcai500-deepcam.json`,
the harness's marker (workloads.write_marker; harness/division.py). A sample is height x 1.5
height pixels (as the published 768 x 1152), height a multiple of 32 so that the width
is a multiple of climate.SIDE_MULTIPLE (16).

A sample is built in standardised units z (H, W, 16), then turned into physical-ish
values per channel (CHANNELS: the published channel order and units, each with its own
offset and spread, some log-normal), so min-max normalisation matters as it does for
the real data:
* background: smooth noise (a coarse grid, interpolated) of unit variance a channel,
  a little white noise, and a warm, moist equator in the temperature and TMQ channels;
* 0-2 tropical cyclones (class 1): round, radius ~height / 12, a low in PS and PSL (1,
  2), high TMQ (6) and PRECT (0), a warm core (T200, 4), low Z1000 (13), and a ring of
  cyclonic wind in U850/UBOT/V850/VBOT (9-12);
* 0-1 atmospheric rivers (class 2): a long thin wavy band, high TMQ (6), QREFHT (3)
  and PRECT (0), wind along the band (9-12).
Each object's signature has a logistic edge whose midpoint is the labelled boundary;
rivers are labelled first, cyclones on top. ~96 % of the pixels stay background (the
real data: ~95-98 %). The first sample of each split holds one of each object, so that
both splits have all three classes (a per-class IoU over the validation set is defined).
Deterministic for a seed (numpy default_rng); 128 samples at 64 x 96 take ~0.3 s.
"""
from __future__ import annotations

import math
import os

import numpy as np

from harness.files import atomic_path
from harness.workloads import climate, write_marker

FORMAT_VERSION = 1          # part of the cache directory's name: bump when the generator changes
VAL_FRACTION = 0.25         # of the samples, the validation set (at least 2 of each split)
HEIGHT_MULTIPLE = 2 * climate.SIDE_MULTIPLE   # the width, 1.5 x height, must be a multiple of 16
# (name, kind, a, b): physical = a + b z (linear) or a exp(b z) (log-normal), CAM5's units
CHANNELS = (("PRECT", "log", 3e-8, 0.8), ("PS", "lin", 98000.0, 1200.0), ("PSL", "lin", 101300.0, 1000.0),
            ("QREFHT", "log", 0.008, 0.4), ("T200", "lin", 218.0, 4.0), ("T500", "lin", 255.0, 6.0),
            ("TMQ", "log", 22.0, 0.35), ("TREFHT", "lin", 285.0, 10.0), ("TS", "lin", 287.0, 11.0),
            ("U850", "lin", 4.0, 8.0), ("UBOT", "lin", 2.0, 6.0), ("V850", "lin", 0.0, 6.0),
            ("VBOT", "lin", 0.0, 5.0), ("Z1000", "lin", 110.0, 90.0), ("Z200", "lin", 11800.0, 150.0),
            ("ZBOT", "lin", 62.0, 2.0))
PRECT, PS, PSL, QREFHT, T200, TMQ, U850, UBOT, V850, VBOT, Z1000 = 0, 1, 2, 3, 4, 6, 9, 10, 11, 12, 13
WARM = (4, 5, 7, 8)          # the temperatures: warmer at the equator


def directory_name(samples: int, height: int) -> str:
    """The cache directory of a set: what decides its content is in the name."""
    return f"deepcam-synthetic-v{FORMAT_VERSION}-{samples}x{height}"


def split_sizes(samples: int) -> tuple[int, int]:
    """(training, validation) samples of a set of `samples`: ValueError if either is under 2."""
    n_val = max(2, int(round(VAL_FRACTION * samples)))
    if samples - n_val < 2:
        raise ValueError(f"deepcam synthetic: {samples} samples, expected at least 4 (2 training and 2 validation)")
    return samples - n_val, n_val


def write_synthetic(path: str, samples: int, height: int, seed: int = 2026) -> None:
    """`samples` samples of height x 1.5 height pixels in the published layout, and the
    training samples' statistics, written one sample at a time (memory stays at one
    sample) into a temporary directory renamed to `path`: a directory at `path` is a
    whole set. ValueError for a height that is not a positive multiple of 32 or fewer
    than 4 samples."""
    if height <= 0 or height % HEIGHT_MULTIPLE:
        raise ValueError(f"deepcam synthetic: height {height} is not a multiple of {HEIGHT_MULTIPLE} (the width, "
                         f"1.5 x height, must be a multiple of {climate.SIDE_MULTIPLE}, the model's output stride)")
    n_train, _ = split_sizes(samples)
    width = height * 3 // 2
    rng = np.random.default_rng(seed)
    lo = np.full(climate.CHANNELS, np.inf, np.float32)
    hi = np.full(climate.CHANNELS, -np.inf, np.float32)
    total, squares = np.zeros(climate.CHANNELS), np.zeros(climate.CHANNELS)
    with atomic_path(path) as tmp:
        for split in climate.SPLITS:
            os.makedirs(os.path.join(tmp, split))
        for i in range(samples):
            split = climate.SPLITS[0] if i < n_train else climate.SPLITS[1]
            x, y = sample(rng, height, width, both=i in (0, n_train))
            climate.write_sample(os.path.join(tmp, split, f"data-{i:06d}.h5"), x, y)
            if i < n_train:   # the statistics are the training set's, as the published file's
                lo, hi = np.minimum(lo, x.min(axis=(0, 1))), np.maximum(hi, x.max(axis=(0, 1)))
                total += x.mean(axis=(0, 1), dtype=np.float64)
                squares += np.square(x, dtype=np.float64).mean(axis=(0, 1))
        climate.write_stats(tmp, lo, hi, total / n_train, squares / n_train, n_train)
        write_marker(tmp, "deepcam", samples=samples, height=height, seed=seed, format_version=FORMAT_VERSION)


def sample(rng: np.random.Generator, height: int, width: int, both: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(x float32 (H, W, 16) physical values, y uint8 (H, W) classes) of one sample;
    both: at least one cyclone and one river."""
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float64) + 0.5   # pixel centres
    z = _background(rng, height, width, yy)
    y = np.zeros((height, width), np.uint8)
    cyclones, rivers = int(rng.integers(0, 3)), int(rng.integers(0, 2))
    if both:
        cyclones, rivers = max(cyclones, 1), 1
    for _ in range(rivers):        # drawn first: a cyclone over a river keeps class 1
        _river(rng, z, y, yy, xx)
    for _ in range(cyclones):
        _cyclone(rng, z, y, yy, xx)
    return _physical(z), y


def _background(rng, height: int, width: int, yy: np.ndarray) -> np.ndarray:
    """Smooth unit-variance noise in every channel, white noise at 0.1, the equator warm."""
    coarse = rng.standard_normal((max(2, height // 8), max(2, width // 8), climate.CHANNELS))
    ry, rx = _interpolation(height, coarse.shape[0]), _interpolation(width, coarse.shape[1])
    # separable: two matrix products (BLAS), not one 4-index sum
    z = np.tensordot(ry, np.tensordot(rx, coarse, axes=([1], [1])), axes=([1], [1]))   # (H, W, C)
    z /= z.std(axis=(0, 1))
    z += 0.1 * rng.standard_normal(z.shape)
    equator = np.cos(math.pi * (yy / height - 0.5)) - 0.64   # about 0 on average over latitude
    for c in (*WARM, TMQ):
        z[..., c] += 1.5 * equator
    return z


def _interpolation(n_out: int, n_in: int) -> np.ndarray:
    """(n_out, n_in) linear interpolation matrix: smooth fields from a coarse grid."""
    pos = np.linspace(0, n_in - 1, n_out)
    return np.stack([np.interp(pos, np.arange(n_in), np.eye(n_in)[j]) for j in range(n_in)], 1)


def _edge(distance: np.ndarray, boundary: float, softness: float) -> np.ndarray:
    """1 well inside, 1/2 at `boundary`, 0 well outside (a logistic edge)."""
    return 1.0 / (1.0 + np.exp(np.minimum((distance - boundary) / softness, 60.0)))


def _cyclone(rng, z: np.ndarray, y: np.ndarray, yy: np.ndarray, xx: np.ndarray) -> None:
    """A tropical cyclone (class 1) added to z and labelled in y, in the tropics."""
    height, width = y.shape
    r = rng.uniform(0.8, 1.2) * height / 12
    cy, cx = rng.uniform(0.25, 0.75) * height, rng.uniform(r, width - r)
    dy, dx = yy - cy, xx - cx
    d = np.hypot(dy, dx)
    core = _edge(d, r, 0.15 * r)
    for c, amplitude in ((PSL, -3.5), (PS, -3.0), (TMQ, 3.0), (PRECT, 2.5), (Z1000, -2.5), (T200, 1.0)):
        z[..., c] += amplitude * core
    rm = 0.6 * r                                   # the wind's ring: strongest at 0.6 r
    speed = (d / rm) * np.exp(1.0 - d / rm) * (1.0 if cy < height / 2 else -1.0)   # cyclonic either side
    u, v = -speed * dy / (d + 1e-9), speed * dx / (d + 1e-9)
    for c, amplitude, along in ((U850, 3.0, u), (UBOT, 2.5, u), (V850, 3.0, v), (VBOT, 2.5, v)):
        z[..., c] += amplitude * along
    y[core >= 0.5] = 1


def _river(rng, z: np.ndarray, y: np.ndarray, yy: np.ndarray, xx: np.ndarray) -> None:
    """An atmospheric river (class 2): a wavy band along most of the width, added to z
    and labelled in y."""
    height, width = y.shape
    length = rng.uniform(0.45, 0.75) * width
    start, half = rng.uniform(0, width - length), rng.uniform(0.03, 0.045) * height
    y0, slope = rng.uniform(0.25, 0.75) * height, rng.uniform(-0.35, 0.35)
    amplitude, waves, phase = rng.uniform(0.03, 0.08) * height, rng.uniform(0.5, 1.5), rng.uniform(0, 2 * math.pi)
    x = xx[0]
    angle = 2 * math.pi * waves * (x - start) / length + phase
    centre = y0 + slope * (x - start - length / 2) + amplitude * np.sin(angle)
    gradient = slope + amplitude * 2 * math.pi * waves / length * np.cos(angle)
    norm = np.sqrt(1.0 + gradient ** 2)
    across = np.abs(yy - centre) / norm            # ~ the distance to the centre line
    band = _edge(across, half, 0.3 * half) * ((x >= start) & (x <= start + length))
    for c, amplitude in ((TMQ, 3.0), (QREFHT, 1.5), (PRECT, 1.0)):
        z[..., c] += amplitude * band
    for c, amplitude, along in ((U850, 2.5, 1 / norm), (UBOT, 2.0, 1 / norm), (V850, 2.5, gradient / norm),
                                (VBOT, 2.0, gradient / norm)):
        z[..., c] += amplitude * band * along
    y[band >= 0.5] = 2


def _physical(z: np.ndarray) -> np.ndarray:
    """float32 (H, W, 16) physical-ish values of standardised z, per CHANNELS."""
    x = np.empty(z.shape, np.float32)
    for c, (_, kind, a, b) in enumerate(CHANNELS):
        x[..., c] = a * np.exp(b * z[..., c]) if kind == "log" else a + b * z[..., c]
    return x
