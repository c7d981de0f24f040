"""Divisions (harness/division.py): the conditions of a ranking (closed) result, each
reason an open one lists, and the workloads' own account of their reference model."""
import pytest

from harness import division

CLOSED = dict(workload="ic", dataset_kind="path", deviations=[], test_only=[], target=-1, default_target=0.763,
              n=-1, default_n=5, repetitions=5)


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
