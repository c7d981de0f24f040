"""The catalogue of bad input. Each case in-process, on the message: the file as a run
reads it (harness.dat.parse on a real file) and the command line as a run parses it
(harness.driver.parse_args). Then a few real runs under mpirun on 2 ranks, one per kind
of refusal, for what only a real run shows: exit status 1 on every rank, exactly one
message, no traceback, nothing under the results directory: a parser error, a
file-level error, a bad HPCAI500_* setting (the input format has no not-yet values
any more) and command-line misuse.

Cases whose exact message tests/test_dat.py asserts (line 17 'fp64', line 18 'rmsprop',
line 27 '101') are not repeated here."""
import json
import re

import pytest

from harness import dat, driver, frameworks, plan
from harness.errors import RunError
from tests.conftest import ROOT, dat_text, mpirun

LINES = {  # line -> (bad value, what the message must show)
    4: ("x", ":4: found 'x'"), 6: ("0", ":6: found '0'"), 7: ("resnet", ":7: found 'resnet'"),
    8: ("synthetic:x", ":8: found 'synthetic:x'"), 9: ("4", ":10:"), 10: ("1 -2 4", ":10: found '-2'"),
    11: ("1 0 1", ":11: found '0'"), 12: ("3", ":12: found '3'"), 13: ("2", ":14:"),
    14: ("-4", ":14: found '-4'"), 15: ("ten", ":15: found 'ten'"), 16: ("0", ":16: found '0'"),
    19: ("0", ":19: found '0'"), 20: ("11", ":20: found '11'"), 21: ("fp8", ":21: found 'fp8'"),
    22: ("tree", ":22: found 'tree'"), 23: ("jackknife", ":23: found 'jackknife'"),
    24: ("median", ":24: found 'median'"), 25: ("1.5", ":25: found '1.5'"), 26: ("-2", ":26: found '-2'"),
    27: ("0", ":27: found '0'"), 29: (str(2**32), f":29: found '{2**32}'"), 30: ("2", ":30: found '2'"), 33: ("jit", ":33: found 'jit', expected a compiler (none, xla, inductor)"),
    31: ("-1", ":31: found '-1'"), 32: ("yes", ":32: found 'yes'"), 34: ("0", ":34: found '0'"),
    35: ("mxnet", ":35: found 'mxnet', expected a framework (tensorflow, pytorch, mindspore)"),
    36: ("0", ":36: found '0'"), 37: ("pipeline:0", ":37: found '0' as pipeline's MICROBATCHES in 'pipeline:0', expected an integer >= 1"),
}


def _lines(edits=None):
    return dat_text(**{f"l{n}": v for n, v in (edits or {}).items()})


def _blank(n):
    rows = _lines().splitlines()
    rows[n - 1] = ""
    return "\n".join(rows) + "\n"


def _cases():
    for n, (value, expect) in LINES.items():
        yield f"line{n}-{value}", lambda p, n=n, value=value: p.write_text(_lines({n: value})), expect
    for n in (3, 14, 29):
        yield f"line{n}-empty", lambda p, n=n: p.write_text(_blank(n)), f":{n}: found an empty line"
    yield "short-file", lambda p: p.write_text("\n".join(_lines().splitlines()[:19]) + "\n"), ":20: found end of file"
    yield "extra-line", lambda p: p.write_text(_lines() + "surplus\n"), ":38: found 'surplus'"
    # files from before lines 31-37, 33-37, 34-37 and 36-37: the message names the lines and what to add
    yield "30-line-file", lambda p: p.write_text("\n".join(_lines().splitlines()[:30]) + "\n"), \
        ":31: found end of file, expected lines 31-37 (an input file from before time to quality has 30 lines);" \
        " add them, e.g. '1             evaluate every K epochs"
    yield "32-line-file", lambda p: p.write_text("\n".join(_lines().splitlines()[:32]) + "\n\n"), \
        ":33: found end of file, expected lines 33-37 (an input file from before the compiler line has 32 lines);" \
        " add them, e.g. 'none          compiler (none, xla, inductor)'"
    yield "33-line-file", lambda p: p.write_text("\n".join(_lines().splitlines()[:33]) + "\n"), \
        ":34: found end of file, expected lines 34-37 (an input file from before the framework lines has 33 lines);" \
        " add them, e.g. '1             # of frameworks' and 'tensorflow    frameworks (tensorflow, pytorch, mindspore)' and"
    yield "35-line-file", lambda p: p.write_text("\n".join(_lines().splitlines()[:35]) + "\n"), \
        ":36: found end of file, expected lines 36-37 (an input file from before the parallel-mode lines has 35"\
        " lines); add them, e.g. '1             # of parallel modes' and 'data          parallel modes (data, model,"
    yield "31-line-file", lambda p: p.write_text("\n".join(_lines().splitlines()[:31]) + "\n"), \
        ":32: found end of file, expected line 32: stop at target"
    yield "directory", lambda p: p.mkdir(), ":0: found a directory"
    yield "non-utf8", lambda p: p.write_bytes(_lines().encode().replace(b"sgd", b"sg\xe9")), ":0: found a non-UTF-8"
    yield "ten-megabytes", lambda p: p.write_text(_lines() + "#" * (10 << 20)), ":0: found a file over 1 MiB"


@pytest.mark.parametrize("make,expect", [c[1:] for c in _cases()], ids=[c[0] for c in _cases()])
def test_bad_input_file(tmp_path, make, expect):
    """The file as a run reads it: one line naming the file as given, the line, the token."""
    path = tmp_path / "bad.dat"
    make(path)
    with pytest.raises(dat.DatError) as info:
        dat.parse(str(path))
    msg = str(info.value)
    assert msg.startswith(f"{path}:") and "\n" not in msg, msg
    assert f"{path}{expect}" in msg, msg


# ------------------------------------------------------------------ one format for every refusal of a line
FORMAT = re.compile(r"^[^:\s]+\.dat:\d+(-\d+)?: found '[^']*'.*, expected .+")


def _refusal(edits: dict) -> str:
    """What the input file `edits` makes of the shipped one is told, in-process: the parser,
    then the plan's checks of the input on a world of 4 ranks (as plan.make runs them before
    the data); '' when they pass."""
    try:
        cfg = dat.parse_text(_lines(edits), "bad.dat")
        plan.check_allreduce(cfg)
        plan.layouts(cfg, dat.expand(cfg), 4, [0, 0, 0, 0])
    except (dat.DatError, RunError) as e:
        return str(e)
    return ""


PYTORCH_P2 = {9: 1, 10: 1, 11: 2, 35: "pytorch"}     # one base model of 2 ranks in PyTorch
REFUSED = {  # id -> (edits, what the message must hold besides the format)
    **{f"line{n}": ({n: value}, expect) for n, (value, expect) in LINES.items()},    # the parser's, each line
    "line10-too-few-values": ({10: "1 2"}, "found 'Ms'"),
    "jax-on-35": ({35: "jax"}, "bad.dat:35: found 'jax', expected a framework (tensorflow, pytorch, mindspore)"),
    "mixed-1": ({37: "mixed:1"}, "bad.dat:37: found '1' as mixed's STAGES in 'mixed:1', expected an integer >= 2"),
    "adasum-pytorch": ({22: "adasum", 35: "pytorch"}, "bad.dat:22: found 'adasum' with framework pytorch (line 35),"
                       " expected ring: " + frameworks.facts("pytorch").REFUSES["allreduce", "adasum"] + " (tests 1-3)"),
    "xla-pytorch": ({33: "xla", 35: "pytorch"}, "bad.dat:33: found 'xla' with framework pytorch (line 35), expected"
                    " one of none, inductor: "),
    "int8-adasum": ({21: "int8", 22: "adasum"}, "bad.dat:21: found 'int8' with all-reduce adasum (line 22), expected"
                    " one of fp32, fp16: "),
    "adasum-p3": ({9: 1, 10: 1, 11: 3, 22: "adasum"}, "bad.dat:22: found 'adasum' with P = 3 (line 11), expected one"
                  " of ring, hierarchical, torus, or P a power of 2: "),
    "vote-ewa": ({7: "ewa", 8: "synthetic", 24: "vote"}, "bad.dat:24: found 'vote' with workload ewa (line 7),"
                 " expected mean: the aggregations ewa defines (tests 1-3)"),
    "layout-too-large": ({9: 1, 10: 3, 11: 2}, "bad.dat:10-11: found '3 x 2', expected M x P <= 4: M x P = 3 x 2 = 6"
                         " exceeds the world size 4 (test 1)"),
    # line 37 against the rest of its test: each names the lines whose values meet in it, and only those
    "pipeline-p1-alone": ({9: 1, 10: 1, 11: 1, 35: "pytorch", 37: "pipeline"},
                          "bad.dat:37: found 'pipeline' with P = 1 (line 11), expected data, or P >= 2: one rank holds"
                          " the whole model; a split model needs a rank a stage (test 1)"),
    "mixed-3-p4": ({**PYTORCH_P2, 11: 4, 37: "mixed:3"}, "bad.dat:37: found 'mixed:3' with P = 4 (line 11), expected"
                   " mixed:STAGES with STAGES 2: STAGES must be at least 2 and divide P"),
    "tensorflow-pipeline": ({**PYTORCH_P2, 35: "tensorflow", 37: "pipeline:4"},
                            "bad.dat:37: found 'pipeline:4' with framework tensorflow (line 35), expected data: "
                            + frameworks.facts("tensorflow").NO_PIPELINE),
    "ewa-pipeline": ({**PYTORCH_P2, 7: "ewa", 8: "synthetic", 37: "model"},
                     "bad.dat:37: found 'model' with workload ewa (line 7), expected data: "),
    "fp16-pipeline": ({**PYTORCH_P2, 17: "fp16", 37: "pipeline"}, "bad.dat:37: found 'pipeline' with precision fp16"
                      " (line 17), expected data, or fp32 or bf16 on line 17: "),
    "inductor-pipeline": ({**PYTORCH_P2, 33: "inductor", 37: "pipeline"}, "bad.dat:37: found 'pipeline' with compiler"
                          " inductor (line 33), expected data, or none on line 33: "),
    "1f1b-p4": ({**PYTORCH_P2, 11: 4, 37: "pipeline:2"}, "bad.dat:37: found 'pipeline:2' with P = 4 (line 11),"
                " expected MICROBATCHES >= 4, or gpipe: 1F1B keeps every stage busy"),
    "microbatches-b": ({**PYTORCH_P2, 37: "pipeline:3"}, "bad.dat:37: found 'pipeline:3' with P = 2 (line 11) and"
                       " B = 32 (line 14), expected MICROBATCHES one of 2, 4, 8, 16, 32, 64: a pipeline of 2 stages"),
}


@pytest.mark.parametrize("edits,expect", REFUSED.values(), ids=REFUSED.keys())
def test_every_refusal_of_a_line_is_file_line_found_quoted_expected(edits, expect):
    """Issue 45: one format, `FILE:LINE: found 'X', expected Y`, the value quoted and Y what
    the line accepts, from the parser and from the plan alike; no rank before it."""
    msg = _refusal(edits)
    assert FORMAT.match(msg) and "\n" not in msg, msg
    assert expect in msg, msg


def test_refusals_that_need_the_node_or_the_data_are_in_the_format_too(monkeypatch, tmp_path):
    """The checks a run makes once it knows its nodes, their GPUs and installs, and the data."""
    cfg = dat.parse_text(_lines({9: 2, 10: "2 1", 11: "1 2", 14: 60, 35: "pytorch"}), "bad.dat")
    planned, _ = plan.layouts(cfg, dat.expand(cfg), 4, [0, 0, 1, 1])
    (tmp_path / "file").write_text("")
    one_gpu = {"pytorch": "0000:07:00.0"}       # every rank of n1 bound to one GPU (gpus.nccl_identity)
    messages = [plan.shared_gpu_problem(cfg, planned, (0, 0, 1, 1), [one_gpu] * 4, ("n1", "n2")),
                plan.results_dir_problem(dat.parse_text(_lines({5: tmp_path / "file" / "runs"}), "bad.dat"))]
    with pytest.raises(RunError) as info:                  # 50 samples: B = 60 fits neither P
        plan.batches(cfg, planned, (), {"digits": type("Data", (), {"n_train": 50})})
    messages.append(str(info.value))
    monkeypatch.setenv("CXX", "no-such-c++")
    messages.append(plan.framework_problem(dat.parse_text(_lines({33: "inductor", 35: "pytorch"}), "bad.dat")))
    monkeypatch.setattr(frameworks.facts("pytorch"), "REQUIRES", (("torch_not_here", "torch (requirements-pytorch.txt)"),))
    messages.append(plan.framework_problem(cfg))
    monkeypatch.setattr(frameworks.facts("pytorch"), "BUILT", ("digits",))
    messages.append(plan.framework_choice_problem(cfg, dat.Test(1, "ic", 1, 1, 32, "fp32", "pytorch"))[1])
    for msg in messages:
        assert FORMAT.match(msg) and "\n" not in msg, msg
    assert messages[2] == ("bad.dat:14: found '60' with P = 1 (line 11), expected at most 50: digits has 50 training"
                           " samples and a job's step takes P x B (test 1); bad.dat:14: found '60' with P = 2 (line"
                           " 11), expected at most 25: digits has 50 training samples and a job's step takes P x B"
                           " (test 2)")
    assert messages[5] == ("bad.dat:7: found 'ic' with framework pytorch (line 35), expected digits: the workloads"
                           " whose model is built in pytorch")


# ------------------------------------------------------------------ the command line
class Exited(Exception):
    pass


@pytest.fixture
def exits(monkeypatch):
    """driver._quiet_exit without its MPI barrier: records the status and stops there."""
    statuses = []

    def quiet_exit(status):
        statuses.append(status)
        raise Exited(status)
    monkeypatch.setattr(driver, "_quiet_exit", quiet_exit)
    for var in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(var, raising=False)
    return statuses


@pytest.mark.parametrize("args,expect", [
    (["a.dat", "b.dat"], "unrecognized arguments: b.dat"),
    (["--fast", "a.dat"], "unrecognized arguments: --fast"),
    (["--frobnicate", "x.dat"], "unrecognized arguments: --frobnicate"),
    (["--watchdog", "-5", "a.dat"], "argument --watchdog: expected seconds >= 0, found '-5'"),
    (["--watchdog", "soon", "a.dat"], "argument --watchdog: expected a number of seconds, found 'soon'"),
    (["--watchdog"], "argument --watchdog: expected one argument"),
    # issue 66: modes that cannot go together (driver.mode_conflict), never one silently ignored
    (["--status", "R", "--verify", "R"], "argument --status: not allowed with argument --verify: each reads earlier"
                                         " runs on its own; give one"),
    (["--summarize", "R", "S", "--status", "R"], "argument --summarize: not allowed with argument --status: each"
                                                 " reads earlier runs on its own; give one"),
    (["--verify", "R", "--check"], "argument --verify: not allowed with argument --check: --verify reads earlier"
                                   " runs (their results.json), it plans and starts none"),
    (["--status", "R", "--resume", "R"], "argument --status: not allowed with argument --resume: --status reads"
                                         " earlier runs (their results.json), it plans and starts none"),
    (["--verify", "R", "--on-fault", "drop"], "argument --verify: not allowed with argument --on-fault: --verify"
                                              " reads earlier runs (their results.json), it plans and starts none"),
    (["x.dat", "--status", "R"], "argument --status: not allowed with an input file (x.dat): --status reads earlier"
                                 " runs (their results.json), it plans and starts none"),
])
def test_command_line_misuse(exits, capsys, args, expect):
    with pytest.raises(Exited):
        driver.parse_args(args)
    assert exits == [1]
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("usage: hpcai500.py") and err.count("hpcai500: error:") == 1, err
    assert err.rstrip().endswith(f"hpcai500: error: {expect}"), err


def test_command_line_misuse_is_said_by_rank_0_only(exits, capsys, monkeypatch):
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    with pytest.raises(Exited):
        driver.parse_args(["--fast", "a.dat"])
    assert exits == [1] and capsys.readouterr() == ("", "")   # silent, but exits 1 as well


def test_good_command_lines_parse(exits, monkeypatch):
    monkeypatch.delenv("HPCAI500_WATCHDOG", raising=False)
    a = driver.parse_args([])
    assert (a.dat, a.check, a.watchdog, a.resume) == ("HPCAI500.dat", False, 1800.0, None)
    a = driver.parse_args(["--check", "--watchdog", "0", "x.dat"])
    assert (a.dat, a.check, a.watchdog) == ("x.dat", True, 0.0)
    monkeypatch.setenv("HPCAI500_WATCHDOG", "12.5")
    assert driver.parse_args(["x.dat"]).watchdog == 12.5
    a = driver.parse_args(["--check", "--resume", "runs/r", "x.dat"])     # checks that the resume would be taken
    assert (a.dat, a.check, a.resume) == ("x.dat", True, "runs/r")
    a = driver.parse_args(["--verify", "runs/r"])
    assert (a.verify, a.status, a.summarize, a.dat) == ("runs/r", None, None, "HPCAI500.dat")
    assert exits == []


def test_resume_of_a_results_directory_names_its_newest_run(tmp_path):
    """Issue 66: --resume writes into the folder it is given, so a results directory (line 5)
    is refused, naming its newest run and that run's state, never guessed; a folder that is
    no run is one message, not Python's [Errno 2]."""
    from tests.conftest import record
    cfg = dat.parse_text(_lines({27: 2}), "x.dat")
    for name, status in (("20261126-090000-aaaaaa", "complete"), ("20261126-091500-bbbbbb", "interrupted")):
        (tmp_path / name).mkdir()
        rec = record(status, interrupted={"reason": "SIGUSR1 received", "test": 1} if status != "complete" else None)
        (tmp_path / name / "results.json").write_text(json.dumps(rec.json()))
    newest = tmp_path / "20261126-091500-bbbbbb"
    with pytest.raises(RunError) as info:
        plan.resumed(str(tmp_path), cfg, 3, {})
    assert str(info.value) == (f"--resume {tmp_path}: found a results directory of 2 run(s), expected the run folder to"
                               f" continue (runs/<id>); its newest is {newest} (interrupted: SIGUSR1 received during test 1; 0 of 4"
                               f" test run(s) finished): --resume {newest}")
    (newest / "results.json").write_text(json.dumps(record("complete").json()))   # nothing there to continue
    with pytest.raises(RunError) as info:
        plan.resumed(str(tmp_path), cfg, 3, {})
    assert str(info.value).endswith(f"its newest is {newest} (complete: every test PASSED; 0 of 4 test run(s)"
                                    " finished)")
    (tmp_path / "empty").mkdir()
    with pytest.raises(RunError) as info:
        plan.resumed(str(tmp_path / "empty"), cfg, 3, {})
    assert str(info.value) == f"--resume {tmp_path / 'empty'}: no results.json (not a runs/<id> folder?)"


def test_no_file_given_and_none_in_the_folder(exits, tmp_path, monkeypatch):
    """The default input file is read from the working directory."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(dat.DatError, match=r"^HPCAI500.dat:0: found no such file, expected an HPCAI500.dat input"):
        dat.parse(driver.parse_args([]).dat)


# ------------------------------------------------------------------ real runs
@pytest.mark.parametrize("make,args,env,expect", [
    (lambda p: p.write_text(_lines({20: "11"})), ["bad.dat"], None,
     "bad.dat:20: found '11', expected warm-up epochs: a number >= 0 and <= epochs (10, line 15)"),
    (lambda p: p.mkdir(), ["bad.dat"], None, "bad.dat:0: found a directory, expected an HPCAI500.dat input file"),
    (lambda p: p.write_text(_lines()), ["bad.dat"], {"HPCAI500_FAULT": "1:train"},
     "environment: found HPCAI500_FAULT='1:train', expected"
     " RANK:STEP|eval|roofline|sampler|staging|start[@TEST][:kill|hang|slow|stop][,...]"),
    (lambda p: p.write_text(_lines()), ["--watchdog", "-5", "bad.dat"], None,
     "argument --watchdog: expected seconds >= 0, found '-5'"),
], ids=["parser-error", "directory", "environment-setting", "command-line"])
def test_refused_on_every_rank_with_one_message(tmp_path, make, args, env, expect):
    make(tmp_path / "bad.dat")
    p = mpirun(2, args, tmp_path, timeout=60, env=env)
    assert p.returncode == 1, (p.returncode, p.stderr[-1500:])
    assert p.stderr.count("hpcai500: error:") == 1, p.stderr[-1500:]   # once, from rank 0
    assert f"hpcai500: error: {expect}" in p.stderr, p.stderr[-1500:]
    assert "Traceback" not in p.stderr and p.stdout == ""
    assert not (tmp_path / "runs").exists() and not (ROOT / "bad.dat").exists()
