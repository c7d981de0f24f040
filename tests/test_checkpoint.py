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
    head, payload = data                    # a checkpoint's header, then its state
    with files.atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(head + payload[:len(payload) // 2]); f.flush()
        print("writing", flush=True)
        time.sleep(60)
        f.write(payload[len(payload) // 2:])
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


@pytest.mark.parametrize("epoch,evaluations,every,due", [
    (2, [2, 4, 6], 1, True),      # every evaluation but the last
    (6, [2, 4, 6], 1, False),     # the last ends training: nothing goes on from it
    (2, [2, 4, 6], 2, False),     # the 1st of every 2nd: not due
    (4, [2, 4, 6], 2, True),      # the 2nd
    (3, [2, 4, 6], 1, False),     # no evaluation after epoch 3
    (2, [2, 4, 6], 0, False),     # 0: none
    (5, [5], 1, False),           # line 31's 0: one evaluation, the last
])
def test_a_checkpoint_is_due_after_every_kth_evaluation_but_the_last(epoch, evaluations, every, due):
    assert checkpoint.due(epoch, evaluations, every) is due


@pytest.mark.parametrize("whole,evaluated,epoch", [
    ({0: [4, 2], 1: [4, 2]}, [1, 2, 3, 4], 4),    # both whole at 4
    ({0: [4, 2], 1: [2]}, [1, 2, 3, 4], 2),       # model 1's 4 torn (or never written): both go on from 2
    ({0: [4, 2], 1: [4, 2]}, [1, 2, 3], 2),       # the test's record lacks epoch 4's evaluation
    ({0: [4], 1: [2]}, [1, 2, 3, 4], 0),          # nothing in common: from the start
    ({0: [4, 2]}, [1, 2, 3, 4], 0),               # model 1 has none
    ({}, [], 0),
])
def test_a_test_goes_on_from_the_newest_evaluation_every_model_has_a_checkpoint_at(whole, evaluated, epoch):
    assert checkpoint.resume_epoch(whole, 2, evaluated) == epoch


def test_the_tests_record_round_trips_and_goes_with_its_checkpoints(tmp_path):
    run = str(tmp_path)
    assert checkpoint.load_test(run, 2, 1) is None
    state = {"curve": [{"epoch": 1, "seconds": 1.5, "quality": 0.5, "base_quality": [0.4]}], "start_wall": 1.0e9}
    checkpoint.save_test(run, 2, 1, state)
    checkpoint.save(run, 2, 1, 0, 1, {}, b"x")
    assert checkpoint.load_test(run, 2, 1) == state
    (tmp_path / "checkpoints" / "test-2-rep-1" / "test.json").write_text("{")   # not a record: none
    assert checkpoint.load_test(run, 2, 1) is None
    checkpoint.discard(run, 2, 1)
    assert not (tmp_path / "checkpoints" / "test-2-rep-1").exists() and checkpoint.epochs(
        checkpoint.folder(run, 2, 1), 0) == []


def test_the_report_says_what_the_checkpoints_cost_and_where_their_time_goes():
    from harness import report
    from tests.conftest import result
    c = {"every": 1, "written": 6, "seconds": 0.5, "each_seconds": 0.25, "write_seconds": 0.75, "bytes": 3 * 2**20,
         "refused": []}
    t = result(train_seconds=20.0, checkpoints=c)
    assert report.checkpoints_line(t) == (
        "Checkpoints : 6 written (each base model's state after every evaluation but the last), 3.0 MiB a set ;"
        " training waited 0.250 s each at most, 0.50 s in all = 2.5 % of Time, outside it as evaluations are ; each"
        " written behind training in 0.750 s at most")
    block = report.row(t)
    assert "(training 20.00 s, evaluations 0.10 s, checkpoints 0.50 s)" in block and report.checkpoints_line(t) in block
    assert "(training 1.00 s, evaluations 0.10 s)\n" in report.row(result())   # none due: the line as before
    none = result(checkpoints={**c, "written": 0, "seconds": 0.0, "each_seconds": 0.0, "bytes": 0,
                               "refused": ["tensorflow: a checkpoint of its training state is not built yet"]})
    assert "(training 1.00 s, evaluations 0.10 s)\n" in report.row(none)   # none written: no seconds to name
    assert report.checkpoints_line(none) == (
        "Checkpoints : none written: tensorflow: a checkpoint of its training state is not built yet; a --resume"
        " would train this test again from its start")


def test_the_report_says_what_an_interruption_cost_a_test_gone_on_from_its_checkpoints():
    from harness import report
    from tests.conftest import result
    t = result(resumed={"epoch": 4, "seconds_before": 12.5, "lost_seconds": 30.25, "samples_before": 1280})
    assert report.resumed_line(t) == (
        "Resumed     : from its base models' checkpoints after epoch 4, epochs 1-4 not trained again ; Time holds"
        " 12.50 s trained before them (an earlier interruption's cost with it) and 30.25 s from the last one written"
        " to training again (work lost, the fault, the relaunch: in no FLOPs)")
    assert report.resumed_line(t) in report.row(t)


def test_a_frameworks_arrays_and_extras_round_trip_and_another_models_are_refused():
    import numpy as np
    payload = checkpoint.pack([("dense/kernel:0", np.arange(6.0).reshape(2, 3)), ("step", np.int64(7))],
                              {"loss_scale": 32768.0})
    arrays, extra = checkpoint.unpack(payload, [(2, 3), ()])
    assert arrays[0].tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]] and int(arrays[1]) == 7
    assert extra == {"loss_scale": 32768.0}
    with pytest.raises(checkpoint.CheckpointError) as e:
        checkpoint.unpack(payload, [(2, 3), (4,)])
    assert str(e.value) == ("checkpoint state: found 2 arrays, () at 1 (step) (another model's), expected this"
                            " model's 2, (4,) at 1")
    with pytest.raises(checkpoint.CheckpointError) as e:
        checkpoint.unpack(payload, [(2, 3)])
    assert str(e.value) == ("checkpoint state: found 2 arrays, () at 1 (step) (another model's), expected this"
                            " model's 1, none at 1")


def test_verify_rederives_what_a_test_gone_on_from_its_checkpoints_holds():
    """Steps 10 and 12 a epoch, checkpoints after epoch 4, B 32, P 1: (10 + 12) x 4 x 32 = 2816
    samples before them; job 1 trained again by a wave: 10 x 4 x 32 = 1280. Time 50 s holds
    12.5 + 30 s; 40 s cannot."""
    from harness import verify
    from tests.conftest import result
    resumed = {"epoch": 4, "seconds_before": 12.5, "lost_seconds": 30.0, "samples_before": 2816}
    t = result(M=2, jobs=[[0], [1]], steps_per_epoch=[10, 12], train_seconds=50.0, resumed=resumed)
    assert [c.ok for c in verify._resumed_checks(t, "test 1")] == [True, True]
    assert [c.ok for c in verify._resumed_checks(result(M=2, jobs=[[0], [1]], steps_per_epoch=[10, 12],
                                                        train_seconds=40.0, resumed={**resumed, "samples_before": 2817}),
                                                 "test 1")] == [False, False]
    again = result(M=2, jobs=[[0], [1]], steps_per_epoch=[10, 12], train_seconds=50.0, retrained=[
        {"job": 1, "wave": 1, "ranks": [0]}], resumed={**resumed, "samples_before": 1280})
    assert [c.ok for c in verify._resumed_checks(again, "test 1")] == [True, True]
    assert verify._resumed_checks(result(), "test 1") == []
