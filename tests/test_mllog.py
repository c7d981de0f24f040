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


LAMB = {"name": "LAMB", "learning_rate": 0.01, "beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-6, "weight_decay": 0.01,
        "global_clipnorm": 1.0}   # an optimizer's get_config(), as train.py's hooks pass it


def build(division="closed", workload="digits", evals=(2,), epochs=2, optimizer=("lamb", LAMB)):
    """A base model's log up to its last evaluation, in run.py's order (before close)."""
    log = mllog.BaseModelLog(test=3, job=1)
    log.init(seed=42, global_batch=64, train_samples=480, eval_samples=120, nodes=1, per_node=2,
             workload=workload, division=division, org="Test Org", platform="1 x test CPU", status="onprem")
    log.staging(T0 + 1, T0 + 2, 480, 12345)
    log.recipe(mllog.recipe(*optimizer, peak_lr=0.02, warmup_steps=10, total_steps=100))
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
           ("deepcam.yaml", "opt_name"): {"CHECK", "POST"}, ("deepcam.yaml", "scheduler_type"): {"POST"},
           ("closed_common.yaml", "submission_benchmark"): {"CHECK", "POST"},
           ("open_common.yaml", "submission_benchmark"): {"CHECK", "POST"}}


# ours -> (the package's file, its keys that ours leaves out or moves)
COPIES = {"common.yaml": ("common.yaml", ()), "closed_common.yaml": ("closed_common.yaml", ()),
          "open_common.yaml": ("open_common.yaml", ()),
          "deepcam.yaml": ("closed_deepcam.yaml", ("opt_betas", "opt_eps", "train_samples", "eval_samples",
                                                   "eval_accuracy")),
          "deepcam_lamb.yaml": ("closed_deepcam_lamb.yaml", ()),
          "deepcam_cosine_annealing.yaml": ("closed_deepcam_cosine_annealing.yaml", ()),
          "deepcam_multistep.yaml": ("closed_deepcam_multistep.yaml", ())}


@pytest.mark.parametrize("name", list(COPIES) + ["deepcam_adam.yaml"])
def test_our_rules_are_the_packages_but_the_relaxed_one(name):
    package, left_out = COPIES.get(name, ("closed_deepcam.yaml", None))
    ours, theirs = _rules(mllog.RULES, name), _rules(PACKAGE_RULES, package)
    ours_k, theirs_k = _keys_of(ours), _keys_of(theirs)
    if left_out is None:      # deepcam_adam.yaml: the two rules moved out of deepcam.yaml
        theirs_k = {k: theirs_k[k] for k in ("opt_betas", "opt_eps")}
        theirs = [r for r in theirs if r["KEY"]["NAME"] in theirs_k]
    else:
        theirs_k = {k: r for k, r in theirs_k.items() if k not in left_out}
        theirs = [r for r in theirs if list(r)[0] != "KEY" or r["KEY"]["NAME"] not in left_out]
    assert list(ours_k) == list(theirs_k)              # every key, in the same order
    for key, rule in theirs_k.items():
        free = RELAXED.get((name, key), set())
        for field in set(rule) | set(ours_k[key]):
            if field not in free:
                assert ours_k[key].get(field) == rule.get(field), (name, key, field)
    # no other record (BEGIN, END) than the package's, BEGIN compared below; where the
    # package has no BEGIN, ours may add one that only names its folder (rules_dir)
    kinds = [list(r)[0] for r in ours]
    if kinds[:1] == ["BEGIN"] and [list(r)[0] for r in theirs][:1] != ["BEGIN"]:
        assert ours[0]["BEGIN"]["CODE"].strip() == "s.update({'rules_dir': __import__('os').path.dirname(config_file)})"
        kinds = kinds[1:]
    assert kinds == [list(r)[0] for r in theirs]


def test_the_relaxed_rules_say_what_the_brief_says():
    common = _keys_of(_rules(mllog.RULES, "common.yaml"))
    assert "s['rules_dir']" in common["submission_division"]["POST"]
    assert "hpc_3.0.0" not in common["submission_division"]["POST"]
    for div in ("closed", "open"):
        bench = _keys_of(_rules(mllog.RULES, f"{div}_common.yaml"))["submission_benchmark"]
        assert "s['rules_dir']" in bench["POST"] and "'deepcam.yaml'" in bench["POST"]   # ours, deepcam's only
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
    for name, (package, _) in COPIES.items():
        head = open(os.path.join(mllog.RULES, name)).read().split("\n- ", 1)[0]
        assert "mlperf-logging 4.1.68" in head and f"hpc_3.0.0/{package}" in head, name


# ------------------------------------------------------------------ the recipe, deepcam's rules
def test_recipe_keys_by_hand():
    """LAMB at a peak LR of 0.02, 10 warm-up steps of 100: cosine over the other 90."""
    keys = mllog.recipe("lamb", LAMB, 0.02, 10, 100)
    assert keys == {"gradient_accumulation_frequency": 1, "batchnorm_group_size": 1, "opt_name": "LAMB",
                    "opt_lr": 0.02, "opt_weight_decay": 0.01, "scheduler_type": "cosine_annealing",
                    "scheduler_lr_warmup_steps": 10, "scheduler_lr_warmup_factor": 1.0, "scheduler_t_max": 90,
                    "scheduler_eta_min": 0.0, "opt_betas": [0.9, 0.999], "opt_eps": 1e-6,
                    "opt_bias_correction": True, "opt_grad_averaging": True, "opt_max_grad_norm": 1.0}
    adam = {"beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-6}
    assert mllog.recipe("adam", {**adam, "weight_decay": 0.01}, 0.1, 0, 5)["opt_name"] == "AdamW"
    assert mllog.recipe("adam", {**adam, "weight_decay": None}, 0.1, 0, 5)["opt_name"] == "Adam"
    sgd = mllog.recipe("sgd", {"momentum": 0.9, "weight_decay": None}, 0.1, 0, 5)
    assert sgd["opt_momentum"] == 0.9 and "opt_betas" not in sgd and sgd["scheduler_t_max"] == 5
    wrapped = {"inner_optimizer": {"class_name": "LAMB", "config": LAMB}, "dynamic": True}   # fp16's loss scaling
    assert mllog.recipe("lamb", wrapped, 0.02, 10, 100) == keys


@pytest.mark.parametrize("optimizer, problem", [
    (("lamb", {**LAMB, "global_clipnorm": None}), "opt_max_grad_norm"),     # MLPerf: LAMB clips at 1
    (("adam", {"beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-7}), "opt_eps"),   # Keras' default eps, not 1e-6
    (None, "opt_name")])                                                     # no recipe logged at all
def test_deepcams_rules_check_the_recipe(tmp_path, optimizer, problem):
    lines = complete(workload="deepcam", **({"optimizer": optimizer} if optimizer else {}))
    if optimizer is None:
        lines = [ln for ln in lines if not any(f'"key": "{k}"' in ln for k in mllog.recipe("lamb", LAMB, 1, 0, 1))]
    messages = mllog.check(write(tmp_path, lines))
    assert messages and any(problem in m for m in messages), messages
    assert mllog.check(write(tmp_path, complete(workload="digits", **({"optimizer": optimizer} if optimizer else {})),
                             "digits.log")) == []     # the other workloads' rules ask for none of it


def test_deepcam_passes_with_every_optimizer_of_line_18(tmp_path):
    configs = {"sgd": {"momentum": 0.9}, "lars": {"momentum": 0.9}, "adagrad": {"epsilon": 1e-7},
               "adam": {"beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-6, "weight_decay": 0.01}, "lamb": LAMB}
    for name, config in configs.items():
        assert mllog.check(write(tmp_path, complete(workload="deepcam", optimizer=(name, config)), f"{name}.log")) \
            == [], name
