"""Tests of harness/dat.py: the HPCAI500.dat parser (every line, good and bad)."""
import dataclasses
import os
from pathlib import Path

import pytest

from harness import dat
from harness.dat import Config, DatError, describe, expand, from_record, parse, parse_text, record
from harness.workloads import Dataset
from harness.dat import Test as DatTest  # aliased: pytest would try to collect 'Test*'

DAT = Path(__file__).resolve().parents[1] / "HPCAI500.dat"
SHIPPED = DAT.read_text(encoding="utf-8")
COL = 14  # the shipped file's value column: values in [0, 14), free text after
EMPTY = object()  # edit(): make the whole line empty


def edit(changes, text=SHIPPED, free=True):
    """Shipped text with line n's value replaced: changes = {n: value} (1-based).
    free=False drops the free text too; value EMPTY empties the line."""
    lines = text.splitlines()
    for n, value in changes.items():
        rest = lines[n - 1][COL:] if free else ""
        if value is EMPTY or not value.strip():
            lines[n - 1] = "" if value is EMPTY else value
        else:
            lines[n - 1] = f"{value:<{COL - 1}} {rest}".rstrip()
    return "\n".join(lines) + "\n"


def fails(text, line, token=None, path="HPCAI500.dat"):
    """parse_text(text) raises a one-line DatError at `line` naming `token`."""
    with pytest.raises(DatError) as info:
        parse_text(text, path)
    err, msg = info.value, str(info.value)
    assert isinstance(err, ValueError)
    assert err.line_no == line, msg
    assert msg.startswith(f"{path}:{line}: found "), msg
    assert "\n" not in msg
    if token is not None:
        assert f"found {token!r}" in msg, msg
    return err


# ---------------------------------------------------------------- the shipped file

def test_shipped_file_parses_and_expands_to_three_tests():
    cfg = parse(str(DAT))
    assert len(SHIPPED.splitlines()) == dat.NLINES == 37
    assert cfg.text == SHIPPED and cfg.path == str(DAT)
    assert (cfg.output_file, cfg.device_out, cfg.results_dir) == ("HPCAI500.out", 6, "runs")
    assert cfg.workloads == ("digits",) and cfg.dataset.text == "embedded" and cfg.dataset.kind == "embedded"
    assert cfg.layouts == ((1, 1), (2, 1), (4, 1)) and cfg.pmap == 0
    assert cfg.batch_sizes == (32,) and cfg.epochs == 10 and cfg.precisions == ("fp32",)
    assert (cfg.optimizer, cfg.base_lr, cfg.warmup_epochs) == ("sgd", 0.05, 1.0)
    assert (cfg.comm_precision, cfg.allreduce, cfg.sampler, cfg.aggregation) == (
        "fp32", "ring", "bootstrap", "mean")
    assert (cfg.target_quality, cfg.penalty_n, cfg.repetitions) == (-1.0, -1.0, 1)
    assert (cfg.staging, cfg.seed, cfg.roofline) == ("none", 42, 1)
    assert (cfg.eval_every, cfg.stop_at_target) == (1, False)      # a new user sees the quality curve
    assert cfg.compiler == "none"                                   # XLA is an accelerator's option
    assert cfg.frameworks == ("tensorflow",)
    assert SHIPPED.splitlines()[30:] == list(dat.NEW_LINES)        # what an older file is told to add
    tests = expand(cfg)
    assert [(t.index, t.M, t.P) for t in tests] == [(1, 1, 1), (2, 2, 1), (3, 4, 1)]
    assert all((t.workload, t.batch, t.precision, t.framework) == ("digits", 32, "fp32", "tensorflow") for t in tests)


def test_shipped_file_is_column_aligned():
    for n, line in enumerate(SHIPPED.splitlines()[2:], 3):
        assert line[COL - 1] == " " and line[COL] != " ", f"line {n} not aligned: {line!r}"


def test_parse_text_matches_parse_and_config_is_frozen():
    cfg = parse_text(SHIPPED)
    assert cfg == dataclasses.replace(parse(str(DAT)), path="HPCAI500.dat")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.seed = 1


# ---------------------------------------------------------------- every line, bad

BAD = [  # (line, value, offending token); value EMPTY = empty line
    (3, EMPTY, None), (3, "   ", None),
    (4, EMPTY, None), (4, "x", "x"), (4, "-1", "-1"), (4, "6.0", "6.0"), (4, "1e3", "1e3"),
    (5, EMPTY, None),
    (6, EMPTY, None), (6, "0", "0"), (6, "-1", "-1"), (6, "x", "x"), (6, "1.5", "1.5"),
    (7, EMPTY, None), (7, "cifar", "cifar"), (7, "1", "1"),
    (8, EMPTY, None), (8, "synthetic:", "synthetic:"), (8, "synthetic:1", "synthetic:1"),
    (8, "synthetic:x", "synthetic:x"), (8, "synthetic:-5", "synthetic:-5"),
    (8, "synthetic:100:3", "synthetic:100:3"), (8, "synthetic:100:8:2", "synthetic:100:8:2"),
    (8, "Synthetic:1.5", "Synthetic:1.5"),
    (9, EMPTY, None), (9, "0", "0"), (9, "-3", "-3"), (9, "x", "x"), (9, "3.0", "3.0"),
    (10, EMPTY, None), (10, "1 2 x", "x"), (10, "1 2 -1", "-1"), (10, "1 2.5 4", "2.5"),
    (11, EMPTY, None), (11, "1 1 0", "0"), (11, "1 1 x", "x"), (11, "-1 1 1", "-1"),
    (12, EMPTY, None), (12, "2", "2"), (12, "-1", "-1"), (12, "x", "x"),
    (13, EMPTY, None), (13, "0", "0"), (13, "x", "x"),
    (14, EMPTY, None), (14, "0", "0"), (14, "-32", "-32"), (14, "x", "x"), (14, "32.5", "32.5"),
    (15, EMPTY, None), (15, "0", "0"), (15, "x", "x"), (15, "2.5", "2.5"),
    (16, EMPTY, None), (16, "0", "0"), (16, "x", "x"),
    (17, EMPTY, None), (17, "fp64", "fp64"), (17, "fp8", "fp8"),
    (18, EMPTY, None), (18, "rmsprop", "rmsprop"),
    (19, EMPTY, None), (19, "0", "0"), (19, "-0.1", "-0.1"), (19, "x", "x"),
    (19, "nan", "nan"), (19, "inf", "inf"), (19, "1e999", "1e999"),
    (20, EMPTY, None), (20, "-1", "-1"), (20, "10.5", "10.5"), (20, "x", "x"),
    (21, EMPTY, None), (21, "fp64", "fp64"), (21, "bf16", "bf16"),
    (22, EMPTY, None), (22, "tree", "tree"),
    (23, EMPTY, None), (23, "jackknife", "jackknife"),
    (24, EMPTY, None), (24, "median", "median"),
    (25, EMPTY, None), (25, "0", "0"), (25, "1.5", "1.5"), (25, "-2", "-2"), (25, "x", "x"),
    (26, EMPTY, None), (26, "-2", "-2"), (26, "-0.5", "-0.5"), (26, "x", "x"),
    (27, EMPTY, None), (27, "0", "0"), (27, "-1", "-1"), (27, "x", "x"), (27, "1.5", "1.5"),
    (28, EMPTY, None),
    (29, EMPTY, None), (29, "-1", "-1"), (29, "4294967296", "4294967296"), (29, "x", "x"),
    (29, "1.5", "1.5"),
    (30, EMPTY, None), (30, "2", "2"), (30, "-1", "-1"), (30, "x", "x"),
    (34, EMPTY, None), (34, "0", "0"), (34, "x", "x"),
    (35, EMPTY, None), (35, "torch", "torch"), (35, "mxnet", "mxnet"),
]


@pytest.mark.parametrize("line,value,token", BAD)
def test_bad_value(line, value, token):
    err = fails(edit({line: value}), line, token)
    if value is EMPTY or not value.strip():
        assert "found an empty line, expected" in str(err)


@pytest.mark.parametrize("line,value,token", [b for b in BAD if b[1] is not EMPTY])
def test_bad_value_without_free_text(line, value, token):
    if value.strip():
        fails(edit({line: value}, free=False), line, token)


@pytest.mark.parametrize("line,value,expected", [
    (17, "fp64", "HPCAI500.dat:17: found 'fp64', expected a training precision "
                 "(fp32, fp16, bf16)"),
    (27, "101", "HPCAI500.dat:27: found '101', expected repetitions: an integer from 1 to 100"),
    (18, "rmsprop", "HPCAI500.dat:18: found 'rmsprop', expected an optimizer "
                    "(sgd, adam, adagrad, lars, lamb)"),
])
def test_message_format(line, value, expected):
    assert str(fails(edit({line: value}), line, value)) == expected


def test_keywords_are_the_tables_of_what_implements_them():
    """Line 7's and lines 17-24's choices come from the modules that implement them:
    a choice that lands there is accepted here, with its T/V code."""
    from harness import ensemble, frameworks, sampler, train, workloads
    assert dat.KNOWN == {"workload": tuple(workloads.CHOICES), "precision": tuple(train.PRECISIONS),
                         "optimizer": tuple(train.OPTIMIZERS), "comm_precision": tuple(train.COMMUNICATION),
                         "allreduce": tuple(train.ALLREDUCE), "sampler": tuple(sampler.METHODS),
                         "aggregation": tuple(ensemble.AGGREGATIONS), "compiler": tuple(train.COMPILERS),
                         "framework": tuple(frameworks.CHOICES)}
    cfg = parse_text(edit({18: "adam", 22: "hierarchical", 27: "100", 30: "0"}))
    assert (cfg.optimizer, cfg.allreduce, cfg.repetitions, cfg.roofline) == ("adam", "hierarchical", 100, 0)
    fails(edit({27: "101"}), 27, "101")
    assert f"({', '.join(dat.KNOWN['optimizer'])})" in dat.LINES[18]


@pytest.mark.parametrize("value,path,keep", [
    ("/scratch/x", "/scratch/x", False), ("/scratch/x keep", "/scratch/x", True),
    ("./local KEEP", "./local", True), ("/scratch/x kept", "/scratch/x", False),
    ("none keep", "none", False)])
def test_staging_line(value, path, keep):
    cfg = parse_text(edit({28: value}))
    assert (cfg.staging, cfg.staging_keep) == (path, keep)
    assert any(("removed" if not keep else "kept") in line for line in dat.describe(cfg)) or path == "none"


# ---------------------------------------------------------------- counts vs values

COUNTS = [  # (changes, line of the error, offending token[, False: drop free text])
    ({6: "2"}, 7, "workloads"),                      # count says 2, one value + free text
    ({6: "2", 7: "digits"}, 7, None, False),         # ... and no free text: 1 token
    ({7: "digits ic"}, 7, "ic"),                     # count says 1, found 2
    ({7: "digits digits"}, 7, "digits"),             # count 1, second is a value too
    ({6: "2", 7: "digits digits"}, 7, "digits"),     # duplicate workload
    ({9: "2"}, 10, "4"),                             # count says 2, found 3
    ({9: "4"}, 10, "Ms"),                            # count says 4, found 3
    ({9: "1"}, 10, "2"),
    ({10: "1 2 4 8"}, 10, "8"),
    ({10: "1 2"}, 10, "Ms"),
    ({11: "1 1 1 1"}, 11, "1"),
    ({11: "1 1"}, 11, "Ps"),
    ({10: "1 2 4", 11: "1 1"}, 11, None, False),     # no free text: only 2 tokens
    ({10: "1 1 4"}, 11, "1"),                        # layout (1, 1) listed twice
    ({13: "2"}, 14, "Bs"),
    ({14: "32 64"}, 14, "64"),
    ({14: "32 -64"}, 14, "-64"),
    ({13: "2", 14: "32 32"}, 14, "32"),              # duplicate batch size
    ({16: "2"}, 17, "PRECs"),
    ({17: "fp32 fp16"}, 17, "fp16"),
    ({17: "fp32 FP16"}, 17, "FP16"),
    ({16: "2", 17: "fp32 fp32"}, 17, "fp32"),        # duplicate precision
    ({34: "2"}, 35, "frameworks"),
    ({35: "tensorflow pytorch"}, 35, "pytorch"),
    ({34: "2", 35: "pytorch PyTorch"}, 35, "PyTorch"),  # duplicate framework, case aside
]


@pytest.mark.parametrize("changes,line,token,free", [c + (True,)[len(c) - 3:] for c in COUNTS])
def test_count_disagrees_with_values(changes, line, token, free):
    err = fails(edit(changes, free=free), line, token)
    if token is None:
        assert "the line holds only " in str(err)


def test_count_message_says_both_numbers():
    msg = str(fails(edit({9: "2"}), 10, "4"))
    assert "line 9 says" in msg and "count says 2 but found 3 values" in msg
    msg = str(fails(edit({9: "4"}), 10, "Ms"))
    assert "value 4 of 4 (line 9 says 4)" in msg


# ---------------------------------------------------------------- file shape

@pytest.mark.parametrize("n", range(1, 31))
def test_short_file_names_the_first_missing_line(n):
    text = "".join(SHIPPED.splitlines(keepends=True)[:n - 1])
    err = fails(text, n, None)
    assert str(err).startswith(f"HPCAI500.dat:{n}: found end of file, expected line {n}: ")
    assert dat.LINES[n] in str(err)


@pytest.mark.parametrize("n", range(3, dat.NLINES + 1))
def test_deleted_line_is_an_error(n):
    lines = SHIPPED.splitlines(keepends=True)
    with pytest.raises(DatError) as info:
        parse_text("".join(lines[:n - 1] + lines[n:]))
    assert n <= info.value.line_no <= dat.NLINES


@pytest.mark.parametrize("extra,line,token", [
    ("junk\n", 38, "junk"), ("\n\n  \n7 more\n", 41, "7"), ("\t-1\n", 38, "-1")])
def test_extra_lines_are_an_error(extra, line, token):
    err = fails(SHIPPED + extra, line, token)
    assert f"unexpected line {line}" in str(err)


@pytest.mark.parametrize("extra", ["\n", "\n\n   \n", "\t\n\n"])
def test_trailing_blank_lines_are_fine(extra):
    assert parse_text(SHIPPED + extra).layouts == ((1, 1), (2, 1), (4, 1))


def test_free_text_is_ignored_and_titles_are_free():
    lines = [ln[:COL] for ln in SHIPPED.splitlines()]
    lines[0], lines[1] = "", "anything 1 2 3 fp16 lamb"
    lines[5] += "workloads: none yet?? 42"
    lines[9] += "\tMs -- 7 is not a value here because it follows free text"
    cfg = parse_text("\n".join(lines))  # also: no final newline
    assert cfg.workloads == ("digits",) and cfg.layouts == ((1, 1), (2, 1), (4, 1))


def test_crlf_and_bom(tmp_path):
    f = tmp_path / "crlf.dat"
    f.write_bytes(b"\xef\xbb\xbf" + SHIPPED.replace("\n", "\r\n").encode())
    assert parse(str(f)).layouts == ((1, 1), (2, 1), (4, 1))


@pytest.mark.parametrize("changes,field,value", [
    ({4: "7"}, "device_out", 7), ({4: "0"}, "device_out", 0), ({4: "8"}, "device_out", 8),
    ({3: "out/res.txt"}, "output_file", "out/res.txt"),
    ({5: "/scratch/runs"}, "results_dir", "/scratch/runs"),
    ({7: "DIGITS"}, "workloads", ("digits",)),
    ({8: "synthetic"}, "dataset", "synthetic"),
    ({8: "SYNTHETIC:1000"}, "dataset", "synthetic:1000"),
    ({8: "synthetic:2:4"}, "dataset", "synthetic:2:4"),
    ({8: "/data/digits.npz"}, "dataset", "/data/digits.npz"),
    ({8: "Embedded"}, "dataset", "embedded"),
    ({10: "0 0 16", 11: "1 2 4"}, "layouts", ((0, 1), (0, 2), (16, 4))),
    ({12: "1"}, "pmap", 1), ({14: "1"}, "batch_sizes", (1,)), ({15: "90"}, "epochs", 90),
    ({17: "FP32"}, "precisions", ("fp32",)), ({18: "SGD"}, "optimizer", "sgd"),
    ({19: "1e-3"}, "base_lr", 0.001), ({19: ".5"}, "base_lr", 0.5),
    ({20: "0"}, "warmup_epochs", 0.0), ({20: "0.5"}, "warmup_epochs", 0.5),
    ({20: "3"}, "warmup_epochs", 3.0),
    ({23: "poisson"}, "sampler", "poisson"), ({23: "None"}, "sampler", "none"),
    ({24: "vote"}, "aggregation", "vote"),
    ({25: "1"}, "target_quality", 1.0), ({25: "0.763"}, "target_quality", 0.763),
    ({25: "-1.0"}, "target_quality", -1.0),
    ({26: "0"}, "penalty_n", 0.0), ({26: "10"}, "penalty_n", 10.0),
    ({28: "NONE"}, "staging", "none"),
    ({29: "0"}, "seed", 0), ({29: "4294967295"}, "seed", 2**32 - 1),
])
def test_good_value(changes, field, value):
    got = getattr(parse_text(edit(changes)), field)
    assert (got.text if field == "dataset" else got) == value


# ---------------------------------------------------------------- reading errors

def read_fails(path):
    with pytest.raises(DatError) as info:
        parse(str(path))
    msg = str(info.value)
    assert info.value.line_no == 0 and msg.startswith(f"{path}:0: ") and "\n" not in msg
    return msg


def test_missing_file(tmp_path):
    assert "found no such file, expected" in read_fails(tmp_path / "nope.dat")


def test_directory(tmp_path):
    assert "a directory" in read_fails(tmp_path)


def test_non_utf8(tmp_path):
    f = tmp_path / "latin1.dat"
    f.write_bytes(SHIPPED.replace("runs ", "r\xe9s  ").encode("latin-1"))
    assert "non-UTF-8 byte 0xe9 on line 5" in read_fails(f)


def test_huge_file(tmp_path):
    f = tmp_path / "huge.dat"
    f.write_text(SHIPPED + "\n" * (1 << 20))
    assert "1 MiB" in read_fails(f)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_unreadable(tmp_path):
    f = tmp_path / "locked.dat"
    f.write_text(SHIPPED)
    f.chmod(0)
    assert "Permission denied" in read_fails(f)


def test_path_is_given_as_is_in_parse_errors(tmp_path):
    f = tmp_path / "my.dat"
    f.write_text(edit({17: "fp64"}))
    with pytest.raises(DatError, match=rf"^{f}:17: found 'fp64', expected"):
        parse(str(f))


# ---------------------------------------------------------------- sweep, T/V, describe

def test_sweep_of_layouts_and_batches():
    cfg = parse_text(edit({9: "2", 10: "1 2", 11: "2 1", 13: "3", 14: "16 32 64"}))
    got = [(t.index, t.M, t.P, t.batch) for t in expand(cfg)]
    assert got == [(1, 1, 2, 16), (2, 1, 2, 32), (3, 1, 2, 64),
                   (4, 2, 1, 16), (5, 2, 1, 32), (6, 2, 1, 64)]


def test_expand_nesting_order_workload_layout_batch_precision():
    cfg = dataclasses.replace(parse_text(SHIPPED), workloads=("digits", "ic"),
                              layouts=((1, 1), (2, 2)), batch_sizes=(8, 16),
                              precisions=("fp32", "bf16"))
    tests = expand(cfg)
    assert len(tests) == 16 and [t.index for t in tests] == list(range(1, 17))
    assert tests[0] == DatTest(1, "digits", 1, 1, 8, "fp32")
    assert tests[1] == DatTest(2, "digits", 1, 1, 8, "bf16")
    assert tests[2] == DatTest(3, "digits", 1, 1, 16, "fp32")
    assert tests[4] == DatTest(5, "digits", 2, 2, 8, "fp32")
    assert tests[8] == DatTest(9, "ic", 1, 1, 8, "fp32")
    assert tests[-1] == DatTest(16, "ic", 2, 2, 16, "bf16")


def test_framework_is_the_innermost_sweep():
    """Lines 34-35: each test in each framework, side by side, the framework innermost."""
    cfg = parse_text(edit({16: "2", 17: "fp32 bf16", 34: "2", 35: "pytorch TensorFlow"}))
    assert cfg.frameworks == ("pytorch", "tensorflow")
    got = [(t.index, t.M, t.precision, t.framework) for t in expand(cfg)[:5]]
    assert got == [(1, 1, "fp32", "pytorch"), (2, 1, "fp32", "tensorflow"), (3, 1, "bf16", "pytorch"),
                   (4, 1, "bf16", "tensorflow"), (5, 2, "fp32", "pytorch")]
    assert len(expand(cfg)) == 12
    assert "FRAMEWRK: pytorch tensorflow" in describe(cfg)


def test_parallel_mode_is_the_innermost_sweep():
    """Lines 36-37: each test in each parallel mode, after the frameworks; lowercased, each once."""
    cfg = parse_text(edit({11: "2 2 2", 34: "2", 35: "tensorflow pytorch", 36: "3", 37: "data Pipeline:8:GPipe mixed:2"}))
    assert cfg.modes == ("data", "pipeline:8:gpipe", "mixed:2")
    got = [(t.index, t.framework, t.mode) for t in expand(cfg)[:4]]
    assert got == [(1, "tensorflow", "data"), (2, "tensorflow", "pipeline:8:gpipe"), (3, "tensorflow", "mixed:2"),
                   (4, "pytorch", "data")]
    assert len(expand(cfg)) == 18
    assert "PARMODE : data pipeline:8:gpipe mixed:2" in describe(cfg)
    assert parse_text(SHIPPED).modes == ("data",)


@pytest.mark.parametrize("line37,found", [("data data", "data"), ("pipe", "pipe"), ("mixed", "mixed"),
                                          ("model:2", "model:2"), ("pipeline:4:8", "pipeline:4:8"),
                                          ("pipeline:x", "pipeline:x"), ("mixed:2:4:zb", "mixed:2:4:zb")])
def test_bad_parallel_modes(line37, found):
    with pytest.raises(DatError) as info:
        parse_text(edit({36: str(len(line37.split())), 37: line37}))
    assert info.value.line_no == 37 and repr(found) in str(info.value), str(info.value)


@pytest.mark.parametrize("line37,message", [
    ("mixed:1", "x.dat:37: found '1' as mixed's STAGES in 'mixed:1', expected an integer >= 2: one stage is data"
                " parallelism"),
    ("pipeline:0", "x.dat:37: found '0' as pipeline's MICROBATCHES in 'pipeline:0', expected an integer >= 1"),
    ("pipeline:4:zigzag", "x.dat:37: found 'zigzag' as pipeline's schedule in 'pipeline:4:zigzag', expected one"
                          " of 1f1b, gpipe"),
    ("data Pipeline:4:ZigZag", "x.dat:37: found 'ZigZag' as pipeline's schedule in 'Pipeline:4:ZigZag', expected"
                               " one of 1f1b, gpipe"),    # as written
    ("data pipe", "x.dat:37: found 'pipe', expected a parallel mode (" + dat.parallelism.FORM + ") as value 2 of 2"
                  " (line 36 says 2)"),     # no mode at all: the grammar
])
def test_a_bad_parallel_mode_names_its_wrong_part(line37, message):
    """Issue 66: line 37's refusal names the part that is wrong, not the whole grammar."""
    with pytest.raises(DatError) as info:
        parse_text(edit({36: str(len(line37.split())), 37: line37}), "x.dat")
    assert str(info.value) == message


@pytest.mark.parametrize("fields,precision,code", [
    ({}, "fp32", "B32C32SR"),
    ({"sampler": "poisson"}, "fp16", "P16C32SR"),
    ({"sampler": "none", "comm_precision": "fp16", "optimizer": "lamb",
      "allreduce": "hierarchical"}, "bf16", "NBFC16MH"),
    ({"optimizer": "adam"}, "fp32", "B32C32AR"),
    ({"optimizer": "adagrad"}, "fp32", "B32C32GR"),
    ({"optimizer": "lars"}, "fp32", "B32C32LR"),
    ({"compiler": "xla"}, "fp32", "B32C32SRX"),       # XLA adds X; none adds nothing (codes as before)
    ({"framework": "pytorch"}, "fp32", "B32C32SRPT"),  # PyTorch adds PT; TensorFlow nothing (codes as before)
    ({"framework": "pytorch", "compiler": "xla"}, "bf16", "BBFC32SRXPT"),
    # line 37's mode last: data adds nothing; model MP; a pipeline its schedule and micro-batches
    # (P = 4 here: the default 4 x 4 = 16); mixed its stages first
    ({"framework": "pytorch", "mode": "model"}, "fp32", "B32C32SRPTMP"),
    ({"framework": "pytorch", "mode": "pipeline"}, "fp32", "B32C32SRPTPP16"),
    ({"framework": "pytorch", "mode": "pipeline:8:gpipe"}, "fp32", "B32C32SRPTGP8"),
    ({"framework": "pytorch", "mode": "mixed:2"}, "fp32", "B32C32SRPT2SPP8"),
])
def test_tv_codes(fields, precision, code):
    framework = fields.pop("framework", "tensorflow")   # a test's, not the Config's
    mode = fields.pop("mode", "data")
    cfg = dataclasses.replace(parse_text(SHIPPED), **fields)
    assert DatTest(1, "digits", 1, 4, 32, precision, framework, mode).tv(cfg) == code


def test_tv_legend_is_one_line():
    assert dat.TV_LEGEND.startswith("sampler B|P|N") and "\n" not in dat.TV_LEGEND
    assert all(code in dat.TV_LEGEND for code in ("32|16|BF", "C32|C16", "S|A|G|L|M", "R|H", "XLA (none)|X", "FW (none)|PT", "mode (none)|MP|PP<m>"))


def test_describe():
    lines = describe(parse_text(edit({10: "1 2 16", 11: "1 1 4", 25: "0.9"})))
    for want in ["WL      : digits", "DATASET : embedded", "M       :  1  2 16",
                 "P       :  1  1  4", "PMAP    : Node-packed", "B       : 32",
                 "EPOCHS  : 10", "PREC    : fp32", "OPTIM   : sgd", "SAMPLER : bootstrap",
                 "AGGR    : mean", "TARGET  : 0.9", "N       : workload default",
                 "SEED    : 42", "ROOFLINE: run", "OUTPUT  : stdout"]:
        assert want in lines
    assert all(ln[8:10] == ": " and "\n" not in ln for ln in lines)
    assert "PMAP    : Round-robin" in describe(parse_text(edit({12: "1"})))
    assert "OUTPUT  : file HPCAI500.out" in describe(parse_text(edit({4: "9"})))
    assert isinstance(parse_text(SHIPPED), Config)


@pytest.mark.parametrize("token,spec", [
    ("embedded", ("embedded", "embedded", None, None)), ("EMBEDDED", ("embedded", "embedded", None, None)),
    ("synthetic", ("synthetic", "synthetic", None, None)),
    ("synthetic:500", ("synthetic:500", "synthetic", 500, None)),
    ("Synthetic:+500:8", ("synthetic:500:8", "synthetic", 500, 8)),
    ("/data/x.npz", ("/data/x.npz", "path", None, None)), ("syntheticdata", ("syntheticdata", "path", None, None))])
def test_dataset_is_parsed_once_into_its_parts(token, spec):
    d = parse_text(edit({8: token})).dataset
    assert (d.text, d.kind, d.samples, d.side) == spec


def test_a_synthetic_size_falls_back_to_the_workloads_default_for_what_is_not_given():
    assert Dataset.parse("synthetic").size((2000, 8)) == (2000, 8)
    assert Dataset.parse("synthetic:300").size((2000, 8)) == (300, 8)
    assert Dataset.parse("synthetic:300:12").size((2000, 8)) == (300, 12)


def test_the_recorded_configuration_keeps_the_dataset_as_its_text_and_reads_back():
    cfg = parse_text(edit({8: "Synthetic:500:8"}))
    rec = record(cfg)
    assert rec["dataset"] == "synthetic:500:8" and "text" not in rec and rec["layouts"] == [list(x) for x in cfg.layouts]
    assert from_record(cfg.text, rec) == cfg


def test_unreadable_file_any_user(monkeypatch, tmp_path):
    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(dat, "open", denied, raising=False)  # shadows the builtin in dat
    assert "found an unreadable file (Permission denied)" in read_fails(tmp_path / "x.dat")


def test_no_mpi_import():
    import subprocess
    import sys
    code = "import sys, harness.dat; assert 'mpi4py' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=DAT.parent)


def test_config_and_tests_pickle_for_broadcast():
    import pickle
    cfg = parse(str(DAT))
    assert pickle.loads(pickle.dumps((cfg, expand(cfg)))) == (cfg, expand(cfg))


def test_all_three_workloads_parse_in_one_sweep():
    cfg = parse_text(edit({6: "3", 7: "digits IC ewa"}))
    assert cfg.workloads == ("digits", "ic", "ewa")
    assert [t.workload for t in dat.expand(cfg)][::3] == ["digits", "ic", "ewa"]


def test_the_legend_a_run_printed_is_recorded_and_verify_reads_it():
    """The T/V legend lists the registry's framework codes: a framework added later would
    change it, so a run records its own (schema 2.13) and --verify re-renders a file from
    before with the legend of the two frameworks then built."""
    from harness import frameworks
    assert dat.TV_LEGEND == dat.tv_legend(code for code, _ in frameworks.CHOICES.values())
    assert "FW (none)|PT|MS, mode" in dat.tv_legend(("", "PT", "MS"))
    assert "FW (none)|PT, mode" in dat.TV_LEGEND_BEFORE_2_13 and dat.TV_LEGEND_BEFORE_2_13.startswith("sampler B|P|N")


def test_the_compiler_line_says_how_the_runs_frameworks_train_without_one():
    """COMPILER in the parameter block: a compiler as the framework that offers it says it;
    none, how each framework of line 35 runs a step (each framework's facts), as results
    schema 2.13 writes it; an earlier run's both frameworks of the time (--verify)."""
    from tests.conftest import dat_text

    def compiler(schema=None, **lines):
        return next(ln for ln in dat.describe(dat.parse_text(dat_text(**lines), "x.dat"), schema)
                    if ln.startswith("COMPILER"))
    assert compiler(l35="pytorch") == "COMPILER: none (PyTorch: eager)"
    assert compiler(l34=2, l35="pytorch tensorflow") == "COMPILER: none (PyTorch: eager; TensorFlow: graph, tf.function)"
    assert compiler((2, 12), l35="pytorch") == "COMPILER: none (TensorFlow: graph, tf.function; PyTorch: eager)"
    assert compiler(l33="inductor", l35="pytorch") == "COMPILER: torch.compile, TorchInductor (forward and backward pass)"
    assert compiler((2, 12), l33="xla") == "COMPILER: XLA (forward and backward pass)"
