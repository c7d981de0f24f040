"""The cosmoflow workload's model in TensorFlow: the reference's 3D CNN in Keras (MLPerf
HPC's reference is Keras; harness/workloads/cosmoflow.py's docstring gives its layers),
its MSE loss, input signature and predict. The data, the feed (numpy), the quality and the
design's numbers (FILTERS through filters(), DENSE, ...) are the workload's.
"""
from __future__ import annotations

import numpy as np

from harness.workloads.cosmoflow import (CHANNELS, DENSE, DROPOUT, LEAKY_ALPHA, OUTPUT_SCALE, PARAMETERS, CosmoData,
                                         filters, validation_volumes)


def _scale(x):
    return x * OUTPUT_SCALE


def build_model(data: CosmoData):
    import tensorflow as tf
    L = tf.keras.layers
    model = tf.keras.Sequential([tf.keras.Input((data.side,) * 3 + (CHANNELS,))], name="cosmoflow")
    for f in filters():
        model.add(L.Conv3D(f, 3, padding="same"))
        model.add(L.LeakyReLU(LEAKY_ALPHA))
        model.add(L.MaxPooling3D(2))
    model.add(L.Flatten())
    for n in DENSE:
        model.add(L.Dense(n))
        model.add(L.LeakyReLU(LEAKY_ALPHA))
        model.add(L.Dropout(DROPOUT))
    model.add(L.Dense(PARAMETERS, activation="tanh"))
    model.add(L.Lambda(_scale, name="times_1p2"))
    return model


def loss(y, outputs):
    """Per-sample mean squared error over the 4 parameters (the reference's MSE)."""
    import tensorflow as tf
    return tf.reduce_mean(tf.square(outputs - tf.cast(y, outputs.dtype)), axis=-1)


def input_signature(data: CosmoData, batch: int):
    import tensorflow as tf
    return (tf.TensorSpec((batch, data.side, data.side, data.side, CHANNELS), tf.float32),
            tf.TensorSpec((batch, PARAMETERS), tf.float32))


def predict(model, data: CosmoData, rows: slice) -> np.ndarray:
    """The 4 predicted parameters (float64) of validation rows `rows`: averaging them over
    base models is the ensemble's prediction."""
    import tensorflow as tf
    out = [tf.cast(model(x, training=False), tf.float32).numpy() for x in validation_volumes(data, rows)]
    return np.concatenate(out).astype(np.float64) if out else np.zeros((0, PARAMETERS))
