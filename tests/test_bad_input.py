"""The catalogue of bad input, each run for real under mpirun on 2 ranks: exit status 1
on every rank within a bounded time, one message naming the file and the line, no
traceback, nothing under the results directory."""
import pytest

from tests.conftest import ROOT, dat_text, mpirun

LINES = {  # line -> (bad value, what the message must show)
    4: ("x", ":4: found 'x'"), 6: ("0", ":6: found '0'"), 7: ("resnet", ":7: found 'resnet'"),
    8: ("synthetic:x", ":8: found 'synthetic:x'"), 9: ("4", ":10:"), 10: ("1 -2 4", ":10: found '-2'"),
    11: ("1 0 1", ":11: found '0'"), 12: ("3", ":12: found '3'"), 13: ("2", ":14:"),
    14: ("-4", ":14: found '-4'"), 15: ("ten", ":15: found 'ten'"), 16: ("0", ":16: found '0'"),
    17: ("fp64", ":17: found 'fp64'"), 18: ("rmsprop", ":18: found 'rmsprop'"), 19: ("0", ":19: found '0'"),
    20: ("11", ":20: found '11'"), 21: ("fp8", ":21: found 'fp8'"), 22: ("tree", ":22: found 'tree'"),
    23: ("jackknife", ":23: found 'jackknife'"), 24: ("median", ":24: found 'median'"),
    25: ("1.5", ":25: found '1.5'"), 26: ("-2", ":26: found '-2'"), 27: ("0", ":27: found '0'"),
    29: (str(2**32), f":29: found '{2**32}'"), 30: ("2", ":30: found '2'"),
}
NOT_YET = {27: "101"}


def _lines(edits=None):
    return dat_text(**{f"l{n}": v for n, v in (edits or {}).items()})


def _cases():
    for n, (value, expect) in LINES.items():
        yield f"line{n}-{value}", lambda p, n=n, value=value: p.write_text(_lines({n: value})), expect
    for n, value in NOT_YET.items():
        yield f"line{n}-not-yet-{value}", lambda p, n=n, v=value: p.write_text(_lines({n: v})), "not supported yet"
    for n in (3, 14, 29):
        yield f"line{n}-empty", lambda p, n=n: p.write_text(_blank(n)), f":{n}:"
    yield "short-file", lambda p: p.write_text("\n".join(_lines().splitlines()[:19]) + "\n"), ":20: found end of file"
    yield "extra-line", lambda p: p.write_text(_lines() + "surplus\n"), ":31:"
    yield "directory", lambda p: p.mkdir(), ":0: found a directory"
    yield "non-utf8", lambda p: p.write_bytes(_lines().encode().replace(b"sgd", b"sg\xe9")), ":0: found a non-UTF-8"
    yield "ten-megabytes", lambda p: p.write_text(_lines() + "#" * (10 << 20)), ":0: found a file over 1 MiB"


def _blank(n):
    rows = _lines().splitlines()
    rows[n - 1] = ""
    return "\n".join(rows) + "\n"


@pytest.mark.parametrize("make,expect", [c[1:] for c in _cases()], ids=[c[0] for c in _cases()])
def test_bad_input_file(tmp_path, make, expect):
    path = tmp_path / "bad.dat"
    make(path)
    p = mpirun(2, [str(path)], tmp_path, timeout=60)
    _refused(p, expect, tmp_path)
    assert "bad.dat:" in p.stderr


@pytest.mark.parametrize("args,expect", [
    ([], "HPCAI500.dat:0: found no such file"),                  # no file given, none in the folder
    (["a.dat", "b.dat"], "unrecognized arguments: b.dat"),
    (["--fast", "a.dat"], "unrecognized arguments: --fast"),
    (["--watchdog", "-5", "a.dat"], "expected seconds >= 0"),
])
def test_command_line_misuse(tmp_path, args, expect):
    _refused(mpirun(2, args, tmp_path, timeout=60), expect, tmp_path)


def _refused(p, expect, folder):
    assert p.returncode == 1, (p.returncode, p.stderr[-1500:])
    assert p.stderr.count("hpcai500: error:") == 1, p.stderr[-1500:]   # once, from rank 0
    assert expect in p.stderr, p.stderr[-1500:]
    assert "Traceback" not in p.stderr
    assert not (folder / "runs").exists() and not (ROOT / "bad.dat").exists()
