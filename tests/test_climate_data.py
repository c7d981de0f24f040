"""climate: MLPerf HPC's DeepCAM layout written (synthetic) and read back, the
normalisation against a hand computation from the raw file, the staged copy, and every
refusal of bad data naming the file. No MPI, no TensorFlow; a few seconds."""
import filecmp
import os
import shutil

import h5py
import numpy as np
import pytest

from harness.workloads import DataError, climate, climate_synthetic as cs

HEIGHT, WIDTH, SAMPLES = 32, 48, 8


@pytest.fixture(scope="module")
def small_set(tmp_path_factory):
    """8 synthetic samples of 32 x 48 (6 training, 2 validation), written once."""
    path = tmp_path_factory.mktemp("deepcam") / cs.directory_name(SAMPLES, HEIGHT)
    cs.write_synthetic(str(path), SAMPLES, HEIGHT)
    return path


@pytest.fixture
def copy(small_set, tmp_path):
    """A copy of the small set to spoil."""
    dst = tmp_path / "set"
    shutil.copytree(small_set, dst)
    return dst


def _rewrite(file, data, labels, label_key=climate.LABEL_KEY):
    """Replace a sample file by one holding exactly these datasets (h5py, not write_sample:
    it would refuse some of them)."""
    os.unlink(file)
    with h5py.File(file, "w") as f:
        f.create_dataset(climate.DATA_KEY, data=data)
        f.create_dataset(label_key, data=labels)


def _raw(file):
    with h5py.File(file, "r") as f:
        return f[climate.DATA_KEY][...], f[climate.LABEL_KEY][...]


def _sizes(path) -> int:
    return sum(os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(path) for n in names)


# ---- the synthetic set, read back ------------------------------------------------------

def test_synthetic_round_trip(small_set):
    data = climate.read(str(small_set))
    assert (data.n_train, data.n_val) == (6, 2)          # 8 x VAL_FRACTION 0.25 = 2 validation
    assert (data.height, data.width) == (HEIGHT, WIDTH)  # 1.5 x the height, as 768 x 1152
    assert data.source == str(small_set)
    assert [os.path.basename(f) for f in data.train_files] == [f"data-{i:06d}.h5" for i in range(6)]
    assert [os.path.basename(f) for f in data.val_files] == ["data-000006.h5", "data-000007.h5"]
    x, y = climate.samples(data, "train", [2, 0])
    assert x.dtype == np.float32 and x.shape == (2, HEIGHT, WIDTH, 16)
    assert y.dtype == np.int32 and y.shape == (2, HEIGHT, WIDTH)
    raw, raw_labels = _raw(data.train_files[2])
    with h5py.File(small_set / "stats.h5", "r") as f:
        lo, hi = f["climate/minval"][...].astype(np.float64), f["climate/maxval"][...].astype(np.float64)
        assert f["climate/count"][()] == 6 and f["climate/mean"].shape == f["climate/sqmean"].shape == (16,)
    expected = (raw.astype(np.float64) - lo) / (hi - lo)  # the reference's min-max, per channel
    np.testing.assert_allclose(x[0], expected, rtol=0, atol=2e-6)
    # one pixel by hand: row 3, column 4, channel 5 (T500)
    assert x[0, 3, 4, 5] == pytest.approx((float(raw[3, 4, 5]) - lo[5]) / (hi[5] - lo[5]), abs=2e-6)
    np.testing.assert_array_equal(y[0], raw_labels)
    # the statistics are the training set's: every training value lies in [0, 1] after it
    xs, ys = climate.samples(data, "train", range(6))
    assert xs.min() >= 0 and xs.max() <= 1 + 1e-6
    assert set(np.unique(ys)) == {0, 1, 2}                 # both objects somewhere
    assert np.mean(ys == 0) > 0.9                           # background the majority
    # the channels' raw scales differ (so normalisation matters): PS ~1e5 Pa, PRECT ~1e-8 m/s
    assert raw[..., 1].mean() > 5e4 and raw[..., 0].mean() < 1e-5


def test_each_split_holds_every_class(small_set):
    data = climate.read(str(small_set))
    assert set(np.unique(climate.labels(data, range(data.n_val)))) == {0, 1, 2}


def test_labels_are_samples_labels(small_set):
    data = climate.read(str(small_set))
    rows = [1, 0, 1]
    got = climate.labels(data, rows)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, climate.samples(data, "validation", rows)[1])
    np.testing.assert_array_equal(got[0], _raw(data.val_files[1])[1])


def test_repeated_rows_read_the_same_sample(small_set):
    data = climate.read(str(small_set))
    x, y = climate.samples(data, "train", [4, 1, 4])
    np.testing.assert_array_equal(x[0], x[2])
    np.testing.assert_array_equal(y[0], y[2])
    assert not np.array_equal(x[0], x[1])


def test_synthetic_is_deterministic_for_a_seed(tmp_path):
    for name, seed in (("a", 7), ("b", 7), ("c", 8)):
        cs.write_synthetic(str(tmp_path / name), 4, HEIGHT, seed=seed)
    a, b, c = (climate.samples(climate.read(str(tmp_path / n)), "train", [0, 1])[0] for n in "abc")
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_write_synthetic_refuses_a_height_not_a_multiple_of_32(tmp_path):
    with pytest.raises(ValueError, match="height 48 is not a multiple of 32"):
        cs.write_synthetic(str(tmp_path / "s"), 8, 48)
    with pytest.raises(ValueError, match="3 samples, expected at least 4"):
        cs.write_synthetic(str(tmp_path / "s"), 3, 32)
    assert not os.path.exists(tmp_path / "s")


# ---- the staged copy -------------------------------------------------------------------

def test_stage_copies_rows_in_order_and_reads_back(small_set, tmp_path):
    data = climate.read(str(small_set))
    rows, calls = [0, 2, 5], []
    out = tmp_path / "staged"
    written = climate.stage(data, rows, str(out), progress=lambda: calls.append(1))
    copy = climate.read(str(out))
    assert (copy.n_train, copy.n_val) == (3, 2) and (copy.height, copy.width) == (HEIGHT, WIDTH)
    assert written == _sizes(out) and len(calls) == 3 + 2 + 1   # 3 samples, 2 validation, stats.h5
    for k, row in enumerate(rows):
        assert filecmp.cmp(copy.train_files[k], data.train_files[row], shallow=False)
        for a, b in zip(climate.samples(copy, "train", [k]), climate.samples(data, "train", [row])):
            np.testing.assert_array_equal(a, b)
    for a, b in zip(climate.samples(copy, "validation", [0, 1]), climate.samples(data, "validation", [0, 1])):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(copy.scale, data.scale)
    # a second copy into the same place replaces the first (no file of it left)
    climate.stage(data, [3], str(out))
    assert climate.read(str(out)).n_train == 1
    with pytest.raises(ValueError, match="sorted, unique"):
        climate.stage(data, [2, 0], str(out))


# ---- bad data, named -------------------------------------------------------------------

def test_a_2019_file_is_refused(copy):
    first = copy / "train" / "data-000000.h5"
    x, y = _raw(first)
    _rewrite(first, x, y, label_key=climate.OLD_LABEL_KEY)
    with pytest.raises(DataError) as e:
        climate.read(str(copy))
    assert str(e.value) == (f"{first}: found 'climate/labels' and no 'climate/labels_0': the 2019 layout of the "
                            "DeepCAM data; the MLPerf HPC data since v0.7 has 'climate/labels_0'")
    later = copy / "validation" / "data-000007.h5"       # not opened by read: found when read
    _rewrite(first, x, y)
    _rewrite(later, *_raw(later), label_key=climate.OLD_LABEL_KEY)
    data = climate.read(str(copy))
    with pytest.raises(DataError, match=f"^{later}: found 'climate/labels'.* 2019 layout"):
        climate.labels(data, [1])


def test_data_of_the_wrong_shape(copy):
    first, later = copy / "train" / "data-000000.h5", copy / "train" / "data-000003.h5"
    x, y = _raw(first)
    _rewrite(first, x[..., :15], y)
    with pytest.raises(DataError) as e:
        climate.read(str(copy))
    assert str(e.value).startswith(f"{first}: dataset 'climate/data': found shape (32, 48, 15), expected (H, W, 16)")
    _rewrite(first, x, y)
    _rewrite(later, x[:16], y[:16])                       # H a multiple of 16, but not the set's
    data = climate.read(str(copy))                        # read opens only the first files
    climate.samples(data, "train", [0, 1, 2])
    with pytest.raises(DataError) as e:
        climate.samples(data, "train", [2, 3])
    assert str(e.value).startswith(f"{later}: dataset 'climate/data': found shape (16, 48, 16), "
                                   f"expected (32, 48, 16) (H, W, 16) like the set's first training file ({first})")


def test_labels_of_the_wrong_shape(copy):
    later = copy / "train" / "data-000002.h5"
    x, y = _raw(later)
    _rewrite(later, x, y[:, :40])
    with pytest.raises(DataError, match=rf"^{later}: dataset 'climate/labels_0': found shape \(32, 40\), "
                                        r"expected \(32, 48\)"):
        climate.samples(climate.read(str(copy)), "train", [2])


@pytest.mark.parametrize("dtype, bad, shown", [(np.uint8, 3, "3"), (np.float32, 1.5, "1.5"),
                                               (np.float32, np.nan, "nan"), (np.int64, -1, "-1")])
def test_a_bad_label_value_in_a_later_file(copy, dtype, bad, shown):
    later = copy / "train" / "data-000004.h5"
    x, y = _raw(later)
    y = y.astype(dtype)
    y[5, 7] = bad
    _rewrite(later, x, y)
    data = climate.read(str(copy))
    with pytest.raises(DataError) as e:
        climate.samples(data, "train", [1, 4])
    assert str(e.value) == (f"{later}: dataset 'climate/labels_0': found {shown} at (row 5, column 7) and 0 more "
                            "bad pixel(s), expected whole values 0..2 (0 background, 1 tropical cyclone, "
                            "2 atmospheric river)")


def test_whole_float_labels_are_read(copy):
    """The reference casts labels with astype(int64): whole floats are classes."""
    later = copy / "train" / "data-000004.h5"
    x, y = _raw(later)
    _rewrite(later, x, y.astype(np.float32))
    got = climate.samples(climate.read(str(copy)), "train", [4])[1][0]
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, y)


def test_missing_stats(copy):
    os.unlink(copy / "stats.h5")
    with pytest.raises(DataError, match=rf"^{copy / 'stats.h5'}: no such file; it holds 'climate/minval' and "
                                        "'climate/maxval'"):
        climate.read(str(copy))


def test_maxval_equal_to_minval(copy):
    stats = copy / "stats.h5"
    with h5py.File(stats, "r") as f:
        lo, hi = f["climate/minval"][...], f["climate/maxval"][...]
    hi[5] = lo[5]
    os.unlink(stats)
    climate.write_stats(str(copy), lo, hi, lo, lo, 6)
    with pytest.raises(DataError) as e:
        climate.read(str(copy))
    assert str(e.value) == (f"{stats}: channel 5: found maxval {lo[5]} <= minval {lo[5]}, expected maxval > minval "
                            "(the normalisation divides by maxval - minval)")


def test_stats_not_16_finite_values(copy):
    stats = copy / "stats.h5"
    with h5py.File(stats, "r+") as f:
        lo = f["climate/minval"][...]
        del f["climate/minval"]
        f["climate/minval"] = lo[:15]
    with pytest.raises(DataError, match=rf"^{stats}: dataset 'climate/minval': found shape \(15,\), expected \(16,\)"):
        climate.read(str(copy))
    with h5py.File(stats, "r+") as f:
        del f["climate/minval"]
        lo[9] = np.inf
        f["climate/minval"] = lo
    with pytest.raises(DataError, match=rf"^{stats}: dataset 'climate/minval': channel 9: found inf, expected a finite"):
        climate.read(str(copy))


def test_a_side_not_a_multiple_of_16(copy):
    first = copy / "train" / "data-000000.h5"
    x, y = _raw(first)
    _rewrite(first, np.concatenate([x, x[:8]]), np.concatenate([y, y[:8]]))   # 40 x 48
    with pytest.raises(DataError) as e:
        climate.read(str(copy))
    assert str(e.value).startswith(f"{first}: dataset 'climate/data': found H x W = 40 x 48, expected multiples "
                                   "of 16 (the model's output stride 16")


def test_splits_of_different_sizes(copy):
    first = copy / "validation" / "data-000006.h5"
    x, y = _raw(first)
    _rewrite(first, x[:16, :32], y[:16, :32])
    with pytest.raises(DataError, match=rf"^{first}: found samples of 16 x 32, expected 32 x 48 like the first "
                                        rf"training file \({copy / 'train' / 'data-000000.h5'}\)"):
        climate.read(str(copy))


def test_no_validation_folder(copy):
    shutil.rmtree(copy / "validation")
    with pytest.raises(DataError, match=rf"^{copy / 'validation'}: no such directory \(MLPerf HPC's DeepCAM layout"):
        climate.read(str(copy))


def test_an_empty_train_folder(copy):
    for f in (copy / "train").iterdir():
        f.unlink()
    (copy / "train" / ".data-000000.h5.tmp-host-1").write_bytes(b"")   # a writer's hidden temporary name
    with pytest.raises(DataError, match=rf"^{copy / 'train'}: no \*\.h5 files \(MLPerf HPC's DeepCAM layout"):
        climate.read(str(copy))


def test_not_a_directory(tmp_path):
    with pytest.raises(DataError, match=r"^deepcam dataset '.*nowhere': not a directory \(MLPerf HPC's DeepCAM"):
        climate.read(str(tmp_path / "nowhere"))


def test_not_hdf5(copy):
    later = copy / "train" / "data-000005.h5"
    later.write_bytes(b"not an HDF5 file")
    with pytest.raises(DataError, match=rf"^{later}: cannot open as HDF5"):
        climate.samples(climate.read(str(copy)), "train", [5])
