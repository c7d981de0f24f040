"""Shared helpers: run hpcai500.py (or any Python program) under a real mpirun, with an
edited HPCAI500.dat; real runs that several files read (bagging_run, sweep_runs); the
`mpi` marker.

Markers (registered in pytest.ini): `mpi` marks a test that starts mpirun: one that
uses a fixture that starts it (run_dat, bagging_run, sweep_runs, or any fixture whose
code names mpirun), or whose code (or a function of its module
that it calls) names `mpirun` (a call, or the string in a command built by hand); a test
may also carry the mark explicitly. `mpirun` below refuses to start in a test without
the mark, so `make unit` (-m "not mpi") never starts one by accident. `slow` (over
~20 s here) is put by hand.
"""
import gc
import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
HPCAI500 = (str(ROOT / "hpcai500.py"),)
# Seconds a launch of ranks (a run, --check, a framework's program) may take before the test fails it as hung:
# one hang bound, not a speed figure. A 2-rank --check or failing run took ~34 s here under a load of 8
# on 2 cores, where bounds of 60-180 s left it 2-5 x; 300 s is ~10 x. Longer runs name their own.
HANG = 300
# The workloads' models shrunk by their test-only settings, for the runs that train every workload in a
# framework (tests/test_pytorch_run.py, tests/test_mindspore.py): ic's stem 8 wide with one bottleneck a
# stage, cosmoflow's first block 4 filters, deepcam's port at 1/8 width with 1 middle block
SMALL_MODELS = {"HPCAI500_IC_WIDTH": "8", "HPCAI500_IC_STAGES": "1,1,1,1", "HPCAI500_COSMO_WIDTH": "4",
                "HPCAI500_DEEPCAM_WIDTH": "4", "HPCAI500_DEEPCAM_MIDDLE": "1"}
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # before any test imports TensorFlow
# The collection imports TensorFlow, PyTorch and matplotlib with the cyclic collector off, as a run's
# driver imports its frameworks (harness/driver._collector_off): each full collection an import sets off
# scans every object made so far, next to none of them garbage; pytest_collection_finish freezes them
# and turns the collector back on for the tests.
gc.disable()


def dat_text(**lines) -> str:
    """The shipped HPCAI500.dat with some lines' values replaced: dat_text(l5='x', l10='2 2')."""
    rows = (ROOT / "HPCAI500.dat").read_text().splitlines()
    for key, value in lines.items():
        n = int(key[1:])
        free = rows[n - 1][14:]  # the shipped file keeps values in a 14-column field
        rows[n - 1] = f"{str(value):<13} {free}"
    return "\n".join(rows) + "\n"


# The suite's two workers (make test: -n 2) run their jobs side by side, so the machine's cores
# are oversubscribed while each mpirun sees no more ranks than slots and lets a waiting rank
# poll at full speed (Open MPI's default), taking the core another job's rank needs. A waiting
# rank yields instead (Open MPI's mpi_yield_when_idle, which it sets itself where a job alone
# oversubscribes a node): two 2-rank jobs of one base model each, side by side, took 12.4 s
# instead of 16.3 (3 pairs each, 2026-11-29, 2-core Intel Xeon). An MCA parameter, MPI's own
# configuration, not recorded in results.json (docs/running.md, "Settings"), and no figure a test
# asserts depends on it; `make run` leaves it to Open MPI.
SUITE_MPI = {"OMPI_MCA_mpi_yield_when_idle": "1"}
# The same contention in OpenMP: a PyTorch process alone on the machine (a 1-rank run, or a
# worker's in-process tests) takes an intra-op thread a core (harness/train.threads, as PyTorch
# does), and GNU OpenMP's threads spin at each parallel region's end for a sibling that the other
# worker's job has descheduled. PASSIVE lets them sleep: 2 epochs of digits in PyTorch on 1 rank,
# beside a process spinning on one of the 2 cores, trained in 1.2-1.4 s instead of 16-17 s, and
# took 9-16 CPU-s instead of 29-32 (2 pairs, 2026-11-29); on a quiet machine it slows that run
# (0.87-1.23 s against 0.52-0.85), so the harness leaves the policy to the site. An OMP_ variable,
# so a run records it in results.json and echoes it (LIB ENV), as it would a site's.
SUITE_OPENMP = {"OMP_WAIT_POLICY": "PASSIVE"}
os.environ.update(SUITE_OPENMP)   # before any test imports PyTorch: libgomp reads it once, when loaded


def mpi_env(quick: bool = True, env: dict | None = None) -> dict:
    """The environment of a run: the venv's mpirun first, root allowed, PMIx's hash job
    store (as the Makefile sets: PMIx 5.0.8's shared-memory one sometimes fails a start),
    waiting ranks yielding their core (SUITE_MPI; SUITE_OPENMP is in os.environ already), TensorFlow
    quiet, plus `env` (extra variables)."""
    return dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}", OMPI_ALLOW_RUN_AS_ROOT="1",
                OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", PMIX_MCA_gds="hash", TF_CPP_MIN_LOG_LEVEL="2",
                TF_USE_LEGACY_KERAS="1", HPCAI500_ROOFLINE_QUICK="1" if quick else "0", **SUITE_MPI, **(env or {}))


# No rank reads stdin, and by default mpirun forwards its own to rank 0 through a pipe. A worker's
# stdin is /dev/null, so mpirun meets its end at once and closes that pipe while starting the job;
# one suite (2026-11-29) had an mpirun exit 1 before any rank wrote a line, saying only libevent's
# "Epoll MOD(1) on fd 22 failed ... write change was 2 (del) ...: Bad file descriptor" (an event
# deleted on a closed descriptor). Not reproduced in 200 launches; without the pipe that path is gone.
MPIRUN_STDIN = ("--stdin", "none")


def mpirun_cmd(np_: int | None, args, program=HPCAI500) -> list[str]:
    """`mpirun --stdin none --oversubscribe -np N python PROGRAM... ARGS...`; np_=None: the program alone
    (an MPI singleton). program=(): ARGS go to python itself (e.g. '-m', 'kernels.gemm')."""
    _check_marked()
    cmd = [sys.executable, *program, *map(str, args)]
    return cmd if np_ is None else [str(BIN / "mpirun"), *MPIRUN_STDIN, "--oversubscribe", "-np", str(np_), *cmd]


def mpirun(np_: int, args: list[str], cwd: Path, timeout: int = HANG, quick: bool = True, *,
           env: dict | None = None, program=HPCAI500) -> subprocess.CompletedProcess:
    """quick: the roofline micro-kernels at test sizes (the shipped-file test runs them full).
    env: extra environment variables; program: see mpirun_cmd."""
    return subprocess.run(mpirun_cmd(np_, args, program), cwd=cwd, env=mpi_env(quick, env), capture_output=True,
                          text=True, timeout=timeout)


def mpirun_started(folder: Path, np_: int, args, env: dict | None = None, **lines) -> subprocess.Popen:
    """mpirun of a dat file written in `folder` (dat_text's lines; results under folder/runs),
    left running: for a test that acts while it runs, or runs several at once. Its output
    goes to folder/out.txt and folder/err.txt, which the test may read as it goes
    (mpirun_ended collects them)."""
    (folder / "t.dat").write_text(dat_text(l5=folder / "runs", **lines))
    with open(folder / "out.txt", "w") as out, open(folder / "err.txt", "w") as err:
        return subprocess.Popen(mpirun_cmd(np_, [*args, folder / "t.dat"]), cwd=folder, env=mpi_env(True, env),
                                stdout=out, stderr=err, text=True)


def mpirun_says(p: subprocess.Popen, folder: Path, text: str) -> None:
    """Wait until mpirun_started's run has written `text` to its stderr, while it runs (a hang
    bound of HANG s)."""
    deadline = time.monotonic() + HANG
    while text not in (err := (folder / "err.txt").read_text()):
        assert p.poll() is None and time.monotonic() < deadline, err[-3000:]
        time.sleep(0.05)


def mpirun_ended(p: subprocess.Popen, folder: Path) -> subprocess.CompletedProcess:
    """mpirun_started's run once it has ended, as mpirun() returns one."""
    p.wait(timeout=HANG)
    return subprocess.CompletedProcess(p.args, p.returncode, (folder / "out.txt").read_text(),
                                       (folder / "err.txt").read_text())


# stdout (line 4's device 6) is the report as mpirun forwarded it. Open MPI's forwarding has dropped
# bytes on its way, report.txt whole: a block's end twice in one suite run (session 21), a piece of a
# conventions line on two simulated nodes (session 22) and on one node (2026-11-28, the shipped file's
# run), a PASSED line (2026-11-28). A test holds stdout to report.txt with `forwarded` and counts in
# report.txt.
def report_of(runs: Path) -> str:
    """report.txt of the one run folder under `runs` (what the harness wrote, whatever
    mpirun's forwarding of stdout lost on the way)."""
    return (run_dir(runs) / "report.txt").read_text()


def forwarded(out: str, report: str) -> bool:
    """`out` is `report` with pieces left out at most (a subsequence of its characters), ends
    as it does, and holds most of it. Reports a forwarding that lost bytes on stderr."""
    it = iter(report)
    if not (all(ch in it for ch in out) and out.endswith(report.splitlines()[-1] + "\n")
            and len(out) > len(report) // 2):
        return False
    if out != report:
        print(f"mpirun forwarded {len(out)} of the report's {len(report)} characters", file=sys.stderr)
    return True


def said(stderr: str, tail: int = 2000) -> str:
    """What a failed run's ranks said, for an assertion's message: every rank's closing
    `hpcai500: rank R failed during ...` line (errors.crash: the error itself, where a
    whole traceback of another rank would push it out of a plain tail), then the tail."""
    closing = [line for line in stderr.splitlines() if line.startswith("hpcai500: rank ")]
    return "\n".join(closing + ["...", stderr[-tail:]])


# hpcai500.py with some packages absent, as on a node where they are not installed: a None
# in sys.modules makes `import` raise ModuleNotFoundError and importlib.util.find_spec
# answer None (PyTorch's own probes of what is installed then see them absent).
_WITHOUT = r'''
import runpy, sys

for name in NAMES:
    sys.modules[name] = None
sys.argv = sys.argv[1:]
sys.path.insert(0, sys.argv[0].rsplit("/", 1)[0])   # the harness beside hpcai500.py, as `python hpcai500.py` finds it
runpy.run_path(sys.argv[0], run_name="__main__")
'''


def without(folder: Path, *names: str) -> tuple[str, str]:
    """A `program` for mpirun(): hpcai500.py run with the packages `names` absent (a node
    without them: a framework's run must not import another framework)."""
    path = folder / "without.py"
    path.write_text(f"NAMES = {names!r}\n" + _WITHOUT)
    return (str(path), str(ROOT / "hpcai500.py"))


def run_dir(results_dir: Path) -> Path:
    """The one run folder under a results directory (line 5's; its dot-folders are caches)."""
    runs = sorted(p for p in results_dir.iterdir() if not p.name.startswith("."))
    assert len(runs) == 1, runs
    return runs[0]


def mllog_events(path: Path) -> list[dict]:
    """The MLLOG events of a log file that the run wrote (mllog/testTTT_repRR_modelJJJJ.log)."""
    return [json.loads(x.split(":::MLLOG", 1)[1]) for x in path.read_text().splitlines() if ":::MLLOG" in x]


def results(results_dir: Path) -> dict:
    return json.loads((run_dir(results_dir) / "results.json").read_text())


def result(**fields):
    """A hand-made results.TestResult for the pure readers' tests (report, experiments,
    plots, metrics.repeats): one digits test, M=1 P=1 B=32, one epoch, quality 0.95 at
    the target, FLOPS 1e12 over 1 s; `fields` replace any of it."""
    from harness.results import TestResult
    base = dict(
        index=1, tv="B32C32SR", workload="digits", M=1, P=1, B=32, precision="fp32", sampler="bootstrap",
        aggregation="mean", repetition=0, seed=42, epochs=1, epochs_trained=1, eval_every=0, stop_at_target=False,
        jobs=[[0]], idle_ranks=[], warnings=[], division="closed", open_reasons=[], data="synthetic",
        train_samples=320, val_samples=100, forward_flops_per_sample=10, training_flops_per_sample=30,
        flops_by_operator={"dense": 10}, activations_per_sample=5, weights=7, intensity=1.0,
        steps_per_epoch=[10], samples_trained=320, total_flops=1e12, train_seconds=1.0, train_seconds_min=1.0,
        staging=None, time_to_solution=1.0, eval_seconds=0.1,
        evaluations=[{"epoch": 1, "seconds": 1.0, "quality": 0.95, "base_quality": [0.95]}],
        time_to_quality=1.0, epochs_to_quality=1, sampler_seconds=0.0, flops=1e12, vflops=1e12,
        quality_name="Top-1", quality=0.95, base_quality=[0.95], target_quality=0.95, penalty_n=10, penalty=1.0,
        final_loss=[0.1], utilisation=None, telemetry={}, vflops_per_watt=None,
        consistency={"max_diff": 0.0, "tolerance": 1e-6, "passed": True},
        resample=[{"job": 0, "size": 320, "out_of_bag": 0.37, "digest": "x"}], weights_digest=[["y"]])
    return TestResult(**{**base, **fields})


def record(status="running", tests=(), interrupted=None, reps=2, skipped=1):
    """A hand-made results.Record for the pure readers of a whole run (heartbeat's judgment,
    verify's counts): the shipped sweep (3 tests) with `reps` repetitions, `skipped` tests
    skipped: (3 - skipped) x reps test runs planned."""
    from harness import dat, results
    text = dat_text(l27=reps)
    cfg = dat.parse_text(text)
    return results.Record("0.2", "runs/x", {"path": "x.dat", "sha256": results.sha256(text), "text": text},
                          dat.record(cfg), {}, {}, [], {}, status=status, tests=list(tests),
                          interrupted=interrupted, skipped=[{"index": 3, "reason": "r"}] * skipped)


@pytest.fixture
def run_dat(tmp_path):
    """Write a dat file in tmp_path (results under tmp_path/runs) and run it.
    env: extra environment variables of the run."""
    def run(np_, extra_args=(), timeout=HANG, env=None, **lines):
        lines.setdefault("l5", str(tmp_path / "runs"))
        path = tmp_path / "test.dat"
        path.write_text(dat_text(**lines))
        return mpirun(np_, [*extra_args, str(path)], tmp_path, timeout, env=env)
    return run


@pytest.fixture(scope="session")
def bagging_run(tmp_path_factory):
    """One real run that several files' tests read (a 4-rank run costs ~15 s here):
    M = 2 jobs of P = 2 ranks on 4 ranks, 2 epochs on the embedded digits, poisson resamples, vote,
    the union of the jobs' resamples staged once to a node-local directory and kept (line 28), the report
    to a file (device 8). Returns (folder, CompletedProcess); results under folder/runs,
    the report in folder/report.out, the node's copy in folder/stage."""
    folder = tmp_path_factory.mktemp("bagging")
    path = folder / "test.dat"
    path.write_text(dat_text(l3=folder / "report.out", l4=8, l5=folder / "runs", l9=1, l10=2, l11=2, l15=2,
                             l23="poisson", l24="vote", l28=f"{folder / 'stage'} keep", l30=0))
    return folder, mpirun(4, [str(path)], folder)


@pytest.fixture(scope="session")
def sweep_runs(tmp_path_factory):
    """Two real runs of ic on 2 ranks that tests/test_ic.py and tests/test_staging.py
    read, synthetic:320:32, B 16, 5 epochs, ic as a small ResNet (the documented test
    knobs: ResNet-50 itself trains at ~40 images/s here). Run A: layouts M=2, P=1 and
    M=1, P=2. Run B: M=1, P=2 again, trained from a node-local copy (line 28, removed
    after the test). Returns (folder, A, B): results under folder/runs and
    folder/staged, the copies under folder/stage."""
    folder = tmp_path_factory.mktemp("sweep")
    env = {"HPCAI500_IC_WIDTH": "8", "HPCAI500_IC_STAGES": "1,1,1,1"}
    both = dict(l7="ic", l8="synthetic:320:32", l14=16, l15=5, l30=0, l31=0)   # one evaluation, at the end
    (folder / "a.dat").write_text(dat_text(l5=folder / "runs", l9=2, l10="2 1", l11="1 2", **both))
    (folder / "b.dat").write_text(dat_text(l5=folder / "staged", l9=1, l10=1, l11=2, l28=folder / "stage", **both))
    return (folder, mpirun(2, [str(folder / "a.dat")], folder, env=env),
            mpirun(2, [str(folder / "b.dat")], folder, env=env))


# ------------------------------------------------------------------ several nodes
def cluster_module():
    sys.path.insert(0, str(ROOT / "scripts" / "cluster"))
    import cluster
    return cluster


def simulated_cluster(name: str, nodes: int, net: int):
    """A simulated cluster (scripts/cluster/) of `nodes` nodes of 2 slots that dies with
    this process even if it is killed; the test is skipped with the reason where
    namespaces cannot be made (not root, no iproute2)."""
    cl = cluster_module()
    why = cl.available()
    if why:
        pytest.skip(why)
    return cl.Cluster(name, net=net).up(nodes, slots=2, tie=True)


@pytest.fixture(scope="session")
def cluster():
    """Four simulated nodes n1..n4 for the multi-node tests (tests/test_multinode.py),
    up once for the worker that runs them (they are one xdist group)."""
    c = simulated_cluster("suite", 4, 249)
    yield c
    c.down()


def cluster_mpirun(c, hosts: str, args, cwd: Path, timeout: int = HANG, env: dict | None = None,
                   popen: tuple | None = None, program=HPCAI500):
    """mpirun on this machine, as on a cluster's login node, launching hpcai500.py (or
    `program`) on the simulated nodes `hosts` (`n1:2,n2:2`) through Open MPI's ssh path.
    The nodes' ranks get a login's environment: the harness's own settings travel with
    -x, as a user passes them to a real cluster. popen=(stdout, stderr): started, not
    waited for."""
    env = mpi_env(True, env)
    cmd = [str(BIN / "mpirun"), *MPIRUN_STDIN, *c.mpirun_args(hosts, env), sys.executable, *program,
           *map(str, args)]
    if popen:
        return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=popen[0], stderr=popen[1], text=True)
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


# ------------------------------------------------------------------ markers
MPI_FIXTURES = {"run_dat", "bagging_run", "sweep_runs", "cluster"}   # the fixtures here that start mpirun
_current = {"item": None}


def _check_marked():
    item = _current["item"]
    if item is not None and item.get_closest_marker("mpi") is None:
        pytest.fail(f"{item.nodeid} starts mpirun but is not marked 'mpi': add @pytest.mark.mpi", pytrace=False)


def _names_mpirun(code, module, seen) -> bool:
    """Does this code, a function nested in it, or a function of `module` it calls, name mpirun?"""
    if code in seen:
        return False
    seen.add(code)
    if "mpirun" in code.co_consts:    # a command built by hand: [..., BIN / "mpirun", ...]
        return True
    for name in code.co_names:
        if name in ("mpirun", "mpirun_cmd", "mpirun_started", "run_dat", "cluster_mpirun"):
            return True
        helper = getattr(module, name, None)
        if isinstance(helper, types.FunctionType) and helper.__module__ == module.__name__ \
                and _names_mpirun(helper.__code__, module, seen):
            return True
    return any(isinstance(c, types.CodeType) and _names_mpirun(c, module, seen) for c in code.co_consts)


def _starts_mpirun(item) -> bool:
    """The test, or a fixture it uses (any scope, any file), names mpirun."""
    if MPI_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    funcs = [getattr(item, "function", None)]
    info = getattr(item, "_fixtureinfo", None)
    for defs in (info.name2fixturedefs.values() if info else ()):
        funcs += [d.func for d in defs]
    for fn in funcs:
        fn = getattr(fn, "__wrapped__", fn)
        module = sys.modules.get(getattr(fn, "__module__", ""), None)
        if isinstance(fn, types.FunctionType) and module is not None and module.__name__ != __name__ \
                and _names_mpirun(fn.__code__, module, set()):
            return True
    return False


# The real runs several tests read: under pytest-xdist (`make test` runs two workers) the
# tests of one run go to one worker (--dist loadgroup), so that each run happens once. A
# module-scoped fixture is made once per worker, not once: the MindSpore process whose figures
# tests/test_mindspore_ewa.py compares (~37 s alone) ran on both workers at once until named here.
SHARED_RUNS = ("bagging_run", "sweep_runs", "stop_run", "train_checks", "cosmoflow_run", "cluster",
               "mindspore_figures", "watchdog_runs", "failing_runs", "hung_and_abort_runs",
               "node_faults")


def pytest_addoption(parser):
    # Not an environment variable: every HPCAI500_* one is a run's setting (harness/settings.py
    # refuses an unknown name), and a run started by a test inherits the test's environment
    parser.addoption("--mindspore-venv", default=str(ROOT / ".venv-mindspore"),
                     help="MindSpore's venv for tests/test_mindspore.py (make test passes $(MSVENV))")


@pytest.hookimpl(tryfirst=True)   # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    for item in items:
        if _starts_mpirun(item):
            item.add_marker(pytest.mark.mpi)
        shared = [name for name in SHARED_RUNS if name in getattr(item, "fixturenames", ())]
        if shared:
            item.add_marker(pytest.mark.xdist_group(shared[0]))
    # Longest first (a shared run, then a test marked slow, then any mpirun, then the
    # in-process rest), stable within each: the two workers then end together instead of
    # one finishing a shared run alone at the end (6 min on 2 cores is the suite's budget).
    def weight(item):
        return (0 if item.get_closest_marker("xdist_group") else 1 if item.get_closest_marker("slow")
                else 2 if item.get_closest_marker("mpi") else 3)
    items.sort(key=weight)


@pytest.fixture(autouse=True)
def _mpi_mark_guard(request):
    _current["item"] = request.node
    yield
    _current["item"] = None


def pytest_collection_finish(session):
    # Every test module, and the frameworks they import, is loaded by now and stays to the end: kept
    # out of the collector's sight (as harness/driver.py does in a run), a full collection during an
    # in-process test scans only what the tests make, not TensorFlow's and PyTorch's modules.
    gc.freeze()
    gc.enable()
