"""The reliability logic in-process, without MPI: the watchdog (an injectable abort,
a fake request), fault injection's spec and arming, and errors every rank agrees on
(a fake communicator). The real-mpirun side of each is in tests/test_run.py."""
import sys
import threading
import time

import pytest

from harness import errors, fault, watchdog
from harness.errors import RunError, agree, first_failure
from harness.watchdog import Watchdog


# ------------------------------------------------------------------ watchdog
class Aborted:
    """The abort callable: records the call and lets the test wait for it."""
    def __init__(self):
        self.fired = threading.Event()

    def __call__(self):
        self.fired.set()


def test_watchdog_fires_with_rank_and_phase_when_nothing_beats(capfd):
    """...and says so on the standard error the process started with, even while device
    set-up captures file descriptor 2 (the message in the capture would be lost with the rank)."""
    abort = Aborted()
    dog = Watchdog(0.2, 3, abort)
    dog.beat("training, test 2")
    dog.start()
    with errors.native_stderr_captured() as captured:
        assert abort.fired.wait(10)                       # fires by itself, calls the abort
        dog._thread.join(10)
    assert not dog._thread.is_alive()                     # one abort, then the thread ends
    err = capfd.readouterr().err
    assert err.count("hpcai500: rank 3: no progress for") == 1
    assert "during training, test 2 (watchdog limit 0.2 s); aborting the job" in err
    assert captured == [""]


def test_each_module_imported_beats_while_an_import_is_watched(tmp_path, monkeypatch):
    """A framework's import cannot beat: each module it imports does, through a finder that
    finds nothing (the real finders after it import the module), gone when the import is done."""
    (tmp_path / "hpcai500_probe_a.py").write_text("import hpcai500_probe_b\nVALUE = hpcai500_probe_b.VALUE + 1\n")
    (tmp_path / "hpcai500_probe_b.py").write_text("VALUE = 41\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    dog = Watchdog(10, 0, Aborted())
    beats = []
    monkeypatch.setattr(dog, "beat", lambda phase=None: beats.append(phase))
    finders = list(sys.meta_path)
    with dog.beating_on_imports():
        import hpcai500_probe_a
    assert hpcai500_probe_a.VALUE == 42 and beats == [None, None]   # two modules, two beats
    assert sys.meta_path == finders
    import hpcai500_probe_b  # noqa: F401 - already imported, nothing asked: no beat either way
    assert beats == [None, None]
    for name in ("hpcai500_probe_a", "hpcai500_probe_b"):
        sys.modules.pop(name)


# driver._give_up, what the watchdog calls, in a process of its own (it ends that process):
# a stand-in world whose Abort says so and returns (the SIGKILL after it then ends the process)
_GIVE_UP = """
import sys
from harness.driver import _give_up
class World:
    rank, policy, ulfm = int(sys.argv[1]), sys.argv[2], sys.argv[3] == "ulfm"
    def Abort(self, code):
        print(f"MPI_Abort({code})", flush=True)
_give_up(World())
"""


@pytest.mark.parametrize("rank,policy,launch,status,said", [
    (1, "abort", "ulfm", 1, ""),                  # ULFM: the exit, not MPI_Abort (driver.py: why)
    (0, "drop", "ulfm", 1, ""),                   # the coordinator ends the job whatever the policy
    (1, "drop", "ulfm", -9, ""),                  # a lost rank under drop: SIGKILLed, ULFM tells its partners
    (1, "abort", "plain", -9, "MPI_Abort(1)\n"),   # no ULFM: MPI_Abort ends every rank (the stand-in returns)
    (0, "retrain", "plain", -9, "MPI_Abort(1)\n")])
def test_the_watchdog_ends_a_ulfm_job_by_exit_status_not_mpi_abort(rank, policy, launch, status, said):
    import subprocess
    import sys
    from tests.conftest import ROOT
    p = subprocess.run([sys.executable, "-c", _GIVE_UP, str(rank), policy, launch], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert (p.returncode, p.stdout) == (status, said), p.stderr[-2000:]


# driver.end, a finished rank's exit, in a process of its own: Python's exit handler, then
# MPI_Finalize (wrapped here to say so), what Python and C buffered (to a pipe: block-buffered,
# no newline), and the status; the interpreter's teardown skipped (it would delete `kept`:
# "teardown")
_END = """
import atexit, ctypes, os, sys
from mpi4py import MPI
from harness.driver import end
finalize = MPI.Finalize
def finalized():
    finalize()
    print("finalized", MPI.Is_finalized())
MPI.Finalize = finalized
atexit.register(lambda: print("python handler"))
libc = ctypes.CDLL(None)
libc.printf(b"C buffer|")
class Teardown:
    def __del__(self, write=os.write):
        write(1, b"teardown\\n")
kept = Teardown()
end(3)
"""


def test_a_finished_rank_runs_its_exit_handlers_finalizes_and_flushes_then_exits_at_once():
    import subprocess
    import sys
    from tests.conftest import ROOT, mpi_env
    p = subprocess.run([sys.executable, "-c", _END], cwd=ROOT, capture_output=True, text=True, timeout=60,
                       env=mpi_env())
    assert p.returncode == 3, p.stderr[-2000:]
    assert sorted(p.stdout.replace("|", "|\n").splitlines()) == ["C buffer|", "finalized True", "python handler"], \
        p.stdout


class Clock:
    """The watchdog's clock (harness.watchdog.time), moved only by the sleeps the test and
    Watchdog.wait take: a beat's age is what the code under test made it. On the real
    clock, a process held off the CPU for one limit (0.2 s: a loaded machine) would look
    like a rank without progress. The watchdog's thread still looks on the real clock."""
    def __init__(self):
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        time.sleep(seconds)


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(watchdog, "time", c)
    return c


def test_watchdog_beats_keep_it_from_firing(clock):
    abort = Aborted()
    dog = Watchdog(0.2, 0, abort).start()                 # looks every 0.05 s
    for _ in range(50):                                   # 1 s: five limits' worth of beating
        dog.beat()
        clock.sleep(0.02)
    assert not abort.fired.is_set()
    dog.stop()
    dog._thread.join(10)
    assert not dog._thread.is_alive() and not abort.fired.is_set()   # stop() ends it quietly


def test_watchdog_zero_is_off():
    dog = Watchdog(0, 0, Aborted()).start()
    assert dog._thread is None


def test_beat_sets_the_phase_only_when_given():
    dog = Watchdog(10, 0, Aborted())
    assert dog.phase == "start-up"
    before = dog.last
    time.sleep(0.01)
    dog.beat("evaluation, test 1")
    assert dog.phase == "evaluation, test 1" and dog.last > before
    dog.beat()
    assert dog.phase == "evaluation, test 1"


class FakeRequest:
    """An MPI request that completes on its n-th Test()."""
    def __init__(self, n):
        self.n, self.calls = n, 0

    def Test(self):
        self.calls += 1
        return self.calls >= self.n


def test_wait_beats_while_waiting_so_a_long_wait_is_not_a_hang(clock):
    abort = Aborted()
    dog = Watchdog(0.2, 1, abort).start()
    req = FakeRequest(40)                                 # 40 x 20 ms = 0.8 s at least: four limits
    dog.wait(req, "waiting for the other jobs, test 1")
    assert req.calls == 40 and dog.phase == "waiting for the other jobs, test 1"
    assert not abort.fired.is_set()
    dog.stop()


def test_wait_on_a_completed_request_returns_at_once():
    dog = Watchdog(10, 0, Aborted())
    req = FakeRequest(1)
    dog.wait(req, "waiting")
    assert req.calls == 1 and dog.phase == "waiting"


# ------------------------------------------------------------------ fault injection
def test_unset_arms_nothing(monkeypatch):
    monkeypatch.delenv("HPCAI500_FAULT", raising=False)
    assert fault._armed(0) == [] and fault.injector(0) is None
    fault.point(0, "eval")                                # nothing happens


@pytest.mark.parametrize("spec,armed", [
    ("1:5", [(5, "raise")]), ("1:5:kill", [(5, "kill")]), ("1:5:hang", [(5, "hang")]), ("1:5:slow", [(5, "slow")]),
    ("1:5:stop", [(5, "stop")]),
    ("1:eval", [("eval", "raise")]), ("1:roofline:kill", [("roofline", "kill")]), ("1:0", [(0, "raise")]),
    ("1:sampler@2:kill", [("sampler@2", "kill")]), ("3:staging:kill,1:eval", [("eval", "raise")])])
def test_spec_arms_its_rank_only(monkeypatch, spec, armed):
    monkeypatch.setenv("HPCAI500_FAULT", spec)
    assert fault._armed(1) == armed
    assert fault._armed(0) == [] and fault._armed(2) == []


def test_a_phase_fault_of_one_test_fires_in_that_test_only(monkeypatch):
    monkeypatch.setenv("HPCAI500_FAULT", "0:staging@2,1:sampler")
    fault.point(0, "staging", 1)                          # test 1: nothing
    fault.point(0, "sampler", 2)                          # another phase: nothing
    with pytest.raises(RuntimeError, match="at staging@2$"):
        fault.point(0, "staging", 2)
    with pytest.raises(RuntimeError, match="at sampler$"):
        fault.point(1, "sampler", 7)                      # every test


@pytest.mark.parametrize("spec", ["1", "x:5", "-1:5", "1:train", "1:5:explode", "1:eval:raise2", ":5", "1:5.5",
                                  "1:5:hang:x", "1:eval@", "1:eval@0", "1:5@2", "1:5,", "1:5,2:x"])
def test_bad_spec_is_a_value_error_naming_it(monkeypatch, spec):
    monkeypatch.setenv("HPCAI500_FAULT", spec)
    usage = r"RANK:STEP\|eval\|roofline\|sampler\|staging\|start\[@TEST\]\[:kill\|hang\|slow\|stop\]\[,\.\.\.\]"
    with pytest.raises(ValueError, match=rf"^HPCAI500_FAULT='.*': expected {usage}$"):
        fault._armed(0)          # refused on every rank, the unarmed ones too
    with pytest.raises(ValueError):
        fault.injector(1)


def test_parse_gives_rank_where_and_kind():
    assert fault.parse("3:12") == [(3, 12, "raise")]
    assert fault.parse("0:eval:hang,2:roofline@3:kill") == [(0, "eval", "hang"), (2, "roofline@3", "kill")]
    with pytest.raises(ValueError, match=r"^RANK:STEP\|eval\|roofline\|sampler\|staging\|start\[@TEST\]"):
        fault.parse("0:eval:hang:again")


def test_injector_fires_at_its_step_only(monkeypatch):
    monkeypatch.setenv("HPCAI500_FAULT", "1:3")
    fire = fault.injector(1)
    for step in (0, 1, 2, 4, 100):
        fire(step)
    with pytest.raises(RuntimeError, match="fault injected by HPCAI500_FAULT at step 3"):
        fire(3)
    assert fault.injector(0) is None                      # other ranks: no callable at all


def test_a_slow_rank_sleeps_before_its_step_and_every_later_one(monkeypatch):
    naps = []
    monkeypatch.setattr(fault.time, "sleep", naps.append)
    monkeypatch.setenv("HPCAI500_FAULT", "0:2:slow")
    fire = fault.injector(0)
    for step in range(5):
        fire(step)                                        # never raises
    assert naps == [fault.SLOW_STEP] * 3                  # steps 2, 3 and 4
    monkeypatch.setenv("HPCAI500_FAULT", "0:eval:slow")
    fault.point(0, "eval")                                # a phase: once
    assert naps == [fault.SLOW_STEP] * 4


def test_a_phase_fault_has_no_step_injector_and_a_step_fault_no_phase(monkeypatch):
    monkeypatch.setenv("HPCAI500_FAULT", "0:eval")
    assert fault.injector(0) is None
    fault.point(0, "roofline")                            # another phase: nothing
    fault.point(1, "eval")                                # another rank: nothing
    with pytest.raises(RuntimeError, match="at eval"):
        fault.point(0, "eval")
    monkeypatch.setenv("HPCAI500_FAULT", "0:5")
    fault.point(0, "eval")


def test_hang_sleeps_forever_and_kill_sends_sigkill(monkeypatch):
    """Neither is run for real here (the mpirun tests do): their system calls are caught."""
    import os
    import signal
    naps, kills = [], []

    def nap(seconds):
        naps.append(seconds)
        if len(naps) == 3:
            raise KeyboardInterrupt          # leave the endless loop
    monkeypatch.setattr(fault.time, "sleep", nap)
    monkeypatch.setenv("HPCAI500_FAULT", "0:roofline:hang")
    with pytest.raises(KeyboardInterrupt):
        fault.point(0, "roofline")
    assert naps == [60, 60, 60]
    monkeypatch.setattr(fault.os, "kill", lambda pid, sig: kills.append((pid, sig)))
    monkeypatch.setenv("HPCAI500_FAULT", "0:7:kill")
    with pytest.raises(RuntimeError):        # os.kill mocked out: falls through to the raise
        fault.injector(0)(7)
    assert kills == [(os.getpid(), signal.SIGKILL)]


# ------------------------------------------------------------------ agreed errors
class FakeComm:
    """A world of `size` ranks seen from one of them: allgather returns every rank's
    contribution, ours at `rank` and the others' given."""
    def __init__(self, size, others=None, rank=0):
        self.size, self.rank, self.others, self.sent = size, rank, dict(others or {}), []

    def allgather(self, value):
        self.sent.append(value)
        return [value if r == self.rank else self.others.get(r) for r in range(self.size)]


def test_agree_returns_the_value_when_no_rank_fails():
    comm = FakeComm(4)
    assert agree(comm, lambda: 42, "step") == 42
    assert comm.sent == [None]                            # took part in the exchange


def test_agree_lowest_failing_rank_wins_the_rank_after_its_message():
    comm = FakeComm(4, {1: "step: disk on fire", 3: "step: other"}, rank=2)
    with pytest.raises(RunError) as info:
        agree(comm, lambda: 1 / 0, "step")
    assert str(info.value) == "step: disk on fire (rank 1; 3 of 4 ranks failed)"
    assert comm.sent == ["step: division by zero"]        # ours was sent too


def test_agree_our_own_failure_and_no_prefix_on_one_rank():
    with pytest.raises(RunError) as info:
        agree(FakeComm(1), lambda: open("/nonexistent/x"), "workload x")
    assert str(info.value).startswith("workload x: [Errno 2] No such file or directory")
    with pytest.raises(RunError) as info:
        agree(FakeComm(1), lambda: int("z"), "")               # no label: the bare message
    assert str(info.value) == "invalid literal for int() with base 10: 'z'"
    with pytest.raises(RunError, match=r"^workload x: boom \(rank 0; 1 of 2 ranks failed\)$"):
        agree(FakeComm(2), lambda: (_ for _ in ()).throw(ValueError("boom")), "workload x")
    with pytest.raises(RunError, match="^workload x: boom$"):     # every rank alike: no rank's own, none named
        agree(FakeComm(2, {1: "workload x: boom"}), lambda: (_ for _ in ()).throw(ValueError("boom")), "workload x")


def test_a_rank_that_succeeds_still_raises_when_another_failed():
    """The failure must reach every rank, or the ones that succeeded hang in the next collective."""
    called = []
    with pytest.raises(RunError, match=r"^late \(rank 3; 1 of 4 ranks failed\)$"):
        agree(FakeComm(4, {3: "late"}), lambda: called.append(1) or "fine", "x")
    assert called == [1]


def test_first_failure():
    first_failure(FakeComm(3), None)                      # nobody failed: returns
    first_failure(FakeComm(3, {1: ""}), "")               # empty strings are no failure
    with pytest.raises(RunError, match=r"^b \(rank 2; 1 of 3 ranks failed\)$"):
        first_failure(FakeComm(3, {2: "b"}), None)
    with pytest.raises(RunError, match=r"^a \(rank 0; 2 of 3 ranks failed\)$"):
        first_failure(FakeComm(3, {2: "b"}), "a")
    with pytest.raises(RunError, match="^only$"):
        first_failure(FakeComm(1), "only")
    # the input's problem, every rank's alike (issue 45: 'rank 0: x.dat:22: ...' hid the line): no rank
    said = "x.dat:22: found 'adasum', expected ring"
    with pytest.raises(RunError, match=f"^{said}$"):
        first_failure(FakeComm(3, {1: said, 2: said}), said)
    with pytest.raises(RuntimeError, match=r"^c \(rank 1; 1 of 3 ranks failed\)$") as raised:   # the driver's abort
        first_failure(FakeComm(3, {1: "c"}), None, RuntimeError)
    assert not isinstance(raised.value, RunError)


def test_say_writes_one_prefixed_line_on_stderr(capsys):
    errors.say("error: x")
    out, err = capsys.readouterr()
    assert out == "" and err == "hpcai500: error: x\n"


def _fails_deep():
    raise ValueError("bad shape (3, 4)")


def test_a_crash_prints_the_rank_marked_traceback_then_the_summary_line():
    """Where the exception was raised (this file, _fails_deep) and how it got there, every
    line marked with the rank; the one-line summary last."""
    try:
        _fails_deep()
    except ValueError as e:
        lines = errors.crash(3, "training, test 2", e).splitlines()
    assert lines[0] == "rank 3: Traceback (most recent call last):"
    assert all(line.startswith("rank 3: ") for line in lines[:-1])
    assert any("test_reliability_units.py" in line and "in _fails_deep" in line for line in lines)
    assert lines[-2] == "rank 3: ValueError: bad shape (3, 4)"
    assert lines[-1] == "hpcai500: rank 3 failed during training, test 2: ValueError: bad shape (3, 4)"
