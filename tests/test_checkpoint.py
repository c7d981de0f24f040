"""harness/checkpoint.py: a base model's checkpoint is whole or absent, and a torn one is
never read. The encoding in-process; a writer SIGKILLed mid-write in a process of its own."""
import hashlib
import os
import signal
import subprocess
import sys
import time

import pytest

from harness import checkpoint
from tests.conftest import ROOT


def test_a_checkpoint_is_its_format_line_a_header_line_and_the_state():
    blob = checkpoint.encode({"epoch": 2}, b"abc")
    sha = hashlib.sha256(b"abc").hexdigest()
    assert blob == (b"hpcai500-checkpoint 1\n"
                    b'{"epoch": 2, "payload_bytes": 3, "payload_sha256": "' + sha.encode() + b'"}\nabc')
    head, payload = checkpoint.decode(blob, "f")
    assert (head["epoch"], payload) == (2, b"abc")


@pytest.mark.parametrize("cut,said", [
    (lambda b: b[:-1], "f: found 2 bytes of state, expected 3 (a torn file)"),
    (lambda b: b[:30], "f: found no whole header line, expected one JSON object (a torn file)"),
    (lambda b: b[:-3] + b"abd", "f: found a state whose SHA-256 differs from its header's (a damaged file)"),
    (lambda b: b"", "f: found b'' on its first line, expected 'hpcai500-checkpoint 1'"),
])
def test_a_torn_or_damaged_checkpoint_is_refused_naming_what_is_wrong(cut, said):
    with pytest.raises(checkpoint.CheckpointError) as e:
        checkpoint.decode(cut(checkpoint.encode({"epoch": 2}, b"abc")), "f")
    assert str(e.value) == said


def test_the_two_newest_are_kept_and_a_torn_newest_gives_way_to_the_one_before(tmp_path):
    run = str(tmp_path)
    for epoch in (1, 2, 3):
        checkpoint.save(run, 1, 0, 0, epoch, {"samples": 100 * epoch}, bytes([epoch]) * 10)
    checkpoint.save(run, 1, 0, 1, 1, {}, b"other job")
    where = checkpoint.folder(run, 1, 0)
    assert sorted(os.listdir(where)) == ["job-0-epoch-2.ckpt", "job-0-epoch-3.ckpt", "job-1-epoch-1.ckpt"]
    head, payload, refused = checkpoint.latest(run, 1, 0, 0)
    assert (head["epoch"], head["samples"], head["job"], payload, refused) == (3, 300, 0, b"\x03" * 10, [])
    newest = os.path.join(where, "job-0-epoch-3.ckpt")
    with open(newest, "r+b") as f:     # a disk that lost the file's tail after the rename
        f.truncate(os.path.getsize(newest) - 4)
    head, payload, refused = checkpoint.latest(run, 1, 0, 0)
    assert (head["epoch"], payload) == (2, b"\x02" * 10)
    assert refused == [f"{newest}: found 6 bytes of state, expected 10 (a torn file)"]
    assert checkpoint.latest(run, 1, 0, 2) == (None, None, [])       # a job without any
    assert checkpoint.latest(run, 2, 0, 0) == (None, None, [])       # a test without a folder


# A writer of a 64 MB checkpoint that says when it starts, then is SIGKILLed during the write
_WRITER = """
import sys, time
from harness import checkpoint, files
real = files.atomic_write
def slow(path, data):                       # the write under way: its temporary file half there
    with files.atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(data[:len(data) // 2]); f.flush()
        print("writing", flush=True)
        time.sleep(60)
        f.write(data[len(data) // 2:])
files.atomic_write = slow
checkpoint.save(sys.argv[1], 1, 0, 0, 2, {}, b"x" * (64 << 20))
"""


def test_a_writer_killed_mid_write_leaves_no_checkpoint_and_the_one_before_is_read(tmp_path):
    run = str(tmp_path)
    checkpoint.save(run, 1, 0, 0, 1, {}, b"epoch one")
    p = subprocess.Popen([sys.executable, "-c", _WRITER, run], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline() == "writing\n"
    time.sleep(0.2)
    os.kill(p.pid, signal.SIGKILL)
    p.wait(timeout=30)
    where = checkpoint.folder(run, 1, 0)
    left, done = sorted(os.listdir(where))     # the killed writer's temporary file, half written: no reader takes it
    assert left.startswith(".job-0-epoch-2.ckpt.tmp-") and 0 < os.path.getsize(os.path.join(where, left)) < 64 << 20
    assert done == "job-0-epoch-1.ckpt" and checkpoint.epochs(where, 0) == [1]
    head, payload, refused = checkpoint.latest(run, 1, 0, 0)
    assert (head["epoch"], payload, refused) == (1, b"epoch one", [])
    checkpoint.save(run, 1, 0, 0, 2, {}, b"epoch two")   # the job's next write (a relaunch) clears the leftover
    assert sorted(os.listdir(where)) == ["job-0-epoch-1.ckpt", "job-0-epoch-2.ckpt"]
