"""harness/frameworks/pytorch/feed.py (issue 67, item 9): the batches' way to the device. On
CPUs unchanged (the host array's own memory, made when the step asks); on a GPU pinned,
non-blocking and one batch ahead on a side stream, never across an epoch's end. The GPU
path's order of copies, events and waits on fake CUDA streams (no GPU here)."""
import contextlib
import itertools

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from harness.frameworks.pytorch import feed  # noqa: E402


def test_the_transfer_is_chosen_by_device_type():
    assert feed.transfer("cuda") == feed.Transfer(pinned=True, non_blocking=True, ahead=True)
    for kind in ("cpu", "meta"):
        assert feed.transfer(kind) == feed.Transfer(pinned=False, non_blocking=False, ahead=False)


def test_a_cpus_batch_is_the_host_arrays_own_memory():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = feed.to_device(x, torch.device("cpu"))
    assert np.shares_memory(t.numpy(), x) and t.dtype == torch.float32 and not t.is_pinned()


def test_each_next_batch_is_loaded_before_the_current_one_is_used_but_never_across_an_epoch():
    """Items 1..7, epochs of 3 (L: a load issued, Y: a batch handed to the step): the next
    batch's load comes before the step on this one, except after each epoch's last (3, 6);
    consumed epoch by epoch (islice, as harness/train.epochs_loop), no epoch reads the next's."""
    log = []

    def load(k):
        log.append(f"L{k}")
        return k
    for k in feed.ahead(range(1, 8), load, 3):
        log.append(f"Y{k}")
    assert log == "L1 L2 Y1 L3 Y2 Y3 L4 L5 Y4 L6 Y5 Y6 L7 Y7".split()
    log.clear()
    gen = feed.ahead(range(1, 7), load, 3)
    assert list(itertools.islice(gen, 3)) == [1, 2, 3] and log == ["L1", "L2", "L3"]
    assert list(itertools.islice(gen, 3)) == [4, 5, 6] and log[3:] == ["L4", "L5", "L6"]


def test_a_cpus_batches_are_made_as_the_step_asks():
    made = []
    got = feed.batches(iter([(1, 2), (3, 4)]), lambda xy: made.append(xy) or xy, 2, torch.device("cpu"))
    assert made == [] and next(got) == (1, 2) and made == [(1, 2)]


class _Stream:
    def __init__(self, name):
        self.name, self.waited = name, []

    def wait_event(self, event):
        self.waited.append(event.batch)


def test_on_a_gpu_each_step_waits_for_its_own_batchs_copies_only(monkeypatch):
    """Fake CUDA: every load runs on the side stream, each batch's event is recorded there
    after its copies, the step's stream waits for that batch's event (not the next's, already
    issued) and its tensors are recorded on the step's stream before it is handed over."""
    log, current = [], ["main"]
    main, side = _Stream("main"), _Stream("side")

    class Event:
        def record(self, stream):
            self.batch = log[-1][1]
            log.append(("recorded", self.batch, stream.name))

    @contextlib.contextmanager
    def on(stream):
        current.append(stream.name)
        yield
        current.pop()
    monkeypatch.setattr(torch.cuda, "Stream", lambda device: side)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device: main)
    monkeypatch.setattr(torch.cuda, "stream", on)
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda t, s: log.append(("kept", int(t), s.name)),
                        raising=False)

    def load(k):
        log.append(("load", k, current[-1]))
        return torch.tensor(k), (torch.tensor(10 * k),)
    for x, (y,) in feed.batches(iter(range(1, 4)), load, 3, torch.device("cuda", 0)):
        log.append(("step", int(x), main.waited[-1]))
    assert log == [("load", 1, "side"), ("recorded", 1, "side"), ("load", 2, "side"), ("recorded", 2, "side"),
                   ("kept", 1, "main"), ("kept", 10, "main"), ("step", 1, 1),
                   ("load", 3, "side"), ("recorded", 3, "side"), ("kept", 2, "main"), ("kept", 20, "main"),
                   ("step", 2, 2), ("kept", 3, "main"), ("kept", 30, "main"), ("step", 3, 3)]
