"""`hpcai500.py --verify runs/<id>` (harness/verify.py): the whole run's residual check.

In-process: flops.rule on hand-computed records (the pure half of the FLOP count that
the verifier re-derives from), and folders that are not runs. Under mpirun (`mpi`):
one small real run (conftest's bagging_run: 4 ranks, M = 2 jobs of P = 2, 2 epochs,
staged, no micro-kernels), shared by the cases; each case verifies its own copy of the run folder,
edited the way the case says: a real run passes every check, and each edit fails the
check that names it."""
import io
import json
import shutil
import subprocess
import sys
import time
from dataclasses import replace

import pytest

from harness import dat, division, flops, heartbeat, results, verify
from tests.conftest import ROOT, dat_text, mpi_env, record, result


# ---- flops.rule: Table 3 on hand-computed records, no TensorFlow ----------------------

def test_rule_conv_by_hand():
    # 10x12x3 input, 3x3 valid conv, 5 filters -> 8x10x5 output, bias and ReLU fused
    rec = {"layer": "c", "kind": "conv", "kernel": 9, "cin": 3, "groups": 1, "filters": 5, "out": 8 * 10 * 5,
           "bias": 1, "activation": "relu"}
    assert flops.rule(rec) == {"convolution": 2 * 9 * 3 * 400, "elementwise": 400 + 400}
    # 12 filters in 4 groups on 8 channels: each filter sees 2; no bias, linear
    grouped = {**rec, "cin": 8, "groups": 4, "filters": 12, "out": 8 * 8 * 12, "bias": 0, "activation": "linear"}
    assert flops.rule(grouped) == {"convolution": 2 * 9 * 2 * 768, "elementwise": 0}


def test_rule_dense_by_hand():
    rec = {"layer": "d", "kind": "dense", "fin": 20, "out": 7, "bias": 1, "activation": "softmax"}
    assert flops.rule(rec) == {"dense": 2 * 20 * 7, "elementwise": 7}   # softmax: not counted
    # TimeDistributed: the same call 5 times per sample
    assert flops.rule({**rec, "times": 5}) == {"dense": 5 * 2 * 20 * 7, "elementwise": 5 * 7}


def test_rule_pooling_by_hand():
    assert flops.rule({"kind": "pooling", "out": 4 * 4 * 6}) == {"pooling": 96}        # 8x8x6, 2x2 max pool
    assert flops.rule({"kind": "global_pooling", "in": 8 * 8 * 6}) == {"pooling": 384}  # every input read once
    assert flops.rule({"kind": "normalization", "out": 75}) == {"normalization": 75}


def test_rule_merge_and_activations_by_hand():
    assert flops.rule({"kind": "merge", "inputs": 3, "out": 32}) == {"elementwise": 2 * 32}  # k - 1 adds
    assert flops.rule({"kind": "activation", "activation": "relu", "out": 32}) == {"elementwise": 32}
    assert flops.rule({"kind": "activation", "activation": "softmax", "out": 32}) == {"elementwise": 0}


def test_rule_depthwise_separable_transposed_by_hand():
    # 9x9x4, 3x3 valid, depth_multiplier 2 -> 7x7x8 (then 1x1 to 6 for the separable)
    dw = {"kind": "depthwise", "kernel": 9, "cin": 4, "depth_multiplier": 2, "out": 7 * 7 * 8, "bias": 0,
          "activation": "linear"}
    assert flops.rule(dw)["depthwise"] == 2 * 9 * 4 * 49 * 2
    sep = {"kind": "separable", "kernel": 9, "cin": 4, "depth_multiplier": 2, "filters": 6, "out": 7 * 7 * 6,
           "bias": 0, "activation": "linear"}
    assert flops.rule(sep) == {"depthwise": 2 * 9 * 4 * 49 * 2, "convolution": 2 * 8 * 49 * 6, "elementwise": 0}
    tr = {"kind": "transposed", "kernel": 9, "filters": 5, "in": 4 * 4 * 3, "out": 8 * 8 * 5, "bias": 0,
          "activation": "linear"}
    assert flops.rule(tr) == {"convolution": 2 * 9 * 5 * 48, "elementwise": 0}


def test_rule_refuses_to_guess():
    with pytest.raises(ValueError, match="no Table 3 rule for a record of kind 'lstm'"):
        flops.rule({"layer": "l", "kind": "lstm", "out": 4})
    with pytest.raises(ValueError, match="layer 'd' lacks 'fin'"):
        flops.rule({"layer": "d", "kind": "dense", "out": 4, "bias": 0, "activation": "linear"})


def test_by_operator_sums_rules_over_records():
    recs = [{"kind": "dense", "fin": 3, "out": 2, "bias": 1, "activation": "relu"}, {"kind": "pooling", "out": 5}]
    assert flops.by_operator(recs) == {**dict.fromkeys(flops.OPERATORS, 0), "dense": 12, "elementwise": 4,
                                       "pooling": 5}


def test_verify_imports_neither_tensorflow_nor_mpi():
    code = ("import sys, harness.verify; bad = [m for m in ('tensorflow', 'mpi4py.MPI', 'horovod') "
            "if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


# ---- not a run: one message, exit status 1 ------------------------------------------------

def test_a_folder_that_is_not_a_run_is_refused(tmp_path, capsys):
    assert verify.main(str(tmp_path)) == 1
    assert capsys.readouterr().err.strip() == f"hpcai500: error: --verify: {tmp_path}: no results.json " \
                                              "(not a runs/<id> folder?)"
    (tmp_path / "results.json").write_text("{not json")
    assert verify.main(str(tmp_path)) == 1
    err = capsys.readouterr()
    assert err.out == "" and len(err.err.strip().splitlines()) == 1 and "not valid JSON" in err.err
    assert verify.main(str(tmp_path / "nowhere")) == 1
    assert "not a folder" in capsys.readouterr().err


def test_a_results_directory_verifies_its_newest_run_and_names_it(tmp_path, capsys):
    """Issue 66: as --status judges it, the newest run folder by name (a batch script knows
    line 5, not the run's name), named before its checks; here that run's results.json is
    broken, so the refusal shows which folder was read."""
    (tmp_path / "20261126-090000-aaaaaa").mkdir()
    (tmp_path / "20261126-090000-aaaaaa" / "results.json").write_text(json.dumps(record("complete").json()))
    newest = tmp_path / "20261126-091500-bbbbbb"
    newest.mkdir()
    (newest / "results.json").write_text("{not json")
    assert verify.main(str(tmp_path)) == 1
    out, err = capsys.readouterr()
    assert out == f"{tmp_path}: a results directory of 2 run(s); verifying its newest, {newest}\n"
    assert err.startswith(f"hpcai500: error: --verify: {newest / 'results.json'}: not valid JSON"), err


# ---- a run that did not complete: its own exit status (pure) ------------------------------

def test_a_failed_check_wins_then_an_incomplete_run():
    ok, bad = verify.Check("a", True), verify.Check("b", False)
    cases = [([ok], "complete"), ([ok], "running"), ([ok], "interrupted"), ([ok, bad], "interrupted"),
             ([ok, bad], "complete")]
    assert [verify.outcome(c, s) for c, s in cases] == ["PASSED", "INCOMPLETE", "INCOMPLETE", "FAILED", "FAILED"]
    assert verify.EXIT == {"PASSED": 0, "FAILED": 1, "INCOMPLETE": 2}
    assert verify.incomplete_line("complete") is None
    assert verify.incomplete_line("running") == ("Incomplete run: results.json says `running`, not `complete`: the"
                                                 " checks cover its finished test runs only; not a result to submit")


def test_test_runs_finished_are_counted_against_those_planned():
    """The shipped sweep, test 3 skipped, 2 repetitions: 4 test runs planned."""
    done = [result(index=i, repetition=r) for i in (1, 2) for r in (0, 1)]
    what = ("test runs finished {} those planned (the sweep's tests that fit the world x the repetitions): {}"
            " ...... {}")
    assert verify.count_check(record("complete", done)).line() == what.format("=", "4 of 4", "PASSED")
    # a test run dropped from a complete run's record (and its report) changes no other figure
    assert verify.count_check(record("complete", done[:3])).line() == what.format("=", "3 of 4", "FAILED")
    assert verify.count_check(record("interrupted", done[:1])).line() == \
        what.format("<=", "1 of 4, the run `interrupted`", "PASSED")
    assert verify.count_check(record("running", done + done[:1])).line() == \
        what.format("<=", "5 of 4, the run `running`", "FAILED")


# ---- the division judged again from the recorded data facts (pure) ---------------------------
# The vendor's case: line 8 the path of the folder --check wrote for ic's synthetic:40:224, 5 repetitions
VENDOR = "runs/.data/ic-synthetic-40-224"
IC_CFG = dat.parse_text(dat_text(l7="ic", l8=VENDOR, l9=1, l10=1, l11=1, l27=5), "x.dat")
GENERATED = {"marker": f"{VENDOR}/hpcai500-ic.json", "classes": 10, "train_samples": 32, "val_samples": 8}
IMAGENET = {"marker": None, "classes": 1000, "train_samples": 1281167, "val_samples": 50000}
REASONS = [f"data written by hpcai500 ({VENDOR}/hpcai500-ic.json), not the published ImageNet",
           "10 classes, ImageNet has 1,000", "32 training samples, ImageNet's training set has 1,281,167",
           "8 validation samples, ImageNet's validation set has 50,000"]
CONVENTIONS = ["ic: data facts (the division's, harness/division.py): classes 10; marker"
               f" {VENDOR}/hpcai500-ic.json; train_samples 32; val_samples 8"]


def _ic(**fields):
    """The vendor's test as the run records it: open, with its data facts' reasons."""
    return result(**{"workload": "ic", "data": VENDOR, "train_samples": 32, "val_samples": 8, "division": "open",
                     "open_reasons": REASONS, "data_facts": GENERATED, **fields})


def test_a_path_to_generated_data_verifies_open():
    t = _ic()
    assert verify.division_check(t, IC_CFG, {}).line() == \
        "test 1 rep 0: division (harness/division.judge): recorded 'open', re-derived 'open' ...... PASSED"
    assert verify.data_facts_check(t, CONVENTIONS, "2.17") == verify.Check(
        "test 1 rep 0: data facts = the test's sample counts and the conventions' data line", True,
        note=CONVENTIONS[0])


def test_generated_data_edited_to_closed_fails_naming_why():
    check = verify.division_check(_ic(division="closed", open_reasons=[]), IC_CFG, {})
    assert not check.ok and check.derived == ["open", REASONS]
    assert check.note == "claimed closed, but the rules make it open: " + "; ".join(REASONS)


def test_facts_edited_to_the_published_sets_fail_against_the_rest_of_the_record():
    """Closed and ImageNet's facts agree with each other, so the division check passes; the
    test's own sample counts and the conventions' line say otherwise, and each is named."""
    forged = _ic(division="closed", open_reasons=[], data_facts=IMAGENET)
    assert verify.division_check(forged, IC_CFG, {}).ok
    check = verify.data_facts_check(forged, CONVENTIONS, "2.17")
    assert not check.ok
    assert check.recorded == {"train_samples": 32, "val_samples": 8, "conventions": False}
    assert check.derived == {"train_samples": 1281167, "val_samples": 50000, "conventions": True}
    counts_too = replace(forged, train_samples=1281167, val_samples=50000)
    check = verify.data_facts_check(counts_too, CONVENTIONS, "2.17")
    assert (check.ok, check.recorded, check.derived) == (False, {"conventions": False}, {"conventions": True})
    assert check.note == ("differs: conventions; the conventions hold no line `ic: data facts (the division's,"
                          " harness/division.py): classes 1,000; marker none; train_samples 1,281,167;"
                          " val_samples 50,000`")


def test_facts_dropped_from_a_2_17_record_fail_and_a_2_16_record_is_judged_as_before():
    """results.load gives a file without the key None: from 2.17 that is an edit; before, the
    facts were not recorded, and the division is judged without them, as that run judged it."""
    dropped = _ic(data_facts=None, division="closed", open_reasons=[])
    check = verify.data_facts_check(dropped, CONVENTIONS, "2.17")
    assert (check.ok, check.note) == (False, "missing: results schema 2.17 records them (from 2.17)")
    check = verify.data_facts_check(dropped, [], "2.16")
    assert (check.ok, check.note) == (True, "not recorded: results schema 2.16")
    check = verify.division_check(dropped, IC_CFG, {}, schema="2.16")
    assert (check.ok, check.note) == (True, "no data facts recorded (results schema 2.16): judged without them")


# ---- a real run, and edits of it ------------------------------------------------------------

@pytest.fixture(scope="module")
def real_run(bagging_run):
    """The shared real run of tests/conftest.py (4 ranks, M = 2 jobs of P = 2, 2 epochs,
    staged, the report also in a file): its run folder and its input file."""
    folder, proc = bagging_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = [p for p in (folder / "runs").iterdir() if not p.name.startswith(".")]
    return run, folder / "test.dat"


@pytest.fixture
def run_copy(real_run, tmp_path):
    """A copy of the real run's folder for one case to edit."""
    run, _ = real_run
    dst = tmp_path / run.name
    shutil.copytree(run, dst)
    return dst


def _verify(run_dir):
    out = io.StringIO()
    status = verify.main(str(run_dir), out=out)
    return status, out.getvalue().splitlines()


def _failed(lines):
    return [ln for ln in lines[:-1] if ln.endswith("...... FAILED")]


def _edit_results(run_dir, edit):
    path = run_dir / "results.json"
    res = json.loads(path.read_text())
    edit(res)
    path.write_text(json.dumps(res, indent=1))


@pytest.mark.mpi
def test_the_real_run_verifies(run_copy):
    # the command line, in a process that must load neither TensorFlow nor MPI
    proc = subprocess.run([sys.executable, str(ROOT / "hpcai500.py"), "--verify", str(run_copy)], cwd=ROOT,
                          env=mpi_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines and all(ln.endswith("...... PASSED") for ln in lines), "\n".join(_failed(lines))
    assert " 0 failed" in lines[-1]
    text = "\n".join(lines)
    for what in ("input: SHA-256", "input file", "forward FLOPs per sample", "training FLOPs per sample",
                 "FLOPs per sample by operator", "samples trained", "FLOPS (total FLOPs / train_seconds)",
                 "penalty (quality / target)^n", "VFLOPS (FLOPS x penalty)", "time to solution", "utilisation",
                 "division (harness/division.judge)", "report.txt lines 1-", "footer", "pipeline (line 37: the mode resolved",
                 "each job's exchange (lines 21-22 and 37, the torus grid from the node map)",
                 "MLLOG mllog/test001_rep00_model0000.log: MLPerf HPC compliance checker: passes",
                 "MLLOG mllog/test001_rep00_model0001.log: figures"):
        assert what in text, what
    code = ("import sys; from harness import verify; rc = verify.main(sys.argv[1], out=open('/dev/null', 'w')); "
            "bad = [m for m in ('tensorflow', 'mpi4py.MPI', 'horovod') if m in sys.modules]; "
            "assert not bad, bad; sys.exit(rc)")
    subprocess.run([sys.executable, "-c", code, str(run_copy)], check=True, cwd=ROOT, timeout=120)


@pytest.mark.mpi
def test_an_edited_figure_in_the_report_fails_naming_its_line(run_copy):
    path = run_copy / "report.txt"
    lines = path.read_text().splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.startswith("Work        :"))
    original = lines[i]
    samples = original.split(":")[1].split()[0]
    lines[i] = original.replace(f": {samples} samples", f": {int(samples) + 1} samples")
    path.write_text("\n".join(lines) + "\n")
    status, out = _verify(run_copy)
    assert status == 1
    (failed,) = _failed(out)
    assert failed.startswith(f"report.txt line {i + 1} (test 1 rep 0 block): recorded {lines[i]!r}, "
                             f"re-derived {original!r}")


@pytest.mark.mpi
def test_an_edited_train_seconds_fails_the_flops(run_copy):
    res = json.loads((run_copy / "results.json").read_text())
    seconds = res["tests"][0]["train_seconds"]
    _edit_results(run_copy, lambda r: r["tests"][0].update(train_seconds=seconds * 2))
    status, out = _verify(run_copy)
    assert status == 1
    failed = _failed(out)
    t = res["tests"][0]
    assert (f"test 1 rep 0: FLOPS (total FLOPs / train_seconds): recorded {t['flops']!r}, re-derived "
            f"{t['total_flops'] / (seconds * 2)!r} ...... FAILED") in failed
    assert any("VFLOPS (FLOPS x penalty)" in ln for ln in failed)
    assert any(ln.startswith("report.txt line") for ln in failed)   # the Time column says otherwise


@pytest.mark.mpi
def test_a_missing_mllog_file_fails_naming_it(run_copy):
    (run_copy / "mllog" / "test001_rep00_model0001.log").unlink()
    status, out = _verify(run_copy)
    assert status == 1
    assert _failed(out) == ["MLLOG mllog/test001_rep00_model0001.log: missing: base model 1 of test 1 rep 0 has no"
                            " log ...... FAILED"]


@pytest.mark.mpi
def test_a_changed_input_file_fails_naming_it(real_run, run_copy):
    _, dat = real_run
    text = dat.read_text()
    try:
        dat.write_text(text.replace("HPC AI500 V3.0 benchmark input file", "HPC AI500 V3.0 benchmark input, edited",
                                    1))
        status, out = _verify(run_copy)
    finally:
        dat.write_text(text)
    assert status == 1
    (failed,) = _failed(out)
    assert failed.startswith(f"input file {dat}: SHA-256: recorded ") and "the input file changed" in failed


@pytest.mark.mpi
def test_a_division_edited_to_closed_fails(run_copy):
    res = json.loads((run_copy / "results.json").read_text())
    assert "HPCAI500_ROOFLINE_QUICK" in res["settings"]   # a test-only setting: never closed
    _edit_results(run_copy, lambda r: r["tests"][0].update(division="closed", open_reasons=[]))
    status, out = _verify(run_copy)
    assert status == 1
    failed = _failed(out)
    (division,) = [ln for ln in failed if "division (harness/division.judge)" in ln]
    assert "claimed closed, but the rules make it open" in division
    assert "test-only setting HPCAI500_ROOFLINE_QUICK=1" in division and "digits is a demonstration" in division
    # and report.txt's Division line no longer matches what results.json claims
    assert any(ln.startswith("report.txt line") and "Division" in ln for ln in failed)


@pytest.mark.mpi
def test_an_exchange_the_input_cannot_make_fails(run_copy):
    """The run's line 22 is ring: a job recorded as a torus (or an unknown library) is not it."""
    res = json.loads((run_copy / "results.json").read_text())
    assert res["tests"][0]["exchange"] == ["Horovod all-reduce, MPI"] * 2
    _edit_results(run_copy, lambda r: r["tests"][0].update(exchange=["Horovod all-reduce, MPI", "Horovod all-reduce, UCX"]))
    status, out = _verify(run_copy)
    assert status == 1
    (check,) = [ln for ln in _failed(out) if "each job's exchange" in ln]
    assert 'recorded ["Horovod all-reduce, MPI","Horovod all-reduce, UCX"]' in check
    assert any(ln.startswith("report.txt line") and "Exchange" in ln for ln in _failed(out))


@pytest.mark.mpi
def test_another_schema_major_is_refused_with_one_message(run_copy):
    _edit_results(run_copy, lambda r: r.update(schema="3.0"))
    proc = subprocess.run([sys.executable, str(ROOT / "hpcai500.py"), "--verify", str(run_copy)], cwd=ROOT,
                          env=mpi_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and proc.stdout == ""
    (message,) = proc.stderr.strip().splitlines()
    assert "found results schema 3.0, expected 2.x" in message and message.startswith("hpcai500: error: --verify:")


@pytest.mark.mpi
def test_a_test_record_missing_a_key_is_refused_naming_it(run_copy, capsys):
    """results.load reads the record typed: a test without `flops`, or with a word for
    it, is not a record of this schema: said once, naming the key and the test."""
    _edit_results(run_copy, lambda r: r["tests"][0].pop("flops"))
    head = f"hpcai500: error: --verify: {run_copy / 'results.json'}: tests[0] (test 1 rep 0): found "
    assert _verify(run_copy) == (1, [])
    assert capsys.readouterr().err.strip() == head + "no flops, expected every key of a TestResult of results" \
                                                     " schema 2.x"
    _edit_results(run_copy, lambda r: r["tests"][0].update(flops="fast"))
    assert _verify(run_copy) == (1, [])
    assert capsys.readouterr().err.strip() == head + 'flops = "fast", expected float'


def _stopped_early(run_dir, status, interrupted=None):
    """The run's results.json saying `status` (and `interrupted`) where it said complete."""
    _edit_results(run_dir, lambda r: r.update(status=status, interrupted=interrupted))


@pytest.mark.mpi
@pytest.mark.parametrize("alive", [False, True])
def test_a_run_still_running_or_dead_verifies_as_incomplete(run_copy, alive):
    """results.json left `running` and report.txt without its footer, as a run writes them
    until it ends: its heartbeat's process gone (the real run's own stamp: dead), or this
    process's fresh stamp (running). Every check passes on what is there, but the run is
    not a result: exit status 2, a line saying so, the state and counts in the last line."""
    report = run_copy / "report.txt"
    text = report.read_text()
    report.write_text(text[:text.index("\nFinished ")])    # the footer is written at the end only
    _stopped_early(run_copy, "running")
    assert (run_copy / heartbeat.NAME).is_file()
    if alive:
        (run_copy / heartbeat.NAME).write_text(json.dumps({**heartbeat.identity(), "time": time.time(),
                                                            "interval": 5.0}))
    status, out = _verify(run_copy)
    assert status == 2, "\n".join(_failed(out))
    assert not _failed(out)
    assert out[-2] == verify.incomplete_line("running")
    state = "running: last heartbeat at " if alive else "dead: not running: last heartbeat at "
    assert out[-1].startswith(f"Verified {run_copy} ({state}") and "1 of 1 test run(s) finished): " in out[-1]
    assert out[-1].endswith(" 0 failed ...... INCOMPLETE")
    assert "test runs finished <= those planned (the sweep's tests that fit the world x the repetitions): 1 of 1," \
           " the run `running` ...... PASSED" in out


@pytest.mark.mpi
def test_a_failed_run_with_a_failed_check_exits_1_and_still_says_incomplete(run_copy):
    """A run stopped on an error after its test (results.ERROR_PREFIX) whose report.txt
    still ends as a complete run's: the report's check fails, and a failed check wins."""
    _stopped_early(run_copy, "interrupted", {"reason": results.ERROR_PREFIX + "staging: disk full", "test": None})
    status, out = _verify(run_copy)
    assert status == 1
    assert _failed(out) and all(ln.startswith("report.txt line") for ln in _failed(out)), "\n".join(_failed(out))
    assert out[-2] == verify.incomplete_line("interrupted")
    assert out[-1].startswith(f"Verified {run_copy} (failed: error: staging: disk full; 1 of 1 test run(s)"
                              " finished): ") and out[-1].endswith(" failed ...... FAILED")
