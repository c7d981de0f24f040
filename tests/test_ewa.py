"""The ewa workload (Extreme Weather Analytics, Faster-RCNN): box math and mAP by hand,
the on-disk format and its errors, the model's training step, predictions, fusion of
several models' detections, the analytic FLOPs of the ROI head, and a run under mpirun."""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # Keras 2 API, before TensorFlow
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import h5py  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from harness.workloads import DataError, Dataset, ewa, weather_synthetic  # noqa: E402
from harness.workloads import extreme_weather as ew  # noqa: E402
from harness.workloads import detection as det  # noqa: E402
from tests.conftest import report_of, results  # noqa: E402


def box(*b):
    return np.array(b, np.float64)


# ---- box math ---------------------------------------------------------------------

def test_iou_by_hand():
    a = np.array([[0, 0, 2, 2], [0, 0, 2, 2]], float)
    b = np.array([[1, 1, 3, 3], [0, 0, 2, 2], [5, 5, 6, 6], [1, 1, 1, 3]], float)
    # overlap 1, union 4 + 4 - 1; identical; disjoint; zero-area
    assert np.allclose(det.iou(a, b), [[1 / 7, 1, 0, 0]] * 2)
    assert det.iou(a, b).shape == (2, 4)


def test_encode_decode_by_hand_and_round_trip():
    ref = np.array([[0, 0, 10, 10]], float)
    # centre moved by 2 px = 0.2 of the reference size, size unchanged: 0.2 / 0.1 = 2
    assert np.allclose(det.encode(np.array([[2, 2, 12, 12]], float), ref), [[2, 2, 0, 0]])
    # height doubled about the same centre: log(2) / 0.2
    assert np.allclose(det.encode(np.array([[-5, 0, 15, 10]], float), ref), [[0, 0, np.log(2) / 0.2, 0]])
    assert np.allclose(det.encode(np.array([[-5, 0, 15, 10]], float), ref, scale=det.RPN_SCALE),
                       [[0, 0, np.log(2), 0]])
    rng = np.random.default_rng(0)

    def random_boxes():
        ys, xs = np.sort(rng.uniform(0, 100, (2, 50, 2)), axis=2)
        return np.stack([ys[:, 0], xs[:, 0], ys[:, 1], xs[:, 1]], 1)

    refs, boxes = random_boxes(), random_boxes()
    assert np.allclose(det.decode(det.encode(boxes, refs), refs), boxes, atol=1e-6)


def test_anchors_by_hand():
    a = det.anchors((1, 2), 8, sizes=[4], ratios=[1.0, 4.0])
    # position-major: (0, 0) square, (0, 0) tall (h = 4 x 2, w = 4 / 2), then (0, 1)
    assert np.allclose(a, [[2, 2, 6, 6], [0, 3, 8, 5], [2, 10, 6, 14], [0, 11, 8, 13]])


# ---- mAP@0.5 ------------------------------------------------------------------------

def test_greedy_nms_by_hand():
    """Boxes in order of score: 0 and 1 overlap at IoU 0.6, 2 overlaps 1 only (IoU 0.6),
    3 stands alone. Threshold 0.5: 0 kept, 1 suppressed by 0, 2 kept (its only overlap, 1,
    was not kept), 3 kept; max_out 2 stops after 0 and 2. IoU exactly at the threshold
    is not suppressed (TensorFlow's rule: above)."""
    over = np.array([[1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 0], [0, 0, 0, 1]], bool)
    assert det.greedy_keep(over, 10).tolist() == [0, 2, 3]
    assert det.greedy_keep(over, 2).tolist() == [0, 2]
    assert det.greedy_keep(np.zeros((0, 0), bool), 3).tolist() == []
    b = np.array([[0, 0, 10, 10], [0, 0, 10, 5]], np.float64)           # IoU 0.5 exactly
    assert det.greedy_keep(det.iou(b, b) > 0.5, 5).tolist() == [0, 1]


def test_map_perfect_detector_is_one():
    gts = [np.array([[0, 0, 0, 10, 10], [3, 20, 20, 30, 60]]), np.array([[1, 5, 5, 9, 9]])]
    dets = [np.column_stack([g[:, :1], np.full(len(g), 0.5), g[:, 1:]]) for g in gts]
    assert det.mean_average_precision(dets, gts, 4) == 1.0


def test_map_known_precision_recall_curve():
    # one class, 3 boxes in 2 images; in score order: TP, FP, TP, FP, TP
    # precision 1, 1/2, 2/3, 2/4, 3/5 at recall 1/3, 1/3, 2/3, 2/3, 1;
    # envelope 1, 2/3, 3/5 -> AP = (1 + 2/3 + 3/5) / 3
    g0, g1, g2 = box(0, 0, 10, 10), box(20, 20, 30, 30), box(0, 0, 8, 8)
    gts = [np.array([[0, *g0], [0, *g1]]), np.array([[0, *g2]])]
    far = box(50, 50, 60, 60)
    dets = [np.array([[0, 0.9, *g0], [0, 0.8, *far], [0, 0.5, *g1]]),
            np.array([[0, 0.7, *g2], [0, 0.6, *far]])]
    assert det.mean_average_precision(dets, gts, 4) == pytest.approx((1 + 2 / 3 + 3 / 5) / 3)


def test_map_duplicates_are_false_positives_and_classes_average():
    a, b = box(0, 0, 10, 10), box(20, 20, 30, 30)
    gts = [np.array([[0, *a], [0, *b], [1, *a]])]
    # class 0: TP, duplicate (FP), TP -> precision 1, 1/2, 2/3 at recall 1/2, 1/2, 1
    # class 1: never detected -> AP 0; class 2: absent from the truth -> not averaged
    dets = [np.array([[0, 0.9, *a], [0, 0.8, *a], [0, 0.7, *b], [2, 0.99, *b]])]
    ap0 = 0.5 * 1 + 0.5 * 2 / 3
    assert det.mean_average_precision(dets, gts, 4) == pytest.approx((ap0 + 0.0) / 2)


def test_map_iou_threshold_is_inclusive():
    gts = [np.array([[0, 0, 0, 10, 10]])]
    for xmax, expected in ((20, 1.0), (19, 1.0), (21, 0.0)):  # IoU 0.5, 0.53, 0.48
        assert det.mean_average_precision([np.array([[0, 0.9, 0, 0, 10, xmax]])], gts, 4) == expected


# ---- fusion of M models -------------------------------------------------------------

def test_fuse_one_model_is_identity():
    d = np.array([[0, 0.9, 0, 0, 10, 10], [0, 0.5, 5, 5, 15, 15], [3, 0.7, 0, 0, 10, 10]])
    # boxes 0 and 1 overlap at IoU 25/175: a model's NMS kept both, fusion keeps both
    out = det.fuse([d])
    assert np.allclose(sorted(map(tuple, out)), sorted(map(tuple, d)))


def test_fuse_averages_over_models():
    m1 = np.array([[0, 0.8, 0, 0, 10, 10], [1, 0.6, 40, 40, 50, 50]])
    m2 = np.array([[0, 0.6, 0, 0, 10, 12], [1, 0.3, 0, 0, 10, 10]])
    out = det.fuse([m1, m2])
    out = out[np.lexsort((out[:, 2], out[:, 0]))]
    # class 0: both models -> score (0.8 + 0.6) / 2, box weighted by score
    assert np.allclose(out[0], [0, 0.7, 0, 0, 10, (0.8 * 10 + 0.6 * 12) / 1.4])
    # class 1: two different objects, each found by 1 of 2 models -> score / 2
    assert np.allclose(out[1], [1, 0.15, 0, 0, 10, 10]) and np.allclose(out[2], [1, 0.3, 40, 40, 50, 50])
    assert len(det.fuse([np.zeros((0, 6)), np.zeros((0, 6))])) == 0
    # capped at a base model's count (2): the highest fused scores, 0.7 and 0.3, stay
    capped = det.fuse([m1, m2], keep=2)
    assert capped[:, 1].tolist() == [0.7, 0.3] and capped[1, 2:].tolist() == [40, 40, 50, 50]


def test_the_ensemble_keeps_no_more_boxes_than_a_base_model(monkeypatch):
    """Two models of K = 1 box each, finding different true objects: the fused list
    keeps one box (the better), so the ensemble cannot gain mAP by recall alone."""
    seen = []
    monkeypatch.setattr(det, "mean_average_precision", lambda fused, truth, classes, iou_threshold: seen.extend(fused))
    data = type("D", (), {"n_val": 1, "val_boxes": np.array([[[0, 0, 0, 10, 10], [0, 20, 20, 30, 30]]], float)})()
    scores = np.array([[[0, 0.9, 0, 0, 10, 10], [0, 0.8, 20, 20, 30, 30]]])   # (n_val, M = 2, K x 6 = 6)
    ewa.quality(scores, data)
    assert len(seen[0]) == 1 and seen[0][0, 1] == pytest.approx(0.45)


def test_packed_rows_drop_padding_and_non_finite():
    flat = np.zeros(4 * 6)
    flat[:6] = [2, 0.4, 1, 2, 3, 4]
    flat[6:12] = [1, np.nan, 1, 2, 3, 4]
    assert det.rows(flat).tolist() == [[2, 0.4, 1, 2, 3, 4]]


# ---- data --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return ewa.load(Dataset.parse("synthetic:40:32"), str(tmp_path_factory.mktemp("ewa")))


def test_synthetic_round_trip(data):
    """The synthetic set is written in the published layout (per-year files, channels
    first, box rows in the default order) and read back by the one reader; the
    statistics are computed at the first read and cached beside the data."""
    folder = data.path
    assert os.path.basename(folder) == f"ewa-synthetic-v{weather_synthetic.FORMAT_VERSION}-40-32-yxyxc"
    assert (data.n_train, data.n_val, data.height, data.width) == (32, 8, 32, 48)
    years = sorted(f for f in os.listdir(folder) if f.endswith(".h5"))
    assert years == [f"climo_{y}.h5" for y in range(1979, 1984)]
    with h5py.File(os.path.join(folder, "climo_1983.h5")) as f:  # the last year: validation
        assert f["images"].shape == (8, 16, 32, 48) and f["images"].dtype == np.float32
        assert f["boxes"].shape == (8, 3, 5) and "channel_mean" not in f
        raw, first = f["boxes"][...], f["images"][0]
    real = raw[..., 4] >= 0
    assert np.array_equal(data.val_boxes[..., 0], np.where(real, raw[..., 4], -1))
    assert np.array_equal(data.val_boxes[real][:, 1:], raw[real][:, :4])
    assert (raw[~real] == -1).all()                           # padding rows: all -1
    assert np.array_equal(data.images("val", [0])[0], first.transpose(1, 2, 0))
    (stats,) = [f for f in os.listdir(folder) if f.startswith("ewa-stats-")]
    assert stats == ew.stats_name(data)
    # renamed into place whole (no `done` marker); the harness's marker of who wrote it, inside before the rename
    assert sorted(os.listdir(folder)) == sorted([*years, stats, "hpcai500-ewa.json"])
    again = ewa.read(folder)
    assert np.array_equal(again.val_boxes, data.val_boxes) and np.array_equal(again.mean, data.mean)
    # statistics of the training images (normalised: ~0, ~1)
    x = data.normalised("train", slice(0, 32))
    assert np.allclose(x.mean((0, 1, 2)), 0, atol=1e-3) and np.allclose(x.std((0, 1, 2)), 1, atol=1e-3)
    boxes = np.concatenate([data.train_boxes, data.val_boxes])
    per_image = (boxes[..., 0] >= 0).sum(1)
    assert per_image.min() >= 1 and per_image.max() <= 3
    real = boxes[boxes[..., 0] >= 0]
    assert set(real[:, 0]) == {0, 1, 2, 3}
    assert (real[:, 1] >= 0).all() and (real[:, 4] <= 48).all() and (real[:, 3] > real[:, 1]).all()
    # no setting: the order is detected from the rows, as written (the page's); each
    # year's first image holds the witness river, low and reaching past x = height
    assert data.box_order == "yxyxc"
    assert data.box_order_how.startswith(f"detected from {len(real)} box rows of 5 files")
    starts = np.cumsum([0] + [p.count for p in data.parts["train"]])[:-1]
    first = data.train_boxes[starts, 0]                        # each training year's first box
    assert (first[:, 0] == 3).all() and (first[:, 2] < first[:, 1]).all() and (first[:, 4] > 32).all()


def test_synthetic_objects_are_where_their_boxes_are(data):
    """At a box's centre (a vortex's core, a river's axis) the channels of the box's
    class carry its signature; at other images' same points they do not."""
    x = data.normalised("train", slice(0, data.n_train))
    at_object, elsewhere = [], []
    for i, boxes in enumerate(data.train_boxes):
        for c, y0, x0, y1, x1 in boxes[boxes[:, 0] >= 0]:
            channels, signs = weather_synthetic.SIGNATURE[int(c)]
            cy, cx = int((y0 + y1) / 2), int((x0 + x1) / 2)
            at_object.append(np.mean(x[i, cy, cx, list(channels)] * signs))
            elsewhere.append(np.mean(x[(i + 1) % len(x), cy, cx, list(channels)] * signs))
    assert np.mean(at_object) > 1.0 and abs(np.mean(elsewhere)) < 0.5


def test_only_node_rank_zero_writes(tmp_path):
    with pytest.raises(DataError, match="no such file or directory"):
        ewa.load(Dataset.parse("synthetic:20:32"), str(tmp_path), node_rank=1)
    with pytest.raises(DataError, match="no embedded data set"):
        ewa.load(Dataset.parse("embedded"), str(tmp_path))
    with pytest.raises(DataError, match="SIDE .* must be at least 32"):
        ewa.load(Dataset.parse("synthetic:20:16"), str(tmp_path))


def test_batches_flip_images_and_boxes_together(data):
    rows = np.array([3, 1, 3, 0, 2])  # the workload's feed: numpy arrays (TensorFlow's prefetch: below)  # bootstrap rows repeat and come in any order
    plain = list(ewa.batches(data, rows, 2, training=False, seed=0))
    assert len(plain) == 2
    (x, gt), y = plain[0]
    assert x.shape == (2, 32, 48, 16) and x.dtype == np.float32 and gt is y
    assert np.array_equal(y, data.train_boxes[[3, 1]])
    assert np.allclose(x[0], data.normalised("train", [3])[0])
    flips = 0
    for ((xa, ya), _), ((xb, yb), _) in zip(ewa.batches(data, rows, 2, training=True, seed=5), plain):
        for i in range(2):
            if np.array_equal(xa[i], xb[i]):
                assert np.array_equal(ya[i], yb[i])
                continue
            flips += 1
            assert np.array_equal(xa[i], xb[i][:, ::-1])
            real = yb[i][:, 0] >= 0
            assert np.allclose(ya[i][real, 2], 48 - yb[i][real, 4])
            assert np.allclose(ya[i][real, 4], 48 - yb[i][real, 2])
    assert flips > 0
    again = list(ewa.batches(data, rows, 2, training=True, seed=5))  # seeded
    assert all(np.array_equal(a[0][0], b[0][0]) for a, b in zip(again, ewa.batches(data, rows, 2, training=True, seed=5)))


def test_prefetch_feeds_the_same_batches(data, monkeypatch):
    """TensorFlow's feed of ewa: the workload's batches, read ahead by tf.data where
    HPCAI500_EWA_PREFETCH asks it."""
    from harness.frameworks.tensorflow import ewa as tf_ewa
    rows = np.array([3, 1, 3, 0, 2, 7])
    plain = list(ewa.batches(data, rows, 2, training=True, seed=4))
    monkeypatch.setenv("HPCAI500_EWA_PREFETCH", "0")
    assert all(np.array_equal(a[1], b[1]) for a, b in zip(plain, tf_ewa.batches(data, rows, 2, training=True,
                                                                                seed=4)))
    monkeypatch.setenv("HPCAI500_EWA_PREFETCH", "2")
    fed = list(tf_ewa.batches(data, rows, 2, training=True, seed=4))
    assert len(fed) == len(plain) == 3
    for ((x, gt), y), ((fx, fgt), fy) in zip(plain, fed):
        assert np.array_equal(x, fx.numpy()) and np.array_equal(gt, fgt.numpy()) and np.array_equal(y, fy.numpy())


def test_stage_writes_the_resample_in_our_layout(data, tmp_path):
    rows = np.array([0, 2, 5, 31])
    written = ewa.stage(data, rows, str(tmp_path / "copy"))
    assert written == sum(os.path.getsize(tmp_path / "copy" / f) for f in ("train.h5", "val.h5"))
    with h5py.File(tmp_path / "copy" / "train.h5") as f:     # channels last, class first
        assert f["images"].shape == (4, 32, 48, 16) and f.attrs["split"] == "train"
    copy = ewa.read(str(tmp_path / "copy"))
    assert (copy.n_train, copy.n_val) == (4, data.n_val)
    assert np.array_equal(copy.train_boxes, data.train_boxes[rows])
    assert np.array_equal(copy.images("train", slice(0, 4)), data.images("train", rows))
    assert np.array_equal(copy.mean, data.mean) and np.array_equal(copy.std, data.std)
    assert np.array_equal(copy.val_boxes, data.val_boxes)
    assert not [f for f in os.listdir(tmp_path / "copy") if f.startswith("ewa-stats")]  # stored, not computed


def test_box_order_by_hand():
    # columns of (class, ymin, xmin, ymax, xmax)
    assert ew.box_columns("yxyxc") == ew.box_columns("yxyx") == [4, 0, 1, 2, 3]
    assert ew.box_columns("xyxyc") == [4, 1, 0, 3, 2]
    assert ew.box_columns("cyxyx") == [0, 1, 2, 3, 4]
    assert ew.box_columns("yyxxc") == [4, 0, 2, 1, 3]
    assert ew.order_names("yyxxc") == "(ymin, ymax, xmin, xmax, class)"
    assert ew.order_names("cyxyx") == "(class, ymin, xmin, ymax, xmax)"
    raw = np.array([[10, 20, 30, 40, 3], [-1, -1, -1, -1, -1]], np.float32)  # x0 y0 x1 y1 c
    rows = ew.to_rows(raw, "xyxyc")
    assert rows.tolist() == [[3, 20, 10, 40, 30], [-1, 0, 0, 0, 0]]
    assert np.array_equal(ew.from_rows(rows, "xyxyc"), raw)
    for bad in ("yxy", "yxyxcc", "yxzxc"):
        with pytest.raises(ValueError, match="two y, two x and at most one c"):
            ew.box_columns(bad)


def _write(path, images=None, boxes=None):
    with h5py.File(path, "w") as f:
        if images is not None:
            f["images"] = images
        if boxes is not None:
            f["boxes"] = boxes


def _published(tmp_path, order="yxyxc"):
    """Two hand-built year files of 3 + 2 images of 8 x 12: channel c of image i is
    10 i + c plus a ramp along x; one box per image, written in `order`."""
    ramp = np.arange(12, dtype=np.float32)
    cols = ew.box_columns(order)
    files = {}
    for name, first, n in (("climo_2000.h5", 0, 3), ("climo_2001.h5", 3, 2)):
        images = np.zeros((n, 16, 8, 12), np.float32)
        boxes = np.full((n, 2, 5), -1, np.float32)
        for k in range(n):
            i = first + k
            images[k] = (10 * i + np.arange(16))[:, None, None] + ramp
            boxes[k, 0, cols] = [i % 4, 1, 2, 5, 3 + i]      # class, ymin, xmin, ymax, xmax
        _write(tmp_path / name, images, boxes)
        files[name] = images
    return files


@pytest.mark.parametrize("order", ["yxyxc", "xyxyc", "cyxyx"])
def test_reader_on_hand_built_published_files(tmp_path, monkeypatch, order):
    monkeypatch.setenv("HPCAI500_EWA_BOX_ORDER", order)
    files = _published(tmp_path, order)
    d = ewa.read(str(tmp_path), cache_dir=str(tmp_path / "cache"))
    assert (d.box_order, d.box_order_how) == (order, "set by HPCAI500_EWA_BOX_ORDER")
    assert (d.n_train, d.n_val, d.height, d.width, d.max_boxes) == (3, 2, 8, 12, 2)  # last year: validation
    assert d.train_boxes[:, 0].tolist() == [[0, 1, 2, 5, 3], [1, 1, 2, 5, 4], [2, 1, 2, 5, 5]]
    assert d.val_boxes[:, 0].tolist() == [[3, 1, 2, 5, 6], [0, 1, 2, 5, 7]]
    assert (d.train_boxes[:, 1] == [-1, 0, 0, 0, 0]).all()
    x = d.images("val", [1, 0, 1])                           # channels last, in the asked order
    assert x.shape == (3, 8, 12, 16)
    assert np.array_equal(x[0], files["climo_2001.h5"][1].transpose(1, 2, 0)) and np.array_equal(x[0], x[2])
    assert np.array_equal(d.images("train", slice(1, 3)), files["climo_2000.h5"][1:].transpose(0, 2, 3, 1))
    # statistics over the training images, cached beside the data, read back next time
    train = files["climo_2000.h5"].transpose(0, 2, 3, 1).reshape(-1, 16)
    assert np.allclose(d.mean, train.mean(0)) and np.allclose(d.std, train.std(0), rtol=1e-5)
    assert os.path.exists(tmp_path / ew.stats_name(d))
    np.savez(tmp_path / ew.stats_name(d), mean=np.full(16, 7.0), std=np.full(16, 2.0))
    assert (ewa.read(str(tmp_path)).mean == 7.0).all()       # the cache is what is used


def test_normalised_reads_normalises_and_mirrors_in_one_pass(tmp_path, monkeypatch):
    """Data.normalised, hand-computed: with mean 7 and std 2 in the statistics cache,
    image i, channel c, column x of _published is (10 i + c + x - 7) / 2. The same
    values from the published files (channels first) and from our staged copy
    (channels last), and bit for bit those of normalising images() in float32."""
    monkeypatch.setenv("HPCAI500_EWA_BOX_ORDER", "yxyxc")
    _published(tmp_path)
    d = ewa.read(str(tmp_path))
    np.savez(tmp_path / ew.stats_name(d), mean=np.full(16, 7.0), std=np.full(16, 2.0))
    d = ewa.read(str(tmp_path))
    x = d.normalised("val", [1, 0, 1], flip=[False, False, True])  # val images are i = 3, 4
    assert x.shape == (3, 8, 12, 16) and x.dtype == np.float32
    assert x[0, 5, 0, 3] == (40 + 3 + 0 - 7) / 2 == 18.0
    assert x[1, 0, 4, 15] == (30 + 15 + 4 - 7) / 2 == 21.0
    assert x[2, 5, 0, 3] == (40 + 3 + 11 - 7) / 2 == 23.5      # mirrored: column 0 holds column 11
    assert np.array_equal(x[2], x[0][:, ::-1])
    raw = d.images("val", [1, 0]).astype(np.float32)
    assert np.array_equal(x[:2], (raw - d.mean) * (np.float32(1.0) / d.std))
    ewa.stage(d, np.array([0, 2]), str(tmp_path / "copy"))
    copy = ewa.read(str(tmp_path / "copy"))
    assert np.array_equal(copy.normalised("val", [1, 0, 1], flip=[False, False, True]), x)
    assert np.array_equal(copy.normalised("train", [1, 0], flip=[True, False]),
                          d.normalised("train", [2, 0], flip=[True, False]))
    assert d.normalised("train", []).shape == (0, 8, 12, 16)


def test_reader_split_options_and_unwritable_data_directory(tmp_path, monkeypatch):
    _published(tmp_path)
    # these few small boxes also fit the x-first reading (xyxyc): the setting decides
    monkeypatch.setenv("HPCAI500_EWA_BOX_ORDER", "yxyxc")
    monkeypatch.setenv("HPCAI500_EWA_VAL", "climo_2000.h5")
    d = ewa.read(str(tmp_path), cache_dir=str(tmp_path / "cache"))
    assert (d.n_train, d.n_val) == (2, 3) and d.val_boxes[:, 0, 0].tolist() == [0, 1, 2]
    monkeypatch.setenv("HPCAI500_EWA_VAL", "climo_1999.h5")
    with pytest.raises(DataError, match="no file 'climo_1999.h5' in .* climo_2000.h5, climo_2001.h5"):
        ewa.read(str(tmp_path))
    monkeypatch.delenv("HPCAI500_EWA_VAL")
    # one file: its last VAL_FRACTION of images are the validation set (5 -> 4 + 1)
    one = tmp_path / "one"
    one.mkdir()
    with h5py.File(tmp_path / "climo_2000.h5", locking=False) as a, \
            h5py.File(tmp_path / "climo_2001.h5", locking=False) as b:
        _write(one / "all.h5", np.concatenate([a["images"][...], b["images"][...]]),
               np.concatenate([a["boxes"][...], b["boxes"][...]]))
    d = ewa.read(str(one / "all.h5"), cache_dir=str(tmp_path / "cache"))
    assert (d.n_train, d.n_val) == (4, 1) and d.val_boxes[0, 0].tolist() == [0, 1, 2, 5, 7]
    # the data's directory refuses the cache file (root ignores permissions, so a
    # directory sits on its name): the statistics go to the cache directory instead
    name = ew.stats_name(d)
    os.remove(one / name)
    (one / name).mkdir()
    (one / name / "x").touch()
    d2 = ewa.read(str(one / "all.h5"), cache_dir=str(tmp_path / "cache"))
    assert os.path.isfile(tmp_path / "cache" / name) and np.allclose(d2.mean, d.mean)
    assert sorted(os.listdir(one)) == ["all.h5", name]       # no temporary file left behind


@pytest.mark.parametrize("case,message", [
    ("missing-dir", "nowhere': no such file or directory"),
    ("empty-dir", "no HDF5 files"),
    ("no-boxes", "climo_2000.h5: no dataset 'boxes'"),
    ("channels", "climo_2000.h5: dataset 'images' must be (N, 16, H, W), channels first"),
    ("channels-last", "climo_2000.h5: dataset 'images' must be (N, 16, H, W), channels first"),
    ("count", "climo_2000.h5: dataset 'boxes' must be (N, G, 5) with N = 4"),
    ("class", "climo_2000.h5: dataset 'boxes': image 2 box 1: class must be -1 (padding) or an integer in [0, 4), found 7"),
    ("empty-box", "climo_2000.h5: dataset 'boxes': image 1 box 0"),
    ("outside", "climo_2000.h5: dataset 'boxes': image 2 box 0 [20.0, 1.0, 30.0, 5.0, 0.0] lies outside the 16 x 24 image"),
    ("sizes", "files hold images of different sizes"),
    ("truncated-head", "climo_2000.h5: cannot open as HDF5"),
    ("truncated-data", "climo_2000.h5: cannot open as HDF5 (Unable to synchronously open file (truncated file"),
    ("corrupt-chunk", "climo_2000.h5: dataset 'images': cannot read the last image"),
    ("val-no-truth", "have no boxes"),
    ("mixed", "mixes files written by stage()"),
])
def test_bad_data_names_file_dataset_and_problem(tmp_path, monkeypatch, case, message):
    # the order set: these few square boxes fit several readings (detection: tests/test_datasets.py)
    monkeypatch.setenv("HPCAI500_EWA_BOX_ORDER", "yxyxc")
    images = np.zeros((4, 16, 16, 24), np.float32)
    boxes = np.full((4, 2, 5), -1, np.float32)
    boxes[:, 0] = [1, 1, 5, 5, 0]                     # yxyxc
    _write(tmp_path / "climo_2001.h5", images[..., :20] if case == "sizes" else images,
           np.full_like(boxes, -1) if case == "val-no-truth" else boxes)
    train = tmp_path / "climo_2000.h5"
    bad = boxes.copy()
    if case == "class":
        bad[2, 1] = [1, 1, 5, 5, 7]
    if case == "empty-box":
        bad[1, 0, 2] = 1  # ymax == ymin
    if case == "outside":
        bad[2, 0] = [20, 1, 30, 5, 0]  # below the image
    if case == "mixed":  # a well-formed file of our layout: class first
        bad = bad[..., [4, 0, 1, 2, 3]]
    shaped = {"channels": images[:, :3], "channels-last": np.zeros((4, 12, 24, 16), np.float32),
              "mixed": images.transpose(0, 2, 3, 1)}.get(case, images)
    if case in ("truncated-data", "corrupt-chunk"):
        with h5py.File(train, "w") as f:
            f["boxes"] = bad
            f.create_dataset("images", data=images + 1, chunks=(1, 16, 16, 24), compression="gzip")
            last = f["images"].id.get_chunk_info(3)  # the last image's compressed bytes
        with open(train, "r+b") as f:
            if case == "truncated-data":  # HDF5 itself refuses the file at open
                f.truncate(train.stat().st_size - 100)
            else:
                f.seek(last.byte_offset + 10)
                f.write(b"\xff" * 20)
    else:
        _write(train, shaped, None if case == "no-boxes" else bad[:3] if case == "count" else bad)
    if case == "truncated-head":
        train.write_bytes(train.read_bytes()[:2000])
    if case == "mixed":
        with h5py.File(train, "a") as f:
            f.attrs["hpcai500_ewa"] = "channels_last"
            f.attrs["split"] = "train"
    if case == "empty-dir":
        os.remove(train)
        os.remove(tmp_path / "climo_2001.h5")
    path = tmp_path / "nowhere" if case == "missing-dir" else tmp_path
    with pytest.raises(DataError) as err:
        ewa.read(str(path))
    assert message in str(err.value)


# ---- model -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def model(data):
    import tensorflow as tf
    from harness.frameworks.tensorflow import ewa as tf_ewa
    tf.keras.utils.set_random_seed(3)
    return tf_ewa.build_model(data)


def test_training_steps_overfit_two_images(data, model):
    import tensorflow as tf

    from harness.frameworks.tensorflow import ewa as tf_ewa
    (x, gt), y = tf.nest.map_structure(np.asarray, next(ewa.batches(data, np.arange(2), 2, training=False)))
    out = model((x, gt), training=True)
    cfg = ewa.config(data)
    a = len(cfg.anchors())
    shapes = {k: tuple(v.shape) for k, v in out.items()}
    assert shapes == {"rpn_logits": (2, a), "rpn_deltas": (2, a, 4), "anchors": (2, a, 4),
                      "rois": (2, cfg.rois, 4), "cls_logits": (2, cfg.rois, 5), "box_deltas": (2, cfg.rois, 4),
                      "rpn_noise": (2, a), "roi_noise": (2, cfg.rois)}    # the loss's sampling draws
    assert 0 < float(tf.reduce_min(out["rpn_noise"])) and float(tf.reduce_max(out["roi_noise"])) < 1
    assert not np.any(model((x, gt), training=False)["rpn_noise"])     # evaluation draws nothing
    # training puts the ground truth among the ROIs
    assert np.allclose(out["rois"][0, -3:][y[0, :, 0] >= 0], y[0, y[0, :, 0] >= 0, 1:])
    opt = tf.keras.optimizers.SGD(0.02, momentum=0.9)

    @tf.function
    def step(x, gt, y):
        with tf.GradientTape() as tape:
            per_sample = tf_ewa.loss(y, tf.nest.map_structure(lambda t: tf.cast(t, tf.float32),
                                                              model((x, gt), training=True)))
            loss = tf.reduce_mean(per_sample)
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return per_sample

    losses = [step(x, gt, y).numpy() for _ in range(30)]
    assert losses[0].shape == (2,) and np.isfinite(losses).all()
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[0])


def test_predict_shapes_and_ranges(data, model):
    from harness.frameworks.tensorflow import ewa as tf_ewa
    s = tf_ewa.predict(model, data, slice(2, 7))
    k = ewa.config(data).detections
    assert s.shape == (5, ewa.score_width(data)) == (5, 6 * k)
    rows = s.reshape(5, k, 6)
    real = rows[..., 1] > 0
    assert real.any()
    assert np.isin(rows[real][:, 0], [0, 1, 2, 3]).all() and (rows[real][:, 1] <= 1).all()
    assert (rows[..., 2:][real] >= 0).all() and (rows[real][:, 4] <= 32).all() and (rows[real][:, 5] <= 48).all()
    assert (rows[~real] == 0).all()
    assert (np.diff(rows[..., 1], axis=1) <= 1e-6).all()  # best first
    assert np.allclose(tf_ewa.predict(model, data, slice(4, 5)), s[2:3], atol=1e-5)  # batch-independent


def _packed(per_image, k):
    """Detections per image ((n, 6) rows) as predict packs them: (images, K x 6)."""
    out = np.zeros((len(per_image), k, 6))
    for i, d in enumerate(per_image):
        out[i, :len(d)] = d
    return out.reshape(len(per_image), -1)


def _as_detections(boxes, score):
    b = boxes[boxes[:, 0] >= 0]
    return np.column_stack([b[:, 0], np.full(len(b), score), b[:, 1:]])


def test_quality_of_ground_truth_and_of_fused_models(data):
    k = ewa.config(data).detections
    truth = _packed([_as_detections(b, 0.9) for b in data.val_boxes], k)
    assert ewa.quality(truth[:, None], data) == 1.0
    assert ewa.quality(truth, data) == 1.0                        # 2-D: one model
    assert ewa.quality(np.stack([truth, np.zeros_like(truth)], 1), data) == 1.0  # found by 1 of 2
    # model 1 also reports a confident false box per object (far off): alone it ranks
    # them above its true boxes; averaged with model 2, which does not, they fall below
    noisy = []
    for b in data.val_boxes:
        far = _as_detections(b, 0.95)
        far[:, 2:] += 1000.0
        noisy.append(np.concatenate([_as_detections(b, 0.9), far]))
    noisy = _packed(noisy, k)
    assert ewa.quality(noisy[:, None], data) < 0.8
    assert ewa.quality(np.stack([noisy, truth], 1), data) == 1.0


# ---- FLOPs -------------------------------------------------------------------------

def test_flops_count_the_roi_head_once_per_roi(data):
    """The head is Dense layers on (batch, R, features): Table 3 counts it R times.
    Two models that differ only in R differ by (R2 - R1) x the head's FLOPs by hand."""
    import dataclasses

    from harness.frameworks.tensorflow import faster_rcnn, flops
    cfg = ewa.config(data)
    counts = {r: flops.count(faster_rcnn.build(dataclasses.replace(cfg, rois=r))) for r in (16, 48)}
    c = cfg.widths[-1] * cfg.pool ** 2
    # per ROI: 2 x 2 max pooling to pool x pool; fc6, fc7 (+ bias, ReLU); class and box layers
    head = (c + (2 * c * cfg.fc + 2 * cfg.fc) + (2 * cfg.fc * cfg.fc + 2 * cfg.fc)
            + (2 * cfg.fc * 5 + 5) + (2 * cfg.fc * 4 + 4))
    assert counts[48].forward - counts[16].forward == 32 * head
    assert counts[48].by_operator["dense"] - counts[16].by_operator["dense"] == 32 * 2 * cfg.fc * (c + cfg.fc + 9)
    assert counts[48].by_operator["pooling"] - counts[16].by_operator["pooling"] == 32 * c


def test_flops_backbone_and_rpn_agree_with_the_profiler(model):
    """The image path up to the RPN against TensorFlow's profiler: convolutions match;
    we also count ReLU and batch norm (Table 3), which the profiler does not."""
    import tensorflow as tf

    from harness.frameworks.tensorflow import flops
    sub = tf.keras.Model(model.inputs[0], [model.get_layer("rpn_cls").output, model.get_layer("rpn_box").output])
    ours, theirs = flops.count(sub), flops.profiler_flops(sub)
    assert 0 < ours.forward - theirs < 0.01 * theirs   # +0.4 %: ReLU and batch norm
    assert ours.forward - ours.by_operator["normalization"] - ours.by_operator["elementwise"] <= theirs


def test_the_trunk_every_port_builds_by_hand():
    """detector.trunk, the one description of the backbone the three ports build: the small
    one of widths (32, 64), a block each, stride 2 on each block's first 3 x 3 (the first
    block keeps 32 channels: no projection); ResNet-50's stem 7 x 7 / 2 and a max pool, 3 + 4
    + 6 bottlenecks, 64 -> 256 at stride 1 first, stride 2 at the first of conv3's and conv4's
    (on the 3 x 3: v1.5), 1024 channels out."""
    from harness.workloads import detector
    stem, pool, blocks = detector.trunk(detector.Config(32, 48, 3, backbone="small"))
    assert (stem, pool) == ((32, 3, 2), False)
    assert blocks == [(32, 32, 2, [(32, 32, 3, 2, True), (32, 32, 3, 1, False)]),
                      (32, 64, 2, [(32, 64, 3, 2, True), (64, 64, 3, 1, False)])]
    stem, pool, blocks = detector.trunk(detector.Config(768, 1152, 15))
    assert (stem, pool, len(blocks)) == ((64, 7, 2), True, 13)
    assert blocks[0] == (64, 256, 1, [(64, 64, 1, 1, True), (64, 64, 3, 1, True), (64, 256, 1, 1, False)])
    assert blocks[3] == (256, 512, 2, [(256, 128, 1, 1, True), (128, 128, 3, 2, True), (128, 512, 1, 1, False)])
    assert [b[2] for b in blocks] == [1, 1, 1, 2, 1, 1, 1, 2, 1, 1, 1, 1, 1] and blocks[-1][1] == 1024


def test_backbone_choice_and_resnet50_trunk(monkeypatch):
    """ResNet-50 at full size, the small backbone below 384 px, HPCAI500_EWA_BACKBONE
    overriding; the ResNet-50 trunk is conv1 to conv4 (43 convolutions: stem, 13
    bottlenecks of 3, 3 projections), stride 16, 1024 features; its FLOPs agree with
    the profiler's."""
    import tensorflow as tf

    from harness.frameworks.tensorflow import faster_rcnn, flops
    from harness.workloads import detector
    assert detector.config_for(768, 1152, 15).backbone == "resnet50"
    assert detector.config_for(96, 144, 3).backbone == "small"
    monkeypatch.setenv("HPCAI500_EWA_BACKBONE", "small")
    assert detector.config_for(768, 1152, 15).backbone == "small"
    monkeypatch.setenv("HPCAI500_EWA_BACKBONE", "vgg16")
    with pytest.raises(ValueError, match="HPCAI500_EWA_BACKBONE='vgg16'"):
        detector.config_for(768, 1152, 15)
    monkeypatch.setenv("HPCAI500_EWA_BACKBONE", "resnet50")
    cfg = detector.config_for(64, 96, 3)
    assert (cfg.backbone, cfg.stride, cfg.feature_hw) == ("resnet50", 16, (4, 6))
    model = faster_rcnn.build(cfg)
    features = model.get_layer("rpn_conv").input
    assert tuple(features.shape[1:]) == (4, 6, 1024)
    convs = [l for l in model.layers if isinstance(l, tf.keras.layers.Conv2D) and not l.name.startswith("rpn")]
    assert len(convs) == 43 and convs[0].kernel_size == (7, 7) and convs[0].kernel.shape[2] == 16
    sub = tf.keras.Model(model.inputs[0], [model.get_layer("rpn_cls").output, model.get_layer("rpn_box").output])
    ours, theirs = flops.count(sub), flops.profiler_flops(sub)
    assert abs(ours.forward - theirs) < 0.01 * theirs


def test_anchors_include_elongated_ones_for_rivers(data):
    from harness.workloads import detector
    for cfg in (ewa.config(data), detector.config_for(768, 1152, 15)):
        a = cfg.anchors()
        ratio = (a[:, 3] - a[:, 1]) / (a[:, 2] - a[:, 0])    # width / height
        assert np.isclose(ratio, 4).any() and np.isclose(ratio, 2).any()
    assert np.isclose(ratio, 0.25).any()                      # full size: north-south rivers too


# ---- the same detector in PyTorch (harness/frameworks/pytorch/ewa.py) --------------------

def test_the_pytorch_detector_counts_as_its_keras_twin(data):
    """The same Table 3 count, by operator, and the same weights in both frameworks: the
    small model of the fixture and the ResNet-50 one at 768 x 1152 (PyTorch's counted on
    the meta device: 163,988,720,256 FLOPs forward, 63,439,981 weights in both)."""
    torch = pytest.importorskip("torch")
    from harness.frameworks.pytorch import ewa as pt
    from harness.frameworks.pytorch import flops as ptflops
    from harness.frameworks.tensorflow import faster_rcnn, flops
    from harness.workloads import detector
    for cfg in (ewa.config(data), detector.config_for(768, 1152, 15)):
        keras = flops.count(faster_rcnn.build(cfg))
        with torch.device("meta"):
            ours = ptflops.count(pt.FasterRCNN(cfg), (torch.zeros(1, 16, cfg.height, cfg.width),
                                                      torch.full((1, cfg.max_boxes, 5), -1.0)))
        assert (ours.forward, ours.by_operator, ours.weights) == (keras.forward, keras.by_operator, keras.weights)
    assert (ours.forward, ours.weights) == (163_988_720_256, 63_439_981)


def _outputs(data, seed=0):
    """A detector's outputs as numbers (no model): random RPN logits and deltas, ROIs that
    are jittered ground-truth boxes and random boxes (some empty), head logits and deltas,
    the sampling draws; with the batch's ground truth."""
    rng = np.random.default_rng(seed)
    cfg = ewa.config(data)
    (_, gt), _ = next(ewa.numpy_batches(data, np.arange(2), 2, False, 0))
    a, r = len(cfg.anchors()), cfg.rois
    corner = rng.uniform(0, [cfg.height, cfg.width], (2, r, 2))
    rois = np.concatenate([corner, corner + rng.uniform(2, 12, (2, r, 2))], -1)
    rois[:, -3:] = np.where(gt[..., :1] >= 0, gt[..., 1:5] + rng.normal(0, 1, (2, 3, 4)), 0.0)
    rois[:, :5] = 0.0                                    # NMS padding: empty ROIs
    out = {"rpn_logits": rng.normal(0, 2, (2, a)), "rpn_deltas": rng.normal(0, 0.3, (2, a, 4)),
           "anchors": np.broadcast_to(cfg.anchors(), (2, a, 4)), "rois": rois,
           "cls_logits": rng.normal(0, 2, (2, r, 5)), "box_deltas": rng.normal(0, 0.3, (2, r, 4)),
           "rpn_noise": rng.uniform(size=(2, a)), "roi_noise": rng.uniform(size=(2, r))}
    return cfg, {k: np.array(v, np.float32) for k, v in out.items()}, gt.astype(np.float32)


def test_the_pytorch_loss_and_detections_are_tensorflows(data):
    """Given the same outputs and draws, PyTorch's four loss terms equal faster_rcnn's
    (1e-5), and its detections (class-wise greedy NMS, the K best) equal
    tf.image.combined_non_max_suppression's, row for row."""
    torch = pytest.importorskip("torch")
    import tensorflow as tf

    from harness.frameworks.pytorch import ewa as pt
    from harness.frameworks.tensorflow import faster_rcnn
    cfg, out, gt = _outputs(data)
    theirs = faster_rcnn.loss_terms(tf.constant(gt), {k: tf.constant(v) for k, v in out.items()})
    ours = pt.loss_terms(torch.from_numpy(gt), {k: torch.from_numpy(v[:1] if k == "anchors" else v)
                                               for k, v in out.items()})
    for name in ("rpn_cls", "rpn_box", "head_cls", "head_box"):
        np.testing.assert_allclose(ours[name].numpy(), theirs[name].numpy(), rtol=1e-5, atol=1e-6)
    assert all(float(ours[n].min()) > 0 for n in ("rpn_cls", "head_cls", "head_box"))   # every term at work
    want = faster_rcnn.detections({k: tf.constant(v) for k, v in out.items()}, cfg).numpy()
    got = pt.detections({k: torch.from_numpy(v) for k, v in out.items()}, cfg).numpy()
    assert (want[..., 1] > 0).sum() > 10
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_the_pytorch_proposals_and_roi_crop_are_tensorflows(data):
    """The RPN's proposals (decode, top pre_nms, greedy NMS at 0.7, R boxes; in training the
    ground truth last) and the ROI crop (crop_and_resize's bilinear samples, 0 outside the
    map), and the crop's gradient into the features, from the same numbers in both frameworks."""
    torch = pytest.importorskip("torch")
    import tensorflow as tf

    from harness.frameworks.pytorch import ewa as pt
    from harness.frameworks.tensorflow import faster_rcnn
    cfg, out, gt = _outputs(data, seed=1)
    args = [out["rpn_logits"], out["rpn_deltas"], gt]
    for training in (False, True):
        want = faster_rcnn.Proposals(cfg.anchors(), cfg)([tf.constant(a) for a in args], training=training).numpy()
        model = pt.FasterRCNN(cfg).train(training)
        got = model.proposals(*[torch.from_numpy(a) for a in args]).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-3)
        assert (np.abs(want).sum(-1) > 0).sum() > cfg.rois   # boxes chosen, not padding
    fh, fw = cfg.feature_hw
    features = np.random.default_rng(2).normal(size=(2, fh, fw, 8)).astype(np.float32)
    rois = out["rois"] * 1.3 - 4.0                           # some boxes reach past the image
    want = faster_rcnn.RoiCrop(cfg)([tf.constant(features), tf.constant(rois)]).numpy()   # (N, R, p, p, C)
    got = pt.roi_crop(torch.from_numpy(features).permute(0, 3, 1, 2), torch.from_numpy(rois), cfg.stride,
                      2 * cfg.pool).permute(0, 2, 3, 4, 1).numpy()
    assert (want == 0).any() and (want != 0).mean() > 0.25   # 5 ROIs empty, others partly outside
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # and the same gradient into the features: the head trains the backbone through the crop
    weights = np.random.default_rng(3).normal(size=want.shape).astype(np.float32)
    # TensorFlow's crop_and_resize gradient into the image loses updates between threads on
    # CPUs (30 repeats of one batch of 80 boxes differed by up to 2.3): its reference is
    # summed one box at a time, RoiCrop's normalisation, where no two threads write at once
    p, (fh, fw) = 2 * cfg.pool, cfg.feature_hw
    norm = (rois / cfg.stride - 0.5) / np.array([fh - 1, fw - 1, fh - 1, fw - 1], np.float32)
    f, want = tf.Variable(features), np.zeros_like(features)
    for i, k in np.ndindex(*rois.shape[:2]):
        with tf.GradientTape() as tape:
            theirs = tf.reduce_sum(tf.image.crop_and_resize(f, norm[i, k][None], [i], (p, p)) * weights[i, k][None])
        want += tape.gradient(theirs, f).numpy()
    f = torch.from_numpy(features).permute(0, 3, 1, 2).requires_grad_()
    ours = (pt.roi_crop(f, torch.from_numpy(rois), cfg.stride, 2 * cfg.pool).permute(0, 2, 3, 4, 1)
            * torch.from_numpy(weights)).sum()
    ours.backward()
    got = f.grad.permute(0, 2, 3, 1).numpy()
    assert np.abs(want).max() > 1
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_the_roi_crop_gradient_is_the_per_box_sum_and_deterministic(data):
    """RoiCrop's gradient into the features is our own (TensorFlow's loses updates between
    CPU threads: faster_rcnn.crop_and_resize): by hand on a 3 x 3 map, and at the detector's
    shapes, under tf.function, crop_and_resize's summed one box at a time and bit-identical
    over repeats, the forward crop_and_resize's exactly."""
    import tensorflow as tf

    from harness.frameworks.tensorflow import faster_rcnn
    dy = np.array([[1, 2], [3, 4]], np.float32)[None, :, :, None]
    # box 0.25..0.75 of a 3 x 3 map: 2 x 2 samples at y, x in {0.5, 1.5}, each shared equally
    # by its four neighbouring pixels; box (0.25, -0.5)..(1.25, 0.5): samples at y {0.5, 2.5},
    # x {-1, 1}, only (0.5, 1) on the map, shared by pixels (0, 1) and (1, 1)
    for box, want in [([0.25, 0.25, 0.75, 0.75], 0.25 * np.array([[1, 3, 2], [4, 10, 6], [3, 7, 4]])),
                      ([0.25, -0.5, 1.25, 0.5], [[0, 1, 0], [0, 1, 0], [0, 0, 0]])]:
        f = tf.Variable(np.zeros((1, 3, 3, 1), np.float32))
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(faster_rcnn.crop_and_resize(f, tf.constant([box]), tf.constant([0]), 2) * dy)
        np.testing.assert_array_equal(tape.gradient(loss, f).numpy()[0, :, :, 0], want)

    cfg, out, _ = _outputs(data, seed=4)
    p, (fh, fw) = 2 * cfg.pool, cfg.feature_hw
    features = np.random.default_rng(5).normal(size=(2, fh, fw, 8)).astype(np.float32)
    rois = out["rois"] * 1.3 - 4.0                           # some boxes reach past the image
    weights = np.random.default_rng(6).normal(size=(2, cfg.rois, p, p, 8)).astype(np.float32)
    layer = faster_rcnn.RoiCrop(cfg)

    @tf.function
    def crops_and_gradient(f):
        with tf.GradientTape() as tape:
            tape.watch(f)
            crops = layer([f, tf.constant(rois)])
            loss = tf.reduce_sum(crops * weights)
        return crops, tape.gradient(loss, f)
    runs = [[t.numpy() for t in crops_and_gradient(tf.constant(features))] for _ in range(10)]
    norm = (rois / cfg.stride - 0.5) / np.array([fh - 1, fw - 1, fh - 1, fw - 1], np.float32)
    theirs = tf.image.crop_and_resize(features, norm.reshape(-1, 4), np.repeat([0, 1], cfg.rois), (p, p))
    np.testing.assert_array_equal(runs[0][0], theirs.numpy().reshape(runs[0][0].shape))
    f, want = tf.Variable(features), np.zeros_like(features)
    for i, k in np.ndindex(*rois.shape[:2]):                 # one box at a time: no two threads write at once
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.image.crop_and_resize(f, norm[i, k][None], [i], (p, p)) * weights[i, k][None])
        want += tape.gradient(loss, f).numpy()
    assert np.abs(want).max() > 1
    np.testing.assert_allclose(runs[0][1], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    assert all(np.array_equal(run[1], runs[0][1]) for run in runs[1:])


# ---- end to end ----------------------------------------------------------------------

def prior_detector(data) -> np.ndarray:
    """The trivial baseline, packed as `predict` packs: on every validation image, one
    detection per class at that class's mean training box, scored by the class's share
    of the training boxes. It knows where and how often each class occurs on average,
    and nothing about the image."""
    real = data.train_boxes[data.train_boxes[..., 0] >= 0]
    rows = [[c, np.mean(real[:, 0] == c), *real[real[:, 0] == c, 1:].mean(0)]
            for c in range(ew.CLASSES) if (real[:, 0] == c).any()]
    return _packed([np.array(rows)] * data.n_val, ewa.config(data).detections)


def test_prior_detector_by_hand(data):
    p = prior_detector(data).reshape(data.n_val, -1, 6)
    assert np.array_equal(p[0], p[-1]) and np.isclose(p[0, :, 1].sum(), 1.0)
    assert 0.0 <= ewa.quality(p, data) < 0.5


def test_ewa_end_to_end_under_mpirun(run_dat, tmp_path):
    """Bagging (M = 2, P = 1: two models' detections fused) and data parallelism
    (M = 1, P = 2: replicas must stay equal) on 2 ranks, 5 epochs on tiny synthetic
    data: the ensemble's mAP must beat the prior detector's on the same data (measured:
    0.162 and 0.150 against 0.000; 0.19 and 0.17 after 8 epochs, for 4 s more alone here)."""
    p = run_dat(2, l7="ewa", l8="synthetic:96:64", l9=2, l10="2 1", l11="1 2", l14=2, l15=5,
                l19=0.02, l30=0, l31=0, timeout=400)
    assert p.returncode == 0, p.stderr[-3000:]
    report = report_of(tmp_path / "runs")    # not stdout: mpirun's forwarding can lose bytes
    assert "PASSED" in report and "FAILED" not in report
    assert ("ewa: backbone small (automatic for 64 px images), R = 64 ROIs; FLOPs count the backbone, RPN and"
            " the ROI head once per ROI" in report)
    assert "- ewa: box rows read as (ymin, xmin, ymax, xmax, class) = yxyxc, detected from" in report
    tests = results(tmp_path / "runs")["tests"]
    assert [len(t["base_quality"]) for t in tests] == [2, 1]
    (folder,) = (tmp_path / "runs" / ".data").glob("ewa-synthetic-*")
    data = ewa.read(str(folder))
    baseline = ewa.quality(prior_detector(data), data)
    print(f"mAP: prior detector {baseline:.4f}, runs "
          + ", ".join(f"{t['quality']:.4f} {t['base_quality']}" for t in tests))
    for t in tests:
        assert t["quality_name"] == "mAP@0.5" and t["consistency"]["passed"]
        assert all(0.0 <= q <= 1.0 for q in [t["quality"], *t["base_quality"]])
        assert t["quality"] > baseline + 0.05, (t["quality"], baseline)


@pytest.mark.parametrize("depth", ["0", "2"])
def test_stream_is_each_epochs_batches_in_turn(data, monkeypatch, depth):
    """TensorFlow's ewa.stream with and without prefetch: epoch e's batches as the
    workload's batches(shards(e), seed + e) gives them, whole batches only, one pipeline
    for all epochs."""
    from harness.frameworks.tensorflow import ewa as tf_ewa
    epochs = {0: np.array([3, 1, 3, 0, 2]), 1: np.array([7, 7, 4, 5])}
    want = [b for e in (0, 1) for b in ewa.batches(data, epochs[e], 2, training=True, seed=9 + e)]
    monkeypatch.setenv("HPCAI500_EWA_PREFETCH", depth)
    got = list(tf_ewa.stream(data, lambda e: epochs[e], 2, 2, seed=9))
    assert len(got) == len(want) == 4
    for ((x, gt), y), ((wx, wgt), wy) in zip(got, want):
        assert np.array_equal(np.asarray(x), wx) and np.array_equal(np.asarray(gt), wgt)
        assert np.array_equal(np.asarray(y), wy)
