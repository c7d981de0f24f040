"""One contract, run over every workload the input file can name: the interface of
harness/workloads (the Workload protocol), the optional constants' defaults, and the
values the harness relies on; and TensorFlow's module of every workload against its
interface (harness/frameworks/tensorflow/models.Model). A new workload is checked by
being listed in CHOICES."""
import inspect
import os

import numpy as np
import pytest

from harness import dat, division, ensemble, workloads
from harness.frameworks.tensorflow import models as tf_models


@pytest.mark.parametrize("name", list(workloads.CHOICES))
def test_every_workload_meets_the_interface(name):
    wl = workloads.get(name)
    assert wl.NAME == name
    for member in workloads.REQUIRED:
        assert hasattr(wl, member), member
    for fn in ("load", "read", "stage", "batches", "score_width", "quality"):
        _binds(workloads.Workload, wl, fn)
    assert isinstance(wl.QUALITY, str) and wl.QUALITY
    assert 0 < wl.TARGET_QUALITY <= 1 and wl.PENALTY_N >= 0
    assert wl.AGGREGATIONS and set(wl.AGGREGATIONS) <= set(ensemble.AGGREGATIONS)
    assert wl.ENSEMBLE in ("sum", "stack") and 0 <= wl.MOMENTUM < 1
    assert callable(wl.describe_model)


# small synthetic sets, and each one's facts by hand: (spec, the facts other than the marker)
SMALL = {"digits": ("synthetic:20:8", {"train_samples": 16, "val_samples": 4}),
         "ic": ("synthetic:10:16", {"train_samples": 8, "val_samples": 2, "classes": 10}),
         "ewa": ("synthetic:10:32", {"train_samples": 8, "val_samples": 2, "images_per_file": [2]}),   # 5 years of 2
         "cosmoflow": ("synthetic:4:32", {"train_samples": 3, "val_samples": 1}),
         "deepcam": ("synthetic:4:32", {"train_samples": 2, "val_samples": 2})}


@pytest.mark.parametrize("name", list(workloads.CHOICES))
def test_every_workloads_synthetic_data_carries_the_harness_marker_whatever_its_path(name, tmp_path):
    """The synthetic writer leaves hpcai500-<workload>.json, which data_facts finds where
    the set was written and where it was moved to and read as a path (division.py: a path to
    generated data is open); the facts are those data_facts always gives and PUBLISHED's."""
    wl = workloads.get(name)
    spec, want = SMALL[name]
    data = wl.load(workloads.Dataset.parse(spec), str(tmp_path / "cache"))
    assert wl.data_facts(data) == {"marker": os.path.join(data.path, f"hpcai500-{name}.json"), **want}
    assert set(want) | {"marker"} == {*division.FACT_KEYS, *(k for k in wl.PUBLISHED if k != "name")}
    moved = tmp_path / "moved"
    os.rename(data.path, moved)
    again = wl.load(workloads.Dataset.parse(str(moved)), str(tmp_path / "cache"))
    assert wl.data_facts(again) == {"marker": str(moved / workloads.marker_name(name)), **want}


def _binds(protocol, module, fn):
    """`module`'s fn callable the way the harness calls it: the protocol's arguments bind."""
    params = inspect.signature(getattr(protocol, fn)).parameters.values()
    args = [p.name for p in params if p.name != "self" and p.kind is not p.KEYWORD_ONLY]
    kwargs = {p.name: None for p in params if p.kind is p.KEYWORD_ONLY}
    inspect.signature(getattr(module, fn)).bind(*args, **kwargs)


@pytest.mark.parametrize("name", list(workloads.CHOICES))
def test_every_workload_has_a_tensorflow_module_that_meets_its_interface(name):
    """harness/frameworks/tensorflow/<name>.py: the Keras members; the feed, where it gives
    one, as the workloads' batches() is called."""
    module = tf_models.get(name)
    for member in tf_models.REQUIRED:
        assert hasattr(module, member), member
    for fn in ("build_model", "loss", "input_signature", "predict"):
        _binds(tf_models.Model, module, fn)
    if module.batches is not None:
        _binds(workloads.Workload, module, "batches")


def test_optional_constants_come_from_one_table():
    digits = workloads.get("digits")      # declares none of them
    assert (digits.ENSEMBLE, digits.MOMENTUM, digits.describe_model(None)) == ("sum", 0.9, (None, []))
    ic = workloads.get("ic")               # its reference recipe's momentum
    assert ic.MOMENTUM == 0.875 and ic.ENSEMBLE == "sum"
    assert workloads.get("ewa").ENSEMBLE == "stack"


def test_a_module_missing_a_member_is_refused(monkeypatch):
    digits = workloads.get("digits")
    monkeypatch.delattr(digits, "quality")
    with pytest.raises(TypeError, match="harness.workloads.digits lacks quality"):
        workloads.get("digits")


def test_training_feed_chains_each_epochs_batches_with_its_seed():
    """A feed without stream(): batches() of shards(e) with seed + e, e in turn, each
    epoch's rows drawn only when the feed reaches it."""
    calls = []

    def batches(data, rows, batch, *, training, seed):
        calls.append((list(rows), seed, training))
        yield from ((rows[i:i + batch], seed) for i in range(0, len(rows) // batch * batch, batch))

    feed = workloads.training_feed(batches, None, None, lambda e: [10 * e, 10 * e + 1, 10 * e + 2], 2, 2, seed=100)
    assert calls == []
    assert [(list(x), s) for x, s in feed] == [([0, 1], 100), ([10, 11], 101)]
    assert calls == [([0, 1, 2], 100, True), ([10, 11, 12], 101, True)]
    assert tf_models.get("ic").stream is not None and tf_models.get("digits").stream is None


@pytest.mark.parametrize("rows", [[], [2, 1], [1, 1], [-1, 0], [0, 5]], ids=["empty", "unsorted", "repeat",
                                                                        "negative", "past-the-end"])
def test_staged_rows_refuses_what_a_copy_cannot_hold(rows):
    with pytest.raises(ValueError, match=r"^ic\.stage: rows must be sorted, unique, non-empty and in 0\.\.4$"):
        workloads.staged_rows("ic", rows, 5)


def test_staged_rows_are_int64():
    got = workloads.staged_rows("cosmoflow", [0, 3, 4], 5)
    assert got.dtype == np.int64 and list(got) == [0, 3, 4]


def test_unknown_workload():
    with pytest.raises(KeyError, match="unknown workload 'resnet'"):
        workloads.get("resnet")


def test_the_input_file_knows_exactly_the_built_workloads():
    assert dat.KNOWN["workload"] == tuple(workloads.CHOICES)


def test_top1_ties_go_to_the_lowest_class():
    scores = np.array([[0.5, 0.5, 0.0], [0.1, 0.2, 0.7], [0.3, 0.3, 0.3]])
    assert workloads.top1(scores, np.array([0, 2, 1])) == pytest.approx(2 / 3)


def test_a_framework_interface_missing_a_member_is_refused(monkeypatch):
    """frameworks.get checks a package's interface against the Framework protocol, with the
    workloads' one check (TensorFlow, which cuts no model, need not give `blocks`)."""
    from harness import frameworks
    torch_interface = frameworks.get("pytorch")   # plain Python at import: torch comes with the Job
    monkeypatch.delattr(torch_interface, "blocks")
    with pytest.raises(TypeError, match="the framework interface harness.frameworks.pytorch.interface lacks blocks"):
        frameworks.get("pytorch")
    assert not hasattr(frameworks.get("tensorflow"), "blocks")   # whole without it: it cuts no model


def test_framework_facts_missing_a_member_are_refused(monkeypatch):
    """The registry checks each framework's facts module against the Facts protocol as it
    lists it, with the same check: a framework cannot be registered half-described."""
    import importlib

    from harness import frameworks, workloads
    assert {"NAME", "CODE", "REFUSES", "RING", "conventions", "stated"} <= set(
        workloads.required_members(frameworks.Facts, {}))
    monkeypatch.delattr(frameworks.facts("pytorch"), "RING")
    try:
        with pytest.raises(TypeError, match="the framework facts harness.frameworks.pytorch.facts lacks RING"):
            importlib.reload(frameworks)      # the registry, as a run imports it
    finally:
        monkeypatch.undo()
        importlib.reload(frameworks)          # whole again for the tests after this one
    assert frameworks.facts("pytorch").RING == "DDP all-reduce"
