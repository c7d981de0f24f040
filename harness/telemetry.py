"""Telemetry: a per-rank background sampler (psutil, and pynvml where a driver works),
the reduction of the per-rank summaries on rank 0, and host / GPU inventories.

Conventions (the report and results.json inherit them):
* cpu_process_percent is top's convention: 100 = one core busy, so a process with
  several busy threads (TensorFlow's pools) can exceed 100. cpu_node_percent is the
  whole node, 0-100 over all its logical CPUs.
* GPU utilisation and memory used are device-wide as NVML reports them (every process
  on that GPU), not this rank's share. Power is W, energy J.
* GPU energy comes from NVML's total-energy counter (Volta and later) where it works,
  else from integrating the sampled power over time (energy_source says which).
* Other load: the cores that processes other than the run's ranks kept busy on a
  machine during a test's timed span = the machine's busy CPU seconds in the span minus
  every rank's own (its threads', not its children's), over the span (`other_load`). The
  counters are read at every sample and at the sampler's start and stop, and read between
  readings at the span's edges (`counter_delta`). A machine is one kernel: nodes simulated
  on one machine share it, and each other's ranks are not "other" load.
* Nothing here raises into the training run: no pynvml, no driver, no device or an
  unsupported query only makes that metric None.
"""
from __future__ import annotations

import os
import platform
import socket
import statistics
import threading
import time

import psutil

from harness import frameworks, gpus, settings
from harness.topology import cpu_mask, machine_of_each_node

GPU_METRICS = ("util_percent", "memory_bytes", "power_watts")
OTHER_LOAD_LIMIT = 0.25   # cores a rank: other load above this on a machine makes the test warn
OTHER_LOAD_WARNING = "processes other than the run kept"   # how that warning begins
PERMANENT = ("NVMLError_NotSupported", "NVMLError_FunctionNotFound", "NVMLError_NoPermission")


def _busy_all(t) -> tuple[float, float]:
    """(busy, total) CPU seconds of a psutil.cpu_times(); Linux's guest time is already
    inside user/nice, and iowait is idle time (psutil's own convention)."""
    total = sum(t) - getattr(t, "guest", 0) - getattr(t, "guest_nice", 0)
    return total - t.idle - getattr(t, "iowait", 0), total


def machine_busy_seconds() -> float:
    """CPU seconds this machine's CPUs have been busy since boot, all CPUs added
    (/proc/stat through psutil; bench/common.py's noise gauge reads the same)."""
    return _busy_all(psutil.cpu_times())[0]


def _stats(xs: list) -> dict | None:
    return {"mean": float(statistics.fmean(xs)), "max": float(max(xs))} if xs else None


class Sampler:
    """Samples this process and node (and `gpu`, where NVML works) every `interval` s on a
    daemon thread, from start() to stop(). Also a context manager:
    `with Sampler(1.0, gpu) as s: train()`, then `s.summary`. `gpu`: the GPU this rank's
    framework pinned at set-up (harness/gpus.pinned), found in NVML by its UUID or bus id
    (gpus.nvml_key), never by the rank's local rank, which a loss of ranks renumbers."""

    def __init__(self, interval: float = 1.0, gpu: dict | None = None):
        self.interval, self.gpu = float(interval), gpu
        self.summary: dict | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._cpu_proc, self._cpu_node, self._rss = [], [], []
        self._gpu = {m: [] for m in GPU_METRICS}
        self._errors = 0
        self._nv = self._h = self._gpu_info = None
        self._unsupported: set[str] = set()
        self._e0 = self._e1 = None          # energy counter (mJ) at start and at the last read
        self._pwr_joules, self._t_last = 0.0, 0.0
        self._power_at: list[tuple[float, float]] = []    # (perf_counter s, W) of every power reading
        self._energy_at: list[tuple[float, float]] = []   # (perf_counter s, mJ) of every counter reading
        self._cpu_at: list[tuple[float, float, float]] = []   # (perf_counter s, this process's CPU s, the
        #                                                      machine's busy CPU s) at start, each sample, stop

    def __enter__(self) -> "Sampler":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("Sampler already started")
        self._proc = psutil.Process()
        self._proc.cpu_percent(None)        # baselines: the first real sample covers start -> now
        self._node_last = psutil.cpu_times()
        self._t0 = self._t_last = time.perf_counter()
        self._cpu_at.append(self._cpu_reading())
        self._thread = threading.Thread(target=self._run, name="hpcai500-telemetry", daemon=True)
        self._thread.start()

    def stop(self, window: tuple[float, float] | None = None) -> dict:
        """Stop (the thread wakes at once), join, and return this rank's summary.
        `window`: (start, stop) as time.perf_counter() of the timed training, whose GPU
        energy and CPU seconds the summary then gives apart (`window_energy_joules`,
        `cpu_window`)."""
        if self.summary is not None:
            return self.summary
        if self._thread is None:
            raise RuntimeError("Sampler not started")
        self._stop.set()
        # NVML calls can hang on a sick GPU: do not let that hang the run.
        self._thread.join(timeout=5.0)
        # the span ends after the thread's last sample: a sample taken while stop() ran
        # (the thread was mid-interval) must not put power into the energy beyond `seconds`
        seconds = time.perf_counter() - self._t0
        self._cpu_at.append(self._cpu_reading())
        self.summary = self._summarise(seconds)
        if window:
            self.summary["cpu_window"] = cpu_window(list(self._cpu_at), *window)
        if window and self.summary["gpu"]:
            self.summary["gpu"]["window_energy_joules"] = (
                window_energy(self._energy_at, *window, counter=True) if len(self._energy_at) > 1 else
                window_energy(self._power_at, *window, counter=False) if self._power_at else None)
        return self.summary

    # -- the thread ---------------------------------------------------------------
    def _run(self) -> None:
        try:
            if self.gpu is not None:
                self._open_gpu()
            while not self._stop.wait(self.interval):
                self._sample()
            if not self._cpu_proc:          # a run shorter than interval: one sample anyway
                self._sample()
            if self._e0 is not None:        # the counter's value at stop: exact energy
                self._e1 = self._query("energy", lambda: self._nv.nvmlDeviceGetTotalEnergyConsumption(self._h), self._e1)
        except Exception:
            self._errors += 1
        finally:
            if self._nv is not None:
                try:
                    self._nv.nvmlShutdown()
                except Exception:
                    pass

    def _open_gpu(self) -> None:
        nv = gpus.nvml()
        if nv is None:
            return
        self._nv = nv
        # Errors that will not go away (old driver, no power readings on this board, MIG
        # slices without utilisation): stop asking. Others may be transient.
        self._permanent = tuple(getattr(nv, n) for n in PERMANENT if hasattr(nv, n))
        try:
            self._h = gpus.handle(nv, self.gpu)
        except Exception:                   # no such device, bad CUDA_VISIBLE_DEVICES
            return
        self._gpu_info = {"index": self.gpu["index"],
                          "name": self._query("name", lambda: nv.nvmlDeviceGetName(self._h)),
                          "uuid": self._query("uuid", lambda: nv.nvmlDeviceGetUUID(self._h))}
        self._e0 = self._e1 = self._query("energy", lambda: nv.nvmlDeviceGetTotalEnergyConsumption(self._h))

    def _query(self, name: str, fn, default=None):
        """fn() or `default`; a query the GPU does not support is not asked again."""
        if name in self._unsupported:
            return default
        try:
            return fn()
        except self._permanent:
            self._unsupported.add(name)
        except Exception:                   # other NVMLError: skip this sample only
            self._errors += 1
        return default

    def _cpu_reading(self) -> tuple[float, float, float]:
        t = self._proc.cpu_times()
        return time.perf_counter(), t.user + t.system, machine_busy_seconds()

    def _sample(self) -> None:
        try:
            self._cpu_at.append(self._cpu_reading())
            with self._proc.oneshot():
                self._cpu_proc.append(self._proc.cpu_percent(None))
                self._rss.append(self._proc.memory_info().rss)
            # Node CPU from our own cpu_times deltas: psutil.cpu_percent keeps module state.
            now = psutil.cpu_times()
            (busy1, all1), (busy0, all0) = _busy_all(now), _busy_all(self._node_last)
            # at most 100: a fully busy interval gives busy == all in ticks, but the float sums of
            # psutil's fields came out 100.0000000323 once (the suite, 2026-11-28)
            self._cpu_node.append(min(100.0, 100.0 * (busy1 - busy0) / (all1 - all0)) if all1 > all0 else 0.0)
            self._node_last = now
        except Exception:
            self._errors += 1
        if self._gpu_info is None:
            return
        nv, h, t = self._nv, self._h, time.perf_counter()
        util = self._query("util", lambda: nv.nvmlDeviceGetUtilizationRates(h).gpu)
        mem = self._query("memory", lambda: nv.nvmlDeviceGetMemoryInfo(h).used)
        mw = self._query("power", lambda: nv.nvmlDeviceGetPowerUsage(h))
        for key, v in zip(GPU_METRICS, (util, mem, None if mw is None else mw / 1000.0)):
            if v is not None:
                self._gpu[key].append(float(v))
        if mw is not None:                  # fallback energy: this power held since the last reading
            self._pwr_joules += mw / 1000.0 * (t - self._t_last)
            self._t_last = t
            self._power_at.append((t, mw / 1000.0))
        if self._e0 is not None:
            self._e1 = self._query("energy", lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h), self._e1)
            if self._e1 is not None:
                self._energy_at.append((t, float(self._e1)))

    def _summarise(self, seconds: float) -> dict:
        out = {"samples": len(self._cpu_proc), "seconds": seconds, "interval": self.interval,
               "errors": self._errors, "cpu_process_percent": _stats(self._cpu_proc),
               "cpu_node_percent": _stats(self._cpu_node), "rss_bytes": _stats(self._rss), "gpu": None}
        if self._gpu_info is not None:
            gpu = dict(self._gpu_info, **{k: _stats(v) for k, v in self._gpu.items()})
            gpu["energy_joules"], gpu["energy_source"] = (
                ((self._e1 - self._e0) / 1000.0, "counter") if self._e0 is not None else
                (self._pwr_joules, "power integral") if self._gpu["power_watts"] else (None, None))
            gpu["available"] = [k for k in GPU_METRICS if self._gpu[k]] + (["energy_counter"] if self._e0 is not None else [])
            out["gpu"] = gpu
        return out


def counter_delta(readings: list[tuple[float, float]], t0: float, t1: float) -> float:
    """How much a counter grew over [t0, t1], from timed readings (time s, value) sorted by
    time (two or more): read linearly between readings, extrapolated at the ends at the
    nearest readings' rate."""
    ts = [t for t, _ in readings]

    def at(t):
        i = min(max(1, sum(x <= t for x in ts)), len(ts) - 1)   # the bracketing (or nearest) pair
        (ta, ea), (tb, eb) = readings[i - 1], readings[i]
        return ea + (eb - ea) * (t - ta) / (tb - ta) if tb > ta else ea
    return at(t1) - at(t0)


def window_energy(readings: list[tuple[float, float]], t0: float, t1: float, counter: bool) -> float:
    """Joules used in [t0, t1] from timed readings (time s, value), sorted by time.
    counter: values are an energy counter in mJ (counter_delta); else values are power in
    W, each held from its reading until the next (the first also before it)."""
    if counter:
        return counter_delta(readings, t0, t1) / 1000.0
    joules = 0.0
    for k, (t, watts) in enumerate(readings):
        start = t if k else float("-inf")
        end = readings[k + 1][0] if k + 1 < len(readings) else float("inf")
        joules += watts * max(0.0, min(end, t1) - max(start, t0))
    return joules


def cpu_window(readings: list[tuple[float, float, float]], t0: float, t1: float) -> dict:
    """A rank's CPU seconds and its machine's busy CPU seconds in [t0, t1] (s of
    perf_counter), from the sampler's readings (time, process s, machine s)."""
    return {"seconds": t1 - t0,
            "process_cpu_seconds": counter_delta([(t, p) for t, p, _ in readings], t0, t1),
            "machine_busy_cpu_seconds": counter_delta([(t, m) for t, _, m in readings], t0, t1)}


# -- rank 0: reduce the gathered summaries --------------------------------------------
def other_load(windows: dict[int, dict], node_of_rank, machine_of_node, hosts) -> list[dict]:
    """Per machine that ran ranks of the test, in machine order: its busy cores during
    the timed span (the mean over its ranks, each of which read the whole machine), the
    cores its ranks kept busy (their sum), and the difference, the cores other processes
    kept busy. `windows`: world rank -> cpu_window (every rank of the test, idle ones
    included: they are the run's); `machine_of_node` () = every node its own machine."""
    machine_of_node = machine_of_each_node(machine_of_node, len(hosts))
    by_machine: dict[int, list[dict]] = {}
    for rank, w in sorted(windows.items()):
        if w and w["seconds"] > 0:
            by_machine.setdefault(machine_of_node[node_of_rank[rank]], []).append(w)
    out = []
    for m, ws in sorted(by_machine.items()):
        busy = statistics.fmean(w["machine_busy_cpu_seconds"] / w["seconds"] for w in ws)
        ours = sum(w["process_cpu_seconds"] / w["seconds"] for w in ws)
        out.append({"hosts": [h for n, h in enumerate(hosts) if machine_of_node[n] == m], "ranks": len(ws),
                    "seconds": statistics.fmean(w["seconds"] for w in ws), "busy_cores": busy,
                    "ranks_cores": ours, "other_cores": other_cores(busy, ours)})
    return out


def other_cores(busy_cores: float, ranks_cores: float) -> float:
    """Cores other processes kept busy: the machine's busy cores minus the ranks' (a little
    below 0 on a quiet machine: the kernel counts a process's time precisely and the
    machine's in ticks, ~4 % apart measured; not clamped)."""
    return busy_cores - ranks_cores


def other_load_warnings(machines: list[dict]) -> list[str]:
    """A test's warnings for machines where other processes kept more than
    OTHER_LOAD_LIMIT cores a rank busy during its timed span."""
    return [f"{OTHER_LOAD_WARNING} {m['other_cores']:.2f} cores busy on {', '.join(m['hosts'])} during"
            f" the timed span, over {OTHER_LOAD_LIMIT:g} a rank ({m['ranks']} rank(s) there): the figures carry that"
            " load" for m in machines if m["other_cores"] > OTHER_LOAD_LIMIT * m["ranks"]]


def _over_ranks(stats: list) -> dict | None:
    stats = [s for s in stats if s]
    if not stats:
        return None
    means = [s["mean"] for s in stats]
    return {"min": min(means), "mean": statistics.fmean(means), "max": max(means),
            "max_of_max": max(s["max"] for s in stats), "ranks": len(stats)}


def reduce(summaries: list[dict]) -> dict:
    """Per metric: min/mean/max over ranks of the per-rank means, max of the per-rank
    maxima. Energy and power totals count each physical GPU once (by UUID), since ranks
    of a node may share a GPU (each framework's setup_devices pins local_rank % GPUs it sees)."""
    summaries = [s for s in summaries if s]
    gpus = [s["gpu"] for s in summaries if s.get("gpu")]
    out = {"ranks": len(summaries), "ranks_with_gpu": len(gpus),
           "samples": sum(s["samples"] for s in summaries),
           "seconds": max((s["seconds"] for s in summaries), default=0.0)}
    for key in ("cpu_process_percent", "cpu_node_percent", "rss_bytes"):
        out[key] = _over_ranks([s.get(key) for s in summaries])
    for key in GPU_METRICS:
        out["gpu_" + key] = _over_ranks([g.get(key) for g in gpus])
    distinct = list({g.get("uuid") or f"rank{i}": g for i, g in enumerate(gpus)}.values())
    energy = [g["energy_joules"] for g in distinct if g.get("energy_joules") is not None]
    power = [g["power_watts"]["mean"] for g in distinct if g.get("power_watts")]
    out["gpus"] = len(distinct)
    out["energy_joules_total"] = float(sum(energy)) if energy else None
    window = [g["window_energy_joules"] for g in distinct if g.get("window_energy_joules") is not None]
    out["window_energy_joules_total"] = float(sum(window)) if window else None
    out["power_watts_total"] = float(sum(power)) if power else None
    return out


def device_utilisation(reduced: dict) -> float | None:
    """Mean GPU utilisation over ranks, in percent (0-100); None without GPUs."""
    util = reduced.get("gpu_util_percent")
    return util["mean"] if util else None


def power_watts(reduced: dict) -> float | None:
    """Sum over the distinct GPUs of their mean power (W); None if unknown."""
    return reduced.get("power_watts_total")


def per_joule(flops_per_s: float, seconds: float, reduced: dict) -> float | None:
    """FLOPs done in the timed window per joule the GPU boards used in it (= FLOPS per
    watt); None where the boards' energy is unknown. CPUs, memory and network are not
    measured: this is GPU-board energy only."""
    joules = reduced.get("window_energy_joules_total")
    return flops_per_s * seconds / joules if joules else None


# -- inventories for results.json -------------------------------------------------------
def gpu_inventory() -> list[dict]:
    """Every NVIDIA GPU NVML sees on this node (all of them: NVML ignores
    CUDA_VISIBLE_DEVICES); [] without pynvml or a driver."""
    nv = gpus.nvml()
    if nv is None:
        return []
    def get(fn, *args):
        try:
            return fn(*args)
        except Exception:
            return None
    try:
        driver = get(nv.nvmlSystemGetDriverVersion)
        out = []
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            mem = get(nv.nvmlDeviceGetMemoryInfo, h)
            out.append({"index": i, "name": get(nv.nvmlDeviceGetName, h), "uuid": get(nv.nvmlDeviceGetUUID, h),
                        "memory_total_bytes": mem.total if mem else None, "driver_version": driver})
        return out
    except Exception:
        return []
    finally:
        get(nv.nvmlShutdown)


def host_inventory() -> dict:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f
                          if line.startswith(("model name", "Model", "cpu model"))), model)
    except OSError:
        pass
    return {"hostname": socket.gethostname(), "cpu_model": model,
            "cores_logical": psutil.cpu_count(), "cores_physical": psutil.cpu_count(logical=False),
            "memory_total_bytes": psutil.virtual_memory().total}


def with_ranks_cores(inventory: list, masks: list[int], node_of_rank) -> list[dict]:
    """The nodes' inventories (`inventory`: one entry a world rank, None but on each node's
    first rank), each with `cores_of_ranks`: the cores its ranks may run on, the union of
    their bindings (`masks`: each world rank's, topology.cpu_mask), counted (pure). Not the
    first rank's binding alone: a launcher that binds each rank to a core of its own leaves
    rank 0 one core of a node whose ranks use them all."""
    union: dict[int, int] = {}
    for node, mask in zip(node_of_rank, masks):
        union[node] = union.get(node, 0) | mask
    return [{**n, "cores_of_ranks": union[node_of_rank[r]].bit_count()} for r, n in enumerate(inventory) if n]


def node_lines(inventory: list[dict]) -> list[str]:
    """The report's lines on the nodes (pure): one per kind of node (ranks, CPU, cores, the
    cores its ranks are bound to where fewer, memory, GPUs alike), naming its hosts (the
    first and last past four), so that the block does not grow with the node count."""
    kinds: dict[tuple, list[str]] = {}
    for n in inventory:
        gpus = n.get("gpus") or []
        gpu = f"{len(gpus)} x {gpus[0].get('name') or 'GPU'}" if gpus else "no GPU"
        kind = (n.get("ranks"), n.get("cpu_model"), n.get("cores_logical"), n.get("cores_of_ranks"),
                round((n.get("memory_total_bytes") or 0) / 2**30, 1), gpu)
        kinds.setdefault(kind, []).append(n.get("hostname") or "?")
    lines = []
    for (ranks, cpu, cores, usable, gib, gpu), hosts in kinds.items():
        named = ", ".join(hosts) if len(hosts) <= 4 else f"{hosts[0]} ... {hosts[-1]}"
        usable = "" if usable in (None, cores) else f" (its ranks bound to {usable} of them)"
        lines.append(f"Nodes: {len(hosts)} x [{ranks} rank(s); {cpu}, {cores} cores{usable}, {gib} GiB; {gpu}]"
                     f" ({named})")
    return lines


def software(names: tuple[str, ...]) -> dict:
    """Versions of the stack this rank runs (the same on every rank of a sane install):
    the neutral core's, then each framework's of `names` (its package's software())."""
    import mpi4py
    import numpy
    from mpi4py import MPI
    out = {"python": platform.python_version(), "numpy": numpy.__version__, "mpi4py": mpi4py.__version__,
           "mpi_library": MPI.Get_library_version().strip("\x00 \n").splitlines()[0],
           "machine": platform.machine(), "cpu_count": os.cpu_count(), "frameworks": list(names)}
    for name in names:
        out.update(frameworks.get(name).software())
    return out


def environment(world, nodes, devices: dict, names: tuple[str, ...]) -> dict:
    """COLLECTIVE over `world`: every rank must call it. `devices`: each framework's set-up
    record on this rank (name -> setup_devices'). Versions (of the frameworks `names`), the world's shape,
    each node's host and GPU inventory (from the node's first rank) with the cores its
    ranks are bound to (every rank's binding: with_ranks_cores), the ranks'
    start-up seconds (called just before the first test) and the libraries' environment
    variables in force (settings.library: rank 0's, and every rank whose differ) on rank 0."""
    mine = ({**host_inventory(), "ranks": nodes.local_size, "gpus": gpu_inventory()}
            if nodes.local_rank == 0 else None)
    inventory = world.gather(mine, root=0)
    masks = world.gather(cpu_mask(), root=0)   # every rank's binding (after discover widened any): its node's cores
    started = world.gather(startup_seconds(), root=0)
    libraries = world.gather(settings.library(own=frameworks.own_variables(),
                                              unread=frameworks.unread_variables(names)), root=0) or [{}]
    differ = [r for r, v in enumerate(libraries) if v != libraries[0]]
    return {**software(names), "world_size": world.size, "nodes": len(nodes.hosts), "hosts": list(nodes.hosts),
            "library_settings": libraries[0], "library_settings_differ_on_ranks": differ,
            "library_settings_by_rank": {str(r): libraries[r] for r in differ},
            "machine_of_node": list(nodes.machine_of_node), "machine_cores": list(nodes.machine_cores),
            "widened_ranks": list(nodes.widened), "node_of_rank": list(nodes.node_of_rank),
            # rank0_devices: the first framework's record, as before schema 2.19 (the only one kept then)
            "rank0_devices": devices[names[0]], "rank0_devices_by_framework": devices,
            "node_inventory": with_ranks_cores(inventory, masks, nodes.node_of_rank) if inventory else [],
            "startup_seconds": startup_summary(started) if started else None}


def startup_seconds() -> float:
    """Seconds since this process was created (the launcher's exec of python): MPI start-up,
    imports, reading the input, loading the data, device set-up, the micro-kernels if on.
    The creation time has the kernel clock's resolution (10 ms)."""
    return time.time() - psutil.Process().create_time()


def startup_summary(per_rank: list[float]) -> dict:
    """Start-up over ranks (s): the slowest rank is the one the first test waits for."""
    return {"min": min(per_rank), "mean": statistics.fmean(per_rank), "max": max(per_rank),
            "rank0": per_rank[0], "ranks": len(per_rank)}
