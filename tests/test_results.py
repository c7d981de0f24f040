"""results.load: results.json read back as the typed Record it was written from, by hand."""
import json
from dataclasses import replace

import pytest

from harness import metrics, results
from tests.conftest import result


def _record(**fields):
    summary = metrics.Repeats(index=1, runs=2, kept=2, ordered_by="train_seconds", flops=1e12, vflops=9e11,
                              quality=0.9, cv_flops=0.01, cv_quality=0.02, reached=2, time_to_quality=1.5,
                              cv_epochs_to_quality=0.0)
    base = dict(hpcai500="0.0", run_dir="runs/x", input={"path": "HPCAI500.dat", "sha256": "s", "text": "t"},
                config={}, settings={}, environment={}, conventions=["c"], roofline={}, status="complete",
                tests=[result(), result(repetition=1, seed=43)], repeats=[summary])
    return results.Record(**{**base, **fields})


def _write(tmp_path, obj) -> str:
    path = tmp_path / "results.json"
    path.write_text(json.dumps(obj))
    return str(path)


def test_round_trip_is_the_same_typed_record(tmp_path):
    rec = _record()
    back = results.load(_write(tmp_path, rec.json()))
    assert back == rec
    assert isinstance(back.tests[1], results.TestResult) and back.tests[1].seed == 43
    assert isinstance(back.repeats[0], metrics.Repeats) and back.repeats[0].time_to_quality == 1.5


def test_a_later_minors_key_is_left_out_an_earlier_minors_missing_key_takes_its_default(tmp_path):
    obj = _record().json()
    obj["tests"][0]["from_schema_2_9"] = 1       # a later minor adds keys only: ours still mean the same
    obj["later_record_key"] = {}
    for key in ("higher_is_better", "reduce_seconds"):   # 2.1 had neither
        del obj["tests"][1][key]
    back = results.load(_write(tmp_path, obj))
    assert not hasattr(back.tests[0], "from_schema_2_9") and back.tests[0] == result()
    assert back.tests[1] == result(repetition=1, seed=43)   # the defaults: higher is better, 0.0 s


def test_a_missing_key_or_a_value_of_another_type_is_refused_naming_it(tmp_path):
    obj = _record().json()
    del obj["tests"][1]["flops"], obj["tests"][1]["quality"]
    path = _write(tmp_path, obj)
    with pytest.raises(ValueError) as e:
        results.load(path)
    assert str(e.value) == (f"{path}: tests[1] (test 1 rep 1): found no flops, quality, expected every key of a"
                            " TestResult of results schema 2.x")
    obj = _record().json()
    obj["tests"][0]["train_seconds"] = 2          # a whole number is a float: another writer may write 2.0 so
    assert results.load(_write(tmp_path, obj)).tests[0].train_seconds == 2
    obj["tests"][0]["time_to_quality"] = "soon"
    with pytest.raises(ValueError, match=r'tests\[0\] \(test 1 rep 0\): found time_to_quality = "soon", '
                                         r"expected float \| None$"):
        results.load(_write(tmp_path, obj))
    obj = _record().json()
    obj["repeats"] = {"1": {}}
    with pytest.raises(ValueError, match=r'json: found repeats = \{"1": \{\}\}, expected list$'):
        results.load(_write(tmp_path, obj))
    del obj["roofline"]
    with pytest.raises(ValueError, match=r"results.json: found no roofline, expected every key of a Record"):
        results.load(_write(tmp_path, obj))


def test_another_major_is_refused_naming_both_versions(tmp_path):
    obj = replace(_record(), schema="3.0").json()
    with pytest.raises(ValueError, match=r"found results schema 3.0, expected 2.x \(this is hpcai500 with results"
                                         rf" schema {results.SCHEMA};"):
        results.load(_write(tmp_path, obj))
    with pytest.raises(ValueError, match=r"found results schema 1 \(no schema key"):
        results.load(_write(tmp_path, {"tests": []}))
