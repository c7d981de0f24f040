"""The deepcam workload's model in TensorFlow: the Keras DeepLabv3+ (deeplab.py) at the
workload's shape, its class-weighted loss, input signature and predict. The data, the
feed (numpy), the quality and the design's numbers are harness/workloads/deepcam.py's.
"""
from __future__ import annotations

import numpy as np

from harness.frameworks.tensorflow import deeplab
from harness.workloads import climate
from harness.workloads.deepcam import CLASS_WEIGHTS, score_width, shape, validation_samples


def build_model(data: climate.Data):
    scale, middle = shape()
    return deeplab.build(data.height, data.width, climate.CHANNELS, climate.CLASSES, scale=scale, middle=middle)


def loss(y, outputs):
    """Per-sample loss: the mean over pixels of the class-weighted cross entropy."""
    import tensorflow as tf
    labels = tf.cast(y, tf.int32)
    ce = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=tf.cast(outputs, tf.float32))
    weighted = ce * tf.gather(tf.constant(CLASS_WEIGHTS, tf.float32), labels)
    return tf.reduce_mean(weighted, axis=[1, 2])


def input_signature(data: climate.Data, batch: int):
    import tensorflow as tf
    return (tf.TensorSpec((batch, data.height, data.width, climate.CHANNELS), tf.float32),
            tf.TensorSpec((batch, data.height, data.width), tf.int32))


def predict(model, data: climate.Data, rows: slice) -> np.ndarray:
    """Per-pixel class probabilities (softmax of the logits in FP32) of validation
    samples `rows`, each flattened H x W x 3 (pixel-major: a pixel's 3 columns are
    adjacent, VOTE_GROUP)."""
    import tensorflow as tf
    out = [tf.nn.softmax(tf.cast(model(x, training=False), tf.float32)).numpy().reshape(len(x), -1)
           for x in validation_samples(data, rows)]
    return np.concatenate(out) if out else np.zeros((0, score_width(data)), np.float32)
