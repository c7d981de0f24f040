"""Shared helpers of the benchmarks: edit HPCAI500.dat, run mpirun, read results.json."""
from __future__ import annotations

import glob
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from harness.telemetry import machine_busy_seconds  # noqa: E402  (the report's other load reads the same counter)
PY = os.path.join(ROOT, ".venv", "bin", "python")
MS_PY = os.path.join(ROOT, ".venv-mindspore", "bin", "python")   # MindSpore's venv (make venv VENV=.venv-mindspore ...)
NP = 2                                      # ranks: this machine has 2 cores
WORK = os.path.join(tempfile.gettempdir(), "hpcai500-bench")  # results + cached synthetic data
ENV = dict(os.environ, PATH=os.path.join(ROOT, ".venv", "bin") + os.pathsep + os.environ.get("PATH", ""),
           OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           PMIX_MCA_gds="hash",              # as the Makefile sets (a rare failed start in PMIx 5.0.8)
           TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2")
COUNTS = {7: 6, 10: 9, 11: 9, 14: 13, 17: 16}  # sweep line -> the line holding its count


def make_dat(name: str, **lines) -> str:
    """A copy of the shipped HPCAI500.dat with the value token(s) of some lines replaced,
    e.g. make_dat("x", l8="synthetic:20000:16", l10="1 2"); line 5 -> a temp results dir.
    The free text after the values is kept."""
    text = open(os.path.join(ROOT, "HPCAI500.dat")).read().splitlines()
    new = {5: WORK, **{int(k[1:]): str(v) for k, v in lines.items()}}
    old_count = {n: int(text[COUNTS[n] - 1].split()[0]) if n in COUNTS else 1 for n in new}
    for n, value in new.items():
        rest = re.sub(r"^\s*(?:\S+(?:\s+|$)){%d}" % old_count[n], "", text[n - 1])
        text[n - 1] = f"{value:<13} {rest}".rstrip()
    os.makedirs(WORK, exist_ok=True)
    path = os.path.join(WORK, f"{name}.dat")
    with open(path, "w") as f:
        f.write("\n".join(text) + "\n")
    return path


def children_seconds() -> float:
    """CPU seconds (user + system) of this process's children that have ended."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def wait_quiet(limit: float = 0.25, patience: float = float(os.environ.get("BENCH_PATIENCE", 120))) -> float:
    """Wait (up to `patience` s) until the machine is nearly idle: less than `limit` cores
    busy over 2 s. Other people's tests share this machine. Returns the last reading."""
    end = time.time() + patience
    while True:
        b0 = machine_busy_seconds()
        time.sleep(2.0)
        load = (machine_busy_seconds() - b0) / 2.0
        if load < limit or time.time() > end:
            return load


QUIET, TRIES = 0.15, 2  # a run while others used > QUIET cores is tried again, TRIES at most


def mpirun(*args: str, np: int = NP, env: dict | None = None, launcher: list[str] | None = None,
           remote: str | None = None, python: str = PY, flags: tuple[str, ...] = ("--oversubscribe",)
           ) -> tuple[str, float]:
    """Run `mpirun -np NP python ARGS...` from the repo root once the machine is quiet,
    with `env` (settings such as HPCAI500_EWA_BACKBONE) added to the environment.
    Returns stdout and the mean number of cores other processes used meanwhile (machine
    busy time minus our ranks' CPU time, over the wall time): the run's noise gauge.
    `launcher`: the words before python (default `mpirun FLAGS -np NP`); `flags`: mpirun's
    options there (default --oversubscribe, with which Open MPI binds no rank);
    `remote`: a program name whose ranks are not this process's descendants (started by
    a simulated cluster's nodes): their CPU time is sampled from /proc and counted as ours.
    `python`: another venv's (MindSpore's); its mpirun then launches, beside it."""
    mpirun_of = os.path.join(os.path.dirname(python), "mpirun") if python != PY else "mpirun"
    cmd = [*(launcher or [mpirun_of, *flags, "-np", str(np)]), python, *args]
    wait_quiet()
    t0, busy0, ours0 = time.perf_counter(), machine_busy_seconds(), children_seconds()
    p = subprocess.Popen(cmd, cwd=ROOT, env={**ENV, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    seen: dict[int, float] = {}
    while True:
        if remote:
            seen.update(_cpu_seconds_of(remote))
        try:
            out, err = p.communicate(timeout=0.5 if remote else None)
            break
        except subprocess.TimeoutExpired:
            continue
    other = (machine_busy_seconds() - busy0) - (children_seconds() - ours0) - sum(seen.values())
    if p.returncode:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{out[-3000:]}{err[-3000:]}")
    return out, max(0.0, other / (time.perf_counter() - t0))


def _cpu_seconds_of(program: str) -> dict[int, float]:
    """CPU seconds so far of every process whose command line names `program` (pid -> s)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if program.encode() not in f.read():
                    continue
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[int(pid)] = (int(fields[11]) + int(fields[12])) / tick    # utime, stime
        except (OSError, IndexError, ValueError):
            continue
    return out


def run_harness(dat: str, **launch) -> tuple[list[dict], float]:
    """Run hpcai500.py on `dat`: the `tests` of the results.json it wrote, and the noise
    gauge. `launch`: mpirun's keywords (np, env, launcher, remote)."""
    before = set(glob.glob(os.path.join(WORK, "*", "results.json")))
    _, other = mpirun("hpcai500.py", dat, **launch)
    (new,) = set(glob.glob(os.path.join(WORK, "*", "results.json"))) - before
    with open(new) as f:
        return json.load(f)["tests"], other


def run_record(dat: str, np: int = NP, env: dict | None = None, python: str = PY) -> tuple[dict, float, int]:
    """Run hpcai500.py on `dat` on `np` ranks (with `env` added to the environment; `python`:
    another venv's, mpirun's): the whole results.json it wrote (environment, write_seconds,
    ... as well as the tests), the noise gauge, and the file's size in bytes."""
    before = set(glob.glob(os.path.join(WORK, "*", "results.json")))
    _, other = mpirun("hpcai500.py", dat, np=np, env=env, python=python)
    (new,) = set(glob.glob(os.path.join(WORK, "*", "results.json"))) - before
    with open(new) as f:
        return json.load(f), other, os.path.getsize(new)


def quietest(run):
    """Call run() -> (value, other load) until other processes stayed under QUIET cores,
    TRIES times at most; the quietest call's (value, other load)."""
    best = run()
    for _ in range(TRIES - 1):
        if best[1] <= QUIET:
            break
        best = min(best, run(), key=lambda r: r[1])
    return best


def alternate(dat: str, bare_args, runs: int, epochs: int, digits: int = 0):
    """Harness and bare loop, alternated `runs` times, each the quietest of its tries:
    (table rows, harness samples/s, bare samples/s, other loads). `bare_args(steps)`
    gives the bare loop's mpirun arguments for the harness's number of steps; the bare
    script prints its figures as JSON on its last line."""
    rows, harness, bare, loads = [], [], [], []
    for i in range(runs):
        (t,), load = quietest(lambda: run_harness(dat))
        steps = t["steps_per_epoch"][0] * epochs
        harness.append(throughput(t))
        loads.append(load)
        rows.append([i + 1, "harness", steps, t["samples_trained"], f"{t['train_seconds']:.2f}",
                     f"{harness[-1]:.{digits}f}", f"{load:.2f}"])
        out, load = quietest(lambda: mpirun(*bare_args(steps)))
        r = json.loads(out.strip().splitlines()[-1])
        bare.append(r["samples_per_s"])
        loads.append(load)
        rows.append([i + 1, "bare Horovod", steps, r["samples"], f"{r['seconds']:.2f}",
                     f"{bare[-1]:.{digits}f}", f"{load:.2f}"])
    return rows, harness, bare, loads


def throughput(test: dict) -> float:
    return test["samples_trained"] / test["train_seconds"]


def median(xs):
    return statistics.median(xs)


def machine() -> str:
    """What the figures were measured on, e.g. '2 usable core(s) of 2 logical CPU(s) (AMD EPYC
    virtual machine), no GPU, 2 MPI ranks'."""
    info = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    model = re.search(r"^model name\s*:\s*(.*)$", info, re.M)
    vm = " virtual machine" if re.search(r"^flags\s*:.*\bhypervisor\b", info, re.M) else ""
    gpu = "GPU present" if glob.glob("/dev/nvidia[0-9]*") else "no GPU"
    return (f"{len(os.sched_getaffinity(0))} usable core(s) of {os.cpu_count()} logical CPU(s) "
            f"({model.group(1) if model else 'unknown CPU'}{vm}), {gpu}, {NP} MPI ranks")


def bare_step(model, opt, loss, distributed: bool = True):
    """The bare loops' training step (bench/ic.py, bare_ewa.py, peers.py), written as
    Horovod's own examples write it: forward (outputs cast to FP32), the mean of
    `loss(y, outputs)` plus the model's weight decay, gradients through Horovod's
    DistributedGradientTape (or local ones: distributed=False), the optimizer's update."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            out = tf.nest.map_structure(lambda t: tf.cast(t, tf.float32), model(x, training=True))
            value = tf.reduce_mean(loss(y, out))
            if model.losses:
                value += tf.add_n(model.losses)
        if distributed:
            tape = hvd.DistributedGradientTape(tape)
        opt.apply_gradients(zip(tape.gradient(value, model.trainable_variables), model.trainable_variables))
        return value
    return step


def fit(xs, ys) -> tuple[float, float]:
    """Least-squares (intercept, slope); slope 0 when every x is the same."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return my - slope * mx, slope


def table(header: list[str], rows: list[list]) -> str:
    """A markdown table."""
    cells = [header] + [[str(c) for c in r] for r in rows]
    w = [max(len(r[i]) for r in cells) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(c.ljust(w[i]) for i, c in enumerate(r)) + " |"
    return "\n".join([line(cells[0]), "|" + "|".join("-" * (x + 2) for x in w) + "|"] + [line(r) for r in cells[1:]])


def cores_shared(ranks: int) -> tuple[str, str]:
    """("yes"|"no": whether `ranks` ranks share this machine's cores, the note the
    simulated-cluster benches print under their tables)."""
    cores = len(os.sched_getaffinity(0))
    shared = "yes" if ranks > cores else "no"
    return shared, (f"note: the 2 nodes share this machine's {cores} cores ({ranks} ranks): "
                    + ("each rank has a core of its own; " if shared == "no" else "compute is a share of them; ")
                    + "the link is real")
