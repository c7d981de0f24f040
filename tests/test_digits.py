"""The digits workload's on-disk format: synthetic data is written and read back by
the one reader that reads real data; broken files give errors naming the file."""
import h5py
import numpy as np
import pytest

from harness.workloads import DataError, Dataset, digits
from tests.conftest import results


def test_embedded_split_is_fixed_and_disjoint():
    a, b = digits.load(Dataset.parse("embedded"), ""), digits.load(Dataset.parse("embedded"), "")
    assert a.n_train + len(a.y_val) == 1797 and a.x_train.shape[1:] == (8, 8, 1)
    assert np.array_equal(a.y_val, b.y_val)
    assert 0.0 <= a.x_train.min() and a.x_train.max() <= 1.0


def test_embedded_digits_are_scikit_learns():
    """Read from the file without importing scikit-learn: the very rows load_digits() gives."""
    from sklearn.datasets import load_digits
    x, y = digits._digits_csv()
    ref = load_digits()
    assert np.array_equal(x, ref.data) and np.array_equal(y, ref.target) and y.dtype == np.int64


def test_batches_are_the_rows_in_order():
    """Rows repeat and come in any order (a bootstrap shard); the remainder is dropped."""
    d = digits.load(Dataset.parse("embedded"), "")
    feed = list(digits.batches(d, np.array([3, 1, 3, 0, 2]), 2, training=True, seed=0))
    assert len(feed) == 2
    for (x, y), rows in zip(feed, ([3, 1], [3, 0])):
        assert np.array_equal(x, d.x_train[rows]) and np.array_equal(y, d.y_train[rows])


def test_synthetic_round_trip(tmp_path):
    d = digits.load(Dataset.parse("synthetic:300:12"), str(tmp_path))
    assert d.n_train + len(d.y_val) == 300 and d.x_train.shape[1:] == (12, 12, 1)
    folder = tmp_path / "digits-synthetic-300-12"
    with h5py.File(folder / "train.h5") as f:       # the real on-disk layout
        assert f["images"].shape == (d.n_train, 12, 12) and f["labels"].dtype == np.int64
    again = digits.read(str(folder))
    assert np.array_equal(again.x_train, d.x_train) and np.array_equal(again.y_val, d.y_val)
    assert len(np.unique(d.y_train)) == 10


def _write(path, images, labels, skip=()):
    with h5py.File(path, "w") as f:
        if "images" not in skip:
            f["images"] = images
        if "labels" not in skip:
            f["labels"] = labels


@pytest.mark.parametrize("case,message", [
    ("no-labels", "no dataset 'labels'"),
    ("bad-label", "labels must lie in [0, 10), found 0..12"),
    ("bad-shape", "expected images (N, H, W) and labels (N,)"),
    ("truncated", "cannot read HDF5"),
    ("missing-dir", "not a directory holding train.h5 and val.h5"),
])
def test_broken_files_name_the_file(tmp_path, case, message):
    good = (np.zeros((5, 8, 8), np.float32), np.arange(5))
    _write(tmp_path / "val.h5", *good)
    train = tmp_path / "train.h5"
    if case == "no-labels":
        _write(train, *good, skip=("labels",))
    elif case == "bad-label":
        _write(train, good[0], np.array([0, 1, 2, 3, 12]))
    elif case == "bad-shape":
        _write(train, np.zeros((5, 8), np.float32), np.arange(5))
    elif case == "truncated":
        _write(train, *good)
        train.write_bytes(train.read_bytes()[:300])
    path = tmp_path / "nowhere" if case == "missing-dir" else tmp_path
    with pytest.raises(DataError) as err:
        digits.read(str(path))
    assert message in str(err.value)
    assert (str(train) if case != "missing-dir" else "nowhere") in str(err.value)


def test_synthetic_data_trains_under_mpirun(run_dat, tmp_path):
    p = run_dat(2, l8="synthetic:600:8", l9=1, l10=2, l11=1, l15=2)
    assert p.returncode == 0, p.stderr[-3000:]
    t = results(tmp_path / "runs")["tests"][0]
    assert t["data"] == "synthetic:600:8" and t["train_samples"] == 480
    assert t["quality"] > 0.3 and t["consistency"]["passed"]   # learnable: well above chance 0.1
    assert (tmp_path / "runs" / ".data" / "digits-synthetic-600-8" / "train.h5").exists()
