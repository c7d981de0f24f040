"""The ic workload: TFRecord index and random access, the reader, synthetic data,
staging, ResNet-50 v1.5's FLOPs, the recipe, and a run under mpirun."""
import os
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # Keras 2 API, before TensorFlow
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from harness.frameworks.tensorflow import flops, resnet  # noqa: E402
from harness.frameworks.tensorflow import ic as tf_ic  # noqa: E402
from harness.workloads import DataError, Dataset, ic, tfrecord  # noqa: E402
from tests.conftest import HANG, report_of, results  # noqa: E402

# Hand-built data set: solid-colour JPEGs of assorted sizes, raw labels 1-based like
# the common converter. Solid colours survive JPEG almost exactly, so a decoded pixel
# tells which record was read.
COLOURS = [(250, 10, 10), (10, 250, 10), (10, 10, 250), (250, 250, 10), (10, 250, 250),
           (250, 10, 250), (128, 128, 128), (250, 250, 250), (60, 30, 200)]
SIZES = [(40, 48), (36, 36), (50, 30)]
RAW_LABELS = [1, 2, 3, 1, 2, 3, 2, 3, 1]
TRAIN_SHARDS, N_VAL = (4, 3), 2   # 7 training records in two shards, 2 validation in one


def _example(colour, size, label):
    img = np.broadcast_to(np.array(colour, np.uint8), (*size, 3))
    jpeg = tf.io.encode_jpeg(img, quality=95).numpy()
    feats = {"image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[jpeg])),
             "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label]))}
    return tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString()


@pytest.fixture
def handmade(tmp_path):
    """A directory in the ImageNet layout, written with TensorFlow's own writer."""
    recs = [_example(c, SIZES[i % 3], lab) for i, (c, lab) in enumerate(zip(COLOURS, RAW_LABELS))]
    k = 0
    layout = [("train", n, len(TRAIN_SHARDS)) for n in TRAIN_SHARDS] + [("validation", N_VAL, 1)]
    counts = {}
    for split, n, total in layout:
        i = counts[split] = counts.get(split, -1) + 1
        with tf.io.TFRecordWriter(str(tmp_path / f"{split}-{i:05d}-of-{total:05d}")) as w:
            for r in recs[k:k + n]:
                w.write(r)
        k += n
    return tmp_path, recs


def _colour(x):
    """Mean RGB (0..255) of normalised images (n, S, S, 3)."""
    return np.asarray(x).mean(axis=(1, 2)) * np.array(ic.STD) * 255 + np.array(ic.MEAN) * 255


# ---- TFRecord index and random access ----------------------------------------------

def test_index_matches_tensorflows_reader(handmade):
    path, recs = handmade
    files = tfrecord.list_shards(str(path), "train")
    assert [os.path.basename(f) for f in files] == ["train-00000-of-00002", "train-00001-of-00002"]
    index = tfrecord.build_index(files)
    assert len(index) == 7 and list(index.shard) == [0] * 4 + [1] * 3
    assert index.nbytes == 16 * 7
    theirs = [r.numpy() for r in tf.data.TFRecordDataset(files)]
    with tfrecord.Reader(index) as r:
        assert r.records(range(7)) == theirs == recs[:7]
    with tfrecord.Reader(index) as r:    # one shard open at a time: shards closed and reopened
        r.open_max = 1
        assert r.records([6, 0, 5, 1, 4]) == [theirs[k] for k in (6, 0, 5, 1, 4)]
    # framing: each record's data starts 12 bytes after the previous one's 4-byte CRC
    first = index.offset[index.shard == 1]
    assert first[0] == 12 and all(np.diff(first) == index.length[index.shard == 1][:-1] + 16)


def test_crc_matches_tensorflow_writer(handmade):
    path, _ = handmade
    with open(path / "train-00000-of-00002", "rb") as f:
        head = np.frombuffer(f.read(12), np.uint8)
    assert tfrecord.masked_crc32c(head[None, :8])[0] == head[8:].view("<u4")[0]


def test_a_frame_is_what_tensorflows_writer_writes(tmp_path, monkeypatch):
    """CRC-32C's published check value: crc("123456789") = 0xE3069283, masked as TFRecord
    masks (rotated right 15, + 0xA282EAD8) here from the definition; the crc32c package
    and the numpy table agree, and a framed record is byte for byte TFRecordWriter's."""
    crc = 0xE3069283
    masked = (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF
    assert tfrecord.masked_crc32c_of(b"123456789") == masked
    monkeypatch.setitem(sys.modules, "crc32c", None)             # the fallback: the numpy table
    assert tfrecord.masked_crc32c_of(b"123456789") == masked
    monkeypatch.delitem(sys.modules, "crc32c")
    with tf.io.TFRecordWriter(str(tmp_path / "theirs")) as w:
        w.write(b"abc" * 100)
    assert (tmp_path / "theirs").read_bytes() == tfrecord.frame(b"abc" * 100)


def test_example_codec_by_hand_and_against_tensorflows_protos():
    """{"a": [1]}: Int64List packed (0A 01 01) in Feature field 3 (1A 03 ...), the map
    entry's key (0A 01 61) and value (12 05 ...), Features field 1 (0A 0A ...), Example
    field 1 (0A 0C ...): 14 bytes. Then both directions against TensorFlow's protos, the
    unpacked forms another writer may use, and damaged bytes."""
    assert tfrecord.encode_example({"a": [1]}) == bytes.fromhex("0A0C 0A0A 0A0161 1205 1A03 0A0101")
    feats = {"image/encoded": [b"\xff\xd8jpeg", b""], "y": np.array([0.5, -1.25, 3e38], np.float32),
             "label": [7, -2, 2 ** 40]}
    ours = tfrecord.encode_example(feats)
    theirs = tf.train.Example.FromString(ours).features.feature
    assert list(theirs["image/encoded"].bytes_list.value) == feats["image/encoded"]
    assert list(theirs["y"].float_list.value) == list(feats["y"])
    assert list(theirs["label"].int64_list.value) == feats["label"]
    back = tfrecord.parse_example(tf.train.Example(features=tf.train.Features(feature=theirs)).SerializeToString())
    assert back["image/encoded"] == feats["image/encoded"] and back["label"].tolist() == feats["label"]
    assert back["y"].dtype == np.float32 and back["y"].tolist() == feats["y"].tolist()
    # unpacked: "x" a float_list of one fixed32 1.0 (0D 0000803F), 16 bytes in all;
    # "n" an int64_list of the varints 3 and 4 (08 03 08 04), 15 bytes in all
    assert tfrecord.parse_example(bytes.fromhex("0A0E 0A0C 0A0178 1207 1205 0D0000803F"))["x"].tolist() == [1.0]
    assert tfrecord.parse_example(bytes.fromhex("0A0D 0A0B 0A016E 1206 1A04 08030804"))["n"].tolist() == [3, 4]
    for bad in (ours[:-3], b"\x0a\xff", b"\x0b"):
        with pytest.raises(ValueError, match="not a tf.train.Example"):
            tfrecord.parse_example(bad)


def test_reader_labels_shapes_and_pixels(handmade, monkeypatch):
    path, _ = handmade
    data = ic.read(str(path), cache_dir=str(path / "cache"))
    assert (data.n_train, data.n_val, data.side, data.num_classes) == (7, 2, 224, 3)
    # neither 0 nor 1000 among labels 1..3: the converter's 1-based labels assumed, and said
    assert data.label_offset == 1 and data.label_how.startswith("assumed: neither 0 nor 1000")
    assert list(data.y_val) == [r - 1 for r in RAW_LABELS[7:]] and data.y_val.dtype == np.int64
    (x, y), = list(tf_ic.batches(data, np.arange(7), 7, training=False, seed=0))
    assert x.shape == (7, 224, 224, 3) and x.dtype == tf.float32 and y.dtype == tf.int64
    assert list(y.numpy()) == [r - 1 for r in RAW_LABELS[:7]]
    assert np.allclose(_colour(x), COLOURS[:7], atol=4)   # RGB order, right record, right normalisation
    monkeypatch.setenv("HPCAI500_IC_LABEL_OFFSET", "0")   # 0-based labels: nothing subtracted
    raw = ic.read(str(path), cache_dir=str(path / "cache"))
    assert list(raw.y_val) == RAW_LABELS[7:] and raw.num_classes == 4
    (_, y0), = list(tf_ic.batches(raw, np.arange(7), 7, training=False, seed=0))
    assert list(y0.numpy()) == RAW_LABELS[:7]


def test_bootstrap_rows_with_repeats(handmade):
    path, _ = handmade
    data = ic.read(str(path))
    rows = np.array([3, 0, 3, 6, 6, 1, 5, 3])
    got = list(tf_ic.batches(data, rows, 3, training=False, seed=0))
    assert len(got) == 2                                   # 8 // 3: the remainder is dropped
    x = np.concatenate([b[0] for b in got])
    y = np.concatenate([b[1] for b in got])
    assert list(y) == [RAW_LABELS[r] - 1 for r in rows[:6]]
    assert np.allclose(_colour(x), [COLOURS[r] for r in rows[:6]], atol=4)


def test_index_is_cached_and_invalidated(handmade):
    path, _ = handmade
    cache = path / "cache"
    ic.read(str(path), cache_dir=str(cache))
    (file,) = cache.glob("ic-index-*.npz")
    assert set(np.load(file).files) >= {"train_offset", "val_label"}
    ic.read(str(path), cache_dir=str(cache))
    assert list(cache.glob("ic-index-*.npz")) == [file]     # hit: nothing new
    with open(path / "train-00001-of-00002", "ab") as f:     # a changed shard is re-indexed
        f.write(b"\0" * 20)
    with pytest.raises(DataError, match="train-00001-of-00002"):
        ic.read(str(path), cache_dir=str(cache))


@pytest.mark.parametrize("damage", ["truncate", "length-crc", "missing-shard"])
def test_damaged_shards_name_the_file(handmade, damage):
    path, _ = handmade
    shard = path / "train-00001-of-00002"
    raw = bytearray(shard.read_bytes())
    if damage == "truncate":
        shard.write_bytes(raw[:-30])
        match = "train-00001-of-00002: truncated"
    elif damage == "length-crc":
        raw[9] ^= 0xFF                                     # the first record's length CRC
        shard.write_bytes(raw)
        match = "train-00001-of-00002: corrupt TFRecord"
    else:
        shard.unlink()
        match = "train shards are incomplete"
    with pytest.raises(DataError, match=match):
        ic.read(str(path))


def test_bad_labels_and_missing_data_are_data_errors(handmade, tmp_path, monkeypatch):
    path, _ = handmade
    monkeypatch.setenv("HPCAI500_IC_LABEL_OFFSET", "2")      # raw label 1 - 2 = -1
    with pytest.raises(DataError, match=r"validation-00000-of-00001: label 1 lies outside 2..1001, the labels of "
                                        r"1000 classes 2-based \(set by HPCAI500_IC_LABEL_OFFSET=2\)"):
        ic.read(str(path))
    (path / "validation-00000-of-00001").unlink()
    with pytest.raises(DataError, match="no validation shards"):
        ic.read(str(path))
    with pytest.raises(DataError, match="not a directory"):
        ic.read(str(path / "nowhere"))
    with pytest.raises(DataError, match="no embedded data set.*synthetic"):
        ic.load(Dataset.parse("embedded"), str(tmp_path))


# ---- synthetic data and staging -----------------------------------------------------

@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    return ic.load(Dataset.parse("synthetic:300:24"), str(cache)), cache


def test_synthetic_round_trip(synthetic):
    data, cache = synthetic
    path = cache / "ic-synthetic-300-24"
    assert data.path == str(path) and data.source == "synthetic:300:24"
    assert ic.describe_data(data) == ["labels 1-based (recorded in hpcai500-ic.json, written with the data by hpcai500): "
                                      "1 subtracted, 10 classes; decided from the 60 validation labels and the "
                                      "first record of each of 2 training shards"]
    assert (data.n_train, data.n_val, data.side, data.num_classes) == (240, 60, 24, 10)
    labels = np.array([lab for _, lab in tfrecord.synthetic_images(300, 24, 10, 2024)])
    assert list(data.y_val) == list(labels[:60])             # validation first, then train
    y = np.concatenate([b[1] for b in tf_ic.batches(data, np.arange(240), 40, training=False, seed=0)])
    assert list(y) == list(labels[60:])
    assert len(list(path.glob("train-*-of-00002"))) == 2     # 128 records a shard
    mtime = os.path.getmtime(path / "train-00000-of-00002")
    again = ic.load(Dataset.parse("synthetic:300:24"), str(cache))          # written once, then read
    assert again.n_train == 240 and os.path.getmtime(path / "train-00000-of-00002") == mtime
    assert not list(cache.glob("*.tmp*"))


def test_synthetic_default_and_224_px(tmp_path):
    ic.write_synthetic(str(tmp_path / "big"), 5, 224)
    data = ic.read(str(tmp_path / "big"))
    assert (data.n_train, data.n_val, data.side) == (4, 1, 224)
    (x, _), = list(tf_ic.batches(data, [0, 1, 3, 2], 4, training=True, seed=1))
    assert x.shape == (4, 224, 224, 3)
    assert ic.SYNTHETIC_DEFAULT == (640, 32) and ic.SYNTHETIC_CLASSES == 10


def test_loading_leaves_tensorflow_unstarted(tmp_path):
    """The harness loads data before it pins TensorFlow's threads, which only works
    while TensorFlow's runtime has not started: load, read and stage run no TF op
    (ic's; and the other workloads' loads)."""
    import subprocess
    import sys
    code = ("import numpy as np, tensorflow as tf\n"
            "from harness.workloads import Dataset, digits, ewa, ic\n"
            f"d = ic.load(Dataset.parse('synthetic:20:16'), {str(tmp_path)!r})\n"
            f"ic.stage(d, np.arange(3), {str(tmp_path / 'copy')!r}); ic.read({str(tmp_path / 'copy')!r})\n"
            f"digits.load(Dataset.parse('embedded'), ''); ewa.load(Dataset.parse('synthetic:10:64'), {str(tmp_path)!r})\n"
            "tf.config.threading.set_intra_op_parallelism_threads(1)\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=os.path.dirname(os.path.dirname(__file__)),
                       capture_output=True, text=True, timeout=HANG)
    assert p.returncode == 0, p.stderr[-2000:]


def test_augmentation_is_seeded(synthetic):
    data, _ = synthetic
    rows = np.arange(32)
    def run(seed):
        return np.concatenate([b[0] for b in tf_ic.batches(data, rows, 16, training=True, seed=seed)])
    a, b, c = run(7), run(7), run(8)
    assert a.shape == (32, 24, 24, 3) and np.array_equal(a, b) and not np.array_equal(a, c)
    plain = np.concatenate([b[0] for b in tf_ic.batches(data, rows, 16, training=False, seed=0)])
    assert not np.array_equal(a, plain)                       # crops and flips did something
    assert abs(float(plain.mean())) < 1.0 and 0.3 < float(plain.std()) < 2.0   # normalised


def test_the_numpy_feed_reads_the_records_tf_data_reads(handmade):
    """ic.numpy_batches (PyTorch's feed, Pillow in threads): the same labels, the same
    colours in RGB order and normalisation, the validation transform's pixels within a
    few levels of tf.data's (the two bilinear resizes differ at edges only: solid
    colours), bootstrap repeats and the dropped remainder as batches()."""
    path, _ = handmade
    data = ic.read(str(path))
    rows = np.array([3, 0, 3, 6, 6, 1, 5, 3])
    ours = list(ic.numpy_batches(data, data.train, rows, 3, augment=False, workers=2))
    theirs = list(tf_ic.batches(data, rows, 3, training=False, seed=0))
    assert len(ours) == len(theirs) == 2
    for (x, y), (tx, ty) in zip(ours, theirs):
        assert x.shape == (3, 224, 224, 3) and x.dtype == np.float32 and y.dtype == np.int64
        assert list(y) == list(ty.numpy())
        assert np.allclose(_colour(x), _colour(tx.numpy()), atol=1)
    assert np.allclose(_colour(np.concatenate([x for x, _ in ours])), [COLOURS[r] for r in rows[:6]], atol=4)
    (last,) = list(ic.numpy_batches(data, data.val, [1], 4, augment=False, drop_remainder=False))
    assert list(last[1]) == [RAW_LABELS[8] - 1]


def test_the_numpy_feeds_augmentation_is_seeded_whatever_the_threads(synthetic):
    data, _ = synthetic
    rows = np.arange(32)
    def run(seed, workers):
        return np.concatenate([b[0] for b in ic.numpy_batches(data, data.train, rows, 8, augment=True, seed=seed,
                                                                 workers=workers)])
    a, b, c = run(7, 1), run(7, 3), run(8, 2)
    assert a.shape == (32, 24, 24, 3) and np.array_equal(a, b) and not np.array_equal(a, c)
    plain = np.concatenate([b[0] for b in ic.numpy_batches(data, data.train, rows, 8, augment=False)])
    assert not np.array_equal(a, plain)
    assert abs(float(plain.mean())) < 1.0 and 0.3 < float(plain.std()) < 2.0


def test_random_crop_draws_as_tensorflows_box_sampler():
    """Area 8-100 %, aspect 3/4-4/3, inside the image; a 1 x 40 image fits no crop in 10
    draws (every aspect needs at least 2 pixels of height at 8 % of 40): the whole image."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        left, top, right, bottom = ic._random_crop(rng, 64, 48)
        w, h = right - left, bottom - top
        assert 0 <= left < right <= 64 and 0 <= top < bottom <= 48
        assert 0.07 * 64 * 48 <= w * h <= 64 * 48 and 0.7 < w / h < 1.4
    assert ic._random_crop(rng, 40, 1) == (0, 0, 40, 1)


def test_stream_feeds_every_epoch_from_one_pipeline(synthetic):
    """TensorFlow's ic.stream: epoch e's rows, whole batches only, in turn; shards drawn
    lazily; the same sample is augmented differently in each epoch, and the stream is seeded."""
    data, _ = synthetic
    epochs = {0: np.array([5, 1, 5, 7, 2]), 1: np.array([2, 2, 9, 0, 3]), 2: np.array([4, 6])}
    asked = []
    def shards(e):
        asked.append(e)
        return epochs[e]
    feed = tf_ic.stream(data, shards, 3, 2, seed=11)
    assert asked == []                                       # nothing drawn before the first batch
    got = list(feed)
    assert asked == [0, 1, 2] and len(got) == 2 + 2 + 1      # 5 rows -> 2 batches, 2 rows -> 1
    labels = np.concatenate([y for _, y in got])
    rows = [5, 1, 5, 7, 2, 2, 9, 0, 4, 6]
    assert list(labels) == list(next(tf_ic.batches(data, rows, 10, training=False, seed=0))[1])
    x = np.concatenate([x for x, _ in got])
    assert not np.array_equal(x[0], x[2])                    # row 5 twice in epoch 1: two draws
    again = np.concatenate([x for x, _ in tf_ic.stream(data, lambda e: epochs[e], 3, 2, seed=11)])
    assert np.array_equal(x, again)


def test_a_stream_started_at_a_later_epoch_draws_as_the_whole_stream_did(synthetic):
    """A model going on from its checkpoint streams epochs 1.. with seed + 1 (train.run): the
    same augmented batches as those epochs of the whole stream; the undone warm-up's batches
    (seed, epoch 0's rows) are the whole stream's first."""
    data, _ = synthetic
    epochs = {0: np.array([5, 1, 5, 7]), 1: np.array([2, 2, 9, 0]), 2: np.array([4, 6, 3, 3])}
    whole = np.concatenate([x for x, _ in tf_ic.stream(data, lambda e: epochs[e], 3, 2, seed=11)])
    later = np.concatenate([x for x, _ in tf_ic.stream(data, lambda e: epochs[e + 1], 2, 2, seed=12)])
    assert whole.shape[0] == 12 and np.array_equal(whole[4:], later)
    first = np.concatenate([x for x, _ in tf_ic.batches(data, epochs[0], 2, training=True, seed=11)])
    assert np.array_equal(whole[:4], first)


def test_stage_copies_exactly_the_rows(synthetic, tmp_path):
    data, _ = synthetic
    rows = np.unique(np.random.default_rng(0).integers(0, data.n_train, data.n_train))
    nbytes = ic.stage(data, rows, str(tmp_path / "stage"))
    shards = [p for p in (tmp_path / "stage").iterdir() if p.name.startswith(("train-", "validation-"))]
    assert nbytes == sum(p.stat().st_size for p in shards)
    copy = ic.read(str(tmp_path / "stage"))
    assert (copy.n_train, copy.n_val, copy.side, copy.num_classes) == (len(rows), 60, 24, 10)
    assert list(copy.y_val) == list(data.y_val)
    with tfrecord.Reader(data.train) as src, tfrecord.Reader(copy.train) as dst:
        assert dst.records(range(len(rows))) == src.records(rows)    # byte for byte, in order
    y_src = np.concatenate([b[1] for b in tf_ic.batches(data, rows, len(rows), training=False, seed=0)])
    y_dst = np.concatenate([b[1] for b in tf_ic.batches(copy, np.arange(len(rows)), len(rows),
                                                        training=False, seed=0)])
    assert list(y_src) == list(y_dst)
    # the staged index was written by stage, not rebuilt: read found it by its key
    assert len(list((tmp_path / "stage").glob("ic-index-*.npz"))) == 1
    # staging again into the same place replaces the old copy
    ic.stage(data, rows[:10], str(tmp_path / "stage"))
    assert ic.read(str(tmp_path / "stage")).n_train == 10
    with pytest.raises(ValueError, match="sorted, unique"):
        ic.stage(data, rows[::-1], str(tmp_path / "bad"))


# ---- model, recipe, evaluation -------------------------------------------------------

def test_resnet50_v1_5_flops():
    """Analytic Table 3 count against TensorFlow's profiler (same graph), and against
    the paper's APC, which is ResNet-50 v1's: v1.5's stride on the 3x3 costs ~6 % more."""
    v15 = resnet.build((224, 224, 3), 1000)
    c = flops.count(v15)
    trainable = sum(int(np.prod(v.shape)) for v in v15.trainable_variables)
    assert trainable == 25_557_032          # ResNet-50 without conv biases (as torchvision's)
    assert c.forward == pytest.approx(flops.profiler_flops(v15, (224, 224, 3)), rel=0.02)
    assert c.training * 512 == pytest.approx(12_603e9, rel=0.002)       # v1.5 (measured)
    assert f"{c.training / 1e9:.2f} GFLOPs" in ic.REFERENCE_NOTE            # what the report says
    v1 = flops.count(resnet.build((224, 224, 3), 1000, v1_5=False))
    assert v1.training * 512 == pytest.approx(11_776e9, rel=0.02)       # the paper's figure
    assert c.by_operator["convolution"] / v1.by_operator["convolution"] == pytest.approx(1.06, abs=0.005)
    # PyTorch's twin (harness/frameworks/pytorch/ic.py), counted on the meta device: the same
    # count by operator and the same weights (batch-norm statistics included in both)
    torch = pytest.importorskip("torch")
    from harness.frameworks.pytorch import flops as torch_flops, ic as torch_ic
    with torch.device("meta"):
        twin = torch_flops.count(torch_ic.resnet_v1_5(1000), torch.zeros(1, 3, 224, 224))
    assert twin.by_operator == c.by_operator and twin.weights == c.weights == 25_610_152


def test_model_regularizers_and_init(synthetic):
    data, _ = synthetic
    model = resnet.build((24, 24, 3), 10, weight_decay=ic.WEIGHT_DECAY, width=8, stages=(1, 1, 1, 1))
    kernels = [l.kernel for l in model.layers if isinstance(l, (tf.keras.layers.Conv2D, tf.keras.layers.Dense))]
    assert len(model.losses) == len(kernels) == 4 * 4 + 1 + 1   # 3 convs + shortcut a stage, stem, logits
    expected = ic.WEIGHT_DECAY / 2 * sum(float(tf.reduce_sum(k ** 2)) for k in kernels)  # l2 = wd / 2
    assert float(tf.add_n(model.losses)) == pytest.approx(expected, rel=1e-5)
    last_bn = [l for l in model.layers if l.name.endswith("_3_bn")]
    assert len(last_bn) == 4 and all(float(tf.reduce_max(tf.abs(l.gamma))) == 0 for l in last_bn)
    assert model.get_layer("conv3_block1_2_conv").strides == (2, 2)         # v1.5
    assert model.get_layer("conv3_block1_1_conv").strides == (1, 1)
    a, b = model.get_layer("conv2_block1_1_conv").kernel, model.get_layer("conv2_block1_3_conv").kernel
    assert a.shape[:2] == b.shape[:2] == (1, 1) and not np.array_equal(a[0, 0, :8, :8], b[0, 0, :8, :8])
    x_spec, y_spec = tf_ic.input_signature(data, 8)
    assert x_spec.shape == (8, 24, 24, 3) and y_spec.shape == (8,) and y_spec.dtype == tf.int64


def test_loss_is_smoothed_cross_entropy():
    logits = tf.constant([[2.0, 0.0, -1.0], [0.0, 0.0, 0.0]])
    y = tf.constant([0, 2], tf.int64)
    got = tf_ic.loss(y, logits).numpy()
    logp = tf.nn.log_softmax(logits).numpy()
    target = np.eye(3)[[0, 2]] * 0.9 + 0.1 / 3
    assert got.shape == (2,) and np.allclose(got, -(target * logp).sum(1), atol=1e-6)
    assert got[1] == pytest.approx(np.log(3))


def test_predict_and_quality(synthetic, monkeypatch):
    data, _ = synthetic
    monkeypatch.setenv("HPCAI500_IC_WIDTH", "8")
    monkeypatch.setenv("HPCAI500_IC_STAGES", "1,1,1,1")
    model = tf_ic.build_model(data)
    assert model.count_params() < 200_000 and ic.score_width(data) == 10
    full = tf_ic.predict(model, data, slice(0, data.n_val))
    part = tf_ic.predict(model, data, slice(5, 17))
    assert full.shape == (60, 10) and full.dtype == np.float32
    assert np.allclose(full.sum(1), 1, atol=1e-5) and np.allclose(part, full[5:17], atol=1e-6)
    onehot = np.eye(10, dtype=np.float32)[data.y_val]
    assert ic.quality(onehot, data) == 1.0
    onehot[:15] = np.roll(onehot[:15], 1, axis=1)
    assert ic.quality(onehot, data) == pytest.approx(45 / 60)


# ---- end to end ------------------------------------------------------------------------

@pytest.mark.slow
def test_ic_trains_under_mpirun(sweep_runs):
    """Bagging (M=2, P=1) and data parallelism (M=1, P=2) in one run on 2 ranks, then
    M=1, P=2 again with staging (the shared runs of tests/conftest.py; tests/test_staging.py
    reads them too)."""
    folder, a, b = sweep_runs
    assert a.returncode == 0, a.stderr[-3000:]
    report = report_of(folder / "runs")    # what the harness wrote: mpirun's forwarding of stdout can lose bytes
    assert report.count("...... PASSED") == 2 and "FAILED" not in report
    tests = results(folder / "runs")["tests"]
    assert [(t["workload"], t["index"], t["M"], t["P"]) for t in tests] == [("ic", 1, 2, 1), ("ic", 2, 1, 2)]
    for t in tests:
        assert t["consistency"]["passed"]
        # learnt: 10 classes, chance 0.1. Measured 0.86 (M=2) and 0.80 (P=2) on an Intel Xeon, 0.78 and
        # 0.53 on an AMD EPYC (each the same on every run there: the CPU's kernels set the path)
        assert t["quality"] > 0.3
    assert (folder / "runs" / ".data" / "ic-synthetic-320-32" / "hpcai500-ic.json").exists()

    # M=1, P=2 again, trained from a node-local copy (line 28): ic.stage writes it, both
    # ranks read it with ic.read
    assert b.returncode == 0, b.stderr[-3000:]
    assert report_of(folder / "staged").count("...... PASSED") == 1
    (t,) = results(folder / "staged")["tests"]
    assert t["staging"]["copies"] == 1 and t["staging"]["bytes"] > 0
    assert list((folder / "stage").iterdir()) == []          # no 'keep': removed after each test
    # same records, same positions, same seeds: the same training, bit for bit (measured,
    # three times: the same weights digest on both ranks and in both runs, and the same
    # quality, 0.796875 = 51/64). The copy renumbers the rows but feeds the very batches,
    # and each rank's kernels run the same sums in the same order: a difference is a bug.
    assert t["weights_digest"] == tests[1]["weights_digest"]
    assert t["quality"] == tests[1]["quality"]
