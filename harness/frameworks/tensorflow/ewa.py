"""The ewa workload's detector in TensorFlow: the Keras Faster-RCNN (faster_rcnn.py) at
the data's image size and boxes (the workload's config), its loss, input signature and
predict, and TensorFlow's feed: the workload's numpy batches, read ahead on a tf.data
thread where HPCAI500_EWA_PREFETCH asks it (`batches`, and `stream`, one pipeline for
every epoch). The data, the numpy feed, the box math and the quality are
harness/workloads/ewa.py's (and extreme_weather.py's, detection.py's, detector.py's).
"""
from __future__ import annotations

import numpy as np

from harness import settings
from harness.frameworks.tensorflow import faster_rcnn
from harness.workloads import each_epoch
from harness.workloads.ewa import PREFETCH_ENV, config, numpy_batches, score_width
from harness.workloads.extreme_weather import CHANNELS, Data


def build_model(data: Data):
    return faster_rcnn.build(config(data))


def loss(y, outputs):
    return faster_rcnn.loss(y, outputs)


def input_signature(data: Data, batch: int):
    import tensorflow as tf
    boxes = tf.TensorSpec((batch, data.max_boxes, 5), tf.float32)
    return (tf.TensorSpec((batch, data.height, data.width, CHANNELS), tf.float32), boxes), boxes


def batches(data: Data, rows, batch: int, *, training: bool = True, seed: int = 0):
    """The workload's batches (ewa.numpy_batches: normalised images and boxes of training
    rows `rows`, in order, flipped left-right at random if `training`). Numpy arrays by
    default; with HPCAI500_EWA_PREFETCH=N > 0, tensors from the same generator through
    tf.data.Dataset.from_generator + prefetch(N), which reads the next batches on a
    tf.data thread while the step runs (see harness/workloads/ewa.py's docstring)."""
    return _fed(data, batch, lambda: numpy_batches(data, rows, batch, training, seed))


def stream(data: Data, shards, epochs: int, batch: int, *, seed: int):
    """Every epoch's training batches in turn (models.Model.stream), epoch e's rows
    `shards(e)` flipped from seed + e: the batches a call of batches() per epoch gives.
    With prefetch on, one tf.data pipeline for the whole training: tearing one down
    every epoch held a rank for seconds at 2 ranks (bench/README.md, peers.py)."""
    return _fed(data, batch, lambda: each_epoch(lambda rows, s: numpy_batches(data, rows, batch, True, s),
                                                 shards, epochs, seed))


def _fed(data: Data, batch: int, generate):
    """generate() itself (numpy batches), or through a tf.data prefetch of
    HPCAI500_EWA_PREFETCH batches when that is > 0."""
    depth = settings.value(PREFETCH_ENV)
    if depth <= 0:
        return generate()
    import tensorflow as tf
    spec = input_signature(data, batch)
    return iter(tf.data.Dataset.from_generator(generate, output_signature=spec).prefetch(depth))


def predict(model, data: Data, rows: slice) -> np.ndarray:
    """Each validation image's top K detections, packed (K x 6): (class, score, ymin,
    xmin, ymax, xmax) rows, best first, zero rows after the last detection."""
    import tensorflow as tf
    cfg = config(data)
    index = np.arange(data.n_val)[rows]
    batch = int(max(1, min(32, (1 << 22) // (data.height * data.width))))  # ~4 M pixels a step
    empty = np.zeros((batch, data.max_boxes, 5), np.float32)
    empty[..., 0] = -1

    @tf.function(autograph=False)  # plain Python control flow: no AST conversion
    def run(x):
        return faster_rcnn.detections(model((x, empty), training=False), cfg)

    out = []
    for lo in range(0, len(index), batch):
        part = index[lo:lo + batch]
        x = data.normalised("val", part)
        x = np.concatenate([x, np.zeros((batch - len(x), *x.shape[1:]), np.float32)])  # one shape, one trace
        out.append(run(tf.constant(x)).numpy()[:len(part)].reshape(len(part), -1))
    return np.concatenate(out) if out else np.zeros((0, score_width(data)))
