"""The ic workload's model in TensorFlow: ResNet-50 v1.5 (resnet.py) at the data's
classes and image side, its loss (label smoothing 0.1), input signature and predict, and
TensorFlow's feed: the tf.data pipeline harness/workloads/ic.py's docstring describes
(parse, JPEG decode and augmentation in parallel, batched and prefetched; `batches`, and
`stream`, one pipeline for every epoch). The data, its index, the numpy feed and the
quality are harness/workloads/ic.py's.
"""
from __future__ import annotations

import numpy as np

from harness.frameworks.tensorflow import resnet
from harness.frameworks.tensorflow.models import class_probabilities
from harness.workloads import tfrecord
from harness.workloads.ic import (CENTER_FRACTION, CHUNK, EVAL_BATCH, LABEL_SMOOTHING, MEAN, STD, WEIGHT_DECAY,
                                  ICData, checked_rows, outside, shape)


def build_model(data: ICData):
    width, stages = shape()
    return resnet.build((data.side, data.side, 3), data.num_classes, weight_decay=WEIGHT_DECAY,
                        width=width, stages=stages)


def loss(y, logits):
    """Per-sample cross-entropy with label smoothing 0.1 (sparse integer labels)."""
    import tensorflow as tf
    onehot = tf.one_hot(tf.cast(y, tf.int32), tf.shape(logits)[-1], dtype=logits.dtype)
    return tf.keras.losses.categorical_crossentropy(onehot, logits, from_logits=True,
                                                    label_smoothing=LABEL_SMOOTHING)


def input_signature(data: ICData, batch: int):
    import tensorflow as tf
    return (tf.TensorSpec((batch, data.side, data.side, 3), tf.float32),
            tf.TensorSpec((batch,), tf.int64))


# ---- the input pipeline ---------------------------------------------------------------

def _records(index: tfrecord.Index, parts):
    """tf.data of the raw records of each row array `parts()` yields, in turn and in
    order, each with its shard number, its part's number and its place in the part:
    preads in a generator, CHUNK at a time (one Python step per chunk, not per record).
    `parts` is called when the pipeline starts, so a later epoch's rows are drawn only
    when the reader reaches them."""
    import tensorflow as tf

    def gen():
        with tfrecord.Reader(index) as r:
            for e, rows in enumerate(parts()):
                for a in range(0, len(rows), CHUNK):
                    chunk = rows[a:a + CHUNK]
                    yield (np.array(r.records(chunk), dtype=object), index.shard[chunk].astype(np.int32),
                           np.full(len(chunk), e, np.int64), np.arange(a, a + len(chunk), dtype=np.int64))

    return tf.data.Dataset.from_generator(gen, output_signature=(
        tf.TensorSpec((None,), tf.string), tf.TensorSpec((None,), tf.int32), tf.TensorSpec((None,), tf.int64),
        tf.TensorSpec((None,), tf.int64))).unbatch()


def _parse(record, shard, offset: int, classes: int, files):
    """(JPEG bytes, 0-based label) of a record; a label outside 0..classes-1 after the
    offset stops the pipeline with an error naming the record's shard (`files`: a
    string tensor of the index's shard paths)."""
    import tensorflow as tf
    f = tf.io.parse_single_example(record, {tfrecord.IMAGE_KEY: tf.io.FixedLenFeature([], tf.string),
                                            tfrecord.LABEL_KEY: tf.io.FixedLenFeature([], tf.int64)})
    raw = f[tfrecord.LABEL_KEY]
    label = raw - offset
    check = tf.debugging.Assert(
        (label >= 0) & (label < classes),
        ["ic: label", raw, "in", tf.gather(files, shard), outside(offset, classes)], summarize=1)
    with tf.control_dependencies([check]):
        return f[tfrecord.IMAGE_KEY], tf.identity(label)


def _normalise(image):
    import tensorflow as tf
    return (image - tf.constant(MEAN) * 255.0) / (tf.constant(STD) * 255.0)


def train_image(jpeg, side: int, seed):
    """Random resized crop + horizontal flip, drawn from the stateless seed (2,) int64."""
    import tensorflow as tf
    crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        tf.image.extract_jpeg_shape(jpeg), tf.constant([[[0.0, 0.0, 1.0, 1.0]]]), seed=crop_seed,
        min_object_covered=0.0, aspect_ratio_range=(3 / 4, 4 / 3), area_range=(0.08, 1.0),
        max_attempts=10, use_image_if_no_bounding_boxes=True)
    window = tf.stack([begin[0], begin[1], size[0], size[1]])
    image = tf.image.decode_and_crop_jpeg(jpeg, window, channels=3)  # decodes the crop only
    image = tf.image.resize(image, (side, side))
    image = tf.image.stateless_random_flip_left_right(image, flip_seed)
    return _normalise(image)


def val_image(jpeg, side: int):
    """The central CENTER_FRACTION square, resized to side x side."""
    import tensorflow as tf
    shape = tf.image.extract_jpeg_shape(jpeg)
    crop = tf.cast(CENTER_FRACTION * tf.cast(tf.minimum(shape[0], shape[1]), tf.float32), tf.int32)
    crop = tf.maximum(crop, 1)
    window = tf.stack([(shape[0] - crop) // 2, (shape[1] - crop) // 2, crop, crop])
    image = tf.image.decode_and_crop_jpeg(jpeg, window, channels=3)
    return _normalise(tf.image.resize(image, (side, side)))


def dataset(data: ICData, index: tfrecord.Index, rows, batch: int, *, augment: bool, seed: int = 0,
            drop_remainder: bool = True):
    """The tf.data pipeline of records `rows` of `index` (data.train or data.val), in
    order: the training transform if `augment`, else the validation one."""
    rows = checked_rows(index, rows, batch, drop_remainder)
    return _pipeline(data, index, lambda: (rows,), batch, augment=augment, seed=seed, drop_remainder=drop_remainder)


def _pipeline(data: ICData, index: tfrecord.Index, parts, batch: int, *, augment: bool, seed: int,
              drop_remainder: bool):
    """Records of the row arrays `parts()` yields, parsed, transformed, batched and
    prefetched. Training sample j of part e (a stream's epoch e) is augmented from the
    stateless seed (seed + e, j): deterministic, different in every epoch of a stream, the
    same where one part is that epoch's with seed + e (the undone warm-up's batches), or
    a stream starts at a later epoch with seed + that epoch (a model going on from its
    checkpoint: train.run)."""
    import tensorflow as tf
    side, offset, classes = data.side, data.label_offset, data.num_classes
    files = tf.constant([str(f) for f in index.files])
    ds = _records(index, parts).map(lambda r, s, e, j: (*_parse(r, s, offset, classes, files), e, j))
    if augment:
        base = tf.constant(seed % 2**63, tf.int64)
        ds = ds.map(lambda jpeg, label, e, j: (train_image(jpeg, side, tf.stack([base + e, j])), label),
                    num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    else:
        ds = ds.map(lambda jpeg, label, e, j: (val_image(jpeg, side), label),
                    num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return ds.batch(batch, drop_remainder=drop_remainder).prefetch(tf.data.AUTOTUNE)


def batches(data: ICData, rows, batch: int, *, training: bool, seed: int):
    """len(rows) // batch batches (x, y) of training samples `rows`, in that order;
    augmented if `training`, else the deterministic validation transform."""
    return iter(dataset(data, data.train, rows, batch, augment=training, seed=seed))


def stream(data: ICData, shards, epochs: int, batch: int, *, seed: int):
    """Every epoch's training batches from one pipeline (models.Model.stream):
    len(shards(e)) // batch augmented batches of epoch e = 0 .. epochs-1 in turn. One
    pipeline for the whole training, so none is built inside the clock after the first,
    the next epoch's first batches are decoded while this one's last steps run, and no
    pipeline is torn down between epochs (deleting an exhausted, autotuned tf.data
    iterator held a rank 8-9 s at 2 ranks a rank, measured: bench/README.md)."""
    parts = lambda: (checked_rows(data.train, shards(e), batch, True) for e in range(epochs))  # noqa: E731
    return iter(_pipeline(data, data.train, parts, batch, augment=True, seed=seed, drop_remainder=True))


# ---- evaluation -----------------------------------------------------------------------

def predict(model, data: ICData, rows: slice) -> np.ndarray:
    """Softmax probabilities (float32, computed in FP32) of validation rows `rows`:
    averaging them across base models is the mean aggregation; argmax, a vote."""
    idx = np.arange(data.n_val)[rows]
    batches = dataset(data, data.val, idx, EVAL_BATCH, augment=False, drop_remainder=False)
    return class_probabilities(model, (x for x, _ in batches), data.num_classes)
