"""MLLOG: a base model's log, built as harness/run.py builds it, passes MLPerf HPC's own
compliance checker with our rules (harness/mllog_rules/), and fails it for each thing
those rules guard; our rules are the package's but for the benchmark name. In-process."""
import json
import logging
import os

import pytest
import yaml

from harness import mllog, workloads
from mlperf_logging.compliance_checker import mlp_compliance, mlp_parser

PACKAGE_RULES = os.path.join(os.path.dirname(mlp_compliance.__file__), "hpc_3.0.0")
T0 = 1_700_000_000.0  # wall-clock seconds of a made-up run


def build(division="closed", workload="digits", evals=(2,), epochs=2):
    """A base model's log up to its last evaluation, in run.py's order (before close)."""
    log = mllog.BaseModelLog(test=3, job=1)
    log.init(seed=42, global_batch=64, train_samples=480, eval_samples=120, nodes=1, per_node=2,
             workload=workload, division=division, org="Test Org", platform="1 x test CPU", status="onprem")
    log.staging(T0 + 1, T0 + 2, 480, 12345)
    log.run_start()
    for e in range(1, epochs + 1):
        log.epoch_start(e)
        log.epoch_stop(e)
        if e in evals:
            log.eval(e, 0.5 + e / 10, start_s=T0 + 10 * e, stop_s=T0 + 10 * e + 1)
    return log.lines


def complete(**kw):
    return mllog.close(build(**kw), ensemble_quality=0.93, reached=True, instance_id=1)


def write(tmp_path, lines, name="model.log"):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def keys(lines):
    return [json.loads(ln.split(":::MLLOG ", 1)[1])["key"] for ln in lines]


def edit(lines, key, change):
    """The lines with change(record) applied to every record of `key` (None: dropped)."""
    out = []
    for ln in lines:
        rec = json.loads(ln.split(":::MLLOG ", 1)[1])
        if rec["key"] == key:
            rec = change(rec)
        if rec is not None:
            out.append(":::MLLOG " + json.dumps(rec))
    return out


# ------------------------------------------------------------------ passing logs
@pytest.mark.parametrize("division", ["closed", "open"])
def test_a_complete_log_passes(tmp_path, division):
    assert mllog.check(write(tmp_path, complete(division=division))) == []


def test_every_workload_of_the_harness_is_a_benchmark_of_our_rules(tmp_path):
    from harness import workloads
    for name in workloads.CHOICES:
        assert mllog.check(write(tmp_path, complete(workload=name), f"{name}.log")) == [], name


def test_several_evaluations_pass_and_carry_their_epoch(tmp_path):
    lines = complete(evals=(1, 2, 3), epochs=3)
    assert mllog.check(write(tmp_path, lines)) == []
    evals = [json.loads(ln.split(":::MLLOG ", 1)[1]) for ln in lines]
    evals = [r for r in evals if r["key"] in ("eval_start", "eval_accuracy", "eval_stop")]
    assert [(r["key"], r["metadata"]["epoch_num"]) for r in evals] == [
        (k, e) for e in (1, 2, 3) for k in ("eval_start", "eval_accuracy", "eval_stop")]
    first = evals[:3]
    assert [r["time_ms"] for r in first] == [int((T0 + 10) * 1e3)] + [int((T0 + 11) * 1e3)] * 2
    assert first[1]["value"] == pytest.approx(0.6)


def test_the_order_is_the_rules(tmp_path):
    """submission keys and staging inside init; evaluation after the epoch; the end last."""
    k = keys(complete())
    init, stop = k.index("init_start"), k.index("init_stop")
    for key in ("submission_benchmark", "submission_org", "submission_platform", "submission_division",
                "submission_status", "cache_clear", "staging_start", "staging_stop"):
        assert init < k.index(key) < stop, key
    assert k.index("staging_start") < k.index("staging_stop")
    assert stop < k.index("run_start") < k.index("epoch_stop") < k.index("eval_start")
    assert k[-2:] == [mllog.ENSEMBLE_QUALITY, "run_stop"]


def test_the_package_parser_reads_our_lines_back(tmp_path):
    lines = complete()
    parsed, errors = mlp_parser.parse_file(str(write(tmp_path, lines)), ruleset="3.0.0")
    assert errors == []
    assert [ln.key for ln in parsed] == keys(lines)
    assert {ln.value["metadata"]["instance_id"] for ln in parsed} == {1}
    ens = next(ln for ln in parsed if ln.key == mllog.ENSEMBLE_QUALITY)
    assert ens.value["value"] == pytest.approx(0.93) and ens.value["metadata"]["target_reached"] is True
    assert "ensemble" in ens.value["metadata"]["scope"]


# ------------------------------------------------------------------ the end of the log
@pytest.mark.parametrize("reached,status", [(True, "success"), (False, "aborted")])
def test_close_says_success_only_when_the_ensemble_reached_the_target(tmp_path, reached, status):
    lines = build()
    before = list(lines)
    closed = mllog.close(lines, ensemble_quality=0.4, reached=reached, instance_id=1, time_s=T0 + 99)
    assert lines == before                              # pure: the given list is left as it was
    assert closed[:len(lines)] == lines and len(closed) == len(lines) + 2
    stop = json.loads(closed[-1].split(":::MLLOG ", 1)[1])
    assert stop["key"] == "run_stop" and stop["metadata"]["status"] == status
    assert stop["metadata"]["instance_id"] == 1 and stop["time_ms"] == int((T0 + 99) * 1e3)
    assert mllog.check(write(tmp_path, closed)) == []   # aborted is a compliant status too


def test_close_refuses_a_log_that_already_ended():
    with pytest.raises(ValueError, match="already has a run_stop"):
        mllog.close(complete(), ensemble_quality=0.9, reached=True, instance_id=1)


def test_init_refuses_what_the_rules_would():
    log = mllog.BaseModelLog(0, 0)
    base = dict(seed=1, global_batch=1, train_samples=1, eval_samples=1, nodes=1, per_node=1,
                workload="digits", division="closed", org="o", platform="p", status="onprem")
    for bad in ({"division": "mixed"}, {"status": "lab"}, {"org": ""}, {"platform": ""}):
        with pytest.raises(ValueError):
            log.init(**{**base, **bad})
    assert log.lines == []


# ------------------------------------------------------------------ failing logs
@pytest.mark.parametrize("case,problem", [
    ("no submission_org", "submission_org"),
    ("wrong benchmark", "submission_benchmark"),
    ("MLPerf's benchmark name", "submission_benchmark"),
    ("no run_stop", "run_stop"),
    ("eval_stop without epoch_num", "eval_stop"),
    ("two run_stop", "run_stop"),
    ("no eval", "eval_start"),
    ("unknown division", "submission_division"),
])
def test_the_checker_names_what_is_wrong(tmp_path, case, problem):
    lines = {
        "no submission_org": lambda: edit(complete(), "submission_org", lambda r: None),
        "wrong benchmark": lambda: complete(workload="mnist"),
        "MLPerf's benchmark name": lambda: edit(complete(), "submission_benchmark",
                                                lambda r: {**r, "value": "cosmoflow"}),
        "no run_stop": lambda: build(),
        "eval_stop without epoch_num": lambda: edit(complete(), "eval_stop", lambda r: {
            **r, "metadata": {k: v for k, v in r["metadata"].items() if k != "epoch_num"}}),
        "two run_stop": lambda: complete() + complete()[-1:],
        "no eval": lambda: complete(evals=()),
        "unknown division": lambda: edit(complete(), "submission_division", lambda r: {**r, "value": "mixed"}),
    }[case]()
    messages = mllog.check(write(tmp_path, lines))
    assert messages, case
    assert any(problem in m for m in messages), (case, messages)
    assert mlp_compliance.enqueued_configs == []


def test_a_line_that_does_not_parse_is_reported(tmp_path):
    lines = complete()
    lines[5] = lines[5][:-10]
    messages = mllog.check(write(tmp_path, lines))
    assert any("does not parse" in m for m in messages)


def test_check_leaves_no_trace(tmp_path, monkeypatch):
    """No compliance_checker.log, an empty queue of rule files, the root logger as it
    was: check() can run many times in one process."""
    monkeypatch.chdir(tmp_path)
    root = logging.getLogger()
    handlers = list(root.handlers)
    mlp_compliance.enqueued_configs.append("left over by someone else")
    good, bad = write(tmp_path, complete(), "good.log"), write(tmp_path, build(), "bad.log")
    for _ in range(3):
        assert mllog.check(good) == []
        assert mllog.check(bad) != []
        assert mlp_compliance.enqueued_configs == []
    assert not (tmp_path / "compliance_checker.log").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.log", "good.log"]
    assert root.handlers == handlers


# ------------------------------------------------------------------ our rules = the package's, but one
def _rules(folder, name):
    with open(os.path.join(folder, name)) as f:
        return yaml.load(f, Loader=yaml.BaseLoader)   # as the package loads them


def _keys_of(records):
    return {r["KEY"]["NAME"]: r["KEY"] for r in records if list(r)[0] == "KEY"}


# (file, key) -> fields that may differ from the package's
RELAXED = {("common.yaml", "submission_division"): {"POST"},
           ("closed_common.yaml", "submission_benchmark"): {"CHECK", "POST"},
           ("open_common.yaml", "submission_benchmark"): {"CHECK", "POST"}}


@pytest.mark.parametrize("name", ["common.yaml", "closed_common.yaml", "open_common.yaml"])
def test_our_rules_are_the_packages_but_the_relaxed_one(name):
    ours, theirs = _rules(mllog.RULES, name), _rules(PACKAGE_RULES, name)
    ours_k, theirs_k = _keys_of(ours), _keys_of(theirs)
    assert list(ours_k) == list(theirs_k)              # every key, in the same order
    for key, rule in theirs_k.items():
        free = RELAXED.get((name, key), set())
        for field in set(rule) | set(ours_k[key]):
            if field not in free:
                assert ours_k[key].get(field) == rule.get(field), (name, key, field)
    # no other record (BEGIN, END) than the package's, BEGIN compared below
    assert [list(r)[0] for r in ours] == [list(r)[0] for r in theirs]


def test_the_relaxed_rules_say_what_the_brief_says():
    common = _keys_of(_rules(mllog.RULES, "common.yaml"))
    assert "s['rules_dir']" in common["submission_division"]["POST"]
    assert "hpc_3.0.0" not in common["submission_division"]["POST"]
    for div in ("closed", "open"):
        bench = _keys_of(_rules(mllog.RULES, f"{div}_common.yaml"))["submission_benchmark"]
        assert "POST" not in bench                          # no benchmark file enqueued
        ok = {"v": {"value": None}}
        ours = [(f"hpcai500-{w}", True) for w in workloads.CHOICES]   # every workload, none forgotten
        for value, passes in ours + [("cosmoflow", False), ("deepcam", False), ("hpcai500-x", False)]:
            ok["v"]["value"] = value
            assert eval(bench["CHECK"].strip(), {}, ok) is passes, value


def test_our_begin_block_only_adds_the_rules_folder():
    def begin(folder):
        code = next(r["BEGIN"]["CODE"] for r in _rules(folder, "common.yaml") if list(r)[0] == "BEGIN")
        s = {}
        exec(code.strip(), {"s": s}, {"s": s, "config_file": os.path.join(mllog.RULES, "common.yaml")})
        return s
    ours, theirs = begin(mllog.RULES), begin(PACKAGE_RULES)
    assert ours.pop("rules_dir") == mllog.RULES
    assert ours == theirs


def test_each_rule_file_says_what_it_changed():
    """...and which package it copies: upgrading mlperf-logging means copying its rules again."""
    from importlib.metadata import version
    assert version("mlperf-logging") == "4.1.68"
    for name in ("common.yaml", "closed_common.yaml", "open_common.yaml"):
        head = open(os.path.join(mllog.RULES, name)).read().split("\n- ", 1)[0]
        assert "mlperf-logging 4.1.68" in head and f"hpc_3.0.0/{name}" in head, name
