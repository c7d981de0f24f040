"""The workloads' models in TensorFlow: one module a workload (harness/frameworks/tensorflow/
<workload>.py) holding its Keras members (the tf.keras model, the loss, the input
signature of the training step, predict, and TensorFlow's own feed where it is not the
workload's numpy one), behind one small interface (`Model`), as harness/workloads/ holds
each workload's data, feed and quality once for every framework. Importing this module
imports no TensorFlow: get() imports a workload's module when the job builds its model,
after the driver has pinned the devices.
"""
from __future__ import annotations

from typing import Protocol

import numpy as np

from harness import workloads


class Model(Protocol):
    def build_model(self, data): ...                  # a tf.keras.Model for this data
    def loss(self, y, outputs): ...                   # per-sample loss tensor (outputs cast to FP32 by train.py)
    def input_signature(self, data, batch: int): ...  # (x_spec, y_spec), tf.TensorSpec nests

    def predict(self, model, data, rows: slice):
        """np.ndarray (rows, the workload's score_width): scores of validation rows, averageable over models."""

    # Optional (DEFAULTS): TensorFlow's training feed where it is not the workload's numpy
    # one (ic's tf.data pipeline, ewa's tf.data prefetch): batches(data, rows, batch, *,
    # training, seed), the workloads' batches() contract; None: the workload's batches.
    batches: object
    # Optional (DEFAULTS: None, then workloads.training_feed chains batches() per epoch):
    # stream(data, shards, epochs, batch, *, seed) -> one iterator over every epoch's
    # training batches, len(shards(e)) // batch of epoch e = 0 .. epochs-1 in turn, for a
    # feed that is a pipeline better built once than once an epoch (ic's tf.data).
    stream: object


DEFAULTS = {"batches": None, "stream": None}


def class_probabilities(model, inputs, classes: int) -> np.ndarray:
    """Softmax of the model's logits, computed in FP32, over the batches `inputs` (an
    iterable of x): what a classifier's predict() returns. Averaging it across base
    models is the mean aggregation; its argmax, a vote."""
    import tensorflow as tf
    out = [tf.nn.softmax(tf.cast(model(x, training=False), tf.float32)).numpy() for x in inputs]
    return np.concatenate(out) if out else np.zeros((0, classes), np.float32)


REQUIRED = workloads.required_members(Model, DEFAULTS)


def get(workload: str) -> Model:
    """The TensorFlow module of `workload` (every workload has one), checked against the interface."""
    return workloads.checked_module(f"harness.frameworks.tensorflow.{workload}", REQUIRED, DEFAULTS)
