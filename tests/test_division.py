"""Divisions (harness/division.py): the conditions of a ranking (closed) result, each
reason an open one lists, and the workloads' own account of their reference model and
of the data they read (data_facts against PUBLISHED: closed means the published set)."""
import pytest

from harness import dat, division, plan
from harness.workloads import Dataset, cosmoflow, deepcam, ewa, ic, marker_name
from tests.conftest import dat_text

IMAGENET = {"marker": None, "classes": 1000, "train_samples": 1281167, "val_samples": 50000}
CLOSED = dict(workload="ic", dataset_kind="path", deviations=[], test_only=[], target=-1, default_target=0.763,
              n=-1, default_n=5, repetitions=5, data_facts=IMAGENET, published=ic.PUBLISHED)
# what the vendor's folder held: synthetic:40:224 written by --check (8 of 40 for validation)
VENDOR = "runs/.data/ic-synthetic-40-224"
GENERATED = {"marker": f"{VENDOR}/hpcai500-ic.json", "classes": 10, "train_samples": 32, "val_samples": 8}


def test_a_ranking_workload_on_real_data_with_the_reference_model_is_closed():
    assert division.judge(**CLOSED) == ("closed", [])
    assert division.judge(**{**CLOSED, "target": 0.763, "n": 5, "repetitions": 100}) == ("closed", [])


@pytest.mark.parametrize("change,reason", [
    ({"workload": "digits"}, "digits is a demonstration workload (ranking: ic, ewa)"),
    ({"workload": "cosmoflow"}, "cosmoflow is MLPerf HPC's workload, bagged here, not an HPC AI500 V2.0 ranking"
                                " workload (ranking: ic, ewa)"),
    ({"dataset_kind": "synthetic"}, "synthetic data (a ranking result reads the real data set from a path)"),
    ({"deviations": ["a reduced ResNet"]}, "not the reference model: a reduced ResNet"),
    ({"test_only": ["HPCAI500_IC_WIDTH=8"]}, "test-only setting HPCAI500_IC_WIDTH=8"),
    ({"target": 0.5}, "target quality 0.5, not the workload's 0.763 (line 25)"),
    ({"n": 2}, "penalty exponent n 2, not the workload's 5 (line 26)"),
    ({"repetitions": 4}, "4 repetition(s), fewer than the 5 of the olympic summary (line 27)"),
])
def test_each_condition_alone_makes_a_test_open_and_is_named(change, reason):
    assert division.judge(**{**CLOSED, **change}) == ("open", [reason])


@pytest.mark.parametrize("facts,reason", [
    ({"marker": f"{VENDOR}/hpcai500-ic.json"},
     "data written by hpcai500 (runs/.data/ic-synthetic-40-224/hpcai500-ic.json), not the published ImageNet"),
    ({"classes": 10}, "10 classes, ImageNet has 1,000"),
    ({"val_samples": 8}, "8 validation samples, ImageNet's validation set has 50,000"),
    ({"train_samples": 32}, "32 training samples, ImageNet's training set has 1,281,167"),
    ({"classes": None}, "unknown classes, ImageNet has 1,000"),
])
def test_each_data_fact_alone_makes_a_path_open_and_is_named(facts, reason):
    assert division.judge(**{**CLOSED, "data_facts": {**IMAGENET, **facts}}) == ("open", [reason])


def test_a_path_to_generated_data_is_open_with_every_reason():
    """The vendor's case: line 8 the path of the folder `--check` wrote for synthetic:40:224."""
    assert division.judge(**{**CLOSED, "data_facts": GENERATED}) == ("open", [
        "data written by hpcai500 (runs/.data/ic-synthetic-40-224/hpcai500-ic.json), not the published ImageNet",
        "10 classes, ImageNet has 1,000", "32 training samples, ImageNet's training set has 1,281,167",
        "8 validation samples, ImageNet's validation set has 50,000"])


def test_facts_dropped_from_the_record_do_not_close_it():
    """A fact data_facts always gives, missing, is a reason: an edit cannot drop the marker."""
    facts = {k: v for k, v in GENERATED.items() if k != "marker"}
    verdict, reasons = division.judge(**{**CLOSED, "data_facts": facts})
    assert verdict == "open" and reasons[0] == "data facts without marker (harness/workloads data_facts gives it)"


def test_data_not_read_from_a_path_has_the_one_reason_and_an_old_record_none():
    """synthetic and embedded data are open for what they are, their facts aside; a record
    of results schema < 2.17 has no facts (None) and is judged as before."""
    assert division.judge(**{**CLOSED, "dataset_kind": "synthetic", "data_facts": GENERATED}) == (
        "open", ["synthetic data (a ranking result reads the real data set from a path)"])
    assert division.judge(**{**CLOSED, "data_facts": None}) == ("closed", [])


def test_published_versions_and_facts_of_each_workload():
    """cosmoflow's two published sets (a tuple: either), ewa's images a year file (each
    file's count must be it), deepcam's split."""
    def reasons(published, **facts):
        return division.data_reasons({"marker": None, "train_samples": 1, "val_samples": 1, **facts},
                                     {"name": published["name"], **{k: published[k] for k in facts}})
    assert reasons(cosmoflow.PUBLISHED, train_samples=262144, val_samples=65536) == []
    assert reasons(cosmoflow.PUBLISHED, train_samples=524288, val_samples=65536) == []
    assert reasons(cosmoflow.PUBLISHED, train_samples=256) == [
        "256 training samples, MLPerf HPC's CosmoFlow data's training set has 524,288 or 262,144"]
    assert reasons(ewa.PUBLISHED, images_per_file=[1460]) == []
    assert reasons(ewa.PUBLISHED, images_per_file=[64, 1460]) == [
        "64 or 1,460 images a file, ExtremeWeather's files hold 1,460 each"]
    assert reasons(deepcam.PUBLISHED, val_samples=32) == [
        "32 validation samples, MLPerf HPC's DeepCAM data's validation set has 15,158"]


def test_the_facts_line_states_every_fact():
    assert division.facts_line(GENERATED) == (
        "data facts (the division's, harness/division.py): classes 10; marker"
        " runs/.data/ic-synthetic-40-224/hpcai500-ic.json; train_samples 32; val_samples 8")
    assert division.facts_line({"marker": None, "images_per_file": [64, 65]}).endswith(
        "images_per_file 64 or 65; marker none")


def test_a_path_to_synthetic_ic_data_is_judged_open_by_the_plan(tmp_path):
    """End to end, in-process: ic's synthetic:40:224 written where --check writes it, line 8
    that folder's path, 5 repetitions: the plan's judgement (plan.judged, what the run
    records) is open, with the marker, the classes and the split named; and with the marker
    taken away, the classes and the split still keep it open."""
    folder = tmp_path / "runs" / ".data" / "ic-synthetic-40-224"
    ic.write_synthetic(str(folder), 40, 224)
    text = dat_text(l7="ic", l8=str(folder), l9=1, l10=1, l11=1, l27=5)
    cfg = dat.parse_text(text, "x.dat")
    assert cfg.dataset == Dataset(str(folder), "path")

    def judged():
        data = ic.load(cfg.dataset, str(tmp_path / "cache"))
        (p,), _ = plan.layouts(cfg, dat.expand(cfg), 1, [0])
        return plan.judged(cfg, p, data, {}, ic.data_facts(data))

    p = judged()
    classes = ["10 classes, ImageNet has 1,000", "32 training samples, ImageNet's training set has 1,281,167",
               "8 validation samples, ImageNet's validation set has 50,000"]
    assert p.data_facts == {"marker": f"{folder}/hpcai500-ic.json", "train_samples": 32, "val_samples": 8,
                            "classes": 10}
    assert (p.division, p.open_reasons) == ("open", (
        f"data written by hpcai500 ({folder}/hpcai500-ic.json), not the published ImageNet", *classes))
    (folder / marker_name("ic")).unlink()
    p = judged()
    assert p.data_facts["marker"] is None and (p.division, p.open_reasons) == ("open", tuple(classes))


def test_every_reason_is_listed():
    verdict, reasons = division.judge(**{**CLOSED, "workload": "digits", "dataset_kind": "embedded",
                                         "repetitions": 1})
    assert verdict == "open" and len(reasons) == 3


def test_workloads_name_their_deviations_from_the_reference_model(monkeypatch):
    from harness.workloads import ewa, ic
    data = type("D", (), {"side": 224})()
    note, deviations = ic.describe_model(data)
    assert deviations == [] and "24.61 GFLOPs" in note
    monkeypatch.setenv("HPCAI500_IC_WIDTH", "8")
    note, deviations = ic.describe_model(type("D", (), {"side": 32})())
    assert deviations == ["a reduced ResNet (stem width 8, stages 3,4,6,3; HPCAI500_IC_WIDTH/HPCAI500_IC_STAGES),"
                          " not ResNet-50", "32 px images, not 224"]
    assert "24.61 GFLOPs" in note and "do not apply" in note       # the shrunk model is not called ResNet-50
    small = type("D", (), {"height": 96, "width": 144, "max_boxes": 3})()
    note, deviations = ewa.describe_model(small)
    assert note.startswith("backbone small (automatic for 96 px images), R = 64 ROIs;")
    assert deviations == ["the small backbone (automatic for 96 px images), not the ResNet-50 trunk",
                          "96 x 144 images, not 768 x 1152"]
    full = type("D", (), {"height": 768, "width": 1152, "max_boxes": 15})()
    assert ewa.describe_model(full)[1] == []
    monkeypatch.setenv("HPCAI500_EWA_BACKBONE", "small")
    assert ewa.describe_model(full)[1] == ["the small backbone (HPCAI500_EWA_BACKBONE=small), not the ResNet-50 trunk"]
