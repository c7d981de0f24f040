"""The digits workload's model in TensorFlow: the small Keras CNN, its loss, input
signature and predict. The data, the feed (numpy) and the quality are
harness/workloads/digits.py's.
"""
from __future__ import annotations

import numpy as np

from harness.frameworks.tensorflow.models import class_probabilities
from harness.workloads import Data
from harness.workloads.digits import CLASSES


def build_model(data: Data):
    import tensorflow as tf
    layers = tf.keras.layers
    return tf.keras.Sequential([
        layers.Input(data.x_train.shape[1:]),
        layers.Conv2D(32, 3, padding="same", activation="relu"),
        layers.BatchNormalization(),
        layers.Conv2D(64, 3, padding="same", activation="relu"),
        layers.MaxPooling2D(2),
        layers.Flatten(),
        layers.Dense(128, activation="relu"),
        layers.Dropout(0.25),
        layers.Dense(data.num_classes),
    ], name="digits_cnn")


def loss(labels, logits):
    import tensorflow as tf
    return tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)


def input_signature(data: Data, batch: int):
    import tensorflow as tf
    return (tf.TensorSpec((batch, *data.x_train.shape[1:]), tf.as_dtype(data.x_train.dtype)),
            tf.TensorSpec((batch, *data.y_train.shape[1:]), tf.as_dtype(data.y_train.dtype)))


def predict(model, data: Data, rows: slice, batch: int = 512) -> np.ndarray:
    """Class probabilities (computed in FP32) of validation rows `rows`."""
    x = data.x_val[rows]
    return class_probabilities(model, (x[i:i + batch] for i in range(0, len(x), batch)), CLASSES)
