"""Published data sets as they are (issue 16): Extreme Weather's box column order and
ImageNet's label base are decided from the data, not assumed.

The files here are written by helpers of this module with h5py and tf.train.Example
directly: they share no code with the synthetic generators (weather_synthetic.py,
tfrecord.example) nor with the reader's own column mapping, so a reader and a writer
that agree on a wrong convention cannot both pass."""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # Keras 2 API, before TensorFlow
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import h5py  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from harness.frameworks.tensorflow import ic as tf_ic  # noqa: E402
from harness.workloads import DataError, Dataset, ewa, ic  # noqa: E402
from harness.workloads import weather_synthetic  # noqa: E402
from tests.conftest import report_of, results  # noqa: E402

H, W = 32, 48                       # image height and width (the 768 x 1152 shape, scaled)
# Each order's columns, spelled out by hand: the page's, the authors' converter's, and
# their x-first twins; the class last in all.
COLUMNS = {"yxyxc": ("ymin", "xmin", "ymax", "xmax", "class"),
           "yyxxc": ("ymin", "ymax", "xmin", "xmax", "class"),
           "xyxyc": ("xmin", "ymin", "xmax", "ymax", "class"),
           "xxyyc": ("xmin", "xmax", "ymin", "ymax", "class")}
CHANNELS = ["PRECT", "PS", "PSL", "QREFHT", "T200", "T500", "TMQ", "TREFHT", "TS", "U850", "UBOT", "V850",
            "VBOT", "Z1000", "Z200", "ZBOT"]


@pytest.fixture(autouse=True)
def _no_settings(monkeypatch):
    for name in ("HPCAI500_EWA_BOX_ORDER", "HPCAI500_EWA_VAL", "HPCAI500_IC_LABEL_OFFSET"):
        monkeypatch.delenv(name, raising=False)


# ---- Extreme Weather: files written by hand ---------------------------------------

def truth(images: int, seed: int) -> list[list[tuple]]:
    """Per image, 1-2 boxes (class, ymin, xmin, ymax, xmax) in pixels; the first image
    also holds a long low band (x from 0.2 H to 1.4 H, y from 0.75 H to 0.95 H)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(images):
        boxes = [(3, 0.75 * H, 0.2 * H, 0.95 * H, 1.4 * H)] if i == 0 else []
        for _ in range(1 + i % 2):
            bh, bw = rng.uniform(6, 12), rng.uniform(8, 20)
            y0, x0 = rng.uniform(0, H - bh), rng.uniform(0, W - bw)
            boxes.append((int(rng.integers(4)), y0, x0, y0 + bh, x0 + bw))
        out.append(boxes)
    return out


def write_year(file, boxes: list[list[tuple]], order: str, slots: int = 3, seed: int = 0) -> None:
    """One file of the published layout: images (N, 16, H, W) float32, boxes (N, slots, 5)
    with each (class, ymin, xmin, ymax, xmax) written in the columns of `order`, rows
    of -1 after an image's last box."""
    rng = np.random.default_rng(seed)
    rows = np.full((len(boxes), slots, 5), -1, np.float32)
    for i, image in enumerate(boxes):
        for j, (c, ymin, xmin, ymax, xmax) in enumerate(image):
            value = {"class": c, "ymin": ymin, "xmin": xmin, "ymax": ymax, "xmax": xmax}
            rows[i, j] = [value[k] for k in COLUMNS[order]]
    with h5py.File(file, "w") as f:
        f["images"] = rng.normal(size=(len(boxes), 16, H, W)).astype(np.float32)
        f["boxes"] = rows


def write_set(folder, order: str, years=(2003, 2004, 2005), images: int = 4, boxes=None) -> list:
    """Year files climo_YYYY.h5 in `folder`, boxes in `order`; returns the boxes written."""
    os.makedirs(folder, exist_ok=True)
    written = []
    for k, year in enumerate(years):
        b = boxes[k] if boxes is not None else truth(images, seed=year)
        write_year(os.path.join(folder, f"climo_{year}.h5"), b, order, seed=year)
        written.append(b)
    return written


def as_rows(boxes: list[list[tuple]], slots: int = 3) -> np.ndarray:
    """What the reader must return: (class, ymin, xmin, ymax, xmax), padding (-1, 0, 0, 0, 0)."""
    out = np.tile(np.array([-1, 0, 0, 0, 0], np.float32), (len(boxes), slots, 1))
    for i, image in enumerate(boxes):
        out[i, :len(image)] = np.array(image, np.float32)
    return out


@pytest.mark.parametrize("order", list(COLUMNS))
def test_each_order_is_detected_and_reads_back_the_same_boxes(tmp_path, order):
    written = write_set(tmp_path, order)
    d = ewa.read(str(tmp_path), cache_dir=str(tmp_path / "cache"))
    assert d.box_order == order
    n_rows = sum(len(image) for year in written for image in year)
    assert d.box_order_how.startswith(f"detected from {n_rows} box rows of 3 files: of the readings "
                                      "yxyxc, yyxxc, xyxyc, xxyyc only this one")
    # every order reads back the very boxes written: the last year is validation
    assert np.array_equal(d.train_boxes, np.concatenate([as_rows(written[0]), as_rows(written[1])]))
    assert np.array_equal(d.val_boxes, as_rows(written[2]))
    boxes, channels, split = ewa.describe_data(d)
    assert boxes.startswith(f"box rows read as ({', '.join(COLUMNS[order])}) = {order}, detected from")
    assert channels == (f"channels in the files' order: {', '.join(CHANNELS)} "
                        "(the published order; the files carry no names)")
    assert split == ("split: validation climo_2005.h5 (the last file by name; HPCAI500_EWA_VAL names others), "
                     "training 2 files (climo_2003.h5 .. climo_2004.h5); the published set has no official split")


def test_ambiguous_rows_stop_before_training_and_the_setting_decides(tmp_path, monkeypatch):
    """Boxes with ymin < xmin < ymax < xmax <= H fit all four readings: no guess."""
    boxes = [[[(1, 2, 5, 8, 12)], [(0, 1, 3, 6, 9), (2, 10, 14, 20, 26)]]] * 2
    write_set(tmp_path / "data", "yxyxc", years=(1979, 1980), boxes=boxes)
    with pytest.raises(DataError) as e:
        ewa.load(Dataset.parse(str(tmp_path / "data")), str(tmp_path / "cache"))   # what the harness calls before training
    message = str(e.value)
    assert "cannot tell the column order of the box rows: 4 readings, yxyxc (ymin, xmin, ymax, xmax, class), " \
           "yyxxc (ymin, ymax, xmin, xmax, class)" in message
    assert "keep every one of the 6 box rows of 2 files inside the 32 x 48 images" in message
    assert "Sample rows: climo_1979.h5 image 0 box 0 [2, 5, 8, 12, 1]; " in message
    assert "climo_1980.h5 image 1 box 1 [10, 14, 20, 26, 2]" in message
    assert "set HPCAI500_EWA_BOX_ORDER to the files' column order" in message
    for order, first in (("yxyxc", [1, 2, 5, 8, 12]), ("yyxxc", [1, 2, 8, 5, 12])):
        monkeypatch.setenv("HPCAI500_EWA_BOX_ORDER", order)           # the setting decides
        d = ewa.read(str(tmp_path / "data"), cache_dir=str(tmp_path / "cache"))
        assert (d.box_order, d.box_order_how) == (order, "set by HPCAI500_EWA_BOX_ORDER")
        assert d.train_boxes[0, 0].tolist() == first
        assert ewa.describe_data(d)[0].endswith(f"= {order}, set by HPCAI500_EWA_BOX_ORDER")


def test_rows_fitting_no_reading_stop_before_training(tmp_path, monkeypatch):
    boxes = truth(3, seed=1)
    boxes[2] = [(2, 30, 40, 5, 45)]          # no reading puts this row inside a 32 x 48 image
    write_set(tmp_path, "yxyxc", years=(1979, 1980), boxes=[boxes, truth(2, seed=2)])
    with pytest.raises(DataError) as e:
        ewa.load(Dataset.parse(str(tmp_path)), str(tmp_path / "cache"))
    message = str(e.value)
    assert "no reading of the box rows keeps every box inside the 32 x 48 images with min < max (2 files)" in message
    assert "yxyxc (ymin, xmin, ymax, xmax, class): 1 of " in message
    assert "e.g. climo_1979.h5 image 2 box 0 [30, 40, 5, 45, 2]" in message
    for order in ("yyxxc", "xyxyc", "xxyyc"):
        assert f"; {order} (" in message
    assert "set HPCAI500_EWA_BOX_ORDER" in message
    monkeypatch.setenv("HPCAI500_EWA_BOX_ORDER", "yxyxc")   # set, the rows must still fit it
    with pytest.raises(DataError, match=r"climo_1979.h5: dataset 'boxes': image 2 box 0 .* is empty in box order "
                                        r"yxyxc"):
        ewa.read(str(tmp_path))


def test_a_bad_class_is_named_before_the_order_is_detected(tmp_path):
    boxes = truth(3, seed=1)
    boxes[1] = [(7, 1, 2, 5, 6)]
    write_set(tmp_path, "yyxxc", years=(1979, 1980), boxes=[boxes, truth(2, seed=2)])
    with pytest.raises(DataError, match=r"climo_1979.h5: dataset 'boxes': image 1 box 0: class must be -1 "
                                        r"\(padding\) or an integer in \[0, 4\), found 7 \(the class column"):
        ewa.read(str(tmp_path))


@pytest.mark.parametrize("order", list(COLUMNS))
def test_synthetic_sets_are_detected_as_written(tmp_path, order):
    """weather_synthetic's witness box makes any set, however small, decidable."""
    weather_synthetic.write_synthetic(str(tmp_path / "s"), 6, 32, order=order)
    d = ewa.read(str(tmp_path / "s"), cache_dir=str(tmp_path / "cache"))
    assert d.box_order == order and d.box_order_how.startswith("detected from")
    # the same scenes whatever the order: the boxes read back agree with the default's
    weather_synthetic.write_synthetic(str(tmp_path / "page"), 6, 32)
    page = ewa.read(str(tmp_path / "page"), cache_dir=str(tmp_path / "cache"))
    assert page.box_order == "yxyxc" and np.array_equal(d.train_boxes, page.train_boxes)


def test_synthetic_load_without_and_with_the_setting(tmp_path, monkeypatch):
    d = ewa.load(Dataset.parse("synthetic:10:32"), str(tmp_path))
    assert d.path.endswith("-yxyxc") and d.box_order == "yxyxc" and d.box_order_how.startswith("detected from")
    monkeypatch.setenv("HPCAI500_EWA_BOX_ORDER", "cyxyx")               # outside the candidates: set only
    d2 = ewa.load(Dataset.parse("synthetic:10:32"), str(tmp_path))
    assert d2.path.endswith("-cyxyx") and (d2.box_order, d2.box_order_how) == ("cyxyx", "set by HPCAI500_EWA_BOX_ORDER")
    assert np.array_equal(d2.train_boxes, d.train_boxes)


def test_channel_names_and_the_split_choices(tmp_path, monkeypatch):
    write_set(tmp_path, "yxyxc")
    monkeypatch.setenv("HPCAI500_EWA_VAL", "climo_2003.h5")
    d = ewa.read(str(tmp_path), cache_dir=str(tmp_path / "cache"))
    assert ewa.describe_data(d)[2] == ("split: validation climo_2003.h5 (set by HPCAI500_EWA_VAL), training 2 files "
                                       "(climo_2004.h5 .. climo_2005.h5); the published set has no official split")
    monkeypatch.delenv("HPCAI500_EWA_VAL")
    names = [n.lower() for n in CHANNELS]
    for name in os.listdir(tmp_path):
        if name.endswith(".h5"):
            with h5py.File(tmp_path / name, "a") as f:
                f["images"].attrs["variables"] = np.array(names, dtype=h5py.string_dtype())
    d = ewa.read(str(tmp_path), cache_dir=str(tmp_path / "cache"))
    assert d.channel_names == tuple(names)
    assert ewa.describe_data(d)[1] == f"channels in the files' order: {', '.join(names)} (as the files name them)"
    one = tmp_path / "one"
    one.mkdir()
    write_year(one / "all.h5", truth(5, seed=3), "xxyyc")
    d = ewa.read(str(one / "all.h5"), cache_dir=str(tmp_path / "cache"))
    assert d.box_order == "xxyyc" and d.box_order_how.startswith("detected from 8 box rows of 1 file:")
    assert ewa.describe_data(d)[2] == "split: validation = the last 20% of the images of all.h5 (1 of 5; one file)"


# ---- ImageNet: tensorflow/models' layout, written by hand -------------------------

def imagenet_example(label: int, k: int) -> bytes:
    """A record as build_imagenet_data.py's _convert_to_example writes it: every key."""
    import tensorflow as tf
    rgb = np.full((20, 24, 3), (37 * label + 11 * k) % 256, np.uint8)
    jpeg = tf.io.encode_jpeg(rgb).numpy()

    def b(v):
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[v]))

    def i(*v):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=list(v)))

    def f(*v):
        return tf.train.Feature(float_list=tf.train.FloatList(value=list(v)))

    synset = f"n{label:08d}".encode()
    feature = {"image/height": i(20), "image/width": i(24), "image/colorspace": b(b"RGB"), "image/channels": i(3),
               "image/class/label": i(label), "image/class/synset": b(synset),
               "image/class/text": b(b"class " + synset), "image/object/bbox/xmin": f(0.1),
               "image/object/bbox/xmax": f(0.9), "image/object/bbox/ymin": f(0.2), "image/object/bbox/ymax": f(0.8),
               "image/object/bbox/label": i(label), "image/format": b(b"JPEG"),
               "image/filename": b(f"{synset.decode()}_{k}.JPEG".encode()), "image/encoded": b(jpeg)}
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def write_imagenet(folder, train: list[list[int]], val: list[int]) -> None:
    """Shards train-0000i-of-0000n (one list of labels each) and validation-00000-of-00001."""
    import tensorflow as tf
    os.makedirs(folder, exist_ok=True)
    k = 0
    for name, labels in [(f"train-{s:05d}-of-{len(train):05d}", t) for s, t in enumerate(train)] + \
            [("validation-00000-of-00001", val)]:
        with tf.io.TFRecordWriter(os.path.join(folder, name)) as w:
            for label in labels:
                w.write(imagenet_example(label, k))
                k += 1


# the same 0-based classes, stored 1-based (tensorflow/models) and 0-based (other converters)
TRAIN0, VAL0 = [[4, 999, 2], [0, 7, 999]], [999, 0, 4, 7]


@pytest.mark.parametrize("base", [1, 0])
def test_imagenet_layout_in_either_label_base_reads_back_0_based(tmp_path, base):
    write_imagenet(tmp_path, [[y + base for y in s] for s in TRAIN0], [y + base for y in VAL0])
    d = ic.read(str(tmp_path))
    assert d.label_offset == base and d.num_classes == 1000
    assert list(d.y_val) == VAL0
    ys = np.concatenate([y for _, y in tf_ic.batches(d, np.arange(6), 3, training=False, seed=0)])
    assert list(ys) == TRAIN0[0] + TRAIN0[1]
    which = f"label {1000 if base else 0} occurs (validation-00000-of-00001)"
    assert ic.describe_data(d) == [
        f"labels {base}-based (detected: {which}): {base} subtracted, 1000 classes; decided from the 4 validation "
        "labels and the first record of each of 2 training shards"]


def test_a_subset_without_0_or_the_top_label_falls_back_to_1_and_says_so(tmp_path, monkeypatch):
    write_imagenet(tmp_path, [[3, 5], [4]], [5, 3])
    d = ic.read(str(tmp_path))
    assert d.label_offset == 1 and list(d.y_val) == [4, 2] and d.num_classes == 5
    assert ic.describe_data(d)[0].startswith(
        "labels 1-based (assumed: neither 0 nor 1000 among the labels read (3..5), so tensorflow/models' "
        "convention (1..1000, 0 unused) is taken; set HPCAI500_IC_LABEL_OFFSET=0 if the data is 0-based)")
    monkeypatch.setenv("HPCAI500_IC_LABEL_OFFSET", "0")                 # the override
    d = ic.read(str(tmp_path))
    assert d.label_offset == 0 and list(d.y_val) == [5, 3]
    assert ic.describe_data(d)[0].startswith("labels 0-based (set by HPCAI500_IC_LABEL_OFFSET=0): 0 subtracted")


def test_labels_outside_the_range_name_the_shard(tmp_path):
    write_imagenet(tmp_path / "both", [[1, 2]], [0, 1000])            # 0 and 1000: no base fits
    with pytest.raises(DataError, match=r"label 0 \(.*validation-00000-of-00001\) means 0-based, label 1000 "
                                        r"\(.*validation-00000-of-00001\) 1-based for 1000 classes; "
                                        r"set HPCAI500_IC_LABEL_OFFSET"):
        ic.read(str(tmp_path / "both"))
    write_imagenet(tmp_path / "high", [[1, 2], [1003, 5]], [1000, 3])  # 1-based; 1003 is a training shard's first
    with pytest.raises(DataError, match=r"high/train-00001-of-00002: label 1003 lies outside 1..1000, the labels "
                                        r"of 1000 classes 1-based \(detected: label 1000 occurs"):
        ic.read(str(tmp_path / "high"))
    # a record the load does not read (not first in its shard): the pipeline refuses it
    write_imagenet(tmp_path / "late", [[0, 2], [5, 1000]], [999, 3])
    d = ic.read(str(tmp_path / "late"))
    assert d.label_offset == 0 and d.num_classes == 1000
    import tensorflow as tf
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"label\] \[1000\] \[in\] \[\S*late/train-00001-of-00002\] \[lies outside 0..999"):
        list(tf_ic.batches(d, np.arange(4), 4, training=False, seed=0))


# ---- end to end: each order trains with no setting ---------------------------------

@pytest.mark.mpi
@pytest.mark.parametrize("order", ["yyxxc"])   # yxyxc, the synthetic set's: tests/test_ewa.py's end to end
def test_each_published_order_trains_with_no_setting(run_dat, tmp_path, order):
    write_set(tmp_path / "ew", order, years=(1998, 2000, 2001), images=4)
    # trained by PyTorch: the reader is the same for both frameworks (9 s alone with TensorFlow, 5.5 s)
    p = run_dat(2, l7="ewa", l8=str(tmp_path / "ew"), l9=1, l10=2, l11=1, l14=2, l15=2, l30=0, l35="pytorch")
    assert p.returncode == 0, p.stderr[-3000:]
    report = report_of(tmp_path / "runs")    # not stdout: mpirun's forwarding can lose bytes
    assert "...... PASSED" in report and "FAILED" not in report
    line = f"ewa: box rows read as ({', '.join(COLUMNS[order])}) = {order}, detected from 21 box rows of 3 files"
    assert f"- {line}" in report                                  # the report's conventions
    res = results(tmp_path / "runs")
    assert "HPCAI500_EWA_BOX_ORDER" not in res["settings"]
    assert any(c.startswith(line) for c in res["conventions"])
    assert "ewa: split: validation climo_2001.h5 (the last file by name" in "\n".join(res["conventions"])
    (t,) = res["tests"]
    assert (t["train_samples"], t["val_samples"]) == (8, 4) and t["consistency"]["passed"]
