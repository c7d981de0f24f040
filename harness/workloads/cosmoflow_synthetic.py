"""cosmoflow_synthetic: universes written in MLPerf HPC's CosmoFlow layout.

The cosmoflow workload's `synthetic[:SAMPLES[:SIDE]]` data set, for machines without the
real data and for tests: `<dir>/train/*.tfrecord` and `<dir>/validation/*.tfrecord`,
GZIP-compressed, one tf.train.Example a file as in `cosmoUniverse_2019_05_4parE_tf_v2`
(`x`: the raw bytes of int16 [SIDE, SIDE, SIDE, 4], channels last; `y`: 4 float32), so
that it is read back by the one reader of real data (cosmoflow.read), and beside them
`hpcai500-cosmoflow.json`, the harness's marker (workloads.write_marker; harness/division.py).

Each sample draws its 4 parameters y uniformly in [-1, 1] (the published targets are
normalised to about that range) and renders a universe from them (`parameters`):

  y0  mean density: 6 x 2^(1.5 y0) counts a voxel (2.1 .. 17)
  y1  amplitude: the log-density's standard deviation sigma = 0.6 + 0.3 y1 (0.3 .. 0.9)
  y2  spectral slope: P(k) proportional to k^-(2 + y2) (3 .. 1: smooth to rough)
  y3  evolution across the 4 channels (4 redshifts of one universe): channel c's mean
      density is y0's times 2^(0.75 y3 g_c), g_c = (c - 1.5) / 1.5 in -1 .. 1

A Gaussian random field delta of unit variance with spectrum P(k) (white noise shaped
in Fourier space, periodic box), one for the 4 channels, gives channel c's density
lambda_c = nbar_c exp(sigma delta - sigma^2 / 2) (a log-normal field of mean nbar_c), and the
voxel's count is Poisson(lambda_c), clipped to int16: particle counts in a box, as the
published N-body histograms are. Mean density, amplitude, roughness and the channel
ratio are all visible to a 3D CNN, so a model learns the parameters and MAE means
something; the Poisson noise and the random phases keep it from being exact, so
bagged models disagree and their mean beats each of them.
"""
from __future__ import annotations

import gzip
import os

import numpy as np

from harness.files import atomic_path
from harness.workloads import DataError, tfrecord, write_marker

FORMAT_VERSION = 1          # part of the cache directory's name: bump when the generator changes
VAL_FRACTION = 0.2          # of the samples, the validation set
CHANNELS = 4                # the published volumes' 4 redshifts
PARAMETERS = 4              # y: the 4 cosmological parameters
SPLITS = ("train", "validation")


def directory_name(samples: int, side: int) -> str:
    """The cache directory of a set: what decides its content is in the name."""
    return f"cosmoflow-synthetic-v{FORMAT_VERSION}-{samples}-{side}"


def file_name(i: int) -> str:
    """Sample i's file, in the published sets' naming shape (`..._univ_..._<n>.tfrecord`)."""
    return f"{i:06d}_univ_hpcai500_synthetic.tfrecord"


def parameters(y: np.ndarray) -> tuple[np.ndarray, float, float]:
    """(per-channel mean counts a voxel, sigma, spectral slope) of the 4 parameters y
    (see the module docstring)."""
    growth = (np.arange(CHANNELS) - 1.5) / 1.5          # -1 .. 1 over the 4 redshifts
    nbar = 6.0 * 2.0 ** (1.5 * y[0] + 0.75 * y[3] * growth)
    sigma = 0.6 + 0.3 * y[1]
    slope = 2.0 + y[2]
    return nbar, float(sigma), float(slope)


def gaussian_field(rng: np.random.Generator, side: int, slope: float) -> np.ndarray:
    """A periodic Gaussian random field of unit variance with power spectrum k^-slope
    (the k = 0 mode removed), float64 (side, side, side)."""
    k = np.fft.fftfreq(side)
    kz = np.fft.rfftfreq(side)
    kk = np.sqrt(k[:, None, None] ** 2 + k[None, :, None] ** 2 + kz[None, None, :] ** 2)
    kk[0, 0, 0] = 1.0
    amplitude = kk ** (-slope / 2)
    amplitude[0, 0, 0] = 0.0
    field = np.fft.irfftn(np.fft.rfftn(rng.standard_normal((side,) * 3)) * amplitude, s=(side,) * 3, axes=(0, 1, 2))
    return field / field.std()


def universe(rng: np.random.Generator, side: int, y: np.ndarray) -> np.ndarray:
    """int16 (side, side, side, 4) counts of the universe of parameters y."""
    nbar, sigma, slope = parameters(y)
    delta = gaussian_field(rng, side, slope)
    lam = nbar * np.exp(sigma * delta[..., None] - sigma ** 2 / 2)
    return np.minimum(rng.poisson(lam), np.iinfo(np.int16).max).astype(np.int16)


def example(x: np.ndarray, y: np.ndarray) -> bytes:
    """One serialized tf.train.Example in the published layout: `x` the raw bytes of the
    int16 volume (channels last), `y` the 4 float32 parameters."""
    return tfrecord.encode_example({"x": [x.astype("<i2").tobytes()], "y": np.asarray(y, np.float32)})


def write_synthetic(path: str, samples: int, side: int, seed: int = 2024) -> None:
    """`samples` universes of side^3 voxels, one GZIP TFRecord file each, the last
    VAL_FRACTION of them the validation set, written one at a time (memory stays at one
    volume) into a temporary directory renamed to `path`: a directory there is a whole set."""
    n_val = max(1, int(round(VAL_FRACTION * samples)))
    if samples - n_val < 1:
        raise DataError(f"cosmoflow synthetic: {samples} samples leave none for training")
    rng = np.random.default_rng(seed)
    # level 1: Poisson counts hardly compress better at 6 (zlib's default) and take ~3x as long
    with atomic_path(path) as tmp:
        for split in SPLITS:
            os.makedirs(os.path.join(tmp, split))
        for i in range(samples):
            split = SPLITS[0] if i < samples - n_val else SPLITS[1]
            y = rng.uniform(-1.0, 1.0, PARAMETERS).astype(np.float32)
            # a GZIP TFRecord file, as TFRecordWriter's "GZIP" option writes it: the framed records, gzipped
            # (no name, time 0 in the gzip header: the same bytes every time)
            with open(os.path.join(tmp, split, file_name(i)), "wb") as f, \
                    gzip.GzipFile("", "wb", compresslevel=1, fileobj=f, mtime=0) as w:
                w.write(tfrecord.frame(example(universe(rng, side, y), y)))
        write_marker(tmp, "cosmoflow", samples=samples, side=side, seed=seed, format_version=FORMAT_VERSION)
